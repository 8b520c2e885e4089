"""What a run records, through one interface: :class:`Recorder`.

A recorder takes the calls start, a metrics row, the state after a chunk, an
image, finish. :class:`MetricsCSV`, :class:`TrainLog` and :class:`Checkpoints`
write the run folder; TensorBoard, Weights & Biases and a user's own recorders
(:mod:`evorl_pop.run.loggers`) take the same calls. :class:`Run` is what they
see of the run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import yaml

from evorl_pop.run import processes
from evorl_pop.run.checkpoint import Checkpoint, precision, save_checkpoint
from evorl_pop.run.config import RunConfig
from evorl_pop.run.folder import CHECKPOINT_FILENAME, LOG_FILENAME, METRICS_FILENAME, resume_hint
from evorl_pop.run.metrics_csv import columns_for, csv_lines, read_metrics_lines
from evorl_pop.run.replicas import summary as replicas_summary

logger = logging.getLogger("evorl_pop.run")


@dataclasses.dataclass
class Run:
    """What a recorder sees of the run it records; the run shell keeps it current."""

    run_dir: Path
    config: RunConfig
    config_text: str  # the config as config.yaml holds it
    key: jax.Array  # the run key: generation g uses fold_in(key, g)
    about: str  # the log's first line: what runs, where, on what
    generation: int = 0  # generations completed
    env_steps: int = 0  # environment steps so far, exact
    wall_time: float = 0.0  # seconds of training, across resumes
    start_generation: int = 0  # where this session began
    columns: tuple[str, ...] = ()  # metrics.csv's columns
    lines: list[str] = dataclasses.field(default_factory=list)  # its rows, as CSV lines
    writer: bool = True  # this process writes files (process 0)
    stopped: str = ""  # why every process stopped after the same chunk (Ctrl-C, SIGTERM, ...)
    devices: int = 1  # devices on the population axis
    # a run of replicas (seeds, a sweep: evorl_pop.run.replicas): each one's labels (its
    # rows' first columns) and environment steps so far (its rows' env_steps)
    labels: list[dict] = dataclasses.field(default_factory=list)
    replica_env_steps: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.labels and not self.replica_env_steps:
            self.replica_env_steps = [0] * len(self.labels)
            if self.lines:  # resumed: from each replica's last row
                rows = read_metrics_lines(self.columns, self.lines[-len(self.labels) :])
                self.replica_env_steps = [int(v) for v in rows["env_steps"]]

    def add(self, rows: list[dict], metric_names) -> None:
        """Keeps a chunk's rows as ``metrics.csv`` lines (the columns from the first chunk)."""
        labels = list(self.labels[0]) if self.labels else []
        self.columns = self.columns or columns_for(metric_names, labels)
        self.lines.extend(csv_lines(rows, self.columns))


class Recorder:
    """What a run records, one method per moment; override the ones you need.

    The run shell calls, on every process (only ``run.writer`` should write
    files): :meth:`start` once, :meth:`row` for each generation,
    :meth:`flush` after each chunk, :meth:`image` for each figure and
    :meth:`finish` at the end (the recorders in reverse order, as context
    managers close), in that order.
    """

    def start(self, run: Run, state) -> None:
        """The run starts (``run.generation``: 0) or resumes (from a checkpoint) at ``state``."""

    def row(self, row: dict[str, Any]) -> None:
        """One generation's metrics: the columns of ``metrics.csv`` (NumPy scalars)."""

    def flush(self, run: Run, state) -> None:
        """A chunk's rows are all in; ``state`` is the run's state after it."""

    def image(self, name: str, path: Path) -> None:
        """A figure the run drew (``fitness`` at the end)."""

    def finish(self, run: Run, completed: bool) -> None:
        """The run ends: ``completed``, or interrupted (Ctrl-C, a signal, an error)."""


class MetricsCSV(Recorder):
    """``metrics.csv``: the chunk's rows in one append, after each chunk."""

    def start(self, run: Run, state) -> None:
        self.path = run.run_dir / METRICS_FILENAME
        self.written = len(run.lines)

    def flush(self, run: Run, state) -> None:
        if not run.writer or self.written == len(run.lines):
            return
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        header = ",".join(run.columns) + "\n" if fresh else ""  # with the rows, in one write
        data = (header + "".join(run.lines[self.written :])).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written = len(run.lines)


