"""CEM-RL on Pendulum-v1: 10 actors per generation, 5 of them trained by TD3.

    python examples/cemrl_pendulum.py [--generations 50] [--seed 0] [--devices 2]

The population is sharded over ``--devices`` CPU devices and every TD3
minibatch is split over the same devices. One generation is 10 episodes of 200
steps, so the default 50 generations are 100k environment steps (about a
minute on a 2-core CPU). Writes runs/examples/cemrl-pendulum and
figures/cemrl_pendulum.png (population best / mean / worst and the return of
the CEM mean actor). The mean actor usually passes -250 within 50k-100k steps.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=50)

from evorl_pop.algorithms.cemrl import Config  # noqa: E402

results = script.train(args, {"cemrl-pendulum": Config()},  # Pendulum-v1, 10 actors, 5 TD3
                       "cemrl_pendulum.png", "CEM-RL, Pendulum-v1, eval = the mean actor",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=5,
                       checkpoint_every=10)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: {result.env_steps:,} env steps; eval return of the mean actor "
          f"{ret[-1]:.1f}, best {ret.max():.1f}")  # fmt: skip
