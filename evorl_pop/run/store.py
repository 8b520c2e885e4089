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
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import fcntl
import hashlib
import itertools
import logging
import math
import os
import shlex
import shutil
import sys
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import yaml

from evorl_pop.base import CheckpointError, RunError, read_text, write_atomic
from evorl_pop.run import config as config_lib
from evorl_pop.run import processes
from evorl_pop.run.config import RunConfig
from evorl_pop.run.replicas import summary as replicas_summary
from evorl_pop.run.state_dicts import serializable

METRICS_FILENAME = "metrics.csv"
CHECKPOINT_FILENAME = "checkpoint.msgpack"
#: A sweep of several programs' whole run config, in its top folder (evorl_pop.run.sweep).
SWEEP_PLAN = "sweep.yaml"
CONFIG_FILENAME = "config.yaml"
LOG_FILENAME = "train.log"
FIGURE_FILENAME = "fitness.png"
LOCK_FILENAME = ".lock"
RECORDS = (CONFIG_FILENAME, METRICS_FILENAME, CHECKPOINT_FILENAME)
#: What the loggers (evorl_pop.run.loggers) and `render` write there; --overwrite removes them.
EXTRAS = ("tb", "wandb", "wandb-id", "render.html", "render.gif")

logger = logging.getLogger("evorl_pop.run")
#: Folders :func:`default_run_dir` created, removed again if the run fails before using them.
RESERVED: set[Path] = set()


def is_writer() -> bool:
    """Whether this process writes files: process 0 under ``jax.distributed``, else always."""
    return jax.process_index() == 0


def _mkdir(path: Path, exist_ok: bool) -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as err:
        if isinstance(err, FileExistsError) and not exist_ok:
            raise  # another run took the name first
        raise RunError(
            f"Cannot create the run folder {str(path)!r}: {err.strerror}; choose another --out "
            "(or --runs-root)."
        ) from None


def default_run_dir(config: RunConfig, root: str | os.PathLike = "runs") -> Path:
    """A new, empty folder ``root/<algorithm>-<task>-<seed>-<timestamp>[-n]``.

    The writing process creates it with ``mkdir``, which fails when another
    run created it first, so runs started at once never share a folder; every
    process gets the name it chose.
    """
    return Path(processes.share(lambda: str(_new_run_dir(config, root))))


def _new_run_dir(config: RunConfig, root: str | os.PathLike) -> Path:
    task = str(getattr(config.algorithm_config, "task", None) or "run").replace("/", "-")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{config.algorithm}-{task}-{config.seed}-{stamp}"
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        with contextlib.suppress(FileExistsError):
            _mkdir(path, exist_ok=False)
            RESERVED.add(path)
            return path


