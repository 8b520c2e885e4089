"""NSGA-III (Deb and Jain 2014) on a sharded population: NSGA-II's generation with
survival by reference directions instead of crowding, for 3 objectives or more.

Everything but survival is :mod:`~evorl_pop.algorithms.nsga2`'s (binary
tournaments, here by front alone, SBX, polynomial mutation, the engine's
evaluation, the metrics and the exported front)::

    parents + offspring ─► non-dominated fronts until the front that overflows
        ─► normalised: ideal point, extreme points (achievement scalarising),
           the hyperplane's intercepts (the worst values where it degenerates)
        ─► each member to its nearest reference direction (Das and Dennis's
           simplex points), by perpendicular distance
        ─► niching: the overflowing front fills the least crowded directions,
           one member at a time (the nearest for an empty niche, else any)

All in JAX with fixed shapes; the niching loop is a ``while_loop`` over the
members still to choose.
"""

from __future__ import annotations

import dataclasses
import math

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


def normalize(fitness, considered):
    """Deb and Jain's normalisation of the considered rows: translated by the ideal point,
    divided by the intercepts of the hyperplane through the extreme points (the
    worst translated values where that plane degenerates)."""
    k = fitness.shape[1]
    ideal = jnp.min(jnp.where(considered[:, None], fitness, jnp.inf), axis=0)
    t = jnp.where(considered[:, None], fitness - ideal, 0.0)
    weights = jnp.eye(k) + 1e-6 * (1.0 - jnp.eye(k))
    asf = jnp.max(t[:, None, :] / weights[None], axis=-1)  # (rows, axes)
    extreme = t[jnp.argmin(jnp.where(considered[:, None], asf, jnp.inf), axis=0)]
    intercepts = 1.0 / jnp.linalg.solve(extreme, jnp.ones(k, t.dtype))
    worst = jnp.max(t, axis=0)
    bad = jnp.any(~jnp.isfinite(intercepts) | (intercepts <= 1e-6))
    intercepts = jnp.where(bad, worst, intercepts)
    return t / jnp.where(intercepts > 1e-12, intercepts, 1.0)


def associate(normalized, directions):
    """Each row's nearest reference direction and its perpendicular distance to it."""
    unit = directions / jnp.linalg.norm(directions, axis=1, keepdims=True)
    along = normalized @ unit.T  # (rows, directions)
    square = jnp.sum(normalized**2, axis=1, keepdims=True) - along**2
    niche = jnp.argmin(square, axis=1)
    return niche, jnp.sqrt(jnp.maximum(jnp.min(square, axis=1), 0.0))


class NSGA3Strategy(NSGA2Strategy):
    """NSGA-III: :class:`~evorl_pop.algorithms.nsga2.NSGA2Strategy` with survival by
    reference directions (``directions``: ``(H, k)`` points of the unit simplex)."""

    def __init__(self, population_size: int, num_dims: int, directions, **variation):
        super().__init__(population_size, num_dims, **variation)
        self.directions = jnp.asarray(directions)

    def survive(self, key, population, fitness, born, generation) -> NSGAState:
        """The ``population_size`` survivors: whole fronts, then the overflowing front's
        members chosen by niching (module docstring); ordered by front, then as chosen."""
        n, total = self.population_size, fitness.shape[0]
        rank = nondominated_ranks(fitness, needed=n)
        last = jnp.argmax(jnp.cumsum(jnp.bincount(rank, length=total + 1)) >= n)
        chosen, pool = rank < last, rank == last
        niche, distance = associate(normalize(fitness, chosen | pool), self.directions)
        h = self.directions.shape[0]
        count = jax.ops.segment_sum(chosen.astype(jnp.int32), niche, h)

        need = n - jnp.sum(chosen)

        def cond(carry):
            return jnp.sum(carry[1]) < need

        def body(carry):
            picked, taken, pool, count, key = carry
            key, k_niche, k_member = jax.random.split(key, 3)
            open_ = jax.ops.segment_max(pool.astype(jnp.int32), niche, h) > 0
            # the least crowded open niche; ties at random (counts are integers)
            j = jnp.argmin(jnp.where(open_, count + jax.random.uniform(k_niche, (h,)), jnp.inf))
            members = pool & (niche == j)
            nearest = jnp.argmin(jnp.where(members, distance, jnp.inf))
            anyone = jnp.argmax(jnp.where(members, jax.random.uniform(k_member, (total,)), -1.0))
            pick = jnp.where(count[j] == 0, nearest, anyone)
            order = picked.at[pick].set(jnp.sum(taken))
            return (
                order,
                taken.at[pick].set(True),
                pool.at[pick].set(False),
                count.at[j].add(1),
                key,
            )

        picked = jnp.full(total, total, jnp.int32)  # the order the niching chose them in
        start = (picked, jnp.zeros(total, bool), pool, count, key)
        picked, taken, _, _, _ = jax.lax.while_loop(cond, body, start)
        keep = chosen | taken
        order = jnp.lexsort((jnp.arange(total), picked, rank, ~keep))[:n]
        zeros = jnp.zeros(n, fitness.dtype)  # no crowding: tournaments compare fronts
        return self.state(
            population[order], fitness[order], rank[order], zeros, born[order], generation
        )


@dataclasses.dataclass(frozen=True)
class NSGA3Config(NSGA2Config):
    """Configuration of an NSGA-III run: :class:`~evorl_pop.algorithms.nsga2.NSGA2Config`'s
    fields, and

    Attributes:
      ref_partitions: Das-Dennis partitions of each objective's axis: the
        reference directions are the ``C(p + k - 1, k - 1)`` points of the simplex
        (``None``: the most that are no more than ``population_size``).
    """

    task: str = "mo/dtlz2"
    population_size: int = 92
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
