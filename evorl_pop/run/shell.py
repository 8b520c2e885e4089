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
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from evorl_pop.base import (
    CheckpointError,
    ConfigError,
    RunError,
    __version__,
    objective_error,
    read_text,
)
from evorl_pop.core.engine import make_mesh
from evorl_pop.core.interfaces import Exports
from evorl_pop.run import config as config_lib
from evorl_pop.run import loggers, processes, restore, store
from evorl_pop.run import replicas as replicas_lib
from evorl_pop.run import stop as stop_lib
from evorl_pop.run.config import RunConfig
from evorl_pop.run.store import Recorder

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
    labels: list = dataclasses.field(default_factory=list)  # replicas: each one's labels


# --- the compiled chunk loop ----------------------------------------------------------


def chunk_fn(algorithm, length: int):
    """``length`` generations as one compiled ``lax.scan``: ``(state, key) -> (state, metrics)``,
    generation ``g`` with ``fold_in(key, g)`` (``g`` the state's ``generation``; a multi-seed
    run's keys, one per seed, each folded), the metrics stacked over the chunk.
    :func:`train_loop` runs them; benchmarks time them."""

    def body(carry, _):
        state, key = carry
        dtypes = jax.tree.map(lambda x: x.dtype, state)
        if jnp.ndim(key):  # a multi-seed run: seed s folds g into its own run key
            generation_key = jax.vmap(jax.random.fold_in, (0, None))(key, state.generation)
        else:
            generation_key = jax.random.fold_in(key, state.generation)
        new_state, metrics = algorithm.step(state, generation_key)
        # A leaf that came back weakly typed would compile the next chunk again.
        return (jax.tree.map(jnp.asarray, new_state, dtypes), key), metrics

    def chunk(state, key):
        (state, _), metrics = jax.lax.scan(body, (state, key), None, length=length)
        return state, metrics

    return jax.jit(chunk)


def train_loop(
    algorithm,
    state,
    key: jax.Array,
    num_generations: int,
    chunk: int = 5,
    callback: Callable[[object, dict], None] | None = None,
    progress: bool = True,
    desc: str = "train",
    generation_offset: int = 0,
    stop: Callable[[], bool] | None = None,
):
    """Runs ``num_generations`` generations in jitted ``lax.scan`` chunks.

    Args:
      algorithm: an object with ``step(state, key) -> (state, metrics)``.
      state: its state, whose integer ``generation`` (counted from the run's
        start) picks the key ``fold_in(key, generation)``.
      key: the run's key.
      num_generations: generations to run from ``state``.
      chunk: generations per compiled chunk (a run config's ``chunk``).
      callback: ``callback(state, metrics)`` after each chunk, the metrics as
        NumPy arrays over the chunk's generations.
      progress, desc: a progress bar (best / mean fitness, steps/s) and its label.
      generation_offset: generations done before this call (the bar counts from it).
      stop: asked before each chunk; ``True`` raises
        :class:`~evorl_pop.run.stop.Requested` (a ``KeyboardInterrupt``) there.

    Returns:
      ``(state, history)``: each metric's NumPy array over all generations run.
    """
    if num_generations < 0 or chunk < 1:
        raise ValueError(f"need generations >= 0 and chunk >= 1, got {num_generations}, {chunk}")
    history: dict[str, list[np.ndarray]] = {}
    total = generation_offset + num_generations
    bar = tqdm(total=total, initial=generation_offset, desc=desc, disable=not progress, unit="gen")
    done = 0
    compiled = {}
    while done < num_generations:
        if stop is not None and stop():
            bar.close()
            raise stop_lib.Requested
        length = min(chunk, num_generations - done)
        if length not in compiled:
            compiled[length] = chunk_fn(algorithm, length)
        t0 = time.perf_counter()
        many = jax.process_count() > 1
        try:
            # Every device's part: a replicated output is read from one device, while
            # another may still be running (a host callback then outlives the run).
            state, metrics = jax.block_until_ready(compiled[length](state, key))
            # One transfer; under jax.distributed the metrics span every process's devices.
            metrics = jax.tree.map(processes.to_host, metrics) if many else jax.device_get(metrics)
        except jax.errors.JaxRuntimeError as err:  # a Python objective's error in one line
            raise objective_error(err) from None
        elapsed = time.perf_counter() - t0
        done += length
        for name, values in metrics.items():
            history.setdefault(name, []).append(values)
        if callback is not None:
            callback(state, metrics)
        best = np.mean(metrics["fitness_best"][-1])  # a multi-seed run: the seeds' mean
        mean = np.mean(metrics["fitness_mean"][-1])
        postfix = {"best": f"{best:.4g}", "mean": f"{mean:.4g}"}
        if "env_steps" in metrics and metrics["env_steps"].sum() > 0:
            postfix["steps/s"] = f"{metrics['env_steps'].sum() / elapsed:.3g}"
        bar.set_postfix(postfix)
        bar.update(length)
    bar.close()
    return state, dict(zip(history, map(np.concatenate, history.values()), strict=True))


