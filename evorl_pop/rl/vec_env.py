"""A batch of environments stepped together, each restarting when its episode ends.

The environments of :mod:`evorl_pop.tasks.envs` do not reset themselves (a
rollout runs one episode per lane). On-policy and off-policy learners step a
fixed batch of environments for a few steps at a time instead, and each
environment starts a new episode as soon as its last one ended::

    batch (obs, states, clocks, returns, pending starts)
      ─► refresh(keys): a fresh start for every lane, once per unroll
      ─► step(actions, keys) x unroll_length
           ─► env.step on every lane ─► reward, terminal, truncated, next_obs
           ─► lanes that ended: their pending start ─► batch for the next step

A reset is drawn once per lane and unroll rather than at every step: computing
(and selecting) a reset at every step is a large share of a PPO unroll on brax
hopper. A lane whose episodes end twice in one unroll starts both of the new
ones from the same state.

Every lane's randomness comes from its key, and the learners derive lane
``i``'s key from ``fold_in(key, i)`` with ``i`` its *global* index
(:func:`~evorl_pop.tasks.rollout.lane_keys`), so a batch split over the devices of a
``DP`` axis steps exactly as the whole batch on one device.

An episode that reaches the time limit (``spec.max_steps``) is *truncated*,
not terminal: the value of its last state is not zero, and learners treat the
two ends differently. ``next_obs`` is the observation before any reset, the
one a replay buffer needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop import distributed as dist
from evorl_pop import registry
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import summarize
from evorl_pop.core.interfaces import Env
from evorl_pop.tasks import envs
from evorl_pop.tasks.rollout import StepResult, lane_keys


@flax.struct.dataclass
class EnvBatch:
    """A batch of running episodes; every leaf leads with the batch axis."""

    obs: jax.Array  # shape=(num_envs, *obs_shape): what the policy sees next
    state: Any  # the environments' states
    steps: jax.Array  # int32, shape=(num_envs,): steps into the current episode
    episode_return: jax.Array  # float32: the current episode's return so far
    last_return: jax.Array  # float32: the return of the last episode that ended (NaN: none yet)
    episodes: jax.Array  # int32: episodes ended so far
    start_obs: jax.Array  # the first observation of the lane's next episode
    start_state: Any  # and its state


def make_env(task: str, episode_length: int | None = None, backend: str | None = None) -> Env:
    """The learners' environment: :func:`evorl_pop.tasks.envs.make_env` with the settings
    they expose.

    Args:
      task: an environment name.
      episode_length: steps before an episode is truncated (``None``: the task's).
      backend: brax's physics backend (``None``: the default); the tasks of a family
        with a ``backend`` setting only.

    Raises:
      ConfigError: a backend for a task whose family has none.
    """
    kwargs = {"episode_length": episode_length}
    if backend is not None:
        family = envs.env_family(task)
        if family is None or "backend" not in family.settings:
            families = registry.ENV_FAMILIES.items()
            owners = " or ".join(name for name, f in families if "backend" in f.settings)
            raise ConfigError(
                f"backend is a {owners} setting, but {task!r} is not a {owners} task: "
                "leave it null."
            )
        kwargs["backend"] = backend
    return envs.make_env(task, **kwargs)


class JaxEnvs:
    """The lanes of an environment stepped in JAX, with the interface the learners use
    (:class:`~evorl_pop.tasks.host_lanes.HostEnvs` has the same, on the host).

    Args:
      env: the environment.
    """

    def __init__(self, env: Env):
        self.env = env
        self.spec = env.spec

    def reset_batch(self, keys: jax.Array) -> EnvBatch:
        """:func:`reset`."""
        return reset(self.env, keys)

    def unroll(self, batch: EnvBatch, act: Callable, key: jax.Array, length: int, index):
        """:func:`unroll`."""
        return unroll(self.env, batch, act, key, length, index)


def make_envs(task: str, episode_length: int | None = None, backend: str | None = None):
    """The learners' lanes of ``task``: :class:`JaxEnvs` of :func:`make_env`, or, for a
    task whose family steps on the host (Gymnasium's),
    :class:`~evorl_pop.tasks.host_lanes.HostEnvs`. Its ``env`` is the learners'
    environment (its ``spec``, the policy :class:`~evorl_pop.core.interfaces.Acting` runs).

    Args:
      task: an environment name.
      episode_length: steps before an episode is truncated (``None``: the task's).
      backend: brax's physics backend (``None``: the default).

    Raises:
      ConfigError: a backend for a task whose family has none.
    """
    if envs.steps_on_host(task):
        from evorl_pop.tasks.host_lanes import HostEnvs  # imports Gymnasium's helpers

        return HostEnvs(task, episode_length, backend)
    return JaxEnvs(make_env(task, episode_length, backend))


def check_task(task: str, who: str) -> None:
    """ConfigError unless a learner's lanes can step ``task``: an environment stepped in
    JAX or on the host (:func:`make_envs`), not a black-box function or an unknown name.

    Args:
      task: the config's task.
      who: the learner, for the message (``'ppo'``).
    """
    if not envs.steps_on_host(task):  # a host family without learner lanes: refused
        envs.check_environment(task, who)


#: The least value of each of a learner's environment settings (``LearnerConfig``'s).
LEAST = {"num_envs": 1, "unroll_length": 1, "episode_length": 1}


def _starts(env: Env, keys: jax.Array):
    obs, state = jax.vmap(env.reset)(keys)
    # A Python number in a state (gymnax's time=0) comes out weakly typed; step's
    # outputs are not, and a state that changes type would compile a chunk again.
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), (obs, state))


def reset(env: Env, keys: jax.Array) -> EnvBatch:
    """A batch of fresh episodes (each lane's pending start: the same state until a refresh).

    Args:
      env: an environment.
      keys: one key per lane (:func:`~evorl_pop.tasks.rollout.lane_keys`).

    Returns:
      An :class:`EnvBatch` at the start of its episodes.
    """
    obs, state = _starts(env, keys)
    zero = jnp.zeros(keys.shape, jnp.float32)
    steps = zero.astype(jnp.int32)
    return EnvBatch(obs, state, steps, zero, jnp.full_like(zero, jnp.nan), steps, obs, state)


def refresh(env: Env, batch: EnvBatch, keys: jax.Array) -> EnvBatch:
    """New pending starts: one fresh reset per lane, for the episodes that begin next.

    Args:
      env: the environment.
      batch: the running episodes.
      keys: one key per lane (:func:`~evorl_pop.tasks.rollout.lane_keys`).

    Returns:
      The batch with new ``start_obs`` and ``start_state``.
    """
    obs, state = _starts(env, keys)
    return batch.replace(start_obs=obs, start_state=state)


def step(
    env: Env, batch: EnvBatch, action: jax.Array, keys: jax.Array
) -> tuple[EnvBatch, StepResult]:
    """Steps every lane; lanes whose episode ended start their pending one.

    Args:
      env: the environment.
      batch: the running episodes.
      action: one action per lane.
      keys: one key per lane, for the environments' steps.

    Returns:
      ``(batch, result)``: the batch after the step (restarted where an
        episode ended) and the step's :class:`~evorl_pop.tasks.rollout.StepResult`.
    """
    next_obs, state, reward, done = jax.vmap(env.step)(keys, batch.state, action)
    steps = batch.steps + 1
    truncated = done & (steps >= env.spec.max_steps)
    terminal = done & ~truncated
    episode_return = batch.episode_return + reward

    def restart(fresh, old):
        return jnp.where(done.reshape(done.shape + (1,) * (old.ndim - 1)), fresh, old)

    new = batch.replace(
        obs=restart(batch.start_obs, next_obs),
        state=jax.tree.map(restart, batch.start_state, state),
        steps=jnp.where(done, 0, steps),
        episode_return=jnp.where(done, 0.0, episode_return),
        last_return=jnp.where(done, episode_return, batch.last_return),
        episodes=batch.episodes + done,
    )
    result = StepResult(
        next_obs=next_obs,
        reward=reward,
        terminal=terminal.astype(jnp.float32),
        truncated=truncated.astype(jnp.float32),
    )
    return new, result


def unroll(
    env: Env,
    batch: EnvBatch,
    act: Callable[[jax.Array, jax.Array], tuple[jax.Array, Any]],
    key: jax.Array,
    length: int,
    index: jax.Array,
) -> tuple[EnvBatch, tuple[jax.Array, Any, StepResult]]:
    """``length`` steps of every lane under a policy, after a :func:`refresh`.

    Args:
      env: the environment.
      batch: the running episodes (this device's lanes).
      act: ``act(obs, keys) -> (action, extra)``: one action per lane, each
        from its own key, and whatever the learner records besides.
      key: the unroll's key, the same on every device.
      length: steps per lane (static).
      index: the lanes' global indices: lane ``i`` draws from ``fold_in(., i)``.

    Returns:
      ``(batch, (obs, extra, result))``: the lanes after the unroll, and the
        observations acted on, ``act``'s extras and the
        :class:`~evorl_pop.tasks.rollout.StepResult`, leaves ``(length, lanes, ...)``.
    """
    refresh_key, key = jax.random.split(key)
    batch = refresh(env, batch, lane_keys(refresh_key, index))

    def one_step(batch, t):
        keys = lane_keys(jax.random.fold_in(key, t), index)
        act_keys, env_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        action, extra = act(batch.obs, act_keys)
        new, result = step(env, batch, action, env_keys)
        return new, (batch.obs, extra, result)

    return jax.lax.scan(one_step, batch, jnp.arange(length))


def metrics(before: EnvBatch, after: EnvBatch, axis_name: str | None = None) -> dict:
    """The returns of a batch split over ``axis_name``, as every algorithm reports them.

    Args:
      before: this device's lanes before the steps.
      after: the same lanes after them.
      axis_name: the axis the lanes are split over, or ``None``.

    Returns:
      ``fitness_best``, ``fitness_mean``, ``fitness_worst``, ``fitness_std`` over
        the returns of the lanes' last finished episodes (NaN while no lane has
        finished one; lanes that have not are left out), and ``episodes``: the
        episodes that ended in between, all global.
    """
    score = after.last_return
    summary = summarize(score, None, jnp.ones(score.shape, bool), True, axis_name)
    episodes = dist.psum(jnp.sum(after.episodes - before.episodes), axis_name)
    none = jnp.isnan(summary.mean)  # extremes of no finite return would read +-inf
    return {
        "fitness_best": jnp.where(none, jnp.nan, summary.best),
        "fitness_mean": summary.mean,
        "fitness_worst": jnp.where(none, jnp.nan, summary.worst),
        "fitness_std": summary.std,
        "episodes": episodes.astype(jnp.int32),
    }
