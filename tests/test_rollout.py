"""The one rollout: against a plain gymnax loop, early exit, episode length, counters."""

import _loop
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import make_strategy
from evorl_pop.base import EnvSpec, EvalInfo
from evorl_pop.core.engine import Engine
from evorl_pop.run.shell import train_loop
from evorl_pop.tasks import ControlTask
from evorl_pop.tasks.obs_norm import ObsNorm
from evorl_pop.tasks.rollout import evaluate_episodes, rollout, rollout_queue


def collect_episode(env, policy, params, key, noise_std=0.0, episode_length=None):
    """One episode with its transitions and exploration noise."""
    return rollout(env, policy, params, key, None, episode_length, noise_std, collect=True)


def plain_gymnax_returns(task, solutions, key, num_steps):
    """Full-length scan of ``step_env`` with a done-mask, the task's key schedule."""
    gymnax_env, env_params = task.env.env, task.env.params

    def one(x, k):
        params = task.unravel(x)
        k = jax.random.split(k, 1)[0]  # evaluate_episodes: one episode
        k, k_reset = jax.random.split(k)
        obs, state = gymnax_env.reset_env(k_reset, env_params)

        def body(carry, k_step):
            obs, state, ret, alive = carry
            obs, state, r, done, _ = gymnax_env.step_env(
                k_step, state, task.policy(params, obs), env_params
            )
            return (obs, state, ret + alive * r, alive * (1.0 - done)), alive

        init = (obs, state, 0.0, 1.0)
        (_, _, ret, _), alive = jax.lax.scan(body, init, jax.random.split(k, num_steps))
        return ret, alive.sum().astype(jnp.int32)

    return jax.jit(jax.vmap(one))(solutions, jax.random.split(key, len(solutions)))


@pytest.mark.parametrize("env, num_steps", [("CartPole-v1", None), ("Pendulum-v1", 30)])
def test_rollout_equals_plain_gymnax_loop(env, num_steps):
    task = ControlTask(env, hidden_sizes=(8,), episode_length=num_steps)
    solutions = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(0), 6))
    key = jax.random.key(1)
    scores, info = jax.jit(jax.vmap(lambda x, k: task.evaluate(x, k, ())))(
        solutions, jax.random.split(key, 6)
    )
    ref_returns, ref_steps = plain_gymnax_returns(
        task, solutions, key, num_steps or task.spec.max_steps
    )
    np.testing.assert_allclose(scores, ref_returns, rtol=1e-5)
    np.testing.assert_array_equal(info.steps, ref_steps)
    if num_steps is not None:  # Pendulum never ends early: truncated at num_steps
        np.testing.assert_array_equal(info.steps, num_steps)
    else:  # random CartPole policies fall early
        assert int(np.max(ref_steps)) < task.spec.max_steps


class _Fall:
    """Reward 1 per step; falls after ``action`` steps; NaN reward and obs once fallen."""

    spec = EnvSpec("Fall", (1,), False, 1, (0.0,), (1000.0,), 1000)

    def __init__(self):
        self.steps_run = 0

    def _count(self, t):
        self.steps_run += 1

    def reset(self, key):
        return jnp.zeros(1), jnp.int32(0)

    def step(self, key, t, action):
        jax.debug.callback(self._count, t)  # one call per episode and step actually run
        t = t + 1
        fallen = t > jnp.sum(action)
        reward = jnp.where(fallen, jnp.nan, 1.0)
        obs = jnp.where(fallen, jnp.nan, jnp.full(1, t, jnp.float32))
        return obs, t, reward, t >= jnp.sum(action)


def test_early_exit_stops_when_every_episode_has_ended():
    env = _Fall()
    lengths = jnp.array([3.0, 60.0])
    out = jax.jit(
        jax.vmap(lambda n, k: rollout(env, lambda p, o: jnp.full(1, p), n, k, check_every=25))
    )(lengths, jax.random.split(jax.random.key(0), 2))
    jax.effects_barrier()
    np.testing.assert_array_equal(out.episode_return, [3.0, 60.0])  # no NaN after the fall
    np.testing.assert_array_equal(out.steps, [3, 60])
    # the batch stops after the chunk in which its last episode ended: 3 chunks
    # of 25 steps for each of the 2 episodes, not 1,000 steps
    assert env.steps_run == 2 * 3 * 25


