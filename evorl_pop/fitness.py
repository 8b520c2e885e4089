"""The sign convention, in one place, and the treatment of failed evaluations.

Tasks report scores in their own units: returns are maximised, losses
minimised. evosax minimises. :func:`to_minimization` is the one boundary
where a score becomes an evosax fitness; nothing else flips signs.
"""

from __future__ import annotations

import jax.numpy as jnp


def to_minimization(score, maximize: bool):
    """Task score -> evosax fitness (lower is better)."""
    return -score if maximize else score


def worst_for_nonfinite(fitness):
    """Replaces NaN / inf fitness (minimisation convention) by just-worse-than-worst.

    Every non-finite entry gets the next float above the worst finite fitness,
    so it ranks last without turning means or weighted sums into NaN. If no
    entry is finite, all become the largest finite float: the generation ranks
    as a tie (nothing to learn from it) and cannot enter a best-so-far archive.

    Args:
      fitness: a fitness vector, lower is better.

    Returns:
      ``(clean_fitness, num_nonfinite)``.
    """
    finite = jnp.isfinite(fitness)
    worst = jnp.max(jnp.where(finite, fitness, -jnp.inf))
    largest = jnp.finfo(jnp.result_type(fitness, jnp.float32)).max
    penalty = jnp.where(jnp.any(finite), jnp.nextafter(worst, jnp.inf), largest)
    return jnp.where(finite, fitness, penalty), jnp.sum(~finite)
