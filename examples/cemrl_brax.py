"""CEM-RL on brax inverted_double_pendulum: 10 actors per generation, 5 trained by TD3.

    python examples/cemrl_brax.py [--generations 300] [--task brax/inverted_double_pendulum]

Episodes last up to 200 steps (spring physics) and end when the pole falls.
Writes runs/examples/cemrl-brax and figures/cemrl_brax.png (population best /
mean / worst and the return of the CEM mean actor).
"""

from _common import parse, train_and_plot


def _arguments(parser):
    parser.add_argument("--task", default="brax/inverted_double_pendulum", help="a brax task")


args = parse(__doc__.splitlines()[0], _arguments, generations=300)

from evorl_pop.algorithms.cemrl import Config  # noqa: E402
from evorl_pop.config import RunConfig  # noqa: E402

config = RunConfig(
    algorithm="cemrl",
    algorithm_config=Config(
        task=args.task,
        population_size=10,
        episode_steps=200,
        learning_starts=1000,
        updates_per_actor=100,
    ),
    seed=args.seed,
    generations=args.generations,
    chunk=5,
    checkpoint_every=10,
    devices=args.devices,
)
for name, result in train_and_plot(
    [("cemrl-brax", config)],
    args,
    "cemrl_brax.png",
    f"CEM-RL, {args.task}, eval = the mean actor",
    metrics=("best", "mean", "worst", "eval_return"),
    x="steps",
):
    ret = result.history["eval_return"]
    print(
        f"{name}: {result.env_steps:,} env steps; eval return of the mean actor {ret[-1]:.1f}, "
        f"best {ret.max():.1f}"
    )
