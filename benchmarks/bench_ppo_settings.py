"""Two values of one PPO setting, side by side over seeds on gymnax tasks.

    python benchmarks/bench_ppo_settings.py [--setting obs_norm_update=after,before]
        [--tasks CartPole-v1,Acrobot-v1] [--seeds 12] [--generations 25] [--first-seed 0]

``--setting NAME=A,B`` names a field of PPO's config and two values of it. Each seed
trains PPO's default config on each task twice, once with ``NAME=A`` and once with
``NAME=B``, from the same initial keys, and the table pairs them: the mean over seeds of

* ``curve``: the return of the environments' last episodes, averaged over
  the generations (the area under the learning curve),
* ``last 5``: the same over the last five generations,
* ``final``: the deterministic policy's return over 10 episodes at the end,

and the difference ``B - A`` with its standard error over the seeds. The settings
measured so far:

* ``obs_norm_update=after,before``: when the running observation statistics take in
  an iteration's observations (``'before'`` its epochs: brax's order, the default);
* ``policy_init_scale=1.0,0.01``: the scale of the policy's initial output weights
  (0.01, the default: every state starts at nearly the same action distribution).
"""

import argparse

import jax
import numpy as np

from evorl_pop import make_mesh
from evorl_pop.algorithms.ppo import PPO
from evorl_pop.base import ConfigError
from evorl_pop.run import config as config_lib
from evorl_pop.run.shell import train_loop


def ppo_config(task, name, value):
    """PPO's default config on ``task`` with ``name=value``, read and checked as the
    command line's ``--set`` is (a misspelt name or a wrong value says what to change)."""
    overrides = ["algorithm=ppo", f"task={task}", f"{name}={value}"]
    return config_lib.resolve_config([], overrides).algorithm_config


def run(config, label, seeds, generations):
    """Per seed: ``(curve, last 5, final)`` of ``config`` (each seed's line, headed by
    ``label``, printed as it ends)."""
    algo = PPO(config, make_mesh(1))
    out = []
    for seed in seeds:
        state, history = train_loop(algo, algo.init(jax.random.key(seed)),
                                    jax.random.key(10_000 + seed), generations,
                                    chunk=generations, progress=False)  # fmt: skip
        returns = np.asarray(history["fitness_mean"])
        final = float(algo.evaluate(state, jax.random.key(20_000 + seed), 10))
        out.append((np.nanmean(returns), np.nanmean(returns[-5:]), final))
        print(f"seed {seed} {config.task} {label}: curve {out[-1][0]:.1f}, last 5 "
              f"{out[-1][1]:.1f}, final {final:.1f}", flush=True)  # fmt: skip
    return np.asarray(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="obs_norm_update=after,before", help="NAME=A,B")
    parser.add_argument("--tasks", default="CartPole-v1,Acrobot-v1")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=25)
    args = parser.parse_args()
    name, _, values = args.setting.partition("=")
    values = values.split(",")
    if len(values) != 2:
        parser.error(f"--setting: give NAME=A,B, two values; got {args.setting!r}")
    tasks = args.tasks.split(",")
    try:  # every config checked before the first run
        configs = {(t, v): ppo_config(t, name, v) for t in tasks for v in values}
    except ConfigError as err:
        parser.error(f"--setting {args.setting}: {err}")
    a, b = values
    seeds = range(args.first_seed, args.first_seed + args.seeds)

    where = f"jax {jax.__version__}, {jax.devices()[0].platform}, one device"
    print(f"{where}; PPO's default config, {args.generations} iterations, "
          f"seeds {seeds.start}-{seeds.stop - 1}")  # fmt: skip
    print(f"| task | measure | {name}={a} | {name}={b} | difference |")
    print("|---|---|---|---|---|")
    for task in tasks:
        first, second = (run(configs[task, v], f"{name}={v}", seeds, args.generations)
                         for v in values)  # fmt: skip
        diff = second - first
        error = diff.std(0, ddof=1) / np.sqrt(len(seeds))
        for i, measure in enumerate(("curve", "last 5", "final")):
            print(f"| {task} | {measure} | {first[:, i].mean():.1f} | {second[:, i].mean():.1f} "
                  f"| {diff[:, i].mean():+.1f} ± {error[i]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
