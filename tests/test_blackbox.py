"""Black-box optimisation: BBOB tasks, float64 runs, restarts, Python objectives.

float64 checks run under the scoped ``jax.enable_x64(True)``: the rest of the
test process keeps JAX's default 32-bit mode.
"""

import dataclasses
from collections.abc import Callable

import _loop
import cma
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from evosax.problems.bbob.bbob import BBOBProblem

from evorl_pop import make_mesh
from evorl_pop.algorithms.cma_es import CMA_ES_pycma
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.algorithms.restarts import (
    Minimizer,
    StopRules,
    default_max_generations,
    default_tolstagnation,
    minimize,
)
from evorl_pop.base import ConfigError, EvalInfo, ObjectiveError
from evorl_pop.tasks import BlackBoxTask, make_task, task_names
from evorl_pop.tasks.blackbox import BBOBTask, PythonTask, bbob_instance


def _float_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]


def test_bbob_task_equals_evosax_problem():
    problem = BBOBProblem("rastrigin_rotated", 3, seed=5)
    x = jax.random.uniform(jax.random.key(0), (6, 3), minval=-5.0, maxval=5.0)
    expected = problem.eval(jax.random.key(1), x, problem.init(jax.random.key(2)))[0]
    task = make_task("bbob/rastrigin_rotated", num_dims=3, instance=5)
    got = jax.vmap(lambda xi: task.evaluate(xi, None, task.init_state())[0])(x)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(task.init_state().f_opt) == float(problem.f_opt)


@pytest.mark.parametrize("devices", [1, 2])
def test_float64_state_population_and_fitness_after_a_generation(devices):
    with jax.enable_x64(True):
        config = ESConfig(
            strategy="CMA_ES",
            task="bbob/ellipsoidal_rotated",
            num_dims=3,
            population_size=6,
            sigma_init=1.0,
            instance=2,
            eval_episodes=0,
        )
        es = ES(config, mesh=make_mesh(devices))
        state = es.init(jax.random.key(0))
        population, _ = es.strategy.ask(jax.random.key(1), state.strategy_state, es.params)
        new_state, metrics = jax.jit(es.step)(state, jax.random.key(1))
        assert population.dtype == jnp.float64
        assert {x.dtype for x in _float_leaves(new_state)} == {jnp.dtype(jnp.float64)}
        for name in ("fitness_best", "fitness_mean", "fitness_median", "f_minus_fopt", "sigma"):
            assert metrics[name].dtype == jnp.float64, name
        # the generation itself is the 1-device one, to float64 rounding
        reference = ES(config, mesh=make_mesh(1))
        ref_state, ref_metrics = jax.jit(reference.step)(
            reference.init(jax.random.key(0)), jax.random.key(1)
        )
        np.testing.assert_allclose(
            new_state.strategy_state.mean, ref_state.strategy_state.mean, rtol=1e-12
        )
        np.testing.assert_allclose(metrics["fitness_best"], ref_metrics["fitness_best"], rtol=1e-12)
    assert not jax.config.x64_enabled and jnp.zeros(1).dtype == jnp.float32


def test_cmaes_float64_reaches_1e_8_on_a_shifted_rotated_ellipsoid():
    # BBOB f10 (condition 1e6), instance 13: f* = 119.09...
    with jax.enable_x64(True):
        config = ESConfig(
            strategy="CMA_ES",
            task="bbob/ellipsoidal_rotated",
            num_dims=10,
            population_size=10,
            sigma_init=2.0,
            instance=13,
            eval_episodes=0,
        )
        result = minimize(
            config,
            jax.random.key(0),
            target=1e-8,
            max_evaluations=10_000,
            x0=np.linspace(-4.0, 4.0, 10),
            mesh=make_mesh(1),
        )
    assert 100.0 < result.best < 120.0
    assert result.converged and 0.0 <= result.f_minus_fopt < 1e-8, result
    assert result.evaluations <= 10_000


