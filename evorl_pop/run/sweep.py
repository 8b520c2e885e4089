"""A hyperparameter sweep: every setting of a grid, with every seed, in as few programs as
its keys allow (``evorl-pop train --sweep KEY=V1,V2,... [--sweep ...] [--seeds N]``).

A swept key that enters the program as data (a learning rate, ``sigma_init``, a clip
range: :func:`evorl_pop.run.replicas.program_keys`) shares one compiled program with the
seeds; a key the algorithm reads as a Python value (a population size, a network's
width) needs a program per value. The grid's settings are grouped by the values of
those keys; each group is one run of replicas, run in turn::

    --sweep population_size=32,64 --sweep learning_rate=0.01,0.03 --seeds 4

    RUN/population_size=32/   one program: 2 learning rates x 4 seeds
    RUN/population_size=64/   one program: 2 learning rates x 4 seeds
    RUN/sweep.csv             one row per setting: the final metric, mean ± s.e.
    RUN/sweep.png             the final metric against each swept key

With no such key the run folder is the one group's own, ``sweep.csv`` and
``sweep.png`` beside its ``metrics.csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shlex
from pathlib import Path

import numpy as np

from evorl_pop.base import RunError, write_atomic
from evorl_pop.run import config as config_lib
from evorl_pop.run import processes, replicas, store
from evorl_pop.run.config import RunConfig

#: The summary files of a sweep.
TABLE, FIGURE = "sweep.csv", "sweep.png"
#: A sweep of several programs: its whole run config, in its top folder (``evorl-pop
#: resume RUN`` reads it).
PLAN = store.SWEEP_PLAN


def program_dirs(path: str | os.PathLike) -> list[Path]:
    """The program folders of a sweep of several programs, from its top folder ``path``
    (``RUN/population_size=32/``, ...: those that exist, in the grid's order); empty for
    any other folder (a run folder, a one-program sweep's)."""
    path = Path(path)
    if (path / "config.yaml").exists() or not path.is_dir():
        return []
    if not ((path / PLAN).exists() or (path / TABLE).exists()):
        return []
    found = [p for p in path.iterdir() if (p / "config.yaml").exists()]
    return sorted(found, key=lambda p: _order(p.name))


def top_folder(path: str | os.PathLike, command: str) -> str | None:
    """What ``evorl-pop COMMAND`` given the top folder of a sweep of several programs is
    told: its programs' folders, one command each; ``None`` for any other folder."""
    programs = program_dirs(path)
    if not programs:
        return None
    each = "; ".join(f"evorl-pop {command} {shlex.quote(str(p))}" for p in programs)
    return (
        f"{str(path)!r} is the top folder of a sweep of {len(programs)} programs, each a run "
        f"folder of its own: {command} one of them ({each})."
    )


def _order(name: str) -> tuple:
    """A program folder's name (``population_size=32``) as a key that sorts numbers as
    numbers."""
    out = []
    for part in name.split(","):
        value = part.partition("=")[2]
        try:
            out.append((0, float(value), ""))
        except ValueError:
            out.append((1, 0.0, value))
    return tuple(out)


def groups(config: RunConfig) -> list[tuple[dict, RunConfig]]:
    """The programs of a sweep: ``(values of the keys that need a program each, the run
    config of that group)`` (its ``sweep`` holds the keys that enter as data).

    Every setting is checked first, and the algorithm of every program built, so that a
    value the algorithm refuses stops the sweep before anything runs.

    Raises:
      ConfigError: a setting the algorithm's config refuses (see
        :func:`~evorl_pop.run.config.check_sweep`).
    """
    from evorl_pop.core.engine import make_mesh

    config_lib.validate(config)
    grid = replicas.parse_sweep(config.sweep)
    cls = config_lib.get(config.algorithm).algorithm_class
    mesh = make_mesh(processes.mesh_devices(config))
    static = replicas.program_keys(cls, config.algorithm_config, mesh, grid)
    data = {k: v for k, v in grid.items() if k not in static}
    first, group = replicas.settings(data)[0], replicas.format_sweep(data)
    out = []
    for setting in replicas.settings({k: grid[k] for k in static}):
        algorithm = replicas.with_values(config.algorithm_config, setting)
        if len(out):  # the first is built when it runs, at once
            cls(replicas.with_values(algorithm, first), mesh=mesh)
        out.append((setting, dataclasses.replace(config, algorithm_config=algorithm, sweep=group)))
    return out


def train(config: RunConfig, run_dir, train_fn, **kwargs) -> list:
    """Runs a sweep's groups in turn (``train_fn(config, run_dir, **kwargs)``: the run
    shell's ``train``), then writes its summary; returns the groups' results.

    A sweep of several programs writes :data:`PLAN` into ``run_dir`` first, so that
    ``evorl-pop resume RUN`` (:func:`resume`) finishes it, however far it got.
    """
    found = groups(config)
    run_dir = Path(run_dir)
    if len(found) == 1:  # every key is data: one program, one run folder
        results = [train_fn(found[0][1], run_dir, **kwargs)]
        summarize([run_dir], run_dir)
        return results
    held = (run_dir / PLAN).exists() or program_dirs(run_dir) or (run_dir / "config.yaml").exists()
    if held and not kwargs.get("overwrite"):  # its plan and programs stay as they are
        raise RunError(
            f"{str(run_dir)!r} holds a run already. Continue it with `evorl-pop resume "
            f"{shlex.quote(str(run_dir))}`, or pass --overwrite to start the sweep afresh there."
        )
    if store.is_writer():
        os.makedirs(run_dir, exist_ok=True)
        write_atomic(run_dir / PLAN, config_lib.dumps(config).encode())
    return _programs(found, run_dir, kwargs, lambda group, out: train_fn(group, out, **kwargs))


def resume(config: RunConfig, run_dir, train_fn, resume_fn, overrides=(), force=False, **kwargs):
    """Finishes a sweep of several programs from its top folder, to ``config``'s
    generations (its :data:`PLAN`, with the command's settings): each program resumed
    from its checkpoint, or trained where it has none yet; then its summary.

    Args:
      config: the sweep's run config.
      run_dir: its top folder.
      train_fn, resume_fn: the run shell's ``train`` and ``resume``.
      overrides, force: for each program's ``resume`` (its generations: ``config``'s, or
        its own where it was resumed alone past them).
      kwargs: ``progress``, ``figure``, ``recorders``, ``time_limit``.
    """
    run_dir = Path(run_dir)
    found = groups(config)
    if store.is_writer():
        write_atomic(run_dir / PLAN, config_lib.dumps(config).encode())

    def run(group, out):
        if not (out / store.CHECKPOINT_FILENAME).exists():
            return train_fn(group, out, overwrite=out.exists(), **kwargs)
        # a program resumed alone past the plan keeps its own total
        own = config_lib.read_mapping(out / "config.yaml").get("generations") or 0
        total = f"generations={max(config.generations, own)}"
        return resume_fn(out, [*overrides, total], None, None, force, **kwargs)

    return _programs(found, run_dir, kwargs, run)


def _programs(found, run_dir: Path, kwargs, run) -> list:
    """``run(group, folder)`` of each program in turn, then the sweep's summary."""
    results = []
    for index, (setting, group) in enumerate(found, start=1):
        if kwargs.get("progress", True) and store.is_writer():
            print(f"sweep: program {index} of {len(found)}, {replicas.folder(setting)}", flush=True)
        results.append(run(group, run_dir / replicas.folder(setting)))
    summarize([run_dir / replicas.folder(s) for s, _ in found], run_dir)
    return results


def refresh(run_dir) -> Path | None:
    """After a run folder of a sweep was resumed alone: its sweep's summary drawn again
    (the folder's own for a one-program sweep, its top folder's for a program of
    several); the folder it was written into, or ``None`` for a run of no sweep."""
    run_dir = Path(run_dir)
    programs = program_dirs(run_dir.parent)
    if run_dir.resolve() in {p.resolve() for p in programs}:
        summarize(programs, run_dir.parent)
        return run_dir.parent
    if (run_dir / "config.yaml").exists():
        if config_lib.read_mapping(run_dir / "config.yaml").get("sweep"):
            summarize([run_dir], run_dir)
            return run_dir
    return None


def summarize(run_dirs, out_dir, metric: str = "fitness_mean") -> tuple[Path, Path]:
    """``sweep.csv`` (one row per setting: its swept values, the seeds, ``metric``'s final
    mean and standard error over them) and ``sweep.png`` (that mean against each swept
    key) of a sweep's run folders, into ``out_dir``."""
    static = _differing(run_dirs)  # the keys of a program each: they differ between folders
    finals: dict[str, list[float]] = {}
    named: dict[str, tuple] = {}
    keys: list[str] = []
    for run_dir in run_dirs:
        config = config_lib.read_mapping(Path(run_dir) / "config.yaml")
        data = list(replicas.parse_sweep(config.get("sweep") or ()))
        keys = list(dict.fromkeys([*keys, *static, *data]))
        own = config_lib.flatten(config.get("algorithm_config") or {})
        metrics = store.read_metrics(Path(run_dir) / store.METRICS_FILENAME)
        # each replica's row of the last generation (a run of one replica: its last row)
        for row in np.flatnonzero(metrics["generation"] == metrics["generation"].max()):
            values = [*(own[k] for k in static), *(metrics[k][row].item() for k in data)]
            setting = tuple(zip([*static, *data], values, strict=True))
            named.setdefault(repr(setting), setting)  # a list value (a width) as its text
            finals.setdefault(repr(setting), []).append(float(metrics[metric][row]))
    rows = []
    for name, values in finals.items():
        setting = named[name]
        values = np.asarray(values)
        finite = values[np.isfinite(values)]
        mean = finite.mean() if len(finite) else np.nan
        error = finite.std(ddof=1) / np.sqrt(len(finite)) if len(finite) > 1 else np.nan
        rows.append({**dict(setting), "seeds": len(values), metric: mean, f"{metric}_se": error})
    out_dir = Path(out_dir)
    table = out_dir / TABLE
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, [*keys, "seeds", metric, f"{metric}_se"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    if store.is_writer():
        write_atomic(table, buffer.getvalue().encode())
    figure = out_dir / FIGURE
    if store.is_writer():
        _draw(rows, keys, metric, figure)
    return table, figure


def _differing(run_dirs) -> list[str]:
    """The algorithm config keys whose values differ between run folders."""
    flats = [
        config_lib.flatten(
            config_lib.read_mapping(Path(d) / "config.yaml").get("algorithm_config") or {}
        )
        for d in run_dirs
    ]
    keys = set().union(*flats)
    return sorted(k for k in keys if len({repr(f.get(k)) for f in flats}) > 1)


def _draw(rows, keys, metric, path) -> None:
    """One panel per swept key: the final metric's mean ± s.e. of each setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.6), dpi=120, squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        others = [k for k in keys if k != key]
        lines: dict[tuple, list] = {}
        for row in rows:
            lines.setdefault(tuple(str(row[k]) for k in others), []).append(row)
        numeric = all(isinstance(r[key], int | float) for r in rows)
        for other, members in lines.items():
            members = sorted(members, key=lambda r: r[key] if numeric else str(r[key]))
            xs = [r[key] if numeric else str(r[key]) for r in members]
            label = ", ".join(f"{k}={v}" for k, v in zip(others, other, strict=True)) or None
            ax.errorbar(
                xs,
                [r[metric] for r in members],
                [r[f"{metric}_se"] for r in members],
                marker="o",
                capsize=3,
                label=label,
            )
        values = [r[key] for r in rows]
        if numeric and min(values) > 0 and max(values) / min(values) >= 10:
            ax.set_xscale("log")
        ax.set(xlabel=key, ylabel=f"final {metric}", title=f"{metric} against {key}")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    fig.suptitle("Sweep: mean ± standard error over seeds", fontsize=10)
    fig.tight_layout()
    os.makedirs(path.parent, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
