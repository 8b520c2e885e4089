"""EnvPool's pools reached from a compiled program: its XLA custom calls, its specs.

A pool (:class:`Pool`) is ``envpool.make(id, num_envs=W, batch_size=W)``: ``W``
environments stepped by EnvPool's C++ threads, every one on each ``send``. Its
``recv`` and ``send`` are XLA custom calls (EnvPool's ``_xla`` targets, called
here through :func:`jax.ffi.ffi_call`), so a whole generation's episodes stay
one compiled program::

    prepare (host, once per evaluation) ─► handle
    recv(handle) ─► first observations ─► [policy ─► send ─► recv] while any runs
    send(zeros): every finished environment starts its next episode

The pool's address is a constant of the programs that step it: a pool lives as
long as its task. Its randomness is EnvPool's own: environment ``i`` draws its
starts from a generator seeded ``seed + i`` when the pool is made, one start per
reset. An environment's ``k``-th episode therefore depends on the pool's seed
and on ``k``. The task's state counts its population evaluations, and
:meth:`Pool.prepare` starts the evaluations of count ``c`` at start ``2c``
(resetting where the pool is behind), so a resumed run's fresh pool is brought
where the uninterrupted run's pool is. That is exact where every episode ends
at the time limit (every DM Control task, MuJoCo's HalfCheetah and Swimmer): each
evaluation then resets each environment once. Where episodes terminate early, a
finished environment runs on (its steps masked) and resets again, so such a
pool's position also depends on the episodes' lengths, and a resumed run's
episodes differ from the uninterrupted run's.

DM Control's observations and actions are float64: the custom calls are traced
in JAX's 64-bit mode (:func:`jax.enable_x64`) and their values cast to float32
at once, so the rest of the program keeps the run's precision.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import ConfigError, EnvSpec

#: The task names' prefix: ``envpool:CheetahRun-v1``.
ENVPOOL_PREFIX = "envpool:"
#: recv's outputs before the observations: handle, env_id, players.env_id,
#: elapsed_step, done, reward, discount, step_type, trunc.
_HEAD = 9
#: The observation fields of a task's state that are not its observation.
_INFO = "info:"


def env_type(env_id: str) -> str:
    """``'dm'`` for DM Control's ids (``CheetahRun-v1``), else ``'gymnasium'``."""
    import envpool

    spec = envpool.make_spec(env_id)
    return "dm" if "task_name" in spec.config._fields else "gymnasium"


def known(env_id: str) -> bool:
    """Whether EnvPool registers ``env_id`` (without importing it when it is not installed)."""
    try:
        import envpool
    except ImportError:
        return False
    return env_id in envpool.list_all_envs()


class Pool:
    """``W`` environments of one EnvPool id, stepped by custom calls in compiled programs.

    Args:
      env_id: EnvPool's id (``'CheetahRun-v1'``, ``'HalfCheetah-v4'``, ``'Pong-v5'``).
      width: environments (``num_envs`` and ``batch_size``).
      max_steps: the time limit (EnvPool's ``max_episode_steps``).
      seed: the pool's seed (environment ``i``: ``seed + i``).
      threads: EnvPool's threads (``0``: one per core, at most ``width``).
    """

    def __init__(self, env_id: str, width: int, max_steps: int, seed: int = 0, threads: int = 0):
        import envpool

        self.env_id, self.width, self.max_steps, self.seed = env_id, width, max_steps, seed
        self.kind = env_type(env_id)
        self.pool = envpool.make(
            env_id,
            env_type=self.kind,
            num_envs=width,
            batch_size=width,
            seed=seed,
            num_threads=threads,
            max_episode_steps=max_steps,
        )
        self.pool.async_reset()  # the first evaluation's recv takes these starts
        self.position = 0  # starts each environment has drawn before the pending ones
        self._lock = threading.Lock()
        self._calls = {}
        for name, (handle, specs, capsules) in self.pool._xla():
            self._calls[name] = _ffi(self.pool, name, specs, capsules, handle)
        self.handle = np.frombuffer(handle, np.uint8).copy()
        recv_specs = dict(self.pool._xla())["recv"][1][1]
        keys = self.pool._state_keys
        self.obs_fields = [
            (i + 1, tuple(shape))
            for i, (key, (_, shape)) in enumerate(zip(keys, recv_specs[1:], strict=True))
            if key.startswith("obs")
        ]

    def prepare(self, count, candidates=None) -> np.ndarray:
        """Brings the pool to the start of the evaluations of count ``count``: its
        environments' ``2 x count``-th starts (resetting them where it is behind, a fresh
        pool of a resumed run too), unless it is there or past it; returns the handle
        (``candidates``: what the evaluation waits for, unused).

        Two starts per count: the engine evaluates a population-based strategy's initial
        population and its first generation at count 0, every other generation at a
        count of its own; so the evaluations of a count ``c >= 1`` start at ``2c``
        whether or not an initial population was evaluated, and where a resumed run's
        fresh pool starts.
        """
        target = 2 * int(np.asarray(count).reshape(-1)[0])
        with self._lock:
            for _ in range(target - self.position):
                self.pool.recv()  # the pending starts
                self.pool.async_reset()
            self.position = max(self.position, target) + 1
        return self.handle

    def finish(self, handle) -> np.ndarray:
        """Zero, once the evaluation's last ``send`` (``handle``) has run."""
        return np.zeros((), np.float32)

    def recv(self, handle):
        """``(handle, observations (W, ...) float32, reward, done, truncated)``, rows in
        environment order."""
        with jax.enable_x64(True):
            out = self._calls["recv"](handle)
            ids = out[1]
            fields = [out[i].reshape(self.width, -1) for i, _ in self.obs_fields]
            obs = jnp.concatenate(fields, -1) if len(fields) > 1 else fields[0]
            obs = obs.astype(jnp.float32)
            order = jnp.zeros_like(ids).at[ids].set(jnp.arange(self.width, dtype=ids.dtype))
            reward = out[5].astype(jnp.float32)[order]
            return out[0], obs[order], reward, out[4][order], out[8][order]

    def send(self, handle, action, discrete: bool):
        """Sends one action per environment (rows in environment order); returns the handle."""
        ids = jnp.arange(self.width, dtype=jnp.int32)
        with jax.enable_x64(True):
            action = action.astype(jnp.int32 if discrete else jnp.float64)
            return self._calls["send"](handle, ids, ids, action)

    def close(self) -> None:
        self.pool.close()