@pytest.mark.parametrize("num_dims, population_size, step", [(4, 8, 0), (3, 7, 0), (4, 8, 40)])
def test_cma_es_pycma_generations_equal_pycmas(num_dims, population_size, step):
    n, lam = num_dims, population_size
    x0 = np.linspace(-2.0, 3.0, n)
    es = cma.CMAEvolutionStrategy(x0, 0.7, {"popsize": lam, "verbose": -9, "seed": 3})
    es.adapt_sigma.initialize(es)
    ties = 0

    def f(x):  # an ellipsoid: rank-one, rank-mu and negative (active) terms all act
        value = float(np.sum(np.arange(1, n + 1) ** 3 * (x - 0.3) ** 2))
        return step * np.floor(value / step) if step else value  # with step: a staircase

    with jax.enable_x64(True):
        strategy = CMA_ES_pycma(population_size=lam, solution=jnp.zeros(n))
        params = strategy.default_params.replace(std_init=jnp.float64(0.7))
        expected = [es.sp.c1, es.sp.cmu, es.sp.cc, es.adapt_sigma.cs, es.adapt_sigma.damps]
        got = [params.c_1, params.c_mu, params.c_c, params.c_std, params.d_std]
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        np.testing.assert_allclose(params.weights, np.asarray(es.sp.weights), rtol=1e-12)
        state = strategy.init(jax.random.key(0), jnp.asarray(x0), params)
        np.testing.assert_allclose(state.C, es.sm.C, rtol=1e-15)
        for generation in range(6):
            _, state = strategy.ask(jax.random.key(generation), state, params)  # B, D of C
            xs = es.ask()  # pycma's candidates, told to both
            fitness = [f(x) for x in xs]
            ties += len(set(fitness)) < lam
            # numpy's sort orders ties arbitrarily; ours keeps the candidates' order, so
            # pycma is told that order through a tie-breaking offset far below the step
            es.tell(xs, [value + 1e-9 * i for i, value in enumerate(fitness)])
            state, _ = strategy.tell(
                jax.random.key(generation),
                jnp.asarray(np.array(xs)),
                jnp.asarray(fitness),
                state,
                params,
            )
            # nothing added to C before its eigendecomposition, as in pycma (which adds 1e-9
            # to the Mahalanobis norms of the negative-weight vectors)
            np.testing.assert_allclose(state.mean, es.mean, rtol=1e-12)
            np.testing.assert_allclose(state.std, es.sigma, rtol=1e-7)
            np.testing.assert_allclose(state.C, es.sm.C, rtol=1e-7, atol=1e-9)
            np.testing.assert_allclose(state.p_c, es.pc, rtol=1e-7, atol=1e-9)
            np.testing.assert_allclose(state.p_std, es.adapt_sigma.ps, rtol=1e-7, atol=1e-9)
    # on the staircase, candidates tie: each gets its own weight, none an averaged rank's
    assert ties >= 3 if step else ties == 0


def test_cma_es_pycma_counts_flat_generations_as_pycma():
    # pycma: flat when the best fitness is not below the one at rank int(0.75 λ)
    strategy = CMA_ES_pycma(population_size=8, solution=jnp.zeros(2))
    params = strategy.default_params
    state = strategy.init(jax.random.key(0), jnp.zeros(2), params)
    population = jax.random.normal(jax.random.key(1), (8, 2))
    counts = []
    for fitness in (
        [1, 1, 1, 1, 1, 1, 1, 5],
        [1, 1, 1, 1, 1, 1, 1, 5],
        [0, 1, 1, 1, 1, 1, 1, 1],
        [3, 2, 2, 2, 2, 2, 2, 2],
        [3, 2, 2, 2, 2, 2, 3, 9],
    ):
        state, _ = strategy.tell(
            jax.random.key(2), population, jnp.asarray(fitness, jnp.float32), state, params
        )
        counts.append(int(state.flat_generations))
    assert counts == [1, 2, 0, 1, 0]


_ROTATION = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]


