"""Runs on disk: train into a run folder, resume it, and keep its records.

A run folder holds::

    config.yaml          the run config (edit it, then `evorl-pop resume --force`)
    metrics.csv          one row per generation, appended between chunks
    checkpoint.msgpack   the latest checkpoint (atomic), see evorl_pop.checkpoint
    train.log            what happened: devices, chunks, checkpoints, resumes
    fitness.png          fitness curves, redrawn at the end of each session

Generation ``g`` always uses ``fold_in(run_key, g)`` and the checkpoint holds
the state and key between chunks, so a resumed run ends in exactly the state
and metrics of an uninterrupted one. Under ``jax.distributed`` every process
computes, and only process 0 writes files.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from evorl_pop import checkpoint as ckpt_lib
from evorl_pop import config as config_lib
from evorl_pop import metrics_file, multihost, registry
from evorl_pop.config import ConfigError, RunConfig

CONFIG_FILENAME = "config.yaml"
LOG_FILENAME = "train.log"
FIGURE_FILENAME = "fitness.png"

logger = logging.getLogger("evorl_pop.run")


class RunError(RuntimeError):
    """A run that cannot start or continue as asked (the message says why)."""


@dataclasses.dataclass
class RunResult:
    """What a training session ended with.

    Attributes:
      run_dir: the run folder.
      state: the final algorithm state.
      history: this session's metrics, name to array over its generations.
      generation: generations completed in total.
      env_steps: cumulative environment steps.
      wall_time: cumulative training seconds.
    """

    run_dir: Path
    state: Any
    history: dict
    generation: int
    env_steps: int
    wall_time: float


def is_writer() -> bool:
    """Whether this process writes files: process 0 under ``jax.distributed``, else always."""
    from evorl_pop.distributed import get_process_id

    return get_process_id() == 0


def default_run_dir(config: RunConfig, root: str | os.PathLike = "runs") -> Path:
    """A fresh folder ``root/<algorithm>-<task>-<seed>-<timestamp>``.

    Args:
      config: the run config.
      root: the folder that collects runs.

    Returns:
      A path that does not exist yet.
    """
    cfg = config.algorithm_config
    task = next(
        (getattr(cfg, n) for n in ("task", "env_name", "env") if getattr(cfg, n, None)), "run"
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    task = str(task).replace("/", "-")  # bbob/<name> names one folder, not two
    base = Path(root) / f"{config.algorithm}-{task}-{config.seed}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _from_writer(text: str) -> str:
    """Process 0's ``text`` on every process (itself for a single process)."""
    return multihost.broadcast_bytes(text.encode()).decode()


def _describe(config: RunConfig) -> str:
    cfg = config.algorithm_config
    parts = [config.algorithm]
    for name in ("strategy", "task", "env_name", "env"):
        if getattr(cfg, name, None):
            parts.append(str(getattr(cfg, name)))
    return " ".join(parts)


def build(config: RunConfig):
    """The algorithm of a run config on its mesh.

    Args:
      config: the run config (``devices``: how many devices on the ``POP`` axis).

    Returns:
      ``(algorithm, mesh, init_key, run_key)``: the run key is what every
      generation folds its index into.
    """
    import jax

    from evorl_pop.mesh import make_mesh

    spec = registry.get(config.algorithm)
    if jax.process_count() > 1 and config.devices not in (None, jax.device_count()):
        # A mesh over part of the devices would leave some processes out of
        # the computation they all run.
        raise RunError(
            f"devices={config.devices}, but a run over {jax.process_count()} processes uses "
            f"all of their {jax.device_count()} devices: leave devices unset (null) or set it "
            f"to {jax.device_count()}; the device count per process comes from the "
            "environment (XLA_FLAGS on CPUs, the launcher, the scheduler)."
        )
    mesh = make_mesh(config.devices)
    algorithm = spec.algorithm_class(config.algorithm_config, mesh=mesh)
    init_key, run_key = jax.random.split(jax.random.key(config.seed))
    return algorithm, mesh, init_key, run_key


