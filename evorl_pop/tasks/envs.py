"""Environments: what a policy acts in, built by name.

An environment here is any object with

* ``spec``: an :class:`EnvSpec` (observation shape, action space, episode length),
* ``reset(key) -> (obs, state)``,
* ``step(key, state, action) -> (obs, state, reward, done)`` without auto-reset.

``done`` is sticky in the sense rollouts rely on: once an episode has ended
(termination or time limit, ``spec.max_steps``), later steps add nothing.
:class:`GymnaxEnv` adapts the gymnax environments,
:class:`~evorl_pop.tasks.brax_envs.BraxEnv` the brax ones (``brax/hopper``,
...), :class:`~evorl_pop.tasks.playground_envs.PlaygroundEnv` MuJoCo
Playground's DM Control Suite (``playground/CheetahRun``, ...); another
simulator plugs in by implementing the same three members. Gymnasium
environments, stepped on the host, are tasks of their own
(:class:`~evorl_pop.tasks.gym_envs.GymTask`, ``gym:<id>``).
Every episode runs through :mod:`evorl_pop.tasks.rollout`.

The policies that act in them are :mod:`evorl_pop.tasks.policies`'s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import EnvSpec, did_you_mean
from evorl_pop.core.interfaces import Env
from evorl_pop.tasks.brax_envs import BRAX_ENVS, BRAX_PREFIX, BraxEnv
from evorl_pop.tasks.playground_envs import PLAYGROUND_ENVS, PLAYGROUND_PREFIX, PlaygroundEnv

#: gymnax environments whose episodes only end at their time limit.
FIXED_LENGTH_GYMNAX = frozenset({"Pendulum-v1"})


class GymnaxEnv:
    """A gymnax environment with its parameters bound, stepped without auto-reset.

    Args:
      name: a gymnax environment name.
      episode_length: steps after which the episode ends (``None``: the
        environment's own limit).
      **env_kwargs: passed to ``gymnax.make``.
    """

    def __init__(self, name: str, episode_length: int | None = None, **env_kwargs):
        import gymnax  # starts JAX's backend when imported: only once an environment is built

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
            terminates=name not in FIXED_LENGTH_GYMNAX,
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


#: The prefix of Gymnasium tasks, ``gym:<id>`` (:class:`~evorl_pop.tasks.gym_envs.GymTask`):
#: stepped on the host, they are tasks rather than environments of :func:`make_env`.
GYM_PREFIX = "gym:"
#: Their Gymnasium vector environments: in this process, or a worker process per episode.
VECTOR_MODES = ("sync", "async")

#: gymnax environments :func:`make_env` does not offer, with the reason.
UNLISTED_GYMNAX = {
    "MNISTBandit-bsuite": "downloads the MNIST data set when it is built",
}


@functools.cache
def env_names() -> tuple[str, ...]:
    """Every environment :func:`make_env` builds by name: gymnax's, brax's, then Playground's."""
    import gymnax  # starts JAX's backend when imported: only once names are asked for

    gymnax_names = [name for name in gymnax.registered_envs if name not in UNLISTED_GYMNAX]
    return (
        *gymnax_names,
        *(BRAX_PREFIX + name for name in BRAX_ENVS),
        *(PLAYGROUND_PREFIX + name for name in PLAYGROUND_ENVS),
    )


def make_env(name: str, **env_kwargs) -> Env:
    """Builds an environment by name.

    Args:
      name: one of :func:`env_names`: a gymnax environment (e.g.
        ``'CartPole-v1'``, ``'Pendulum-v1'``, ``'Breakout-MinAtar'``), a
        brax one (``'brax/hopper'``, ``'brax/halfcheetah'``, ...) or a
        Playground one (``'playground/CheetahRun'``, ...).
      **env_kwargs: passed to the environment's constructor; every
        environment takes ``episode_length`` (``None``: its own limit, 1000
        for brax and Playground), brax ones also ``backend`` (``'spring'``,
        ``'positional'``, ``'generalized'``, ``'mjx'``), Playground ones
        ``impl`` (``'jax'``, ``'warp'``).

    Returns:
      An :class:`Env`.

    Raises:
      ValueError: for an unknown name, listing the valid ones.
    """
    if name in UNLISTED_GYMNAX:
        raise ValueError(f"{name!r} is not offered: it {UNLISTED_GYMNAX[name]}.")
    names = env_names()
    if name not in names:
        hint = did_you_mean(name, names, 3)
        raise ValueError(
            f"Unknown environment {name!r}.{hint} Valid environments: {', '.join(sorted(names))}."
        )
    # None means the default
    env_kwargs = {k: v for k, v in env_kwargs.items() if v is not None}
    if name.startswith(BRAX_PREFIX):
        return BraxEnv(name.removeprefix(BRAX_PREFIX), **env_kwargs)
    if name.startswith(PLAYGROUND_PREFIX):
        return PlaygroundEnv(name.removeprefix(PLAYGROUND_PREFIX), **env_kwargs)
    return GymnaxEnv(name, **env_kwargs)


def random_observations(env: Env, key: jax.Array, count: int, every: int = 8) -> jax.Array:
    """Observations of uniformly random play: one every ``every`` steps, ``count`` in all.

    An episode that ends is followed by a new one, so the observations span
    the states random play meets (for example the reference batch of virtual
    batch normalisation, :func:`evorl_pop.tasks.vbn.fold_virtual_batch_norm`).

    Args:
      env: an :class:`Env`.
      key: PRNG key of the resets, actions and steps.
      count: observations to return.
      every: steps between two kept observations.

    Returns:
      An array of shape ``(count, *env.spec.obs_shape)``.
    """
    spec = env.spec

    def random_action(key):
        if spec.discrete:
            return jax.random.randint(key, (), 0, spec.action_dim)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        return jax.random.uniform(key, (spec.action_dim,), minval=low, maxval=high)

    def step(carry, key):
        k_action, k_step, k_reset = jax.random.split(key, 3)
        obs, state, _, done = env.step(k_step, carry[1], random_action(k_action))
        fresh = env.reset(k_reset)
        return jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, (obs, state)), obs

    key, reset_key = jax.random.split(key)
    _, seen = jax.lax.scan(step, env.reset(reset_key), jax.random.split(key, count * every))
    return seen[every - 1 :: every]
