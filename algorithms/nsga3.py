"""NSGA-III (Deb and Jain 2014) on a sharded population: NSGA-II's generation with
parents drawn at random and survival by reference directions instead of crowding,
for 3 objectives or more.

Everything else is :mod:`~evorl_pop.algorithms.nsga2`'s (SBX, polynomial
mutation, the engine's evaluation, the metrics and the exported front)::

    parents + offspring ─► non-dominated fronts until the front that overflows
        ─► normalised: the ideal point; each axis's extreme point (achievement
           scalarising over the first front and the earlier extremes); the
           hyperplane through them, its intercepts the nadir (degenerate: the
           first front's worst values, then the population's), as pymoo 0.6
        ─► each member to its nearest reference direction (Das and Dennis's
           simplex points), by perpendicular distance
        ─► niching: the overflowing front fills the least crowded directions
           (counts of the fronts kept whole), one member at a time, ties at
           random (the nearest for an empty niche, else any)

The ideal point, the worst values and the extreme points carry over from one
generation to the next in the state (:class:`NSGA3State`), as pymoo keeps them.

All in JAX with fixed shapes; the niching loop is a ``while_loop`` over the
members still to choose.
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config, NSGA2Strategy, NSGAState
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import num_objectives
from evorl_pop.core.pareto import nondominated_ranks
from evorl_pop.tasks.multiobjective import das_dennis


def default_partitions(population_size: int, num_objectives: int) -> int:
    """The most Das-Dennis partitions whose directions are no more than the population."""
    if num_objectives == 1:
        return 1  # one direction, whatever the partitions
    p = 1
    while math.comb(p + num_objectives, num_objectives - 1) <= population_size:
        p += 1
    return p


#: Deb and Jain's (2014) weights of the achievement scalarising function that finds
#: each axis's extreme point: 1 on the axis, 1e6 on the others (pymoo's, as a product).
ASF_OFF_AXIS = 1e6
#: Translated objective values below this count as 0 in the extreme points' ASF (pymoo).
ASF_ZERO = 1e-3
#: Intercepts (and nadir ranges) at or below this are degenerate (pymoo, the paper's
#: "the hyperplane cannot be built"): the fallbacks of :func:`hyperplane_nadir` apply.
TOO_SMALL = 1e-6


@flax.struct.dataclass
class NSGA3State(NSGAState):
    """NSGA-II's state and the normalisation's memory, kept across generations as in
    pymoo: the ideal point and the worst values ever seen, and the extreme points
    (rows of raw objectives; ``inf`` until the first survival)."""

    ideal: jax.Array  # (k,)
    worst: jax.Array  # (k,)
    extremes: jax.Array  # (k, k), row i: the extreme point of axis i


def extreme_points(fitness, front, ideal, extremes):
    """Each axis's extreme point: of the earlier extremes and the front's rows, the one
    that minimises the achievement scalarising function with that axis's weights."""
    k = fitness.shape[1]
    candidates = jnp.concatenate([extremes, jnp.where(front[:, None], fitness, jnp.inf)])
    t = candidates - ideal
    t = jnp.where(t < ASF_ZERO, 0.0, t)
    weights = jnp.where(jnp.eye(k, dtype=bool), 1.0, ASF_OFF_AXIS).astype(t.dtype)
    asf = jnp.max(t[None, :, :] * weights[:, None, :], axis=-1)  # (axes, candidates)
    return candidates[jnp.argmin(asf, axis=1)]


def hyperplane_nadir(extremes, ideal, worst, worst_of_front, worst_of_population):
    """The nadir estimate: the ideal point plus the intercepts of the hyperplane through
    the extreme points, none beyond the worst values seen. A singular or inexact system,
    or an intercept of :data:`TOO_SMALL` or less (a negative one among them), falls back
    to the worst values of the first front; an axis whose range is still too small, to
    the worst of the population."""
    k = extremes.shape[1]
    m = extremes - ideal
    plane = jnp.linalg.solve(m, jnp.ones(k, m.dtype))
    intercepts = 1.0 / plane
    exact = jnp.all(jnp.abs(m @ plane - 1.0) <= 1e-8 + 1e-5)  # numpy's allclose
    valid = jnp.all(jnp.isfinite(plane)) & exact & jnp.all(intercepts > TOO_SMALL)
    nadir = jnp.where(valid, jnp.minimum(ideal + intercepts, worst), worst_of_front)
    return jnp.where(nadir - ideal <= TOO_SMALL, worst_of_population, nadir)