@contextlib.contextmanager
def hold(
    run_dir: Path,
    new: bool,
    config_text: str | None = None,
    overwrite: bool = False,
    read: Callable[[Path], Any] | None = None,
):
    """Holds the run folder's lock while the run writes it; a failed write into the
    folder in the body is a one-line :class:`RunError` (see :func:`writing`).

    ``new``: create the folder, refuse one holding files of a run unless
    ``overwrite``, and write ``config_text`` (the config's YAML) as
    ``config.yaml``. Else the folder must hold a checkpoint, and the context
    yields ``(read(run_dir), config.yaml's mapping)`` as process 0 read them
    (``read``: :func:`evorl_pop.run.restore.load_checkpoint`; the checkpoint's
    config when there is no ``config.yaml``).
    """
    handle = None

    def acquire():
        nonlocal handle
        if new:
            _mkdir(run_dir, exist_ok=True)
        elif not run_dir.is_dir():
            raise RunError(f"No run folder at {str(run_dir)!r}.")
        elif (run_dir / CONFIG_FILENAME).exists() and not (run_dir / CHECKPOINT_FILENAME).exists():
            if (pid := _holder(run_dir)) is not None:
                raise _in_use(run_dir, pid)
            raise CheckpointError(
                f"{str(run_dir)!r} has no checkpoint: the run stopped before its first one; "
                f"start it again with {restart(run_dir)}."
            )
        else:
            ckpt = read(run_dir)  # a folder without a run gets no lock file
        handle = open(run_dir / LOCK_FILENAME, "a+")  # noqa: SIM115 (held until the run ends)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            handle.close()
            raise _in_use(run_dir, pid) from None
        # A refusal leaves even the lock file as it was.
        names = (*RECORDS, LOG_FILENAME, FIGURE_FILENAME, *EXTRAS)
        present = [n for n in names if (run_dir / n).exists()]
        if new and present and not overwrite:
            raise RunError(
                f"{str(run_dir)!r} holds a run already ({', '.join(present)}). Continue it with "
                f"`evorl-pop resume {shlex.quote(str(run_dir))}` (Python: evorl_pop.resume), or "
                "pass --overwrite (Python: overwrite=True) to start afresh there."
                if CHECKPOINT_FILENAME in present
                else f"{str(run_dir)!r} holds files a run writes ({', '.join(present)}); pass "
                "--overwrite (Python: overwrite=True) to replace them, or choose another folder."
            )
        for name in present if new else ():
            path = run_dir / name
            path.unlink() if path.is_file() else shutil.rmtree(path)
        for path in run_dir.glob(".*.tmp"):  # a write a kill cut short (see write_atomic)
            path.unlink(missing_ok=True)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        if new:
            return write_atomic(run_dir / CONFIG_FILENAME, config_text.encode())
        path = run_dir / CONFIG_FILENAME
        return ckpt, config_lib.read_mapping(path) if path.exists() else ckpt.config

    try:
        with writing(run_dir):  # one process: no other to tell what it read
            yield acquire() if jax.process_count() == 1 else processes.share(acquire)
    finally:
        if handle is not None:
            with contextlib.suppress(OSError):  # a full disk: the error above says so
                handle.close()  # releases the lock


def _holder(run_dir: Path) -> str | None:
    """The pid in the lock file while another process holds the lock, else ``None``."""
    with contextlib.suppress(OSError), open(run_dir / LOCK_FILENAME) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
    return None  # the shared lock ends with the file's closing


def _in_use(run_dir: Path, pid: str) -> RunError:
    return RunError(
        f"{str(run_dir)!r} is in use by another evorl-pop process (pid {pid}); wait "
        "for it to end (or stop it) before writing to this run folder, or choose another."
    )


@contextlib.contextmanager
def writing(run_dir: Path):
    """Turns a failed write into the run folder into a one-line :class:`RunError`."""
    try:
        yield
    except OSError as err:
        raise RunError(
            f"Cannot write {str(err.filename or run_dir)!r}: {err.strerror or err}; fix that "
            f"(free space, permissions) and try again (`evorl-pop resume {run_dir}` continues "
            "a run from its last checkpoint)."
        ) from None


# --- checkpoints ----------------------------------------------------------------------

MAGIC = b"evorl-pop-ckpt\x00\x01"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The contents of a checkpoint file."""

    state: dict  # the state as nested dicts of NumPy arrays (flax to_state_dict)
    key: np.ndarray  # the run key's raw data, of PRNG implementation `key_impl`
    key_impl: str
    config: dict  # the run config, config.yaml's layout
    generation: int  # generations completed
    env_steps: int  # a Python int: no overflow
    wall_time: float  # seconds of training, across resumes
    metrics_columns: tuple[str, ...] = ()
    # metrics.csv's rows up to `generation`, without header (None: older checkpoints)
    metrics_rows: str | None = None
    precision: str = "float32"  # the state's float type
    devices: int = 0  # devices on the population axis that computed it (0: not recorded)


def precision(state) -> str:
    """``'float64'`` when a float JAX array (or shape) in ``state`` is 64-bit, else ``float32``."""
    wide = any(
        isinstance(x, jax.Array | jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating)
        and jnp.dtype(x.dtype).itemsize == 8
        for x in jax.tree.leaves(state)
    )
    return "float64" if wide else "float32"


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Writes a checkpoint, its state already on the host, atomically to ``path``."""
    payload = {f.name: getattr(ckpt, f.name) for f in dataclasses.fields(ckpt)}
    serializable(ckpt.state)
    payload.update(
        format=FORMAT_VERSION,
        state=flax.serialization.to_state_dict(ckpt.state),
        metrics_columns=list(ckpt.metrics_columns),
        metrics_rows=zlib.compress((ckpt.metrics_rows or "").encode()),
    )
    body = flax.serialization.msgpack_serialize(payload)
    write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body)