def _ffi(pool, name: str, specs, capsules, handle: bytes):
    """One of EnvPool's custom calls, registered under a name of its own; sequential under
    ``vmap`` (a run's replicas axis, of size one)."""
    import sys

    from jax import ffi

    in_specs, out_specs = specs
    out = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for dtype, shape in out_specs)
    target = f"evorl_pop_envpool_{id(pool)}_{name}"
    ffi.register_ffi_target(target, capsules[0], platform="cpu", api_version=1)
    if capsules[1] is not None:
        ffi.register_ffi_target(target, capsules[1], platform="gpu", api_version=1)
    call = ffi.ffi_call(
        target,
        out if len(out) > 1 else out[0],
        has_side_effect=True,
        input_layouts=tuple(tuple(range(len(shape))) for _, shape in in_specs),
        output_layouts=tuple(tuple(range(len(s.shape))) for s in out)
        if len(out) > 1
        else tuple(range(len(out[0].shape))),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    value = int.from_bytes(handle, byteorder=sys.byteorder, signed=False)
    return lambda *args: call(*args, handle=value)


def pool_spec(env_id: str, name: str, episode_length: int | None) -> tuple[EnvSpec, str]:
    """``(spec, layout)`` of an EnvPool id, read from its registered spec (no pool made);
    ``layout``: ``'flat'`` (observations concatenated) or ``'image'`` (Atari's frames).

    Raises:
      ConfigError: an unknown id, or EnvPool not installed.
    """
    if not known(env_id):
        raise ConfigError(
            f"task: {name!r} is not an EnvPool id (envpool.list_all_envs() lists them; "
            "EnvPool itself: pip install -e '.[envpool]')."
        )
    import envpool
    import gymnasium as gym

    spec = envpool.make_spec(env_id)
    limit = int(spec.config.max_episode_steps)
    max_steps = episode_length or limit
    action = spec.gymnasium_action_space
    space = spec.gymnasium_observation_space
    if isinstance(space, gym.spaces.Dict):
        shapes = [s.shape for key, s in space.spaces.items() if not key.startswith(_INFO)]
        obs_shape: tuple[int, ...] = (int(sum(int(np.prod(s)) for s in shapes)),)
        layout = "flat"
    elif len(space.shape) == 3:
        channels, height, width = space.shape  # stacked frames, seen as channels last
        obs_shape, layout = (height, width, channels), "image"
    else:
        obs_shape, layout = (int(np.prod(space.shape)),), "flat"
    terminates = env_type(env_id) != "dm" and not env_id.startswith(_TIME_LIMIT_ONLY)
    if isinstance(action, gym.spaces.Discrete):
        env_spec = EnvSpec(name, obs_shape, True, int(action.n), None, None, max_steps, terminates)
    else:
        low = tuple(float(x) for x in np.broadcast_to(action.low, action.shape))
        high = tuple(float(x) for x in np.broadcast_to(action.high, action.shape))
        dim = int(np.prod(action.shape))
        env_spec = EnvSpec(name, obs_shape, False, dim, low, high, max_steps, terminates)
    return env_spec, layout


#: Gymnasium-style MuJoCo tasks whose episodes end only at the time limit.
_TIME_LIMIT_ONLY = ("HalfCheetah", "Swimmer", "Reacher", "Pusher")

__all__ = ["ENVPOOL_PREFIX", "Pool", "env_type", "known", "pool_spec"]
