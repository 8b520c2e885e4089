"""ERL on Pendulum-v1: a GA population of 10 actors and one TD3 learner.

    python examples/erl_pendulum.py [--generations 46] [--seed 0] [--devices 2]

The population is sharded over ``--devices`` CPU devices and every TD3
minibatch is split over the same devices; every 5 generations the learner's
actor replaces the weakest member. One generation is 10 population episodes
plus one learner episode of 200 steps, so the default 46 generations are about
100k environment steps (about a minute on a 2-core CPU). Writes
runs/examples/erl-pendulum and figures/erl_pendulum.png (population best /
mean / worst and the return of the learner's actor). The learner usually
passes -250 within 50k steps.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=46)

from evorl_pop.algorithms.erl import Config  # noqa: E402

results = script.train(args, {"erl-pendulum": Config()},  # Pendulum-v1, 10 actors, sync every 5
                       "erl_pendulum.png", "ERL, Pendulum-v1, eval = the TD3 learner",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=5,
                       checkpoint_every=10)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    injected = int(result.history["rl_actors_injected"].sum())
    print(f"{name}: {result.env_steps:,} env steps; eval return of the learner {ret[-1]:.1f}, "
          f"best {ret.max():.1f}; learner copied into the population {injected} times")  # fmt: skip
