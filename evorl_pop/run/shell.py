"""The run shell: the one way a run is built and run, from the command line,
the examples and Python.

::

    RunConfig ─► run settings checked; devices and the mesh; the algorithm
                 (it checks its own config, once); init traced once (jit):
                 its shapes for the memory check, then the initial state
              ─► run folder: lock, config.yaml; recorders start
              ─► chunks of generations, each one jit(lax.scan(step)):
                 generation g uses fold_in(run key, g); after each chunk its
                 rows ─► recorders (metrics.csv, train.log, checkpoint, ...)
              ─► fitness.png ─► recorders finish

A run split into chunks, or stopped and resumed, gives the result of one
piece: the checkpoint holds the state and the run key between chunks, so a
resumed run ends in exactly the state and metrics of an uninterrupted one.
Ctrl-C, SIGTERM and SIGUSR1 (a scheduler's notice before it preempts a job)
and a session's time limit stop a run at the end of a chunk, the same one on
every process; the run checkpoints, and says how to resume it
(:mod:`evorl_pop.run.stop`).

The parts: :mod:`evorl_pop.run.build` (the algorithm, its mesh and initial
state), :mod:`evorl_pop.run.loop` (the compiled chunks,
:func:`~evorl_pop.run.loop.train_loop`), :mod:`evorl_pop.run.session` (the
recorders around them); this module holds the entry points, :func:`train` and
:func:`resume`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax

from evorl_pop.base import (
    CheckpointError,
    ConfigError,
    RunError,
    objective_error,
    read_text,
)
from evorl_pop.run import config as config_lib
from evorl_pop.run import folder, processes, restore
from evorl_pop.run import stop as stop_lib
from evorl_pop.run.build import build
from evorl_pop.run.config import RunConfig
from evorl_pop.run.lock import hold
from evorl_pop.run.loop import chunk_fn, train_loop
from evorl_pop.run.recorders import Recorder, Run
from evorl_pop.run.session import RunResult, _about, _session, default_recorders, labels

__all__ = ["RunResult", "build", "chunk_fn", "default_recorders", "resume", "train", "train_loop"]


# --- the entry points -----------------------------------------------------------------


def train(
    config: RunConfig,
    run_dir: str | os.PathLike | None = None,
    progress: bool = True,
    overwrite: bool = False,
    figure: bool = True,
    recorders: Sequence[Recorder] = (),
    time_limit: float | None = None,
) -> RunResult:
    """Starts a run of ``config`` in a new run folder.

    Args:
      config: the run config (an algorithm's config alone runs with the
        default run settings).
      run_dir: the folder (``None``: ``runs/<algorithm>-<task>-<seed>-<time>``).
      progress: show a progress bar; figure: draw ``fitness.png`` at the end.
      overwrite: replace the records of an earlier run in ``run_dir``.
      recorders: recorders beside the run folder's own and the loggers ``config.loggers``
        names (:mod:`evorl_pop.run.loggers`; one given here replaces the config's of its class).
      time_limit: seconds this session may train; it stops with a checkpoint
        before a chunk would pass them (:class:`~evorl_pop.run.stop.Interrupted`,
        status 124).

    Raises:
      ConfigError: a value that cannot run, before anything is written.
      RunError: a folder in use or that cannot be written, a population that cannot fit.
    """
    if not isinstance(config, RunConfig):
        config = RunConfig(config_lib.name_of(config), algorithm_config=config)
    run_dir = Path(run_dir) if run_dir is not None else folder.default_run_dir(config)
    try:
        algorithm, mesh, state, run_key, text = build(config)
        stop_lib.check()  # a signal while it compiled: nothing is written yet
    except BaseException as err:
        if run_dir in folder.RESERVED and not any(run_dir.iterdir()):
            run_dir.rmdir()  # the empty folder default_run_dir made for this run
        if isinstance(err, jax.errors.JaxRuntimeError):
            raise objective_error(err) from None
        raise
    about = _about(f"new run in {run_dir}", config, mesh)
    try:
        recorders = default_recorders(recorders, config)
    except ConfigError:
        if run_dir in folder.RESERVED and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise
    try:
        with hold(run_dir, True, text, overwrite):
            run = Run(
                run_dir,
                config,
                text,
                run_key,
                about,
                writer=jax.process_index() == 0,
                devices=mesh.size,
                labels=labels(algorithm),
            )
            return _session(run, algorithm, state, recorders, progress, figure, time_limit)
    except KeyboardInterrupt as err:  # before the session: what the run folder holds
        raise stop_lib.told(err, run_dir) from None


def resume(
    run_dir: str | os.PathLike,
    overrides=(),
    config_file: str | os.PathLike | None = None,
    more: int | None = None,
    force: bool = False,
    progress: bool = True,
    figure: bool = True,
    recorders: Sequence[Recorder] = (),
    time_limit: float | None = None,
) -> RunResult:
    """Continues a run from its latest checkpoint.

    The run's ``config.yaml`` (and ``config_file`` and ``overrides`` on top)
    must match the checkpoint's config but for ``RESUMABLE_FIELDS``, unless
    ``force``. ``metrics.csv`` is first made to hold exactly the checkpoint's rows.

    Args:
      run_dir: the run folder.
      overrides, config_file: ``key=value`` strings and a YAML / TOML file over
        ``config.yaml``; ``generations=N`` sets a new total, ``devices=N``,
        ``chunk=N`` or ``checkpoint_every=N`` new run settings (another device
        count agrees with an uninterrupted run to float tolerance, not bit for bit).
      more: run this many generations beyond the checkpoint.
      force: continue even if the config differs from the checkpoint's.
      progress, figure, recorders, time_limit: as for :func:`train`.

    Raises:
      CheckpointError: no checkpoint, a damaged one, or another precision (nothing is changed).
      RunError: a changed config without ``force``, a target before the
        checkpoint, a folder in use or that cannot be written.
      ConfigError: a bad override.
    """
    run_dir = Path(run_dir)
    try:
        with hold(run_dir, False, read=restore.load_checkpoint) as held:
            run, algorithm, state = _restored(run_dir, *held, overrides, config_file, more, force)
            recorders = default_recorders(recorders, run.config)
            return _session(run, algorithm, state, recorders, progress, figure, time_limit)
    except KeyboardInterrupt as err:  # before the session: what the run folder holds
        raise stop_lib.told(err, run_dir) from None


def _restored(run_dir: Path, ckpt, source, overrides, config_file, more, force):
    """The run, algorithm and state a resume continues from ``ckpt`` (see :func:`resume`);
    ``metrics.csv`` made to hold the checkpoint's rows and ``config.yaml`` the config."""
    saved = config_lib.from_dict(ckpt.config, check=False)
    # A run over several processes uses all their devices, unless told otherwise.
    multi = [f"devices={jax.device_count()}"] if jax.process_count() > 1 else []
    total = [] if more is None else [f"generations={ckpt.generation + more}"]
    config = config_lib.resolve_config(
        [source, *([config_file] if config_file is not None else [])],
        [*multi, *overrides, *total],
        check=False,
    )
    changed = config_lib.differences(saved, config)
    if config.precision != saved.precision:  # the checkpoint's arrays are of its precision
        raise RunError(
            f"The config differs from the checkpoint's ({'; '.join(changed)}): a run keeps "
            f"its precision, even with --force; resume with precision={saved.precision}, or "
            f"start a new run for {config.precision}."
        )
    if changed and not force:
        raise RunError(
            f"The config differs from the checkpoint's ({'; '.join(changed)}): continuing "
            "would not reproduce the run. Pass --force to continue with the new config anyway."
        )
    if config.generations < ckpt.generation:
        raise RunError(
            f"The checkpoint is at generation {ckpt.generation}, past the requested total "
            f"of {config.generations}; ask for more (--generations N with N >= "
            f"{ckpt.generation}, or --more N)."
        )
    try:
        algorithm, mesh, template, _, text = build(config)
    except jax.errors.JaxRuntimeError as err:
        raise objective_error(err) from None
    try:
        state = restore.restore_state(template, ckpt)
    except CheckpointError as err:
        if not changed:
            raise
        raise CheckpointError(
            f"{err} The config was changed ({'; '.join(changed)}), and --force continues "
            "only with changes that keep the state's shape (more generations, another "
            "learning rate); this one needs a new run. Nothing was changed here."
        ) from None

    def repair():
        path = run_dir / folder.METRICS_FILENAME
        columns, rows = ckpt.metrics_columns, ckpt.metrics_rows
        if columns and rows is not None:
            restore.restore_metrics(path, columns, rows)
        else:  # a checkpoint from before rows were kept, or of generation 0
            columns = restore.truncate_metrics(path, ckpt.generation) or ()
            rows = "".join(read_text(path, "").splitlines(keepends=True)[1:]) if columns else ""
        config_lib.save(config, run_dir / folder.CONFIG_FILENAME)
        return columns, rows

    columns, rows = processes.share(repair)
    what = f"resume from generation {ckpt.generation}"
    what += f" with a changed config (--force: {'; '.join(changed)})" if changed else ""
    run = Run(
        run_dir,
        config,
        text,
        key=restore.restore_key(ckpt),
        about=_about(what, config, mesh),
        generation=ckpt.generation,
        env_steps=ckpt.env_steps,
        wall_time=ckpt.wall_time,
        start_generation=ckpt.generation,
        columns=tuple(columns),
        lines=rows.splitlines(keepends=True),
        writer=jax.process_index() == 0,
        devices=mesh.size,
        labels=labels(algorithm),
    )
    if ckpt.devices and ckpt.devices != mesh.size and run.writer:
        note = (
            f"note: resuming on {mesh.size} device(s) a run checkpointed on {ckpt.devices}: "
            "it continues as a fresh run on this count would, equal to float rounding, "
            "which a chaotic run (e.g. CMA-ES's eigendecomposition) can amplify; resume "
            f"with --devices {ckpt.devices} to continue bit for bit."
        )
        print(note, file=sys.stderr)
        run.about += f"\n{note}"
    return run, algorithm, state
