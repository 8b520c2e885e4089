"""The data-parallel layout of a learner: its mesh, the splits it needs, where its state lives.

A learner (PPO, SAC) keeps its networks, optimizer states and replay buffer
replicated on every device of a one-dimensional ``DP`` mesh, and its batch of
environments split over it: each device steps its contiguous slice of the
environments and differentiates its contiguous slice of every minibatch. Its
config extends :class:`LearnerConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop.base import ConfigError, check_config
from evorl_pop.core.engine import make_mesh
from evorl_pop.rl import replay, vec_env
from evorl_pop.tasks.envs import check_environment
from evorl_pop.tasks.rollout import evaluate_episodes


def dp_mesh(mesh: Mesh | None) -> Mesh:
    """A one-dimensional ``DP`` mesh over the devices of ``mesh``.

    Args:
      mesh: a mesh with the axis ``'DP'`` (kept as it is) or ``'POP'`` (the run
        machinery's, whose devices are reused), or ``None`` for one device.

    Returns:
      A mesh with the single axis ``'DP'``.

    Raises:
      ConfigError: a mesh with neither axis.
    """
    axis = dist.DP_AXIS_NAME
    if mesh is None:
        return make_mesh(1, axis_name=axis)
    if tuple(mesh.axis_names) == (axis,):
        return mesh
    if dist.POP_AXIS_NAME not in mesh.axis_names:
        raise ConfigError(
            f"The mesh has axes {tuple(mesh.axis_names)}; a learner splits its environments "
            f"and minibatches over {axis!r}: build it with evorl_pop.make_mesh(n, axis_name="
            f"{axis!r})."
        )
    return Mesh(mesh.devices.reshape(-1), (axis,))  # the learners check their own splits


def check_split(name: str, value: int, num_devices: int, what: str) -> None:
    """ConfigError unless ``num_devices`` divides ``value``, naming values that would.

    Args:
      name: the setting to change, e.g. ``'num_envs'``.
      value: its value (or a value computed from it).
      num_devices: the devices of the ``DP`` axis.
      what: what is split, for the message (``'the environments'``).
    """
    if value % num_devices:
        lower = value // num_devices * num_devices
        options = " or ".join(str(v) for v in (lower, lower + num_devices) if v > 0)
        raise ConfigError(
            f"{what} ({value}) are split over {num_devices} devices, so they must be a multiple "
            f"of {num_devices} (e.g. {options}): change {name} or the device count."
        )


def place(tree: Any, mesh: Mesh, split: bool) -> Any:
    """Pins ``tree`` replicated, or split along its leading axis over ``'DP'``.

    ``init`` and ``step`` leave the state in one layout, so that the next call
    sees the same input shardings and reuses its compilation.

    Args:
      tree: a pytree of arrays.
      mesh: the ``DP`` mesh.
      split: split the leading axis over the devices (on one device,
        replicated: jit reports both the same way there).

    Returns:
      ``tree`` with a sharding constraint (inside ``jit``) or placed (outside).
    """
    spec = P(dist.DP_AXIS_NAME) if split and mesh.size > 1 else P()
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, spec))


def state_specs(state_class: type) -> Any:
    """``shard_map`` specs of a learner's state class: its ``envs`` split over
    ``'DP'``, every other field replicated."""
    specs = {field.name: P() for field in dataclasses.fields(state_class)}
    return state_class(**{**specs, "envs": P(dist.DP_AXIS_NAME)})


def place_state(state: Any, mesh: Mesh) -> Any:
    """:func:`place` of a learner's state: ``state.envs`` split, the rest replicated."""
    envs = place(state.envs, mesh, split=True)
    return place(state.replace(envs=()), mesh, split=False).replace(envs=envs)


def advance(state: Any, metrics: dict, steps: int, mesh: Mesh) -> tuple[Any, dict]:
    """Closes a learner's step: one more ``generation``; the metrics count ``steps``.

    Args:
      state: the state after the step (its ``generation``, an int32).
      metrics: the step's metrics.
      steps: environment steps the step took.
      mesh: the ``DP`` mesh.

    Returns:
      ``(state, metrics)``: the state placed by :func:`place_state`, the
        metrics with this step's ``env_steps``.
    """
    state = state.replace(generation=state.generation + 1)
    return place_state(state, mesh), {**metrics, "env_steps": jnp.int32(steps)}


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The settings every learner on a ``DP`` mesh has (PPO's and SAC's configs add theirs).

    Attributes:
      task: an environment (gymnax, e.g. ``'CartPole-v1'``, or ``'brax/hopper'``).
      num_envs: environments stepped together, split over the devices.
      unroll_length: steps of every environment per step of the learner.
      episode_length: steps before an episode is truncated (``null``: the task's).
      backend: brax's physics backend (``null``: evorl_pop's default, spring).
    """

    task: str = "CartPole-v1"
    num_envs: int = 32
    unroll_length: int = 64
    episode_length: int | None = None
    backend: str | None = None

    #: The learner's searchable settings, traced: a flax struct with ``create(**values)``
    #: whose fields are settings of the config (``Hyperparameters``).
    HYPERPARAMETERS = None

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        least = {"num_envs": 1, "unroll_length": 1, "episode_length": 1}
        check_environment(self.task, type(self).__module__.rpartition(".")[2])
        check_config(self, least=least)

    def hyperparameters(self) -> Any:
        """The searchable settings as traced scalars (:func:`traced_settings`)."""
        return traced_settings(self.HYPERPARAMETERS, self)


def traced_settings(cls: type, config: Any) -> Any:
    """``cls.create`` of ``config``'s values of ``cls``'s fields: a learner's searchable
    settings (its ``Hyperparameters``) as traced scalars."""
    return cls.create(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


class DataParallel:
    """What the learners on a ``DP`` mesh share (PPO, SAC): their environments and
    mesh, :meth:`init` and :meth:`step`.

    A subclass calls this constructor, defines ``fresh(key) -> state`` (one
    member's state, where it was computed), ``local_step(state, key, axis) ->
    (state, metrics)`` (a step on this device's lanes) and ``acting(state)`` (its
    deterministic policy, :class:`~evorl_pop.core.interfaces.Acting`), and calls
    :meth:`shard_steps` once built.

    Args:
      config: the learner's config (a :class:`LearnerConfig`).
      mesh: a mesh with the axis ``'DP'`` or ``'POP'`` (``evorl_pop.make_mesh(n)``),
        or ``None`` for one device.

    Raises:
      ConfigError: a setting that cannot run, or environments or minibatches
        that the device count does not divide.
    """

    def __init__(self, config: LearnerConfig, mesh: Mesh | None = None):
        config.validate()
        self.config = config
        self.envs = vec_env.make_envs(config.task, config.episode_length, config.backend)
        self.env = self.envs.env
        self.mesh = dp_mesh(mesh)
        check_split("num_envs", config.num_envs, self.mesh.size, "The environments")

    def unroll(
        self, envs: Any, act: Callable, key: jax.Array, dp_axis_name: str | None = None
    ) -> tuple[Any, tuple[jax.Array, Any, Any]]:
        """``unroll_length`` steps of this device's environments under a policy.

        Args:
          envs: this device's lanes (a learner state's ``envs``).
          act: ``act(obs, keys) -> (actions, recorded)``, one key per lane.
          key: the step's collection key, the same on every device.
          dp_axis_name: the axis the lanes are split over, or ``None``.

        Returns:
          ``(envs, (obs, recorded, result))``: the lanes after the unroll, and their
            observations, what ``act`` recorded and the environments' step results
            (:class:`~evorl_pop.tasks.rollout.StepResult`), leaves ``(unroll_length,
            local_envs, ...)``.
        """
        index = replay.global_batch_index(envs.steps.shape[0], dp_axis_name)
        return self.envs.unroll(envs, act, key, self.config.unroll_length, index)

    def shard_steps(self, state_class: type) -> None:
        """Makes :meth:`step` run ``local_step`` on every device's lanes, in ``shard_map``."""
        specs = state_specs(state_class)
        self._sharded_step = jax.shard_map(
            self.local_step,
            mesh=self.mesh,
            in_specs=(specs, P()),
            out_specs=(specs, P()),
            check_vma=False,  # brax's scans start from constants the checks would reject
        )

    def init(self, key: jax.Array) -> Any:
        """:meth:`fresh`'s state laid out as :meth:`step` returns it (``envs`` split over
        ``'DP'``, the rest replicated).

        Args:
          key: PRNG key; environment ``i`` starts from ``fold_in`` of it with ``i``.
        """
        return place_state(self.fresh(key), self.mesh)

    def step(self, state: Any, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        """One step of the learner, every device on its lanes: ``num_envs x
        unroll_length`` environment steps, then its updates.

        Args:
          state: the learner's state.
          key: PRNG key of this step.

        Returns:
          ``(state, metrics)``, as :func:`advance`: ``fitness_*`` over the returns of
            the environments' last finished episodes (NaN before any has finished
            one), ``episodes`` finished and ``env_steps`` taken this step, and the
            learner's mean losses (its class docstring names them).
        """
        state, metrics = self._sharded_step(state, key)
        steps = self.config.num_envs * self.config.unroll_length
        return advance(state, metrics, steps, self.mesh)

    @functools.partial(jax.jit, static_argnames=("self", "num_episodes"))
    def evaluate(self, state: Any, key: jax.Array, num_episodes: int = 10) -> jax.Array:
        """The mean return of the deterministic policy (``acting(state)``, which a
        subclass defines) over ``num_episodes`` episodes; a float32 scalar."""
        acting = self.acting(state)
        return evaluate_episodes(
            acting.env, acting.policy, acting.params, key, num_episodes,
            episode_length=acting.episode_length,
        ).episode_return  # fmt: skip
