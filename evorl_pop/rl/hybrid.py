"""The base the hybrid evolutionary-RL algorithms (CEM-RL, ERL) share.

Both keep one population of actors sharded over the ``POP`` mesh axis, one
shared replay buffer, and TD3 with minibatches split over a ``DP`` axis of a
mesh on the same devices. One generation of either is built from the pieces
of :class:`Hybrid`::

    state ─► the algorithm's operators ─► flat actors (pop × num_params)
          ─► [learning gate: TD3 on the shared buffer, else NaN losses]
          ─► rollout: one episode per actor, sharded P('POP'); its steps
             go into the buffer; statistics from evorl_pop.stats
          ─► the algorithm's update (fit the CEM / train the learner)
          ─► evaluate: the algorithm's actor without noise
          ─► advance: fitness, generation and the exact step count

What differs stays in the algorithm's file: CEM-RL samples and fits a
distribution (:mod:`evorl_pop.algorithms.cemrl`); ERL selects, crosses,
mutates and injects its learner (:mod:`evorl_pop.algorithms.erl`). This
module also builds the pair of meshes and the data-parallel TD3 training
function, and checks configurations with messages that say what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop.counter import Count
from evorl_pop.envs import make_env
from evorl_pop.mesh import make_mesh
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.rollout import (
    PopulationRollout,
    evaluate,
    example_transition,
    population_rollout,
)
from evorl_pop.rl.td3 import TD3, TD3Config, TD3State, check_continuous


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Settings every hybrid algorithm has (each algorithm's ``Config`` adds its own).

    Attributes:
      task: a continuous-action environment.
      population_size: actors evaluated per generation.
      num_elites: the best actors the algorithm keeps or fits to.
      learning_starts: buffer size before gradient updates begin.
      buffer_capacity: replay buffer size.
      episode_steps: steps per episode (``None``: the environment's limit).
      eval_episodes: noise-free episodes to evaluate the algorithm's actor
        each generation (``eval_return``).
      td3: TD3 hyper-parameters (network sizes, learning rates, batch size).
    """

    task: str = "Pendulum-v1"
    population_size: int = 10
    num_elites: int = 2
    learning_starts: int = 2000
    buffer_capacity: int = 200_000
    episode_steps: int | None = None
    eval_episodes: int = 5
    td3: TD3Config = TD3Config(critic_hidden_sizes=(128, 128), batch_size=128)


@flax.struct.dataclass
class HybridState:
    """What every hybrid algorithm carries between generations."""

    population: Any  # the last evaluated population, leaves shape=(population_size, ...)
    fitness: jax.Array  # shape=(population_size,): its returns (NaN / inf as -inf)
    buffer: ReplayBuffer  # the shared replay buffer
    generation: jax.Array  # int32: generations evaluated so far
    env_steps: Count  # environment steps so far, exact past 2**31


