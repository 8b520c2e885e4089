"""CEM-RL and ERL on the engine: device-count invariance, RL actors entering the
population, exact step counts, and configuration errors.

Each algorithm runs two generations step by step on one device (the
reference) and under ``lax.scan`` on 2 and 4 devices; the results must agree
to float tolerance. CEM-RL's second generation is the first with TD3 updates.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from evorl_pop import make_mesh
from evorl_pop.algorithms import cemrl, erl
from evorl_pop.rl import TD3, TD3Config, TD3State
from evorl_pop.run import store
from evorl_pop.run.session import _rows

TINY_TD3 = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=32)
CEM_CONFIG = cemrl.Config(
    population_size=6,
    num_elites=3,
    num_rl_actors=3,
    updates_per_actor=4,
    learning_starts=60,  # reached after the first generation (6 x 10 steps)
    episode_length=10,
    eval_episodes=2,
    td3=TINY_TD3,
)
ERL_CONFIG = erl.Config(
    population_size=6,
    num_elites=2,
    sync_period=1,
    updates_per_generation=4,
    learning_starts=64,  # the initial population's 60 steps and the learner's first 10
    episode_length=10,
    eval_episodes=2,
    td3=TINY_TD3,
)
KEYS = jax.random.split(jax.random.key(42), 2)


def _like(value, ref):
    """``value`` with the dtype and placement of ``ref`` (a jitted step reuses its compilation)."""
    return jax.device_put(jnp.asarray(value, ref.dtype), ref.sharding)


def stepwise(algo, keys=KEYS):
    """Generations one jitted step at a time from ``init(key(0))``, one per key:
    ``(states, metrics, step)``, the states from the initial one on."""
    step = jax.jit(algo.step)
    states = [algo.init(jax.random.key(0))]
    metrics = []
    for k in keys:
        state, m = step(states[-1], k)
        states.append(state)
        metrics.append(m)
    # the state keeps its types from one generation to the next: no recompile
    assert step._cache_size() == 1
    return states, metrics, step


def _scanned(algo):
    run = jax.jit(lambda s, keys: jax.lax.scan(algo.step, s, keys))
    return run(algo.init(jax.random.key(0)), KEYS)


@pytest.fixture(scope="module")
def cem_reference():
    algo = cemrl.CEMRL(CEM_CONFIG, make_mesh(1))
    return algo, *stepwise(algo)


@pytest.fixture(scope="module")
def erl_reference():
    algo = erl.ERL(ERL_CONFIG, make_mesh(1))
    return algo, *stepwise(algo)


def _check_invariance(reference, make, n):
    _, states, metrics, _ = reference
    state, scanned = _scanned(make(n))
    chex.assert_trees_all_close(state, states[-1], rtol=1e-4, atol=1e-5)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *metrics)
    chex.assert_trees_all_close(scanned, stacked, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_cemrl_same_on_any_device_count(cem_reference, n):
    _check_invariance(cem_reference, lambda n: cemrl.CEMRL(CEM_CONFIG, make_mesh(n)), n)
    _, _, metrics, _ = cem_reference
    assert [int(m["rl_actors_injected"]) for m in metrics] == [0, 3]
    assert [int(m["env_steps"]) for m in metrics] == [60, 60]
    assert [int(m["episodes"]) for m in metrics] == [6, 6]


# 4 devices: the exhaustive tier (2 already split every batch)
@pytest.mark.parametrize(
    "n", [pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.exhaustive)]
)
def test_erl_same_on_any_device_count(erl_reference, n):
    _check_invariance(erl_reference, lambda n: erl.ERL(ERL_CONFIG, make_mesh(n)), n)
    _, _, metrics, _ = erl_reference
    assert [int(m["env_steps"]) for m in metrics] == [70, 70]  # 6 members + the learner
    assert [int(m["episodes"]) for m in metrics] == [7, 7]


def _generation_pieces(algo, before, key):
    """A generation's ask, learner step and evaluation, as the engine's step runs them."""
    k_ask, k_eval, _, _ = jax.random.split(key, 4)
    asked, strategy_state = algo.strategy.ask(k_ask, before.strategy_state, algo.params)
    population, _, metrics = jax.jit(algo.learner.step)(
        jax.random.fold_in(key, 4), before.learner_state, asked, strategy_state
    )
    summary, _ = jax.jit(algo.evaluate, static_argnums=3)(
        population, k_eval, before.task_state, True
    )
    return np.asarray(asked), np.asarray(population), summary, metrics


def _td3_in_turn(algo, critic, buffer, samples, key):
    """Each sample, as an actor with a fresh Adam state beside the critic the previous one
    left, trained by TD3's own ``learn`` on one device: ``(critic, actors)``."""
    td3 = TD3(algo.task.spec, CEM_CONFIG.td3, policy=algo.task.policy)
    learn = jax.jit(lambda state, key: td3.learn(state, buffer, key, CEM_CONFIG.updates_per_actor))
    actors = []
    for sample, k in zip(samples, jax.random.split(key, len(samples)), strict=True):
        actor = td3.init_actor(algo.task.unravel(jnp.asarray(sample)))
        state, _ = learn(TD3State(actor, critic, jnp.int32(0)), k)
        critic = state.critic
        actors.append(_flat(state.actor.params))
    return critic, np.stack(actors)


