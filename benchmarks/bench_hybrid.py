"""CEM-RL and ERL on Pendulum-v1: learning curves over seeds, wall time, figure.

    python benchmarks/bench_hybrid.py [--steps 100000] [--seeds 0 1 2] [--devices 1]

Trains each algorithm (default configuration) for ``--steps`` environment
steps per seed, prints a table of the median evaluation return (noise-free
episodes of the CEM mean actor / the ERL learner's actor) against environment
steps, the wall time of every run, and whether the median over seeds of the
mean evaluation return over the last 10% of the steps reaches ``--target``.
Saves ``figures/hybrid_pendulum.png``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=100_000, help="env steps per run")
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
parser.add_argument("--algorithms", nargs="+", default=["cemrl", "erl"], choices=["cemrl", "erl"])
parser.add_argument("--devices", type=int, default=1, help="CPU devices (POP and DP axes)")
parser.add_argument("--chunk", type=int, default=5, help="generations per compiled chunk")
parser.add_argument("--target", type=float, default=-250.0)
parser.add_argument("--figure", type=Path, default=ROOT / "figures" / "hybrid_pendulum.png")
args = parser.parse_args()
flags = os.environ.get("XLA_FLAGS", "")
if args.devices > 1 and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms import cemrl, erl  # noqa: E402
from evorl_pop.run.shell import chunk_fn  # noqa: E402

ALGORITHMS = {
    "cemrl": ("CEM-RL", lambda mesh: cemrl.CEMRL(cemrl.Config(), mesh)),
    "erl": ("ERL", lambda mesh: erl.ERL(erl.Config(), mesh)),
}
KEYS = ("env_steps", "eval_return", "fitness_best", "fitness_mean", "fitness_worst")


def train(algo, run, seed: int) -> tuple[dict[str, np.ndarray], float]:
    """One run until ``--steps`` env steps; generation g uses fold_in(key, g)."""
    init_key, run_key = jax.random.split(jax.random.key(seed))
    state = algo.init(init_key)
    history, steps = {k: [] for k in KEYS}, 0
    start = time.perf_counter()
    while steps < args.steps:
        state, metrics = run(state, run_key)
        metrics = jax.device_get(metrics)
        steps += int(np.sum(metrics["env_steps"], dtype=np.int64))
        for k in KEYS:
            history[k].append(np.asarray(metrics[k]))
    wall = time.perf_counter() - start
    history = {k: np.concatenate(v) for k, v in history.items()}
    # per-generation counts (int32) summed on the host in int64: exact at any length
    history["total_env_steps"] = np.cumsum(history["env_steps"], dtype=np.int64)
    keep = history["total_env_steps"] <= max(args.steps, history["total_env_steps"][0])
    return {k: v[keep] for k, v in history.items()}, wall


def value_at(history, steps):
    """Metric values of the last generation finished by ``steps`` env steps."""
    i = np.searchsorted(history["total_env_steps"], steps, side="right") - 1
    return history["eval_return"][max(i, 0)]


def final_return(history):
    """Mean eval return over the generations in the last 10% of the steps."""
    last = history["total_env_steps"] > 0.9 * args.steps
    return float(np.mean(history["eval_return"][last]))


def main():
    mesh = make_mesh(args.devices)
    results = {}
    for name in args.algorithms:
        label, make = ALGORITHMS[name]
        algo = make(mesh)
        run = chunk_fn(algo, args.chunk)
        results[name] = []
        for seed in args.seeds:
            history, wall = train(algo, run, seed)
            results[name].append((history, wall))
            print(
                f"{label} seed {seed}: {int(history['total_env_steps'][-1])} steps in "
                f"{wall:.0f} s (incl. compile), final eval return {final_return(history):.1f}",
                flush=True,
            )

    checkpoints = np.linspace(args.steps / 10, args.steps, 10).astype(int)
    print(f"\nmedian eval return over seeds {args.seeds}, Pendulum-v1, {args.devices} device(s)")
    header = "env steps | " + " | ".join(f"{ALGORITHMS[n][0]:>8}" for n in results)
    print(header)
    print("-" * len(header))
    for steps in checkpoints:
        row = [np.median([value_at(h, steps) for h, _ in results[n]]) for n in results]
        print(f"{steps:9d} | " + " | ".join(f"{v:8.1f}" for v in row))
    print()
    for name, runs in results.items():
        finals = [final_return(h) for h, _ in runs]
        walls = [w for _, w in runs]
        med = float(np.median(finals))
        verdict = "PASS" if med >= args.target else "FAIL"
        print(
            f"{ALGORITHMS[name][0]}: mean eval return over the last 10% of steps per seed "
            f"{[round(f, 1) for f in finals]}, median {med:.1f} (target >= {args.target}: "
            f"{verdict}); wall time per run {[round(w) for w in walls]} s, "
            f"total {sum(walls):.0f} s"
        )

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, runs) in zip(axes[0], results.items(), strict=True):
        steps = runs[0][0]["total_env_steps"]
        n = min(len(h["total_env_steps"]) for h, _ in runs)
        steps = steps[:n]
        for key, label, color in [
            ("fitness_best", "population best", "tab:green"),
            ("fitness_mean", "population mean", "tab:blue"),
            ("fitness_worst", "population worst", "tab:gray"),
            ("eval_return", "RL / mean actor (eval)", "tab:red"),
        ]:
            values = np.stack([h[key][:n] for h, _ in runs])
            ax.plot(steps, np.median(values, 0), color=color, label=label)
            ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.15)
        ax.axhline(args.target, color="k", ls=":", lw=1)
        ax.set_title(f"{ALGORITHMS[name][0]} on Pendulum-v1 ({len(runs)} seeds)")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episode return (median, min-max band)")
        ax.set_ylim(bottom=-1800)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=120)
    print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
