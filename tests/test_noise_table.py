"""Open_ES reading its noise from a shared table: the rows it reads, and the engine's
invariants (low communication, resume) with it."""

import _loop
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ESConfig, NoiseTableOpen_ES, make_strategy
from evorl_pop.algorithms.open_es import LowCommunicationEngine
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import Engine
from evorl_pop.tasks import BlackBoxTask


def _windows(table, width):
    return np.lib.stride_tricks.sliding_window_view(table, width)


def test_candidates_are_mirrored_windows_of_the_seeded_table():
    dims, size = 5, 60
    strategy, params = make_strategy(
        "Open_ES", 12, dims, sigma_init=0.5, noise="table", table_size=size, table_seed=4
    )
    assert isinstance(strategy, NoiseTableOpen_ES)
    table = np.asarray(jax.random.normal(jax.random.key(4), (size,)))
    np.testing.assert_array_equal(strategy.noise_table, table)
    state = strategy.init(jax.random.key(0), jnp.full(dims, 2.0), params)
    population, _ = strategy.ask(jax.random.key(1), state, params)
    z = (np.asarray(population) - 2.0) / 0.5
    np.testing.assert_allclose(z[6:], -z[:6], atol=1e-6)  # antithetic pairs
    windows = _windows(table, dims)
    offsets = []
    for row in z[:6]:
        match = np.flatnonzero(np.abs(windows - row).max(1) < 1e-5)
        assert len(match) == 1, "each direction is one window of the table"
        offsets.append(match[0])
    assert len(set(offsets)) > 1
    # another generation's key reads other windows
    again, _ = strategy.ask(jax.random.key(2), state, params)
    assert not np.allclose(again, population)


def test_table_noise_resumes_exactly_with_the_table_rebuilt():
    """Device counts: test_engine.py's plain-loop comparison has a table case."""
    task = BlackBoxTask("rastrigin", num_dims=6, x0=2.0)
    key = jax.random.key(5)

    def engine():  # a new strategy each time: the table rebuilt from its seed
        strategy, params = make_strategy(
            "Open_ES", 14, task.num_dims, learning_rate=0.1, noise="table", table_size=500
        )
        return Engine(strategy, task, make_mesh(2), params)

    first = engine()
    whole, history = _loop.run(first, first.init(jax.random.key(0)), key, 6)
    restarted = engine()  # as after a restart: in two chunks, bit for bit
    run3 = lambda s: _loop.run(restarted, s, key, 3)  # noqa: E731
    state, _ = run3(restarted.init(jax.random.key(0)))
    state, metrics = run3(state)
    np.testing.assert_array_equal(state.strategy_state.mean, whole.strategy_state.mean)
    np.testing.assert_array_equal(metrics["fitness_mean"], history["fitness_mean"][3:])
    assert not np.allclose(state.strategy_state.mean, 2.0)


@pytest.mark.parametrize("n", [1, 2])
def test_low_communication_reads_the_same_table_rows(n):
    task = BlackBoxTask("sphere", num_dims=7, x0=1.0)
    strategy, params = make_strategy(
        "Open_ES", 16, task.num_dims, learning_rate=0.05, noise="table", table_size=300
    )
    key, states = jax.random.key(2), {}
    for low in (False, True):
        engine_class = LowCommunicationEngine if low else Engine
        e = engine_class(strategy, task, make_mesh(n), params)
        states[low] = _loop.run(e, e.init(jax.random.key(1)), key, 4)[0]
    np.testing.assert_allclose(
        states[True].strategy_state.mean, states[False].strategy_state.mean, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        states[True].strategy_state.best_fitness,
        states[False].strategy_state.best_fitness,
        rtol=1e-6,
    )
    # the engine's own best so far: the same candidate on both paths
    np.testing.assert_allclose(states[True].best_fitness, states[False].best_fitness, rtol=1e-6)
    np.testing.assert_allclose(
        states[True].best_solution, states[False].best_solution, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(states[True].best_fitness, states[True].strategy_state.best_fitness)


def test_open_es_reads_the_table_by_default():
    assert isinstance(make_strategy("Open_ES", 8, 10)[0], NoiseTableOpen_ES)
    assert type(make_strategy("Open_ES", 8, 10, noise="normal")[0]).__name__ == "Open_ES"
    assert not isinstance(make_strategy("SNES", 8, 10)[0], NoiseTableOpen_ES)
    ESConfig(strategy="SNES").validate()  # 'auto' suits every strategy


def test_noise_option_errors_say_what_to_change():
    with pytest.raises(ValueError, match="table_size >= 10"):
        make_strategy("Open_ES", 8, 10, noise="table", table_size=9)
    with pytest.raises(ValueError, match="Open_ES sampler; CMA_ES"):
        make_strategy("CMA_ES", 8, 10, noise="table")
    with pytest.raises(ValueError, match="noise must be one of"):
        make_strategy("Open_ES", 8, 10, noise="gauss")
    with pytest.raises(ConfigError, match="Open_ES sampler"):
        ESConfig(strategy="SNES", noise="table").validate()
