"""CEM-RL and ERL: device-count invariance, RL actors entering the population,
exact step counters, and configuration errors.

Each algorithm runs two generations step by step on one device (the
reference) and under ``lax.scan`` on 2 and 4 devices; the results must agree
to float tolerance. The second generation is the first with TD3 updates.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from evorl_pop import make_mesh
from evorl_pop.algorithms import cemrl, erl
from evorl_pop.base import Count
from evorl_pop.rl import TD3Config

TINY_TD3 = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=32)
CEM_CONFIG = cemrl.Config(
    population_size=6,
    num_elites=3,
    num_rl_actors=3,
    updates_per_actor=4,
    learning_starts=60,  # reached after the first generation (6 x 10 steps)
    episode_steps=10,
    eval_episodes=2,
    td3=TINY_TD3,
)
ERL_CONFIG = erl.Config(
    population_size=6,
    num_elites=2,
    sync_period=1,
    updates_per_generation=4,
    learning_starts=64,
    episode_steps=10,
    eval_episodes=2,
    td3=TINY_TD3,
)
KEYS = jax.random.split(jax.random.key(42), 2)


def _flat(tree):
    return np.asarray(jax.vmap(lambda p: ravel_pytree(p)[0])(tree))


def _like(value, ref):
    """``value`` with the dtype and placement of ``ref`` (a jitted step reuses its compilation)."""
    return jax.device_put(jnp.asarray(value, ref.dtype), ref.sharding)


def _stepwise(algo):
    step = jax.jit(algo.step)
    states, metrics = [algo.init(jax.random.key(0))], []
    for k in KEYS:
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
    return algo, *_stepwise(algo)


@pytest.fixture(scope="module")
def erl_reference():
    algo = erl.ERL(ERL_CONFIG, make_mesh(1))
    return algo, *_stepwise(algo)


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


@pytest.mark.parametrize("n", [2, 4])
def test_erl_same_on_any_device_count(erl_reference, n):
    _check_invariance(erl_reference, lambda n: erl.ERL(ERL_CONFIG, make_mesh(n)), n)
    _, _, metrics, _ = erl_reference
    assert [int(m["env_steps"]) for m in metrics] == [70, 70]  # 6 members + the learner
    assert [int(m["episodes"]) for m in metrics] == [7, 7]


def test_cemrl_population_holds_the_td3_actors(cem_reference):
    """The RL half of the evaluated population is exactly what TD3 produced from
    the CEM samples, the rest are the samples, and the new mean is fitted to
    that population."""
    algo, states, metrics, _ = cem_reference
    before, after = states[1], states[2]
    ask_key, rl_key, _, _ = jax.random.split(KEYS[1], 4)
    samples = np.asarray(algo.ask(before, ask_key))
    n_rl = CEM_CONFIG.num_rl_actors
    _, trained, _ = jax.jit(algo.train_actors)(
        before.critic, jnp.asarray(samples[:n_rl]), before.buffer, rl_key
    )
    population = _flat(after.population)
    np.testing.assert_allclose(population[:n_rl], trained, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(population[n_rl:], samples[n_rl:], rtol=1e-5, atol=1e-7)
    assert np.abs(population[:n_rl] - samples[:n_rl]).max() > 1e-4  # TD3 moved them
    # the critic was trained, and the CEM mean follows the evaluated population
    assert not np.allclose(
        jax.tree.leaves(after.critic.params)[0], jax.tree.leaves(before.critic.params)[0]
    )
    order = np.argsort(-np.asarray(after.fitness), kind="stable")[: CEM_CONFIG.num_elites]
    np.testing.assert_allclose(after.mean, np.asarray(algo.weights) @ population[order], rtol=1e-5)
    np.testing.assert_allclose(
        metrics[1]["fitness_best"], np.max(np.asarray(after.fitness)), rtol=1e-6
    )


def test_erl_learner_actor_replaces_the_weakest(erl_reference):
    algo, states, metrics, _ = erl_reference
    before, after = states[1], states[2]
    weakest = int(np.argmin(before.fitness))
    population = _flat(after.population)
    learner = np.asarray(ravel_pytree(before.learner.actor.params)[0])
    np.testing.assert_array_equal(population[weakest], learner)
    assert int(metrics[1]["rl_actors_injected"]) == 1
    np.testing.assert_allclose(metrics[1]["injected_return"], after.fitness[weakest])
    # elites survive in their slots; the first generation injects nothing
    elites = np.argsort(-np.asarray(before.fitness))[: ERL_CONFIG.num_elites]
    np.testing.assert_array_equal(population[elites], _flat(before.population)[elites])
    assert int(metrics[0]["rl_actors_injected"]) == 0
    # the learner trained on the shared buffer in both generations
    assert np.isfinite(float(metrics[0]["critic_loss"]))
    assert not np.allclose(learner, ravel_pytree(states[0].learner.actor.params)[0])


def test_erl_breed_selects_fitter_parents():
    config = erl.Config(
        population_size=8, num_elites=1, mutation_prob=0.0, crossover_prob=0.0, td3=TINY_TD3
    )
    algo = erl.ERL(config)
    flat = jnp.arange(8.0)[:, None] * jnp.ones((8, algo.num_params))
    fitness = jnp.arange(8.0)
    key = jax.random.key(0)
    children = np.asarray(jax.jit(algo.breed)(flat, fitness, key))
    np.testing.assert_array_equal(children[7], flat[7])  # the elite
    # Without crossover and mutation child i copies the first of its two
    # tournament winners: the fittest of 3 members drawn with the first of
    # the 7 keys of fold_in(key, i). Member j's weights and fitness are all j.

    def winner(i):
        first = jax.random.split(jax.random.fold_in(key, i), 7)[0]
        return jnp.max(jax.random.randint(first, (3,), 0, 8))

    winners = np.asarray(jax.jit(jax.vmap(winner))(jnp.arange(7)))
    np.testing.assert_array_equal(children[:7], np.asarray(flat)[winners])
    assert np.mean(children[:7, 0]) > 3.5


@pytest.fixture(scope="module")
def erl_operators():
    algo = erl.ERL(erl.Config(population_size=6, num_elites=2, td3=TINY_TD3))
    return algo, jax.jit(algo.breed), jax.jit(algo.inject)


def _elites(fitness, k):
    """The k best slots, ties broken by slot order (an independent reference)."""
    fitness = np.asarray(fitness)
    return np.lexsort((np.arange(fitness.size), -fitness))[:k]


@pytest.mark.parametrize(
    "fitness",
    [[-np.inf] * 6, [3.0, 5.0, 5.0, 1.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0, -np.inf, -np.inf]],
    ids=["all-tied", "ties", "tied-worst"],
)
def test_erl_injection_keeps_the_elites(erl_operators, fitness):
    algo, breed, inject = erl_operators
    flat = jnp.arange(6.0)[:, None] * jnp.ones((6, algo.num_params))
    fitness = jnp.asarray(fitness, jnp.float32)
    actor = jnp.full((algo.num_params,), -1.0)
    bred = np.asarray(breed(flat, fitness, jax.random.key(1)))
    injected, slot = inject(jnp.asarray(bred), fitness, actor, jnp.bool_(True))
    injected, slot = np.asarray(injected), int(slot)
    elites = _elites(fitness, 2)
    assert slot not in elites and fitness[slot] == fitness.min()
    np.testing.assert_array_equal(injected[elites], np.asarray(flat)[elites])
    np.testing.assert_array_equal(injected[slot], actor)
    others = np.delete(np.arange(6), slot)
    np.testing.assert_array_equal(injected[others], bred[others])
    unchanged, _ = inject(jnp.asarray(bred), fitness, actor, jnp.bool_(False))
    np.testing.assert_array_equal(unchanged, bred)


def test_erl_step_with_tied_fitness_keeps_the_elites(erl_reference):
    """A generation whose parents all failed (fitness -inf) keeps its elites in
    slots 0 and 1 and injects the learner into a child's slot."""
    _, states, _, step = erl_reference
    before = states[1].replace(fitness=_like(np.full(6, -np.inf), states[1].fitness))
    after, metrics = step(before, KEYS[1])
    assert step._cache_size() == 1
    population = _flat(after.population)
    np.testing.assert_array_equal(population[:2], _flat(before.population)[:2])
    learner = np.asarray(ravel_pytree(before.learner.actor.params)[0])
    np.testing.assert_array_equal(population[5], learner)
    assert int(metrics["rl_actors_injected"]) == 1


def test_count_exact_past_2_31():
    add = jax.jit(lambda c, n: c.add(n))
    count, total = Count.zero(), 0
    for n in [2**31 - 1, 2**31 - 1, 2**31 - 1, 7, 123_456]:
        count, total = add(count, jnp.int32(n)), total + n
        assert int(count) == total
    assert total > 2**32


@pytest.mark.parametrize("name", ["cem", "erl"])
def test_env_steps_exact_past_2_31(name, cem_reference, erl_reference):
    """The state's step total carries past 2**32 where an int32 would wrap."""
    _, states, metrics, step = cem_reference if name == "cem" else erl_reference
    start = 2**33 - 30  # hi word 1, lo word 2**32 - 30
    steps = states[1].env_steps
    before = states[1].replace(env_steps=Count(_like(1, steps.hi), _like(2**32 - 30, steps.lo)))
    assert int(before.env_steps) == start
    after, m = step(before, KEYS[1])
    assert step._cache_size() == 1
    assert int(m["env_steps"]) == int(metrics[1]["env_steps"]) > 30
    assert int(after.env_steps) == start + int(m["env_steps"])


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
    with pytest.raises(ValueError, match=r"batch size 30 .* 4 devices.*28 or 32"):
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
