"""Making Gymnasium environments for the project: ``gym:<id>`` to a factory (importing
the package that registers a namespace first), ``Dict`` and ``Tuple`` observations
flattened, the :class:`~evorl_pop.base.EnvSpec` probed from one environment, and the
reset seeds an episode's key gives.

:mod:`evorl_pop.tasks.gym_envs` (the tasks and the family) and
:mod:`evorl_pop.tasks.host_lanes` (the learners' lanes) build on it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import ConfigError, EnvSpec, did_you_mean
from evorl_pop.tasks.vector_pool import made_quietly

#: The prefix of Gymnasium tasks, ``gym:<id>``.
GYM_PREFIX = "gym:"
#: :class:`~evorl_pop.tasks.control.ControlTask`'s settings of environments stepped in JAX,
#: which a :class:`GymTask` does not take.
JAX_SETTINGS = ("backend", "impl", "lanes", "virtual_batch_norm")
#: Gymnasium namespaces whose environments a package registers when it is imported:
#: the namespace, to that module and the project's extra that installs it. ``gym:ID`` in
#: one of them imports the module first (``gym:dm_control/cheetah-run-v0``: the DM
#: Control suite in MuJoCo's C simulator, through ``shimmy``).
NAMESPACES: dict[str, tuple[str, str]] = {"dm_control": ("shimmy", "dmc")}


def registered_factory(env_id: str, episode_length: int | None = None, **kwargs) -> Callable:
    """A factory of the registered Gymnasium environment ``env_id``.

    Args:
      env_id: a Gymnasium id (``'CartPole-v1'``), or Gymnasium's ``'module:id'``: the
        module (a package that registers environments when imported, such as
        ``shimmy``'s ``dm_control/...``) is imported first, here and in every worker.
      episode_length: its time limit instead of the registered one.
      **kwargs: passed to ``gymnasium.make``.

    Returns:
      ``() -> gymnasium.Env`` (picklable, for worker processes).

    Raises:
      ConfigError: a module that does not import, or an id that is not registered
        (with the nearest ids).
    """
    import gymnasium as gym  # imported once a Gymnasium task is built

    module, sep, name = env_id.rpartition(":")
    namespace = name.partition("/")[0] if "/" in name else None
    if not sep and name not in gym.registry and namespace in NAMESPACES:
        module, extra = NAMESPACES[namespace]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"gym:{env_id}: the {namespace}/ environments are registered by the package "
                f"{module!r}, which is not installed: pip install 'evorl_pop[{extra}]'."
            )
        sep, env_id = ":", f"{module}:{name}"  # every worker imports it too
        if not os.environ.get("DISPLAY"):  # MuJoCo draws frames without a window: EGL
            os.environ.setdefault("MUJOCO_GL", "egl")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(
                f"gym:{env_id}: the module {module!r} that registers it does not import "
                f"({err}); install it, or put it on PYTHONPATH."
            ) from None
        except Exception as err:  # a module that fails as it imports: a plug-in's own error
            gl = f" (MUJOCO_GL={os.environ['MUJOCO_GL']})" if "MUJOCO_GL" in os.environ else ""
            raise ConfigError(
                f"gym:{env_id}: importing the module {module!r} that registers it failed"
                f"{gl}: {type(err).__name__}: {err}"
            ) from None
    if name not in gym.registry:
        hint = did_you_mean(name, gym.registry, 3)
        where = f" after importing {module!r}" if sep else ""
        raise ConfigError(
            f"Unknown Gymnasium environment {name!r}{where}.{hint} Any id of "
            "gymnasium.registry works as gym:ID, and gym:MODULE:ID imports the module that "
            "registers it first (gymnasium.pprint_registry() lists them)."
        )
    if episode_length is not None:
        kwargs["max_episode_steps"] = int(episode_length)
    return Flattened(functools.partial(gym.make, env_id, **kwargs))


class Flattened:
    """A factory whose environments observe a flat vector where their observation space
    is a ``Dict`` or a ``Tuple`` (Gymnasium's ``FlattenObservation``): a ``Dict``'s
    entries in its key order (sorted, unless it was built from an ordered mapping), a
    ``Tuple``'s in order, each entry flattened as ``gymnasium.spaces.flatten`` does
    (a ``Box`` raveled, a ``Discrete`` one-hot). Keyword arguments reach the factory."""

    def __init__(self, factory: Callable):
        self.factory = factory

    def __call__(self, **kwargs):
        from gymnasium import spaces
        from gymnasium.wrappers import FlattenObservation

        env = self.factory(**kwargs)
        if isinstance(env.observation_space, (spaces.Dict, spaces.Tuple)):
            return FlattenObservation(env)
        return env


def _space_error(name: str, role: str, space) -> ValueError:
    return ValueError(
        f"{name}: its {role} space {space} is not supported; Gymnasium tasks take Box "
        "(bounded, for actions) or Discrete spaces."
    )


def _own_limit(env) -> int | None:
    """The step limit an environment keeps itself, without a ``TimeLimit`` wrapper (DM
    Control's ``control.Environment`` behind ``shimmy``: its ``_step_limit``), else ``None``."""
    limit = getattr(getattr(env.unwrapped, "_env", None), "_step_limit", None)
    return int(limit) if isinstance(limit, int | float) and np.isfinite(limit) else None


def _spec(name: str, env, episode_length: int | None) -> EnvSpec:
    """The :class:`EnvSpec` of a Gymnasium environment; ValueError for spaces a policy cannot use.

    A Discrete observation is seen one-hot (``obs_shape == (n,)``).
    """
    from gymnasium import spaces

    obs_space = env.observation_space
    act_space = env.action_space
    if isinstance(obs_space, spaces.Discrete):
        obs_shape = (int(obs_space.n),)
    elif isinstance(obs_space, spaces.Box):
        obs_shape = tuple(obs_space.shape)
    else:
        raise _space_error(name, "observation", obs_space)
    low = None
    high = None
    if isinstance(act_space, spaces.Discrete):
        discrete = True
        dim = int(act_space.n)
    elif isinstance(act_space, spaces.Box) and act_space.is_bounded("both"):
        discrete = False
        dim = int(np.prod(act_space.shape))
        low = tuple(np.asarray(act_space.low, np.float32).ravel().tolist())
        high = tuple(np.asarray(act_space.high, np.float32).ravel().tolist())
    else:
        raise _space_error(name, "action", act_space)
    limit = episode_length or getattr(env.spec, "max_episode_steps", None) or _own_limit(env)
    if limit is None:
        raise ValueError(
            f"{name} has no time limit (no max_episode_steps): give it an episode_length."
        )
    return EnvSpec(name, obs_shape, discrete, dim, low, high, int(limit), terminates=True)


def probe(factory: Callable, name: str, episode_length: int | None) -> tuple[EnvSpec, bool]:
    """``(spec, one_hot)`` of a factory's environments, read from one made and closed here
    (``one_hot``: a Discrete observation, seen one-hot).

    Raises:
      ConfigError: an environment whose simulator (Box2D, MuJoCo) is not installed.
      ValueError: spaces a policy cannot use, or no time limit.
    """
    import gymnasium as gym

    try:
        env = made_quietly(factory)
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(
            f"{name} needs a simulator that is not installed ({err}); install "
            "Gymnasium's Box2D and MuJoCo environments with: pip install -e '.[gymnasium]'"
        ) from err
    try:
        return _spec(name, env, episode_length), isinstance(
            env.observation_space, gym.spaces.Discrete
        )
    finally:
        env.close()


def _seed(key: jax.Array) -> jax.Array:
    return jax.random.bits(key, (), jnp.uint32)


def start_seed(key: jax.Array) -> jax.Array:
    """The reset seed of an episode whose key is ``key`` (uint32): the second half of its
    split, as :func:`episode_seeds` draws each episode's."""
    return _seed(jax.random.split(key)[1])


def episode_seeds(key: jax.Array, episodes: int) -> jax.Array:
    """The reset seeds of the episodes of an evaluation with ``key`` (uint32, ``(episodes,)``).

    Episode ``j`` takes ``split(key, episodes)[j]`` and resets with the second half of
    its split, the key schedule of :func:`~evorl_pop.tasks.rollout.evaluate_episodes` and
    :func:`~evorl_pop.tasks.rollout.rollout`: a plain Gymnasium loop reset with these seeds
    replays the task's episodes.

    Args:
      key: a candidate's evaluation key.
      episodes: its episodes.

    Returns:
      The seeds, one per episode.
    """
    return jax.vmap(start_seed)(jax.random.split(key, episodes))
