"""PBT-PPO on brax hopper: 4 PPO learners searching their learning rate, clip and entropy.

    python examples/pbt_ppo_brax.py [--generations 30] [--task brax/hopper] [--devices 2]

Each member is a whole PPO learner (8 environments x 32 steps per iteration,
4 epochs of 4 minibatches, observation normalisation) whose learning rate,
clip range, entropy cost, GAE lambda and discount start drawn from their
ranges. Every 2,048 environment steps per member (one generation: 8 PPO
iterations) the members' deterministic policies are evaluated; the worst
copies the best's networks, Adam state and observation statistics (keeping
its own running episodes) and multiplies the copied hyperparameters by 0.8 or
1.2. The members are sharded over ``--devices`` CPU devices. Writes
runs/examples/pbt-ppo-brax and figures/pbt_ppo_brax.png: the members' returns
(best / mean / worst) and every member's learning-rate trajectory.
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="brax/hopper", help="a brax task")


args = script.start(__doc__, _arguments, generations=30)

import numpy as np  # noqa: E402

from evorl_pop.algorithms.pbt import Config  # noqa: E402
from evorl_pop.algorithms.ppo import Config as PPOConfig  # noqa: E402

members = PPOConfig(num_envs=8, unroll_length=32, num_minibatches=4, num_epochs=4)
pbt = Config(task=args.task, learner="ppo", population_size=4, interval=2048, eval_episodes=2,
             ppo=members)  # fmt: skip
results = script.train(args, {"pbt-ppo-brax": pbt}, "pbt_ppo_brax.png",
                       f"PBT-PPO, {args.task}, 4 members", x="steps", chunk=2,
                       checkpoint_every=10)  # fmt: skip
for name, result in results.items():
    returns = [result.history[f"member{i}_return"][-1] for i in range(4)]
    print(f"{name}: {result.env_steps:,} env steps; last evaluation: median member "
          f"{np.median(returns):.1f}, best {max(returns):.1f}")  # fmt: skip
