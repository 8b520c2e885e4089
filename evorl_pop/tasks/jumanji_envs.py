"""Jumanji's environments behind the :class:`~evorl_pop.core.interfaces.Env` protocol.

Every Jumanji environment that fits (:data:`JUMANJI_IDS`) is a task named
``jumanji:<id>`` (``jumanji:Snake-v1``, ``jumanji:Game2048-v1``,
``jumanji:Minesweeper-v0``, ...), stepped without auto-reset::

    reset(key)                 -> obs, JumanjiState(Jumanji's state, time=0)
    step(key, state, action)   -> obs, state, reward, done
                                  done = Jumanji's last step (its own end or its time
                                         limit) or time == episode_length

Observations are one float32 vector: the fields of Jumanji's observation in
their order, each raveled (a nested record's fields in their order too),
booleans as 0 / 1; the reward is Jumanji's, summed where it is one per
agent. Where the observation has an ``action_mask`` field, the
policies (ES's, PPO's) read it there (``EnvSpec.action_mask``) and never pick
an action it rules out. Actions:

* a ``DiscreteArray``: one categorical head;
* a ``MultiDiscreteArray`` whose mask has one row per dimension (or that has
  no mask): one categorical head per dimension (``EnvSpec.action_heads``);
* a ``MultiDiscreteArray`` whose mask covers every combination (its shape is the
  dimensions' sizes: Minesweeper's cells, BinPack's (space, item) pairs): one
  categorical head over the combinations, the index unravelled (C order) into
  the action, so that the mask rules out exactly the invalid combinations;
* a float ``BoundedArray``: continuous, in its bounds.

An episode ends where Jumanji's timestep is the last one. Jumanji marks its
time-limit ends with a discount of 1 and its own ends with 0; the learners tell
the two apart by the time limit (``EnvSpec.max_steps``), which is Jumanji's own
where it has one (an ``episode_length`` replaces it), else ``episode_length`` or
:data:`DEFAULT_EPISODE_LENGTH`. The environments that do not fit, and why, are
:data:`UNLISTED_JUMANJI`. ``evorl-pop render`` draws episodes with Jumanji's
own viewer (matplotlib). Jumanji is an optional dependency (the ``jumanji``
extra), imported when an environment is built.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.tasks.control import JaxEnvFamily
from evorl_pop.tasks.drawing import Trajectory, write_gif
from evorl_pop.tasks.envs import check_episode_length

JUMANJI_PREFIX = "jumanji:"
#: Jumanji's environments offered as tasks (``jumanji:<id>``), in Jumanji's order.
JUMANJI_IDS = (
    "Connector-v3",
    "MMST-v0",
    "Snake-v1",
    "CVRP-v1",
    "BinPack-v2",
    "RubiksCube-v0",
    "GraphColoring-v1",
    "PacMan-v1",
    "RubiksCube-partly-scrambled-v0",
    "LevelBasedForaging-v0",
    "Sudoku-v0",
    "Maze-v0",
    "FlatPack-v0",
    "Game2048-v1",
    "Knapsack-v1",
    "Cleaner-v0",
    "SearchAndRescue-v0",
    "Tetris-v0",
    "JobShop-v0",
    "RobotWarehouse-v0",
    "Minesweeper-v0",
    "Sudoku-very-easy-v0",
    "TSP-v1",
    "SlidingTilePuzzle-v0",
)
#: Jumanji's environments not offered, with the reason.
UNLISTED_JUMANJI = {
    "Sokoban-v0": "downloads its levels from the Hugging Face Hub when it is built",
    "MultiCVRP-v0": "takes a bounded integer array per vehicle, which is no discrete space",
}
#: The time limit of an environment that has none of its own (Game2048, Knapsack, ...).
DEFAULT_EPISODE_LENGTH = 1000


@flax.struct.dataclass
class JumanjiState:
    """Jumanji's state and the steps taken in the episode."""

    inner: Any
    time: jax.Array  # int32


def flatten_observation(obs) -> jax.Array:
    """Jumanji's observation as one float32 vector: its fields in order, each raveled."""
    leaves = jax.tree.leaves(obs)
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])


def _mask_slice(obs) -> tuple[int, int] | None:
    """Where the ``action_mask`` field lies in :func:`flatten_observation`'s vector."""
    fields = obs._asdict() if hasattr(obs, "_asdict") else {}
    start = 0
    for name, value in fields.items():
        size = sum(int(np.size(x)) for x in jax.tree.leaves(value))
        if name == "action_mask":
            return start, start + size
        start += size
    return None


