"""Statistics of an evaluated population, shared by the ES engine and the
hybrid algorithms.

Everything here runs inside ``shard_map`` over the ``POP`` axis: each device
holds its slice of the scores, and the collectives make every statistic
global (padded slots masked out, NaN / inf counted but never averaged).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop.distributed import POP_AXIS_NAME, all_gather, pmax, pmin, psum


@flax.struct.dataclass
class Summary:
    """Global statistics of one evaluated population, in the task's units."""

    scores: jax.Array  # (padded_pop,) every candidate's score, global order
    best: jax.Array
    worst: jax.Array
    mean: jax.Array  # over finite scores only; NaN when none is finite
    std: jax.Array  # likewise
    num_nonfinite: jax.Array  # int32
    info: Any  # the task's EvalInfo summed over real candidates


def summarize(scores, info, mask, maximize: bool, axis_name: str | None = POP_AXIS_NAME):
    """Global statistics of a sharded population; call inside the shard.

    Padded slots (``mask`` False) never reach extremes, means or counts;
    NaN / inf scores are counted and left out of extremes and means. With no
    finite score at all, mean and std are NaN (a 0.0 would read as a result).

    Args:
      scores: this device's scores, shape ``(local_pop,)``.
      info: this device's per-candidate info pytree (leading axis local_pop).
      mask: ``True`` for real candidates.
      maximize: whether higher scores are better.
      axis_name: the population axis (``None`` when unsharded).

    Returns:
      A :class:`Summary`, identical on every device.
    """
    finite = jnp.isfinite(scores) & mask
    count = psum(jnp.sum(finite), axis_name)
    num_nonfinite = psum(jnp.sum(mask & ~finite), axis_name)
    hi = pmax(jnp.max(jnp.where(finite, scores, -jnp.inf)), axis_name)
    lo = pmin(jnp.min(jnp.where(finite, scores, jnp.inf)), axis_name)
    denom = jnp.maximum(count, 1).astype(jnp.result_type(scores, jnp.float32))
    mean = psum(jnp.sum(jnp.where(finite, scores, 0.0)), axis_name) / denom
    var = psum(jnp.sum(jnp.where(finite, (scores - mean) ** 2, 0.0)), axis_name) / denom
    none_finite = count == 0

    def masked_sum(x):
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return psum(jnp.sum(jnp.where(m, x, jnp.zeros_like(x)), axis=0), axis_name)

    gathered = all_gather(scores, axis_name, tiled=True, to="invarying")
    best, worst = (hi, lo) if maximize else (lo, hi)
    return Summary(
        scores=gathered,
        best=best,
        worst=worst,
        mean=jnp.where(none_finite, jnp.nan, mean),
        std=jnp.where(none_finite, jnp.nan, jnp.sqrt(var)),
        num_nonfinite=num_nonfinite.astype(jnp.int32),
        info=jax.tree.map(masked_sum, info),
    )
