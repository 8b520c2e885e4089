"""gymnax's environments behind the :class:`~evorl_pop.core.interfaces.Env` protocol.

Every environment of gymnax's registry (classic control, MinAtar, bsuite,
misc) is a task under its gymnax name (``CartPole-v1``, ``Pendulum-v1``,
``Breakout-MinAtar``, ...), stepped without auto-reset::

    reset(key)                 -> obs, gymnax state
    step(key, state, action)   -> obs, state, reward, done
                                  done = the environment's own end, or its time limit

``evorl-pop render`` draws their episodes with gymnax's own visualiser where
it has one for the environment, else the observations. gymnax starts JAX's
backend when imported: it is imported when names are asked for or an
environment is built.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.tasks.control import JaxEnvFamily
from evorl_pop.tasks.drawing import EpisodePictures, StateDrawer, Trajectory, write_gif
from evorl_pop.tasks.envs import check_episode_length

#: gymnax environments whose episodes only end at their time limit.
FIXED_LENGTH_GYMNAX = frozenset({"Pendulum-v1"})

#: gymnax environments not offered, with the reason.
UNLISTED_GYMNAX = {
    "MNISTBandit-bsuite": "downloads the MNIST data set when it is built",
}

#: The environments gymnax's visualiser draws with gymnasium's pygame.
PYGAME_DRAWN = (
    "Acrobot-v1",
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
)


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

        check_episode_length(episode_length)
        self.env, self.params = gymnax.make(name, **env_kwargs)
        if episode_length is not None:
            # gymnax environments end an episode at params.max_steps_in_episode
            # (a float in some of them: keep its type)
            limit = np.asarray(self.params.max_steps_in_episode).dtype.type(episode_length)
            self.params = self.params.replace(max_steps_in_episode=limit)
        space = self.env.action_space(self.params)
        discrete = hasattr(space, "n")
        low = None
        high = None
        if discrete:
            action_dim = int(space.n)
        else:
            shape = tuple(space.shape) or (1,)
            action_dim = int(np.prod(shape))
            low = _bounds(space.low, shape)
            high = _bounds(space.high, shape)
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


def _bounds(value, shape: tuple[int, ...]) -> tuple[float, ...]:
    """An action bound of a Box space, one float per action dimension."""
    return tuple(np.broadcast_to(np.asarray(value, np.float32), shape).ravel().tolist())


@functools.cache
def gymnax_names() -> tuple[str, ...]:
    """Every gymnax environment offered, in gymnax's order (:data:`UNLISTED_GYMNAX` left out)."""
    import gymnax  # starts JAX's backend when imported: only once names are asked for

    return tuple(name for name in gymnax.registered_envs if name not in UNLISTED_GYMNAX)


def gymnax_drawer(env: GymnaxEnv) -> StateDrawer | None:
    """``draw(ax, state)`` by gymnax's own visualiser for ``env`` (one for every frame),
    or ``None``: it has none."""
    try:
        from gymnax.visualize.visualizer import Visualizer
    except ImportError:
        return None
    import matplotlib.pyplot as plt

    vis = Visualizer(env.env, env.params, [])
    plt.close(vis.fig)  # its own figure: drawn into the GIF's instead

    def draw(ax, state):
        vis.fig, vis.ax, vis.state_seq = ax.figure, ax, [state]
        vis.init()

    try:
        fig, ax = plt.subplots()
        draw(ax, jax.tree.map(np.asarray, env.reset(jax.random.key(0))[1]))
        plt.close(fig)
    except Exception:  # no visualiser for this environment
        return None
    return draw


def classic_control_pictures(env: GymnaxEnv) -> EpisodePictures | None:
    """Classic control as gymnasium draws it (pygame, no display): one renderer for
    every frame; ``None`` without gymnasium's drawing extra (pygame)."""
    name, params = env.env.name, env.params
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame: no sound card,
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no display to look for
    try:
        import gymnasium
        import pygame  # noqa: F401  (gymnasium draws classic control with it)
        from gymnax.visualize import vis_gym
    except ImportError:
        return None

    def pictures(states) -> np.ndarray:
        world = gymnasium.make(name, render_mode="rgb_array")
        world.reset(seed=0)
        vis_gym.set_gym_params(world.unwrapped, name, params)
        images = []
        for t in range(len(jax.tree.leaves(states)[0])):
            state = jax.tree.map(lambda x, t=t: x[t], states)
            world.unwrapped.state = vis_gym.get_gym_state(state, name)
            if name == "Pendulum-v1":
                world.unwrapped.last_u = np.asarray(state.last_u, np.float64)
            images.append(world.render()[::2, ::2])  # about the GIF's size
        world.close()
        return np.stack(images)

    return pictures


def grid_pictures(env: GymnaxEnv) -> EpisodePictures:
    """A grid world's observation (MinAtar's channels), as gymnax's visualiser draws it:
    each cell the colour of its highest channel (a colour each), black where none is set."""
    import matplotlib

    inner, params = env.env, env.params
    channels = inner.obs_shape[-1]
    palette = matplotlib.colormaps["tab10" if channels <= 10 else "hsv"](
        np.arange(channels) / (10 if channels <= 10 else channels)
    )[:, :3]
    palette = np.concatenate([np.zeros((1, 3)), palette]) * 255

    @jax.jit
    def observe(states):
        return jax.vmap(lambda s: inner.get_obs(s, params))(states)

    def pictures(states) -> np.ndarray:
        obs = np.asarray(observe(states))
        top = np.max(obs * np.arange(1, channels + 1), axis=-1).astype(int)
        return palette[top].astype(np.uint8)

    return pictures


class GymnaxFamily(JaxEnvFamily):
    """gymnax's environments (:class:`GymnaxEnv`), under their gymnax names."""

    description = "gymnax's environments in JAX: classic control, MinAtar, bsuite, misc"
    pattern = "<gymnax id>"
    example = "Pendulum-v1"

    def names(self) -> tuple[str, ...]:
        return gymnax_names()

    def owns(self, name: str) -> bool:
        # an unlisted one too, so that building it says why it is not offered
        return name in UNLISTED_GYMNAX or name in gymnax_names()

    def make_env(self, name: str, **settings) -> GymnaxEnv:
        if name in UNLISTED_GYMNAX:
            raise ValueError(f"{name!r} is not offered: it {UNLISTED_GYMNAX[name]}.")
        return GymnaxEnv(name, **settings)

    def draw(self, env: GymnaxEnv, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF: classic control as gymnasium draws it, MinAtar's grids as gymnax's
        visualiser colours them, the others by gymnax's visualiser where it has one
        for ``env``, else of the observations."""
        name = env.env.name
        pictures = None
        if name in PYGAME_DRAWN:
            pictures = classic_control_pictures(env)
        elif name.endswith("-MinAtar"):
            pictures = grid_pictures(env)
        if pictures is not None:
            return write_gif(env, episodes, out, pictures=pictures)
        return write_gif(env, episodes, out, gymnax_drawer(env))


registry.register_env_family("gymnax", GymnaxFamily())
