"""Sharded evaluation over a device mesh.

:func:`shmap_vmap` and :func:`shmap_map` wrap a per-candidate function so that
each device of a mesh applies it to its own slice of a population: vectorised
(``jax.vmap``) or one candidate at a time (``jax.lax.map``, lower peak memory).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import chex
import jax
from jax.sharding import PartitionSpec


def tree_device_put(tree: chex.ArrayTree, device_or_sharding):
    """Places every leaf of a pytree on a device or sharding.

    Args:
      tree: a pytree of arrays.
      device_or_sharding: a ``jax.Device`` or a ``jax.sharding.Sharding``
        (for example ``NamedSharding(mesh, P('POP'))``).

    Returns:
      The same pytree with each leaf placed accordingly.
    """
    return jax.tree.map(lambda x: jax.device_put(x, device_or_sharding), tree)


def _spec_axes(spec) -> list[tuple[int, tuple[str, ...]]]:
    """(dim, mesh axes) pairs of a PartitionSpec entry list."""
    out = []
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        out.append((dim, tuple(names)))
    return out


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def _check_specs(mesh, in_specs, out_specs, fn_name: str):
    for which, specs in (("in_specs", in_specs), ("out_specs", out_specs)):
        for spec in jax.tree.leaves(specs, is_leaf=lambda s: _is_spec(s) or s is None):
            if not _is_spec(spec):
                continue
            for _, names in _spec_axes(spec):
                for name in names:
                    if name not in mesh.axis_names:
                        raise ValueError(
                            f"{fn_name}: {which} names the mesh axis {name!r}, but the "
                            f"mesh has axes {tuple(mesh.axis_names)}. Use one of those "
                            "names, or build the mesh with this axis, e.g. "
                            f"jax.sharding.Mesh(devices, ({name!r},))."
                        )


def _check_divisible(mesh, in_specs, args, fn_name: str):
    """Raises a helpful error when a sharded dimension does not split evenly."""
    specs = in_specs if isinstance(in_specs, tuple) else (in_specs,) * len(args)
    if len(specs) != len(args):
        raise ValueError(
            f"{fn_name}: got {len(args)} positional arguments but {len(specs)} in_specs; "
            "give one PartitionSpec (or pytree of them) per argument."
        )
    for argnum, (spec_tree, arg) in enumerate(zip(specs, args, strict=True)):
        if _is_spec(spec_tree) or spec_tree is None:
            pairs = [(spec_tree, leaf) for leaf in jax.tree.leaves(arg)]
        else:
            try:
                pairs = list(
                    zip(
                        jax.tree.leaves(spec_tree, is_leaf=lambda s: _is_spec(s) or s is None),
                        jax.tree.leaves(arg),
                        strict=True,
                    )
                )
            except ValueError:
                continue  # structure mismatch: let shard_map report it
        for spec, leaf in pairs:
            if spec is None:
                continue
            shape = getattr(leaf, "shape", ())
            for dim, names in _spec_axes(spec):
                if dim >= len(shape):
                    raise ValueError(
                        f"{fn_name}: argument {argnum} has shape {tuple(shape)} but its "
                        f"spec {spec} shards dimension {dim}; give it an array with at "
                        f"least {dim + 1} dimensions or drop that entry from the spec."
                    )
                n = math.prod(mesh.shape[name] for name in names)
                size = shape[dim]
                if size % n:
                    lower, upper = (size // n) * n, -(-size // n) * n
                    options = f"{upper}" if lower == 0 else f"{lower} or {upper}"
                    raise ValueError(
                        f"{fn_name}: argument {argnum} has length {size} along dimension "
                        f"{dim}, which is sharded over mesh axes {names} of total size "
                        f"{n}; {size} is not divisible by {n}. Use a multiple of {n} "
                        f"(e.g. {options}), or pad it with "
                        "evorl_pop.mesh.pad_to_multiple and mask the padded slots."
                    )


def _wrap(local_fn: Callable, fn: Callable, mesh, in_specs, out_specs, fn_name, kwargs):
    _check_specs(mesh, in_specs, out_specs, fn_name)
    mapped = jax.shard_map(local_fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs)

    @functools.wraps(fn)
    def wrapper(*args):
        _check_divisible(mesh, in_specs, args, fn_name)
        return mapped(*args)

    return wrapper


def shmap_vmap(fn: Callable, mesh, in_specs, out_specs, **kwargs):
    """Evaluates ``fn`` on every element of each device's slice, vectorised.

    Equivalent to ``jax.vmap(fn)`` over the leading axis of the arguments,
    with that axis sharded over the mesh: each device runs ``jax.vmap(fn)`` on
    its local slice inside ``jax.shard_map``.

    Args:
      fn: a per-element function of positional arguments.
      mesh: a ``jax.sharding.Mesh``.
      in_specs: ``PartitionSpec`` (or pytree of them) per positional argument,
        e.g. ``P('POP')`` for a population sharded along its leading axis. An
        argument given ``P()`` is replicated and still mapped over by vmap, so
        give every argument a leading element axis.
      out_specs: ``PartitionSpec`` (or pytree) of the outputs, e.g. ``P('POP')``.
      **kwargs: passed to ``jax.shard_map`` (e.g. ``check_vma``).

    Returns:
      A function of the same positional arguments returning the stacked
        outputs, laid out according to ``out_specs``.

    Raises:
      ValueError: when a spec names an axis the mesh lacks, or a sharded axis
        length is not divisible by the number of devices along it.
    """
    return _wrap(jax.vmap(fn), fn, mesh, in_specs, out_specs, "shmap_vmap", kwargs)


def shmap_map(fn: Callable, mesh, in_specs, out_specs, **kwargs):
    """Evaluates ``fn`` on each device's slice one element at a time.

    Like :func:`shmap_vmap` but each device loops over its local slice with
    ``jax.lax.map``: the peak memory is that of one element, at the cost of
    running sequentially. Use it when a vectorised evaluation does not fit.

    Args:
      fn: a per-element function of positional arguments.
      mesh: a ``jax.sharding.Mesh``.
      in_specs: ``PartitionSpec`` (or pytree of them) per positional argument.
      out_specs: ``PartitionSpec`` (or pytree) of the outputs.
      **kwargs: passed to ``jax.shard_map``.

    Returns:
      A function of the same positional arguments returning the stacked
        outputs, laid out according to ``out_specs``.

    Raises:
      ValueError: as :func:`shmap_vmap`.
    """

    def local(*args):
        return jax.lax.map(lambda xs: fn(*xs), args)

    return _wrap(local, fn, mesh, in_specs, out_specs, "shmap_map", kwargs)
