"""The sharded ES engine against the plain evosax ask / evaluate / tell loop."""

import dataclasses

import _loop
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import make_mesh
from evorl_pop.algorithms import open_es
from evorl_pop.algorithms.es import ES, ESConfig, NoiseTableOpen_ES, elite_shaping, make_strategy
from evorl_pop.algorithms.open_es import LowCommunicationEngine
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import Engine, _median, to_minimization, worst_for_nonfinite
from evorl_pop.tasks import BlackBoxTask, ControlTask

GENERATIONS = 6


def reference_run(strategy, params, task, key, generations, init_key):
    """The plain evosax loop with the engine's key schedule, on one device."""
    k_sol, k_init, k_pop, k_eval0 = jax.random.split(init_key, 4)
    solution = task.init_solution(k_sol)
    state = strategy.init(k_init, solution, params)
    task_state = task.init_state()
    history = []

    @jax.jit
    def generation(state, task_state, k):
        k_ask, k_eval, k_tell, _ = jax.random.split(k, 4)
        population, state = strategy.ask(k_ask, state, params)
        keys = jax.vmap(lambda i: jax.random.fold_in(k_eval, i))(jnp.arange(len(population)))
        scores, info = jax.vmap(task.evaluate, in_axes=(0, 0, None))(population, keys, task_state)
        fitness, _ = worst_for_nonfinite(to_minimization(scores, task.maximize))
        state, _ = strategy.tell(k_tell, population, fitness, state, params)
        task_state = task.update_state(task_state, jax.tree.map(lambda x: x.sum(0), info))
        return state, task_state, scores

    for g in range(generations):
        state, task_state, scores = generation(state, task_state, jax.random.fold_in(key, g))
        history.append(np.asarray(scores))
    return state, task_state, np.stack(history)


def engine_run(strategy, params, task, key, generations, init_key, n, **kwargs):
    engine = Engine(strategy, task, mesh=make_mesh(n), strategy_params=params, **kwargs)
    state = engine.init(init_key)
    state, metrics = _loop.run(engine, state, key, generations)
    return engine, state, metrics


def _scores_metrics(scores, maximize):
    finite = np.where(np.isfinite(scores), scores, np.nan)
    best = np.nanmax(finite, 1) if maximize else np.nanmin(finite, 1)
    return best, np.nanmean(finite, 1)


STRATEGY_CASES = [
    ("CMA_ES", 16, {}),
    ("Open_ES", 16, {"learning_rate": 0.1, "sigma_init": 0.5, "noise": "normal"}),
    ("Open_ES", 16, {"learning_rate": 0.1, "sigma_init": 0.5, "noise": "table", "table_size": 99}),
    ("SNES", 16, {}),
    ("Sep_CMA_ES", 16, {}),
    ("PGPE", 16, {}),
    ("xNES", 16, {}),
]


@pytest.mark.parametrize("name,pop,kwargs", STRATEGY_CASES)
def test_sharded_run_reproduces_plain_evosax_loop(name, pop, kwargs):
    task = BlackBoxTask("rastrigin", num_dims=6, x0=2.0)
    strategy, params = make_strategy(name, pop, task.num_dims, **kwargs)
    key, init_key = jax.random.key(7), jax.random.key(8)
    ref_state, _, ref_scores = reference_run(strategy, params, task, key, GENERATIONS, init_key)
    best, mean = _scores_metrics(ref_scores, task.maximize)
    # the search moved: the comparison is not between two untouched states
    assert not np.allclose(ref_state.mean, 2.0)
    for n in (1, 2, 4, 8):
        _, state, metrics = engine_run(strategy, params, task, key, GENERATIONS, init_key, n)
        np.testing.assert_allclose(metrics["fitness_best"], best, rtol=1e-4)
        np.testing.assert_allclose(metrics["fitness_mean"], mean, rtol=1e-4)
        np.testing.assert_allclose(metrics["fitness_worst"], ref_scores.max(1), rtol=1e-4)
        np.testing.assert_allclose(state.strategy_state.mean, ref_state.mean, rtol=1e-4, atol=1e-5)
        assert int(state.generation) == GENERATIONS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SimpleGA", "DifferentialEvolution"])
