"""Collectives that degrade to the identity when no axis is mapped.

Every function here takes an ``axis_name``. Inside ``jax.shard_map`` (or
:func:`~evorl_pop.distributed.shmap_map` / :func:`~evorl_pop.distributed.shmap_vmap`)
over a mesh with that axis it performs the collective; with
``axis_name=None`` it returns its input unchanged, so the same algorithm code
runs unsharded on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np


def _collective(op: Callable, name: str, x, axis_name, **kwargs):
    if axis_name is None:
        return x
    try:
        return op(x, axis_name, **kwargs)
    except NameError as err:  # jax raises NameError for an unbound axis name
        raise _unbound(name, axis_name) from err


def _unbound(name: str, axis_name) -> ValueError:
    return ValueError(
        f"{name}(axis_name={axis_name!r}) was called where no mesh axis named "
        f"{axis_name!r} is mapped. Call it inside jax.shard_map / shmap_map / "
        f"shmap_vmap over a mesh that has the axis {axis_name!r}, or pass "
        "axis_name=None to run without a collective."
    )


#: Leaves of a pytree up to this many elements share one collective (:func:`pmean`).
BUCKET_LEAF_SIZE = 16_384


def _bucketed(op: Callable, name: str, x, axis_name):
    """An element-wise reduction of a pytree in one collective per dtype.

    The leaves of one dtype are concatenated, reduced together and split again:
    XLA:CPU meets every operand of an all-reduce at a rendezvous of its own,
    so a gradient of many small arrays costs far more reduced leaf by leaf than as
    one array (docs/guides/learners.md measures it). Leaves of more than
    :data:`BUCKET_LEAF_SIZE` elements are reduced alone: copying them costs more
    than their rendezvous, and on several cores XLA fuses that copy into the matrix
    product that made them (SAC's 256x256 kernels). Weakly typed leaves (Python
    numbers) are reduced alone too, so that every leaf keeps its type.
    """
    if axis_name is None:
        return x
    leaves, treedef = jax.tree.flatten(x)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    buckets: dict = {}
    for i, leaf in enumerate(leaves):
        alone = jax.typeof(leaf).weak_type or leaf.size > BUCKET_LEAF_SIZE
        buckets.setdefault((leaf.dtype, i if alone else None), []).append(i)
    out = list(leaves)
    try:
        for members in buckets.values():
            if len(members) == 1:
                out[members[0]] = op(leaves[members[0]], axis_name)
                continue
            parts = [leaves[i] for i in members]
            flat = op(jnp.concatenate([jnp.ravel(p) for p in parts]), axis_name)
            ends = np.cumsum([p.size for p in parts])
            for i, part, end in zip(members, parts, ends, strict=True):
                out[i] = flat[end - part.size : end].reshape(part.shape)
    except NameError as err:  # jax raises NameError for an unbound axis name
        raise _unbound(name, axis_name) from err
    return jax.tree.unflatten(treedef, out)


def pmean(x, axis_name: str | None = None):
    """Mean of ``x`` (an array or pytree) over the devices of a mesh axis.

    The same on every device; with ``axis_name=None``, ``x`` itself. The
    data-parallel gradient step averages its per-device gradients with it. The
    leaves of a pytree are reduced in one collective per dtype (as are
    :func:`psum`'s, :func:`pmin`'s and :func:`pmax`'s).
    """
    return _bucketed(jax.lax.pmean, "pmean", x, axis_name)


def psum(x, axis_name: str | None = None):
    """Sum of ``x`` over the devices of mesh axis ``axis_name`` (``None``: ``x``).

    Counts and totals of a sharded population (candidates, steps, episodes)
    come from it, each counted once.
    """
    return _bucketed(jax.lax.psum, "psum", x, axis_name)


def pmin(x, axis_name: str | None = None):
    """Element-wise minimum of ``x`` over the devices of a mesh axis (``None``: ``x``);
    the best of a sharded population's losses, once each device has its own."""
    return _bucketed(jax.lax.pmin, "pmin", x, axis_name)


def pmax(x, axis_name: str | None = None):
    """Element-wise maximum over the devices of mesh axis ``axis_name``.

    Args:
      x: an array or pytree of arrays, each device's value.
      axis_name: the mapped mesh axis to reduce over; ``None`` returns ``x``.

    Returns:
      The maximum, the same on every device.
    """
    return _bucketed(jax.lax.pmax, "pmax", x, axis_name)


def all_gather(x, axis_name: str | None = None, **kwargs):
    """Gathers ``x`` from every device of a mesh axis.

    Args:
      x: an array or pytree of arrays, each device's local slice.
      axis_name: the mapped mesh axis to gather over; ``None`` returns ``x``.
      **kwargs: passed to :func:`jax.lax.all_gather`: ``tiled=True`` concatenates
        the slices along ``axis`` instead of stacking them on a new axis;
        ``to='invarying'`` marks the result as replicated so that it can leave
        ``jax.shard_map`` under an out-spec ``P()``.

    Returns:
      The gathered array(s): with ``tiled=True`` and local slices of a sharded
        population, the whole population in global order.
    """
    return _collective(jax.lax.all_gather, "all_gather", x, axis_name, **kwargs)


def split_key_to_devices(key: chex.PRNGKey, devices: Sequence[jax.Device]):
    """Splits a key into one key per device and places each on its device.

    Args:
      key: a PRNG key.
      devices: the devices to place keys on (for example ``mesh.devices.flat``).

    Returns:
      An array of ``len(devices)`` distinct keys whose ``i``-th row lives on
        ``devices[i]``, sharded along its leading axis.
    """
    devices = list(devices)
    if not devices:
        raise ValueError("split_key_to_devices needs at least one device.")
    keys = jax.random.split(key, len(devices))
    mesh = jax.sharding.Mesh(devices, ("_keys",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("_keys"))
    return jax.device_put(keys, sharding)


def is_dist_initialized() -> bool:
    """Whether ``jax.distributed.initialize`` has been called in this process.

    Returns:
      ``True`` when this process is part of a multi-process JAX run.
    """
    return jax.distributed.is_initialized()


def get_process_id() -> int:
    """Index of this process in a multi-process run.

    Returns:
      ``jax.process_index()`` under ``jax.distributed``, else 0.
    """
    return jax.process_index() if is_dist_initialized() else 0


def get_global_ranks():
    """Global rank of each of this process's local devices.

    Ranks follow ``jax.devices()`` order: process ``p`` with ``n`` local devices
    holds ranks ``p*n .. p*n + n - 1`` (all processes have the same number of
    local devices, as JAX requires for a global mesh).

    Returns:
      An int32 array of shape ``(jax.local_device_count(),)`` whose ``i``-th
        element is the global rank of ``jax.local_devices()[i]`` and lives on it.
    """
    local = jax.local_devices()
    global_index = {d.id: i for i, d in enumerate(jax.devices())}
    ranks = jnp.asarray([global_index[d.id] for d in local], dtype=jnp.int32)
    return jax.device_put(
        ranks,
        jax.sharding.NamedSharding(
            jax.sharding.Mesh(local, ("_ranks",)), jax.sharding.PartitionSpec("_ranks")
        ),
    )
