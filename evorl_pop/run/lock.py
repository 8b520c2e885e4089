"""The run folder's lock: one process writes a run folder at a time.

The writing process holds an ``flock`` on ``.lock`` (which holds its pid) while
the run writes the folder; the kernel drops the lock of a process that dies,
so a killed run never blocks its resume. Under ``jax.distributed`` only
process 0 touches the folder; the others get what it read, or the error it
met, through :func:`evorl_pop.run.processes.share`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from evorl_pop.base import CheckpointError, RunError, write_atomic
from evorl_pop.run import config as config_lib
from evorl_pop.run import processes
from evorl_pop.run.folder import (
    CHECKPOINT_FILENAME,
    CONFIG_FILENAME,
    EXTRAS,
    FIGURE_FILENAME,
    LOCK_FILENAME,
    LOG_FILENAME,
    RECORDS,
    _mkdir,
    restart,
    writing,
)


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