def test_population_based_strategies_are_device_count_invariant(name):
    task = BlackBoxTask("sphere", num_dims=5, x0=1.0)
    strategy, params = make_strategy(name, 12, task.num_dims)
    key, init_key = jax.random.key(1), jax.random.key(2)
    runs = [engine_run(strategy, params, task, key, 8, init_key, n) for n in (1, 2, 4)]
    for _, state, metrics in runs[1:]:
        np.testing.assert_allclose(metrics["fitness_best"], runs[0][2]["fitness_best"], rtol=1e-5)
        np.testing.assert_allclose(
            state.strategy_state.population, runs[0][1].strategy_state.population, rtol=1e-5
        )
    best = runs[0][2]["best_so_far"]
    assert best[-1] < best[0]  # it optimises


@pytest.mark.parametrize("name,pop", [("Open_ES", 30), ("CMA_ES", 33), ("CMA_ES", 30)])
def test_population_not_divisible_by_devices_is_padded(name, pop):
    # float64: the padded, sharded run and the plain loop agree to ~1e-15; in
    # float32 CMA-ES's eigendecomposition amplifies their different summation
    # orders to ~1e-5 after a few generations, which is rounding, not padding
    with jax.enable_x64(True):
        _padded_run_matches_plain_loop(name, pop)


