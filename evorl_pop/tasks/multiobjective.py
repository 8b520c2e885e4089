"""Multi-objective test problems: ZDT1-4 and ZDT6 (Zitzler, Deb and Thiele 2000),
DTLZ1-7 (Deb, Thiele, Laumanns and Zitzler 2002) and WFG1-9 (Huband et al. 2006),
with their known Pareto fronts.

Each is a black-box task whose score is a vector of ``num_objectives`` values,
all minimised, on the unit box ``[0, 1]^num_dims`` (candidates outside it are
clipped to it before they are scored)::

    mo/zdt1   f2 = g (1 - sqrt(f1 / g))                        front: f2 = 1 - sqrt(f1)
    mo/zdt2   f2 = g (1 - (f1 / g)^2)                          front: f2 = 1 - f1^2
    mo/zdt3   f2 = g (1 - sqrt(f1 / g) - f1 / g sin(10 pi f1)) front: 5 disconnected pieces
    mo/dtlz1  linear front, sum f = 1/2                        (M objectives)
    mo/dtlz2  spherical front, sum f^2 = 1                     (M objectives)
    mo/zdt4, mo/zdt6, mo/dtlz3 .. mo/dtlz7, mo/wfg1 .. mo/wfg9  (mo_problems, wfg)

A task knows its front (:meth:`MOTask.pareto_front`, for IGD and IGD+), its
search box (``bounds``) and a reference point for the hypervolume
(``ref_point``). Build one by name with :func:`make_mo_task`, which also builds
the multi-objective brax tasks (``mo/halfcheetah``, ...: :mod:`~evorl_pop.tasks.mo_brax`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import EvalInfo, did_you_mean, float_dtype
from evorl_pop.tasks import mo_problems, wfg
from evorl_pop.tasks.mo_problems import DTLZ_K, ZDT_DIMS

#: Task names of the multi-objective problems: ``mo/<problem>``.
MO_PREFIX = "mo/"
#: The problems; ZDT ones have 2 objectives, DTLZ ones ``num_objectives`` (3 by default).
PROBLEMS = (
    ("zdt1", "zdt2", "zdt3", "zdt4", "zdt6") + tuple(f"dtlz{i}" for i in range(1, 8)) + wfg.WFG
)
#: Hypervolume reference points (every objective's value), as commonly used for each;
#: the others' are 1.1 times the true front's worst values.
REF_POINT = {"zdt1": 1.1, "zdt2": 1.1, "zdt3": 1.1, "dtlz1": 1.0, "dtlz2": 1.1}
#: Problems whose true front is sampled: optimal candidates, then the non-dominated ones.
SAMPLED = ("dtlz5", "dtlz6", "dtlz7", "wfg1", "wfg2", "wfg3")


def mo_task_names() -> list[str]:
    """``mo/<problem>`` for every problem, and every multi-objective brax task."""
    from evorl_pop.tasks.mo_brax import mo_brax_names  # brax is imported when one is built

    return [MO_PREFIX + name for name in PROBLEMS] + mo_brax_names()


def das_dennis(partitions: int, num_objectives: int) -> np.ndarray:
    """Das and Dennis's (1998) evenly spaced points of the unit simplex.

    Every point whose coordinates are multiples of ``1 / partitions`` and sum to
    1: ``C(partitions + M - 1, M - 1)`` rows of ``M`` columns.
    """
    rows = []

    def fill(prefix: list[int], left: int, slots: int) -> None:
        if slots == 1:
            rows.append([*prefix, left])
            return
        for i in range(left + 1):
            fill([*prefix, i], left - i, slots - 1)

    fill([], partitions, num_objectives)
    return np.asarray(rows, np.float64) / partitions


def nondominated_2d(points: np.ndarray) -> np.ndarray:
    """The rows of ``points`` (two objectives, minimised) that no other row dominates,
    by the first objective: a sweep keeping the rows below every earlier one."""
    p = np.asarray(points)[np.lexsort((points[:, 1], points[:, 0]))]
    earlier = np.minimum.accumulate(np.concatenate([[np.inf], p[:-1, 1]]))
    return p[p[:, 1] < earlier]


def nondominated(points: np.ndarray, chunk: int = 512) -> np.ndarray:
    """The rows of ``points`` (minimised) that no other row dominates."""
    if points.shape[1] == 2:
        return nondominated_2d(points)
    keep = np.ones(len(points), bool)
    for start in range(0, len(points), chunk):
        a = points[start : start + chunk, None, :]
        beaten = np.all(points[None] <= a, -1) & np.any(points[None] < a, -1)
        keep[start : start + chunk] = ~beaten.any(axis=1)
    return points[keep]


def thin(points: np.ndarray, size: int) -> np.ndarray:
    """``size`` rows of ``points`` spread over them: each the farthest from those before."""
    if len(points) <= size:
        return points
    chosen = [int(np.argmin(points[:, 0]))]
    nearest = np.linalg.norm(points - points[chosen[0]], axis=1)
    for _ in range(size - 1):
        chosen.append(int(np.argmax(nearest)))
        nearest = np.minimum(nearest, np.linalg.norm(points - points[chosen[-1]], axis=1))
    return points[np.sort(chosen)]


def _sampled_front(task: MOTask, size: int) -> np.ndarray:
    """Optimal candidates at random positions (and the positions' corners), their
    objectives thinned to ``2 size``, the non-dominated ones (where some are not),
    thinned to ``size``."""
    m, problem = task.num_objectives, task.problem
    p = wfg.default_k(m) if problem.startswith("wfg") else m - 1
    rng = np.random.default_rng(0)
    corners = (np.arange(2 ** min(p, 10))[:, None] >> np.arange(p)) & 1
    positions = np.concatenate([corners.astype(np.float64), rng.random((4 * size, p))])
    if problem == "wfg1":
        positions = positions**50.0  # its polynomial bias: y^0.02 even over [0, 1]
    x = mo_problems.pareto_set(problem, positions, m, task.num_dims)
    f = np.asarray(jax.jit(jax.vmap(task.objectives))(jnp.asarray(x, float_dtype())))
    f = thin(f.astype(np.float64), 2 * size)
    if problem in ("dtlz7", "wfg2", "wfg3"):  # fronts of pieces: not every optimum counts
        f = nondominated(f)
    return thin(f, size)


@functools.cache
def _front(problem: str, num_objectives: int, size: int, num_dims: int) -> np.ndarray:
    if problem in SAMPLED:
        return _sampled_front(MOTask(problem, num_dims, num_objectives), size)
    if problem == "zdt6":
        f1 = np.linspace(0.2807753191, 1.0, size)  # the smallest f1 of x1 in [0, 1]
        return np.stack([f1, 1.0 - f1**2], axis=1)
    if problem in ("zdt1", "zdt2", "zdt3", "zdt4"):
        f1 = np.linspace(0.0, 1.0, size if problem != "zdt3" else 20 * size)
        if problem in ("zdt1", "zdt4"):
            return np.stack([f1, 1.0 - np.sqrt(f1)], axis=1)
        if problem == "zdt2":
            return np.stack([f1, 1.0 - f1**2], axis=1)
        f2 = 1.0 - np.sqrt(f1) - f1 * np.sin(10.0 * np.pi * f1)
        front = nondominated_2d(np.stack([f1, f2], axis=1))
        keep = np.linspace(0, len(front) - 1, min(size, len(front))).round().astype(int)
        return front[keep]
    # the fewest partitions whose simplex has at least `size` points
    partitions = 1
    while math.comb(partitions + num_objectives - 1, num_objectives - 1) < size:
        partitions += 1
    simplex = das_dennis(partitions, num_objectives)
    if problem == "dtlz1":
        return 0.5 * simplex
    sphere = simplex / np.linalg.norm(simplex, axis=1, keepdims=True)
    if problem.startswith("wfg"):  # WFG4-9: the concave front, objective m scaled by 2m
        return sphere * 2.0 * np.arange(1, num_objectives + 1)
    return sphere  # DTLZ2-4


@dataclasses.dataclass(frozen=True)
class MOTask:
    """Minimise ``num_objectives`` objectives of a ``num_dims`` vector in ``[0, 1]^num_dims``.

    Attributes:
      problem: one of :data:`PROBLEMS`.
      num_dims: the variables (``None``: 30 for ZDT1-3, 10 for ZDT4 and ZDT6,
        ``M + k - 1`` for DTLZ with ``k`` of
        :data:`~evorl_pop.tasks.mo_problems.DTLZ_K`, ``k + 20`` for WFG with its
        position variables ``k`` of :func:`~evorl_pop.tasks.wfg.default_k`).
      num_objectives: ZDT: 2; DTLZ and WFG: ``M`` (``None``: 3).
    """

    problem: str = "zdt1"
    num_dims: int | None = None
    num_objectives: int | None = None

    def __post_init__(self):
        if self.problem not in PROBLEMS:
            hint = did_you_mean(self.problem, PROBLEMS, 3)
            raise ValueError(
                f"Unknown multi-objective problem {self.problem!r}.{hint} "
                f"Valid: {', '.join(mo_task_names())}."
            )
        zdt = self.problem.startswith("zdt")
        m = self.num_objectives if self.num_objectives is not None else (2 if zdt else 3)
        if zdt and m != 2:
            raise ValueError(f"{self.problem} has 2 objectives, got num_objectives={m}.")
        if m < 2:
            raise ValueError(f"num_objectives must be at least 2, got {m}.")
        if self.problem.startswith("wfg"):
            n = self.num_dims if self.num_dims is not None else wfg.default_k(m) + wfg.WFG_L
            self._check_wfg(m, n)
        else:
            default = ZDT_DIMS.get(self.problem, 30) if zdt else m + DTLZ_K[self.problem] - 1
            n = self.num_dims if self.num_dims is not None else default
        if n < (2 if zdt else m):
            least = 2 if zdt else f"num_objectives ({m})"
            raise ValueError(f"{self.problem}: num_dims must be at least {least}, got {n}.")
        object.__setattr__(self, "num_objectives", m)
        object.__setattr__(self, "num_dims", n)

    def _check_wfg(self, m: int, n: int) -> None:
        k = wfg.default_k(m)
        if n <= k:
            raise ValueError(f"{self.problem}: num_dims must be more than k = {k}, got {n}.")
        if self.problem in ("wfg2", "wfg3") and (n - k) % 2:
            raise ValueError(f"{self.problem}: num_dims - k ({n} - {k}) must be even.")

    @property
    def name(self) -> str:
        return f"{MO_PREFIX}{self.problem}-{self.num_dims}d-{self.num_objectives}obj"

    @property
    def maximize(self) -> tuple[bool, ...]:
        return (False,) * self.num_objectives

    @property
    def bounds(self) -> tuple[float, float]:
        """Every variable's ``(lower, upper)``."""
        return 0.0, 1.0

    @property
    def ref_point(self) -> tuple[float, ...]:
        """The hypervolume's reference point, in the task's units."""
        if self.problem in REF_POINT:
            return (REF_POINT[self.problem],) * self.num_objectives
        worst = 1.1 * self.pareto_front().max(axis=0)
        return tuple(float(v) for v in np.round(worst, 4))

    def pareto_front(self, size: int = 1000) -> np.ndarray:
        """About ``size`` points of the true Pareto front, shape ``(n, num_objectives)``."""
        return _front(self.problem, self.num_objectives, size, self.num_dims)

    def init_solution(self, key):
        del key
        return jnp.full((self.num_dims,), 0.5, float_dtype())

    def init_state(self):
        return ()

    def update_state(self, task_state, info_total):
        return task_state

    def objectives(self, x: jax.Array) -> jax.Array:
        """The objective vector of one candidate ``x`` (clipped to the unit box)."""
        x = jnp.clip(x, 0.0, 1.0)
        if self.problem not in ("zdt1", "zdt2", "zdt3", "dtlz1", "dtlz2"):  # mo_problems
            return mo_problems.objectives(self.problem, x, self.num_objectives)
        if self.problem.startswith("zdt"):
            f1 = x[0]
            g = 1.0 + 9.0 * jnp.sum(x[1:]) / (self.num_dims - 1)
            h = f1 / g
            if self.problem == "zdt1":
                f2 = g * (1.0 - jnp.sqrt(h))
            elif self.problem == "zdt2":
                f2 = g * (1.0 - h**2)
            else:
                f2 = g * (1.0 - jnp.sqrt(h) - h * jnp.sin(10.0 * jnp.pi * f1))
            return jnp.stack([f1, f2])
        m = self.num_objectives
        position, distance = x[: m - 1], x[m - 1 :]
        if self.problem == "dtlz1":
            d = distance - 0.5
            # 1 - cos(20 pi d) as 2 sin^2(10 pi d): no cancellation near the optimum
            g = 100.0 * jnp.sum(d**2 + 2.0 * jnp.sin(10.0 * jnp.pi * d) ** 2)
            lead, tail, scale = position, 1.0 - position, 0.5 * (1.0 + g)
        else:
            g = jnp.sum((distance - 0.5) ** 2)
            lead, tail = mo_problems.quarter_turn(position)
            scale = 1.0 + g
        # f_i = scale * lead_1 ... lead_{M-i} * tail_{M-i+1} (no tail for f_1)
        prods = jnp.concatenate([jnp.ones(1, x.dtype), jnp.cumprod(lead)])  # prods[j] = lead_1..j
        f = [prods[m - 1 - i] * (tail[m - 1 - i] if i else 1.0) for i in range(m)]
        return scale * jnp.stack(f)

    def evaluate(self, solution, key, task_state):
        del key, task_state
        return self.objectives(solution), EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))


def make_mo_task(
    name: str, num_dims: int | None = None, num_objectives: int | None = None, **control
):
    """The problem ``mo/<problem>`` (:class:`MOTask`), or the multi-objective brax task
    ``mo/<env>`` (:class:`~evorl_pop.tasks.mo_brax.MOBraxTask`, built with ``control``:
    ``hidden_sizes``, ``activation``, ``episodes``, ``episode_length``, ``backend``;
    the problems take none of these)."""
    from evorl_pop.tasks.mo_brax import MO_BRAX, MOBraxTask

    if not name.startswith(MO_PREFIX):
        raise ValueError(f"A multi-objective problem is named {MO_PREFIX}<problem>, got {name!r}.")
    if name[len(MO_PREFIX) :] in MO_BRAX:
        if num_dims is not None:
            raise ValueError(f"{name}: num_dims is the policy's size, not a setting.")
        task = MOBraxTask(name, **control)
        if num_objectives not in (None, task.num_objectives):
            raise ValueError(f"{name} has {task.num_objectives} objectives, got {num_objectives}.")
        return task
    return MOTask(name[len(MO_PREFIX) :], num_dims, num_objectives)
