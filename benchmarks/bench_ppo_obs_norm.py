"""PPO's two orders of the observation statistics, side by side over seeds.

    python benchmarks/bench_ppo_obs_norm.py [--tasks CartPole-v1,Acrobot-v1] [--seeds 12]
        [--generations 25] [--first-seed 0]

``obs_norm_update`` says when PPO's running observation statistics take in an
iteration's observations: ``'before'`` its epochs (brax's order, the default)
or ``'after'`` them. Each seed trains PPO's default config on each task
twice, once per order, from the same initial networks and keys, and the
table pairs them: the mean over seeds of

* ``curve``: the return of the environments' last episodes, averaged over
  the generations (the area under the learning curve),
* ``last 5``: the same over the last five generations,
* ``final``: the deterministic policy's return over 10 episodes at the end,

and the difference ``before - after`` with its standard error over the seeds.
"""

import argparse

import jax
import numpy as np

from evorl_pop import make_mesh
from evorl_pop.algorithms.ppo import PPO, Config
from evorl_pop.run.shell import train_loop

ORDERS = ("after", "before")


def run(task, order, seeds, generations):
    """Per seed: ``(curve, last 5, final)`` of PPO's default config with this order."""
    algo = PPO(Config(task=task, obs_norm_update=order), make_mesh(1))
    out = []
    for seed in seeds:
        state, history = train_loop(algo, algo.init(jax.random.key(seed)),
                                    jax.random.key(10_000 + seed), generations,
                                    chunk=generations, progress=False)  # fmt: skip
        returns = np.asarray(history["fitness_mean"])
        final = float(algo.evaluate(state, jax.random.key(20_000 + seed), 10))
        out.append((np.nanmean(returns), np.nanmean(returns[-5:]), final))
    return np.asarray(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="CartPole-v1,Acrobot-v1")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=25)
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)

    where = f"jax {jax.__version__}, {jax.devices()[0].platform}, one device"
    print(f"{where}; PPO's default config, {args.generations} iterations, "
          f"seeds {seeds.start}-{seeds.stop - 1}")  # fmt: skip
    print("| task | measure | after | before | before - after |")
    print("|---|---|---|---|---|")
    for task in args.tasks.split(","):
        after, before = (run(task, order, seeds, args.generations) for order in ORDERS)
        diff = before - after
        error = diff.std(0, ddof=1) / np.sqrt(len(seeds))
        for i, measure in enumerate(("curve", "last 5", "final")):
            print(f"| {task} | {measure} | {after[:, i].mean():.1f} | {before[:, i].mean():.1f} "
                  f"| {diff[:, i].mean():+.1f} ± {error[i]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
