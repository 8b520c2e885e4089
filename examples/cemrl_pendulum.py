"""CEM-RL on Pendulum-v1: 10 actors per generation, 5 of them trained by TD3.

    python examples/cemrl_pendulum.py [--steps 100000] [--seed 0] [--devices 2]

The population is sharded over ``--devices`` CPU devices and every TD3
minibatch is split over the same devices. Writes figures/cemrl_pendulum.png.
The CEM mean actor usually passes a return of -250 within 50k-100k steps
(about two minutes on a 2-core CPU).
"""

from _hybrid import ROOT, parse_args, plot, train

args = parse_args(__doc__.splitlines()[0])

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.cemrl import CEMRL, Config  # noqa: E402

config = Config()  # Pendulum-v1, population 10, 5 TD3 actors, 200 TD3 iterations each
algo = CEMRL(config, make_mesh(args.devices))
history = train(algo, args)
plot(
    history,
    args.figure or ROOT / "figures" / "cemrl_pendulum.png",
    f"CEM-RL on Pendulum-v1, population {config.pop_size} (seed {args.seed})",
    "CEM mean actor (eval)",
)
print(f"final eval return of the mean actor: {history['eval_return'][-1]:.1f}")