class Hybrid:
    """Set-up and generation pieces shared by the hybrid algorithms.

    An algorithm checks its own settings, calls this ``__init__``, and writes
    its ``init`` and ``step`` from :meth:`initial_state`, :meth:`learning`,
    :meth:`train_if`, :meth:`rollout`, :meth:`evaluate` and :meth:`advance`.

    Args:
      config: the algorithm's config (a :class:`HybridConfig`).
      mesh: a mesh with the axis ``'POP'`` (``evorl_pop.make_mesh(n)``), or
        ``None`` for one device. TD3 minibatches are split over the same
        devices along a ``'DP'`` axis.
      algorithm: the algorithm's name for error messages.
      num_updates: TD3 iterations per call of ``self.train``.

    Raises:
      ValueError: for a discrete-action environment, a buffer smaller than a
        batch, or a batch size the device count does not divide.
    """

    def __init__(self, config: HybridConfig, mesh: Mesh | None, algorithm: str, num_updates: int):
        self.config = config
        self.env = make_env(config.task)
        check_continuous(self.env.spec, algorithm)
        check_buffer(config.buffer_capacity, config.td3.batch_size, config.learning_starts)
        self.pop_mesh, self.dp_mesh = make_meshes(mesh)
        check_batch_split(config.td3.batch_size, self.dp_mesh.size)
        self.td3 = TD3(self.env.spec, config.td3)
        self.policy = self.td3.policy
        flat, self._unravel = ravel_pytree(self.policy.init(jax.random.key(0)))
        self.num_params = flat.shape[0]
        self.train = dp_train(self.td3, self.dp_mesh, num_updates)

    def unravel(self, flat: jax.Array) -> Any:
        """Actor parameters from a flat vector (vectorise with ``jax.vmap``)."""
        return self._unravel(flat)

    def initial_state(self, state_class: type, population: Any, **fields) -> HybridState:
        """A state of ``state_class`` before the first generation.

        Args:
          state_class: the algorithm's :class:`HybridState` subclass.
          population: the initial actors, leaves shape ``(population_size, ...)``.
          **fields: the algorithm's own fields.

        Returns:
          The state with fitness -inf, an empty buffer and zero counters,
          replicated as ``step`` returns it (so its second call reuses the
          compilation).
        """
        state = state_class(
            population=population,
            fitness=jnp.full((self.config.population_size,), -jnp.inf, jnp.float32),
            buffer=ReplayBuffer.create(example_transition(self.env), self.config.buffer_capacity),
            generation=jnp.int32(0),
            env_steps=Count.zero(),
            **fields,
        )
        return replicated(state, self.pop_mesh)

    def learning(self, buffer: ReplayBuffer) -> jax.Array:
        """The learning gate: whether ``buffer`` holds enough data for TD3 updates."""
        cfg = self.config
        return buffer.size >= max(cfg.learning_starts, cfg.td3.batch_size)

    def train_if(self, learn: jax.Array, train: Callable, *operands):
        """``train(*operands)`` once learning has started.

        Args:
          learn: the gate (:meth:`learning`).
          train: returns ``(*new_operands, losses)``, ``losses`` holding
            ``critic_loss`` and ``actor_loss``.
          *operands: what ``train`` updates.

        Returns:
          ``train(*operands)``, or the operands unchanged with NaN losses.
        """
        nan = jnp.float32(jnp.nan)
        skip = lambda *ops: (*ops, {"critic_loss": nan, "actor_loss": nan})  # noqa: E731
        return jax.lax.cond(learn, train, skip, *operands)

    def rollout(
        self, flat: jax.Array, buffer: ReplayBuffer, key: jax.Array
    ) -> tuple[Any, PopulationRollout, ReplayBuffer]:
        """One noise-free episode per actor, sharded over ``'POP'``; the steps fill the buffer.

        Args:
          flat: the actors, shape ``(population_size, num_params)``.
          buffer: the shared replay buffer.
          key: PRNG key; actor ``i`` uses ``fold_in(key, i)``.

        Returns:
          ``(population, rollout, buffer)``: the actors' parameters, the
          :class:`~evorl_pop.rl.rollout.PopulationRollout` and the buffer with
          every valid step added.
        """
        population = jax.vmap(self.unravel)(flat)
        rollout = population_rollout(
            self.env, self.policy, self.pop_mesh, population, key, 0.0, self.config.episode_steps
        )
        return population, rollout, buffer.add(rollout.transitions, rollout.valid)

    def evaluate(self, params: Any, key: jax.Array) -> jax.Array:
        """Mean noise-free return of one actor over ``eval_episodes`` episodes."""
        cfg = self.config
        return evaluate(self.env, self.policy, params, key, cfg.eval_episodes, cfg.episode_steps)

    def advance(
        self,
        state: HybridState,
        population: Any,
        rollout: PopulationRollout,
        buffer: ReplayBuffer,
        metrics: dict[str, jax.Array],
        **fields,
    ) -> tuple[HybridState, dict[str, jax.Array]]:
        """Closes a generation: the evaluated population, its fitness, the counters.

        Args:
          state: the state the generation started from.
          population: the evaluated actors.
          rollout: their rollout.
          buffer: the buffer after the generation.
          metrics: the algorithm's metrics; they override the rollout's (an
            ``env_steps`` here counts every step of the generation).
          **fields: the algorithm's own new fields.

        Returns:
          ``(state, metrics)``: the state replicated as :meth:`initial_state`
          lays it out; the metrics are the algorithm's and the population
          statistics (``fitness_best``, ``fitness_mean``, ``fitness_worst``,
          ``fitness_std``, ``num_nonfinite``, ``env_steps``, ``episodes`` of
          this generation).
        """
        metrics = {**rollout.metrics, **metrics}
        state = state.replace(
            population=population,
            fitness=rollout.fitness,
            buffer=buffer,
            generation=state.generation + 1,
            env_steps=state.env_steps.add(metrics["env_steps"]),
            **fields,
        )
        return replicated(state, self.pop_mesh), metrics


