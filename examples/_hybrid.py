"""Shared parts of the hybrid evolutionary-RL examples: flags, training loop, figure."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(description: str, steps: int = 100_000) -> argparse.Namespace:
    """Parses ``--steps --seed --devices --chunk --figure``; sets the device count.

    Must run before JAX is imported: ``--devices N`` forces N host (CPU) devices.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="environment steps to train")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices (POP and DP axes)")
    parser.add_argument("--chunk", type=int, default=5, help="generations per compiled chunk")
    parser.add_argument("--figure", type=Path, default=None, help="where to save the curve")
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    if args.devices > 1 and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    return args


def train(algo, args) -> dict:
    """Runs generations in ``lax.scan`` chunks until ``args.steps`` env steps
    (whole chunks, so a run may pass ``args.steps`` by up to one chunk).

    Generation ``g`` uses ``fold_in(key, g)``, so the chunk size does not
    change the result. Prints one line per chunk.

    Returns:
      The metrics of every generation, as NumPy arrays.
    """
    import jax
    import numpy as np

    init_key, run_key = jax.random.split(jax.random.key(args.seed))
    state = algo.init(init_key)
    run = jax.jit(lambda s, keys: jax.lax.scan(algo.step, s, keys))
    history: dict[str, list] = {}
    start = time.perf_counter()
    while int(state.env_steps) < args.steps:
        keys = jax.vmap(lambda g: jax.random.fold_in(run_key, g))(
            state.generation + np.arange(args.chunk)
        )
        state, metrics = run(state, keys)
        metrics = jax.device_get(metrics)
        for name, values in metrics.items():
            history.setdefault(name, []).append(np.asarray(values))
        print(
            f"gen {int(state.generation):4d}  steps {int(state.env_steps):8d}  "
            f"pop best {metrics['fitness_best'][-1]:8.1f} mean {metrics['fitness_mean'][-1]:8.1f} "
            f"worst {metrics['fitness_worst'][-1]:8.1f}  eval {metrics['eval_return'][-1]:8.1f}  "
            f"critic loss {metrics['critic_loss'][-1]:7.3f}  {time.perf_counter() - start:6.0f} s",
            flush=True,
        )
    return {name: np.concatenate(values) for name, values in history.items()}


def plot(history: dict, path: Path, title: str, eval_label: str) -> None:
    """Population best / mean / worst and the evaluated actor vs environment steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = history["total_env_steps"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(
        steps, history["fitness_worst"], history["fitness_best"], color="tab:blue", alpha=0.15
    )
    ax.plot(steps, history["fitness_best"], color="tab:green", label="population best")
    ax.plot(steps, history["fitness_mean"], color="tab:blue", label="population mean")
    ax.plot(steps, history["fitness_worst"], color="tab:gray", label="population worst")
    ax.plot(steps, history["eval_return"], color="tab:red", lw=2, label=eval_label)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")
