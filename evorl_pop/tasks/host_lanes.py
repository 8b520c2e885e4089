"""The learners' batch of environments stepped on the host: Gymnasium's (``gym:ID``).

PPO and SAC step a fixed batch of environments a few steps at a time
(:mod:`evorl_pop.rl.vec_env`). On a task whose family steps on the host
(``family.steps_in_jax`` is ``False``), each lane is one Gymnasium
environment kept by the host, reached from inside the compiled learner
through host callbacks::

    HostBatch on the device: obs, steps, returns, and each lane's episode seed
    and actions so far (what the host's environment went through)
      ─► sync (once per unroll): the host checks that each lane's environment is
         where the device says; where not (a resumed run, a fresh process),
         it is rebuilt: reset(seed), then the episode's actions replayed
      ─► step(actions) x unroll_length: env.step on every lane; a lane whose
         episode ended resets with its pending seed, as vec_env's lanes restart

Lane ``i`` resets with the seed :func:`~evorl_pop.tasks.gym_make.start_seed`
of its key ``fold_in(key, i)``, ``i`` its *global* index, and each device's
callbacks step only its own lanes: a batch split over the devices of a ``DP``
axis steps as the whole batch on one device. The host keeps a lane's
environment under a stream number drawn from the lane's first key and its
replica's index (:func:`~evorl_pop.core.interfaces.replica_index`), so that the
batches of several seeds or settings in one program (a ``vmap``, whose callbacks
run one batch after the other) each step environments of their own.

Exact resume: a checkpoint cannot hold a Gymnasium environment, so the
device state holds what rebuilds it, each lane's seed and its episode's
actions so far (``episode_length x action size`` numbers per lane). A run
resumed from a checkpoint replays them before its first step and continues
exactly as the uninterrupted run does, with no episode cut at a chunk's
boundary; an environment that is not deterministic given its seed and its
actions would break this, as it breaks any replay. The calls carry data from
one to the next, which orders them without ``ordered=True`` (which neither
``shard_map`` over several devices nor ``vmap`` allows).

:func:`collect_episodes` runs a Gymnasium task's collecting evaluation on the
same lanes (CEM-RL's and ERL's population, whose transitions feed its learner,
and ERL's exploration episodes): fresh episodes, each to its end, on lanes
leased for the call and given back after.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from evorl_pop.base import ConfigError
from evorl_pop.core.interfaces import replica_index
from evorl_pop.tasks import gym_make
from evorl_pop.tasks.rollout import StepResult, lane_keys


@flax.struct.dataclass
class HostBatch:
    """A batch of running host episodes, as the device sees them (leaves lead with lanes).

    The fields :func:`~evorl_pop.rl.vec_env.metrics` reads are
    :class:`~evorl_pop.rl.vec_env.EnvBatch`'s.
    """

    obs: jax.Array  # shape=(num_envs, *obs_shape): what the policy sees next
    steps: jax.Array  # int32: steps into the current episode
    episode_return: jax.Array  # float32: the current episode's return so far
    last_return: jax.Array  # float32: the return of the last episode that ended (NaN: none)
    episodes: jax.Array  # int32: episodes ended so far
    seed: jax.Array  # uint32: the current episode's reset seed
    start_seed: jax.Array  # uint32: the reset seed of the lane's next episode
    total: jax.Array  # int32: steps the lane has taken since the run began
    actions: jax.Array  # (num_envs, max_steps, action size): the episode's actions so far
    stream: jax.Array  # uint32: which host environment is the lane's (its key, its replica)


def _lane_ids(stream, index) -> list[tuple[int, int]]:
    """The host's names of a batch's lanes: ``(stream, global index)``."""
    return list(zip(np.asarray(stream).tolist(), np.asarray(index).tolist(), strict=True))


@dataclasses.dataclass
class _Lane:
    """One lane's environment and where it is."""

    env: Any
    obs: np.ndarray
    seed: int = -1
    steps: int = 0
    total: int = -1
    start: int = 0


