"""Any Gymnasium environment as an ES task: JAX policies, environments stepped on the host.

A task ``gym:<id>`` (``gym:CartPole-v1``, ``gym:LunarLander-v3``,
``gym:HalfCheetah-v5``), or :class:`GymTask` on any ``gymnasium.Env``
factory, keeps the policy a JAX network and the whole generation compiled;
only the environment runs in Python, reached through host callbacks. Each
device steps its own slice of the population, every episode of the slice in
one Gymnasium vector environment (``SyncVectorEnv``, or ``AsyncVectorEnv``
with a worker process per episode)::

    a device's slice: n candidates x E episodes = W episodes, one host rollout
      reset:  seeds (n, E) from the episodes' keys ─► host: lease a vector env of
              width W, reset(seed=seeds) ─► words (n, size)
      step:   policy(params, obs) in JAX ─► host: vec.step(actions); returns,
              step counts, ends and observation sums kept on the host
              ─► words (n, size)   (while any episode runs)
      words:  each candidate's observations, lease id, running flag, and, once
              the last episode ends (the vector env back in the pool), its
              returns, steps and observation sums, as raw 32-bit words

The episodes follow :func:`~evorl_pop.tasks.rollout.rollout`'s rules (a step counts
and pays while its episode runs, ``done`` sticky, the loop stops as the last
episode ends), but the bookkeeping is the host's: each step of the compiled
loop is one policy evaluation and one host callback, what a hand-written
loop does, and the loop stops at the very step the last episode ends. Each
callback has ``vmap_method='expand_dims'``, so under the engine's ``vmap``
the host sees a device's whole slice in one call. Each callback takes one
argument and returns one array, and the step that ends the last episode also
returns the episodes' results (no callback of its own): JAX puts every
argument into an array of its own (``jax.device_put``, tens of microseconds)
before the callback sees it, and converts and checks every result on its way
back, fixed costs per step that a cheap environment's step (CartPole: some 10
microseconds an episode) does not hide.

Episode ``j`` of candidate ``i`` is reset with a seed drawn from
``fold_in(generation key, i)`` (:func:`episode_seeds`): results do not
depend on the device count, and a resumed run continues exactly. Under
``jax.distributed`` each process steps the environments of its own devices
(a device's callbacks run on its own process's host). Gymnasium itself comes
with gymnax; the simulators of its Box2D and MuJoCo environments are the
extra ``pip install -e '.[gymnasium]'``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import warnings
from collections.abc import Callable, Sequence

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import ConfigError, EnvSpec, ObjectiveError, did_you_mean
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.envs import GYM_PREFIX, VECTOR_MODES
from evorl_pop.tasks.playground_envs import mujoco_notices
from evorl_pop.tasks.rollout import EpisodeStats, ObsMoments

#: Sync vector envs step one at a time per process: Python steps them under the
#: GIL anyway, and two devices' callbacks stepping at once fight over it (each
#: MuJoCo step releases it and waits to take it back), so that together they
#: step slower than one at a time.
_SYNC_STEPPING = threading.Lock()


def registered_factory(env_id: str, episode_length: int | None = None, **kwargs) -> Callable:
    """A factory of the registered Gymnasium environment ``env_id``.

    Args:
      env_id: a Gymnasium id (``'CartPole-v1'``).
      episode_length: its time limit instead of the registered one.
      **kwargs: passed to ``gymnasium.make``.

    Returns:
      ``() -> gymnasium.Env`` (picklable, for worker processes).

    Raises:
      ConfigError: ``env_id`` is not registered (with the nearest ids).
    """
    if env_id not in gym.registry:
        hint = did_you_mean(env_id, gym.registry, 3)
        raise ConfigError(
            f"Unknown Gymnasium environment {env_id!r}.{hint} Any id of "
            "gymnasium.registry works as gym:ID (gymnasium.pprint_registry() lists them)."
        )
    if episode_length is not None:
        kwargs["max_episode_steps"] = int(episode_length)
    return functools.partial(gym.make, env_id, **kwargs)


def _space_error(name: str, role: str, space) -> ValueError:
    return ValueError(
        f"{name}: its {role} space {space} is not supported; Gymnasium tasks take Box "
        "(bounded, for actions) or Discrete spaces."
    )


def _spec(name: str, env, episode_length: int | None) -> EnvSpec:
    """The :class:`EnvSpec` of a Gymnasium environment; ValueError for spaces a policy cannot use.

    A Discrete observation is seen one-hot (``obs_shape == (n,)``).
    """
    spaces = gym.spaces
    obs_space, act_space = env.observation_space, env.action_space
    if isinstance(obs_space, spaces.Discrete):
        obs_shape = (int(obs_space.n),)
    elif isinstance(obs_space, spaces.Box):
        obs_shape = tuple(obs_space.shape)
    else:
        raise _space_error(name, "observation", obs_space)
    if isinstance(act_space, spaces.Discrete):
        discrete, dim, low, high = True, int(act_space.n), None, None
    elif isinstance(act_space, spaces.Box) and act_space.is_bounded("both"):
        discrete, dim = False, int(np.prod(act_space.shape))
        low = tuple(np.asarray(act_space.low, np.float32).ravel().tolist())
        high = tuple(np.asarray(act_space.high, np.float32).ravel().tolist())
    else:
        raise _space_error(name, "action", act_space)
    limit = episode_length or getattr(env.spec, "max_episode_steps", None)
    if limit is None:
        raise ValueError(
            f"{name} has no time limit (no max_episode_steps): give it an episode_length."
        )
    return EnvSpec(name, obs_shape, discrete, dim, low, high, int(limit), terminates=True)


def _made_quietly(factory: Callable):
    """``factory()`` without MuJoCo 4's deprecation notices on Gymnasium's model files (one
    line per environment made); module-level, so worker processes can unpickle it."""
    with mujoco_notices():
        return factory()


def _seed(key: jax.Array) -> jax.Array:
    return jax.random.bits(key, (), jnp.uint32)


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
    return jax.vmap(lambda k: _seed(jax.random.split(k)[1]))(jax.random.split(key, episodes))


class _Words:
    """Where each field lies in a candidate's row of the one uint32 array a callback returns.

    One array rather than a tuple, as each result of a host callback costs a
    conversion and a check on its way back; the float32 and int32 fields are
    their raw bits (``bitcast_convert_type`` in JAX, a ``view`` on the host).

    Args:
      episodes: the candidate's episodes.
      obs_size: the elements of one observation.
    """

    def __init__(self, episodes: int, obs_size: int):
        fields = dict(obs=episodes * obs_size, lease=1, running=1, returns=episodes,
                      steps=episodes, count=1, total=obs_size, total_sq=obs_size)  # fmt: skip
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
        self.vec, self.batch, self.obs = vec, seeds_shape[:-1], obs
        self.candidates = int(np.prod(self.batch, dtype=int))
        self.words = _Words(seeds_shape[-1], int(np.prod(spec.obs_shape, dtype=int)))
        space = vec.single_action_space  # read once: its shape, dtype and first action
        if spec.discrete:
            self.action_shape, self.action_dtype = (-1,), np.int64
            self.action_start = int(space.start)
        else:
            self.action_shape, self.action_dtype = (-1, *space.shape), space.dtype
            self.action_start = 0
        self.running = np.ones(width, bool)
        self.time = 0
        self.returns, self.steps = np.zeros(width), np.zeros(width, np.int32)
        self.count = np.zeros(width)
        self.total, self.total_sq = np.zeros_like(obs, float), np.zeros_like(obs, float)


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
        self.factory, self.spec, self.vector = factory, spec, vector
        self.one_hot, self.moments = one_hot, moments
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
        fns = [functools.partial(_made_quietly, self.factory)] * width
        mode = gym.vector.AutoresetMode.NEXT_STEP  # an ended episode's env idles in resets
        if self.vector == "sync":
            return gym.vector.SyncVectorEnv(fns, copy=False, autoreset_mode=mode)
        # Forked, not spawned: a spawned (or forkserver) worker runs the main
        # module again, seconds per worker for a script that imports JAX, and the
        # whole script for one without a __main__ guard. JAX warns about any fork;
        # the workers run Gymnasium alone, never JAX, and the one lock they take
        # (MuJoCo's notices, :func:`mujoco_notices`) is new in every forked child.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            return gym.vector.AsyncVectorEnv(fns, copy=False, autoreset_mode=mode, context="fork")

    def _failed(self, what: str, err: Exception, vec=None) -> ObjectiveError:
        if vec is not None:  # in an unknown state: not reused
            vec.close()
        return ObjectiveError(f"The environment {self.spec.name!r} raised {type(err).__name__} "
                              f"in {what}: {err}")  # fmt: skip

    def _observations(self, vec, obs) -> np.ndarray:
        if self.one_hot:
            return self._eye[np.asarray(obs) - int(vec.single_observation_space.start)]
        return np.asarray(obs, np.float32)

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        """Leases a vector env of ``seeds.size`` episodes; resets episode ``k`` with ``seeds[k]``.

        Args:
          seeds: shape ``batch + (episodes,)``: the episodes of each candidate.

        Returns:
          The words (uint32, ``batch + (size,)``, laid out as :class:`_Words`):
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
        """The lease's words (see :class:`_Words`); ends the lease if no episode runs."""
        at, n = lease.words, lease.candidates
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
        at, n, per_episode = lease.words, lease.candidates, lease.batch + (-1,)
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
            self._free, self._leases = {}, {}
        for vec in envs:
            vec.close()


