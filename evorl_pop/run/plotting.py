"""Fitness curves from run folders.

Runs whose configs agree except for the seed (and run settings such as the
chunk size) form one group, drawn as the mean over its runs with a shaded
band (min-max or ±1 std); best, mean and worst fitness are told apart by
line style. Fitness stays in the task's own units (returns up, losses down).
Against environment steps, the mean covers the steps every run of the group
reached; a group whose runs share no such range shows each run's curve alone.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from evorl_pop.run import replicas, store, sweep
from evorl_pop.run.config import flatten, read_mapping

METRICS = {"best": "fitness_best", "mean": "fitness_mean", "worst": "fitness_worst"}
_STYLES = {"fitness_best": "-", "fitness_mean": "--", "fitness_worst": ":", "f_minus_fopt": "-"}
# Settings that do not make two runs different experiments.
_NOT_GROUPING = ("seed", "seeds", "generations", "chunk", "checkpoint_every", "devices")
_MEMBER_COLUMN = re.compile(r"member(\d+)_(.+)")


def load_runs(path: str | os.PathLike) -> list[tuple[dict, dict[str, np.ndarray]]]:
    """:func:`load_run`, a run of replicas (seeds, a sweep) split into them: each one's
    ``(config with its seed and swept values, its rows)``, as if it were a run of its own."""
    config, metrics = load_run(path)
    if replicas.SEED not in metrics:
        return [(config, metrics)]
    swept = list(replicas.parse_sweep(config.get("sweep") or ()))
    labels = [replicas.SEED, *swept]
    keys = np.stack([metrics[k] for k in labels], 1)
    runs = []
    for label in np.unique(keys, axis=0):  # in the order of the labels' values
        rows = (keys == label).all(1)
        own = dict(zip(swept, label[1:].tolist(), strict=True))
        algorithm = replicas.with_values_mapping(config.get("algorithm_config") or {}, own)
        one = {
            **config,
            "seed": int(label[0]),
            "seeds": 1,
            "sweep": [],
            "algorithm_config": algorithm,
        }
        runs.append((one, {k: v[rows] for k, v in metrics.items() if k not in labels}))
    return runs


def load_run(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config mapping or {}, metric columns)`` of a run folder or a metrics CSV."""
    path = Path(path)
    csv_path = path / store.METRICS_FILENAME if path.is_dir() else path
    if not csv_path.exists():
        raise ValueError(f"No metrics at {str(csv_path)!r}: is {str(path)!r} a run folder?")
    metrics = store.read_metrics(csv_path)
    if not metrics or len(metrics.get("generation", ())) == 0:
        raise ValueError(f"{str(csv_path)!r} has no rows yet.")
    config_path = csv_path.parent / "config.yaml"
    return (read_mapping(config_path) if config_path.exists() else {}), metrics


def _settings(config: dict) -> dict:
    """A run config's settings, the algorithm's over the run's, nested ones under dotted
    keys (``td3.actor_lr``)."""
    run = {k: v for k, v in config.items() if not isinstance(v, dict)}
    return {**run, **flatten(config.get("algorithm_config") or {})}


def _label(config: dict, differing: Sequence[str]) -> str:
    algo, flat = config.get("algorithm_config") or {}, _settings(config)
    named = ("algorithm", "strategy", "task")
    parts = [str(config.get("algorithm", "run")), *(str(algo[n]) for n in named if algo.get(n))]
    extra = [f"{k}={flat.get(k)}" for k in differing if k not in named]
    extra = extra[:4] + ["..."] * (len(extra) > 4)  # a legend, not a config dump
    return " ".join(parts) + (f" ({', '.join(extra)})" if extra else "")


def _common_steps(runs) -> tuple[float, float] | None:
    """The first and last environment step at which every run of a group has data
    (``None``: their ranges of steps do not overlap)."""
    start = max(m["env_steps"][0] for _, m in runs)
    end = min(m["env_steps"][-1] for _, m in runs)
    return (start, end) if start <= end else None


def _aggregate(runs, metric: str, x: str, band: str):
    """Mean and band over the runs of a group, on a common x axis (for steps: only
    where every run has data, see :func:`_common_steps`)."""
    if x == "generation":
        n = min(len(m["generation"]) for _, m in runs)
        xs = runs[0][1]["generation"][:n].astype(float)
        ys = np.stack([m[metric][:n] for _, m in runs])
    elif len(runs) == 1:
        xs, ys = runs[0][1]["env_steps"].astype(float), runs[0][1][metric][None]
    else:
        # Env steps differ between seeds (episodes end early): interpolate
        # every run onto one grid over the steps that all of them reached.
        if (common := _common_steps(runs)) is None:
            raise ValueError("The runs share no range of environment steps to average over.")
        xs = np.linspace(*common, 200)
        ys = np.stack([np.interp(xs, m["env_steps"], m[metric]) for _, m in runs])
    with warnings.catch_warnings():  # a generation without finite fitness is a gap, not news
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(ys, axis=0)
        if band == "std":
            std = np.nanstd(ys, axis=0)
            return xs, mean, mean - std, mean + std
        return xs, mean, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)


