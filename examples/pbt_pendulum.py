"""PBT on Pendulum-v1: 8 TD3 learners searching their learning rates.

    python examples/pbt_pendulum.py [--generations 12] [--seed 0] [--devices 2]

Each member's actor and critic learning rates start log-uniform in
[1e-5, 1e-2]; every 1000 environment steps (one generation) the bottom
quarter copies a member of the top quarter (weights, targets, Adam states,
learning rates) and multiplies the copied rates by 0.8 or 1.2. The members
are sharded over ``--devices`` CPU devices. Writes runs/examples/pbt-pendulum
and figures/pbt_pendulum.png: the members' returns (best / mean / worst) and
every member's learning-rate trajectory beside them.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=12)

import numpy as np  # noqa: E402

from evorl_pop.algorithms.pbt import Config, Hyperparameter  # noqa: E402

search = (Hyperparameter("actor_lr", 1e-5, 1e-2), Hyperparameter("critic_lr", 1e-5, 1e-2))
pbt = Config(population_size=8, search=search, interval=1000)
results = script.train(args, {"pbt-pendulum": pbt}, "pbt_pendulum.png",
                       "PBT-TD3, Pendulum-v1, 8 members", x="steps", chunk=2,
                       checkpoint_every=4)  # fmt: skip
for name, result in results.items():
    returns = [result.history[f"member{i}_return"][-1] for i in range(8)]
    print(f"{name}: {result.env_steps:,} env steps; last evaluation: median member "
          f"{np.median(returns):.1f}, best {max(returns):.1f}")  # fmt: skip