def _ellipsoid(exponent, rotated):
    """A 3-D ellipsoid of condition ``10**exponent``, optimum at 0.3, optionally rotated."""
    scales = 10.0 ** (exponent * np.arange(3) / 2)
    rotation = _ROTATION if rotated else np.eye(3)
    return lambda x: float(np.sum(scales * (rotation @ (x - 0.3)) ** 2))


def _phenotype_covariance(transform, scaling, sigma, C):
    A = np.asarray(transform) * np.asarray(scaling)
    return float(sigma) ** 2 * A @ np.asarray(C) @ A.T


@pytest.mark.parametrize(
    "exponent, rotated, generations",
    [
        # axis-parallel: C's diagonal reaches a ratio of 1e8, its scales move into sigma_vec
        (10, False, 100),
        # rotated: C's condition reaches 1e12, its root moves into the genotype-phenotype map
        (14, True, 120),
    ],
)
def test_cma_es_pycma_alleviates_conditioning_as_pycma(exponent, rotated, generations):
    n = 3
    lam = 7
    x0 = np.linspace(-2.0, 3.0, 3)
    f = _ellipsoid(exponent, rotated)
    es = cma.CMAEvolutionStrategy(x0, 0.7, {"popsize": lam, "verbose": -9, "seed": 3})
    es.adapt_sigma.initialize(es)
    events = []
    with jax.enable_x64(True):
        strategy = CMA_ES_pycma(population_size=lam, solution=jnp.zeros(n))
        params = strategy.default_params.replace(std_init=jnp.float64(0.7))
        state = strategy.init(jax.random.key(0), jnp.asarray(x0), params)
        ask, tell = jax.jit(strategy.ask), jax.jit(strategy.tell)
        for generation in range(generations):
            scaling = np.asarray(state.scaling)
            _, state = ask(jax.random.key(generation), state, params)
            xs = es.ask()  # pycma alleviates in ask, before sampling; so does the strategy
            # the same generation, the same action
            assert bool(state.transformed) == (not es.gp.isidentity), generation
            np.testing.assert_allclose(state.scaling, es.sigma_vec.scaling, rtol=1e-5)
            if not np.array_equal(scaling, np.asarray(state.scaling)):
                events.append(generation)
            fitness = [f(x) for x in xs]
            es.tell(xs, fitness)
            state, _ = tell(
                jax.random.key(generation),
                jnp.asarray(np.array(xs)),
                jnp.asarray(fitness),
                state,
                params,
            )
            # the distribution in the search space: mean and covariance, pycma's
            # covariance whitened (near a condition of 1e12 the rounding of C's
            # narrow axes, in either, is amplified by 1e6 in its wide ones)
            transform = np.eye(n) if es.gp.isidentity else es.gp._tf_matrix
            expected = _phenotype_covariance(transform, es.sigma_vec.scaling, es.sigma, es.sm.C)
            got = _phenotype_covariance(state.transform, state.scaling, state.std, state.C)
            w, V = np.linalg.eigh(expected)
            whiten = (V / np.sqrt(w)) @ V.T
            mean = np.asarray(state.transform) @ np.asarray(state.mean)
            tolerance = 1e-4 if w.max() / w.min() < 1e11 else 3e-3
            assert np.linalg.norm(whiten @ (mean - es.gp.pheno(es.mean))) < tolerance, generation
            assert np.max(np.abs(whiten @ (got - expected) @ whiten)) < tolerance, generation
            # and in pycma's coordinates, where the stop rules look
            np.testing.assert_allclose(state.C, es.sm.C, rtol=0, atol=3e-3 * np.max(es.sm.C))
            if es.gp.isidentity:
                np.testing.assert_allclose(state.mean, es.mean, rtol=1e-12)
        if rotated:
            assert not es.gp.isidentity and np.all(np.asarray(state.scaling) == 1.0)
            np.testing.assert_allclose(
                state.transform, es.gp._tf_matrix, atol=1e-4 * np.max(np.abs(es.gp._tf_matrix))
            )
        else:
            assert es.gp.isidentity and len(events) == 1, events
        # the candidates follow the distribution in the search space
        many = CMA_ES_pycma(population_size=200_000, solution=jnp.zeros(n))
        population, asked = many.ask(jax.random.key(7), state, params)
        covariance = _phenotype_covariance(asked.transform, asked.scaling, asked.std, asked.C)
        w, V = np.linalg.eigh(covariance)
        whiten = (V / np.sqrt(w)) @ V.T
        centred = np.asarray(population) - np.asarray(asked.transform) @ np.asarray(asked.mean)
        assert np.max(np.abs(whiten @ (np.cov(centred.T) - covariance) @ whiten)) < 0.02
        assert np.linalg.norm(whiten @ centred.mean(0)) < 0.02
        np.testing.assert_allclose(many.get_mean(asked), asked.transform @ asked.mean)


