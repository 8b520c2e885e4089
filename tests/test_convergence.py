"""CMA-ES through the engine against pycma's published evaluation counts."""

import jax
import numpy as np
import pytest

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ESConfig, minimize

# pycma's median evaluations to f < 1e-8 in 10-D (x0 = 3·1, σ0 = 1 on sphere and
# ellipsoid; x0 = 0, σ0 = 0.5 on Rosenbrock), default population 10
PYCMA_MEDIANS = {"sphere": 1511, "ellipsoid": 4106, "rosenbrock": 4778}
SETUPS = {"sphere": (3.0, 1.0), "ellipsoid": (3.0, 1.0), "rosenbrock": (0.0, 0.5)}


@pytest.mark.parametrize("function", list(PYCMA_MEDIANS))
def test_cmaes_reaches_1e_8_with_pycma_evaluation_counts(function):
    x0, sigma = SETUPS[function]
    config = ESConfig(strategy="CMA_ES", task=function, num_dims=10, population_size=10,
                      x0=x0, sigma_init=sigma)
    results = [minimize(config, jax.random.key(seed), target=1e-8, max_generations=1000,
                        restarts=0, mesh=make_mesh(1)) for seed in range(5)]
    assert all(r.converged for r in results), [r.best for r in results]
    median = np.median([r.evaluations for r in results])
    assert abs(median - PYCMA_MEDIANS[function]) <= 0.15 * PYCMA_MEDIANS[function], median


def test_minimize_restarts_a_stalled_run_and_counts_its_evaluations():
    # Rastrigin traps CMA-ES with a small population in a local optimum
    config = ESConfig(strategy="CMA_ES", task="rastrigin", num_dims=4, population_size=6,
                      x0=3.0, sigma_init=0.05)
    result = minimize(config, jax.random.key(0), target=1e-8, max_generations=300, restarts=2,
                      mesh=make_mesh(1))
    assert not result.converged and result.restarts == 2
    assert result.best > 0.5  # stuck in a local optimum of Rastrigin every time
    # each of the 3 runs stopped at its stall, before its 300 generations
    assert 3 * 6 * 10 < result.evaluations < 3 * 300 * 6
