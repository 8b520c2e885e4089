"""TD3, the replay buffer and transition rollouts against references.

The data-parallel TD3 update with the minibatch split over 2 and 4 devices
must equal the full-batch update on one device; buffers and rollouts are
checked against hand-computed contents and unsharded references.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from evorl_pop import make_mesh
from evorl_pop.algorithms.cemrl import CEM, Config
from evorl_pop.base import EnvSpec
from evorl_pop.core.engine import Engine
from evorl_pop.rl import TD3, ReplayBuffer, TD3Config, example_transition, sample
from evorl_pop.tasks import ControlTask
from evorl_pop.tasks.envs import make_env
from evorl_pop.tasks.rollout import Transition, rollout


def collect_episode(env, policy, params, key, noise_std=0.0, episode_length=None):
    """One episode with its transitions and exploration noise."""
    return rollout(env, policy, params, key, None, episode_length, noise_std, collect=True)


TINY = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16, 16), batch_size=32)


def _leaves_close(a, b, rtol=1e-4, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def pendulum():
    return make_env("Pendulum-v1")


@pytest.fixture(scope="module")
def filled(pendulum):
    """A TD3 learner and a buffer holding two noisy episodes of its actor."""
    td3 = TD3(pendulum.spec, TINY)
    state = td3.init(jax.random.key(0))
    buffer = ReplayBuffer.create(example_transition(pendulum.spec), 1000)
    episodes = jax.jit(
        jax.vmap(lambda k: collect_episode(pendulum, td3.policy, state.actor.params, k, 0.5, 100))
    )(jax.random.split(jax.random.key(1)))
    buffer = buffer.add(episodes.transitions, episodes.valid)
    return td3, state, buffer


def _random_batch(spec, n, key):
    k = jax.random.split(key, 5)
    obs = jax.random.normal(k[0], (n, *spec.obs_shape))
    return Transition(
        obs=obs,
        action=jax.random.uniform(k[1], (n, spec.action_dim), minval=-2.0, maxval=2.0),
        reward=jax.random.normal(k[2], (n,)),
        next_obs=obs + 0.1 * jax.random.normal(k[3], obs.shape),
        terminal=(jax.random.uniform(k[4], (n,)) < 0.2).astype(jnp.float32),
    )


@pytest.mark.parametrize("n", [2, 4])
def test_update_dp_equals_full_batch(filled, n):
    """Two TD3 iterations (the first with the delayed actor step) on a fixed batch."""
    td3, state, _ = filled
    batch = _random_batch(td3.spec, TINY.batch_size, jax.random.key(7))

    def two_updates(state, batch, key, axis):
        state, m1 = td3.update(state, batch, jax.random.fold_in(key, 0), axis)
        state, m2 = td3.update(state, batch, jax.random.fold_in(key, 1), axis)
        return state, (m1, m2)

    ref, ref_metrics = jax.jit(lambda s, b, k: two_updates(s, b, k, None))(
        state, batch, jax.random.key(3)
    )
    mesh = make_mesh(n, axis_name="DP")
    sharded = jax.shard_map(
        lambda s, b, k: two_updates(s, b, k, "DP"),
        mesh=mesh,
        in_specs=(P(), P("DP"), P()),
        out_specs=P(),
    )
    got, metrics = jax.jit(sharded)(state, batch, jax.random.key(3))
    _leaves_close(got, ref)
    _leaves_close(metrics, ref_metrics)
    # the reference really moved: critic, actor and both targets
    for before, after in [
        (state.critic.params, ref.critic.params),
        (state.actor.params, ref.actor.params),
        (state.critic.target_params, ref.critic.target_params),
        (state.actor.target_params, ref.actor.target_params),
    ]:
        assert not np.allclose(jax.tree.leaves(before)[-1], jax.tree.leaves(after)[-1])
    assert np.isfinite(ref_metrics[0]["actor_loss"]) and np.isnan(ref_metrics[1]["actor_loss"])
    assert int(got.updates) == 2


@pytest.mark.parametrize("n", [2, 4])
def test_train_from_buffer_dp_equals_single_device(filled, n):
    td3, state, buffer = filled
    ref, ref_metrics = jax.jit(lambda s, b, k: td3.learn(s, b, k, 4))(
        state, buffer, jax.random.key(5)
    )
    mesh = make_mesh(n, axis_name="DP")
    sharded = jax.shard_map(
        lambda s, b, k: td3.learn(s, b, k, 4, "DP"),
        mesh=mesh,
        in_specs=(P(), P(), P()),
        out_specs=P(),
    )
    got, metrics = jax.jit(sharded)(state, buffer, jax.random.key(5))
    _leaves_close(got, ref)
    _leaves_close(metrics, ref_metrics)
    assert not np.allclose(
        jax.tree.leaves(ref.critic.params)[0], jax.tree.leaves(state.critic.params)[0]
    )


def test_critic_loss_matches_hand_computed_target(filled):
    """Clipped double-Q target with smoothing noise drawn per global sample index."""
    td3, state, _ = filled
    batch = _random_batch(td3.spec, 8, jax.random.key(11))
    key = jax.random.key(4)
    index = jnp.arange(8)
    loss = td3.critic_loss(
        state.critic.params,
        state.critic.target_params,
        state.actor.target_params,
        batch,
        key,
        index,
    )
    cfg = td3.config
    rows = []
    for i in range(8):
        noise = jax.random.normal(jax.random.fold_in(key, i), (1,))
        noise = jnp.clip(cfg.policy_noise * noise, -cfg.noise_clip, cfg.noise_clip) * 2.0
        a = jnp.clip(td3.policy(state.actor.target_params, batch.next_obs[i]) + noise, -2, 2)
        q_next = [
            td3.critic.apply(
                jax.tree.map(lambda p, j=j: p[j], state.critic.target_params),
                batch.next_obs[i],
                a,
            )
            for j in range(2)
        ]
        y = batch.reward[i] + cfg.discount * (1 - batch.terminal[i]) * min(q_next)
        q = [
            td3.critic.apply(
                jax.tree.map(lambda p, j=j: p[j], state.critic.params),
                batch.obs[i],
                batch.action[i],
            )
            for j in range(2)
        ]
        rows.append((q[0] - y) ** 2 + (q[1] - y) ** 2)
    np.testing.assert_allclose(loss, np.mean(rows), rtol=1e-5)


def test_discrete_env_rejected_with_hint():
    spec = make_env("CartPole-v1").spec
    with pytest.raises(ValueError, match=r"TD3 needs continuous actions.*'Pendulum-v1'"):
        TD3(spec, TINY)


def test_config_checks():
    with pytest.raises(ValueError, match="batch_size"):
        TD3Config(batch_size=0).validate()
    with pytest.raises(ValueError, match="tau"):
        TD3Config(tau=0.0).validate()


# --- replay buffer ---------------------------------------------------------------


def _items(values):
    values = jnp.asarray(values, jnp.float32)
    return {"x": values, "y": jnp.stack([values, -values], -1)}


def test_buffer_add_masked_in_order_and_wraps():
    buf = ReplayBuffer.create({"x": jnp.float32(0), "y": jnp.zeros(2)}, 5)
    buf = buf.add(
        _items([[1, 2, 3], [4, 5, 6]]), jnp.array([[True, False, True], [True, True, False]])
    )
    np.testing.assert_array_equal(buf.data["x"], [1, 3, 4, 5, 0])
    np.testing.assert_array_equal(buf.data["y"][:, 1], [-1, -3, -4, -5, 0])
    assert (int(buf.size), int(buf.position)) == (4, 4)
    buf = buf.add(_items([7, 8, 9]))
    np.testing.assert_array_equal(buf.data["x"], [8, 9, 4, 5, 7])
    assert (int(buf.size), int(buf.position)) == (5, 2)


def test_buffer_add_more_than_capacity_keeps_the_newest():
    buf = ReplayBuffer.create({"x": jnp.float32(0), "y": jnp.zeros(2)}, 4)
    buf = buf.add(_items([1, 2]))
    buf = jax.jit(ReplayBuffer.add)(buf, _items(np.arange(10, 17)), jnp.arange(7) != 3)
    # valid items 10 11 12 14 15 16 written in turn from slot 2: 12 lands in
    # slot 0, and the last four survive as if written one by one
    np.testing.assert_array_equal(buf.data["x"], [12, 14, 15, 16])
    assert (int(buf.size), int(buf.position)) == (4, 0)


@pytest.mark.parametrize("n", [2, 4])
def test_sample_slices_the_global_batch(n):
    buf = ReplayBuffer.create({"x": jnp.float32(0), "y": jnp.zeros(2)}, 64)
    buf = buf.add(_items(np.arange(50)))
    ref, ref_index = sample(buf, jax.random.key(3), 16)
    got, index = jax.shard_map(
        lambda b, k: sample(b, k, 16, "DP"),
        mesh=make_mesh(n, axis_name="DP"),
        in_specs=(P(), P()),
        out_specs=P("DP"),
    )(buf, jax.random.key(3))
    _leaves_close(got, ref, rtol=0, atol=0)
    np.testing.assert_array_equal(index, ref_index)  # positions in the global batch
    np.testing.assert_array_equal(ref_index, np.arange(16))
    assert np.all(np.asarray(ref["x"]) < 50)
    assert len(np.unique(np.asarray(ref["x"]))) > 8


# --- rollouts ----------------------------------------------------------------------


class _Countdown:
    """Reward = action; terminates after 3 steps; time limit 10."""

    spec = EnvSpec("Countdown", (1,), False, 1, (-1.0,), (1.0,), 10)

    def reset(self, key):
        return jnp.zeros(1), jnp.int32(0)

    def step(self, key, t, action):
        t = t + 1
        return jnp.full(1, t, jnp.float32), t, jnp.sum(action), t >= 3


def test_collect_episode_masks_after_termination():
    env = _Countdown()
    ep = collect_episode(env, lambda p, o: jnp.full(1, p), 0.5, jax.random.key(0), 0.0, 6)
    np.testing.assert_array_equal(ep.valid, [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(ep.transitions.terminal[:3], [0, 0, 1])
    np.testing.assert_array_equal(ep.transitions.next_obs[:3, 0], [1, 2, 3])
    assert float(ep.episode_return) == 1.5 and int(ep.steps) == 3
    buf = ReplayBuffer.create(example_transition(env.spec), 8).add(ep.transitions, ep.valid)
    assert int(buf.size) == 3


def test_time_limit_is_not_terminal(pendulum):
    td3 = TD3(pendulum.spec, TINY)
    params = td3.policy.init(jax.random.key(1))
    ep = jax.jit(lambda p, k: collect_episode(pendulum, td3.policy, p, k))(
        params, jax.random.key(2)
    )
    assert bool(ep.valid.all()) and float(ep.transitions.terminal.sum()) == 0.0
    ref = jax.jit(lambda p, k: rollout(pendulum, td3.policy, p, k))(params, jax.random.key(2))
    np.testing.assert_allclose(ep.episode_return, ref.episode_return, rtol=1e-5)
    # consecutive transitions chain
    np.testing.assert_allclose(ep.transitions.obs[1:], ep.transitions.next_obs[:-1])


def _collecting_engine(pop, n, episode_length):
    """The engine evaluating a population of TINY actors, collecting their transitions."""
    task = ControlTask(
        "Pendulum-v1",
        TINY.actor_hidden_sizes,
        TINY.actor_activation,
        episode_length=episode_length,
        transitions=True,
    )
    strategy = CEM(pop, jnp.zeros(task.num_dims), 2, Config())
    return task, Engine(strategy, task, make_mesh(n))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_collecting_evaluation_global_statistics(n):
    pop = 5  # padded to 6 or 8 on 2 or 4 devices
    task, engine = _collecting_engine(pop, n, 12)
    flat = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(0), pop))
    summary, episodes = jax.jit(lambda x, k: engine.evaluate(x, k, (), collect=True))(
        flat, jax.random.key(9)
    )
    ref = jax.jit(
        jax.vmap(
            lambda x, i: collect_episode(
                task.env,
                task.policy,
                task.unravel(x),
                jax.random.split(jax.random.fold_in(jax.random.key(9), i))[0],
                0.0,
                12,
            )
        )
    )(flat, jnp.arange(pop))
    r = np.asarray(ref.episode_return)
    np.testing.assert_allclose(summary.scores[:pop], r, rtol=1e-5)
    m = summary.metrics()
    np.testing.assert_allclose(m["fitness_best"], r.max(), rtol=1e-5)
    np.testing.assert_allclose(m["fitness_worst"], r.min(), rtol=1e-5)
    np.testing.assert_allclose(m["fitness_mean"], r.mean(), rtol=1e-5)
    np.testing.assert_allclose(m["fitness_std"], r.std(), rtol=1e-4)
    assert int(m["env_steps"]) == pop * 12 and int(m["episodes"]) == pop
    assert int(episodes.valid.sum()) == pop * 12  # padded members insert nothing
    actions = episodes.transitions.action[:pop, 0]  # each member's one episode
    np.testing.assert_allclose(actions, ref.transitions.action, rtol=1e-5)


def test_collecting_evaluation_nan_is_worst_and_counted():
    task, engine = _collecting_engine(4, 2, 8)
    flat = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(0), 4))
    flat = flat.at[2].set(jnp.nan)
    summary, _ = jax.jit(lambda x, k: engine.evaluate(x, k, (), collect=True))(
        flat, jax.random.key(1)
    )
    assert int(summary.num_nonfinite) == 1
    fitness = np.asarray(summary.fitness(4))
    assert fitness[2] == fitness.max() and np.isfinite(fitness).all()  # worst, not NaN
