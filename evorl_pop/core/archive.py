"""An archive of elites sharded across the devices by cell (quality-diversity).

The descriptor space is cut into cells: a grid (``cells_per_dim`` equal cells per
descriptor dimension over the bounds, row-major) or a centroidal Voronoi
tessellation (CVT: ``num_cells`` centroids by k-means on uniform samples of the
descriptor box, as QDax's ``compute_cvt_centroids``; :func:`cvt_centroids`). Each
cell keeps its best genotype (its elite), the elite's fitness (maximised; ``-inf``:
empty) and descriptor::

    cells padded to a multiple of 8 and of the devices, sharded P('POP'): device d holds
    cells [d * C/D, (d + 1) * C/D), memory per device ~ cells / devices

    insert: the generation's candidates (replicated) ─► each one's cell
            (grid: arithmetic; CVT: each device's nearest own centroid, pmin
            across devices) ─► each device keeps those of its cells, the best
            per cell (ties: the lowest candidate index), if better than the
            incumbent (strictly) ─► elites replaced in place
    sample: which cells are filled (all_gather of one flag per cell) ─► parents
            drawn uniformly over the filled cells (replicated key) ─► each
            device gives the genotypes of its cells, psum (one non-zero term each)

Descriptors outside the bounds are clipped to them first, so a candidate falls in
the nearest cell at the border; candidates with a non-finite fitness never enter.
The archive's content (which elites, their values) does not depend on the device
count, bit for bit; its metrics' sums are reduced across devices, equal to float
rounding.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop.base import float_dtype
from evorl_pop.distributed import POP_AXIS_NAME, all_gather, pmax, pmin, psum

POP = P(POP_AXIS_NAME)
KINDS = ("grid", "cvt")
#: Cells are padded to a multiple of this and of the device count: one shape on 1, 2,
#: 4 and 8 devices, so that a checkpoint resumes on any of these counts.
CELL_MULTIPLE = 8


@flax.struct.dataclass
class Archive:
    """The cells' elites, sharded ``P('POP')`` by cell (padded cells stay empty)."""

    genotypes: jax.Array  # (padded_cells, num_dims)
    fitness: jax.Array  # (padded_cells,), maximised; -inf: an empty cell
    descriptors: jax.Array  # (padded_cells, descriptor_size)
    centroids: jax.Array  # (padded_cells, descriptor_size); padded cells: +inf


def grid_centroids(low, high, cells_per_dim) -> np.ndarray:
    """The centres of a grid's cells, row-major (the first dimension varies slowest)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    axes = [
        lo + (np.arange(n) + 0.5) * (hi - lo) / n
        for lo, hi, n in zip(low, high, cells_per_dim, strict=True)
    ]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=-1)


def grid_cells(descriptors, low, high, cells_per_dim):
    """The grid cell of each descriptor (clipped to the bounds), row-major, int32."""
    low = jnp.asarray(low, descriptors.dtype)
    high = jnp.asarray(high, descriptors.dtype)
    n = jnp.asarray(cells_per_dim, jnp.int32)
    d = jnp.clip(descriptors, low, high)
    index = jnp.floor((d - low) / (high - low) * n.astype(d.dtype)).astype(jnp.int32)
    index = jnp.clip(index, 0, n - 1)
    strides = np.cumprod((list(cells_per_dim) + [1])[:0:-1])[::-1].astype(np.int32)
    return jnp.sum(index * strides, axis=-1).astype(jnp.int32)


def _nearest(points, centroids):
    """Index and squared distance of each point's nearest centroid (ties: the lowest)."""
    dist = jnp.sum((points[:, None, :] - centroids[None, :, :]) ** 2, axis=-1)
    return jnp.argmin(dist, axis=-1).astype(jnp.int32), jnp.min(dist, axis=-1)