def _padded_run_matches_plain_loop(name, pop):
    task = BlackBoxTask("sphere", num_dims=4, x0=1.0)
    strategy, params = make_strategy(name, pop, task.num_dims)
    key, init_key = jax.random.key(3), jax.random.key(4)
    ref_state, _, ref_scores = reference_run(strategy, params, task, key, 4, init_key)
    engine, state, metrics = engine_run(strategy, params, task, key, 4, init_key, 4)
    assert engine.padded_size == 4 * -(-pop // 4) and engine.padded_size > pop
    best, mean = _scores_metrics(ref_scores, False)
    np.testing.assert_allclose(metrics["fitness_best"], best, rtol=1e-9)
    np.testing.assert_allclose(metrics["fitness_mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(metrics["fitness_std"], ref_scores.std(1), rtol=1e-9)
    np.testing.assert_array_equal(metrics["evaluations"], pop)
    assert state.strategy_state.mean.dtype == ref_state.mean.dtype == np.float64
    np.testing.assert_allclose(state.strategy_state.mean, ref_state.mean, rtol=1e-9, atol=1e-12)


@dataclasses.dataclass(frozen=True)
class FlakyTask(BlackBoxTask):
    """Sphere that fails (NaN, or +inf) where the first coordinate is large."""

    def evaluate(self, solution, key, task_state):
        value, info = super().evaluate(solution, key, task_state)
        value = jnp.where(solution[0] > 1.5, jnp.nan, value)
        value = jnp.where(solution[1] > 1.8, jnp.inf, value)
        return value, info


def test_nan_and_inf_fitness_rank_worst_and_are_counted():
    with jax.enable_x64(True):  # as above: float32 rounding is not what is tested
        _nonfinite_run()


def _nonfinite_run():
    task = FlakyTask("sphere", num_dims=4, x0=1.0)
    strategy, params = make_strategy("CMA_ES", 16, task.num_dims, sigma_init=1.0)
    key, init_key = jax.random.key(5), jax.random.key(6)
    ref_state, _, ref_scores = reference_run(strategy, params, task, key, 10, init_key)
    _, state, metrics = engine_run(strategy, params, task, key, 10, init_key, 4)
    bad = (~np.isfinite(ref_scores)).sum(1)
    assert bad.sum() > 0  # the test really injects failures
    np.testing.assert_array_equal(metrics["num_nonfinite"], bad)
    best, mean = _scores_metrics(ref_scores, False)
    np.testing.assert_allclose(metrics["fitness_mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(metrics["fitness_best"], best, rtol=1e-9)
    assert np.all(np.isfinite(metrics["fitness_mean"]))
    assert np.all(np.isfinite(state.strategy_state.mean))
    assert state.strategy_state.mean.dtype == ref_state.mean.dtype == np.float64
    np.testing.assert_allclose(state.strategy_state.mean, ref_state.mean, rtol=1e-9, atol=1e-12)
    # the failing region is avoided: the final mean is not in it
    assert state.strategy_state.mean[0] <= 1.5


def test_worst_for_nonfinite_ranks_failures_last():
    fitness = jnp.array([3.0, jnp.nan, 1.0, jnp.inf, -jnp.inf, 2.0])
    clean, count = worst_for_nonfinite(fitness)
    assert int(count) == 3
    order = np.argsort(np.asarray(clean), kind="stable")
    assert set(order[-3:]) == {1, 3, 4} and np.all(np.isfinite(clean))
    assert np.all(np.asarray(clean)[[1, 3, 4]] > 3.0)
    all_bad, count = worst_for_nonfinite(jnp.array([jnp.nan, jnp.nan]))
    assert int(count) == 2 and np.all(np.isfinite(all_bad))
    # a generation that failed entirely cannot beat any real fitness in an archive
    assert np.all(np.asarray(all_bad) >= np.finfo(np.float32).max)


@pytest.mark.parametrize("size", [1, 2, 7, 16, 33])
def test_fitness_median_equals_numpy_median(size):
    x = np.array(jax.random.normal(jax.random.key(size), (size,)))
    x[: size // 3] = x[-1]  # ties
    assert float(jax.jit(_median)(jnp.asarray(x))) == np.median(x)
    # an all-failed generation (every fitness the largest float) does not overflow
    largest = np.finfo(np.float32).max
    assert float(_median(jnp.full((size,), largest))) == largest


@pytest.mark.parametrize("n", [2, 4])
def test_control_task_is_device_count_invariant_with_obs_norm(n):
    task = ControlTask("CartPole-v1", hidden_sizes=(8,), episodes=2, normalize_obs=True)
    strategy, params = make_strategy("Open_ES", 12, task.num_dims, learning_rate=0.05)
    key, init_key = jax.random.key(11), jax.random.key(12)
    _, one, m1 = engine_run(strategy, params, task, key, 3, init_key, 1)
    _, many, mn = engine_run(strategy, params, task, key, 3, init_key, n)
    for k in ("fitness_best", "fitness_mean", "fitness_worst", "env_steps", "episodes"):
        np.testing.assert_allclose(mn[k], m1[k], rtol=1e-5)
    np.testing.assert_array_equal(m1["episodes"], 24)  # counted once, not per device
    np.testing.assert_allclose(
        many.strategy_state.mean, one.strategy_state.mean, rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(many.task_state.mean, one.task_state.mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(many.task_state.var, one.task_state.var, rtol=1e-4, atol=1e-6)
    assert float(one.task_state.count) == float(m1["env_steps"].sum())


def test_obs_norm_merge_matches_numpy_statistics():
    """The normaliser merged from psum'd moments equals the mean/var of all observations."""
    task = ControlTask("Pendulum-v1", hidden_sizes=(4,), normalize_obs=True)
    strategy, params = make_strategy("Open_ES", 8, task.num_dims)
    engine = Engine(strategy, task, mesh=make_mesh(4), strategy_params=params)
    state = engine.init(jax.random.key(0))
    population, _ = strategy.ask(jax.random.key(1), state.strategy_state, params)
    summary, _ = jax.jit(engine.evaluate)(population, jax.random.key(2), state.task_state)
    merged = task.update_state(state.task_state, summary.info)

    def observations(x, i):  # collect the raw observations of one candidate
        env, policy = task.env, task.policy
        k = jax.random.fold_in(jax.random.key(2), i)
        _, reset_key = jax.random.split(jax.random.split(k, 1)[0])
        obs, st = env.reset(reset_key)
        keys = jax.random.split(jax.random.split(jax.random.split(k, 1)[0])[0], env.spec.max_steps)

        def body(carry, sk):
            obs, st = carry
            a = policy(task.unravel(x), state.task_state.normalize(obs))
            nobs, st, _, _ = env.step(sk, st, a)
            return (nobs, st), obs

        _, obs_seq = jax.lax.scan(body, (obs, st), keys)
        return obs_seq

    obs = np.asarray(jax.vmap(observations)(population, jnp.arange(8))).reshape(-1, 3)
    # Pendulum episodes never end early, so every observation counts
    assert float(merged.count) == obs.shape[0]
    np.testing.assert_allclose(merged.mean, obs.mean(0), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(merged.var, obs.var(0), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("noise", ["normal", "table"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_low_communication_openes_equals_full_matrix_update(n, noise):
    task = BlackBoxTask("rastrigin", num_dims=7, x0=1.0)
    strategy, params = make_strategy("Open_ES", 14, task.num_dims, learning_rate=0.05, noise=noise)
    engine = LowCommunicationEngine(strategy, task, make_mesh(n), params)
    state = engine.init(jax.random.key(0))
    key = jax.random.key(9)
    new_state, metrics = jax.jit(engine.step)(state, key)

    # the full-matrix path: evosax's own tell on the same noise
    k_ask, k_eval, k_tell, _ = jax.random.split(key, 4)
    s = state.strategy_state
    z = engine.noise_matrix(k_ask)
    np.testing.assert_allclose(z[:7], -z[7:])  # antithetic pairs
    population = s.mean + s.std * z
    scores = jax.vmap(lambda x: task.evaluate(x, None, ())[0])(population)
    ref, _ = strategy.tell(k_tell, population, scores, s, params)
    np.testing.assert_allclose(new_state.strategy_state.mean, ref.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state.strategy_state.best_solution, ref.best_solution, rtol=1e-5)
    assert float(new_state.strategy_state.best_fitness) == pytest.approx(float(ref.best_fitness))
    assert int(new_state.strategy_state.generation_counter) == int(ref.generation_counter)
    assert not np.allclose(ref.mean, s.mean)
    np.testing.assert_allclose(metrics["fitness_best"], scores.min(), rtol=1e-6)


def test_low_communication_blocks_bound_noise_memory_and_match(monkeypatch):
    """Drawing the noise in blocks (bounded memory) changes nothing."""
    task = BlackBoxTask("sphere", num_dims=50, x0=1.0)
    strategy, params = make_strategy("Open_ES", 32, task.num_dims, learning_rate=0.05)
    key = jax.random.key(1)
    states = []
    for block_bytes in (1 << 30, 4 * 50 * 2):  # whole slice at once vs two rows at a time
        monkeypatch.setattr(open_es, "NOISE_BLOCK_BYTES", block_bytes)
        engine = LowCommunicationEngine(strategy, task, make_mesh(2), params)
        states.append(_loop.run(engine, engine.init(key), key, 3)[0])
    assert engine.noise_block == 2
    np.testing.assert_allclose(
        states[0].strategy_state.mean, states[1].strategy_state.mean, rtol=1e-5, atol=1e-6
    )


def _sphere_openes_final(**variant):
    config = ESConfig(strategy="Open_ES", task="sphere", num_dims=20, x0=1.0, population_size=64,
                      learning_rate=0.05, sigma_init=0.1, **variant)  # fmt: skip
    config.validate()
    es = ES(config, mesh=make_mesh(2))
    assert isinstance(es.strategy, NoiseTableOpen_ES) == (config.noise != "normal")
    _, history = _loop.train(es, jax.random.key(0), 150)
    return history["fitness_mean"][-10:].mean()


@pytest.mark.parametrize(
    "variant", [{"noise": "normal", "low_communication": True}, {"noise": "table"}]
)
def test_openes_variants_learn_like_evosax_openes(variant):
    """The low-communication path and the noise table against evosax's own OpenES."""
    reference, final = _sphere_openes_final(noise="normal"), _sphere_openes_final(**variant)
    start = 20.0  # sphere at x0 = 1 in 20-D
    assert final < 0.05 * start and reference < 0.05 * start
    assert final < 3 * reference and reference < 3 * final


def test_step_compiles_once_and_scan_equals_loop():
    es = ES(ESConfig(strategy="CMA_ES", task="sphere", population_size=8), mesh=make_mesh(2))
    state = es.init(jax.random.key(0))
    traces = []

    def step(s, k):
        traces.append(1)
        return es.step(s, k)

    jstep = jax.jit(step)
    s_loop = state
    for g in range(3):
        s_loop, _ = jstep(s_loop, jax.random.fold_in(jax.random.key(1), g))
    assert len(traces) == 1  # no retrace on later calls
    s_scan, _ = _loop.run(es, state, jax.random.key(1), 3)
    np.testing.assert_allclose(s_scan.strategy_state.mean, s_loop.strategy_state.mean, rtol=1e-6)
    eager, _ = es.step(state, jax.random.fold_in(jax.random.key(1), 0))
    jitted, _ = jstep(state, jax.random.fold_in(jax.random.key(1), 0))
    np.testing.assert_allclose(eager.strategy_state.mean, jitted.strategy_state.mean, rtol=1e-5)


def test_eval_mode_map_equals_vmap():
    task = ControlTask("Acrobot-v1", hidden_sizes=(8,))
    strategy, params = make_strategy("SNES", 8, task.num_dims)
    key, init_key = jax.random.key(0), jax.random.key(1)
    _, _, m_vmap = engine_run(strategy, params, task, key, 2, init_key, 2)
    _, _, m_map = engine_run(strategy, params, task, key, 2, init_key, 2, eval_mode="map")
    np.testing.assert_allclose(m_map["fitness_mean"], m_vmap["fitness_mean"], rtol=1e-5)


# --- bad input -------------------------------------------------------------------


def test_unknown_strategy_lists_valid_ones():
    with pytest.raises(
        ValueError, match=r"Unknown strategy 'CMAES'.*'CMA_ES'.*Valid strategies:.*Open_ES"
    ):
        make_strategy("CMAES", 10, 3)


def test_unknown_environment_lists_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown task 'Pendulum'.*Pendulum-v1.*Valid:"):
        ESConfig(task="Pendulum").make_task()
    with pytest.raises(ValueError, match=r"Unknown environment 'cartpole'.*CartPole-v1"):
        ControlTask("cartpole")


def test_policy_output_must_fit_action_space():
    import flax.linen as nn

    class ThreeOutputs(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x)

    with pytest.raises(ValueError, match=r"outputs shape \(3,\).*needs \(2,\).*output 2 value"):
        ControlTask("CartPole-v1", policy_module=ThreeOutputs())
    with pytest.raises(ValueError, match=r"needs \(1,\)"):
        ControlTask("Pendulum-v1", policy_module=ThreeOutputs())


def test_population_size_the_strategy_cannot_take():
    with pytest.raises(ValueError, match=r"Open_ES cannot take population_size=31.*even.*32"):
        make_strategy("Open_ES", 31, 4)
    with pytest.raises(ValueError, match="at least 2"):
        make_strategy("CMA_ES", 1, 4)


def test_strategy_with_required_arguments_says_which():
    with pytest.raises(
        ValueError,
        match=r"SV_CMA_ES needs the constructor argument\(s\) "
        r"num_populations",
    ):
        make_strategy("SV_CMA_ES", 8, 4)


def test_strategy_and_task_dimensions_must_agree():
    strategy, params = make_strategy("CMA_ES", 8, 5)
    with pytest.raises(ValueError, match=r"searches 5 dimensions but the task.*has 4"):
        Engine(strategy, BlackBoxTask("sphere", num_dims=4), make_mesh(1), params)


def test_low_communication_requires_openes():
    strategy, params = make_strategy("CMA_ES", 8, 4)
    with pytest.raises(ValueError, match="needs evosax's Open_ES"):
        LowCommunicationEngine(strategy, BlackBoxTask("sphere", num_dims=4), make_mesh(1), params)


@pytest.mark.parametrize("n", [1, 2])
def test_elite_update_follows_the_best_fraction(n):
    w = np.log(2.5) - np.log([1.0, 2.0])  # CMA-ES's weights for the best 2 of 8
    w /= w.sum()
    fitness = jnp.array([3.0, 1.0, jnp.nan, 0.0, 5.0, 2.0, 4.0, 6.0])  # minimised; NaN last
    expected = np.zeros(8)
    expected[[3, 1]] = -w
    np.testing.assert_allclose(elite_shaping(8, 0.25)(None, fitness, None, None), expected)

    # one Open_ES generation with SGD at learning rate 1 moves the mean by
    # sum_k w_k (x_k - mean) / (n sigma^2) over the best two candidates
    config = ESConfig(strategy="Open_ES", task="sphere", num_dims=5, x0=1.0, population_size=8,
                      elite=0.25, optimizer="sgd", learning_rate=1.0, sigma_init=0.5,
                      noise="normal")  # fmt: skip
    es = ES(config, mesh=make_mesh(n))
    state = es.init(jax.random.key(0))
    key = jax.random.key(1)
    new, metrics = jax.jit(es.step)(state, key)
    s = state.strategy_state
    population, _ = es.strategy.ask(jax.random.split(key, 4)[0], s, es.params)
    f = np.asarray((population**2).sum(1))
    best = np.argsort(f)[:2]
    assert float(metrics["fitness_best"]) == pytest.approx(f.min(), rel=1e-6)
    step = (w[:, None] * (population[best] - s.mean)).sum(0) / (8 * s.std**2)
    np.testing.assert_allclose(new.strategy_state.mean, s.mean + step, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match=r"elite shapes Open_ES's update; SNES"):
        ESConfig(strategy="SNES", elite=0.1).validate()
    with pytest.raises(ConfigError, match=r"elite must be a fraction in \[0, 1\], got 1.5"):
        ESConfig(elite=1.5).validate()
