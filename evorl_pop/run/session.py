"""A training session: the recorders started, the generations run through them,
the figure and the algorithm's export drawn, the recorders finished; a stop ends
in an :class:`~evorl_pop.run.stop.Interrupted` that says what the run folder holds.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from evorl_pop.base import (
    __version__,
)
from evorl_pop.core.capabilities import NamesStrategy, OnTask, Replicated
from evorl_pop.core.interfaces import Exports
from evorl_pop.run import loggers
from evorl_pop.run import stop as stop_lib
from evorl_pop.run.config import RunConfig
from evorl_pop.run.folder import FIGURE_FILENAME
from evorl_pop.run.loop import train_loop
from evorl_pop.run.metrics_csv import read_metrics_lines
from evorl_pop.run.recorders import Checkpoints, MetricsCSV, Recorder, Run, TrainLog

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


def default_recorders(
    extra: Sequence[Recorder] = (), config: RunConfig | None = None
) -> list[Recorder]:
    """The run folder's recorders (metrics.csv, train.log, checkpoints), the loggers
    ``config.loggers`` names (but those ``extra`` has), then ``extra``."""
    wanted = config is not None and any(name != "csv" for name in config.loggers)
    named = loggers.from_config(config, extra) if wanted else []
    return [MetricsCSV(), TrainLog(), Checkpoints(), *named, *extra]


def _rows(run: Run, metrics: dict, wall: float) -> list[dict]:
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


def _session(run: Run, algorithm, state, recorders, progress, figure, time_limit=None) -> RunResult:
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


def _figure(run: Run, recorders) -> None:
    """``fitness.png``, shown to the recorders; a figure that cannot be drawn or written
    is a line in the log, the run itself being complete."""
    from evorl_pop.run import plotting  # matplotlib: only when a figure is drawn

    path = run.run_dir / FIGURE_FILENAME
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


def _export(run: Run, algorithm: Exports, state, recorders) -> None:
    """The algorithm's result beyond one solution (:class:`Exports`), its figures shown
    to the recorders; one that cannot be written is a line in the log, as a figure."""
    try:
        columns = read_metrics_lines(run.columns, run.lines)
        figures = algorithm.export(state, run.run_dir, columns)
    except (ValueError, OSError) as err:
        what = err.strerror if isinstance(err, OSError) and err.strerror else err
        logger.info("no export: %s", what)
        print(f"warning: the run's result was not exported ({what})", file=sys.stderr)
        return
    for name, path in figures.items():
        for recorder in recorders:
            recorder.image(name, path)


def labels(algorithm) -> list[dict]:
    """Each replica's labels of a run of replicas
    (:class:`~evorl_pop.core.capabilities.Replicated`), else none: a single run."""
    return algorithm.labels if isinstance(algorithm, Replicated) else []


def _desc(config: RunConfig) -> str:
    """``es Open_ES CartPole-v1``: the algorithm, its strategy and task."""
    settings = config.algorithm_config
    names = [
        settings.strategy if isinstance(settings, NamesStrategy) else None,
        settings.task if isinstance(settings, OnTask) else None,
    ]
    return " ".join([config.algorithm, *(str(n) for n in names if n)])


def _about(what: str, config: RunConfig, mesh) -> str:
    return (
        f"{what}: {_desc(config)}  (evorl_pop {__version__}, jax {jax.__version__}, "
        f"{jax.default_backend()} backend, {mesh.size} device(s) on the population axis, "
        f"{jax.process_count()} process(es), compilation cache: "
        f"{jax.config.jax_compilation_cache_dir or 'off'})"
    )
