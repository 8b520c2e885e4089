"""CEM-RL on Pendulum-v1: 10 actors per generation, 5 of them trained by TD3.

    python examples/cemrl_pendulum.py [--generations 50] [--seed 0] [--devices 2]

The population is sharded over ``--devices`` CPU devices and every TD3
minibatch is split over the same devices. One generation is 10 episodes of 200
steps, so the default 50 generations are 100k environment steps (about a
minute on a 2-core CPU). Writes runs/examples/cemrl-pendulum and
figures/cemrl_pendulum.png (population best / mean / worst and the return of
the CEM mean actor). The mean actor usually passes -250 within 50k-100k steps.
"""

from _common import parse, train_and_plot

args = parse(__doc__.splitlines()[0], generations=50)

from evorl_pop.algorithms.cemrl import Config  # noqa: E402
from evorl_pop.config import RunConfig  # noqa: E402

config = RunConfig(
    algorithm="cemrl",
    algorithm_config=Config(),  # Pendulum-v1, population 10, 5 TD3 actors
    seed=args.seed,
    generations=args.generations,
    chunk=5,
    checkpoint_every=10,
    devices=args.devices,
)
for name, result in train_and_plot(
    [("cemrl-pendulum", config)],
    args,
    "cemrl_pendulum.png",
    "CEM-RL, Pendulum-v1, eval = the mean actor",
    metrics=("best", "mean", "worst", "eval_return"),
    x="steps",
):
    ret = result.history["eval_return"]
    print(
        f"{name}: {result.env_steps:,} env steps; eval return of the mean actor {ret[-1]:.1f}, "
        f"best {ret.max():.1f}"
    )
