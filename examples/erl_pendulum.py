"""ERL on Pendulum-v1: a GA population of 10 actors and one TD3 learner.

    python examples/erl_pendulum.py [--steps 100000] [--seed 0] [--devices 2]

The population is sharded over ``--devices`` CPU devices and every TD3
minibatch is split over the same devices; every 5 generations the learner's
actor replaces the weakest member. Writes figures/erl_pendulum.png. The
learner usually passes a return of -250 within 50k steps (about two minutes on
a 2-core CPU).
"""

from _hybrid import ROOT, parse_args, plot, train

args = parse_args(__doc__.splitlines()[0])

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.erl import ERL, Config  # noqa: E402

config = Config()  # Pendulum-v1, population 10, TD3 learner, sync every 5 generations
algo = ERL(config, make_mesh(args.devices))
history = train(algo, args)
plot(
    history,
    args.figure or ROOT / "figures" / "erl_pendulum.png",
    f"ERL on Pendulum-v1, population {config.pop_size} + TD3 learner (seed {args.seed})",
    "TD3 learner's actor (eval)",
)
injected = int(history["rl_actors_injected"].sum())
print(
    f"final eval return of the learner: {history['eval_return'][-1]:.1f}; "
    f"learner copied into the population {injected} times"
)
