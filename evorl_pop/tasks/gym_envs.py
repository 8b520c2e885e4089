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

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.core.interfaces import Env
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.drawing import Trajectory, write_gif
from evorl_pop.tasks.envs import check_episode_length
from evorl_pop.tasks.gym_make import (
    GYM_PREFIX,
    JAX_SETTINGS,
    Flattened,
    episode_seeds,
    probe,
    registered_factory,
    start_seed,
)
from evorl_pop.tasks.obs_norm import ObsMoments
from evorl_pop.tasks.rollout import EpisodeStats
from evorl_pop.tasks.vector_pool import VECTOR_MODES, VectorPool, Words, made_quietly


class GymTask(ControlTask):
    """Neuroevolution of a JAX policy on a Gymnasium environment stepped on the host.

    A :class:`~evorl_pop.tasks.control.ControlTask` (mean return over ``episodes``
    episodes, optional observation normalisation) whose episodes run on the
    host's :class:`~evorl_pop.tasks.vector_pool.VectorPool` (see the module docstring).
    """

    def __init__(
        self,
        env: str | Callable,
        episode_length: int | None = None,
        vector: str = "sync",
        name: str | None = None,
        **settings,
    ):
        """Builds the task; one environment is made here, to read its spaces.

        Args:
          env: a registered Gymnasium id (``'CartPole-v1'``, with or without
            ``gym:``) or a factory ``() -> gymnasium.Env`` (picklable by
            cloudpickle for ``vector='async'``).
          episode_length: the time limit (``None``: the environment's
            ``max_episode_steps``; a factory's environment must have one).
          vector: ``'sync'`` (``SyncVectorEnv``: every episode of a device's
            slice stepped in turn, in this process) or ``'async'``
            (``AsyncVectorEnv``: a worker process per episode).
          name: the task's name (default ``gym:<id>``).
          **settings: the policy and its evaluation, as
            :class:`~evorl_pop.tasks.control.ControlTask`'s ``hidden_sizes``,
            ``activation``, ``episodes``, ``normalize_obs``, ``policy_module``,
            ``policy`` and ``transitions`` (its collecting evaluations keep every
            step's transition, for CEM-RL's and ERL's learner).

        Raises:
          ConfigError: an unknown id, or an environment whose simulator (Box2D,
            MuJoCo) is not installed.
          ValueError: spaces a policy cannot use (Box and Discrete only; Box
            actions bounded), no time limit, a bad ``vector``, or a setting of
            environments stepped in JAX (:data:`JAX_SETTINGS`).
        """

        check_episode_length(episode_length)
        if isinstance(env, str):
            env_id = env.removeprefix(GYM_PREFIX)
            factory = registered_factory(env_id, episode_length)
            name = name or GYM_PREFIX + env_id
        elif callable(env):
            factory = Flattened(env)
            name = name or GYM_PREFIX + getattr(env, "__name__", type(env).__name__)
        else:
            raise ValueError(f"env must be a Gymnasium id or a factory, got {type(env).__name__}.")
        for key in JAX_SETTINGS:
            if settings.get(key) not in (None, False):
                raise ValueError(
                    f"{key} applies to environments stepped in JAX; {name} steps on the host."
                )
        spec, one_hot = probe(factory, name, episode_length)
        self.pool = VectorPool(factory, spec, vector, one_hot)
        self._host = None  # the lanes of collecting evaluations, made by the first
        # the spec is all ControlTask reads of its environment
        super().__init__(self.pool, **settings)
        self.pool.moments = self.normalize_obs  # the host sums what the normaliser takes in

    def _collect(self, solution, key, task_state, episodes: int):
        """The episodes with their transitions (``transitions=True``: CEM-RL's actors),
        stepped on the host by :func:`~evorl_pop.tasks.host_lanes.collect_episodes`."""
        from evorl_pop.tasks.host_lanes import collect_episodes

        params = self.unravel(solution)

        def act(obs):
            return jax.vmap(self.policy, (None, 0))(params, obs)

        obs_norm = task_state if self.normalize_obs else None
        return collect_episodes(self.host_envs(), act, key, episodes, obs_norm)

    def explore(self, params, key: jax.Array, noise_std: float) -> Any:
        """One episode of the policy ``params`` with Gaussian action noise of ``noise_std``
        half action ranges, its transitions collected (ERL's exploration)."""
        from evorl_pop.tasks.host_lanes import collect_episodes

        def act(obs):
            return jax.vmap(self.policy, (None, 0))(params, obs)

        reset_key, noise_key = jax.random.split(key)
        episodes = collect_episodes(
            self.host_envs(), act, reset_key, 1, noise_std=noise_std, noise_key=noise_key
        )
        return jax.tree.map(lambda x: x[0], episodes)

    def host_envs(self):
        """The host lanes of the collecting evaluations
        (:class:`~evorl_pop.tasks.host_lanes.HostEnvs`), made by the first."""
        from evorl_pop.tasks.host_lanes import HostEnvs

        if self._host is None:
            self._host = HostEnvs(self.name, self.spec.max_steps, factory=self.pool.factory)
        return self._host

    def _batch_episodes(self, solutions, keys, task_state, episodes) -> EpisodeStats:
        # one host rollout for the whole slice already: its callbacks take the vmap
        one = lambda x, k: self._episodes(x, k, task_state, episodes)  # noqa: E731
        return jax.vmap(one)(solutions, keys)

    def _episodes(self, solution, key, task_state, episodes) -> EpisodeStats:
        """The episodes of one candidate, run by the host (one rollout per device under vmap)."""
        spec = self.spec
        obs_norm = task_state if self.normalize_obs else None
        # a copy per episode, as evaluate_episodes makes: each episode's action is then a
        # product of its own (not one matrix product of all), the same float for float
        # whatever the batch, as a plain Gymnasium loop computes it
        params = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (episodes, *x.shape)), self.unravel(solution)
        )
        f32 = jnp.float32
        i32 = jnp.int32
        u32 = jnp.uint32
        at = Words(episodes, int(np.prod(spec.obs_shape, dtype=int)))
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
        moments = None
        if obs_norm is not None:
            moments = ObsMoments(
                field(words, at.count, f32)[0],
                field(words, at.total, f32).reshape(spec.obs_shape),
                field(words, at.total_sq, f32).reshape(spec.obs_shape),
            )
        return EpisodeStats(
            episode_return=field(words, at.returns, f32).mean(),
            steps=field(words, at.steps, i32).sum(),
            episodes=jnp.int32(episodes),
            moments=moments,
        )


