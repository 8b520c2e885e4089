"""EnvPool's environments as ES tasks, stepped by EnvPool's threads inside the compiled generation.

A task ``envpool:<id>`` (``envpool:CheetahRun-v1``, DM Control's;
``envpool:HalfCheetah-v4``, Gymnasium-style MuJoCo; ``envpool:Pong-v5``, Atari)
runs a population's episodes in one EnvPool pool of ``W`` environments, ``W``
the padded population times the episodes per candidate: candidate ``i``'s
episode ``j`` is environment ``i x episodes + j``. Each step of the compiled
loop is one policy evaluation of the whole population and EnvPool's ``send``
and ``recv`` custom calls (:mod:`evorl_pop.tasks.envpool_pool`)::

    recv ─► observations (W, ...) ─► policies (vmap over W) ─► send ─► recv ...
    a slot's return and steps count until its first done (EnvPool resets a
    finished environment at once and runs it on, masked); the loop stops when
    every slot has finished; one last send starts every next episode

Done is EnvPool's ``done``: a termination, or truncation at the time limit
(``episode_length``, else the id's own). On several devices the pool is one,
on the host of device 0: each device's slice is gathered, device 0 steps the
whole population, and each device takes its slice of the results back. The
pool, its environments and the actions they receive are then the same on 1
and 2 devices, so are the episodes.

The episodes are EnvPool's: they depend on the pool's seed (``0``; environment
``i``: ``i``) and on how many starts its environments have drawn, not on the
evaluation keys. The task's state counts its population evaluations, and the
evaluations of a count begin at a start of their own, where a resumed run's
fresh pool is brought (:meth:`~evorl_pop.tasks.envpool_pool.Pool.prepare`; the
module says where this is exact). The population is evaluated whole
(``eval_mode='vmap'``); ``'map'`` evaluates one candidate at a time, each in
the pool of single evaluations, drawing more starts per count than a resumed
run skips to. ``evorl-pop render`` replays the policy in the same
task through Gymnasium (DM Control's through shimmy), whose starts are not
EnvPool's. The learners, which reset single lanes with keys of their own, and
so the hybrids and PBT, take other families' tasks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import flax
import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.core.interfaces import Env
from evorl_pop.distributed import POP_AXIS_NAME
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.drawing import Trajectory, write_gif
from evorl_pop.tasks.envpool_pool import ENVPOOL_PREFIX, Pool, env_type, known, pool_spec
from evorl_pop.tasks.envs import check_episode_length
from evorl_pop.tasks.obs_norm import ObsMoments, ObsNorm
from evorl_pop.tasks.rollout import EpisodeStats


@flax.struct.dataclass
class EnvPoolState:
    """An EnvPool task's state: its observation normaliser (or ``None``) and the
    population evaluations so far (where a resumed run's pool starts)."""

    obs_norm: ObsNorm | None
    evaluations: jax.Array

    def normalize(self, obs):
        """The normaliser's view of ``obs`` (``obs`` itself without one)."""
        return obs if self.obs_norm is None else self.obs_norm.normalize(obs)


class _Replay:
    """What ``evorl-pop render`` replays the task with: Gymnasium's same task."""

    one_hot = False

    def __init__(self, env_id: str, episode_length: int | None):
        self.env_id, self.episode_length = env_id, episode_length

    def factory(self, **kwargs):
        from evorl_pop.tasks.gym_make import registered_factory

        return registered_factory(gymnasium_id(self.env_id), self.episode_length)(**kwargs)


def gymnasium_id(env_id: str) -> str:
    """Gymnasium's id of the task an EnvPool id names: ``CheetahRun-v1`` ->
    ``dm_control/cheetah-run-v0``, ``Pong-v5`` -> ``ALE/Pong-v5``, others as they are."""
    import envpool

    config = envpool.make_spec(env_id).config
    if env_type(env_id) == "dm":
        task = config.task_name
        camel = "".join(part.capitalize() for part in task.split("_"))
        domain = env_id.split("-")[0].removesuffix(camel)
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", domain).lower()
        return f"dm_control/{snake}-{task}-v0"
    if "img_height" in config._fields:
        return "ALE/" + env_id
    return env_id


class EnvPoolTask(ControlTask):
    """Neuroevolution of a JAX policy on an EnvPool task (see the module docstring).

    Args:
      env: EnvPool's id, with or without ``envpool:``.
      episode_length: the time limit (``None``: the id's own).
      threads: EnvPool's threads (``0``: one per core).
      **settings: :class:`~evorl_pop.tasks.control.ControlTask`'s ``hidden_sizes``,
        ``activation``, ``episodes``, ``normalize_obs``, ``policy_module`` and ``policy``.

    Raises:
      ConfigError: an unknown id, or EnvPool not installed.
      ValueError: ``transitions`` (a learner's collecting evaluations).
    """

    def __init__(self, env: str, episode_length: int | None = None, threads: int = 0, **settings):
        check_episode_length(episode_length)
        if settings.get("transitions"):
            raise ValueError(f"{env} steps in EnvPool's pools, which keep no transitions.")
        for key in ("lanes", "virtual_batch_norm", "backend", "impl"):
            if settings.get(key) not in (None, False):
                raise ValueError(f"{key} applies to environments stepped in JAX, not {env}.")
            settings.pop(key, None)
        self.env_id = env.removeprefix(ENVPOOL_PREFIX)
        name = ENVPOOL_PREFIX + self.env_id
        spec, self.layout = pool_spec(self.env_id, name, episode_length)
        self.threads = threads
        self.pools: dict[tuple[str, int], Pool] = {}
        self.pool = _Replay(self.env_id, episode_length)
        super().__init__(_SpecOnly(spec), **settings)

    def init_state(self):
        obs_norm = ObsNorm.create(self.spec.obs_shape) if self.normalize_obs else None
        return EnvPoolState(obs_norm, jnp.int32(0))

    def update_state(self, task_state: EnvPoolState, info_total):
        obs_norm = task_state.obs_norm
        if obs_norm is not None:
            obs_norm = obs_norm.merge(info_total.moments)
        return EnvPoolState(obs_norm, task_state.evaluations + 1)

    def policy_params(self, solution, obs_norm):
        return self.unravel(solution)

    def _pool(self, role: str, width: int) -> Pool:
        pool = self.pools.get((role, width))
        if pool is None:
            pool = Pool(self.env_id, width, self.spec.max_steps, threads=self.threads)
            self.pools[role, width] = pool
        return pool

    def _episodes(self, solution, key, task_state, episodes) -> EpisodeStats:
        stats = self._gathered("single", solution[None], task_state, episodes)
        return jax.tree.map(lambda x: x[0], stats)

    def _batch_episodes(self, solutions, keys, task_state, episodes) -> EpisodeStats:
        return self._gathered("population", solutions, task_state, episodes)

    def _gathered(self, role, solutions, task_state, episodes) -> EpisodeStats:
        """Every device's ``solutions`` stepped in one pool by device 0; this device's
        slice of the results (without a device axis: all of them)."""
        try:
            devices = jax.lax.axis_size(POP_AXIS_NAME)
        except NameError:
            devices = 1
        if devices == 1:
            return self._run(role, solutions, task_state, episodes)
        n = solutions.shape[0]
        everyone = jax.lax.all_gather(solutions, POP_AXIS_NAME, tiled=True)
        shapes = jax.eval_shape(lambda s: self._run(role, s, task_state, episodes), everyone)
        index = jax.lax.axis_index(POP_AXIS_NAME)
        stats = jax.lax.cond(
            index == 0,
            lambda s: self._run(role, s, task_state, episodes),
            lambda s: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes),
            everyone,
        )
        stats = jax.lax.psum(stats, POP_AXIS_NAME)  # device 0's, exactly
        return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, index * n, n), stats)

    def _run(self, role, solutions, task_state: EnvPoolState, episodes) -> EpisodeStats:
        """The episodes of candidates ``solutions`` (all of them), ``episodes`` each."""
        spec = self.spec
        count = solutions.shape[0]
        width = count * episodes
        pool = self._pool(role, width)
        obs_norm = task_state.obs_norm if self.normalize_obs else None
        params = jax.vmap(self.unravel)(solutions)
        params = jax.tree.map(lambda x: jnp.repeat(x, episodes, axis=0), params)
        # the candidates passed along: an evaluation starts after the one that made them
        first = solutions.reshape(count, -1)[:, :1]
        handle_shape = jax.ShapeDtypeStruct(pool.handle.shape, jnp.uint8)
        handle = jax.experimental.io_callback(
            pool.prepare, handle_shape, task_state.evaluations, first
        )
        handle, obs, _, _, _ = pool.recv(handle)
        obs = self._observe(obs)
        f32 = jnp.float32
        zeros = jnp.zeros((width,), f32)
        moments = None  # raw observation sums, where the task normalises
        if self.normalize_obs:
            shape = (width, *spec.obs_shape)
            moments = ObsMoments(zeros, jnp.zeros(shape), jnp.zeros(shape))

        def step(carry):
            handle, obs, alive, returns, steps, sums = carry
            seen = obs if obs_norm is None else obs_norm.normalize(obs)
            action = jax.vmap(self.policy)(params, seen).reshape(width, -1)
            action = action[:, 0] if spec.discrete else action
            handle = pool.send(handle, action, spec.discrete)
            handle, next_obs, reward, done, _ = pool.recv(handle)
            live = alive.astype(f32)
            mask = live.reshape(width, *[1] * len(spec.obs_shape))
            if sums is not None:
                sums = ObsMoments(
                    sums.count + live, sums.total + obs * mask, sums.total_sq + obs**2 * mask
                )
            returns = returns + jnp.where(alive, reward, 0.0)
            steps = steps + alive.astype(jnp.int32)
            return handle, self._observe(next_obs), alive & ~done, returns, steps, sums

        alive = jnp.ones((width,), bool)
        carry = (handle, obs, alive, zeros, jnp.zeros((width,), jnp.int32), moments)
        handle, *_, returns, steps, sums = jax.lax.while_loop(lambda c: c[2].any(), step, carry)
        zero = jnp.zeros((width, spec.action_dim) if not spec.discrete else (width,), f32)
        handle = pool.send(handle, zero, spec.discrete)  # every finished one starts anew
        # the results wait for that send: the next evaluation's recv takes its starts
        after = jax.experimental.io_callback(pool.finish, jax.ShapeDtypeStruct((), f32), handle)
        returns = returns + after

        def per_candidate(x, reduce):
            return reduce(x.reshape(count, episodes, *x.shape[1:]), axis=1)

        moments = jax.tree.map(lambda x: per_candidate(x, jnp.sum), sums)
        return EpisodeStats(
            episode_return=per_candidate(returns, jnp.mean),
            steps=per_candidate(steps, jnp.sum),
            episodes=jnp.full((count,), episodes, jnp.int32),
            moments=moments,
        )

    def _observe(self, obs):
        if self.layout == "image":  # stacked frames (C, H, W) as (H, W, C) in [0, 1]
            height, width, channels = self.spec.obs_shape
            obs = obs.reshape(-1, channels, height, width).transpose(0, 2, 3, 1) / 255.0
        return obs

    def _collect(self, solution, key, task_state, episodes: int):
        raise ValueError(f"{self.name} steps in EnvPool's pools, which keep no transitions.")


