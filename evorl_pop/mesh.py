"""Meshes and padding for populations that do not split evenly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from evorl_pop.distributed import POP_AXIS_NAME


def make_mesh(num_devices: int | None = None, axis_name: str = POP_AXIS_NAME, devices=None) -> Mesh:
    """A one-dimensional mesh over the first ``num_devices`` devices.

    Args:
      num_devices: how many devices to use; ``None`` uses all of
        ``jax.devices()`` (every process's devices under ``jax.distributed``).
      axis_name: the name of the mesh axis, ``'POP'`` by default.
      devices: an explicit device list, instead of ``jax.devices()``.

    Returns:
      A ``jax.sharding.Mesh`` with the single axis ``axis_name``.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    if not isinstance(num_devices, int | np.integer):
        raise ValueError(f"num_devices must be a count or None (all devices), got {num_devices!r}.")
    if not 1 <= num_devices <= len(devices):
        raise ValueError(
            f"num_devices={num_devices} but {len(devices)} device(s) are available. "
            "On the CPU, call evorl_pop.use_all_cores() or "
            "evorl_pop.backend.set_host_devices(N) before JAX starts."
        )
    return Mesh(np.asarray(devices[:num_devices]), (axis_name,))


def padded_size(size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``size``."""
    return -(-size // multiple) * multiple


def pad_to_multiple(tree, multiple: int, axis: int = 0):
    """Pads the leading axis of every leaf to a multiple of ``multiple``.

    Padded rows repeat the first row, so they hold valid values (no NaN
    sneaks in), and must be masked out of every statistic.

    Args:
      tree: a pytree of arrays sharing the length of ``axis``.
      multiple: e.g. the number of devices of the population axis.
      axis: the axis to pad.

    Returns:
      ``(padded_tree, mask)`` where ``mask`` is a boolean vector that is
      ``True`` for real rows.
    """
    leaves = jax.tree.leaves(tree)
    size = leaves[0].shape[axis]
    total = padded_size(size, multiple)

    def pad(x):
        if total == size:
            return x
        fill = jnp.repeat(jnp.take(x, jnp.array([0]), axis=axis), total - size, axis=axis)
        return jnp.concatenate([x, fill], axis=axis)

    return jax.tree.map(pad, tree), jnp.arange(total) < size


def sharding(mesh: Mesh, *spec) -> NamedSharding:
    """``NamedSharding(mesh, PartitionSpec(*spec))``."""
    return NamedSharding(mesh, PartitionSpec(*spec))