# --- metrics.csv -----------------------------------------------------------------------

LEADING = ("generation", "env_steps", "wall_time")
_FIRST = ("fitness_best", "fitness_mean", "fitness_worst", "fitness_std", "best_so_far")


def columns_for(metric_names, labels=()) -> tuple[str, ...]:
    """The CSV columns for an algorithm's metric names, in order; ``labels``: a replica's
    label columns (its seed, its swept values), after the leading ones."""
    names = ["env_steps_gen" if n == "env_steps" else n for n in metric_names]
    names = [n for n in names if n not in LEADING and n not in labels]
    first = [n for n in _FIRST if n in names]
    return (*LEADING, *labels, *first, *sorted(n for n in names if n not in first))


def _whole_lines(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _format(value) -> str:
    if isinstance(value, bool | int | np.bool_ | np.integer):
        return str(int(value))
    return "nan" if math.isnan(value) else repr(float(value))


def csv_lines(rows, columns) -> list[str]:
    """Rows (mappings from column name to a scalar) as CSV lines; a missing column is empty."""
    return [",".join(_format(r[c]) if c in r else "" for c in columns) + "\n" for r in rows]


def read_metrics_lines(columns, lines) -> dict[str, np.ndarray]:
    """Rows of ``metrics.csv`` (whole lines, no header) as int64 or float64 NumPy columns;
    ValueError for lines that are not of those ``columns``."""
    body = list(csv.reader(lines))
    if columns and columns[0] != LEADING[0] or any(len(r) != len(columns) for r in body):
        raise ValueError("not the columns of a metrics file")
    out = {}
    for i, name in enumerate(columns):
        values = [r[i] for r in body]
        try:
            out[name] = np.array([int(v) for v in values], dtype=np.int64)
        except ValueError:
            out[name] = np.array([float(v) if v else np.nan for v in values], np.float64)
    return out


def read_metrics(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A metrics file's (or a run folder's) columns as int64 or float64 NumPy arrays.

    A last line cut short is left out; a file that is not a metrics CSV is a ValueError.
    """
    path = Path(path) / METRICS_FILENAME if Path(path).is_dir() else Path(path)
    try:
        header, *lines = _whole_lines(read_text(path, "a metrics CSV")) or [""]
        out = read_metrics_lines(next(csv.reader([header])) if header else [], lines)
    except ValueError as err:  # also UnicodeDecodeError: a binary file
        raise ValueError(
            f"{str(path)!r} is not an evorl-pop metrics CSV ({err}); give a run folder or its "
            f"{METRICS_FILENAME}."
        ) from None
    return out


# --- recorders --------------------------------------------------------------------------


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


def resume_hint(run_dir: Path) -> str:
    """What to do with a stopped run: resume it, or start it again if it has no checkpoint
    (the commands quoted for a shell). Under ``jax.distributed`` only process 0 can say:
    the others may not see its folder, or see it before its last checkpoint is written."""
    if not is_writer():
        return "process 0 writes the run folder, and its message says how to go on."
    if (run_dir.parent / SWEEP_PLAN).exists():  # a program of a sweep: the sweep goes on
        command = f"evorl-pop resume {shlex.quote(str(run_dir.parent))}"
        return f"finish the sweep with `{command}`."
    if (run_dir / CHECKPOINT_FILENAME).exists():
        command = f"evorl-pop resume {shlex.quote(str(run_dir))}"
        return f"continue from its last checkpoint with `{command}`."
    return f"no checkpoint was written; start it again with {restart(run_dir)}."


def restart(run_dir: Path) -> str:
    """The command that starts the run of ``run_dir`` again from its ``config.yaml``."""
    q = lambda path: shlex.quote(str(path))  # noqa: E731
    return (
        f"`evorl-pop train --config {q(run_dir / CONFIG_FILENAME)} --out {q(run_dir)} --overwrite`"
    )


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
