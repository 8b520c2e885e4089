"""The run folder's names and what is said about it: the files a run writes there,
the folder a new run gets, the write errors and the commands that go on with a
stopped run (the layout: :mod:`evorl_pop.run.store`).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import os
import shlex
from pathlib import Path

import jax

from evorl_pop.base import RunError
from evorl_pop.core.capabilities import OnTask
from evorl_pop.run import processes
from evorl_pop.run.config import RunConfig

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
    settings = config.algorithm_config
    task = settings.task if isinstance(settings, OnTask) else None
    task = str(task or "run").replace("/", "-")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{config.algorithm}-{task}-{config.seed}-{stamp}"
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        with contextlib.suppress(FileExistsError):
            _mkdir(path, exist_ok=False)
            RESERVED.add(path)
            return path


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