def make_meshes(mesh: Mesh | None) -> tuple[Mesh, Mesh]:
    """The population mesh and a data-parallel mesh over the same devices.

    Args:
      mesh: a mesh with the axis ``'POP'``, or ``None`` for one device.

    Returns:
      ``(pop_mesh, dp_mesh)``: one-dimensional meshes with the axes ``'POP'``
      and ``'DP'``.

    Raises:
      ValueError: when ``mesh`` has no ``'POP'`` axis.
    """
    if mesh is None:
        mesh = make_mesh(1)
    if dist.POP_AXIS_NAME not in mesh.axis_names:
        raise ValueError(
            f"The mesh has axes {tuple(mesh.axis_names)}, but the population is sharded "
            f"over an axis named {dist.POP_AXIS_NAME!r}: build it with "
            "evorl_pop.make_mesh(num_devices)."
        )
    devices = list(mesh.devices.flat)
    pop_mesh = make_mesh(len(devices), axis_name=dist.POP_AXIS_NAME, devices=devices)
    dp_mesh = make_mesh(len(devices), axis_name=dist.DP_AXIS_NAME, devices=devices)
    return pop_mesh, dp_mesh


def replicated(tree, mesh: Mesh):
    """Pins every leaf of ``tree`` as replicated over ``mesh``.

    An algorithm's state leaves ``step`` (and ``init``) with this one layout, so
    the next call sees the same input shardings and reuses its compilation.

    Args:
      tree: a pytree of arrays.
      mesh: the mesh to replicate over.

    Returns:
      ``tree``, replicated (inside ``jit`` a sharding constraint).
    """
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, P()))


def dp_train(
    td3: TD3, dp_mesh: Mesh, num_updates: int
) -> Callable[[TD3State, ReplayBuffer, jax.Array], tuple[TD3State, dict]]:
    """TD3 training with each minibatch split over the ``DP`` axis of ``dp_mesh``.

    Args:
      td3: the TD3 learner definition.
      dp_mesh: a mesh with the axis ``'DP'``.
      num_updates: TD3 iterations per call.

    Returns:
      ``train(state, buffer, key) -> (state, metrics)``; state, buffer and
      key are replicated, and so are the results.
    """

    def local(state, buffer, key):
        return td3.train(state, buffer, key, num_updates, dist.DP_AXIS_NAME)

    return jax.shard_map(local, mesh=dp_mesh, in_specs=(P(), P(), P()), out_specs=P())


def check_batch_split(batch_size: int, num_devices: int) -> None:
    """Raises a ValueError when the minibatch does not split evenly over devices."""
    if batch_size % num_devices:
        lower = (batch_size // num_devices) * num_devices
        upper = lower + num_devices
        options = f"{upper}" if lower == 0 else f"{lower} or {upper}"
        raise ValueError(
            f"The TD3 batch size {batch_size} is split over {num_devices} devices of the "
            f"'DP' axis, so it must be a multiple of {num_devices} (e.g. {options})."
        )


def check_buffer(capacity: int, batch_size: int, learning_starts: int) -> None:
    """Raises a ValueError when the buffer cannot hold one minibatch."""
    if capacity < batch_size:
        raise ValueError(
            f"The replay buffer capacity {capacity} is smaller than one TD3 batch "
            f"({batch_size}); make buffer_capacity at least {batch_size}."
        )
    if learning_starts > capacity:
        raise ValueError(
            f"learning_starts={learning_starts} exceeds the buffer capacity {capacity}, "
            "so gradient updates would never start; lower it or enlarge the buffer."
        )
