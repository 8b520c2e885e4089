"""CMA-ES through the engine against pycma's published evaluation counts."""

import _loop
import jax
import numpy as np
import pytest

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.algorithms.restarts import STOP_REASONS, minimize

# pycma's median evaluations to f < 1e-8 in 10-D (x0 = 3·1, σ0 = 1 on sphere and
# ellipsoid; x0 = 0, σ0 = 0.5 on Rosenbrock), default population 10
PYCMA_MEDIANS = {"sphere": 1511, "ellipsoid": 4106, "rosenbrock": 4778}
SETUPS = {"sphere": (3.0, 1.0), "ellipsoid": (3.0, 1.0), "rosenbrock": (0.0, 0.5)}


@pytest.mark.parametrize("function", list(PYCMA_MEDIANS))
def test_cmaes_reaches_1e_8_with_pycma_evaluation_counts(function):
    x0, sigma = SETUPS[function]
    config = ESConfig(
        strategy="CMA_ES", task=function, num_dims=10, population_size=10, x0=x0, sigma_init=sigma
    )
    results = [
        minimize(
            config,
            jax.random.key(seed),
            target=1e-8,
            max_generations=1000,
            restarts=0,
            mesh=make_mesh(1),
        )
        for seed in range(5)
    ]
    assert all(r.converged for r in results), [r.best for r in results]
    median = np.median([r.evaluations for r in results])
    assert abs(median - PYCMA_MEDIANS[function]) <= 0.15 * PYCMA_MEDIANS[function], median


def test_minimize_restarts_a_stalled_run_and_counts_its_evaluations():
    # Rastrigin traps CMA-ES with a small population and step size in a local optimum
    config = ESConfig(
        strategy="CMA_ES", task="rastrigin", num_dims=4, population_size=6, x0=3.0, sigma_init=0.05
    )
    result = minimize(
        config, jax.random.key(0), target=1e-8, max_generations=300, restarts=2, mesh=make_mesh(1)
    )
    assert result.restarts == 2 and result.best > 0.5
    # each run stopped by one of pycma's termination rules (not its 300 generations, the
    # budget or the target), IPOP doubling λ
    rules = STOP_REASONS[STOP_REASONS.index("tolfun") :]
    stops = [(r.population_size, r.stop in rules) for r in result.runs]
    assert stops == [(6, True), (12, True), (24, True)], result.runs
    assert result.evaluations == sum(r.evaluations for r in result.runs)


def _first_generation_reaching(config, seeds, generations, threshold):
    es = ES(config, mesh=make_mesh(1))

    def run(key):
        return _loop.train(es, key, generations)[1]["eval_return"]

    firsts = []
    for seed in seeds:
        returns = np.asarray(run(jax.random.key(seed)))
        hit = np.flatnonzero(returns >= threshold)
        firsts.append(int(hit[0]) + 1 if hit.size else None)
    return firsts


@pytest.mark.slow
def test_openes_solves_cartpole_within_50_generations():
    config = ESConfig(
        strategy="Open_ES",
        task="CartPole-v1",
        population_size=256,
        learning_rate=0.05,
        sigma_init=0.1,
        hidden_sizes=(32,),
        eval_episodes=8,
    )
    firsts = _first_generation_reaching(config, range(5), 50, 500.0)
    assert sum(f is not None for f in firsts) >= 4, firsts


@pytest.mark.slow
def test_openes_reaches_minus_400_on_pendulum_within_100_generations():
    """Budget: 100 generations x 256 candidates x 2 episodes x 200 steps = 10.24 M steps."""
    config = ESConfig(
        strategy="Open_ES",
        task="Pendulum-v1",
        population_size=256,
        learning_rate=0.05,
        sigma_init=0.1,
        hidden_sizes=(32,),
        episodes=2,
        eval_episodes=8,
    )
    firsts = _first_generation_reaching(config, range(3), 100, -400.0)
    assert sum(f is not None for f in firsts) >= 2, firsts