# --- building a run -------------------------------------------------------------------


def build(config: RunConfig):
    """The algorithm of a run, its mesh and its initial state; RunError before any
    compile if the state and population cannot fit on a device.

    Returns:
      ``(algorithm, mesh, state, run_key, yaml)``: ``init`` is traced once, its
      shapes checked, then run; its state is replicated where it was not placed;
      ``yaml`` is the config as ``config.yaml`` holds it.
    """
    text = config_lib.dumps(config)
    config_lib.validate(config, algorithm=False)  # the algorithm checks its own config
    algorithm_class = config_lib.get(config.algorithm).algorithm_class
    devices = processes.mesh_devices(config)
    if jax.process_count() > 1 and devices not in (None, jax.device_count()):
        # A mesh over part of the devices would leave processes out of what they all run.
        raise RunError(
            f"devices={config.devices}, but a run over {jax.process_count()} processes uses "
            f"all of their {jax.device_count()} devices: leave devices unset (null) or set it "
            f"to {jax.device_count()}; the device count per process comes from the "
            "environment (XLA_FLAGS on CPUs, the launcher, the scheduler)."
        )
    mesh = make_mesh(devices)
    if config.seeds > 1 or config.sweep:  # replicas of seeds and settings, in one program
        algorithm, init_key, run_key = replicas_lib.build(algorithm_class, config, mesh)
    else:
        algorithm = algorithm_class(config.algorithm_config, mesh=mesh)
        init_key, run_key = jax.random.split(jax.random.key(config.seed))
    init = jax.jit(algorithm.init).trace(init_key)
    leaves = jax.tree.leaves(init.out_info)
    dims = max(
        (x.shape[-1] for x in leaves if x.ndim and jnp.issubdtype(x.dtype, jnp.floating)), default=1
    )
    population = getattr(config.algorithm_config, "population_size", 0) or 0
    # Per device: the replicated state, and its slice of the population held
    # about three times over (candidates, noise, the updated copy).
    width = 8 if config.precision == "float64" else 4
    need = sum(x.size * x.dtype.itemsize for x in leaves)
    need += 3 * width * dims * -(-population // mesh.size)
    device = mesh.devices.flat[0]
    have = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
    # Simulated CPU devices share the host's memory.
    have = have or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // mesh.size
    replicas = len(getattr(algorithm, "labels", ())) or 1
    need += 3 * width * dims * -(-population // mesh.size) * (replicas - 1)
    if need > have:
        if replicas > 1:
            fit = int(have // (need / replicas))
            settings = replicas // config.seeds
            what = f"seeds={config.seeds}" + (f" x {settings} settings" if config.sweep else "")
            raise RunError(
                f"{what} of population_size={population:,} with {dims:,} "
                f"parameters per candidate need about {need / 2**30:,.1f} GiB per device, more "
                f"than the {have / 2**30:,.1f} GiB there are: about {fit} replicas fit; lower "
                "seeds or the sweep (and run the others in a second run), or spread them over "
                "more devices."
            )
        raise RunError(
            f"population_size={population:,} with {dims:,} parameters per candidate needs about "
            f"{need / 2**30:,.1f} GiB per device, more than the {have / 2**30:,.1f} GiB there "
            "are: lower population_size (or the network), or spread it over more devices."
        )
    state = init.lower().compile()(init_key)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):  # a state placed otherwise than a chunk's output would compile it again
        if isinstance(x, jax.Array) and not isinstance(x.sharding, NamedSharding):
            return processes.put(x, replicated)
        return x

    return algorithm, mesh, jax.tree.map(place, state), run_key, text


def default_recorders(
    extra: Sequence[Recorder] = (), config: RunConfig | None = None
) -> list[Recorder]:
    """The run folder's recorders (metrics.csv, train.log, checkpoints), the loggers
    ``config.loggers`` names (but those ``extra`` has), then ``extra``."""
    wanted = config is not None and any(name != "csv" for name in config.loggers)
    named = loggers.from_config(config, extra) if wanted else []
    return [store.MetricsCSV(), store.TrainLog(), store.Checkpoints(), *named, *extra]


def _rows(run: store.Run, metrics: dict, wall: float) -> list[dict]:
    """A chunk's metrics as ``metrics.csv`` rows; advances the run's counters. A run of
    replicas (seeds, a sweep) has a row per generation and replica (its metrics: one
    column per replica), each with its labels and that replica's own ``env_steps``."""
    n = len(next(iter(metrics.values())))
    rows = []
    for i in range(n):
        time = run.wall_time + (wall - run.wall_time) * (i + 1) / n  # shared out evenly
        for r, label in enumerate(run.labels or [{}]):
            at = (i, r) if run.labels else (i,)
            steps = int(metrics["env_steps"][at]) if "env_steps" in metrics else 0
            run.env_steps += steps
            row = {"env_steps_gen" if k == "env_steps" else k: v[at] for k, v in metrics.items()}
            row.update(generation=run.generation + 1 + i, wall_time=time)
            if run.labels:  # a replica: its labels, its own steps so far
                run.replica_env_steps[r] += steps
                row.update(label, env_steps=run.replica_env_steps[r])
            else:
                row.update(env_steps=run.env_steps)
            rows.append(row)
    run.wall_time = wall
    run.generation += n
    return rows


def _session(
    run: store.Run, algorithm, state, recorders, progress, figure, time_limit=None
) -> RunResult:
    """Starts the recorders and runs a session's generations through them; a stop ends
    in an :class:`~evorl_pop.run.stop.Interrupted` that says what the run folder holds."""
    config = run.config
    start = time.perf_counter()
    base = run.wall_time
    # A stop signal sets the flag, read between chunks; a time limit or other processes
    # need the poll (evorl_pop.run.stop handles what comes after).
    flag = stop_lib.held() or stop_lib.Flag()  # evorl-pop's: set by a signal before now
    poll = flag.is_set
    if time_limit is not None or jax.process_count() > 1:
        poll = stop_lib.Poll(flag, time_limit)

    def record(state, metrics):
        rows = _rows(run, metrics, base + time.perf_counter() - start)
        run.add(rows, metrics)
        for recorder in recorders:
            for row in rows:
                recorder.row(row)
            recorder.flush(run, state)

    previous = {}
    try:
        if threading.current_thread() is threading.main_thread():
            # Replaces JAX's own SIGTERM handler (its preemption notifier) for the session;
            # a signal while the recorders start stops after the first chunk.
            previous = {sig: signal.signal(sig, flag.handler) for sig in stop_lib.STOP_SIGNALS}
        for recorder in recorders:
            recorder.start(run, state)
        try:
            state, history = train_loop(
                algorithm,
                state,
                run.key,
                config.generations - run.generation,
                chunk=config.chunk,
                callback=record,
                progress=progress and run.writer,
                desc=_desc(config),
                generation_offset=run.generation,
                stop=poll,
            )
        except KeyboardInterrupt as err:
            if isinstance(err, stop_lib.Requested):
                # Every process stopped after the same chunk: they checkpoint together,
                # and the log's last line says why.
                run.stopped = stop_lib.reason(flag, poll)[0]
            for recorder in reversed(recorders):
                recorder.finish(run, completed=False)
            raise
        finally:  # the signals' handlers as before the session
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if figure and run.writer and run.generation:  # no generation: nothing to draw
            _figure(run, recorders)
        if run.writer and isinstance(algorithm, Exports):
            _export(run, algorithm, state, recorders)
        for recorder in reversed(recorders):
            recorder.finish(run, completed=True)
    except KeyboardInterrupt as err:
        raise stop_lib.interrupted(err, flag, poll, run) from None
    return RunResult(
        run.run_dir, state, history, run.generation, run.env_steps, run.wall_time, run.labels
    )


def _figure(run: store.Run, recorders) -> None:
    """``fitness.png``, shown to the recorders; a figure that cannot be drawn or written
    is a line in the log, the run itself being complete."""
    from evorl_pop.run import plotting  # matplotlib: only when a figure is drawn

    path = run.run_dir / store.FIGURE_FILENAME
    try:
        plotting.plot_runs([run.run_dir], out=path)
    except (ValueError, OSError) as err:  # no rows yet; a full disk
        what = err.strerror if isinstance(err, OSError) and err.strerror else err
        logger.info("no figure: %s", what)
        print(
            f"warning: no figure ({what}); `evorl-pop plot {shlex.quote(str(run.run_dir))} "
            "--out FILE` draws it later",
            file=sys.stderr,
        )
        return
    for recorder in recorders:
        recorder.image("fitness", path)


def _export(run: store.Run, algorithm: Exports, state, recorders) -> None:
    """The algorithm's result beyond one solution (:class:`Exports`), its figures shown
    to the recorders; one that cannot be written is a line in the log, as a figure."""
    try:
        columns = store.read_metrics_lines(run.columns, run.lines)
        figures = algorithm.export(state, run.run_dir, columns)
    except (ValueError, OSError) as err:
        what = err.strerror if isinstance(err, OSError) and err.strerror else err
        logger.info("no export: %s", what)
        print(f"warning: the run's result was not exported ({what})", file=sys.stderr)
        return
    for name, path in figures.items():
        for recorder in recorders:
            recorder.image(name, path)


def _desc(config: RunConfig) -> str:
    """``es Open_ES CartPole-v1``: the algorithm, its strategy and task."""
    names = [getattr(config.algorithm_config, n, None) for n in ("strategy", "task")]
    return " ".join([config.algorithm, *(str(n) for n in names if n)])


def _about(what: str, config: RunConfig, mesh) -> str:
    return (
        f"{what}: {_desc(config)}  (evorl_pop {__version__}, jax {jax.__version__}, "
        f"{jax.default_backend()} backend, {mesh.size} device(s) on the population axis, "
        f"{jax.process_count()} process(es), compilation cache: "
        f"{jax.config.jax_compilation_cache_dir or 'off'})"
    )


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
    run_dir = Path(run_dir) if run_dir is not None else store.default_run_dir(config)
    try:
        algorithm, mesh, state, run_key, text = build(config)
        stop_lib.check()  # a signal while it compiled: nothing is written yet
    except BaseException as err:
        if run_dir in store.RESERVED and not any(run_dir.iterdir()):
            run_dir.rmdir()  # the empty folder default_run_dir made for this run
        if isinstance(err, jax.errors.JaxRuntimeError):
            raise objective_error(err) from None
        raise
    about = _about(f"new run in {run_dir}", config, mesh)
    try:
        recorders = default_recorders(recorders, config)
    except ConfigError:
        if run_dir in store.RESERVED and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise
    try:
        with store.hold(run_dir, True, text, overwrite):
            run = store.Run(
                run_dir,
                config,
                text,
                run_key,
                about,
                writer=jax.process_index() == 0,
                devices=mesh.size,
                labels=getattr(algorithm, "labels", []),
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
        with store.hold(run_dir, False, read=restore.load_checkpoint) as held:
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
        path = run_dir / store.METRICS_FILENAME
        columns, rows = ckpt.metrics_columns, ckpt.metrics_rows
        if columns and rows is not None:
            restore.restore_metrics(path, columns, rows)
        else:  # a checkpoint from before rows were kept, or of generation 0
            columns = restore.truncate_metrics(path, ckpt.generation) or ()
            rows = "".join(read_text(path, "").splitlines(keepends=True)[1:]) if columns else ""
        config_lib.save(config, run_dir / store.CONFIG_FILENAME)
        return columns, rows

    columns, rows = processes.share(repair)
    what = f"resume from generation {ckpt.generation}"
    what += f" with a changed config (--force: {'; '.join(changed)})" if changed else ""
    run = store.Run(
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
        labels=getattr(algorithm, "labels", []),
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