@functools.partial(jax.jit, static_argnums=(1, 2, 5))
def _kmeans(key, num_cells: int, num_samples: int, low, high, iterations: int):
    samples = jax.random.uniform(key, (num_samples, low.shape[0]), low.dtype, low, high)

    def assign(centroids):
        # |s - c|^2 - |s|^2 = |c|^2 - 2 s.c: a matrix product per block of samples
        norms = jnp.sum(centroids**2, axis=-1)

        def nearest(block):
            return jnp.argmin(norms - 2 * block @ centroids.T, axis=-1).astype(jnp.int32)

        size = min(num_samples, 1024)
        blocks = -(-num_samples // size)
        padded = jnp.pad(samples, ((0, blocks * size - num_samples), (0, 0)))
        return jax.lax.map(nearest, padded.reshape(blocks, size, -1)).reshape(-1)[:num_samples]

    def lloyd(centroids, _):
        nearest = assign(centroids)
        sums = jax.ops.segment_sum(samples, nearest, num_cells)
        counts = jax.ops.segment_sum(jnp.ones(num_samples, low.dtype), nearest, num_cells)
        moved = sums / jnp.maximum(counts, 1)[:, None]
        return jnp.where(counts[:, None] > 0, moved, centroids), None

    centroids, _ = jax.lax.scan(lloyd, samples[:num_cells], None, length=iterations)
    return centroids


def cvt_centroids(
    key, num_cells: int, num_samples: int, low, high, iterations: int = 30
) -> np.ndarray:
    """CVT centroids: Lloyd's k-means on ``num_samples`` uniform samples of the box
    ``[low, high]``, started from the first ``num_cells`` samples, ``iterations`` times
    (an empty cluster keeps its centroid). Deterministic in ``key``; float32."""
    if num_samples < num_cells:
        raise ValueError(f"cvt needs at least num_cells={num_cells} samples, got {num_samples}.")
    low = jnp.asarray(low, jnp.float32)
    high = jnp.asarray(high, jnp.float32)
    return np.asarray(_kmeans(key, num_cells, num_samples, low, high, iterations))


class ShardedArchive:
    """The operations on an :class:`Archive` over the ``POP`` axis of a mesh.

    Args:
      mesh: a mesh with a ``'POP'`` axis.
      low, high: the descriptor bounds, one float per descriptor dimension.
      cells_per_dim: a grid's cells per dimension; or ``None`` with ``centroids``.
      centroids: a CVT's ``(num_cells, descriptor_size)`` centroids.
    """

    def __init__(self, mesh: Mesh, low, high, cells_per_dim=None, centroids=None):
        if (cells_per_dim is None) == (centroids is None):
            raise ValueError("give either cells_per_dim (a grid) or centroids (a CVT).")
        self.mesh = mesh
        self.low = np.asarray(low, np.float64)
        self.high = np.asarray(high, np.float64)
        if np.any(self.high <= self.low):
            raise ValueError(f"descriptor bounds need low < high, got {low} and {high}.")
        self.grid = None if cells_per_dim is None else tuple(int(n) for n in cells_per_dim)
        if self.grid is not None:
            if len(self.grid) != self.low.size or min(self.grid) < 1:
                raise ValueError(
                    f"cells_per_dim needs {self.low.size} counts of at least 1, got {self.grid}."
                )
            centroids = grid_centroids(self.low, self.high, self.grid)
        self.centroids = np.asarray(centroids)
        self.num_cells = self.centroids.shape[0]
        devices = mesh.shape[POP_AXIS_NAME]
        multiple = math.lcm(CELL_MULTIPLE, devices)
        self.padded_cells = -(-self.num_cells // multiple) * multiple
        self.local_cells = self.padded_cells // devices
        self.descriptor_size = self.low.size
        # compiled once each (an eager shard_map would trace at every call)
        self.empty = jax.jit(self.empty, static_argnums=0)
        self.cells = jax.jit(self.cells)
        self.insert = jax.jit(self.insert)
        self.sample = jax.jit(self.sample, static_argnums=2)
        self.metrics = jax.jit(self.metrics)
        self.fitness_at = jax.jit(self.fitness_at)
        self.novelty = jax.jit(self.novelty, static_argnums=2)

    def _sharded(self, tree):
        return jax.lax.with_sharding_constraint(tree, NamedSharding(self.mesh, POP))

    def empty(self, num_dims: int) -> Archive:
        """An archive with every cell empty, sharded by cell."""
        dtype = float_dtype()
        pad = self.padded_cells - self.num_cells
        centroids = np.concatenate(
            [self.centroids, np.full((pad, self.descriptor_size), np.inf)]
        ).astype(dtype)
        archive = Archive(
            genotypes=jnp.zeros((self.padded_cells, num_dims), dtype),
            fitness=jnp.full((self.padded_cells,), -jnp.inf, dtype),
            descriptors=jnp.zeros((self.padded_cells, self.descriptor_size), dtype),
            centroids=jnp.asarray(centroids),
        )
        return self._sharded(archive)

    def _cells(self, descriptors, local_centroids):
        """Inside the shard: the cell of each (replicated) descriptor, replicated."""
        # a non-finite descriptor's candidate never enters (insert): any cell will do
        finite = jnp.all(jnp.isfinite(descriptors), axis=-1, keepdims=True)
        d = jnp.clip(jnp.where(finite, descriptors, self.low), self.low, self.high)
        d = d.astype(descriptors.dtype)
        if self.grid is not None:
            return grid_cells(d, self.low, self.high, self.grid)
        index, dist = _nearest(d, local_centroids)
        offset = jax.lax.axis_index(POP_AXIS_NAME) * self.local_cells
        best = pmin(dist, POP_AXIS_NAME)
        mine = jnp.where(dist == best, index + offset, self.padded_cells)
        return pmin(mine, POP_AXIS_NAME)

    def cells(self, archive: Archive, descriptors):
        """The cell each descriptor falls in (clipped to the bounds), replicated int32."""
        return jax.shard_map(self._cells, mesh=self.mesh, in_specs=(P(), POP), out_specs=P())(
            descriptors, archive.centroids
        )

    def insert(self, archive: Archive, genotypes, fitness, descriptors):
        """The archive with a batch of candidates inserted (see the module docstring).

        Args:
          archive: the :class:`Archive`.
          genotypes: ``(batch, num_dims)`` candidates, in their global order.
          fitness: ``(batch,)`` maximised; a candidate with a non-finite fitness or
            descriptor is left out.
          descriptors: ``(batch, descriptor_size)``.

        Returns:
          ``(archive, added)``: ``added`` counts the cells that changed (replicated).
        """

        def local(arch: Archive, genotypes, fitness, descriptors):
            cells = self._cells(descriptors, arch.centroids)
            size = self.local_cells
            batch = fitness.shape[0]
            own = cells - jax.lax.axis_index(POP_AXIS_NAME) * size
            finite = jnp.isfinite(fitness) & jnp.all(jnp.isfinite(descriptors), axis=-1)
            ok = (own >= 0) & (own < size) & finite
            segment = jnp.where(ok, own, size)  # segment `size`: dropped
            value = jnp.where(ok, fitness, -jnp.inf)
            best = jax.ops.segment_max(value, segment, size + 1)
            is_best = ok & (value == best[segment])
            ids = jnp.where(is_best, jnp.arange(batch), batch)
            winner = jax.ops.segment_min(ids, segment, size + 1)[:size]
            best = best[:size]
            better = best > arch.fitness  # an empty segment's -inf never is
            take = jnp.clip(winner, 0, batch - 1)
            new = arch.replace(
                genotypes=jnp.where(better[:, None], genotypes[take], arch.genotypes),
                fitness=jnp.where(better, best, arch.fitness),
                descriptors=jnp.where(better[:, None], descriptors[take], arch.descriptors),
            )
            return new, psum(jnp.sum(better, dtype=jnp.int32), POP_AXIS_NAME)

        return jax.shard_map(
            local, mesh=self.mesh, in_specs=(POP, P(), P(), P()), out_specs=(POP, P())
        )(archive, genotypes, fitness, descriptors)

    def sample(self, archive: Archive, key, count: int):
        """``count`` genotypes drawn uniformly (with replacement) over the filled cells of
        every device, replicated; the same draw whatever the device count. An empty
        archive gives zeros."""

        def local(fitness, genotypes, key):
            filled = jnp.isfinite(fitness).astype(jnp.int32)
            filled = all_gather(filled, POP_AXIS_NAME, tiled=True, to="invarying")
            total = jnp.cumsum(filled)
            draw = jax.random.randint(key, (count,), 0, jnp.maximum(total[-1], 1))
            cell = jnp.searchsorted(total, draw, side="right")  # the (draw + 1)-th filled
            own = cell - jax.lax.axis_index(POP_AXIS_NAME) * self.local_cells
            mine = (own >= 0) & (own < self.local_cells) & (total[-1] > 0)
            rows = genotypes[jnp.clip(own, 0, self.local_cells - 1)]
            # one device holds each row: the others add zeros, exactly
            return psum(jnp.where(mine[:, None], rows, jnp.zeros_like(rows)), POP_AXIS_NAME)

        return jax.shard_map(local, mesh=self.mesh, in_specs=(POP, POP, P()), out_specs=P())(
            archive.fitness, archive.genotypes, key
        )

    def fitness_at(self, archive: Archive, cells):
        """The fitness of the elites of ``cells`` (replicated int32, as :meth:`cells`
        gives), replicated; ``-inf`` for an empty cell. Exact on any device count: one
        device holds each cell, the others give ``-inf`` to the maximum."""

        def local(fitness, cells):
            own = cells - jax.lax.axis_index(POP_AXIS_NAME) * self.local_cells
            mine = (own >= 0) & (own < self.local_cells)
            values = fitness[jnp.clip(own, 0, self.local_cells - 1)]
            return pmax(jnp.where(mine, values, -jnp.inf), POP_AXIS_NAME)

        return jax.shard_map(local, mesh=self.mesh, in_specs=(POP, P()), out_specs=P())(
            archive.fitness, cells
        )

    def novelty(self, archive: Archive, descriptors, k: int):
        """Each (replicated) descriptor's mean Euclidean distance to its ``k`` nearest
        elites' descriptors (fewer when fewer cells are filled; ``0`` when none are),
        replicated. The elites' descriptors (``descriptor_size`` floats a cell) are
        gathered on every device and the distances computed over all the cells, in one
        shape on any device count: the same values, bit for bit."""

        def local(fitness, elites, descriptors):
            filled = all_gather(jnp.isfinite(fitness), POP_AXIS_NAME, tiled=True, to="invarying")
            elites = all_gather(elites, POP_AXIS_NAME, tiled=True, to="invarying")
            diff = descriptors[:, None, :] - elites[None, :, :]
            dist = jnp.sqrt(jnp.sum(diff * diff, axis=-1))
            dist = jnp.where(filled[None, :], dist, jnp.inf)
            near = -jax.lax.top_k(-dist, min(k, self.padded_cells))[0]
            finite = jnp.isfinite(near)
            total = jnp.sum(jnp.where(finite, near, 0.0), axis=1)
            return total / jnp.maximum(jnp.sum(finite, axis=1), 1).astype(total.dtype)

        return jax.shard_map(local, mesh=self.mesh, in_specs=(POP, POP, P()), out_specs=P())(
            archive.fitness, archive.descriptors, descriptors
        )

    def metrics(self, archive: Archive, qd_offset: float) -> dict:
        """The archive's metrics, replicated: ``qd_score`` (the sum over filled cells of
        ``fitness + qd_offset``), ``coverage`` (filled / cells), ``archive_size`` (filled
        cells), ``archive_fitness_max`` and ``archive_fitness_mean`` (NaN when empty)."""

        def local(fitness):
            filled = jnp.isfinite(fitness)
            count, total = psum(
                (jnp.sum(filled, dtype=jnp.int32), jnp.sum(jnp.where(filled, fitness, 0.0))),
                POP_AXIS_NAME,
            )
            best = pmax(jnp.max(fitness), POP_AXIS_NAME)
            return count, total, best

        count, total, best = jax.shard_map(local, mesh=self.mesh, in_specs=POP, out_specs=P())(
            archive.fitness
        )
        dtype = archive.fitness.dtype
        return {
            "qd_score": total + qd_offset * count.astype(dtype),
            "coverage": count.astype(dtype) / self.num_cells,
            "archive_size": count,
            "archive_fitness_max": jnp.where(count > 0, best, jnp.nan),
            "archive_fitness_mean": jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan),
        }

    def to_numpy(self, archive: Archive) -> dict[str, np.ndarray]:
        """The archive's real cells on the host: ``genotypes``, ``fitness`` (``-inf``:
        empty), ``descriptors``, ``centroids`` and ``filled``."""
        host = jax.device_get(archive)
        n = self.num_cells
        out = {
            "genotypes": np.asarray(host.genotypes)[:n],
            "fitness": np.asarray(host.fitness)[:n],
            "descriptors": np.asarray(host.descriptors)[:n],
            "centroids": np.asarray(self.centroids, np.asarray(host.centroids).dtype),
        }
        out["filled"] = np.isfinite(out["fitness"])
        return out
