"""Runs on disk: train into a run folder, resume it (the entry points of ``evorl-pop``).

The checkpoint holds the state and run key between chunks, so a resumed run
ends in exactly the state and metrics of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

import evorl_pop
from evorl_pop import backend, metrics_file, multihost, registry, rundir, training
from evorl_pop import checkpoint as ckpt_lib
from evorl_pop import config as config_lib
from evorl_pop.config import RunConfig
from evorl_pop.mesh import make_mesh
from evorl_pop.rundir import RunError, default_run_dir

logger = logging.getLogger("evorl_pop.run")


@dataclasses.dataclass
class RunResult:
    """What a training session ended with."""

    run_dir: Path
    state: Any  # the final algorithm state
    history: dict  # this session's metrics, name to array over its generations
    generation: int  # in total, as the two cumulative counters below
    env_steps: int
    wall_time: float


def _build(config: RunConfig):
    """``(algorithm, mesh, init_key, run_key)``; RunError before any compile if it cannot fit."""
    devices = backend.mesh_devices(config)
    if jax.process_count() > 1 and devices not in (None, jax.device_count()):
        # A mesh over part of the devices would leave processes out of what they all run.
        raise RunError(
            f"devices={config.devices}, but a run over {jax.process_count()} processes uses "
            f"all of their {jax.device_count()} devices: leave devices unset (null) or set it "
            f"to {jax.device_count()}; the device count per process comes from the "
            "environment (XLA_FLAGS on CPUs, the launcher, the scheduler)."
        )
    mesh = make_mesh(devices)
    algorithm = registry.get(config.algorithm).algorithm_class(config.algorithm_config, mesh=mesh)
    init_key, run_key = jax.random.split(jax.random.key(config.seed))
    leaves = jax.tree.leaves(jax.eval_shape(algorithm.init, init_key))
    dims = max((x.shape[-1] for x in leaves if x.ndim and jnp.issubdtype(x.dtype, jnp.floating)),
               default=1)  # fmt: skip
    population = getattr(config.algorithm_config, "population_size", 0) or 0
    # Per device: the replicated state, and its slice of the population held
    # about three times over (candidates, noise, the updated copy).
    need = sum(x.size * x.dtype.itemsize for x in leaves) + 12 * dims * -(-population // mesh.size)
    device = mesh.devices.flat[0]
    have = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
    # Simulated CPU devices share the host's memory.
    have = have or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // mesh.size
    if need > have:
        raise RunError(
            f"population_size={population:,} with {dims:,} parameters per candidate needs about "
            f"{need / 2**30:,.1f} GiB per device, more than the {have / 2**30:,.1f} GiB there "
            "are: lower population_size (or the network), or spread it over more devices."
        )
    return algorithm, mesh, init_key, run_key


def _init_state(algorithm, init_key, mesh):
    """The initial state, replicated on ``mesh`` where the algorithm did not place it:
    a state placed otherwise than a compiled chunk's output would compile it again."""
    # Traced, a placement is a sharding constraint and every process computes the same
    # state; eagerly, JAX would compare values across processes (NaN != NaN).
    multi = jax.process_count() > 1
    state = jax.jit(lambda: algorithm.init(init_key))() if multi else algorithm.init(init_key)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        if isinstance(x, jax.Array) and not (x.committed and isinstance(x.sharding, NamedSharding)):
            return multihost.put(x, replicated)
        return x

    return jax.tree.map(place, state)


def _run(session: training.Session, algorithm, mesh, what: str, progress, figure, stop):
    """Runs a session with the run's log open; Ctrl-C ends in an ``Interrupted``."""
    config, run_dir = session.config, session.run_dir
    names = [getattr(config.algorithm_config, n, None) for n in ("strategy", "task")]
    desc = " ".join([config.algorithm, *(str(n) for n in names if n)])
    try:
        with rundir.writing(run_dir), rundir.logging_to(run_dir):
            logger.info(
                "%s: %s  (evorl_pop %s, jax %s, %s backend, %s device(s) on the population "
                "axis, %d process(es), compilation cache: %s)",
                what, desc, evorl_pop.__version__, jax.__version__, jax.default_backend(),
                mesh.size, jax.process_count(), jax.config.jax_compilation_cache_dir or "off",
            )  # fmt: skip
            for line in config_lib.dumps(config).splitlines():
                logger.info("  %s", line)
            try:
                state, history = training.train_loop(
                    algorithm, session.state, session.run_key,
                    config.generations - session.generation, chunk=config.chunk,
                    callback=session.callback, progress=progress and session.writer, desc=desc,
                    generation_offset=session.generation, stop=stop,
                )  # fmt: skip
                session.checkpoint()
            except KeyboardInterrupt:
                session.checkpoint(collective=False)
                logger.info("interrupted after generation %d", session.generation)
                raise
            logger.info("done: generation %d, %d env steps, %.1fs",
                        session.generation, session.env_steps, session.wall_time)  # fmt: skip
    except KeyboardInterrupt:
        if (run_dir / ckpt_lib.FILENAME).exists():
            what = f"continue from its last checkpoint with `evorl-pop resume {run_dir}`."
        else:
            what = f"no checkpoint was written; start again (with --overwrite to reuse {run_dir})."
        raise training.Interrupted(what) from None
    if figure and session.writer:
        from evorl_pop import plotting  # matplotlib: only when a figure is drawn

        try:
            plotting.plot_runs([run_dir], out=run_dir / rundir.FIGURE_FILENAME)
        except ValueError as err:  # e.g. no rows yet
            logger.info("no figure: %s", err)
    return RunResult(run_dir, state, history, session.generation, session.env_steps,
                     session.wall_time)  # fmt: skip