def update_normalization(fitness, front, ideal, worst, extremes):
    """Deb and Jain's normalisation, with pymoo's memory: the ideal point and worst values
    over every generation so far, the extreme points among the earlier ones and this
    population's first front (``front``), and the nadir from their hyperplane.

    Returns:
      ``(ideal, worst, extremes, nadir)``.
    """
    ideal = jnp.minimum(ideal, jnp.min(fitness, axis=0))
    worst = jnp.maximum(worst, jnp.max(fitness, axis=0))
    extremes = extreme_points(fitness, front, ideal, extremes)
    worst_of_front = jnp.max(jnp.where(front[:, None], fitness, -jnp.inf), axis=0)
    nadir = hyperplane_nadir(extremes, ideal, worst, worst_of_front, jnp.max(fitness, axis=0))
    return ideal, worst, extremes, nadir


def normalize(fitness, ideal, nadir):
    """Objectives translated by the ideal point and divided by the nadir's range (a range
    of exactly 0 by 1e-12, as pymoo)."""
    span = nadir - ideal
    return (fitness - ideal) / jnp.where(span == 0, 1e-12, span)


def associate(normalized, directions):
    """Each row's nearest reference direction by perpendicular distance, and that distance."""
    unit = directions / jnp.linalg.norm(directions, axis=1, keepdims=True)
    along = normalized @ unit.T  # (rows, directions)
    offset = normalized[:, None, :] - along[:, :, None] * unit[None, :, :]
    distance = jnp.linalg.norm(offset, axis=-1)
    niche = jnp.argmin(distance, axis=1)
    return niche, jnp.take_along_axis(distance, niche[:, None], axis=1)[:, 0]


def niching(key, chosen, pool, niche, distance, num_niches: int, needed):
    """Deb and Jain's niching: ``needed`` members of ``pool``, one at a time, each from a
    least crowded niche (counts of the ``chosen`` and those picked so far) that still has
    pool members, ties at random; from a niche with no member yet the nearest one, else
    one at random.

    Returns:
      ``(total,)`` int32: the order each member was picked in (``total`` if not).
    """
    total = chosen.shape[0]
    count = jax.ops.segment_sum(chosen.astype(jnp.int32), niche, num_niches)

    def cond(carry):
        return carry[1] < needed

    def body(carry):
        picked, done, pool, count, key = carry
        key, k_niche, k_member = jax.random.split(key, 3)
        open_ = jax.ops.segment_max(pool.astype(jnp.int32), niche, num_niches) > 0
        # the least crowded open niche; ties at random (counts are integers)
        noise = jax.random.uniform(k_niche, (num_niches,))
        j = jnp.argmin(jnp.where(open_, count + noise, jnp.inf))
        members = pool & (niche == j)
        nearest = jnp.argmin(jnp.where(members, distance, jnp.inf))
        anyone = jnp.argmax(jnp.where(members, jax.random.uniform(k_member, (total,)), -1.0))
        pick = jnp.where(count[j] == 0, nearest, anyone)
        return (
            picked.at[pick].set(done),
            done + 1,
            pool.at[pick].set(False),
            count.at[j].add(1),
            key,
        )

    start = (jnp.full(total, total, jnp.int32), jnp.int32(0), pool, count, key)
    return jax.lax.while_loop(cond, body, start)[0]


