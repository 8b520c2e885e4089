"""SAC on Pendulum-v1: 4 environments, one gradient update per environment step.

    python examples/sac_pendulum.py [--generations 20] [--seeds 1] [--devices 2]

One generation is one step of the algorithm: 200 steps (one episode) of each
of 4 environments go into the replay buffer, then 800 updates of twin critics,
a tanh-Gaussian actor and the temperature, on minibatches of 256 split over
``--devices`` CPU devices. Writes runs/examples/sac-pendulum and
figures/sac_pendulum.png: the best, mean and worst return of the environments'
last episodes (goal: above -200, which takes about 6k-10k steps).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=20)

from evorl_pop.algorithms.sac import Config  # noqa: E402

results = script.train(args, {"sac-pendulum": Config(task="Pendulum-v1")}, "sac_pendulum.png",
                       "SAC, Pendulum-v1, 4 environments", x="steps", chunk=2,
                       checkpoint_every=10)  # fmt: skip
for name, result in results.items():
    mean = result.history["fitness_mean"]
    above = (mean >= -200).nonzero()[0]
    when = f"{(above[0] + 1) * 800:,} steps" if above.size else "not within the run"
    print(f"{name}: {result.env_steps:,} env steps; mean return {mean[-1]:.1f}; >= -200 at {when}")