class _SpecOnly:
    """The environment a ControlTask reads of an EnvPool task: its spec."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec


class EnvPoolFamily:
    """Every EnvPool task, ``envpool:<id>``: an :class:`EnvPoolTask` each (an
    :class:`~evorl_pop.core.interfaces.EnvFamily` without JAX environments or learner lanes)."""

    description = (
        "EnvPool's tasks, stepped by its C++ threads inside the compiled generation "
        "(ES algorithms): envpool:ID, e.g. envpool:CheetahRun-v1, envpool:HalfCheetah-v4"
    )
    pattern = ENVPOOL_PREFIX + "<EnvPool id>"
    example = ENVPOOL_PREFIX + "CheetahRun-v1"
    settings: dict[str, tuple[str, ...]] = {}
    steps_in_jax = False
    #: One pool per program (core.capabilities.Pooled): no learner lanes, no replicas.
    pooled = True
    drawing = "gif"

    def names(self) -> tuple[str, ...]:
        return ()  # any id of EnvPool's registry, checked when its task is made

    def owns(self, name: str) -> bool:
        return name.startswith(ENVPOOL_PREFIX) and known(name.removeprefix(ENVPOOL_PREFIX))

    def make_env(self, name: str, **settings) -> Env:
        raise ValueError(f"{name} steps in EnvPool's pools: it makes tasks (make_task).")

    def make_task(self, name: str, **kwargs) -> EnvPoolTask:
        return EnvPoolTask(name, **kwargs)

    def draw(self, env: Env, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF of the frames Gymnasium's same task drew."""
        return write_gif(env, episodes, out, pictures=lambda frames: frames)


registry.register_env_family("envpool", EnvPoolFamily())

__all__ = ["EnvPoolFamily", "EnvPoolState", "EnvPoolTask", "gymnasium_id"]