def train(
    config: RunConfig,
    run_dir: str | os.PathLike | None = None,
    progress: bool = True,
    overwrite: bool = False,
    figure: bool = True,
) -> RunResult:
    """Starts a run of ``config`` in a new run folder.

    Args:
      config: the run config.
      run_dir: the folder (``None``: :func:`default_run_dir`).
      progress: show a progress bar; figure: draw ``fitness.png`` at the end.
      overwrite: replace the records of an earlier run in ``run_dir``.

    Raises:
      ConfigError: a value that cannot run, before anything is written.
    """
    config_lib.validate(config)  # one built in Python has not been checked yet
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    # Process 0's name (a timestamp) is everyone's.
    run_dir = Path(multihost.share(lambda: str(run_dir)))
    try:
        algorithm, mesh, init_key, run_key = _build(config)
    except BaseException:
        if run_dir in rundir.RESERVED and not any(run_dir.iterdir()):
            run_dir.rmdir()  # the empty folder default_run_dir made for this run
        raise
    with training.deferred_interrupts() as stop, rundir.hold(run_dir, True, config, overwrite):
        state = _init_state(algorithm, init_key, mesh)
        session = training.Session(run_dir, config, run_key, state)
        return _run(session, algorithm, mesh, f"new run in {run_dir}", progress, figure, stop)


def resume(
    run_dir: str | os.PathLike,
    overrides=(),
    config_file: str | os.PathLike | None = None,
    more: int | None = None,
    force: bool = False,
    progress: bool = True,
    figure: bool = True,
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
      progress, figure: as for :func:`train`.

    Raises:
      CheckpointError: no checkpoint, a damaged one, or another precision (nothing is changed).
      RunError: a changed config without ``force``, a target before the
        checkpoint, a folder in use or that cannot be written.
      ConfigError: a bad override.
    """
    run_dir = Path(run_dir)
    with training.deferred_interrupts() as stop, rundir.hold(run_dir, False) as (ckpt, source):
        saved = config_lib.from_dict(ckpt.config)
        # A run over several processes uses all their devices, unless told otherwise.
        multi = [f"devices={jax.device_count()}"] if jax.process_count() > 1 else []
        total = [] if more is None else [f"generations={ckpt.generation + more}"]
        config = config_lib.resolve_config(
            [source, *([config_file] if config_file is not None else [])],
            [*multi, *overrides, *total],
        )
        changed = config_lib.differences(saved, config)
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
        algorithm, mesh, init_key, _ = _build(config)
        state = ckpt_lib.restore_state(_init_state(algorithm, init_key, mesh), ckpt)

        def repair():
            path = run_dir / metrics_file.FILENAME
            columns, rows = ckpt.metrics_columns, ckpt.metrics_rows
            if columns and rows is not None:
                metrics_file.restore(path, columns, rows)
            else:  # a checkpoint from before rows were kept, or of generation 0
                columns = metrics_file.truncate(path, ckpt.generation) or ()
                rows = "".join(path.read_text().splitlines(keepends=True)[1:]) if columns else ""
            config_lib.save(config, run_dir / rundir.CONFIG_FILENAME)
            return columns, rows

        with rundir.writing(run_dir):
            columns, rows = multihost.share(repair)
        ckpt = dataclasses.replace(ckpt, metrics_columns=columns, metrics_rows=rows)
        session = training.Session(run_dir, config, ckpt_lib.restore_key(ckpt), state, ckpt)
        what = f"resume from generation {ckpt.generation}"
        what += f" with a changed config (--force: {'; '.join(changed)})" if changed else ""
        return _run(session, algorithm, mesh, what, progress, figure, stop)
