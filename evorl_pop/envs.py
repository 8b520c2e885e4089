"""Environments: a small protocol, gymnax behind it, and fast masked rollouts.

An environment here is any object with

* ``spec``: an :class:`EnvSpec` (observation shape, action space, episode length),
* ``reset(key) -> (obs, state)``,
* ``step(key, state, action) -> (obs, state, reward, done)`` without auto-reset.

Rollouts run a fixed number of steps under ``lax.scan`` and stop counting
reward after ``done`` with a mask: one reset per episode instead of an
auto-reset computed at every step (about twice as fast on gymnax).
:class:`GymnaxEnv` adapts the gymnax environments,
:class:`~evorl_pop.envs_brax.BraxEnv` the brax ones (``brax/hopper``, ...);
another simulator plugs in by implementing the same three members.
``done`` is sticky in the sense rollouts rely on: once an episode has ended
(termination or time limit, ``spec.max_steps``), later steps add nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any, Protocol

import flax.struct
import gymnax
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of an environment.

    Attributes:
      name: registry name, e.g. ``'CartPole-v1'``.
      obs_shape: shape of one observation.
      discrete: ``True`` for a discrete action space.
      action_dim: number of actions (discrete) or action vector length.
      action_low: lower bounds of continuous actions (``None`` if discrete).
      action_high: upper bounds of continuous actions (``None`` if discrete).
      max_steps: episode length limit.
    """

    name: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None
    max_steps: int

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))


class Env(Protocol):
    spec: EnvSpec

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array]: ...


class GymnaxEnv:
    """A gymnax environment with its parameters bound, stepped without auto-reset.

    Args:
      name: a gymnax environment name.
      episode_length: steps after which the episode ends (``None``: the
        environment's own limit).
      **env_kwargs: passed to ``gymnax.make``.
    """

    def __init__(self, name: str, episode_length: int | None = None, **env_kwargs):
        self.env, self.params = gymnax.make(name, **env_kwargs)
        if episode_length is not None:
            if episode_length < 1:
                raise ValueError(f"episode_length must be at least 1, got {episode_length}.")
            # gymnax environments end an episode at params.max_steps_in_episode
            # (a float in some of them: keep its type)
            limit = np.asarray(self.params.max_steps_in_episode).dtype.type(episode_length)
            self.params = self.params.replace(max_steps_in_episode=limit)
        space = self.env.action_space(self.params)
        discrete = hasattr(space, "n")
        if discrete:
            action_dim, low, high = int(space.n), None, None
        else:
            shape = tuple(space.shape) or (1,)
            action_dim = int(np.prod(shape))
            low = tuple(np.broadcast_to(np.asarray(space.low, np.float32), shape).ravel().tolist())
            high = tuple(
                np.broadcast_to(np.asarray(space.high, np.float32), shape).ravel().tolist()
            )
        self.spec = EnvSpec(
            name=name,
            obs_shape=tuple(self.env.observation_space(self.params).shape),
            discrete=discrete,
            action_dim=action_dim,
            action_low=low,
            action_high=high,
            max_steps=int(self.params.max_steps_in_episode),
        )
        self._action_shape = tuple(space.shape)

    def reset(self, key):
        return self.env.reset_env(key, self.params)

    def step(self, key, state, action):
        if not self.spec.discrete:
            action = jnp.reshape(action, self._action_shape)
        obs, state, reward, done, _ = self.env.step_env(key, state, action, self.params)
        # step_env reports natural ends only; the time limit is gymnax's is_truncated
        done = done | self.env.is_truncated(state, self.params)
        return obs, state, reward.astype(jnp.float32), done


BRAX_PREFIX = "brax/"

#: brax environments offered as tasks (``brax/<name>``).
BRAX_ENVS = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_double_pendulum",
    "inverted_pendulum",
    "pusher",
    "reacher",
    "walker2d",
)

#: gymnax environments left out of :data:`ENV_FACTORIES`, with the reason.
UNLISTED_GYMNAX = {
    "MNISTBandit-bsuite": "downloads the MNIST data set when it is built",
}


def _brax_env(name: str, **kwargs):
    from evorl_pop.envs_brax import BraxEnv  # brax is optional: imported on first use

    # None means the default, as for gymnax environments
    return BraxEnv(name, **{k: v for k, v in kwargs.items() if v is not None})


ENV_FACTORIES: dict[str, Callable[..., Env]] = {
    **{
        name: (lambda name=name, **kw: GymnaxEnv(name, **kw))
        for name in gymnax.registered_envs
        if name not in UNLISTED_GYMNAX
    },
    **{
        name: (lambda name=name, **kw: _brax_env(name.removeprefix(BRAX_PREFIX), **kw))
        for name in (BRAX_PREFIX + env for env in BRAX_ENVS)
    },
}


