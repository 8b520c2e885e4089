"""What a multi-objective run writes at its end: the front as ``front.csv``, its
figure ``front.png``, and the hypervolume's curve."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np


def write_front_csv(front: dict, out: Path) -> None:
    """Writes each front member's index, objectives, generation born and parameters."""
    k, dims = front["objectives"].shape[1], front["parameters"].shape[1]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["index", *(f"f{i}" for i in range(k)), "born", *(f"x{j}" for j in range(dims))]
        )
        for i, obj, born, x in zip(
            front["index"], front["objectives"], front["born"], front["parameters"], strict=True
        ):
            writer.writerow([int(i), *map(repr, map(float, obj)), int(born), *map(float, x)])


def plot_curve(generations, values, out: Path, title: str) -> None:
    """The hypervolume over the run's generations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8), dpi=120)
    ax.plot(generations, values, "-", color="C0")
    ax.set(xlabel="generation", ylabel="hypervolume", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot_front(front: dict, out: Path, title: str, true_front=None) -> None:
    """Draws the front's objectives: one scatter for 1 or 2 objectives, each pair of
    objectives for more; the population in grey, the front coloured by generation born."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives, population = front["objectives"], front["population"]
    k = objectives.shape[1]
    pairs = [(0, 0)] if k == 1 else list(itertools.combinations(range(k), 2))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 4), squeeze=False)
    for ax, (i, j) in zip(axes[0], pairs, strict=True):
        if k == 1:
            xs, ys, px, py = (
                front["index"],
                objectives[:, 0],
                np.arange(len(population)),
                population[:, 0],
            )
            ax.set_xlabel("member")
            ax.set_ylabel("f0")
        else:
            xs, ys, px, py = objectives[:, i], objectives[:, j], population[:, i], population[:, j]
            ax.set_xlabel(f"f{i}")
            ax.set_ylabel(f"f{j}")
            if true_front is not None:
                ax.scatter(
                    true_front[:, i], true_front[:, j], s=1, c="k", alpha=0.3, label="true front"
                )
        ax.scatter(px, py, s=8, c="lightgrey", label="population")
        points = ax.scatter(xs, ys, s=12, c=front["born"], cmap="viridis", label="front")
    fig.colorbar(points, ax=axes[0].tolist(), label="generation born")
    axes[0][0].legend(loc="best", fontsize="small")
    fig.suptitle(f"{title}: {len(objectives)} non-dominated")
    fig.savefig(out, dpi=100)
    plt.close(fig)
