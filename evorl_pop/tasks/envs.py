"""Environments: what a policy acts in, built by name through the environment families.

An environment is an :class:`~evorl_pop.core.interfaces.Env`:

* ``spec``: an :class:`~evorl_pop.base.EnvSpec` (observation shape, action space,
  episode length),
* ``reset(key) -> (obs, state)``,
* ``step(key, state, action) -> (obs, state, reward, done)`` without auto-reset.

``done`` is sticky in the sense rollouts rely on: once an episode has ended
(termination or time limit, ``spec.max_steps``), later steps add nothing.
Every episode runs through :mod:`evorl_pop.tasks.rollout`.

Names belong to environment families, plug-ins of
:data:`evorl_pop.registry.ENV_FAMILIES` (an
:class:`~evorl_pop.core.interfaces.EnvFamily` each): the family a name's prefix
names (a bare name: gymnax's) is asked first whether it owns the name, then
every other family in turn:

| family | names | module |
|---|---|---|
| gymnax | ``CartPole-v1``, ``Breakout-MinAtar``, ... | :mod:`evorl_pop.tasks.gymnax_envs` |
| brax | ``brax/hopper``, ... | :mod:`evorl_pop.tasks.brax_envs` |
| playground | ``playground/CheetahRun``, ... | :mod:`evorl_pop.tasks.playground_envs` |
| marl | ``marl/MPE_simple_spread_v3``, ... | :mod:`evorl_pop.tasks.marl_envs` |
| jumanji | ``jumanji:Game2048-v1``, ... | :mod:`evorl_pop.tasks.jumanji_envs` |
| envpool | ``envpool:CheetahRun-v1``, ... (C++ threads) | :mod:`evorl_pop.tasks.envpool_envs` |
| gym | ``gym:<id>``, stepped on the host | :mod:`evorl_pop.tasks.gym_envs` |

A family of your own registers itself in its own module
(:class:`~evorl_pop.tasks.control.JaxEnvFamily` is the part every family
stepped in JAX shares); the policies that act in the environments are
:mod:`evorl_pop.tasks.policies`'s.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import ConfigError, did_you_mean
from evorl_pop.core.capabilities import Pooled
from evorl_pop.core.interfaces import Env, EnvFamily

#: The family of a name without a ``family/`` or ``family:`` prefix (``CartPole-v1``).
DEFAULT_FAMILY = "gymnax"


#: Each name already found, to the family that owns it: a registered family keeps its
#: names, so a config's checks, its task and its render ask the families once per name.
_OWNERS: dict[str, EnvFamily] = {}


def env_family(name: str) -> EnvFamily | None:
    """The family that owns the environment ``name``, or ``None`` (a black-box task, or
    a name no family has).

    Args:
      name: an environment name (``'CartPole-v1'``, ``'brax/hopper'``, ``'gym:<id>'``).
    """
    owner = _OWNERS.get(name)
    if owner is None:
        owner = _find_family(name)
        if owner is not None:
            _OWNERS[name] = owner
    return owner


def steps_on_host(name: str) -> bool:
    """Whether the task ``name`` steps its environments on the host (a family with
    ``steps_in_jax`` false, Gymnasium's); ``False`` for JAX families and black-box tasks."""
    family = env_family(name)
    return family is not None and not family.steps_in_jax and not isinstance(family, Pooled)


def _find_family(name: str) -> EnvFamily | None:
    # The family a name's prefix names (brax/..., gym:...; a bare name: gymnax) first,
    # so that only the module of the family that owns it is asked.
    prefix = re.match(r"([^/:]+)[/:]", name)
    family = registry.ENV_FAMILIES.find(prefix.group(1) if prefix else DEFAULT_FAMILY)
    if family is not None and family.owns(name):
        return family
    for _, family in registry.ENV_FAMILIES.items():
        if family.owns(name):
            return family
    return None


def check_environment(name: str, who: str) -> None:
    """:class:`~evorl_pop.base.ConfigError` unless ``name`` is an environment stepped in
    JAX, saying why ``who`` (``'ppo'``, ``'cemrl'``) cannot run it.

    Raises:
      ConfigError: a black-box function, an environment stepped on the host, an unknown name.
    """
    family = env_family(name)
    if family is not None and getattr(family, "multi_agent", False):
        raise ConfigError(
            f"task: {who} learns one agent's policy, and {name!r} is a multi-agent task "
            f"({family.pattern}); -a es evolves its whole team (--set team=shared|per_agent)."
        )
    if family is not None and family.steps_in_jax:
        return
    if family is not None:
        raise ConfigError(
            f"task: {who} steps its environments in JAX, and {name!r} ({family.pattern}) is "
            "stepped on the host; -a es runs it, or choose an environment of evorl-pop list."
        )
    from evorl_pop.tasks.blackbox import BLACKBOX_TASKS  # its import is slow: here only

    if name in BLACKBOX_TASKS:
        raise ConfigError(
            f"task: {who} learns a policy in an environment, and {name!r} is a black-box "
            "function (-a es optimises it); choose an environment of evorl-pop list, "
            "e.g. task=Pendulum-v1."
        )
    names = env_names()
    hint = did_you_mean(name, names, 3)
    raise ConfigError(f"task: unknown value {name!r}.{hint} evorl-pop list shows the environments.")


def env_names() -> tuple[str, ...]:
    """Every environment :func:`make_env` builds by name: the names each family stepped in
    JAX lists, family by family."""
    families = registry.ENV_FAMILIES.items()
    return tuple(name for _, f in families if f.steps_in_jax for name in f.names())


def env_settings(fields: Collection[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Every family's own settings (brax's ``backend``, ...), each to its valid values.

    Args:
      fields: only the settings of these names (a config's fields); ``None``: all.
    """
    settings = {}
    for _, family in registry.ENV_FAMILIES.items():
        settings.update(family.settings)
    if fields is None:
        return settings
    return {name: valid for name, valid in settings.items() if name in fields}


def check_episode_length(episode_length: int | None) -> None:
    """ValueError for an episode length below 1 (``None``: the environment's own passes)."""
    if episode_length is not None and episode_length < 1:
        raise ValueError(f"episode_length must be at least 1, got {episode_length}.")


def make_env(name: str, **env_kwargs) -> Env:
    """Builds an environment by name, by the family that owns it.

    Args:
      name: one of :func:`env_names`: a gymnax environment (e.g.
        ``'CartPole-v1'``, ``'Pendulum-v1'``, ``'Breakout-MinAtar'``), a
        brax one (``'brax/hopper'``, ``'brax/halfcheetah'``, ...), a
        Playground one (``'playground/CheetahRun'``, ...) or a plug-in's.
      **env_kwargs: passed to the family's ``make_env`` (``None`` values left
        out: the defaults); every environment takes ``episode_length``
        (``None``: its own limit, 1000 for brax and Playground), brax ones
        also ``backend`` (``'spring'``, ``'positional'``, ``'generalized'``,
        ``'mjx'``), Playground ones ``impl`` (``'jax'``, ``'warp'``).

    Returns:
      An :class:`~evorl_pop.core.interfaces.Env`.

    Raises:
      ValueError: for an unknown name, listing the valid ones.
    """
    family = env_family(name)
    if family is None or not family.steps_in_jax:
        names = env_names()
        hint = did_you_mean(name, names, 3)
        raise ValueError(
            f"Unknown environment {name!r}.{hint} Valid environments: {', '.join(sorted(names))}."
        )
    settings = {key: value for key, value in env_kwargs.items() if value is not None}
    return family.make_env(name, **settings)


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
        if spec.discrete and spec.action_heads:
            return jax.random.randint(
                key, (len(spec.action_heads),), 0, np.array(spec.action_heads)
            )
        if spec.discrete:
            return jax.random.randint(key, (), 0, spec.action_dim)
        low = np.asarray(spec.action_low)
        high = np.asarray(spec.action_high)
        return jax.random.uniform(key, (spec.action_dim,), minval=low, maxval=high)

    def step(carry, key):
        k_action, k_step, k_reset = jax.random.split(key, 3)
        obs, state, _, done = env.step(k_step, carry[1], random_action(k_action))
        fresh = env.reset(k_reset)
        return jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, (obs, state)), obs

    key, reset_key = jax.random.split(key)
    _, seen = jax.lax.scan(step, env.reset(reset_key), jax.random.split(key, count * every))
    return seen[every - 1 :: every]