class TrainLog(Recorder):
    """``train.log`` (the ``evorl_pop.run`` log): the run's set-up, a line per chunk,
    checkpoints, warnings, how it ended."""

    def start(self, run: Run, state) -> None:
        self.nonfinite = []
        self.episodes = {}  # episodes ended so far in this session, by replica
        self.label_keys = list(run.labels[0]) if run.labels else []
        self.last = {}
        self.generation_rows = []  # the last generation's rows
        writer = run.writer
        self.handler = logging.FileHandler(run.run_dir / LOG_FILENAME) if writer else None
        if self.handler is not None:
            self.handler.setFormatter(
                logging.Formatter("%(asctime)s  %(message)s", "%Y-%m-%d %H:%M:%S")
            )
            logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.info("%s", run.about)
        for line in run.config_text.splitlines():
            logger.info("  %s", line)

    def row(self, row: dict[str, Any]) -> None:
        if row["generation"] != self.last.get("generation"):
            self.generation_rows = []  # a multi-seed run: a row per seed
        self.generation_rows.append(row)
        self.last = row
        # a learner's fitness (no population: no num_nonfinite) is NaN until its first
        # episode ends: no alarm before then (a multi-seed run: each seed's first)
        replica = tuple(row.get(k) for k in self.label_keys)
        self.episodes[replica] = self.episodes.get(replica, 0) + row.get("episodes", 0)
        learner_waits = "num_nonfinite" not in row and self.episodes[replica] == 0
        nonfinite = math.isnan(row.get("fitness_mean", 0.0)) and not learner_waits
        if nonfinite and row["generation"] not in self.nonfinite:
            self.nonfinite.append(row["generation"])

    def flush(self, run: Run, state) -> None:
        if self.nonfinite and run.writer:
            many = len(self.nonfinite) > 1
            which = f"generation{'s' if many else ''} {', '.join(map(str, self.nonfinite))}"
            text = f"{which}: no finite fitness (all candidates NaN or inf); the run goes on"
            logger.warning("warning: %s", text)
            print(f"warning: {text}", file=sys.stderr)
        self.nonfinite = []
        rows = self.generation_rows or [{}]
        with warnings.catch_warnings():  # no finite value: NaN, said above
            warnings.simplefilter("ignore", RuntimeWarning)
            best, mean = (
                float(np.nanmean([r.get(f"fitness_{k}", np.nan) for r in rows]))
                for k in ("best", "mean")
            )
        logger.info(
            "generation %d/%d  best %.6g  mean %.6g  env steps %d  %.1fs",
            run.generation,
            run.config.generations,
            best,
            mean,
            run.env_steps,
            run.wall_time,
        )

    def finish(self, run: Run, completed: bool) -> None:
        if completed:
            logger.info(
                "done: generation %d, %d env steps, %.1fs",
                run.generation,
                run.env_steps,
                run.wall_time,
            )
            if run.labels:  # replicas: each setting's mean over its seeds
                swept = [k for k in self.label_keys if k != "seed"]
                for line in replicas_summary(self.generation_rows, swept):
                    logger.info("%s", line)
        else:
            why = f" ({run.stopped})" if run.stopped else ""
            logger.info(
                "stopped%s after generation %d; %s", why, run.generation, resume_hint(run.run_dir)
            )
        if self.handler is not None:
            logger.removeHandler(self.handler)
            self.handler.close()


class Checkpoints(Recorder):
    """``checkpoint.msgpack``: once ``checkpoint_every`` generations have passed since
    the last, and at the end (a new run checkpoints even at generation 0, so that
    ``-g 0`` can be resumed). Every process takes part (the state is gathered)."""

    def start(self, run: Run, state) -> None:
        self.state = state
        self.saved = run.generation if run.generation > 0 else -1

    def flush(self, run: Run, state) -> None:
        self.state = state
        every = run.config.checkpoint_every
        if every and run.generation - max(self.saved, 0) >= every:
            self.save(run)

    def finish(self, run: Run, completed: bool) -> None:
        self.save(run, collective=completed or bool(run.stopped))

    def save(self, run: Run, collective: bool = True) -> None:
        """Saves the latest state reached, unless saved already.

        Args:
          run: the run.
          collective: ``False`` skips a save that needs a collective (after an
            immediate interruption the other processes may not take part).
        """
        state = self.state
        if state is None or self.saved == run.generation:
            return
        if not collective and any(  # a leaf that only a gather across processes reads
            isinstance(x, jax.Array)
            and not (x.is_fully_addressable or x.sharding.is_fully_replicated)
            for x in jax.tree.leaves(state)
        ):
            logger.info("no checkpoint at generation %d (interrupted)", run.generation)
            return
        if jax.process_count() == 1:  # every shard is here: one transfer
            host, key = jax.device_get(jax.tree.map(processes.key_data, (state, run.key)))
            host, key = jax.tree.map(np.asarray, host), np.asarray(key)
        else:  # a gather across processes
            host, key = jax.tree.map(processes.to_host, state), processes.to_host(run.key)
        if run.writer:
            ckpt = Checkpoint(
                state=host,
                key=key,
                key_impl=str(jax.random.key_impl(run.key)),
                config=yaml.safe_load(run.config_text),
                generation=run.generation,
                env_steps=run.env_steps,
                wall_time=run.wall_time,
                metrics_columns=run.columns,
                metrics_rows="".join(run.lines),
                precision=precision(state),
                devices=run.devices,
            )
            save_checkpoint(run.run_dir / CHECKPOINT_FILENAME, ckpt)
            logger.info("checkpoint at generation %d", run.generation)
        self.saved = run.generation
