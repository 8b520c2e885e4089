"""Variation operators of the multi-objective genetic algorithms (NSGA-II, NSGA-III):
Deb's simulated binary crossover and bounded polynomial mutation, in JAX.

Both keep every variable in the search box ``[lower, upper]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: The search box of a task that has none of its own (policy weights): every parameter.
DEFAULT_BOUNDS = (-10.0, 10.0)


def sbx(key, first, second, lower, upper, eta: float, prob: float, prob_var: float = 0.5):
    """Simulated binary crossover of parent pairs in ``[lower, upper]`` (Deb and Agrawal 1995;
    the bounded form of Deb's NSGA-II code).

    Each pair crosses with probability ``prob``; then each variable with
    probability ``prob_var`` (and parents that differ there), its two children
    spread around the parents' mean with the distribution index ``eta``, and
    given to either child at random.

    Args:
      key: the crossover's key.
      first, second: ``(pairs, dims)`` parents.
      lower, upper: the bounds (scalars or ``(dims,)``).

    Returns:
      The two ``(pairs, dims)`` children.
    """
    k_u, k_var, k_pair, k_swap = jax.random.split(key, 4)
    shape = first.shape
    u = jax.random.uniform(k_u, shape, first.dtype)
    low, high = jnp.minimum(first, second), jnp.maximum(first, second)
    diff = high - low
    cross = (
        (jax.random.uniform(k_var, shape) < prob_var)
        & (jax.random.uniform(k_pair, shape[:1] + (1,)) < prob)
        & (diff > 1e-14)
    )
    safe = jnp.where(cross, diff, 1.0)
    power = 1.0 / (eta + 1.0)

    def spread(beta):
        alpha = 2.0 - beta ** -(eta + 1.0)
        inside = u <= 1.0 / alpha
        return jnp.where(
            inside,
            (u * alpha) ** power,
            (1.0 / jnp.where(inside, 1.0, 2.0 - u * alpha)) ** power,
        )

    mid = low + high
    c1 = 0.5 * (mid - spread(1.0 + 2.0 * (low - lower) / safe) * diff)
    c2 = 0.5 * (mid + spread(1.0 + 2.0 * (upper - high) / safe) * diff)
    c1, c2 = jnp.clip(c1, lower, upper), jnp.clip(c2, lower, upper)
    swap = jax.random.uniform(k_swap, shape) < 0.5
    a, b = jnp.where(swap, c2, c1), jnp.where(swap, c1, c2)
    return jnp.where(cross, a, first), jnp.where(cross, b, second)


def polynomial_mutation(key, x, lower, upper, eta: float, prob: float):
    """Deb's bounded polynomial mutation: each variable with probability ``prob`` moves
    by a perturbation of distribution index ``eta`` that stays within the bounds."""
    k_which, k_u = jax.random.split(key)
    mutate = jax.random.uniform(k_which, x.shape) < prob
    u = jax.random.uniform(k_u, x.shape, x.dtype)
    span = upper - lower
    to_low, to_high = (x - lower) / span, (upper - x) / span
    power = 1.0 / (eta + 1.0)
    down = u < 0.5
    # each power taken once, of the side each variable moves to (the same values)
    near = jnp.where(down, 1.0 - to_low, 1.0 - to_high) ** (eta + 1.0)
    base_down = 2.0 * u + (1.0 - 2.0 * u) * near
    base_up = 2.0 * (1.0 - u) + 2.0 * (u - 0.5) * near
    root = jnp.where(down, base_down, base_up) ** power
    delta = jnp.where(down, root - 1.0, 1.0 - root)
    return jnp.where(mutate, jnp.clip(x + delta * span, lower, upper), x)