class NSGA3Strategy(NSGA2Strategy):
    """NSGA-III: :class:`~evorl_pop.algorithms.nsga2.NSGA2Strategy` with parents drawn at
    random and survival by reference directions (``directions``: ``(H, k)`` points of
    the unit simplex)."""

    def __init__(self, population_size: int, num_dims: int, directions, **variation):
        super().__init__(population_size, num_dims, **variation)
        self.directions = jnp.asarray(directions)

    def select(self, key, state, count: int):
        """``count`` parents at random: Deb and Jain's NSGA-III has no tournament (pymoo's
        compares only constraint violations, then picks either)."""
        return jax.random.randint(key, (count,), 0, self.population_size)

    def init(self, key, population, fitness, params=None):
        del params
        fitness = fitness.reshape(population.shape[0], -1)
        k = fitness.shape[1]
        memory = (
            jnp.full(k, jnp.inf, fitness.dtype),
            jnp.full(k, -jnp.inf, fitness.dtype),
            jnp.full((k, k), jnp.inf, fitness.dtype),
        )
        born = jnp.zeros(population.shape[0], jnp.int32)
        return self.survive(key, population, fitness, born, jnp.int32(0), memory)

    def tell(self, key, population, fitness, state: NSGA3State, params=None):
        del params
        generation = state.generation + 1
        born = jnp.full(population.shape[0], generation, jnp.int32)
        new = self.survive(
            key,
            jnp.concatenate([state.population, population]),
            jnp.concatenate([state.fitness, fitness.reshape(population.shape[0], -1)]),
            jnp.concatenate([state.born, born]),
            generation,
            (state.ideal, state.worst, state.extremes),
        )
        return new, {}

    def survive(self, key, population, fitness, born, generation, memory) -> NSGA3State:
        """The ``population_size`` survivors: whole fronts, then the overflowing front's
        members chosen by niching (module docstring); ordered by front, then as chosen."""
        n, total = self.population_size, fitness.shape[0]
        rank = nondominated_ranks(fitness, needed=n)
        last = jnp.argmax(jnp.cumsum(jnp.bincount(rank, length=total + 1)) >= n)
        chosen, pool = rank < last, rank == last
        ideal, worst, extremes, nadir = update_normalization(fitness, rank == 0, *memory)
        niche, distance = associate(normalize(fitness, ideal, nadir), self.directions)
        h = self.directions.shape[0]
        picked = niching(key, chosen, pool, niche, distance, h, n - jnp.sum(chosen))
        keep = chosen | (picked < total)
        order = jnp.lexsort((jnp.arange(total), picked, rank, ~keep))[:n]
        return NSGA3State(
            population=population[order],
            fitness=fitness[order],
            rank=rank[order],
            crowding=jnp.zeros(n, fitness.dtype),  # no crowding: parents are drawn at random
            born=born[order],
            generation=generation,
            ideal=ideal,
            worst=worst,
            extremes=extremes,
        )


@dataclasses.dataclass(frozen=True)
class NSGA3Config(NSGA2Config):
    """Configuration of an NSGA-III run: :class:`~evorl_pop.algorithms.nsga2.NSGA2Config`'s
    fields, with NSGA-III's own defaults, and the reference directions.

    The defaults are Deb and Jain's (2014, section V-A: SBX with ``p_c = 1`` and
    ``eta_c = 30``, polynomial mutation with ``p_m = 1 / n`` and ``eta_m = 20``), which
    are also pymoo 0.6's (``NSGA3``: ``SBX(eta=30, prob=1.0)``, ``PM(eta=20)``); as
    pymoo, each variable of a crossing pair crosses with probability 0.5, and a child
    is mutated at all with probability 0.9 (pymoo's ``PM``), which the paper does not
    say (``mutation_child_prob=1``: every child). pymoo also drops duplicate
    offspring; this NSGA-III does not.

    Attributes:
      task: the problem (default ``mo/dtlz2`` with 3 objectives: the paper's first).
      population_size: members kept, and offspring made, each generation (92: the
        smallest multiple of 4 no less than the 91 directions of 12 partitions for
        3 objectives, the paper's table I).
      crossover_prob: SBX: the probability that a pair of parents crosses (1.0:
        Deb and Jain; pymoo).
      eta_crossover: SBX's distribution index (30: Deb and Jain; pymoo).
      mutation_prob: polynomial mutation's probability per variable (``None``:
        ``1 / num_dims``, Deb and Jain; pymoo's ``PM``).
      eta_mutation: polynomial mutation's distribution index (20: Deb and Jain; pymoo).
      mutation_child_prob: the probability that a child is mutated at all (0.9:
        pymoo's ``PM`` default; Deb and Jain mutate every child).
      ref_partitions: Das-Dennis partitions of each objective's axis: the
        reference directions are the ``C(p + k - 1, k - 1)`` points of the simplex
        (``None``: the most that are no more than ``population_size``).
    """

    task: str = "mo/dtlz2"
    population_size: int = 92
    crossover_prob: float = 1.0
    eta_crossover: float = 30.0
    mutation_prob: float | None = None
    eta_mutation: float = 20.0
    mutation_child_prob: float = 0.9
    ref_partitions: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.ref_partitions is not None and self.ref_partitions < 1:
            raise ConfigError(f"ref_partitions must be at least 1, got {self.ref_partitions}.")


class NSGA3(NSGA2):
    """NSGA-III on a task, its population evaluated on the mesh (see the module docstring)."""

    def make_strategy(self, config: NSGA3Config, task) -> NSGA3Strategy:
        k = num_objectives(task)  # 1 unless the task is MultiObjective
        p = config.ref_partitions or default_partitions(config.population_size, k)
        directions = das_dennis(p, k)
        return NSGA3Strategy(
            config.population_size, task.num_dims, directions, **self.variation(config, task)
        )


registry.register_algorithm(
    "nsga3",
    NSGA3Config,
    NSGA3,
    "NSGA-III: multi-objective search by reference directions (mo/dtlz2 with 3 objectives, ...)",
)