def plot_runs(
    runs: Sequence[str | os.PathLike],
    out: str | os.PathLike = "fitness.png",
    x: str = "generation",
    metrics: Sequence[str] = ("best", "mean", "worst"),
    band: str = "minmax",
    svg: bool = False,
    title: str | None = None,
    log_y: bool | None = None,
) -> list[Path]:
    """Draws fitness curves of one or several runs into a PNG (and an SVG).

    A run with per-member hyperparameters (PBT) gets a panel per
    hyperparameter beside the curves, with every member's trajectory.

    Args:
      runs: run folders (or metrics CSV files); a sweep's top folder stands for its
        programs' run folders.
      out, svg: the PNG path (``.png`` added to a name without a file type); also write
        an SVG beside it.
      x: ``'generation'`` or ``'steps'`` (cumulative environment steps).
      metrics: any of ``'best'``, ``'mean'``, ``'worst'`` or metrics column names.
      band: ``'minmax'`` or ``'std'``: the shaded band of a group of several runs.
      title: the figure title (``None``: from the runs).
      log_y: a logarithmic fitness axis (``None``: when the values are
        positive and span over three decades, as for black-box losses).

    Returns:
      The paths written.

    Raises:
      ValueError: no runs or metrics, a run without rows or without a metric's column,
        a file type matplotlib does not write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs or x not in ("generation", "steps") or band not in ("minmax", "std"):
        raise ValueError(f"Need runs, x generation or steps, band minmax or std: {x}, {band}.")
    if not metrics:
        raise ValueError(
            "--metrics names no metric: give best, mean, worst or metrics.csv columns, "
            "comma-separated."
        )
    out = _figure_path(out)
    columns = [METRICS.get(m, m) for m in metrics]
    runs = [p for r in runs for p in sweep.program_dirs(r) or [r]]  # a sweep: its programs
    loaded = [(item, r) for r in runs for item in load_runs(r)]  # a multi-seed run: its seeds
    for (_, m), r in loaded:
        for c in columns:
            if c not in m:
                raise ValueError(f"{str(r)!r} has no column {c!r}; it has {sorted(m)}.")
        if x == "steps" and not m["env_steps"].any():
            raise ValueError(f"{str(r)!r} took no environment steps: plot it with --x generation.")
    loaded = [item for item, _ in loaded]
    groups: dict[str, list] = {}
    for item in loaded:
        data = {k: v for k, v in item[0].items() if k not in _NOT_GROUPING}
        groups.setdefault(yaml.safe_dump(data, sort_keys=True), []).append(item)
    flat = [_settings(g[0][0]) for g in groups.values()]
    # Settings of every run (another algorithm's own go without saying).
    keys = set.intersection(*(set(c) for c in flat))
    differing = sorted(k for k in keys - {*_NOT_GROUPING} if len({repr(c[k]) for c in flat}) > 1)

    hyperparameters = member_hyperparameters(loaded[0][1])
    # A task that knows f*: a last panel shows how close the runs came, on a log axis.
    precision = "f_minus_fopt" not in columns and all("f_minus_fopt" in m for _, m in loaded)
    panels = 1 + len(hyperparameters) + precision
    style = {"axes.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 7}
    with plt.rc_context(style):
        fig, axes = plt.subplots(1, panels, figsize=(3 + 4 * panels, 4.2), dpi=120, squeeze=False)
        ax = axes[0, 0]
        xlabel = "generation" if x == "generation" else "environment steps"
        xs = loaded[0][1]["generation" if x == "generation" else "env_steps"]
        # Row g's values were used from the end of interval g - 1 to the end of interval g.
        edges = np.concatenate([[0], xs])
        member_axes = axes[0, 1 : 1 + len(hyperparameters)]
        for member_ax, (name, values) in zip(member_axes, hyperparameters.items(), strict=True):
            member_ax.plot(edges, np.vstack([values, values[-1:]]), lw=1, drawstyle="steps-post")
            scale = "log" if np.all(values > 0) and values.max() / values.min() > 30 else "linear"
            member_ax.set(xlabel=xlabel, title=f"{name} per member", yscale=scale)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

        def draw(axis, group, column, color, label=None):
            if x == "steps" and len(group) > 1 and _common_steps(group) is None:
                for _, m in group:  # no mean: each seed's own curve
                    style = _STYLES.get(column, "-.") + "o" * (len(m[column]) == 1)
                    axis.plot(m["env_steps"], m[column], style, color=color, lw=1, label=label)
                    label = None
                values = np.concatenate([m[column] for _, m in group])
                return values[np.isfinite(values)]
            xs, mean, lo, hi = _aggregate(group, column, x, band)
            style = _STYLES.get(column, "-.") + "o" * (len(xs) == 1)  # a lone point: a dot
            axis.plot(xs, mean, style, color=color, label=label)
            if len(group) > 1:
                axis.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0)
                for _, m in group:  # each seed's own curve, faint
                    at = m["generation" if x == "generation" else "env_steps"]
                    axis.plot(at, m[column], "-", color=color, alpha=0.3, lw=0.6)
            return mean[np.isfinite(mean)]

        finite = []
        for i, group in enumerate(groups.values()):
            count = f", {len(group)} seeds" if len(group) > 1 else ""
            if count and x == "steps" and _common_steps(group) is None:
                count += ", no common steps to average"
            label = _label(group[0][0], differing) + count
            for j, column in enumerate(columns):
                # One experiment: a colour per metric; several: a colour per experiment.
                color = colors[(j if len(groups) == 1 else i) % len(colors)]
                name = next((k for k, v in METRICS.items() if v == column), column)
                finite.extend(draw(ax, group, column, color, f"{label}: {name}"))
            if precision:
                draw(axes[0, -1], group, "f_minus_fopt", colors[i % len(colors)])
        if precision:
            axes[0, -1].set(xlabel=xlabel, title="f − f* (best so far)", yscale="log")
        if log_y is None:
            log_y = bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 1e3
        averaged = [len(g) > 1 and (x == "generation" or _common_steps(g)) for g in groups.values()]
        if title is None and any(averaged):
            title = (
                f"Fitness (mean over seeds, band: {'min-max' if band == 'minmax' else '±1 std'})"
            )
        ax.set(xlabel=xlabel, ylabel="fitness", yscale="log" if log_y else "linear")
        ax.set_title(title or "Fitness")
        ax.legend(loc="best")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        written = [out, out.with_suffix(".svg")] if svg else [out]
        for path in written:
            fig.savefig(path)
    plt.close(fig)
    return written


def _figure_path(out: str | os.PathLike) -> Path:
    """The figure file ``out`` names, ``.png`` added when it names no file type; a
    ``ValueError`` for a type matplotlib does not write."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = Path(out)
    types = FigureCanvasAgg.get_supported_filetypes()
    if not out.suffix:
        return out.with_name(f"{out.name}.png")
    if out.suffix[1:].lower() not in types:
        raise ValueError(
            f"--out {str(out)!r}: {out.suffix!r} is not a figure type; end the name in .png "
            f"(or {', '.join(f'.{t}' for t in sorted(types) if t != 'png')})."
        )
    return out


