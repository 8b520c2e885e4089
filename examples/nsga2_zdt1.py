"""NSGA-II on ZDT1: 30 variables, population 100, the front found in 250 generations.

    python examples/nsga2_zdt1.py [--generations 250] [--devices 2]

The population is evaluated sharded across the devices. Writes the run folder
runs/examples/nsga2-zdt1 (with front.csv and front.png, the front found beside
the true one, coloured by the generation each member was born) and
figures/nsga2_zdt1.png (per generation: the hypervolume against (1.1, 1.1), the
true front's being 0.8767, the IGD from the true front, and the population's mean
of each objective).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=250)

from evorl_pop.algorithms.nsga2 import NSGA2Config  # noqa: E402

config = NSGA2Config(task="mo/zdt1", population_size=100)
drawn = ("hypervolume", "igd", "fitness_mean_0", "fitness_mean_1")
results = script.train(args, {"nsga2-zdt1": config}, "nsga2_zdt1.png",
                       "NSGA-II, ZDT1, population 100", metrics=drawn, chunk=50,
                       checkpoint_every=0)  # fmt: skip
result = results["nsga2-zdt1"]
history = result.history
print(
    f"IGD {history['igd'][-1]:.4f}, IGD+ {history['igd_plus'][-1]:.4f}, hypervolume "
    f"{history['hypervolume'][-1]:.4f} (the true front's: 0.8767), "
    f"{int(history['front_size'][-1])} non-dominated; the front: {result.run_dir / 'front.png'}"
)
