"""The WFG toolkit's nine problems (Huband, Hingston, Barone and While 2006), in JAX, with
any number of objectives ``M``.

A candidate's ``n = k + l`` variables ``z_i`` in ``[0, 2i]`` are given here on the
unit box (``y_i = z_i / 2i``); the first ``k`` are position variables, the other
``l`` distance variables. Each problem is a chain of transformations of ``y``
(shifts, biases, reductions) to ``M`` values ``t``, then
``f_m = t_M + 2m h_m(x)`` with ``x_i = max(t_M, A_i) (t_i - 1/2) + 1/2`` and the
problem's shapes ``h``::

    wfg1  convex, mixed            flat and polynomial bias
    wfg2  convex, disconnected     non-separable
    wfg3  linear, degenerate       non-separable
    wfg4  concave                  multi-modal
    wfg5  concave                  deceptive
    wfg6  concave                  non-separable
    wfg7  concave                  parameter-dependent bias
    wfg8  concave                  parameter-dependent bias, non-separable
    wfg9  concave                  all of these

Defaults, as Huband et al. and pymoo: ``k = 4`` for 2 objectives, ``2 (M - 1)``
otherwise; ``l = 20``. The optimal distance variables are ``z_i = 0.7 i``
(``y_i = 0.35``), dependent on the others for WFG8 and WFG9 (:func:`pareto_set`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

#: The problems.
WFG = tuple(f"wfg{i}" for i in range(1, 10))
#: The distance variables by default (Huband et al.'s experiments).
WFG_L = 20
#: ``b_param``'s constants as the toolkit uses them.
PARAM = (0.98 / 49.98, 0.02, 50.0)


def default_k(m: int) -> int:
    """The position variables: 4 for 2 objectives, ``2 (M - 1)`` otherwise."""
    return 4 if m == 2 else 2 * (m - 1)


# --- transformations (Huband et al.'s table I) -----------------------------------------


def s_linear(y, a):
    return jnp.clip(jnp.abs(y - a) / jnp.abs(jnp.floor(a - y) + a), 0.0, 1.0)


def s_deceptive(y, a, b, c):
    left = jnp.floor(y - a + b) * (1.0 - c + (a - b) / b) / (a - b)
    right = jnp.floor(a + b - y) * (1.0 - c + (1.0 - a - b) / b) / (1.0 - a - b)
    return jnp.clip(1.0 + (jnp.abs(y - a) - b) * (left + right + 1.0 / b), 0.0, 1.0)


def s_multimodal(y, a, b, c):
    r = jnp.abs(y - c) / (2.0 * (jnp.floor(c - y) + c))
    value = (1.0 + jnp.cos((4.0 * a + 2.0) * jnp.pi * (0.5 - r)) + 4.0 * b * r**2) / (b + 2.0)
    return jnp.clip(value, 0.0, 1.0)


def b_flat(y, a, b, c):
    low = jnp.minimum(0.0, jnp.floor(y - b)) * a * (b - y) / b
    high = jnp.minimum(0.0, jnp.floor(c - y)) * (1.0 - a) * (y - c) / (1.0 - c)
    return jnp.clip(a + low - high, 0.0, 1.0)


def b_param(y, u, a, b, c):
    exponent = b + (c - b) * (a - (1.0 - 2.0 * u) * jnp.abs(jnp.floor(0.5 - u) + a))
    return jnp.clip(y**exponent, 0.0, 1.0)


def r_sum(y, w):
    return jnp.clip(jnp.sum(w * y) / jnp.sum(w), 0.0, 1.0)


def r_nonsep(y, a: int):
    size = y.shape[0]
    total = jnp.sum(y)
    for shift in range(1, a):
        total = total + jnp.sum(jnp.abs(y - jnp.roll(y, -shift)))
    half = -(-a // 2)
    return jnp.clip(total / (size * half * (1.0 + 2.0 * a - 2.0 * half) / a), 0.0, 1.0)


def suffix_means(y):
    """``mean(y[i + 1:])`` for each ``i < n - 1``."""
    tail = jnp.cumsum(y[::-1])[::-1]  # tail[i] = sum(y[i:])
    return tail[1:] / jnp.arange(y.shape[0] - 1, 0, -1)


def prefix_means(y):
    """``mean(y[:i])`` for each ``i >= 1``."""
    return jnp.cumsum(y)[:-1] / jnp.arange(1, y.shape[0])


# --- shapes ---------------------------------------------------------------------------


def shape(x, lead, tail, m: int):
    """``h_1 = prod lead(x)``, ``h_j = lead(x_1) ... lead(x_{M-j}) tail(x_{M-j+1})``."""
    prods = jnp.concatenate([jnp.ones(1, x.dtype), jnp.cumprod(lead(x))])
    ends = tail(x)
    return [prods[m - 1 - i] * (ends[m - 1 - i] if i else 1.0) for i in range(m)]


def _quarter_turn(v):
    """``cos(pi v / 2)`` and ``sin(pi v / 2)``, each from the nearer end of the quarter
    turn (values near 0 keep their relative precision in float32)."""
    near = v > 0.5
    to_end = 0.5 * jnp.pi * jnp.where(near, 1.0 - v, v)
    return jnp.where(near, jnp.sin(to_end), jnp.cos(to_end)), jnp.where(
        near, jnp.cos(to_end), jnp.sin(to_end)
    )


def concave(x, m):
    return shape(x, lambda v: _quarter_turn(v)[1], lambda v: _quarter_turn(v)[0], m)


def convex(x, m):
    # 1 - cos(pi v / 2) = 2 sin^2(pi v / 4) and 1 - sin(pi v / 2) = 2 sin^2(pi (1 - v) / 4):
    # no cancellation near 0
    def lead(v):
        return 2.0 * jnp.sin(0.25 * jnp.pi * v) ** 2

    return shape(x, lead, lambda v: 2.0 * jnp.sin(0.25 * jnp.pi * (1.0 - v)) ** 2, m)


def linear(x, m):
    return shape(x, lambda v: v, lambda v: 1.0 - v, m)


def mixed(x1, a=5.0):
    return 1.0 - x1 - jnp.cos(2.0 * a * jnp.pi * x1 + 0.5 * jnp.pi) / (2.0 * a * jnp.pi)


def disconnected(x1, a=5.0):
    return 1.0 - x1 * jnp.cos(a * jnp.pi * x1) ** 2


# --- the problems --------------------------------------------------------------------


def _reduce(y, m, k, reduce_position, reduce_distance):
    gap = k // (m - 1)
    t = [reduce_position(y[i * gap : (i + 1) * gap], i * gap) for i in range(m - 1)]
    return jnp.stack([*t, reduce_distance(y[k:])])


def _mean(part, start=0):
    del start
    return jnp.clip(jnp.mean(part), 0.0, 1.0)


def transitions(problem: str, y, m: int, k: int):
    """The ``M`` values ``t`` of ``y`` (the unit box)."""
    n = y.shape[0]
    linear_shift = jnp.concatenate([y[:k], s_linear(y[k:], 0.35)])
    if problem == "wfg1":
        y = linear_shift
        y = jnp.concatenate([y[:k], b_flat(y[k:], 0.8, 0.75, 0.85)])
        y = jnp.clip(y**0.02, 0.0, 1.0)
        w = 2.0 * jnp.arange(1, n + 1, dtype=y.dtype)
        return _reduce(
            y, m, k, lambda p, s: r_sum(p, w[s : s + p.shape[0]]), lambda d: r_sum(d, w[k:])
        )
    if problem in ("wfg2", "wfg3"):
        y = linear_shift
        pairs = jnp.stack([r_nonsep(y[k + 2 * j : k + 2 * j + 2], 2) for j in range((n - k) // 2)])
        return _reduce(jnp.concatenate([y[:k], pairs]), m, k, _mean, _mean)
    if problem == "wfg4":
        return _reduce(s_multimodal(y, 30.0, 10.0, 0.35), m, k, _mean, _mean)
    if problem == "wfg5":
        return _reduce(s_deceptive(y, 0.35, 0.001, 0.05), m, k, _mean, _mean)
    if problem == "wfg6":
        gap = k // (m - 1)
        return _reduce(
            linear_shift, m, k, lambda p, s: r_nonsep(p, gap), lambda d: r_nonsep(d, n - k)
        )
    if problem == "wfg7":
        biased = b_param(y[:k], suffix_means(y)[:k], *PARAM)
        y = jnp.concatenate([biased, s_linear(y[k:], 0.35)])
        return _reduce(y, m, k, _mean, _mean)
    if problem == "wfg8":
        biased = b_param(y[k:], prefix_means(y)[k - 1 :], *PARAM)
        y = jnp.concatenate([y[:k], s_linear(biased, 0.35)])
        return _reduce(y, m, k, _mean, _mean)
    if problem == "wfg9":
        y = jnp.concatenate([b_param(y[:-1], suffix_means(y), *PARAM), y[-1:]])
        position = s_deceptive(y[:k], 0.35, 0.001, 0.05)
        y = jnp.concatenate([position, s_multimodal(y[k:], 30.0, 95.0, 0.35)])
        gap = k // (m - 1)
        return _reduce(y, m, k, lambda p, s: r_nonsep(p, gap), lambda d: r_nonsep(d, n - k))
    raise ValueError(f"Unknown WFG problem {problem!r}.")


def objectives(problem: str, y, m: int, k: int | None = None):
    """WFG ``problem``'s ``m`` objectives of ``y`` (the unit box; ``z_i = 2i y_i``)."""
    k = default_k(m) if k is None else k
    t = transitions(problem, y, m, k)
    a = jnp.ones(m - 1, y.dtype)
    if problem == "wfg3":
        a = a.at[1:].set(0.0)  # degenerate: every position value but the first at 1/2
    x = jnp.maximum(t[-1], a) * (t[:-1] - 0.5) + 0.5
    if problem in ("wfg1", "wfg2"):
        h = convex(x, m)[:-1] + [(mixed if problem == "wfg1" else disconnected)(x[0])]
    elif problem == "wfg3":
        h = linear(x, m)
    else:
        h = concave(x, m)
    return t[-1] + 2.0 * jnp.arange(1, m + 1, dtype=y.dtype) * jnp.stack(h)


def pareto_set(problem: str, positions, m: int, n: int, k: int | None = None) -> np.ndarray:
    """Optimal candidates (the unit box) with the given ``(rows, k)`` position values."""
    k = default_k(m) if k is None else k
    rows = positions.shape[0]
    y = np.concatenate([positions, np.full((rows, n - k), 0.35)], axis=1)
    if problem == "wfg8":
        a = PARAM[0]
        for i in range(k, n):
            u = y[:, :i].mean(axis=1)
            exponent = 0.02 + 49.98 * (a - (1.0 - 2.0 * u) * np.abs(np.floor(0.5 - u) + a))
            y[:, i] = 0.35 ** (1.0 / exponent)
    elif problem == "wfg9":
        for i in range(n - 2, k - 1, -1):
            y[:, i] = 0.35 ** (1.0 / (0.02 + 1.96 * y[:, i + 1 :].mean(axis=1)))
    return y