def _frame(env, name: str) -> np.ndarray:
    """The environment's ``rgb_array`` frame; ValueError when it cannot draw (MuJoCo without
    an OpenGL library), saying what to install: the run itself is unaffected."""
    try:
        return np.asarray(env.render())
    except Exception as err:  # OpenGL's, MuJoCo's, PyOpenGL's errors have no common class
        raise ValueError(
            f"{name} could not draw a frame ({type(err).__name__}: {err}). MuJoCo draws "
            "through OpenGL: MUJOCO_GL=egl (apt-get install libegl1) or MUJOCO_GL=osmesa "
            "(apt-get install libosmesa6); the run folder is unaffected."
        ) from None


def play(task: GymTask, solution, key: jax.Array, task_state, episodes: int) -> list:
    """A candidate's evaluation episodes replayed by a plain Gymnasium loop (each reset
    with its :func:`episode_seeds`), drawn by the environment (``render_mode='rgb_array'``).

    Args:
      task: the task.
      solution: the candidate's flat weights.
      key: its evaluation key (episode ``j``: ``split(key, episodes)[j]``).
      task_state: the task's observation statistics (used where it normalises).
      episodes: how many.

    Returns:
      Per episode ``(Trajectory, return)``: its states the frames drawn after each
        step, its return summed as the task sums it.

    Raises:
      ValueError: the environment draws no ``rgb_array`` frames, or cannot draw them.
    """
    params = task.unravel(solution)
    obs_norm = task_state if task.normalize_obs else None

    @jax.jit
    def act(obs):
        return task.policy(params, obs if obs_norm is None else obs_norm.normalize(obs))

    seeds = np.asarray(episode_seeds(key, episodes))
    return _play(task.pool.factory, task.pool.one_hot, task.spec, act, seeds)


