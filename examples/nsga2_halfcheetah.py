"""NSGA-II on mo/halfcheetah: running forward against the control cost, a front of gaits.

    python examples/nsga2_halfcheetah.py [--generations 30] [--devices 2]

Each candidate is a 16 x 16 MLP policy with its parameters bounded to [-10, 10]
(as EvoRL's NSGA-II on its brax multi-objective tasks), scored on one 100-step
episode: the episode's forward reward and its control cost, both maximised (the
cost enters negative). The population is evaluated sharded across the devices.
Writes the run folder runs/examples/nsga2-halfcheetah (with front.csv and
front.png, the front coloured by the generation each member was born) and
figures/nsga2_halfcheetah.png (per generation: the hypervolume against the task's
reference point (0, -60), the front's size, and the population's mean of each
objective). ``evorl-pop render RUN --member I`` draws front member I running.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=30)

from evorl_pop.algorithms.nsga2 import NSGA2Config  # noqa: E402

config = NSGA2Config(
    task="mo/halfcheetah",
    population_size=64,
    hidden_sizes=(16, 16),
    bounds=(-10.0, 10.0),
    episode_length=100,
)
drawn = ("hypervolume", "front_size", "fitness_mean_0", "fitness_mean_1")
result = script.train(
    args,
    {"nsga2-halfcheetah": config},
    "nsga2_halfcheetah.png",
    "NSGA-II, mo/halfcheetah, population 64",
    metrics=drawn,
    chunk=10,
    checkpoint_every=0,
)["nsga2-halfcheetah"]
history = result.history
print(
    f"hypervolume {history['hypervolume'][-1]:.2f} (generation 1: "
    f"{history['hypervolume'][0]:.2f}), {int(history['front_size'][-1])} non-dominated; "
    f"the front: {result.run_dir / 'front.png'}"
)
