"""PBT against the same members with fixed hyperparameters: TD3 on Pendulum-v1, PPO on CartPole-v1.

    python benchmarks/bench_pbt.py [--learner td3] [--steps 12000] [--interval 1000] [--seed 0]
    python benchmarks/bench_pbt.py --learner ppo [--steps 40960] [--interval 2048]

Eight TD3 learners whose actor and critic learning rates are drawn
log-uniformly from [1e-5, 1e-2] are trained side by side in one run twice,
from the same initial state and with the same keys: once with PBT (exploit
and explore every ``--interval`` steps) and once without. At the end every
member of both populations is evaluated over 10 noise-free episodes (the
same episodes for both). The goal: PBT's median member reaches ``--target``
and is at least as good as the best fixed-hyperparameter member. Prints a
table and the wall times, and saves ``figures/pbt_vs_fixed.png``: both
populations' returns and the members' learning-rate trajectories.

``--learner ppo`` does the same with eight PPO learners on CartPole-v1 (8
environments x 128 steps per iteration, 4 epochs of 4 minibatches) whose
learning rate, clip range, entropy cost, GAE lambda and discount are drawn
from PBT's default ranges for PPO (``figures/pbt_ppo_vs_fixed.png``; target 475).
Measured on the 2-core CPU, one core (``--learner ppo --steps 20480``, seed 0;
11.4 s PBT, 9.6 s fixed, compilation included)::

             median     best    worst   members
       PBT    500.0    500.0    474.1   500 474.1 500 489.7 500 500 500 474.1
     fixed    500.0    500.0    161.3   500 256.4 500 500 500 161.3 259.3 500

PBT's median member equals the best fixed member (500, the maximum): goal met.
PBT lifts its worst member from 161.3 to 474.1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--learner", choices=("td3", "ppo"), default="td3")
parser.add_argument(
    "--steps", type=int, default=None, help="env steps per member (12000, ppo: 40960)"
)
parser.add_argument(
    "--interval", type=int, default=None, help="env steps between exploits (1000, ppo: 2048)"
)
parser.add_argument("--population", type=int, default=8)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--devices", type=int, default=1, help="CPU devices on the POP axis")
parser.add_argument("--target", type=float, default=None, help="-200 (ppo: 475)")
parser.add_argument("--figure", type=Path, default=None)
args = parser.parse_args()
PPO = args.learner == "ppo"
args.steps = args.steps or (40_960 if PPO else 12_000)
args.interval = args.interval or (2048 if PPO else 1000)
args.target = args.target if args.target is not None else (475.0 if PPO else -200.0)
args.figure = args.figure or ROOT / "figures" / f"pbt{'_ppo' if PPO else ''}_vs_fixed.png"
flags = os.environ.get("XLA_FLAGS", "")
if args.devices > 1 and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms import pbt, ppo  # noqa: E402
from evorl_pop.tasks.rollout import evaluate_episodes  # noqa: E402

SEARCH = (pbt.Hyperparameter("actor_lr", 1e-5, 1e-2), pbt.Hyperparameter("critic_lr", 1e-5, 1e-2))
CONFIG = pbt.Config(population_size=args.population, search=SEARCH, interval=args.interval)
if PPO:
    members = ppo.Config(num_envs=8, unroll_length=128, num_minibatches=4, num_epochs=4)
    CONFIG = pbt.Config(
        task="CartPole-v1",
        learner="ppo",
        population_size=args.population,
        interval=args.interval,
        ppo=members,
    )
PLOTTED = ("learning_rate", "entropy_cost") if PPO else ("actor_lr", "critic_lr")
FINAL_EPISODES = 10


def train(algo: pbt.PBT) -> tuple[dict[str, np.ndarray], pbt.State, float]:
    """All intervals; interval g uses fold_in(run_key, g). Returns history, state, wall time."""
    init_key, run_key = jax.random.split(jax.random.key(args.seed))
    state = algo.init(init_key)
    step = jax.jit(algo.step)
    rows = []
    start = time.perf_counter()
    for g in range(args.steps // args.interval):
        state, metrics = step(state, jax.random.fold_in(run_key, g))
        rows.append(jax.device_get(metrics))
    jax.block_until_ready(state)
    wall = time.perf_counter() - start
    history = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
    return history, state, wall


def final_returns(algo: pbt.PBT, state: pbt.State) -> np.ndarray:
    """Every member's mean return over the same 10 noise-free episodes."""
    key = jax.random.fold_in(jax.random.key(args.seed), 10**6)
    if algo.members is not None:  # PPO members: their deterministic policies
        evaluate = lambda learner, own: algo.members.evaluate(learner, own, key, FINAL_EPISODES)  # noqa: E731
        return np.asarray(jax.jit(jax.vmap(evaluate))(state.learners, state.buffers))
    run = jax.jit(
        jax.vmap(
            lambda p: (
                evaluate_episodes(
                    algo.env, algo.policy, p, key, FINAL_EPISODES, None, algo.episode_length
                ).episode_return
            )
        )
    )
    return np.asarray(run(state.learners.actor.params))