def make_env(name: str, **env_kwargs) -> Env:
    """Builds an environment by registry name.

    Args:
      name: a key of :data:`ENV_FACTORIES`: a gymnax environment (e.g.
        ``'CartPole-v1'``, ``'Pendulum-v1'``, ``'Breakout-MinAtar'``) or a
        brax one (``'brax/hopper'``, ``'brax/halfcheetah'``, ...).
      **env_kwargs: passed to the environment's constructor; every
        environment takes ``episode_length`` (``None``: its own limit, 1000
        for brax), brax ones also ``backend`` (``'spring'``, ``'positional'``,
        ``'generalized'``, ``'mjx'``).

    Returns:
      An :class:`Env`.

    Raises:
      ValueError: for an unknown name, listing the valid ones.
    """
    if name in UNLISTED_GYMNAX:
        raise ValueError(f"{name!r} is not offered: it {UNLISTED_GYMNAX[name]}.")
    if name not in ENV_FACTORIES:
        close = difflib.get_close_matches(name, ENV_FACTORIES, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"Unknown environment {name!r}.{hint} Valid environments: "
            f"{', '.join(sorted(ENV_FACTORIES))}."
        )
    return ENV_FACTORIES[name](**env_kwargs)


# --- running observation normalisation -----------------------------------------


@flax.struct.dataclass
class ObsNorm:
    """Running mean / variance of observations (Chan et al. parallel merge)."""

    count: jax.Array  # shape=(), float32: observations seen
    mean: jax.Array  # shape=obs_shape
    var: jax.Array  # shape=obs_shape

    @classmethod
    def create(cls, obs_shape) -> ObsNorm:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.ones(obs_shape))

    def normalize(self, obs, clip: float = 5.0):
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)

    def merge(self, moments: ObsMoments) -> ObsNorm:
        """Folds in a batch's moments (sums that may come from a ``psum``)."""
        n = moments.count
        safe_n = jnp.maximum(n, 1.0)
        batch_mean = moments.total / safe_n
        batch_var = jnp.maximum(moments.total_sq / safe_n - batch_mean**2, 0.0)
        total = self.count + n
        w = n / jnp.maximum(total, 1.0)
        delta = batch_mean - self.mean
        mean = self.mean + w * delta
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * w
        var = jnp.where(total > 0, m2 / jnp.maximum(total, 1.0), self.var)
        keep = n > 0
        return ObsNorm(
            count=total,
            mean=jnp.where(keep, mean, self.mean),
            var=jnp.where(keep, var, self.var),
        )


@flax.struct.dataclass
class ObsMoments:
    """Sums over observations; add them (``psum``) and merge into :class:`ObsNorm`."""

    count: jax.Array
    total: jax.Array
    total_sq: jax.Array

    @classmethod
    def zeros(cls, obs_shape) -> ObsMoments:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.zeros(obs_shape))


# --- rollouts ------------------------------------------------------------------


@flax.struct.dataclass
class EpisodeStats:
    """What one evaluation produced (summed over its episodes)."""

    episode_return: jax.Array  # mean return over the evaluation's episodes
    steps: jax.Array  # int32: env steps taken before each episode ended, summed
    episodes: jax.Array  # int32: episodes run
    moments: ObsMoments  # raw observation sums, for the running normaliser


def rollout(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    obs_norm: ObsNorm | None = None,
    num_steps: int | None = None,
) -> EpisodeStats:
    """Runs one episode of ``policy`` with a done-mask.

    Args:
      env: an :class:`Env`.
      policy: ``(params, obs) -> action``.
      params: the policy parameters.
      key: PRNG key for the reset and the environment's own noise.
      obs_norm: when given, observations are normalised before the policy
        sees them, and raw observation moments are returned.
      num_steps: steps to scan (default: the episode limit).

    Returns:
      :class:`EpisodeStats` for this single episode.
    """
    num_steps = env.spec.max_steps if num_steps is None else num_steps
    key, reset_key = jax.random.split(key)
    obs, state = env.reset(reset_key)
    track = obs_norm is not None
    # zeros derived from obs keep its sharding type (varying inside shard_map)
    zero = jnp.zeros_like(obs, dtype=jnp.float32)
    moments = ObsMoments(zero.reshape(-1)[0], zero, zero)

    def body(carry, step_key):
        obs, state, ret, alive, moments = carry
        if track:
            moments = ObsMoments(
                moments.count + alive,
                moments.total + alive * obs,
                moments.total_sq + alive * obs**2,
            )
            action = policy(params, obs_norm.normalize(obs))
        else:
            action = policy(params, obs)
        obs, state, reward, done = env.step(step_key, state, action)
        ret = ret + alive * reward
        alive_next = alive * (1.0 - done.astype(jnp.float32))
        return (obs, state, ret, alive_next, moments), alive

    init = (obs, state, moments.count, moments.count + 1.0, moments)
    (_, _, ret, _, moments), alive = jax.lax.scan(body, init, jax.random.split(key, num_steps))
    return EpisodeStats(
        episode_return=ret,
        steps=jnp.sum(alive).astype(jnp.int32),
        episodes=jnp.int32(1),
        moments=moments,
    )


def evaluate_episodes(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    num_episodes: int = 1,
    obs_norm: ObsNorm | None = None,
) -> EpisodeStats:
    """Mean return of ``policy`` over ``num_episodes`` independent episodes."""
    stats = jax.vmap(lambda k: rollout(env, policy, params, k, obs_norm))(
        jax.random.split(key, num_episodes)
    )
    return EpisodeStats(
        episode_return=stats.episode_return.mean(),
        steps=stats.steps.sum(),
        episodes=jnp.int32(num_episodes),
        moments=jax.tree.map(lambda x: x.sum(0), stats.moments),
    )