class HostEnvs:
    """The environments of a ``gym:`` task, stepped on the host, one per lane.

    Also the learners' environment object: it has the task's ``spec`` (its
    ``reset`` and ``step`` say that it steps on the host).

    Args:
      task: a ``gym:`` task name.
      episode_length: the time limit (``None``: the environment's own).
      backend: must be ``None`` (a brax setting).
      factory: the environments' factory (``None``: the registered id's).

    Raises:
      ConfigError: a backend, an unknown id, a missing simulator.
    """

    def __init__(
        self,
        task: str,
        episode_length: int | None = None,
        backend: str | None = None,
        factory: Callable | None = None,
    ):
        if backend is not None:
            raise ConfigError(
                f"backend is a brax setting, and {task!r} is stepped on the host: leave it null."
            )
        env_id = task.removeprefix(gym_make.GYM_PREFIX)
        self.factory = factory or gym_make.registered_factory(env_id, episode_length)
        try:
            self.spec, self.one_hot = gym_make.probe(self.factory, task, episode_length)
        except ValueError as err:
            raise ConfigError(f"task: {err}") from None
        self.task = task
        self.env = self  # the learners' environment: its spec
        self._lanes: dict[tuple[int, int], _Lane] = {}  # (stream, lane) to its environment
        self._free: list = []  # environments of released lanes, for the next ones
        self._leases = 2**31  # collections' streams (the learners' are random, any value)
        self._lock = threading.Lock()  # lanes are made by each device's callbacks
        self._obs_size = int(np.prod(self.spec.obs_shape, dtype=int))
        self._action_size = 1 if self.spec.discrete else self.spec.action_dim
        self._action_dtype = jnp.int32 if self.spec.discrete else jnp.float32

    # --- as an Env: the spec only -------------------------------------------------------

    def reset(self, key: jax.Array):
        raise ValueError(f"{self.task} steps on the host: its lanes are a HostBatch's.")

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        raise ValueError(f"{self.task} steps on the host: its lanes are a HostBatch's.")

    # --- the host's side ----------------------------------------------------------------

    def _made(self) -> Any:
        from evorl_pop.tasks.vector_pool import made_quietly

        return made_quietly(self.factory)

    def _observe(self, env, obs) -> np.ndarray:
        if self.one_hot:
            eye = np.eye(self._obs_size, dtype=np.float32)
            return eye[int(obs) - int(env.observation_space.start)]
        return np.asarray(obs, np.float32).reshape(self.spec.obs_shape)

    def _action(self, env, action: np.ndarray):
        space = env.action_space
        if self.spec.discrete:
            return int(action.reshape(-1)[0]) + int(space.start)
        return action.reshape(space.shape).astype(space.dtype)

    def _lane(self, lane: tuple[int, int]) -> _Lane:
        with self._lock:
            record = self._lanes.get(lane)
        if record is None:
            with self._lock:
                env = self._free.pop() if self._free else None
            env = env or self._made()
            record = _Lane(env, np.zeros(self.spec.obs_shape, np.float32))
            with self._lock:
                self._lanes[lane] = record
        return record

    def _sync(self, index, stream, seed, steps, total, actions, start) -> np.ndarray:
        """Each lane's environment where the device says it is (rebuilt where not);
        records its pending seed; returns the lanes' observations."""
        out = np.zeros((len(index), *self.spec.obs_shape), np.float32)
        for j, lane in enumerate(_lane_ids(stream, index)):
            record = self._lane(lane)
            where = (int(seed[j]), int(steps[j]), int(total[j]))
            if (record.seed, record.steps, record.total) != where:
                obs, _ = record.env.reset(seed=where[0])
                for action in np.asarray(actions[j, : where[1]]):
                    obs = record.env.step(self._action(record.env, action))[0]
                record.obs = self._observe(record.env, obs)
                record.seed, record.steps, record.total = where
            record.start = int(start[j])
            out[j] = record.obs
        return out

    def _step(self, words: np.ndarray) -> np.ndarray:
        """One step of every lane; a lane whose episode ended starts its pending one.

        Args:
          words: uint32 ``(lanes, 2 + action size)``: each lane's global index, its
            stream and its action's raw bits (one argument: each costs a copy).

        Returns:
          float32 ``(lanes, 2 x observation size + 3)``: each lane's observation after
            the step, its observation after any reset, its reward, terminal and
            truncated flags (one result: each costs a conversion).
        """
        words = np.asarray(words)
        actions = np.ascontiguousarray(words[:, 2:]).view(
            np.int32 if self.spec.discrete else np.float32
        )
        size = self._obs_size
        out = np.zeros((len(words), 2 * size + 3), np.float32)
        for j, lane in enumerate(_lane_ids(words[:, 1], words[:, 0])):
            record = self._lanes[lane]
            env = record.env
            obs, reward, term, trunc, _ = env.step(self._action(env, actions[j]))
            record.steps += 1
            record.total += 1
            term = bool(term)
            trunc = (bool(trunc) or record.steps >= self.spec.max_steps) and not term
            out[j, :size] = self._observe(env, obs).reshape(-1)
            if term or trunc:
                obs, _ = env.reset(seed=record.start)
                record.seed = record.start
                record.steps = 0
            record.obs = self._observe(env, obs)
            out[j, size : 2 * size] = record.obs.reshape(-1)
            out[j, 2 * size :] = (reward, term, trunc)
        return out

    def _lease(self, stream: np.ndarray) -> np.ndarray:
        """Fresh stream numbers for the lanes of one collection, never used before."""
        with self._lock:
            first = self._leases
            self._leases += 1
        return np.full(np.shape(stream), first % 2**32, np.uint32)

    def _release(self, words: np.ndarray) -> np.ndarray:
        """Frees lanes (``words``: ``(lanes, 3)``, index, stream, anything) for others."""
        words = np.asarray(words)
        with self._lock:
            for lane in _lane_ids(words[:, 1], words[:, 0]):
                record = self._lanes.pop(lane, None)
                if record is not None:
                    self._free.append(record.env)
        return np.zeros((), np.int32)

    def close(self) -> None:
        """Closes the lanes' environments."""
        with self._lock:
            lanes = list(self._lanes.values())
            self._lanes.clear()
            free = self._free
            self._free = []
        for env in [record.env for record in lanes] + free:
            env.close()

    # --- the device's side: vec_env's interface -------------------------------------------

    def seeds(self, keys: jax.Array) -> jax.Array:
        """Each lane's reset seed from its key (:func:`~evorl_pop.tasks.gym_make.start_seed`)."""
        return jax.vmap(gym_make.start_seed)(keys)

    def reset_batch(self, keys: jax.Array) -> HostBatch:
        """A batch of fresh episodes, one per key; the host resets them at the first unroll.

        Args:
          keys: one key per lane (:func:`~evorl_pop.tasks.rollout.lane_keys`).
        """
        n = keys.shape[0]
        seeds = self.seeds(keys)
        zero = jnp.zeros((n,), jnp.float32)
        steps = jnp.zeros((n,), jnp.int32)
        return HostBatch(
            obs=jnp.zeros((n, *self.spec.obs_shape), jnp.float32),
            steps=steps,
            episode_return=zero,
            last_return=jnp.full_like(zero, jnp.nan),
            episodes=steps,
            seed=seeds,
            start_seed=seeds,
            total=steps,
            actions=jnp.zeros((n, self.spec.max_steps, self._action_size), self._action_dtype),
            stream=jax.vmap(lambda k: jax.random.bits(jax.random.fold_in(k, 1), (), jnp.uint32))(
                keys
            )
            + jnp.uint32(replica_index()),  # a sweep's settings share their keys
        )

    def sync(self, batch: HostBatch, start: jax.Array, index: jax.Array) -> jax.Array:
        """The host's :meth:`_sync` of this device's lanes: their observations."""
        shape = jax.ShapeDtypeStruct(batch.obs.shape, jnp.float32)
        args = (index, batch.stream, batch.seed, batch.steps, batch.total, batch.actions, start)
        return io_callback(self._sync, shape, *args, ordered=False)

    def step_batch(
        self, batch: HostBatch, action: jax.Array, index: jax.Array
    ) -> tuple[HostBatch, StepResult]:
        """Steps every lane on the host; lanes whose episode ended start their pending one.

        Returns:
          ``(batch, result)``, as :func:`~evorl_pop.rl.vec_env.step`.
        """
        n = batch.steps.shape[0]
        size = self._obs_size
        action = action.astype(self._action_dtype)
        bits = jax.lax.bitcast_convert_type(action.reshape(n, -1), jnp.uint32)
        ids = jnp.stack([index.astype(jnp.uint32), batch.stream], axis=1)
        shape = jax.ShapeDtypeStruct((n, 2 * size + 3), jnp.float32)
        out = io_callback(self._step, shape, jnp.concatenate([ids, bits], axis=1))
        next_obs = out[:, :size].reshape(batch.obs.shape)
        obs_after = out[:, size : 2 * size].reshape(batch.obs.shape)
        reward = out[:, 2 * size]
        terminal = out[:, 2 * size + 1]
        truncated = out[:, 2 * size + 2]
        done = (terminal + truncated) > 0
        lanes = jnp.arange(n)
        actions = batch.actions.at[lanes, batch.steps].set(action.reshape(n, -1))
        episode_return = batch.episode_return + reward
        new = batch.replace(
            obs=obs_after,
            steps=jnp.where(done, 0, batch.steps + 1),
            episode_return=jnp.where(done, 0.0, episode_return),
            last_return=jnp.where(done, episode_return, batch.last_return),
            episodes=batch.episodes + done,
            seed=jnp.where(done, batch.start_seed, batch.seed),
            total=batch.total + 1,
            actions=actions,
        )
        return new, StepResult(next_obs, reward, terminal, truncated)

    def unroll(
        self,
        batch: HostBatch,
        act: Callable[[jax.Array, jax.Array], tuple[jax.Array, Any]],
        key: jax.Array,
        length: int,
        index: jax.Array,
    ) -> tuple[HostBatch, tuple[jax.Array, Any, StepResult]]:
        """``length`` steps of every lane under a policy, as
        :func:`~evorl_pop.rl.vec_env.unroll` (the same keys: one pending seed per lane
        and unroll, each step's action keys)."""
        refresh_key, key = jax.random.split(key)
        start = self.seeds(lane_keys(refresh_key, index))
        batch = batch.replace(obs=self.sync(batch, start, index), start_seed=start)

        def one_step(batch, t):
            keys = lane_keys(jax.random.fold_in(key, t), index)
            act_keys = jax.vmap(jax.random.split)(keys)[:, 0]
            action, extra = act(batch.obs, act_keys)
            new, result = self.step_batch(batch, action, index)
            return new, (batch.obs, extra, result)

        return jax.lax.scan(one_step, batch, jnp.arange(length))


