"""CMA-ES on 10-D sphere, ellipsoid (condition 1e6) and Rosenbrock, sharded.

    python examples/cmaes_blackbox.py [--devices 2]

Writes run folders under runs/examples/ and figures/cmaes_blackbox.png.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=600)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

SETUPS = {"sphere": (3.0, 1.0), "ellipsoid": (3.0, 1.0), "rosenbrock": (0.0, 0.5)}
configs = {
    f"cmaes-{fn}": ESConfig(
        strategy="CMA_ES", task=fn, num_dims=10, population_size=10, x0=x0, sigma_init=sigma
    )  # fmt: skip
    for fn, (x0, sigma) in SETUPS.items()
}
results = script.train(args, configs, "cmaes_blackbox.png", "CMA-ES, 10-D, population 10",
                       chunk=100, checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    best = result.history["best_so_far"]
    below = (best < 1e-8).nonzero()[0]
    reached = f"f < 1e-8 after {(below[0] + 1) * 10} evaluations" if below.size else "not reached"
    print(f"{name}: best {best[-1]:.3g}, {reached}")
