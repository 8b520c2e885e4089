"""brax physics environments behind the :class:`~evorl_pop.core.interfaces.Env` protocol.

Every brax locomotion / manipulation environment is a task named
``brax/<env>`` (``brax/hopper``, ``brax/halfcheetah``, ...)::

    reset(key)                 -> obs, BraxState(brax state, time=0, done=False)
    step(key, state, action)   -> obs, state, reward, done
                                  done = brax's own termination (a fall)
                                         or time == episode_length

An episode that has ended is frozen: further steps return the same state,
zero reward and ``done=True``, so a rollout that keeps scanning past a fall
adds nothing to the return and never sees the NaNs a fallen body can produce.
Actions live in ``[-1, 1]``, brax's convention (environments with other
actuator ranges rescale internally). ``evorl-pop render`` shows their
episodes in brax's HTML viewer.

brax is an optional dependency (``pip install -e '.[brax]'``); it is imported
when the first brax environment is built.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import ConfigError, EnvSpec
from evorl_pop.tasks.control import JaxEnvFamily
from evorl_pop.tasks.drawing import Trajectory
from evorl_pop.tasks.envs import check_episode_length

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

#: Physics backends. ``spring`` is the default: the cheapest per step
#: (``benchmarks/bench_brax.py --backend`` times each), which is what a
#: population of thousands of rollouts is bound by; brax's own default is the
#: more accurate ``generalized``.
BACKENDS = ("spring", "positional", "generalized", "mjx")

#: brax environments with no termination: episodes run to the time limit.
FIXED_LENGTH = frozenset({"halfcheetah", "humanoidstandup", "pusher", "reacher"})

DEFAULT_BACKEND = "spring"
DEFAULT_EPISODE_LENGTH = 1000


@contextlib.contextmanager
def quiet_brax():
    """Hides two notices no user can act on: mujoco prints "Failed to import warp" when
    MJX's optional GPU backend is absent, and brax warns, for every model it loads, that
    brax itself is no longer maintained."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Brax System, piplines", UserWarning)
        yield


def _import_brax_envs():
    try:
        with quiet_brax():
            import brax.envs
    except ImportError as err:
        raise ConfigError(
            f"brax tasks need brax, which is not installed ({err}); "
            "install it with: pip install -e '.[brax]'"
        ) from err
    return brax.envs


@flax.struct.dataclass
class BraxState:
    """A brax state with the episode's clock and its sticky end flag."""

    inner: Any  # brax.envs.State
    time: jax.Array  # int32: steps taken
    done: jax.Array  # bool: the episode has ended (fall or time limit)


class BraxEnv:
    """A brax environment, stepped without auto-reset, with a time limit.

    Args:
      name: a brax environment in :data:`BRAX_ENVS` (without the prefix).
      backend: a physics backend in :data:`BACKENDS`.
      episode_length: steps after which the episode is truncated.

    Raises:
      ValueError: brax (or, for ``mjx``, mujoco's MJX) is not installed, or
        an unknown name / backend / a non-positive episode length.
    """

    def __init__(
        self,
        name: str,
        backend: str = DEFAULT_BACKEND,
        episode_length: int = DEFAULT_EPISODE_LENGTH,
    ):
        check_choice("brax environment", name, BRAX_ENVS)
        check_choice("brax backend", backend, BACKENDS)
        check_episode_length(episode_length)
        envs = _import_brax_envs()
        if backend == "mjx":
            try:
                import mujoco.mjx  # noqa: F401
            except ImportError as err:
                raise ValueError(
                    f"backend='mjx' needs mujoco's MJX, which does not import ({err}); "
                    "pip install mujoco-mjx, or use backend='spring'."
                ) from err
        with quiet_brax():
            env = envs.get_environment(name, backend=backend)
        self._bind(env, BRAX_PREFIX + name, episode_length, terminates=name not in FIXED_LENGTH)

    def _bind(self, env, name: str, episode_length: int, terminates: bool) -> None:
        """Steps ``env``, anything with brax's ``reset`` / ``step`` and a ``State`` with
        ``obs``, ``reward`` and ``done``, its actions in ``[-1, 1]``, under ``name``."""
        self.env = env
        # Tracing a brax step takes seconds of Python, and a rollout traces it
        # in several loops (and again under vmap): jitted, it is traced once
        # per input type and its jaxpr reused. The observation's shape comes
        # from a trace too (brax's observation_size runs a reset op by op).
        self._reset = jax.jit(env.reset)
        self._step = jax.jit(env.step)
        obs = jax.eval_shape(self._reset, jax.random.key(0)).obs
        dim = int(env.action_size)
        self.spec = EnvSpec(
            name=name,
            obs_shape=tuple(obs.shape),
            discrete=False,
            action_dim=dim,
            action_low=(-1.0,) * dim,
            action_high=(1.0,) * dim,
            max_steps=int(episode_length),
            terminates=terminates,
        )

    def reset(self, key):
        inner = self._reset(key)
        # jnp.zeros_like keeps the obs's sharding type (varying inside shard_map)
        zero = jnp.zeros_like(inner.done, jnp.int32)
        return inner.obs, BraxState(inner, zero, zero.astype(bool))

    def step(self, key, state: BraxState, action):
        del key  # brax's dynamics are deterministic
        new = self._step(state.inner, action)
        inner = jax.tree.map(lambda old, x: jnp.where(state.done, old, x), state.inner, new)
        time = state.time + 1
        done = state.done | (new.done > 0) | (time >= self.spec.max_steps)
        reward = jnp.where(state.done, 0.0, new.reward).astype(jnp.float32)
        return inner.obs, BraxState(inner, time, done), reward, done


def check_choice(what: str, value: str, valid: tuple[str, ...]) -> None:
    """ValueError for a ``value`` that ``valid`` lacks (``what``: ``'brax backend'``, ...)."""
    if value not in valid:
        raise ValueError(f"Unknown {what} {value!r}; choose from {valid}.")


class BraxFamily(JaxEnvFamily):
    """brax's environments (:class:`BraxEnv`), named ``brax/<env>``."""

    description = "brax's physics in JAX: locomotion and manipulation (brax/hopper, ...)"
    pattern = BRAX_PREFIX + "<env>"
    example = BRAX_PREFIX + "inverted_pendulum"
    settings = {"backend": BACKENDS}
    drawing = "html"
    prefix, ids, env_class = BRAX_PREFIX, BRAX_ENVS, BraxEnv

    def draw(self, env: BraxEnv, episodes: Sequence[Trajectory], out: Path) -> int:
        """brax's HTML viewer of the episodes, one after the other."""
        frames = [
            jax.tree.map(lambda x, t=t: x[t], episode.states.inner.pipeline_state)
            for episode in episodes
            for t in range(len(episode.so_far))
        ]
        return write_html(env.env.sys, frames, out)


def write_html(system, frames: list, out: Path) -> int:
    """brax's HTML viewer (``brax.io.html``) of a brax ``system`` into the file ``out``.

    Args:
      system: a brax ``System``.
      frames: one state per frame, each with brax's ``x``: the position and rotation
        of every body but the world.
      out: the HTML file.

    Returns:
      The frames written.
    """
    from brax.io import html

    out.write_text(html.render(system, frames))
    return len(frames)


registry.register_env_family("brax", BraxFamily())