def _queue_steps(lengths, lanes, chunk):
    """Steps a queue of ``lanes`` lanes computes: a lane takes the next episode
    at the first multiple of ``chunk`` steps after its episode has ended; once
    no episode is pending, the running ones move to ``lanes // 4`` lanes, then
    to one, as soon as they fit."""
    widths = sorted({lanes, max(1, lanes // 4), 1}, reverse=True)
    pending = list(lengths[lanes:])
    running = list(lengths[:lanes])
    computed = 0
    for width, below in zip(widths, [*widths[1:], 0], strict=True):
        running = [r for r in running if r is not None]
        running += [None] * (width - len(running))
        while any(running) and (pending or sum(r is not None for r in running) > below):
            computed += width * chunk
            left = [None if r is None else r - chunk for r in running]
            running = [r if r is None or r > 0 else None for r in left]
            running = [pending.pop(0) if r is None and pending else r for r in running]
    return computed


@pytest.mark.parametrize("lanes", [3, 9])
def test_queued_rollout_equals_per_episode_rollouts_and_costs_the_steps_taken(lanes):
    env = _Fall()
    lengths = [3, 60, 7, 12, 1, 30, 45, 2, 9]  # 60: cut at 50 steps
    keys = jax.random.split(jax.random.key(0), len(lengths))
    policy = lambda p, o: jnp.full(1, p)  # noqa: E731
    ref = jax.jit(jax.vmap(lambda n, k: rollout(env, policy, n, k, episode_length=50)))(
        jnp.array(lengths, jnp.float32), keys
    )
    jax.effects_barrier()
    env.steps_run = 0
    out = jax.jit(lambda n, k: rollout_queue(env, policy, n, k, episode_length=50, lanes=lanes))(
        jnp.array(lengths, jnp.float32), keys
    )
    jax.effects_barrier()
    np.testing.assert_array_equal(out.episode_return, ref.episode_return)
    np.testing.assert_array_equal(out.steps, ref.steps)
    np.testing.assert_array_equal(out.steps, np.minimum(lengths, 50))
    if lanes < len(lengths):  # lanes refilled every 4 steps: about the steps taken
        assert env.steps_run == _queue_steps(np.minimum(lengths, 50), lanes, 4)
        assert env.steps_run < 1.5 * np.minimum(lengths, 50).sum()
    else:  # one lane per episode: the longest episode's chunks, for every lane
        assert env.steps_run == lanes * 50


def test_queue_shared_by_a_population_keeps_each_candidates_episodes():
    env = _Fall()
    policy = lambda p, o: jnp.full(1, p)  # noqa: E731
    lengths = jnp.array([3.0, 60.0, 7.0, 12.0, 1.0])
    keys = jax.random.split(jax.random.key(1), 5)

    def evaluate(lanes):  # under vmap, as the engine evaluates a slice: 2 episodes each
        norm = ObsNorm.create((1,))
        one = lambda n, k: evaluate_episodes(env, policy, n, k, 2, norm, 40, lanes)  # noqa: E731
        return jax.jit(jax.vmap(one))(lengths, keys)

    one_each, queued = evaluate(10), evaluate(3)
    for a, b in zip(jax.tree.leaves(one_each), jax.tree.leaves(queued), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(queued.steps, 2 * np.minimum(lengths, 40))
    np.testing.assert_array_equal(queued.moments.count, queued.steps)
    # the observations 0, 1, ..., length - 1 of each of the two episodes
    n = np.minimum(lengths, 40)
    np.testing.assert_array_equal(queued.moments.total[:, 0], n * (n - 1))


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_a_slice_evaluated_as_a_batch_is_the_vectorised_evaluation(normalize_obs):
    # What the engine runs on a device's slice (its episodes traced once) against
    # jax.vmap of one candidate's evaluation, on episodes ending early in a queue.
    task = ControlTask("CartPole-v1", (4,), episodes=3, normalize_obs=normalize_obs, lanes=4)
    solutions = 0.5 * jax.random.normal(jax.random.key(0), (5, task.num_dims))
    keys = jax.random.split(jax.random.key(1), 5)
    state = task.init_state()
    if normalize_obs:  # a normaliser that has seen something
        state = state.replace(count=jnp.float32(9.0), mean=jnp.full(4, 0.1), var=jnp.ones(4))
    batch = jax.jit(task.evaluate_batch)(solutions, keys, state)
    vectorised = jax.jit(jax.vmap(task.evaluate, (0, 0, None)))(solutions, keys, state)
    assert len(set(np.asarray(batch[1].steps).tolist())) > 1  # the episodes differ
    for a, b in zip(jax.tree.leaves(batch), jax.tree.leaves(vectorised), strict=True):
        np.testing.assert_array_equal(a, b)


def test_collected_transitions_with_early_exit_and_truncation():
    env = _Fall()
    ep = jax.jit(
        lambda k: collect_episode(env, lambda p, o: jnp.full(1, p), 40.0, k, 0.0, episode_length=60)
    )(jax.random.key(0))
    jax.effects_barrier()
    assert ep.valid.shape == (60,) and ep.transitions.obs.shape == (60, 1)
    np.testing.assert_array_equal(ep.valid, np.arange(60) < 40)
    np.testing.assert_array_equal(ep.transitions.next_obs[:40, 0], np.arange(1, 41))
    np.testing.assert_array_equal(ep.transitions.terminal[:40], np.arange(40) == 39)
    assert float(ep.episode_return) == 40.0 and int(ep.steps) == 40
    assert env.steps_run == 40  # chunks of 20 steps (60 split evenly): stops after two
    # an episode the length limit cuts short is not terminal (its value is bootstrapped)
    cut = collect_episode(env, lambda p, o: jnp.full(1, p), 500.0, jax.random.key(0), 0.0, 30)
    assert bool(cut.valid.all()) and float(cut.transitions.terminal.sum()) == 0.0
    assert int(cut.steps) == 30


def test_episode_length_is_honoured_by_the_engine_on_any_device_count():
    task = ControlTask("Pendulum-v1", hidden_sizes=(4,), episode_length=17)
    strategy, params = make_strategy("Open_ES", 6, task.num_dims)
    metrics = {}
    for n in (1, 4):  # 6 members on 4 devices: padded to 8
        engine = Engine(strategy, task, make_mesh(n), params)
        state = engine.init(jax.random.key(0))
        _, metrics[n] = _loop.run(engine, state, jax.random.key(1), 2)
    np.testing.assert_array_equal(metrics[1]["env_steps"], [6 * 17, 6 * 17])
    for k in ("env_steps", "fitness_mean", "fitness_best"):
        np.testing.assert_allclose(metrics[4][k], metrics[1][k], rtol=1e-5)


@pytest.mark.slow
def test_queued_slices_give_the_per_episode_results_on_any_device_count():
    # CartPole episodes of random policies end early, at different steps
    strategy, params = make_strategy("Open_ES", 8, ControlTask("CartPole-v1", (4,)).num_dims)
    metrics = {}
    for n in (1, 2):
        for lanes in (2, 8):  # 2: a queue on each device; 8: one lane per episode
            task = ControlTask("CartPole-v1", (4,), episodes=2, normalize_obs=True, lanes=lanes)
            engine = Engine(strategy, task, make_mesh(n), params)
            state = engine.init(jax.random.key(0))
            state, m = _loop.run(engine, state, jax.random.key(1), 2)
            metrics[n, lanes] = {**m, "obs_mean": state.task_state.mean}
    assert np.all(metrics[1, 2]["env_steps"] < 8 * 2 * 500)
    for k in ("env_steps", "episodes", "fitness_mean", "fitness_best", "obs_mean"):
        for n in (1, 2):  # the queue changes nothing (but the rounding of a sum
            # of squares, which XLA may fuse into multiply-adds at one width only)
            np.testing.assert_allclose(metrics[n, 2][k], metrics[n, 8][k], rtol=1e-6)
        np.testing.assert_allclose(metrics[2, 2][k], metrics[1, 2][k], rtol=1e-5)
    for k in ("env_steps", "episodes"):
        np.testing.assert_array_equal(metrics[2, 2][k], metrics[1, 8][k])


class _BigCount:
    """A task whose every evaluation reports 2**22 environment steps."""

    maximize = True
    name = "big-count"
    num_dims = 2

    def init_solution(self, key):
        return jnp.zeros(2)

    def init_state(self):
        return ()

    def evaluate(self, solution, key, task_state):
        return -jnp.sum(solution**2), EvalInfo(jnp.int32(2**22), jnp.int32(1))

    def update_state(self, task_state, info_total):
        return task_state


def test_cumulative_env_steps_are_exact_past_2_to_the_31():
    strategy, params = make_strategy("Open_ES", 256, 2)
    engine = Engine(strategy, _BigCount(), make_mesh(2), params)
    totals = []

    def accumulate(state, metrics):  # as the run loop does: Python ints on the host
        for steps in metrics["env_steps"]:
            totals.append((totals[-1] if totals else 0) + int(steps))

    state = engine.init(jax.random.key(0))
    train_loop(engine, state, jax.random.key(1), 5, chunk=2, callback=accumulate, progress=False)
    assert totals == [k * 2**30 for k in range(1, 6)]  # 5 * 2**30 > 2**32
