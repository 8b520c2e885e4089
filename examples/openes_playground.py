"""OpenES on MuJoCo Playground's CartpoleBalance (DM Control Suite, MJX physics): a 5-16-1 MLP.

    python examples/openes_playground.py [--generations 30] [--task playground/CartpoleBalance]

Writes runs/examples/openes-playground and figures/openes_playground.png.
Episodes last 200 control steps (2 s; the suite's own are 1,000) and earn up
to 1 a step for a pole kept upright and centred, with little control and
velocity: at most 200. A random policy earns about 75. Any
``playground/<Task>`` of ``evorl-pop list`` runs the same way; needs
``pip install -e '.[playground]'``.
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="playground/CartpoleBalance", help="a Playground task")
    parser.add_argument("--pop", type=int, default=32, help="population size")
    parser.add_argument("--episode-length", type=int, default=200, help="control steps")


args = script.start(__doc__, _arguments, generations=30)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task=args.task, population_size=args.pop, learning_rate=0.05,
              sigma_init=0.1, hidden_sizes=(16,), episode_length=args.episode_length,
              impl="jax", eval_episodes=2)  # fmt: skip
results = script.train(args, {"openes-playground": es}, "openes_playground.png",
                       f"OpenES on {args.task} (MJX), population {args.pop}",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=5,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: {result.env_steps:,} env steps; mean-policy return {ret[-1]:.1f} "
          f"of at most {args.episode_length} (best {ret.max():.1f})")  # fmt: skip
