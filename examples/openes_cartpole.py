"""OpenES on CartPole-v1: a 4-32-2 MLP policy, population 256, sharded.

    python examples/openes_cartpole.py [--devices 2]

Writes runs/examples/openes-cartpole and figures/openes_cartpole.png.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=40)  # the devices, before JAX starts

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task="CartPole-v1", population_size=256, learning_rate=0.05,
              sigma_init=0.1, hidden_sizes=(32,), eval_episodes=8)  # fmt: skip
results = script.train(args, {"openes-cartpole": es}, "openes_cartpole.png",
                       "OpenES on CartPole-v1, population 256",
                       metrics=("best", "mean", "worst", "eval_return"), chunk=5,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    solved = (result.history["eval_return"] >= 500).nonzero()[0]
    when = f"generation {solved[0] + 1}" if solved.size else "not within the run"
    ret = result.history["eval_return"][-1]
    print(f"{name}: mean policy return {ret:.1f}; 500 first at {when}")