def play_acting(acting, factory: Callable, one_hot: bool, key: jax.Array, episodes: int):
    """:func:`play` of a learner's deterministic policy on a Gymnasium environment.

    Args:
      acting: the policy (:class:`~evorl_pop.core.interfaces.Acting`); ``acting.env``'s
        ``spec`` is the environment's.
      factory: the environment's factory.
      one_hot: whether a Discrete observation is seen one-hot.
      key: the episodes' key (episode ``j`` resets with :func:`episode_seeds`'s seed ``j``).
      episodes: how many.

    Returns:
      As :func:`play`.
    """
    obs_norm = acting.obs_norm

    @jax.jit
    def act(obs):
        return acting.policy(acting.params, obs if obs_norm is None else obs_norm.normalize(obs))

    seeds = np.asarray(episode_seeds(key, episodes))
    return _play(factory, one_hot, acting.env.spec, act, seeds)


def _play(factory: Callable, one_hot: bool, spec: EnvSpec, act: Callable, seeds) -> list:
    """Episodes of ``act`` (observation to action, in JAX), one per seed, drawn."""
    env = made_quietly(functools.partial(factory, render_mode="rgb_array"))
    if env.render_mode != "rgb_array":
        raise ValueError(f"{spec.name} draws no rgb_array frames: there is nothing to render.")
    space = env.action_space
    runs = []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=int(seed))
            frames, observations, so_far, total = [], [], [], 0.0
            for _ in range(spec.max_steps):
                seen = np.asarray(obs, np.float32)
                if one_hot:
                    seen = np.eye(spec.obs_shape[0], dtype=np.float32)[obs - space.start]
                action = np.asarray(act(seen))
                if spec.discrete:
                    action = int(action.reshape(-1)[0]) + int(space.start)
                else:
                    action = action.reshape(space.shape).astype(space.dtype)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                frames.append(_frame(env, spec.name)[::2, ::2])  # the GIF's size
                observations.append(seen)
                so_far.append(np.float32(total))
                if terminated or truncated:
                    break
            trajectory = Trajectory(np.stack(frames), np.stack(observations), np.asarray(so_far))
            runs.append((trajectory, float(np.float32(total))))
    finally:
        env.close()
    return runs


class GymFamily:
    """Every Gymnasium environment, ``gym:<id>``: a :class:`GymTask` each, stepped on the
    host (an :class:`~evorl_pop.core.interfaces.EnvFamily` without JAX environments)."""

    description = (
        "any Gymnasium environment, stepped on the host (every algorithm): gym:ID for "
        "any id of gymnasium.registry, e.g. gym:CartPole-v1, gym:LunarLander-v3"
    )
    pattern = GYM_PREFIX + "<Gymnasium id>"
    example = GYM_PREFIX + "Pendulum-v1"
    settings = {"vector": VECTOR_MODES}
    steps_in_jax = False
    drawing = "gif"

    def names(self) -> tuple[str, ...]:
        return ()  # any id of Gymnasium's registry, checked when its task is made

    def owns(self, name: str) -> bool:
        return name.startswith(GYM_PREFIX)

    def make_env(self, name: str, **settings) -> Env:
        raise ValueError(
            f"{name} steps on the host: it makes tasks (make_task), not environments stepped "
            "in JAX."
        )

    def make_task(self, name: str, **kwargs) -> GymTask:
        return GymTask(name, **kwargs)

    def draw(self, env: Env, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF of the frames the environment drew (:func:`play`)."""
        return write_gif(env, episodes, out, pictures=lambda frames: frames)


registry.register_env_family("gym", GymFamily())

__all__ = [
    "GYM_PREFIX",
    "Flattened",
    "GymFamily",
    "GymTask",
    "VECTOR_MODES",
    "VectorPool",
    "episode_seeds",
    "play",
    "play_acting",
    "probe",
    "registered_factory",
    "start_seed",
]
