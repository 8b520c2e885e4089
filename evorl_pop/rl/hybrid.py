"""Set-up shared by the hybrid evolutionary-RL algorithms (CEM-RL, ERL).

Both keep one population sharded over the ``POP`` mesh axis and train TD3
with minibatches split over a ``DP`` axis of a mesh on the same devices.
This module builds that pair of meshes, the data-parallel TD3 training
function, and checks configurations with messages that say what to change.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop.mesh import make_mesh
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.td3 import TD3, TD3State


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
