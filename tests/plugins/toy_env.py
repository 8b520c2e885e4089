"""A plug-in in one file: an environment family of point masses stepped in JAX.

Nothing here edits evorl_pop. Importing this module (``evorl-pop --plugin
toy_env``, or an ``evorl_pop.plugins`` entry point naming it) registers the
family ``toy``, whose environments are named ``toy/<task>``:

* ``toy/reach``: a point mass in the plane, started and given a target at
  random in ``[-1, 1]^2``; the action (in ``[-1, 1]^2``) is its velocity, a
  tenth of it per step; the reward is minus the distance to the target, every
  step of a fixed-length episode (50 steps unless ``episode_length`` says);
* ``toy/reach-1d``: the same on a line.

The observation is the position and the offset to the target. The algorithms
then take these tasks by name as they take brax's, and ``evorl-pop render``
draws their episodes: the mass and its target, step by step.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.tasks.control import JaxEnvFamily
from evorl_pop.tasks.drawing import write_gif

PREFIX = "toy/"
#: The tasks, each with the dimension of its plane (or line).
TASKS = {"reach": 2, "reach-1d": 1}
#: Steps of an episode unless ``episode_length`` says otherwise.
EPISODE_LENGTH = 50
#: The distance one step moves the mass at full speed.
STEP = 0.1


@flax.struct.dataclass
class PointState:
    position: jax.Array  # shape=(dims,)
    target: jax.Array  # shape=(dims,)
    time: jax.Array  # int32: steps taken


class PointMass:
    """A point mass that moves by its action towards a target (an ``Env``)."""

    def __init__(self, task: str, episode_length: int = EPISODE_LENGTH):
        if episode_length < 1:
            raise ValueError(f"episode_length must be at least 1, got {episode_length}.")
        self.dims = TASKS[task]
        self.spec = EnvSpec(
            name=PREFIX + task,
            obs_shape=(2 * self.dims,),
            discrete=False,
            action_dim=self.dims,
            action_low=(-1.0,) * self.dims,
            action_high=(1.0,) * self.dims,
            max_steps=episode_length,
            terminates=False,
        )

    def _observe(self, state: PointState) -> jax.Array:
        return jnp.concatenate([state.position, state.target - state.position])

    def reset(self, key):
        position, target = jax.random.uniform(key, (2, self.dims), minval=-1.0, maxval=1.0)
        state = PointState(position, target, jnp.zeros((), jnp.int32))
        return self._observe(state), state

    def step(self, key, state: PointState, action):
        del key  # deterministic
        position = state.position + STEP * jnp.clip(action, -1.0, 1.0)
        state = PointState(position, state.target, state.time + 1)
        reward = -jnp.linalg.norm(state.target - position)
        return self._observe(state), state, reward, state.time >= self.spec.max_steps


def draw_point(ax, state: PointState) -> None:
    """The mass (a dot) and its target (a cross), on a line drawn as a plane."""
    position = np.pad(np.asarray(state.position), (0, 2 - state.position.size))
    target = np.pad(np.asarray(state.target), (0, 2 - state.target.size))
    ax.plot(*target, "x", color="tab:red", markersize=12)
    ax.plot(*position, "o", color="tab:blue", markersize=10)
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_aspect("equal")


class PointMasses(JaxEnvFamily):
    """The family: ``toy/<task>`` for each task of :data:`TASKS`."""

    description = "point masses in JAX that reach a target (a test plug-in): toy/reach, ..."
    pattern = PREFIX + "<task>"

    def names(self) -> tuple[str, ...]:
        return tuple(PREFIX + task for task in TASKS)

    def make_env(self, name: str, **settings) -> PointMass:
        return PointMass(name.removeprefix(PREFIX), **settings)

    def draw(self, env, episodes, out) -> int:
        return write_gif(env, episodes, out, draw_point)


registry.register_env_family("toy", PointMasses())
