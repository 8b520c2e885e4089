"""CMA-ES with IPOP restarts on a SciPy objective, in float64, sharded.

    python examples/python_objective.py [--devices 2]

The objective is ordinary SciPy code (``scipy.optimize.rosen``, 8-D
Rosenbrock, optimum 0 at x = 1): the engine calls it through
``jax.pure_callback``, each device on its own slice of the population, once
per slice (the batched form). Everything else (sampling, ranking, the
covariance update, the restarts) is the same compiled engine as for a JAX task.
"""

from evorl_pop.run import script

args = script.start(__doc__, runs=False)  # no run folder: --devices, --seed

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # before any array exists

import numpy as np  # noqa: E402
from scipy.optimize import rosen  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import ESConfig  # noqa: E402
from evorl_pop.algorithms.restarts import minimize  # noqa: E402
from evorl_pop.tasks import PythonTask  # noqa: E402

calls = []


def rosenbrock(xs: np.ndarray) -> np.ndarray:
    """Rows of ``xs`` are candidates; scipy's rosen takes them as columns."""
    calls.append(len(xs))
    return rosen(xs.T)


task = PythonTask(rosenbrock, num_dims=8, x0=0.0, batched=True, optimal_value=0.0)
# the task is given, so the config only sets the strategy and its population
config = ESConfig(strategy="CMA_ES", num_dims=8, population_size=12, sigma_init=0.5)
result = minimize(
    config,
    jax.random.key(args.seed),
    target=1e-10,
    max_evaluations=30_000,
    restarts=4,
    restart_strategy="ipop",
    mesh=make_mesh(None if args.devices == "auto" else args.devices),  # auto: every core
    task=task,
)
print(
    f"f = {result.best:.3e} after {result.evaluations:,} evaluations "
    f"({'reached' if result.converged else 'missed'} 1e-10), x = {np.round(result.x, 6)}"
)
for run in result.runs:
    print(f"  run: λ = {run.population_size}, {run.evaluations:,} evaluations, stop {run.stop}")
print(f"{len(calls)} calls of the objective, {np.mean(calls):.1f} candidates each on average")