def collect_episodes(
    envs: HostEnvs,
    act: Callable,
    key: jax.Array,
    episodes: int,
    obs_norm=None,
    noise_std: float | None = None,
    noise_key: jax.Array | None = None,
    act_key: jax.Array | None = None,
):
    """A policy's episodes on the host with every step's transition (a Gymnasium task's
    collecting evaluation: CEM-RL's population feeding its learner's replay buffer).

    Episode ``j`` resets with :func:`~evorl_pop.tasks.gym_make.episode_seeds`'s seed
    ``j`` (as the task's other evaluations), runs to its end within ``max_steps``
    steps of one scan, and its lanes go back to ``envs`` for the next evaluation.

    Args:
      envs: the host environments.
      act: ``act(obs) -> actions``, for the episodes' ``(episodes, *obs_shape)``
        observations (normalised by ``obs_norm`` where it is given).
      key: the evaluation's key.
      episodes: how many.
      obs_norm: the observation normaliser, or ``None``.
      noise_std: Gaussian action noise in half action ranges (ERL's exploration), or
        ``None``; step ``t`` draws it from ``fold_in(noise_key, t)``.
      noise_key: the noise's key.
      act_key: for a stochastic policy (SAC's exploration), ``None`` otherwise: ``act`` is
        then ``act(obs, key)``, step ``t``'s key ``fold_in(act_key, t)``.

    Returns:
      An :class:`~evorl_pop.tasks.rollout.Episode`, leaves leading with the episodes.
    """
    from evorl_pop.tasks.obs_norm import ObsMoments
    from evorl_pop.tasks.rollout import Episode, Transition, add_exploration_noise

    index = jnp.arange(episodes)
    batch = envs.reset_batch(jax.random.split(key, episodes))
    # a stream of the call's own: a replicated evaluation runs the same call on every device
    stream = io_callback(envs._lease, jax.ShapeDtypeStruct((episodes,), jnp.uint32), batch.stream)
    batch = batch.replace(stream=stream)
    batch = batch.replace(obs=envs.sync(batch, batch.seed, index))

    def one_step(carry, t):
        batch, alive = carry
        seen = batch.obs if obs_norm is None else obs_norm.normalize(batch.obs)
        if act_key is None:
            action = act(seen)
        else:
            action = act(seen, jax.random.fold_in(act_key, t))
        if noise_std is not None:
            noise = jax.random.fold_in(noise_key, t)
            action = add_exploration_noise(envs, action, noise, noise_std)
        new, result = envs.step_batch(batch, action, index)
        done = (result.terminal + result.truncated) > 0
        step = Transition(batch.obs, action, result.reward, result.next_obs, result.terminal)
        return (new, alive & ~done), (step, alive)

    alive = jnp.ones((episodes,), bool)
    length = envs.spec.max_steps
    (final, _), (steps, valid) = jax.lax.scan(one_step, (batch, alive), jnp.arange(length))
    ids = jnp.stack([index.astype(jnp.uint32), final.stream, final.total.astype(jnp.uint32)], 1)
    io_callback(envs._release, jax.ShapeDtypeStruct((), jnp.int32), ids)
    steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)
    valid = valid.T
    moments = None
    if obs_norm is not None:
        seen = jnp.where(valid[..., None], steps.obs.reshape(episodes, length, -1), 0.0)
        moments = ObsMoments(
            valid.sum(1).astype(jnp.float32),
            seen.sum(1).reshape(episodes, *envs.spec.obs_shape),
            (seen**2).sum(1).reshape(episodes, *envs.spec.obs_shape),
        )
    episode_return = jnp.sum(jnp.where(valid, steps.reward, 0.0), axis=1)
    return Episode(episode_return, valid.sum(1).astype(jnp.int32), moments, steps, valid)
