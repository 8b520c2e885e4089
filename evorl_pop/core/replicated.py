"""A replicated computation that runs the same on any device count.

A strategy's ``init``, ``ask`` and ``tell`` take and return replicated values.
Traced in a mesh's program, XLA's partitioner is still free to split their work
(a sum over the population, a matmul) across the devices, so the order of
their sums, and their last bits, would depend on the device count; CMA-ES's
eigenbasis, degenerate while the dimension exceeds μ, amplifies those bits into
different samples. :func:`replicated` runs such a function whole on every device.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P


def replicated(fn, mesh: Mesh):
    """``fn`` run whole on every device of ``mesh``: its inputs and outputs replicated.

    Inside a ``shard_map`` of replicated specs no op is partitioned, and
    optimisation barriers around ``fn`` keep XLA from fusing it with the ops
    around it (the evaluation's collectives differ by device count): every
    device runs the same update on the same inputs. One device compiles without
    the partitioner's passes; a few strategies' updates round differently there
    (``tests/test_device_count.py`` names them).

    Args:
      fn: a function of replicated arrays (pytrees) to replicated arrays.
      mesh: the mesh whose program calls it.

    Returns:
      ``fn``, with the same signature.
    """

    def isolated(*args):
        return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

    return jax.shard_map(isolated, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
