"""OpenES on CartPole-v1: a 4-32-2 MLP policy, population 256, sharded.

    python examples/openes_cartpole.py [--devices 2]

Writes runs/examples/openes-cartpole and figures/openes_cartpole.png.
"""

from _common import parse, train_and_plot

args = parse(__doc__.splitlines()[0], generations=40)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402
from evorl_pop.config import RunConfig  # noqa: E402

config = RunConfig(
    algorithm="es",
    algorithm_config=ESConfig(
        strategy="Open_ES",
        task="CartPole-v1",
        population_size=256,
        learning_rate=0.05,
        sigma_init=0.1,
        hidden_sizes=(32,),
        eval_episodes=8,
    ),
    seed=args.seed,
    generations=args.generations,
    chunk=5,
    checkpoint_every=0,
    devices=args.devices,
)
for name, result in train_and_plot(
    [("openes-cartpole", config)],
    args,
    "openes_cartpole.png",
    "OpenES on CartPole-v1, population 256",
    metrics=("best", "mean", "worst", "eval_return"),
):
    solved = (result.history["eval_return"] >= 500).nonzero()[0]
    when = f"generation {solved[0] + 1}" if solved.size else "not within the run"
    print(
        f"{name}: mean policy return {result.history['eval_return'][-1]:.1f}; 500 first at {when}"
    )