@dataclasses.dataclass(frozen=True)
class _Function(BlackBoxTask):
    f: Callable = jnp.sum

    def evaluate(self, solution, key, task_state):
        return self.f(solution), EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))


def _first_squared(x):
    return jnp.square(x[0])


def _first_exp(x):
    return jnp.exp(x[0])


def _first(x):
    return x[0]


@pytest.mark.parametrize(
    "rule, f, x0, sigma, options",
    [
        # a coordinate so large that 0.2 σ sqrt(C_ii) does not change it (pycma
        # misses it in coordinate 0: ``any`` of its indices)
        ("noeffectcoord", _first_squared, [1.0, 1e20], 1.0, {}),
        # a slope without end: σ grows past 1e3 σ0
        ("tolfacupx", _first_exp, [0.0, 0.0], 1e-3, {}),
        # a linear function: σ grows while C's largest axis shrinks, σ / sqrt(λ_max(C)) > 1e2 σ0
        ("tolupsigma", _first, [0.0, 0.0], 1.0, {"tolupsigma": 1e2}),
    ],
)
def test_minimize_stops_on_the_rule_pycma_stops_on(rule, f, x0, sigma, options):
    es = cma.CMAEvolutionStrategy(x0, sigma, {"popsize": 6, "verbose": -9, "seed": 1} | options)
    while not es.stop():
        xs = es.ask()
        es.tell(xs, [float(f(x)) for x in xs])
    assert rule in es.stop(), es.stop()
    with jax.enable_x64(True):
        config = ESConfig(
            strategy="CMA_ES_pycma",
            num_dims=2,
            population_size=6,
            sigma_init=sigma,
            eval_episodes=0,
        )
        result = minimize(
            config,
            jax.random.key(0),
            target=-np.inf,
            max_evaluations=6000,
            x0=np.array(x0),
            mesh=make_mesh(1),
            task=_Function(num_dims=2, f=f),
            stop_rules=StopRules(**options),
        )
    assert [r.stop for r in result.runs] == [rule], result.runs
    # within a few generations of pycma's stop
    assert abs(result.evaluations - es.countevals) <= 10 * 6, (result.evaluations, es.countevals)


@pytest.mark.parametrize("num_dims, population_size", [(2, 6), (5, 8), (10, 10), (5, 17)])
def test_default_maxiter_and_tolstagnation_are_pycmas(num_dims, population_size):
    es = cma.CMAEvolutionStrategy(
        np.zeros(num_dims), 1.0, {"popsize": population_size, "verbose": -9}
    )
    assert default_max_generations(num_dims, population_size) == es.opts["maxiter"]
    assert default_tolstagnation(num_dims, population_size) == es.opts["tolstagnation"]


def _bipop_rastrigin():
    config = ESConfig(
        strategy="CMA_ES",
        task="bbob/rastrigin",
        num_dims=3,
        population_size=6,
        sigma_init=2.0,
        instance=1,
        eval_episodes=0,
    )
    return Minimizer(config, mesh=make_mesh(2))


