"""The run folder: its name, its lock, its checkpoint and its metrics, and the
recorders that write them.

A run folder holds::

    config.yaml          the run config (edit it, then `evorl-pop resume --force`)
    metrics.csv          one row per generation, appended between chunks
    checkpoint.msgpack   the latest checkpoint (atomic, checksummed)
    train.log            what happened: devices, chunks, checkpoints, resumes, warnings
    fitness.png          fitness curves, redrawn at the end of each session
    .lock                locked (flock) by the process writing the run; holds its pid

One process writes a run folder at a time; the kernel drops the lock of a
process that dies, so a killed run never blocks its resume. Under
``jax.distributed`` only process 0 touches the folder; the others get what it
read, or the error it met, through :func:`evorl_pop.run.processes.share`.

What a run records goes through one interface, :class:`Recorder`: start, a
metrics row, the state after a chunk, an image, finish. :class:`MetricsCSV`,
:class:`TrainLog` and :class:`Checkpoints` write the run folder; TensorBoard,
Weights & Biases and a user's own recorders take the same calls.

A checkpoint holds the state on the host (its full value, gathered across
processes), with the run key, config, counters, precision and the metrics
rows up to it (so a damaged ``metrics.csv`` is rebuilt on resume). On disk::

    MAGIC (16 bytes) | SHA-256 of the payload (32 bytes) | msgpack payload

so damage is detected by the checksum rather than restored. ``metrics.csv``
rows are appended between chunks with one ``os.write`` on a file opened with
``O_APPEND``, so a killed process leaves only whole lines (at worst a last
line without its newline, which readers and :func:`truncate_metrics` drop);
floats are written with ``repr`` so they read back bit for bit.

Each part has its module, and this one gathers their names::

    evorl_pop.run.folder       the files' names, a new run's folder, what to do next
    evorl_pop.run.lock         the lock (hold)
    evorl_pop.run.checkpoint   the checkpoint file (Checkpoint, save_checkpoint)
    evorl_pop.run.metrics_csv  metrics.csv's columns and lines (read_metrics)
    evorl_pop.run.recorders    Run, Recorder and the run folder's recorders
"""

from evorl_pop.run.checkpoint import FORMAT_VERSION, MAGIC, Checkpoint, precision, save_checkpoint
from evorl_pop.run.folder import (
    CHECKPOINT_FILENAME,
    CONFIG_FILENAME,
    EXTRAS,
    FIGURE_FILENAME,
    LOCK_FILENAME,
    LOG_FILENAME,
    METRICS_FILENAME,
    RECORDS,
    RESERVED,
    SWEEP_PLAN,
    default_run_dir,
    is_writer,
    restart,
    resume_hint,
    writing,
)
from evorl_pop.run.lock import hold
from evorl_pop.run.metrics_csv import (
    LEADING,
    columns_for,
    csv_lines,
    read_metrics,
    read_metrics_lines,
)
from evorl_pop.run.recorders import Checkpoints, MetricsCSV, Recorder, Run, TrainLog, logger

__all__ = [
    "CHECKPOINT_FILENAME",
    "CONFIG_FILENAME",
    "EXTRAS",
    "FIGURE_FILENAME",
    "FORMAT_VERSION",
    "LEADING",
    "LOCK_FILENAME",
    "LOG_FILENAME",
    "MAGIC",
    "METRICS_FILENAME",
    "RECORDS",
    "RESERVED",
    "SWEEP_PLAN",
    "Checkpoint",
    "Checkpoints",
    "MetricsCSV",
    "Recorder",
    "Run",
    "TrainLog",
    "columns_for",
    "csv_lines",
    "default_run_dir",
    "hold",
    "is_writer",
    "logger",
    "precision",
    "read_metrics",
    "read_metrics_lines",
    "restart",
    "resume_hint",
    "save_checkpoint",
    "writing",
]