def member_columns(history, name):
    return np.stack([history[f"member{i}_{name}"] for i in range(args.population)], 1)


def main():
    mesh = make_mesh(args.devices)
    results = {}
    for label, exploit in (("PBT", True), ("fixed", False)):
        algo = pbt.PBT(dataclasses.replace(CONFIG, exploit=exploit), mesh)
        history, state, wall = train(algo)
        results[label] = (history, final_returns(algo, state), wall)
        print(
            f"{label:>5}: {wall:7.1f}s wall (incl. compilation) for {args.steps} steps x "
            f"{args.population} members"
        )

    steps = np.arange(1, args.steps // args.interval + 1) * args.interval
    print(f"\nmean return over {FINAL_EPISODES} episodes after {args.steps} steps per member")
    print(f"{'':>6} {'median':>8} {'best':>8} {'worst':>8}   members")
    for label, (_, final, _) in results.items():
        row = " ".join(f"{r:7.1f}" for r in final)
        print(f"{label:>6} {np.median(final):8.1f} {final.max():8.1f} {final.min():8.1f}   {row}")
    pbt_median = float(np.median(results["PBT"][1]))
    fixed_best = float(results["fixed"][1].max())
    ok = pbt_median >= args.target and pbt_median >= fixed_best
    print(
        f"\nPBT median {pbt_median:.1f} vs target {args.target} and best fixed member "
        f"{fixed_best:.1f}: {'goal met' if ok else 'goal NOT met'}"
    )
    ratio = results["PBT"][2] / results["fixed"][2]
    print(f"wall time PBT / fixed: {ratio:.2f}")

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), dpi=110)
    for (label, (history, final, _)), color in zip(results.items(), ("C0", "C3"), strict=True):
        returns = member_columns(history, "return")
        axes[0].plot(steps, returns, color=color, alpha=0.25, linewidth=0.8)
        axes[0].plot(
            steps,
            np.median(returns, 1),
            color=color,
            linewidth=2,
            label=f"{label}: median (final {np.median(final):.0f})",
        )
    axes[0].axhline(args.target, color="k", linestyle=":", linewidth=1)
    axes[0].set(xlabel="environment steps per member", ylabel="evaluation return")
    axes[0].set_title("members (thin) and median (bold)", fontsize=10)
    axes[0].legend(fontsize=8)
    for ax, name in zip(axes[1:], PLOTTED, strict=True):
        for label, style in (("PBT", "-"), ("fixed", ":")):
            values = member_columns(results[label][0], name)
            for i in range(args.population):
                ax.plot(steps, values[:, i], style, color=f"C{i}", linewidth=1)
        ax.set_yscale("log")
        ax.set(xlabel="environment steps per member", ylabel=name)
        ax.set_title(f"{name}: PBT (solid), fixed (dotted)", fontsize=10)
    what = "PBT-PPO on CartPole-v1" if PPO else "PBT-TD3 on Pendulum-v1"
    fig.suptitle(f"{what}, {args.population} members", fontsize=11)
    fig.tight_layout()
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure)
    print(f"saved {args.figure}")


if __name__ == "__main__":
    main()
