"""brax physics environments behind the :class:`~evorl_pop.tasks.envs.Env` protocol.

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
actuator ranges rescale internally).

brax is an optional dependency (``pip install -e '.[brax]'``); it is imported
when the first brax environment is built.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop.base import ConfigError, EnvSpec

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
def _quiet():
    """Hides two notices no user can act on: mujoco prints "Failed to import warp" when
    MJX's optional GPU backend is absent, and brax warns, for every model it loads, that
    brax itself is no longer maintained."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Brax System, piplines", UserWarning)
        yield


def _import_brax_envs():
    try:
        with _quiet():
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
        if name not in BRAX_ENVS:
            raise ValueError(f"Unknown brax environment {name!r}; choose from {BRAX_ENVS}.")
        if backend not in BACKENDS:
            raise ValueError(f"Unknown brax backend {backend!r}; choose from {BACKENDS}.")
        if episode_length < 1:
            raise ValueError(f"episode_length must be at least 1, got {episode_length}.")
        envs = _import_brax_envs()
        if backend == "mjx":
            try:
                import mujoco.mjx  # noqa: F401
            except ImportError as err:
                raise ValueError(
                    f"backend='mjx' needs mujoco's MJX, which does not import ({err}); "
                    "pip install mujoco-mjx, or use backend='spring'."
                ) from err
        with _quiet():
            self.env = envs.get_environment(name, backend=backend)
        dim = int(self.env.action_size)
        # Tracing a brax step takes seconds of Python, and a rollout traces it
        # in several loops (and again under vmap): jitted, it is traced once
        # per input type and its jaxpr reused. The observation's shape comes
        # from a trace too (brax's observation_size runs a reset op by op).
        self._reset, self._step = jax.jit(self.env.reset), jax.jit(self.env.step)
        obs = jax.eval_shape(self._reset, jax.random.key(0)).obs
        self.spec = EnvSpec(
            name=BRAX_PREFIX + name,
            obs_shape=(int(obs.shape[-1]),),
            discrete=False,
            action_dim=dim,
            action_low=(-1.0,) * dim,
            action_high=(1.0,) * dim,
            max_steps=int(episode_length),
            terminates=name not in FIXED_LENGTH,
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