def init_state(algorithm, init_key, mesh):
    """The algorithm's initial state, placed on the mesh (see :func:`place_state`).

    Args:
      algorithm: the algorithm (``init(key) -> state``).
      init_key: the run's init key.
      mesh: the run's mesh.

    Returns:
      The initial state.
    """
    import jax

    if jax.process_count() > 1:
        # Run eagerly, an init that places host values on the global mesh would
        # have JAX compare them across processes (NaN never compares equal) and
        # would evaluate populations outside jit; traced, a placement is just a
        # sharding constraint and every process computes the same state.
        state = jax.jit(lambda: algorithm.init(init_key))()
    else:
        state = algorithm.init(init_key)
    return place_state(state, mesh)


def place_state(state, mesh):
    """Replicates every not-yet-placed array of a state over the mesh.

    A compiled chunk returns its state committed to the mesh; a fresh or
    restored state that is not would compile the chunk a second time, and a
    resumed run would run a different program than an uninterrupted one.
    Arrays already on a ``NamedSharding`` (e.g. a sharded population) stay.

    Args:
      state: the algorithm state.
      mesh: the run's mesh.

    Returns:
      The state with every other array replicated, ``P()``, on ``mesh``.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        if isinstance(x, jax.Array) and not (x.committed and isinstance(x.sharding, NamedSharding)):
            return multihost.put(x, replicated)
        return x

    return jax.tree.map(place, state)


class _Session:
    """Writes metrics rows and checkpoints between chunks (on the writing process)."""

    def __init__(
        self,
        run_dir: Path,
        config: RunConfig,
        run_key,
        generation: int,
        env_steps: int,
        wall_time: float,
        columns=None,
    ):
        self.run_dir = run_dir
        self.config = config
        self.run_key = run_key
        self.writer = is_writer()
        self.generation = generation
        self.env_steps = env_steps
        self.wall_base = wall_time
        self.wall_time = wall_time
        self.start = time.perf_counter()
        self.columns = tuple(columns) if columns else None
        self.metrics = None
        self.state = None
        self.saved_generation = generation
        self.last_checkpoint_generation = generation

    def callback(self, state, metrics) -> None:
        first = next(iter(metrics.values()))
        n = len(first)
        generation = int(multihost.to_host(state.generation))
        wall = self.wall_base + time.perf_counter() - self.start
        rows = []
        for i in range(n):
            self.env_steps += int(metrics["env_steps"][i]) if "env_steps" in metrics else 0
            row = {
                "generation": generation - n + 1 + i,
                "env_steps": self.env_steps,
                # Time within a chunk is shared out evenly: the host sees only its end.
                "wall_time": self.wall_time + (wall - self.wall_time) * (i + 1) / n,
            }
            for name, values in metrics.items():
                if name == "env_steps":
                    row["env_steps_gen"] = values[i]
                elif name not in row:
                    row[name] = values[i]
            rows.append(row)
        self.wall_time = wall
        self.generation = generation
        self.state = state
        if self.columns is None:
            self.columns = metrics_file.columns_for(metrics)
        if self.writer:
            if self.metrics is None:
                self.metrics = metrics_file.MetricsWriter(
                    self.run_dir / metrics_file.FILENAME, self.columns
                )
            self.metrics.append(rows)
            last = rows[-1]
            logger.info(
                "generation %d/%d  best %.6g  mean %.6g  env steps %d  %.1fs",
                generation,
                self.config.generations,
                float(last.get("fitness_best", float("nan"))),
                float(last.get("fitness_mean", float("nan"))),
                self.env_steps,
                wall,
            )
        every = self.config.checkpoint_every
        if every and generation - self.last_checkpoint_generation >= every:
            self.checkpoint()

    def checkpoint(self, collective: bool = True) -> None:
        """Saves the latest state reached, unless it is saved already.

        Every process calls it: a state leaf sharded across processes is
        gathered (a collective) before process 0 writes.

        Args:
          collective: ``False`` skips the save when it would need a collective
            (after an interruption the other processes may not take part).
        """
        if self.state is None or self.saved_generation == self.generation:
            return
        if not collective and multihost.needs_collective(self.state):
            logger.info("no checkpoint at generation %d (interrupted)", self.generation)
            return
        state = ckpt_lib.host_state(self.state)
        if self.writer:
            ckpt_lib.save(
                self.run_dir / ckpt_lib.FILENAME,
                state,
                self.run_key,
                config_lib.to_dict(self.config),
                self.generation,
                self.env_steps,
                self.wall_time,
                self.columns or (),
            )
            logger.info("checkpoint at generation %d", self.generation)
        self.saved_generation = self.last_checkpoint_generation = self.generation


def _attach_log(run_dir: Path) -> logging.Handler | None:
    if not is_writer():
        return None
    handler = logging.FileHandler(run_dir / LOG_FILENAME)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


def _detach_log(handler) -> None:
    if handler is not None:
        logger.removeHandler(handler)
        handler.close()


def _log_start(config: RunConfig, algorithm, what: str) -> None:
    import jax

    import evorl_pop

    mesh = getattr(algorithm, "mesh", None) or getattr(
        getattr(algorithm, "engine", None), "mesh", None
    )
    devices = mesh.size if mesh is not None else config.devices
    logger.info(
        "%s: %s  (evorl_pop %s, jax %s, %s backend, %s device(s) on the population axis, "
        "%d process(es))",
        what,
        _describe(config),
        evorl_pop.__version__,
        jax.__version__,
        jax.default_backend(),
        devices,
        jax.process_count(),
    )
    for line in config_lib.dumps(config).splitlines():
        logger.info("  %s", line)


def _run(session: _Session, algorithm, state, num_generations: int, progress: bool, figure: bool):
    from evorl_pop.training import train_loop

    config = session.config
    try:
        state, history = train_loop(
            algorithm,
            state,
            session.run_key,
            num_generations,
            chunk=config.chunk,
            callback=session.callback,
            progress=progress and session.writer,
            desc=_describe(config),
            generation_offset=session.generation,
        )
    except KeyboardInterrupt:
        session.checkpoint(collective=False)
        logger.info("interrupted after generation %d", session.generation)
        raise
    session.checkpoint()
    logger.info(
        "done: generation %d, %d env steps, %.1fs",
        session.generation,
        session.env_steps,
        session.wall_time,
    )
    if figure and session.writer:
        draw_figure(session.run_dir)
    return RunResult(
        session.run_dir, state, history, session.generation, session.env_steps, session.wall_time
    )


def draw_figure(run_dir: Path) -> Path | None:
    """Redraws ``RUN/fitness.png`` from the run's metrics.

    Args:
      run_dir: the run folder.

    Returns:
      The figure's path, or ``None`` when there are no metrics yet.
    """
    from evorl_pop import plotting

    if not (Path(run_dir) / metrics_file.FILENAME).exists():
        return None
    try:
        return plotting.plot_runs([run_dir], out=Path(run_dir) / FIGURE_FILENAME)[0]
    except ValueError as err:  # e.g. no rows yet
        logger.info("no figure: %s", err)
        return None


def train(
    config: RunConfig,
    run_dir: str | os.PathLike | None = None,
    progress: bool = True,
    overwrite: bool = False,
    figure: bool = True,
) -> RunResult:
    """Starts a run in a new run folder.

    Args:
      config: the validated run config.
      run_dir: the folder (``None``: :func:`default_run_dir`).
      progress: show a progress bar.
      overwrite: replace the records of an earlier run in ``run_dir``.
      figure: draw ``fitness.png`` at the end.

    Returns:
      A :class:`RunResult`.

    Raises:
      RunError: ``run_dir`` holds a run already (and not ``overwrite``).
    """
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    # Process 0's view decides for everyone: the folder name (a timestamp) and
    # what it holds; the other processes may not even see the same filesystem.
    run_dir = Path(_from_writer(str(run_dir)))
    existing = [
        n
        for n in (CONFIG_FILENAME, metrics_file.FILENAME, ckpt_lib.FILENAME)
        if (run_dir / n).exists()
    ]
    existing = [n for n in _from_writer(",".join(existing)).split(",") if n]
    if existing and not overwrite:
        raise RunError(
            f"{str(run_dir)!r} holds a run already ({', '.join(existing)}). Continue it with "
            f"`evorl-pop resume {run_dir}`, or pass --overwrite to start afresh there."
        )
    algorithm, mesh, init_key, run_key = build(config)
    if is_writer():
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in (*existing, LOG_FILENAME, FIGURE_FILENAME):
            path = run_dir / name
            if path.exists():
                path.unlink() if path.is_file() else shutil.rmtree(path)
        config_lib.save(config, run_dir / CONFIG_FILENAME)
    multihost.barrier("evorl_pop.train.folder")  # no process starts before the folder is ready
    handler = _attach_log(run_dir)
    try:
        _log_start(config, algorithm, f"new run in {run_dir}")
        state = init_state(algorithm, init_key, mesh)
        session = _Session(run_dir, config, run_key, 0, 0, 0.0)
        return _run(session, algorithm, state, config.generations, progress, figure)
    finally:
        _detach_log(handler)


_ABSENT = "\0"  # stands for a missing file in what process 0 shares


def _read_run(run_dir: Path) -> tuple[bytes, str | None]:
    """The checkpoint's bytes and ``config.yaml``'s text, as process 0 reads them.

    Only process 0 touches the files; the others receive what it read, or
    raise the same error it met.

    Args:
      run_dir: the run folder.

    Returns:
      ``(checkpoint_bytes, config_text)``; ``config_text`` is ``None`` without a ``config.yaml``.

    Raises:
      RunError: no run folder.
      CheckpointError: no readable checkpoint.
    """
    data, text, error = b"", _ABSENT, ""
    if is_writer():
        try:
            if not run_dir.is_dir():
                raise RunError(f"No run folder at {str(run_dir)!r}.")
            data = ckpt_lib.read_bytes(run_dir)
            config_path = run_dir / CONFIG_FILENAME
            if config_path.exists():
                text = config_path.read_text()
        except (RunError, ckpt_lib.CheckpointError) as err:
            error = f"{type(err).__name__}:{err}"
        except OSError as err:
            error = f"RunError:Cannot read {str(run_dir / CONFIG_FILENAME)!r}: {err.strerror}."
    kind, _, message = _from_writer(error).partition(":")
    if kind:
        raise (RunError if kind == "RunError" else ckpt_lib.CheckpointError)(message)
    text = _from_writer(text)
    return multihost.broadcast_bytes(data), None if text == _ABSENT else text


def _parse_config(text: str, path: Path) -> RunConfig:
    """A run config from a YAML file's text (as :func:`config_lib.load` reads the file)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"The config file {str(path)!r} does not parse: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"The config file {str(path)!r} must hold a mapping, got {data!r}.")
    return config_lib.from_dict(data)


