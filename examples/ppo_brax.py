"""PPO on brax hopper: 32 environments, 64 steps each per iteration.

    python examples/ppo_brax.py [--generations 400] [--task brax/hopper] [--devices 2]

One generation is one PPO iteration: 2,048 steps (spring physics, 1000-step
episodes that end when the hopper falls), then 10 epochs of 32 minibatches,
each split over ``--devices`` CPU devices, with running observation
normalisation (PPO's default config). Writes runs/examples/ppo-brax and figures/ppo_brax.png: the
best, mean and worst return of the environments' last episodes, and prints the
deterministic policy's return over 10 episodes.
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="brax/hopper", help="a brax task")


args = script.start(__doc__, _arguments, generations=400)

import jax  # noqa: E402

from evorl_pop.algorithms.ppo import PPO, Config  # noqa: E402

config = Config(task=args.task)
results = script.train(args, {"ppo-brax": config}, "ppo_brax.png", f"PPO, {args.task}",
                       x="steps", chunk=20, checkpoint_every=100)  # fmt: skip
for name, result in results.items():
    final = PPO(config).evaluate(result.state, jax.random.key(args.seed), 10)
    print(
        f"{name}: {result.env_steps:,} env steps; mean return of the last episodes "
        f"{result.history['fitness_mean'][-1]:.1f}; deterministic policy {float(final):.1f}"
    )