class JumanjiEnv:
    """A Jumanji environment, its observation flattened, stepped without auto-reset.

    Args:
      name: a Jumanji id (``'Snake-v1'``).
      episode_length: steps after which the episode ends (``None``: the
        environment's own time limit, else :data:`DEFAULT_EPISODE_LENGTH`);
        Jumanji's own limit becomes it where the environment takes one.
      **env_kwargs: passed to ``jumanji.make``.

    Raises:
      ValueError: an environment not offered (:data:`UNLISTED_JUMANJI`), or an
        ``episode_length`` past a time limit the environment cannot change.
    """

    def __init__(self, name: str, episode_length: int | None = None, **env_kwargs):
        import jumanji  # starts JAX's backend when imported: only once an environment is built
        from jumanji import specs

        if name in UNLISTED_JUMANJI:
            raise ValueError(f"'jumanji:{name}' is not offered: it {UNLISTED_JUMANJI[name]}.")
        check_episode_length(episode_length)
        env = jumanji.make(name, **env_kwargs)
        own = getattr(env, "time_limit", None)
        if episode_length is not None and own is not None and own != episode_length:
            if "time_limit" not in inspect.signature(type(env).__init__).parameters:
                raise ValueError(
                    f"episode_length={episode_length}: 'jumanji:{name}' has a fixed time "
                    f"limit of {own} steps."
                )
            env = jumanji.make(name, **{**env_kwargs, "time_limit": episode_length})
        self.env = env
        self.max_steps = int(episode_length or own or DEFAULT_EPISODE_LENGTH)
        action = env.action_spec
        obs = env.observation_spec.generate_value()
        flat = flatten_observation(obs)
        mask = _mask_slice(obs)
        mask_shape = np.shape(obs.action_mask) if mask is not None else None
        self._unravel: tuple[int, ...] | None = None  # a joint head's dimensions
        self._action_dtype = action.dtype
        self._action_shape = tuple(action.shape)
        heads: tuple[int, ...] = ()
        low = high = None
        if isinstance(action, specs.MultiDiscreteArray):
            nvec = tuple(int(n) for n in np.asarray(action.num_values).ravel())
            if mask_shape == nvec and len(nvec) > 1:
                self._unravel = nvec
                action_dim = int(np.prod(nvec))
            else:
                if mask is not None and mask_shape != (len(nvec), *set(nvec)):
                    raise ValueError(f"'jumanji:{name}': its action mask {mask_shape} fits no head")
                heads, action_dim = nvec, sum(nvec)
            discrete = True
        elif isinstance(action, specs.DiscreteArray):
            discrete, action_dim = True, int(action.num_values)
        else:
            discrete, action_dim = False, int(np.prod(self._action_shape))
            low = _bounds(action.minimum, self._action_shape)
            high = _bounds(action.maximum, self._action_shape)
        self.spec = EnvSpec(
            name=JUMANJI_PREFIX + name,
            obs_shape=tuple(flat.shape),
            discrete=discrete,
            action_dim=action_dim,
            action_low=low,
            action_high=high,
            max_steps=self.max_steps,
            action_heads=heads,
            action_mask=mask,
        )

    def jumanji_action(self, action: jax.Array) -> jax.Array:
        """The action Jumanji takes for one of the policies' actions."""
        if self._unravel is not None:
            action = jnp.stack(jnp.unravel_index(action, self._unravel))
        return jnp.reshape(action, self._action_shape).astype(self._action_dtype)

    def reset(self, key):
        inner, timestep = self.env.reset(key)
        return flatten_observation(timestep.observation), JumanjiState(inner, jnp.int32(0))

    def step(self, key, state: JumanjiState, action):
        del key  # Jumanji's state holds its own key
        inner, timestep = self.env.step(state.inner, self.jumanji_action(action))
        time = state.time + 1
        done = timestep.last() | (time >= self.max_steps)
        obs = flatten_observation(timestep.observation)
        reward = jnp.sum(timestep.reward).astype(jnp.float32)
        return obs, JumanjiState(inner, time), reward, done


def _bounds(value, shape: tuple[int, ...]) -> tuple[float, ...]:
    """An action bound, one float per action dimension."""
    return tuple(np.broadcast_to(np.asarray(value, np.float32), shape).ravel().tolist())


def _without_keys(tree):
    """``tree`` with its PRNG keys as their raw data (which NumPy can hold)."""

    def leaf(x):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return np.asarray(jax.random.key_data(x))
        return np.asarray(x)

    return jax.tree.map(leaf, tree)


def viewer_pictures(env: JumanjiEnv):
    """An episode's states as images, by Jumanji's viewer (matplotlib), or ``None``:
    its viewer gives no pictures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    viewer = getattr(env.env, "_viewer", None)
    if viewer is None or not hasattr(viewer, "_display_rgb_array"):
        return None
    viewer._display = viewer._display_rgb_array  # frames as arrays, not windows

    def frame(state) -> np.ndarray | None:
        try:
            image = env.env.render(state)
        finally:
            viewer.close()
            plt.close("all")
        return None if image is None or np.ndim(image) != 3 else np.asarray(image)[..., :3]

    reset = _without_keys(env.reset(jax.random.key(0))[1].inner)
    if frame(reset) is None:  # a viewer that draws but gives no pixels back
        return None

    def pictures(states) -> np.ndarray:
        steps = len(np.asarray(states.time))
        return np.stack(
            [frame(jax.tree.map(lambda x, t=t: x[t], states.inner)) for t in range(steps)]
        )

    return pictures


class JumanjiFamily(JaxEnvFamily):
    """Jumanji's environments (:class:`JumanjiEnv`), as ``jumanji:<id>``."""

    description = "Jumanji's environments in JAX: routing, packing, logic puzzles (jumanji:<id>)"
    pattern = "jumanji:<Jumanji id>"
    example = "jumanji:Game2048-v1"
    prefix = JUMANJI_PREFIX
    ids = JUMANJI_IDS
    env_class = JumanjiEnv

    def owns(self, name: str) -> bool:
        # an unlisted one too, so that building it says why it is not offered
        return name in self.names() or name.removeprefix(self.prefix) in UNLISTED_JUMANJI

    def draw(self, env: JumanjiEnv, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF drawn by Jumanji's viewer, else of the observations."""
        try:
            pictures = viewer_pictures(env)
        except ImportError:
            pictures = None
        if pictures is None:
            return write_gif(env, episodes, out)
        episodes = [dataclasses.replace(e, states=_without_keys(e.states)) for e in episodes]
        return write_gif(env, episodes, out, pictures=pictures)


registry.register_env_family("jumanji", JumanjiFamily())