def member_hyperparameters(metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A run's per-member columns ``member{i}_{name}`` as ``{name: array (rows, members)}``."""
    found: dict[str, dict[int, np.ndarray]] = {}
    for column, values in metrics.items():
        match = _MEMBER_COLUMN.fullmatch(column)
        if match and match[2] != "return":
            found.setdefault(match[2], {})[int(match[1])] = values
    return {n: np.stack([m[i] for i in sorted(m)], 1) for n, m in found.items()}


def join_images(rows: Sequence[Sequence[str | os.PathLike]], out: str | os.PathLike) -> Path:
    """PNG figures joined into one: each row's images side by side, top-aligned, the rows
    one above the other, each centred on a white canvas (pixels copied, not resampled).

    Args:
      rows: the PNG files of each row, left to right.
      out: the PNG written (it may be one of the inputs).

    Returns:
      ``out``.
    """
    import matplotlib.image

    def rgb(path):
        image = matplotlib.image.imread(path)[..., :3]
        return (image * 255).round().astype(np.uint8)

    def pad(image, height, width):
        left = (width - image.shape[1]) // 2
        widths = ((0, height - image.shape[0]), (left, width - image.shape[1] - left), (0, 0))
        return np.pad(image, widths, constant_values=255)

    joined = []
    for paths in rows:
        images = [rgb(p) for p in paths]
        height = max(i.shape[0] for i in images)
        joined.append(np.concatenate([pad(i, height, i.shape[1]) for i in images], axis=1))
    width = max(row.shape[1] for row in joined)
    matplotlib.image.imsave(out, np.concatenate([pad(r, r.shape[0], width) for r in joined]))
    return Path(out)