class GymTask(ControlTask):
    """Neuroevolution of a JAX policy on a Gymnasium environment stepped on the host.

    A :class:`~evorl_pop.tasks.control.ControlTask` (mean return over ``episodes``
    episodes, optional observation normalisation) whose episodes run on the
    host's :class:`VectorPool` (see the module docstring).
    """

    def __init__(
        self,
        env: str | Callable,
        hidden_sizes: Sequence[int] = (32,),
        activation: str = "tanh",
        episodes: int = 1,
        normalize_obs: bool = False,
        policy_module=None,
        episode_length: int | None = None,
        policy: str = "auto",
        vector: str = "sync",
        name: str | None = None,
    ):
        """Builds the task; one environment is made here, to read its spaces.

        Args:
          env: a registered Gymnasium id (``'CartPole-v1'``, with or without
            ``gym:``) or a factory ``() -> gymnasium.Env`` (picklable by
            cloudpickle for ``vector='async'``).
          hidden_sizes, activation, episodes, normalize_obs, policy_module,
            policy: as :class:`~evorl_pop.tasks.control.ControlTask`.
          episode_length: the time limit (``None``: the environment's
            ``max_episode_steps``; a factory's environment must have one).
          vector: ``'sync'`` (``SyncVectorEnv``: every episode of a device's
            slice stepped in turn, in this process) or ``'async'``
            (``AsyncVectorEnv``: a worker process per episode).
          name: the task's name (default ``gym:<id>``).

        Raises:
          ConfigError: an unknown id, or an environment whose simulator (Box2D,
            MuJoCo) is not installed.
          ValueError: spaces a policy cannot use (Box and Discrete only; Box
            actions bounded), no time limit, or a bad ``vector``.
        """
        if episode_length is not None and episode_length < 1:
            raise ValueError(f"episode_length must be at least 1, got {episode_length}.")
        if isinstance(env, str):
            env_id = env.removeprefix(GYM_PREFIX)
            factory = registered_factory(env_id, episode_length)
            name = name or GYM_PREFIX + env_id
        elif callable(env):
            factory = env
            name = name or GYM_PREFIX + getattr(env, "__name__", type(env).__name__)
        else:
            raise ValueError(f"env must be a Gymnasium id or a factory, got {type(env).__name__}.")
        try:
            probe = _made_quietly(factory)
        except gym.error.DependencyNotInstalled as err:
            raise ConfigError(
                f"{name} needs a simulator that is not installed ({err}); install "
                "Gymnasium's Box2D and MuJoCo environments with: pip install -e '.[gymnasium]'"
            ) from err
        try:
            spec = _spec(name, probe, episode_length)
            one_hot = isinstance(probe.observation_space, gym.spaces.Discrete)
        finally:
            probe.close()
        self.pool = VectorPool(factory, spec, vector, one_hot, moments=normalize_obs)
        super().__init__(
            self.pool,  # the spec is all ControlTask reads of its environment
            hidden_sizes=hidden_sizes,
            activation=activation,
            episodes=episodes,
            normalize_obs=normalize_obs,
            policy_module=policy_module,
            policy=policy,
        )

    def _collect(self, solution, key, task_state, episodes: int):
        raise ValueError(
            f"{self.name} steps on the host and keeps no transitions: the algorithms with "
            "learners (CEM-RL, ERL, PBT) take environments stepped in JAX."
        )

    def _batch_episodes(self, solutions, keys, task_state, episodes) -> EpisodeStats:
        # one host rollout for the whole slice already: its callbacks take the vmap
        one = lambda x, k: self._episodes(x, k, task_state, episodes)  # noqa: E731
        return jax.vmap(one)(solutions, keys)

    def _episodes(self, solution, key, task_state, episodes) -> EpisodeStats:
        """The episodes of one candidate, run by the host (one rollout per device under vmap)."""
        spec, obs_norm = self.spec, task_state if self.normalize_obs else None
        # a copy per episode, as evaluate_episodes makes: each episode's action is then a
        # product of its own (not one matrix product of all), the same float for float
        # whatever the batch, as a plain Gymnasium loop computes it
        params = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (episodes, *x.shape)), self.unravel(solution)
        )
        f32, i32, u32 = jnp.float32, jnp.int32, jnp.uint32
        at = _Words(episodes, int(np.prod(spec.obs_shape, dtype=int)))
        words_shape = jax.ShapeDtypeStruct((at.size,), u32)

        def host(fn, arg):  # expand_dims: under vmap, one call for the whole slice
            return jax.pure_callback(fn, words_shape, arg, vmap_method="expand_dims")

        def field(words, where, dtype):
            return jax.lax.bitcast_convert_type(words[where], dtype)

        def step(words):
            obs = field(words, at.obs, f32).reshape(episodes, *spec.obs_shape)
            seen = obs if obs_norm is None else obs_norm.normalize(obs)
            action = jax.vmap(self.policy)(params, seen)
            action = action.reshape(episodes, -1).astype(i32 if spec.discrete else f32)
            ids = jnp.broadcast_to(words[at.lease], (episodes, 1))
            return host(self.pool.step, jnp.concatenate([field(action, ..., u32), ids], -1))

        words = host(self.pool.reset, episode_seeds(key, episodes))
        words = jax.lax.while_loop(lambda w: w[at.running][0] != 0, step, words)
        returns, steps = field(words, at.returns, f32), field(words, at.steps, i32)
        sums = (field(words, at.count, f32)[0], field(words, at.total, f32).reshape(spec.obs_shape),
                field(words, at.total_sq, f32).reshape(spec.obs_shape))  # fmt: skip
        return EpisodeStats(
            episode_return=returns.mean(),
            steps=steps.sum(),
            episodes=jnp.int32(episodes),
            moments=ObsMoments(*sums) if obs_norm is not None else None,
        )


__all__ = [
    "GYM_PREFIX",
    "GymTask",
    "VECTOR_MODES",
    "VectorPool",
    "episode_seeds",
    "registered_factory",
]
