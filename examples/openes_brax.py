"""OpenES on brax inverted_double_pendulum: an 8-32-1 MLP, population 64, spring physics.

    python examples/openes_brax.py [--generations 150] [--task brax/inverted_double_pendulum]

Writes runs/examples/openes-brax and figures/openes_brax.png. Episodes last up
to 500 steps and end when the pole falls; the return is about 9 per step
upright (at most about 4,650). A random policy falls within a dozen steps.
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="brax/inverted_double_pendulum", help="a brax task")
    parser.add_argument("--pop", type=int, default=64, help="population size")


args = script.start(__doc__, _arguments, generations=150)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task=args.task, population_size=args.pop, learning_rate=0.05,
              sigma_init=0.1, hidden_sizes=(32,), normalize_obs=True, episode_length=500,
              backend="spring", eval_episodes=4)  # fmt: skip
results = script.train(args, {"openes-brax": es}, "openes_brax.png",
                       f"OpenES on {args.task} (spring), population {args.pop}",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=10,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: {result.env_steps:,} env steps; mean-policy return {ret[-1]:.1f} "
          f"(best {ret.max():.1f})")  # fmt: skip
