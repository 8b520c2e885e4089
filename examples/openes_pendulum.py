"""OpenES on Pendulum-v1: a 3-32-1 MLP policy, population 256, two episodes each.

    python examples/openes_pendulum.py [--devices 2]

Writes runs/examples/openes-pendulum and figures/openes_pendulum.png. The
mean policy typically passes a return of -400 within 100 generations
(about 10 M environment steps).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=150)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task="Pendulum-v1", population_size=256, learning_rate=0.05,
              sigma_init=0.1, hidden_sizes=(32,), episodes=2, eval_episodes=8)  # fmt: skip
results = script.train(args, {"openes-pendulum": es}, "openes_pendulum.png",
                       "OpenES on Pendulum-v1, population 256",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=10,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    above = (ret >= -400).nonzero()[0]
    when = f"generation {above[0] + 1}" if above.size else "not within the run"
    print(f"{name}: mean policy return {ret[-1]:.1f}; >= -400 first at {when}")
