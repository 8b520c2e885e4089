"""The run folder: its name, its lock, what it holds, and how it is read.

A run folder holds::

    config.yaml          the run config (edit it, then `evorl-pop resume --force`)
    metrics.csv          one row per generation, appended between chunks
    checkpoint.msgpack   the latest checkpoint (atomic), see evorl_pop.checkpoint
    train.log            what happened: devices, chunks, checkpoints, resumes, warnings
    fitness.png          fitness curves, redrawn at the end of each session
    .lock                locked (flock) by the process writing the run; holds its pid

One process writes a run folder at a time; the kernel drops the lock of a
process that dies, so a killed run never blocks its resume. Under
``jax.distributed`` only process 0 touches the folder; the others get what it
read, or the error it met, through :func:`evorl_pop.multihost.share`.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import itertools
import logging
import os
import shutil
from pathlib import Path

import jax

from evorl_pop import checkpoint as ckpt_lib
from evorl_pop import config as config_lib
from evorl_pop import metrics_file, multihost
from evorl_pop.config import RunConfig

CONFIG_FILENAME = "config.yaml"
LOG_FILENAME = "train.log"
FIGURE_FILENAME = "fitness.png"
LOCK_FILENAME = ".lock"
RECORDS = (CONFIG_FILENAME, metrics_file.FILENAME, ckpt_lib.FILENAME)

logger = logging.getLogger("evorl_pop.run")
#: Folders :func:`default_run_dir` created, removed again if the run fails before using them.
RESERVED: set[Path] = set()


class RunError(RuntimeError):
    """A run that cannot start or continue as asked (the message says why)."""


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
    run created it first, so runs started at once never share a folder.
    """
    task = str(getattr(config.algorithm_config, "task", None) or "run").replace("/", "-")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{config.algorithm}-{task}-{config.seed}-{stamp}"
    if not is_writer():
        return base
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        with contextlib.suppress(FileExistsError):
            _mkdir(path, exist_ok=False)
            RESERVED.add(path)
            return path


@contextlib.contextmanager
def hold(run_dir: Path, new: bool, config: RunConfig | None = None, overwrite: bool = False):
    """Holds the run folder's lock while the run writes it.

    ``new``: create the folder, refuse one holding files of a run unless
    ``overwrite``, and write ``config``. Else the folder must hold a checkpoint,
    and the context yields ``(checkpoint, config.yaml's mapping)`` as process 0
    read them (the checkpoint's config when there is no ``config.yaml``).
    """
    handle = None

    def acquire():
        nonlocal handle
        if new:
            _mkdir(run_dir, exist_ok=True)
        elif not run_dir.is_dir():
            raise RunError(f"No run folder at {str(run_dir)!r}.")
        else:
            ckpt = ckpt_lib.load(run_dir)  # a folder without a run gets no lock file
        handle = open(run_dir / LOCK_FILENAME, "a+")  # noqa: SIM115 (held until the run ends)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            handle.close()
            raise RunError(
                f"{str(run_dir)!r} is in use by another evorl-pop process (pid {pid}); wait "
                "for it to end (or stop it) before writing to this run folder, or choose another."
            ) from None
        # A refusal leaves even the lock file as it was.
        present = [n for n in (*RECORDS, LOG_FILENAME, FIGURE_FILENAME) if (run_dir / n).exists()]
        if new and present and not overwrite:
            raise RunError(
                f"{str(run_dir)!r} holds a run already ({', '.join(present)}). Continue it with "
                f"`evorl-pop resume {run_dir}`, or pass --overwrite to start afresh there."
                if any(n in RECORDS for n in present)
                else f"{str(run_dir)!r} holds files a run writes ({', '.join(present)}); pass "
                "--overwrite to replace them, or choose another folder."
            )
        for name in present if new else ():
            path = run_dir / name
            path.unlink() if path.is_file() else shutil.rmtree(path)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        if new:
            return config_lib.save(config, run_dir / CONFIG_FILENAME)
        path = run_dir / CONFIG_FILENAME
        return ckpt, config_lib.read_mapping(path) if path.exists() else ckpt.config

    try:
        with writing(run_dir):
            held = multihost.share(acquire)
        yield held
    finally:
        if handle is not None:
            handle.close()  # releases the lock


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


@contextlib.contextmanager
def logging_to(run_dir: Path):
    """Appends the ``evorl_pop.run`` log to ``RUN/train.log`` (on the writing process)."""
    handler = logging.FileHandler(run_dir / LOG_FILENAME) if is_writer() else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
