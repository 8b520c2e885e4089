"""CEM-RL on brax inverted_double_pendulum: 10 actors per generation, 5 trained by TD3.

    python examples/cemrl_brax.py [--generations 300] [--task brax/inverted_double_pendulum]

Episodes last up to 200 steps (spring physics) and end when the pole falls.
Writes runs/examples/cemrl-brax and figures/cemrl_brax.png (population best /
mean / worst and the return of the CEM mean actor).
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="brax/inverted_double_pendulum", help="a brax task")


args = script.start(__doc__, _arguments, generations=300)

from evorl_pop.algorithms.cemrl import Config  # noqa: E402

cemrl = Config(task=args.task, population_size=10, episode_length=200, learning_starts=1000,
               updates_per_actor=100)  # fmt: skip
results = script.train(args, {"cemrl-brax": cemrl}, "cemrl_brax.png",
                       f"CEM-RL, {args.task}, eval = the mean actor",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=5,
                       checkpoint_every=10)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: {result.env_steps:,} env steps; eval return of the mean actor "
          f"{ret[-1]:.1f}, best {ret.max():.1f}")  # fmt: skip