def test_ipop_doubles_the_population_within_one_budget():
    minimizer = _bipop_rastrigin()
    result = minimizer.minimize(
        jax.random.key(0),
        target=1e-8,
        max_evaluations=4000,
        restarts=9,
        restart_strategy="ipop",
        x0=np.full(3, 3.0),
    )
    sizes = [r.population_size for r in result.runs]
    assert sizes == [6 * 2**k for k in range(len(sizes))]
    assert {r.max_generations for r in result.runs} == {default_max_generations(3, 6)}
    assert len(sizes) >= 3, result.runs
    assert sum(r.evaluations for r in result.runs) == result.evaluations <= 4000
    assert all(r.evaluations % r.population_size == 0 for r in result.runs)
    # every run but the last one stopped by a termination rule, not the budget
    assert all(r.stop not in ("budget", "running") for r in result.runs[:-1])
    assert result.runs[-1].stop in ("target", "budget") or result.converged


def test_bipop_alternates_regimes_as_hansen_2009():
    minimizer = _bipop_rastrigin()
    result = minimizer.minimize(
        jax.random.key(1),
        target=1e-12,
        max_evaluations=3000,
        restarts=9,
        restart_strategy="bipop",
        x0=np.full(3, 3.0),
    )
    runs = result.runs
    assert runs[0].regime == "first" and runs[0].population_size == 6
    maxiter0 = default_max_generations(3, 6)  # every run keeps it, as in cma.fmin
    assert runs[0].max_generations == maxiter0
    assert sum(r.evaluations for r in runs) == result.evaluations <= 3000
    small = runs[0].evaluations
    large = 0
    num_large = 0
    for run in runs[1:]:
        # small regime exactly when small runs used fewer evaluations than large ones
        assert run.regime == ("small" if small < max(1, large) else "large"), runs
        if run.regime == "large":
            num_large += 1
            assert run.population_size == 6 * 2**num_large and run.sigma == 2.0
            assert run.max_generations == maxiter0
            large += run.evaluations
        else:
            assert 6 <= run.population_size <= 6 * 2**num_large
            assert 0.02 <= run.sigma <= 2.0
            assert run.evaluations <= 0.5 * large + run.population_size
            assert run.max_generations == min(
                maxiter0, int(np.ceil(0.5 * large / run.population_size))
            )
            small += run.evaluations
    assert {"small", "large"} <= {r.regime for r in runs}, runs


def _sphere_sum(x):
    return float(np.sum(np.square(x)))


@pytest.mark.parametrize("batched", [False, True])
def test_python_objective_gives_the_same_run_as_the_jax_task(batched):
    f = (lambda X: np.sum(np.square(X), axis=1)) if batched else _sphere_sum
    config = ESConfig(
        strategy="CMA_ES",
        task="sphere",
        num_dims=5,
        population_size=9,
        sigma_init=0.5,
        x0=1.0,
        eval_episodes=1,
    )
    python_task = PythonTask(f, num_dims=5, x0=1.0, batched=batched, optimal_value=0.0)
    histories = []
    for task in (BlackBoxTask("sphere", num_dims=5, x0=1.0), python_task):
        es = ES(config, mesh=make_mesh(2), task=task)
        _, history = _loop.train(es, jax.random.key(3), 15, chunk=5)
        histories.append(history)
    jax_run, python_run = histories
    for name in ("fitness_best", "fitness_median", "eval_return", "f_minus_fopt", "sigma"):
        np.testing.assert_allclose(python_run[name], jax_run[name], rtol=1e-5, err_msg=name)
    assert python_run["fitness_best"][-1] < 0.1 * python_run["fitness_best"][0]