def test_cemrl_population_holds_the_td3_actors(cem_reference):
    """The RL part of the evaluated population is what TD3 makes of the CEM samples, one
    after the other against the shared critic; the rest are the samples, and the new mean
    is fitted to that population."""
    algo, states, metrics, _ = cem_reference
    before = states[1]
    after = states[2]
    samples, population, summary, _ = _generation_pieces(algo, before, KEYS[1])
    n_rl = CEM_CONFIG.num_rl_actors
    rl_key = jax.random.fold_in(KEYS[1], 4)
    learner = before.learner_state
    critic, trained = _td3_in_turn(algo, learner.critic, learner.buffer, samples[:n_rl], rl_key)
    np.testing.assert_allclose(population[:n_rl], trained, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(population[n_rl:], samples[n_rl:])
    assert np.abs(population[:n_rl] - samples[:n_rl]).max() > 1e-4  # TD3 moved them
    # the critic CEM-RL keeps is the one the last actor trained, and it moved
    chex.assert_trees_all_close(after.learner_state.critic, critic, rtol=1e-5, atol=1e-6)
    assert not np.allclose(_flat(critic.params), _flat(learner.critic.params))
    # the CEM mean follows the evaluated population
    fitness = np.asarray(summary.fitness(CEM_CONFIG.population_size))  # minimised
    order = np.argsort(fitness, kind="stable")[: CEM_CONFIG.num_elites]
    mean = np.asarray(algo.strategy.weights) @ population[order]
    np.testing.assert_allclose(after.strategy_state.mean, mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics[1]["fitness_best"], -fitness.min(), rtol=1e-6)


def _flat(params):
    return np.asarray(ravel_pytree(params)[0])


def test_erl_learner_actor_replaces_the_weakest(erl_reference):
    algo, states, metrics, _ = erl_reference
    before = states[1]
    after = states[2]
    s = before.strategy_state  # the population the second generation is bred from
    weakest = int(np.argmax(s.fitness))  # fitness is minimised
    population = np.asarray(after.strategy_state.population)
    learner = after.learner_state.learner  # it trained, then joined the population
    np.testing.assert_array_equal(population[weakest], _flat(learner.actor.params))
    assert int(metrics[1]["rl_actors_injected"]) == 1
    np.testing.assert_allclose(
        metrics[1]["injected_return"], -after.strategy_state.fitness[weakest], rtol=1e-6
    )
    # elites survive in their slots
    elites = np.argsort(np.asarray(s.fitness), kind="stable")[: ERL_CONFIG.num_elites]
    np.testing.assert_array_equal(population[elites], np.asarray(s.population)[elites])
    # the learner trained on the shared buffer in both generations
    assert np.isfinite(float(metrics[0]["critic_loss"]))
    first = states[0].learner_state.learner
    assert not np.allclose(_flat(learner.actor.params), _flat(first.actor.params))


def _ga_state(algo, flat, fitness):
    """A GA state holding ``flat`` with evosax fitness (minimised) ``fitness``."""
    state = algo.strategy.init(jax.random.key(0), flat, jnp.asarray(fitness), algo.params)
    return state.replace(generation_counter=jnp.int32(4))  # generation 5: sync_period 5 injects


def test_erl_breed_selects_fitter_parents():
    config = erl.Config(
        population_size=8, num_elites=1, mutation_prob=0.0, crossover_prob=0.0, td3=TINY_TD3
    )
    algo = erl.ERL(config, make_mesh(1))
    flat = jnp.arange(8.0)[:, None] * jnp.ones((8, algo.task.num_dims))
    state = _ga_state(algo, flat, -jnp.arange(8.0))  # member j returned j
    key = jax.random.key(0)
    children, _ = jax.jit(algo.strategy.ask)(key, state, algo.params)
    children = np.asarray(children)
    np.testing.assert_array_equal(children[7], flat[7])  # the elite
    # Without crossover and mutation child i copies the first of its two
    # tournament winners: the fittest of 3 members drawn with the first of
    # the 7 keys of fold_in(key, i). Member j's weights and return are all j.

    def winner(i):
        first = jax.random.split(jax.random.fold_in(key, i), 7)[0]
        return jnp.max(jax.random.randint(first, (3,), 0, 8))

    winners = np.asarray(jax.jit(jax.vmap(winner))(jnp.arange(7)))
    np.testing.assert_array_equal(children[:7], np.asarray(flat)[winners])
    assert np.mean(children[:7, 0]) > 3.5


@pytest.fixture(scope="module")
def erl_operators():
    config = erl.Config(population_size=6, num_elites=2, sync_period=5, td3=TINY_TD3)
    algo = erl.ERL(config, make_mesh(1))
    return algo, jax.jit(algo.strategy.ask), jax.jit(algo.learner.step)


def _elites(returns, k):
    """The k best slots, ties broken by slot order (an independent reference)."""
    returns = np.asarray(returns)
    return np.lexsort((np.arange(returns.size), -returns))[:k]


@pytest.mark.parametrize(
    "returns",
    [[-np.inf] * 6, [3.0, 5.0, 5.0, 1.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0, -np.inf, -np.inf]],
    ids=["all-tied", "ties", "tied-worst"],
)
def test_erl_injection_keeps_the_elites(erl_operators, returns):
    algo, ask, step = erl_operators
    flat = jnp.arange(6.0)[:, None] * jnp.ones((6, algo.task.num_dims))
    # evosax fitness as the engine hands it over: minimised, non-finite made worst
    fitness = np.where(np.isfinite(returns), -np.asarray(returns), np.finfo(np.float32).max)
    state = _ga_state(algo, flat, fitness.astype(np.float32))
    bred, state = ask(jax.random.key(1), state, algo.params)
    learner_state = algo.learner.init(jax.random.key(2))
    injected, learner_state, metrics = step(jax.random.key(3), learner_state, bred, state)
    injected = np.asarray(injected)
    slot = int(learner_state.slot)
    elites = _elites(returns, 2)
    assert slot not in elites and returns[slot] == min(returns)
    assert int(metrics["rl_actors_injected"]) == 1
    np.testing.assert_array_equal(injected[elites], np.asarray(flat)[elites])
    np.testing.assert_array_equal(injected[slot], _flat(learner_state.learner.actor.params))
    others = np.delete(np.arange(6), slot)
    np.testing.assert_array_equal(injected[others], np.asarray(bred)[others])
    # a generation that is not a multiple of sync_period injects nothing
    quiet = state.replace(generation_counter=jnp.int32(5))
    unchanged, _, metrics = step(
        jax.random.key(3), algo.learner.init(jax.random.key(2)), bred, quiet
    )
    np.testing.assert_array_equal(unchanged, bred)
    assert int(metrics["rl_actors_injected"]) == 0


def test_erl_step_with_tied_fitness_keeps_the_elites(erl_reference):
    """A generation whose parents all failed (every fitness worst) keeps its elites in
    slots 0 and 1 and injects the learner into a child's slot."""
    algo, states, _, step = erl_reference
    s = states[1].strategy_state
    worst = _like(np.full(6, np.finfo(np.float32).max), s.fitness)
    before = states[1].replace(strategy_state=s.replace(fitness=worst))
    after, metrics = step(before, KEYS[1])
    assert step._cache_size() == 1
    population = np.asarray(after.strategy_state.population)
    np.testing.assert_array_equal(population[:2], np.asarray(s.population)[:2])
    learner = after.learner_state.learner
    np.testing.assert_array_equal(population[5], _flat(learner.actor.params))
    assert int(metrics["rl_actors_injected"]) == 1


def test_run_counts_env_steps_exactly_past_2_31(tmp_path):
    """The run's step total is a Python int: it carries past 2**32 where an int32 wraps."""
    run = store.Run(tmp_path, None, "", None, "", generation=3, env_steps=2**33 - 30)
    steps = np.array([2**31 - 1, 2**31 - 1, 70], np.int32)
    rows = _rows(run, {"env_steps": steps, "fitness_best": np.zeros(3)}, wall=1.0)
    assert [r["env_steps"] for r in rows] == [
        2**33 - 30 + 2**31 - 1,
        2**33 + 2**32 - 32,
        2**33 + 2**32 + 38,
    ]
    assert [r["generation"] for r in rows] == [4, 5, 6] and run.env_steps == rows[-1]["env_steps"]


@pytest.mark.parametrize("module", [cemrl, erl])
def test_discrete_env_rejected(module):
    algo = cemrl.CEMRL if module is cemrl else erl.ERL
    with pytest.raises(ValueError, match=r"continuous actions.*'Pendulum-v1'"):
        algo(module.Config(task="CartPole-v1"))


@pytest.mark.parametrize("module", [cemrl, erl])
def test_buffer_smaller_than_batch_rejected(module):
    algo = cemrl.CEMRL if module is cemrl else erl.ERL
    with pytest.raises(ValueError, match="smaller than one TD3 batch"):
        algo(module.Config(buffer_capacity=16, learning_starts=0, td3=TINY_TD3))


@pytest.mark.parametrize("module", [cemrl, erl])
def test_batch_not_divisible_by_devices_rejected(module):
    algo = cemrl.CEMRL if module is cemrl else erl.ERL
    td3 = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=30)
    with pytest.raises(ValueError, match=r"TD3 minibatch's samples \(30\) .* 4 devices.*28 or 32"):
        algo(module.Config(td3=td3), make_mesh(4))


def test_population_too_small_rejected():
    with pytest.raises(ValueError, match="num_elites=8"):
        cemrl.CEMRL(cemrl.Config(population_size=6, num_elites=8))
    with pytest.raises(ValueError, match="num_rl_actors=7"):
        cemrl.CEMRL(cemrl.Config(population_size=6, num_elites=3, num_rl_actors=7))
    with pytest.raises(ValueError, match="population_size > num_elites"):
        erl.ERL(erl.Config(population_size=4, num_elites=4))


def test_mesh_without_pop_axis_rejected():
    with pytest.raises(ValueError, match="'POP'"):
        cemrl.CEMRL(CEM_CONFIG, make_mesh(2, axis_name="DP"))
