"""The engine's contract with a strategy: only the Strategy protocol's members, the best so
far kept by the engine, and a pure per-generation report."""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import make_strategy
from evorl_pop.base import EvalInfo
from evorl_pop.core.engine import Engine
from evorl_pop.core.interfaces import Strategy, Task

LAMBDA, DIMS, GENERATIONS = 6, 3, 8


@flax.struct.dataclass
class ParentState:
    parent: jax.Array  # (dims,)
    parent_fitness: jax.Array  # () minimised


class OnePlusLambda:
    """A (1+lambda)-ES with a fixed step size and only the protocol's members: its state
    has no best_fitness or best_solution."""

    def __init__(self, population_size: int, num_dims: int, std: float = 0.5):
        self.population_size = population_size
        self.num_dims = num_dims
        self.std = std

    @property
    def default_params(self):
        return ()

    def init(self, key, solution, params):
        del key, params
        return ParentState(solution, jnp.asarray(jnp.inf, solution.dtype))

    def ask(self, key, state, params):
        noise = jax.random.normal(key, (self.population_size, self.num_dims))
        return state.parent + self.std * noise, state

    def tell(self, key, population, fitness, state, params):
        i = jnp.argmin(fitness)
        better = fitness[i] < state.parent_fitness
        parent = jnp.where(better, population[i], state.parent)
        return ParentState(parent, jnp.where(better, fitness[i], state.parent_fitness)), {}

    def get_mean(self, state):
        return state.parent


class FailingHill:
    """Maximise ``-|x|^2``; a candidate with ``x[0] > 1.5`` fails (NaN). The task state
    counts the evaluations it has seen."""

    name = "failing-hill"
    num_dims = DIMS
    maximize = True

    def init_solution(self, key):
        return jnp.full((DIMS,), 1.0)

    def init_state(self):
        return jnp.int32(0)

    def update_state(self, task_state, info):
        return task_state + info.episodes

    def evaluate(self, solution, key, task_state):
        score = -jnp.sum(solution**2)
        score = jnp.where(solution[0] > 1.5, jnp.nan, score)
        return score, EvalInfo(steps=jnp.int32(1), episodes=jnp.int32(1))


def _score(x):
    """FailingHill's score in NumPy."""
    return np.where(x[:, 0] > 1.5, np.nan, -np.sum(x.astype(np.float64) ** 2, axis=1))


def test_a_strategy_with_only_the_protocols_members_runs_and_its_best_is_the_engines():
    strategy, task = OnePlusLambda(LAMBDA, DIMS), FailingHill()
    assert isinstance(strategy, Strategy) and isinstance(task, Task)
    assert not hasattr(strategy.init(jax.random.key(0), jnp.zeros(DIMS), ()), "best_fitness")
    engine = Engine(strategy, task, make_mesh(4), eval_episodes=1)  # 6 padded to 8
    state = engine.init(jax.random.key(1))
    step = jax.jit(engine.step)
    best, best_x, failed = np.inf, np.full(DIMS, np.nan), 0
    for g in range(GENERATIONS):
        key = jax.random.fold_in(jax.random.key(2), g)
        population = np.asarray(
            strategy.ask(jax.random.split(key, 4)[0], state.strategy_state, ())[0]
        )
        state, metrics = step(state, key)
        scores = _score(population)
        failed += int(np.sum(np.isnan(scores)))
        fitness = np.where(np.isnan(scores), np.inf, -scores)  # minimised, finite only
        if fitness.min() < best:
            best, best_x = fitness.min(), population[np.argmin(fitness)]
        np.testing.assert_allclose(metrics["best_so_far"], -best, rtol=1e-6)
        np.testing.assert_allclose(state.best_fitness, best, rtol=1e-6)
        np.testing.assert_allclose(state.best_solution, best_x, rtol=1e-6)
        # a distribution-based strategy reports its mean: here the parent
        parent = np.asarray(state.strategy_state.parent)
        np.testing.assert_allclose(metrics["eval_return"], _score(parent[None])[0], rtol=1e-6)
    assert failed > 0 and np.isfinite(best)  # failures happened and never entered the best
    assert int(state.task_state) == LAMBDA * GENERATIONS


def test_report_is_pure_and_step_updates_the_task_state():
    task = FailingHill()
    strategy, params = make_strategy("CMA_ES", 8, DIMS, sigma_init=0.3)
    engine = Engine(strategy, task, make_mesh(2), strategy_params=params, eval_episodes=1)
    state = engine.init(jax.random.key(3))
    key = jax.random.key(4)
    stepped, step_metrics = jax.jit(engine.step)(state, key)

    out = jax.jit(engine.generation)(state, key)
    after = stepped.replace(task_state=state.task_state)  # the generation's, before its update
    k_report = jax.random.split(key, 4)[3]
    extra = dict(out.metrics)
    first = jax.jit(engine.report)(after, out.summary, k_report, extra)
    second = jax.jit(engine.report)(after, out.summary, k_report, extra)
    assert extra == out.metrics and int(after.task_state) == 0  # nothing it was given changed
    assert set(first) == set(step_metrics)
    for name, value in step_metrics.items():
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        np.testing.assert_array_equal(first[name], value, err_msg=name)
    # the task state is step's to update: by the generation's evaluations
    assert int(stepped.task_state) == 8
