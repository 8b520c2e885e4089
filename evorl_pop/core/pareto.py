"""Pareto dominance in JAX, with fixed shapes: ranks, crowding, and the measures of a front.

Every function takes objective vectors as rows of a ``(n, k)`` matrix, all
minimised (the engine's convention, :func:`~evorl_pop.core.engine.to_minimization`),
and jit-compiles for a fixed ``n``::

    nondominated_ranks  fronts peeled from a domination matrix (Deb et al. 2002's
                        fast non-dominated sort, as counts of dominators)
    crowding_distance   each front's crowding distance, every front at once
    hypervolume         exact: a sweep for 2 objectives, moocore's for more
    igd, igd_plus       distances from a known front (Coello and Reyes Sierra
                        2004; Ishibuchi et al. 2015)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def dominates(fitness: jax.Array) -> jax.Array:
    """``d[i, j]``: row ``i`` dominates row ``j`` (no worse everywhere, better somewhere)."""
    a, b = fitness[:, None, :], fitness[None, :, :]
    return jnp.all(a <= b, axis=-1) & jnp.any(a < b, axis=-1)


def nondominated_ranks(fitness: jax.Array, needed: int | None = None) -> jax.Array:
    """The front of each row: 0 for the non-dominated, 1 for those only they dominate, ...

    The fronts are peeled one at a time. Two objectives: the rows sorted once by
    ``(f0, f1)``; a remaining row joins the current front when no remaining row
    before its group of equal rows has an ``f1`` as low (a running minimum: ``O(n)``
    per front). More: from the domination matrix, a row joins when no remaining row
    dominates it (one ``any`` over the matrix's columns per front, faster on a CPU
    than keeping counts of dominators). Both are the same relation, compared exactly.

    Args:
      fitness: ``(n, k)`` objective vectors, minimised; finite.
      needed: stop peeling once this many rows are ranked (survival selection
        needs no more); ``None``: rank every row.

    Returns:
      ``(n,)`` int32 ranks; rows left unranked (beyond ``needed``) get ``n``.
    """
    n, k = fitness.shape
    needed = n if needed is None else needed
    if k == 2:
        order = jnp.lexsort((fitness[:, 1], fitness[:, 0]))
        x, y = fitness[order, 0], fitness[order, 1]
        index = jnp.arange(n)
        new = jnp.concatenate([jnp.ones(1, bool), (x[1:] != x[:-1]) | (y[1:] != y[:-1])])
        group_start = jax.lax.cummax(jnp.where(new, index, 0))

        def front_of(remaining):
            lowest = jax.lax.cummin(jnp.where(remaining, y, jnp.inf))
            before = jnp.concatenate([jnp.full(1, jnp.inf, y.dtype), lowest[:-1]])
            return remaining & ~(before[group_start] <= y)

    else:
        dom = dominates(fitness)

        def front_of(remaining):
            return remaining & ~jnp.any(dom & remaining[:, None], axis=0)

    def cond(carry):
        _, remaining, _, ranked = carry
        return jnp.any(remaining) & (ranked < needed)

    def body(carry):
        rank, remaining, front_id, ranked = carry
        front = front_of(remaining)
        rank = jnp.where(front, front_id, rank)
        return rank, remaining & ~front, front_id + 1, ranked + jnp.sum(front, dtype=jnp.int32)

    start = (jnp.full(n, n, jnp.int32), jnp.ones(n, bool), jnp.int32(0), jnp.int32(0))
    rank = jax.lax.while_loop(cond, body, start)[0]
    if k == 2:  # back from the sorted order
        return jnp.zeros_like(rank).at[order].set(rank)
    return rank


def crowding_distance(fitness: jax.Array, rank: jax.Array) -> jax.Array:
    """Deb et al.'s (2002) crowding distance of each row within its front.

    Per objective, a front's rows sorted by that objective (ties by row
    index): the first and last get ``inf``, every other row adds the gap
    between its neighbours divided by the front's range of that objective
    (nothing when the range is 0). Every front is computed at once: rows are
    sorted by ``(rank, objective, index)``.

    Args:
      fitness: ``(n, k)`` objective vectors, minimised.
      rank: ``(n,)`` fronts, from :func:`nondominated_ranks`.

    Returns:
      ``(n,)`` distances, ``inf`` at each front's extremes.
    """
    n, k = fitness.shape
    index = jnp.arange(n)
    distance = jnp.zeros(n, fitness.dtype)
    for m in range(k):
        f = fitness[:, m]
        order = jnp.lexsort((index, f, rank))
        r, fs = rank[order], f[order]
        first = jnp.concatenate([jnp.ones(1, bool), r[1:] != r[:-1]])
        last = jnp.concatenate([r[1:] != r[:-1], jnp.ones(1, bool)])
        # each front's range: its last sorted value less its first (its max and min)
        start = jax.lax.cummax(jnp.where(first, index, 0))
        end = jax.lax.cummin(jnp.where(last, index, n - 1), reverse=True)
        span = fs[end] - fs[start]
        gap = jnp.concatenate([fs[1:], fs[-1:]]) - jnp.concatenate([fs[:1], fs[:-1]])
        inner = jnp.where(span > 0, gap / jnp.where(span > 0, span, 1.0), 0.0)
        distance = distance.at[order].add(jnp.where(first | last, jnp.inf, inner))
    return distance


def hypervolume_2d(fitness: jax.Array, ref: jax.Array, mask: jax.Array | None = None):
    """The exact hypervolume that the rows of ``fitness`` (two objectives, minimised)
    dominate up to ``ref``: a sweep along the first objective.

    Rows outside the box below ``ref`` add nothing, nor do rows where ``mask``
    is False; dominated rows need no removal.
    """
    ref = jnp.asarray(ref, fitness.dtype)
    points = jnp.minimum(fitness, ref)  # a row beyond ref covers nothing: its strip is empty
    if mask is not None:
        points = jnp.where(mask[:, None], points, ref)
    order = jnp.lexsort((points[:, 1], points[:, 0]))
    x, y = points[order, 0], points[order, 1]
    lowest = jax.lax.cummin(y)  # the front's height over [x_i, x_{i+1})
    width = jnp.concatenate([x[1:], ref[:1]]) - x
    return jnp.sum(width * (ref[1] - lowest))


def _hypervolume_host(points, mask, ref):
    import moocore  # the exact algorithms for 3 and more objectives

    points = np.asarray(points, np.float64)[np.asarray(mask)]
    ref = np.asarray(ref, np.float64)
    inside = points[np.all(points < ref, axis=1)]
    volume = moocore.hypervolume(inside, ref=ref) if len(inside) else 0.0
    return np.asarray(volume, np.float32)


def hypervolume(fitness: jax.Array, ref, mask: jax.Array | None = None) -> jax.Array:
    """The exact hypervolume dominated by the rows of ``fitness`` (minimised) up to ``ref``.

    One objective: ``max(ref - min, 0)``; two: :func:`hypervolume_2d`; more:
    moocore's (``jax.pure_callback``, on the host).

    Args:
      fitness: ``(n, k)`` objective vectors, minimised.
      ref: the reference point, ``(k,)``, minimised.
      mask: the rows that count (``None``: all).

    Returns:
      A scalar, in the objectives' units to the power ``k``.
    """
    n, k = fitness.shape
    mask = jnp.ones(n, bool) if mask is None else mask
    ref = jnp.asarray(ref, fitness.dtype)
    if k == 1:
        best = jnp.min(jnp.where(mask, fitness[:, 0], ref[0]))
        return jnp.maximum(ref[0] - best, 0.0)
    if k == 2:
        return hypervolume_2d(fitness, ref, mask)
    out = jax.ShapeDtypeStruct((), jnp.float32)
    # under vmap (several seeds in one program), one host call per front
    volume = jax.pure_callback(_hypervolume_host, out, fitness, mask, ref, vmap_method="sequential")
    return volume.astype(fitness.dtype)


def igd(fitness: jax.Array, front, mask: jax.Array | None = None, plus: bool = False):
    """Inverted generational distance: the mean, over the points of the true ``front``,
    of the distance to the nearest row of ``fitness`` (where ``mask``).

    ``plus``: IGD+, where a row counts only by how much it is worse than the
    front's point in each objective (Ishibuchi et al. 2015), so it is
    Pareto-compliant.
    """
    front = jnp.asarray(front, fitness.dtype)
    diff = fitness[None, :, :] - front[:, None, :]  # (front, rows, k)
    if plus:
        diff = jnp.maximum(diff, 0.0)
    dist = jnp.sqrt(jnp.sum(diff**2, axis=-1))
    if mask is not None:
        dist = jnp.where(mask[None, :], dist, jnp.inf)
    return jnp.mean(jnp.min(dist, axis=1))