def _differences(old: RunConfig, new: RunConfig) -> list[str]:
    """The settings that differ, other than those a resume may change."""
    a = config_lib._flatten(config_lib.to_dict(old))
    b = config_lib._flatten(config_lib.to_dict(new))
    return [
        f"{key.removeprefix('algorithm_config.')}: {a.get(key)!r} -> {b.get(key)!r}"
        for key in sorted(set(a) | set(b), key=lambda k: (k.count("."), k))
        if key not in config_lib.RESUMABLE_FIELDS and a.get(key) != b.get(key)
    ]


def resume(
    run_dir: str | os.PathLike,
    generations: int | None = None,
    more: int | None = None,
    overrides=(),
    config_file: str | os.PathLike | None = None,
    force: bool = False,
    devices: int | None = None,
    chunk: int | None = None,
    checkpoint_every: int | None = None,
    progress: bool = True,
    figure: bool = True,
) -> RunResult:
    """Continues a run from its latest checkpoint.

    The run's ``config.yaml`` (and ``config_file`` and ``overrides`` on top)
    must match the checkpoint's config, except for the settings that do not
    change results (generations, chunk, checkpoint interval, devices);
    ``force`` accepts a changed config. Metrics rows past the checkpoint are
    dropped first, so no generation is written twice.

    Args:
      run_dir: the run folder.
      generations: the new total number of generations.
      more: run this many generations beyond the checkpoint instead.
      overrides: ``key=value`` strings, as for ``train``.
      config_file: a YAML / TOML file overriding ``config.yaml``.
      force: continue even if the config differs from the checkpoint's.
      devices: devices on the population axis (results then agree with an
        uninterrupted run to float tolerance rather than bit for bit).
      chunk: generations per compiled chunk.
      checkpoint_every: the checkpoint interval.
      progress: show a progress bar.
      figure: redraw ``fitness.png`` at the end.

    Returns:
      A :class:`RunResult`.

    Raises:
      CheckpointError: no checkpoint, or a damaged one (nothing is changed).
      RunError: a changed config without ``force``, or a target before the checkpoint.
      ConfigError: a bad override.
    """
    import jax

    run_dir = Path(run_dir)
    data, config_text = _read_run(run_dir)
    ckpt = ckpt_lib.parse(data, run_dir / ckpt_lib.FILENAME)  # fails before anything is touched
    saved = config_lib.from_dict(ckpt.config)
    config_path = run_dir / CONFIG_FILENAME
    config = saved if config_text is None else _parse_config(config_text, config_path)
    if jax.process_count() > 1 and devices is None:
        devices = jax.device_count()  # a run over several processes uses all their devices
    if config_file is not None:
        data = config_lib.to_dict(config)
        extra = config_lib.read_mapping(config_file)
        if "algorithm_config" in extra:
            data["algorithm_config"].update(extra.pop("algorithm_config") or {})
        data.update(extra)
        config = config_lib.from_dict(data)
    config = config_lib.apply_overrides(config, overrides)
    if more is not None:
        generations = ckpt.generation + more
    config = config_lib.replace(
        config,
        generations=generations,
        devices=devices,
        chunk=chunk,
        checkpoint_every=checkpoint_every,
    )
    changed = _differences(saved, config)
    if changed and not force:
        raise RunError(
            "The config differs from the checkpoint's ("
            + "; ".join(changed)
            + "): continuing would not reproduce the run. Pass --force to continue with "
            "the new config anyway."
        )
    if config.generations < ckpt.generation:
        raise RunError(
            f"The checkpoint is at generation {ckpt.generation}, past the requested total "
            f"of {config.generations}; ask for more (--generations N with N >= "
            f"{ckpt.generation}, or --more N)."
        )
    algorithm, mesh, init_key, _ = build(config)
    state = ckpt_lib.restore_state(init_state(algorithm, init_key, mesh), ckpt.state)
    restored_generation = int(multihost.to_host(state.generation))
    if restored_generation != ckpt.generation:
        raise ckpt_lib.CheckpointError(
            f"The checkpoint says generation {ckpt.generation} but its state is at "
            f"{restored_generation}."
        )
    run_key = ckpt_lib.restore_key(ckpt)
    if is_writer():
        metrics_file.truncate(run_dir / metrics_file.FILENAME, ckpt.generation)
        config_lib.save(config, config_path)
    multihost.barrier("evorl_pop.resume.folder")
    handler = _attach_log(run_dir)
    try:
        _log_start(config, algorithm, f"resume from generation {ckpt.generation}")
        if changed:
            logger.info("config changed (--force): %s", "; ".join(changed))
        session = _Session(
            run_dir,
            config,
            run_key,
            ckpt.generation,
            ckpt.env_steps,
            ckpt.wall_time,
            ckpt.metrics_columns,
        )
        session.state = state
        return _run(
            session, algorithm, state, config.generations - ckpt.generation, progress, figure
        )
    finally:
        _detach_log(handler)


__all__ = [
    "ConfigError",
    "RunConfig",
    "RunError",
    "RunResult",
    "build",
    "default_run_dir",
    "draw_figure",
    "resume",
    "train",
]
