"""The objective functions of the multi-objective test problems beyond ZDT1-3 and DTLZ1-2,
on the unit box: ZDT4 and ZDT6 (Zitzler, Deb and Thiele 2000), DTLZ3-7 (Deb, Thiele,
Laumanns and Zitzler 2005) and WFG1-9 (:mod:`~evorl_pop.tasks.wfg`).

Every function maps one candidate ``x`` in ``[0, 1]^n`` to its ``m`` objectives,
all minimised. A problem whose own box is another one is scaled to it first:
ZDT4's ``x_2 .. x_n`` in ``[-5, 5]`` are ``10 x_i - 5``; WFG's ``z_i`` in
``[0, 2i]`` are ``2i x_i``. SBX and polynomial mutation act relative to the
box, so a search on the unit box is the same search as on the problem's own.

``g`` functions with ``n - cos(...)`` sums are written with ``2 sin^2`` instead
(the same values without cancellation, so that float32 resolves ``g`` near 0).
"""

from __future__ import annotations

import jax.numpy as jnp

from evorl_pop.tasks import wfg

#: DTLZ's ``k``: the variables of ``g`` beyond the ``M - 1`` position variables (Deb et al.
#: 2005: 5 for DTLZ1, 10 for DTLZ2-6, 20 for DTLZ7).
DTLZ_K = {"dtlz1": 5, "dtlz2": 10, "dtlz3": 10, "dtlz4": 10, "dtlz5": 10, "dtlz6": 10}
DTLZ_K["dtlz7"] = 20
#: DTLZ4's bias of the position variables (Deb et al. 2005).
DTLZ4_ALPHA = 100.0
#: ZDT4 and ZDT6's default variables (Zitzler, Deb and Thiele 2000).
ZDT_DIMS = {"zdt4": 10, "zdt6": 10}


def rastrigin_g(d):
    """DTLZ1 and DTLZ3's ``g``: ``100 (k + sum(d^2 - cos(20 pi d)))`` of ``d = x - 1/2``."""
    return 100.0 * jnp.sum(d**2 + 2.0 * jnp.sin(10.0 * jnp.pi * d) ** 2)


def zdt4(x):
    """ZDT4: ZDT1's front under a Rastrigin ``g`` of ``x_2 .. x_n`` in ``[-5, 5]``."""
    y = 10.0 * x[1:] - 5.0
    g = 1.0 + jnp.sum(y**2 + 20.0 * jnp.sin(2.0 * jnp.pi * y) ** 2)
    return jnp.stack([x[0], g * (1.0 - jnp.sqrt(x[0] / g))])


def zdt6(x):
    """ZDT6: a non-uniform, concave front (``f1 >= 0.2808``)."""
    f1 = 1.0 - jnp.exp(-4.0 * x[0]) * jnp.sin(6.0 * jnp.pi * x[0]) ** 6
    g = 1.0 + 9.0 * jnp.mean(x[1:]) ** 0.25
    return jnp.stack([f1, g * (1.0 - (f1 / g) ** 2)])


def quarter_turn(a):
    """``cos(pi a / 2)`` and ``sin(pi a / 2)``, each from the nearer end of the quarter
    turn (``sin(pi (1 - a) / 2)`` for the cosine above 1/2): in float32, a value near 0
    keeps its relative precision, which the distance to the front's edges needs."""
    near = a > 0.5
    to_end = 0.5 * jnp.pi * jnp.where(near, 1.0 - a, a)
    cos = jnp.where(near, jnp.sin(to_end), jnp.cos(to_end))
    sin = jnp.where(near, jnp.cos(to_end), jnp.sin(to_end))
    return cos, sin


def spherical(angles, scale, m: int):
    """``f_i = scale * cos(a_1) ... cos(a_{m-i}) * sin(a_{m-i+1})`` (no sine for ``f_1``),
    of the ``m - 1`` angles in units of a quarter turn."""
    lead, tail = quarter_turn(angles)
    prods = jnp.concatenate([jnp.ones(1, angles.dtype), jnp.cumprod(lead)])
    return scale * jnp.stack([prods[m - 1 - i] * (tail[m - 1 - i] if i else 1.0) for i in range(m)])


def dtlz(problem: str, x, m: int):
    """DTLZ3-7 of ``x`` with ``m`` objectives."""
    position, distance = x[: m - 1], x[m - 1 :]
    if problem == "dtlz3":
        return spherical(position, 1.0 + rastrigin_g(distance - 0.5), m)
    if problem == "dtlz4":
        return spherical(position**DTLZ4_ALPHA, 1.0 + jnp.sum((distance - 0.5) ** 2), m)
    if problem in ("dtlz5", "dtlz6"):
        if problem == "dtlz5":
            g = jnp.sum((distance - 0.5) ** 2)
        else:
            g = jnp.sum(distance**0.1)
        theta = (1.0 + 2.0 * g * position[1:]) / (2.0 * (1.0 + g))
        return spherical(jnp.concatenate([position[:1], theta]), 1.0 + g, m)
    g = 1.0 + 9.0 * jnp.mean(distance)
    h = m - jnp.sum(position / (1.0 + g) * (1.0 + jnp.sin(3.0 * jnp.pi * position)))
    return jnp.concatenate([position, ((1.0 + g) * h)[None]])


def objectives(problem: str, x, m: int, k: int | None = None):
    """The objectives of ``x`` (in the unit box) of one of these problems."""
    if problem == "zdt4":
        return zdt4(x)
    if problem == "zdt6":
        return zdt6(x)
    if problem.startswith("dtlz"):
        return dtlz(problem, x, m)
    return wfg.objectives(problem, x, m, k)


def pareto_set(problem: str, positions, m: int, n: int, k: int | None = None):
    """Optimal candidates (unit box) for the ``(rows, p)`` position values in ``[0, 1]``:
    ``p = m - 1`` for DTLZ, WFG's ``k``; the distance variables at their optimum."""
    import numpy as np

    rows = positions.shape[0]
    if problem.startswith("wfg"):
        return wfg.pareto_set(problem, positions, m, n, k)
    optimum = {"dtlz6": 0.0, "dtlz7": 0.0}.get(problem, 0.5)
    return np.concatenate([positions, np.full((rows, n - positions.shape[1]), optimum)], axis=1)
