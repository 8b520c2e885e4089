"""The host's Gymnasium vector environments, leased to the rollouts of Gymnasium tasks.

A Gymnasium task (:class:`~evorl_pop.tasks.gym_envs.GymTask`) runs a device's
slice of episodes as one host rollout: its :meth:`VectorPool.reset` leases a
vector env as wide as the slice's episodes, each :meth:`VectorPool.step` steps
every episode of it at once, and the step that ends the last episode returns
what the episodes earned and the vector env to the pool. What crosses from the
host to JAX is one uint32 array per call, laid out by :class:`Words`.
Gymnasium is imported when the first vector env is made.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import warnings
from collections.abc import Callable

import numpy as np

from evorl_pop.base import EnvSpec, ObjectiveError
from evorl_pop.tasks.playground_envs import mujoco_notices

#: Gymnasium's vector environments: in this process, or a worker process per episode.
VECTOR_MODES = ("sync", "async")

#: Sync vector envs step one at a time per process: Python steps them under the
#: GIL anyway, and two devices' callbacks stepping at once fight over it (each
#: MuJoCo step releases it and waits to take it back), so that together they
#: step slower than one at a time.
_SYNC_STEPPING = threading.Lock()


def made_quietly(factory: Callable):
    """``factory()`` without MuJoCo 4's deprecation notices on Gymnasium's model files (one
    line per environment made); module-level, so worker processes can unpickle it."""
    with mujoco_notices():
        return factory()


class Words:
    """Where each field lies in a candidate's row of the one uint32 array a callback returns.

    One array rather than a tuple, as each result of a host callback costs a
    conversion and a check on its way back; the float32 and int32 fields are
    their raw bits (``bitcast_convert_type`` in JAX, a ``view`` on the host).

    Args:
      episodes: the candidate's episodes.
      obs_size: the elements of one observation.
    """

    def __init__(self, episodes: int, obs_size: int):
        fields = {
            "obs": episodes * obs_size,
            "lease": 1,
            "running": 1,
            "returns": episodes,
            "steps": episodes,
            "count": 1,
            "total": obs_size,
            "total_sq": obs_size,
        }
        start = 0
        for name, size in fields.items():
            setattr(self, name, slice(start, start + size))
            start += size
        self.size = start


class _Lease:
    """One rollout's vector env and the bookkeeping of its episodes (float64 sums).

    Args:
      vec: the vector env.
      seeds_shape: ``batch + (episodes,)``.
      obs: what the policy sees next (float32, one row per episode).
      spec: the environments' :class:`EnvSpec`.
    """

    def __init__(self, vec, seeds_shape: tuple[int, ...], obs: np.ndarray, spec: EnvSpec):
        width = vec.num_envs
        self.vec = vec
        self.batch = seeds_shape[:-1]
        self.obs = obs
        self.candidates = int(np.prod(self.batch, dtype=int))
        self.words = Words(seeds_shape[-1], int(np.prod(spec.obs_shape, dtype=int)))
        space = vec.single_action_space  # read once: its shape, dtype and first action
        if spec.discrete:
            self.action_shape = (-1,)
            self.action_dtype = np.int64
            self.action_start = int(space.start)
        else:
            self.action_shape = (-1, *space.shape)
            self.action_dtype = space.dtype
            self.action_start = 0
        self.running = np.ones(width, bool)
        self.time = 0
        self.returns = np.zeros(width)
        self.steps = np.zeros(width, np.int32)
        self.count = np.zeros(width)
        self.total = np.zeros_like(obs, float)
        self.total_sq = np.zeros_like(obs, float)


class VectorPool:
    """The host's Gymnasium vector environments, leased to rollouts by width.

    A rollout's :meth:`reset` leases a vector env of its width (made on first
    need, then reused) and :meth:`step` steps it; the step that ends its last
    episode returns what its episodes earned and the env to the pool. Devices
    whose callbacks run at once lease different envs. Errors of the
    environment reach the run as one :class:`~evorl_pop.base.ObjectiveError` line.

    Args:
      factory: ``() -> gymnasium.Env``.
      spec: the environments' :class:`EnvSpec`.
      vector: ``'sync'`` or ``'async'`` (a worker process per episode).
      one_hot: the observations are Discrete: the policy sees them one-hot.
      moments: sum the observations (for a running normaliser).
    """

    def __init__(
        self, factory: Callable, spec: EnvSpec, vector="sync", one_hot=False, moments=False
    ):
        if vector not in VECTOR_MODES:
            raise ValueError(f"vector must be one of {VECTOR_MODES}, got {vector!r}.")
        self.factory = factory
        self.spec = spec
        self.vector = vector
        self.one_hot = one_hot
        self.moments = moments
        self._eye = np.eye(spec.obs_shape[0], dtype=np.float32) if one_hot else None
        self._stepping = _SYNC_STEPPING if vector == "sync" else contextlib.nullcontext()
        self._free: dict[int, list] = {}
        self._leases: dict[int, _Lease] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def make_vector_env(self, width: int):
        """A new vector env, as the pool makes them.

        Args:
          width: its episodes (sub-environments).

        Returns:
          A ``SyncVectorEnv`` or ``AsyncVectorEnv`` whose ended episodes idle in
            resets (Gymnasium's next-step autoreset) until the next ``reset``.
        """
        import gymnasium as gym  # imported once a rollout needs an environment

        fns = [functools.partial(made_quietly, self.factory)] * width
        mode = gym.vector.AutoresetMode.NEXT_STEP  # an ended episode's env idles in resets
        if self.vector == "sync":
            return gym.vector.SyncVectorEnv(fns, copy=False, autoreset_mode=mode)
        # Forked, not spawned: a spawned (or forkserver) worker runs the main
        # module again, seconds per worker for a script that imports JAX, and the
        # whole script for one without a __main__ guard. JAX warns about any fork;
        # the workers run Gymnasium alone, never JAX, and the one lock they take
        # (MuJoCo's notices, playground_envs.mujoco_notices) is new in every forked child.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            return gym.vector.AsyncVectorEnv(fns, copy=False, autoreset_mode=mode, context="fork")

    def _failed(self, what: str, err: Exception, vec=None) -> ObjectiveError:
        if vec is not None:  # in an unknown state: not reused
            vec.close()
        return ObjectiveError(
            f"The environment {self.spec.name!r} raised {type(err).__name__} in {what}: {err}"
        )

    def _observations(self, vec, obs) -> np.ndarray:
        if self.one_hot:
            return self._eye[np.asarray(obs) - int(vec.single_observation_space.start)]
        return np.asarray(obs, np.float32)

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        """Leases a vector env of ``seeds.size`` episodes; resets episode ``k`` with ``seeds[k]``.

        Args:
          seeds: shape ``batch + (episodes,)``: the episodes of each candidate.

        Returns:
          The words (uint32, ``batch + (size,)``, laid out as :class:`Words`):
            each candidate's first observations, the lease id, running.
        """
        seeds = np.asarray(seeds)  # JAX hands callbacks its own arrays
        width = seeds.size
        with self._lock:
            free = self._free.get(width)
            vec = free.pop() if free else None
            lease_id = next(self._ids) % (2**31 - 1)
        try:
            vec = vec or self.make_vector_env(width)
            obs, _ = vec.reset(seed=[int(s) for s in seeds.reshape(-1)])
        except Exception as err:
            raise self._failed("reset", err, vec) from err
        lease = _Lease(vec, seeds.shape, self._observations(vec, obs), self.spec)
        with self._lock:
            self._leases[lease_id] = lease
        return self._words(lease, lease_id)

    def step(self, words: np.ndarray) -> np.ndarray:
        """Steps every episode of a lease with its action (all of them at once).

        Args:
          words: shape ``batch + (episodes, action words + 1)``: each episode's
            action as raw 32-bit words (float32 continuous, int32 discrete), then
            the lease id; one argument, as each argument of a host callback costs
            a copy (about as much as a small environment's step).

        Returns:
          The words (as :meth:`reset`'s): the next observations and whether any
            episode of the lease is still running (the same for every candidate);
            once none is, the episodes' returns, steps and observation sums, the
            vector env back in the pool.
        """
        words = np.asarray(words)  # JAX hands callbacks its own arrays
        lease_id = int(words.flat[-1])  # the same for every episode
        lease = self._leases[lease_id]
        actions = np.ascontiguousarray(words[..., :-1]).view(
            np.int32 if self.spec.discrete else np.float32
        )
        actions = actions.reshape(lease.action_shape).astype(lease.action_dtype)
        if lease.action_start:
            actions += lease.action_start
        running = lease.running
        if self.moments:  # of the observations the policy saw while its episode ran
            seen = np.where(running[:, None], lease.obs.reshape(len(running), -1), 0.0)
            lease.count += running
            lease.total += seen.reshape(lease.total.shape)
            lease.total_sq += (seen**2).reshape(lease.total.shape)
        try:
            with self._stepping:
                obs, reward, terminated, truncated, _ = lease.vec.step(actions)
        except Exception as err:
            with self._lock:
                del self._leases[lease_id]
            raise self._failed("step", err, lease.vec) from err
        lease.time += 1
        lease.returns += np.where(running, reward, 0.0)
        lease.steps += running
        lease.running = running & ~(terminated | truncated) & (lease.time < self.spec.max_steps)
        lease.obs = self._observations(lease.vec, obs)
        return self._words(lease, lease_id)

    def _words(self, lease: _Lease, lease_id: int) -> np.ndarray:
        """The lease's words (see :class:`Words`); ends the lease if no episode runs."""
        at = lease.words
        n = lease.candidates
        out = np.zeros((n, at.size), np.uint32)
        floats = out.view(np.float32)
        floats[:, at.obs] = lease.obs.reshape(n, -1)
        out[:, at.lease] = lease_id
        running = lease.running.any()
        out[:, at.running] = running
        if not running:
            self._finish(lease, lease_id, out)
        return out.reshape(lease.batch + (at.size,))

    def _finish(self, lease: _Lease, lease_id: int, out: np.ndarray) -> None:
        """Ends a lease: writes its episodes' returns and steps, its candidates' observation
        sums (float32, int32, float32) into ``out``; the vector env goes back to the pool."""
        with self._lock:
            del self._leases[lease_id]
            self._free.setdefault(lease.vec.num_envs, []).append(lease.vec)
        at = lease.words
        n = lease.candidates
        per_episode = lease.batch + (-1,)
        floats = out.view(np.float32)
        floats[:, at.returns] = lease.returns.reshape(n, -1).astype(np.float32)
        out.view(np.int32)[:, at.steps] = lease.steps.reshape(n, -1)
        if not self.moments:
            return

        def per_candidate(x):  # summed over each candidate's episodes
            x = x.reshape(per_episode + self.spec.obs_shape).sum(len(lease.batch))
            return x.astype(np.float32).reshape(n, -1)

        floats[:, at.count] = lease.count.reshape(per_episode).sum(-1).reshape(n, 1)
        floats[:, at.total] = per_candidate(lease.total)
        floats[:, at.total_sq] = per_candidate(lease.total_sq)

    def close(self) -> None:
        """Closes every vector env (worker processes too)."""
        with self._lock:
            envs = [v for vs in self._free.values() for v in vs]
            envs += [lease.vec for lease in self._leases.values()]
            self._free = {}
            self._leases = {}
        for vec in envs:
            vec.close()