def test_python_objective_sees_float64_on_every_device():
    seen = set()

    def f(x):
        seen.add(x.dtype)
        return np.sum(np.square(x))

    config = ESConfig(
        strategy="CMA_ES",
        task="sphere",
        num_dims=3,
        population_size=6,
        sigma_init=0.5,
        x0=1.0,
        eval_episodes=0,
    )
    with jax.enable_x64(True):
        for devices in (1, 2):  # on 2, the callbacks run where the scoped mode does not reach
            runs = []
            for task in (PythonTask(f, 3, x0=1.0), BlackBoxTask("sphere", 3, x0=1.0)):
                es = ES(config, mesh=make_mesh(devices), task=task)
                run = lambda s, es=es: _loop.run(es, s, jax.random.key(1), 3)[1]  # noqa: E731
                runs.append(run(es.init(jax.random.key(0)))["fitness_best"])
            assert runs[0].dtype == jnp.float64
            # float32 arguments or results would differ from float64 at about 1e-7
            np.testing.assert_allclose(runs[0], runs[1], rtol=1e-13)
    assert seen == {np.dtype(np.float64)}


def test_bad_input_is_one_clear_line():
    unknown = "Unknown BBOB function 'ellipsoid'. Did you mean 'ellipsoidal'"
    with pytest.raises(ValueError, match=unknown):
        make_task("bbob/ellipsoid", num_dims=4)
    with pytest.raises(ValueError, match=r"instance must be an integer in \[1, 2147483647\].*0"):
        BBOBTask("sphere", num_dims=4, instance=0)
    with pytest.raises(ConfigError, match="Did you mean 'bbob/discus'"):
        ESConfig(strategy="CMA_ES", task="bbob/discsu").validate()
    ESConfig(strategy="CMA_ES", task="bbob/discus").validate()
    assert "bbob/lunacek" in task_names() and "CartPole-v1" in task_names()

    def two_values(x):
        return np.array([1.0, 2.0])

    wrong_shape = r"objective 'two_values' returned shape \(2,\) from f\(x\)"
    with pytest.raises(ValueError, match=wrong_shape):
        PythonTask(two_values, num_dims=3)
    with pytest.raises(ValueError, match=r"objective 'short' returned shape \(2,\) from f\(X\)"):
        PythonTask(lambda X: np.zeros(len(X) + 1), num_dims=3, batched=True, name="short")

    def broken(x):
        raise FloatingPointError("overflow in the simulator")

    with pytest.raises(ValueError, match="objective 'broken' raised FloatingPointError: overflow"):
        PythonTask(broken, num_dims=3)


def test_python_objective_failing_mid_run_is_one_clear_line():
    def far_away(x):  # fine at x0, fails once the search strays
        if np.abs(x).max() > 10:
            raise ValueError("|x| > 10")
        return float(np.sum(x**2))

    task = PythonTask(far_away, num_dims=2, x0=0.0)
    es = ES(
        ESConfig(
            strategy="CMA_ES",
            task="sphere",
            num_dims=2,
            population_size=4,
            sigma_init=100.0,
            eval_episodes=0,
        ),
        mesh=make_mesh(2),
        task=task,
    )
    with pytest.raises(ObjectiveError) as info:
        _loop.train(es, jax.random.key(0), 5)
    assert str(info.value) == "The objective 'far_away' raised ValueError: |x| > 10"
    # the process goes on computing, and no stale callback error waits for the next computation
    jax.effects_barrier()
    assert float(jnp.sum(jnp.ones(3))) == 3.0


def test_one_compiled_run_serves_every_instance():
    config = ESConfig(
        strategy="CMA_ES",
        task="bbob/sphere",
        num_dims=3,
        population_size=6,
        sigma_init=2.0,
        eval_episodes=0,
    )
    bests = []
    with jax.enable_x64(True):
        minimizer = Minimizer(config, mesh=make_mesh(1))
        for instance in (1, 2, 3):
            data = bbob_instance("sphere", 3, instance)
            result = minimizer.minimize(
                jax.random.key(0),
                target=1e-8,
                max_evaluations=1200,
                x0=np.zeros(3),
                task_state=data,
            )
            assert result.converged and result.best - float(data.f_opt) < 1e-8
            bests.append(result.best)
        run = minimizer._run_fn(6, 1200 // 6 // 5 + 1)  # the history of a 1200-evaluation budget
    assert run._cache_size() == 1
    assert len(set(bests)) == 3  # three different f*
