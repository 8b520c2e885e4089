"""RVEA (Cheng, Jin, Olhofer and Sendhoff 2016) on a sharded population: the reference
vector guided evolutionary algorithm, for 3 objectives or more.

The generation, in the engine's ask -> evaluate (sharded over ``POP``) -> tell::

    ask   parents drawn at random from the population ─► SBX ─► polynomial
          mutation: population_size offspring
    tell  parents + offspring, translated by their least objectives z_min
          ─► each candidate to the reference vector of least angle theta
          ─► per vector, the candidate of least angle-penalised distance
               APD = (1 + k (t / t_max)^alpha theta / gamma_v) |F - z_min|
             (gamma_v: the vector's least angle to another; t: the generation)
          ─► every ceil(adapt_fraction * t_max) generations, the vectors adapt
             to the survivors' ranges: v_i = v0_i * (z_max - z_min), normalised

The reference vectors are the unit Das-Dennis directions (NSGA-III's), the
most that are no more than ``population_size``. One member survives per vector
that has candidates, so the population holds at most one member per vector:
the state keeps one slot per vector, ``valid`` where it is filled (an empty
slot holds a copy of a member, ranked 2, and is never a parent). ``t_max`` is
``max_generations`` (past it the penalty stays at ``k theta / gamma``).
Everything is in JAX with fixed shapes; the selection is one ``(candidates,
vectors)`` angle matrix.
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.algorithms.mo_config import NSGA2Config
from evorl_pop.algorithms.mo_variation import polynomial_mutation, sbx
from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Strategy, NSGAState
from evorl_pop.algorithms.nsga3 import default_partitions
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import num_objectives
from evorl_pop.core.pareto import dominates
from evorl_pop.tasks.multiobjective import das_dennis

#: The least distance or angle divided by (float32's smallest normal is far below).
TINY = 1e-12


def unit(vectors):
    """Rows scaled to length 1."""
    return vectors / jnp.linalg.norm(vectors, axis=-1, keepdims=True)


def least_angles(vectors):
    """gamma: each unit vector's least angle to another (1 with a single vector)."""
    cosine = vectors @ vectors.T
    h = vectors.shape[0]
    nearest = jnp.max(jnp.where(jnp.eye(h, dtype=bool), -jnp.inf, cosine), axis=1)
    gamma = jnp.arccos(jnp.clip(nearest, -1.0, 1.0))
    return jnp.where(jnp.isfinite(nearest), jnp.maximum(gamma, TINY), 1.0)


def apd_select(fitness, alive, vectors, penalty):
    """RVEA's elitist selection: each vector's candidate of least APD.

    Args:
      fitness: ``(m, k)`` candidates, minimised; alive: ``(m,)`` the ones taking part.
      vectors: ``(H, k)`` unit reference vectors.
      penalty: ``(t / t_max) ** alpha``.

    Returns:
      ``(chosen, filled)``: ``(H,)`` each vector's candidate, and whether it has any.
    """
    m, k = fitness.shape
    h = vectors.shape[0]
    least = jnp.min(jnp.where(alive[:, None], fitness, jnp.inf), axis=0)
    translated = jnp.where(alive[:, None], fitness - least, 0.0)
    distance = jnp.linalg.norm(translated, axis=1)
    cosine = (translated / jnp.maximum(distance, TINY)[:, None]) @ vectors.T
    niche = jnp.argmax(cosine, axis=1)
    theta = jnp.arccos(jnp.clip(cosine[jnp.arange(m), niche], -1.0, 1.0))
    gamma = least_angles(vectors)
    apd = (1.0 + k * penalty * theta / gamma[niche]) * distance
    apd = jnp.where(alive, apd, jnp.inf)
    least_apd = jax.ops.segment_min(apd, niche, h)
    # the first candidate of least APD in each niche (the lowest index on a tie)
    first = jnp.where(alive & (apd == least_apd[niche]), jnp.arange(m), m)
    chosen = jax.ops.segment_min(first, niche, h)
    filled = jax.ops.segment_max(alive.astype(jnp.int32), niche, h) > 0
    return jnp.where(filled, chosen, 0), filled


def adapt(initial, fitness, valid):
    """The vectors adapted to the ranges of the valid rows: ``initial * (z_max - z_min)``,
    each normalised (``initial``: the unit Das-Dennis vectors)."""
    low = jnp.min(jnp.where(valid[:, None], fitness, jnp.inf), axis=0)
    high = jnp.max(jnp.where(valid[:, None], fitness, -jnp.inf), axis=0)
    return unit(initial * jnp.maximum(high - low, TINY))


@flax.struct.dataclass
class RVEAState(NSGAState):
    """Slot ``i`` is reference vector ``i``'s survivor, where ``valid``; ``rank``: 0 on
    the survivors' non-dominated front, 1 for the other survivors, 2 for empty slots."""

    vectors: jax.Array  # (H, k) the reference vectors, unit, as adapted
    valid: jax.Array  # (H,) whether the slot holds a survivor


class RVEAStrategy(NSGA2Strategy):
    """RVEA with evosax's interface (module docstring).

    Args:
      population_size: offspring made each generation (and the initial population).
      num_dims: variables of a candidate.
      directions: ``(H, k)`` points of the simplex: the initial reference vectors.
      alpha: the rate of the angle penalty's growth.
      adapt_every: generations between the vectors' adaptations.
      max_generations: t_max of the penalty.
      variation: NSGA-II's search box and variation settings.
    """

    def __init__(
        self,
        population_size: int,
        num_dims: int,
        directions,
        alpha: float = 2.0,
        adapt_every: int = 10,
        max_generations: int = 100,
        **variation,
    ):
        super().__init__(population_size, num_dims, **variation)
        directions = np.asarray(directions, np.float64)
        self.directions = directions / np.linalg.norm(directions, axis=1, keepdims=True)
        self.alpha = alpha
        self.adapt_every = adapt_every
        self.max_generations = max_generations

    def survive(self, population, fitness, born, alive, vectors, generation) -> RVEAState:
        """One survivor per reference vector with candidates (:func:`apd_select`)."""
        progress = jnp.minimum(generation / self.max_generations, 1.0)
        penalty = progress.astype(fitness.dtype) ** self.alpha
        chosen, valid = apd_select(fitness, alive, vectors, penalty)
        fitness = fitness[chosen]
        dominated = jnp.any(dominates(jnp.where(valid[:, None], fitness, jnp.inf)), axis=0)
        rank = jnp.where(valid, dominated.astype(jnp.int32), 2)
        return RVEAState(
            population=population[chosen],
            fitness=fitness,
            rank=rank,
            crowding=jnp.zeros(chosen.shape[0], fitness.dtype),
            born=born[chosen],
            generation=generation,
            vectors=vectors,
            valid=valid,
        )

    def init(self, key, population, fitness, params=None):
        del key, params
        fitness = fitness.reshape(population.shape[0], -1)
        n = population.shape[0]
        born, alive = jnp.zeros(n, jnp.int32), jnp.ones(n, bool)
        vectors = jnp.asarray(self.directions, fitness.dtype)
        return self.survive(population, fitness, born, alive, vectors, jnp.int32(0))

    def ask(self, key, state: RVEAState, params=None):
        del params
        k_select, k_cross, k_mutate = jax.random.split(key, 3)
        pairs = -(-self.population_size // 2)
        # uniform over the filled slots: the filled first, then a draw below their count
        filled = jnp.argsort(~state.valid, stable=True)
        draw = jax.random.randint(k_select, (2 * pairs,), 0, jnp.sum(state.valid))
        parents = state.population[filled[draw]]
        first, second = sbx(
            k_cross,
            parents[:pairs],
            parents[pairs:],
            self.lower,
            self.upper,
            self.eta_crossover,
            self.crossover_prob,
        )
        children = jnp.concatenate([first, second])[: self.population_size]
        children = polynomial_mutation(
            k_mutate, children, self.lower, self.upper, self.eta_mutation, self.mutation_prob
        )
        return children, state

    def tell(self, key, population, fitness, state: RVEAState, params=None):
        del key, params
        generation = state.generation + 1
        n = population.shape[0]
        new = self.survive(
            jnp.concatenate([state.population, population]),
            jnp.concatenate([state.fitness, fitness.reshape(n, -1)]),
            jnp.concatenate([state.born, jnp.full(n, generation, jnp.int32)]),
            jnp.concatenate([state.valid, jnp.ones(n, bool)]),
            state.vectors,
            generation,
        )
        initial = jnp.asarray(self.directions, new.fitness.dtype)
        due = generation % self.adapt_every == 0
        vectors = jnp.where(due, adapt(initial, new.fitness, new.valid), new.vectors)
        return new.replace(vectors=vectors), {}

    def get_mean(self, state: RVEAState):
        """The front's member best in the first objective (one objective: the best)."""
        return state.population[jnp.lexsort((state.fitness[:, 0], state.rank))[0]]


@dataclasses.dataclass(frozen=True)
class RVEAConfig(NSGA2Config):
    """Configuration of an RVEA run: :class:`~evorl_pop.algorithms.nsga2.NSGA2Config`'s
    fields (SBX's defaults Cheng et al.'s: every pair crosses, index 30), and

    Attributes:
      population_size: offspring each generation; the reference vectors are the
        most Das-Dennis directions no more than it.
      ref_partitions: Das-Dennis partitions of each objective's axis (``None``:
        the most whose directions are no more than ``population_size``).
      alpha: the rate of the angle penalty's growth.
      adapt_fraction: fr, the vectors adapt every ``ceil(fr * max_generations)``
        generations (0: never).
      max_generations: t_max, the generations the penalty grows over.
    """

    task: str = "mo/dtlz2"
    population_size: int = 92
    crossover_prob: float = 1.0
    eta_crossover: float = 30.0
    ref_partitions: int | None = None
    alpha: float = 2.0
    adapt_fraction: float = 0.1
    max_generations: int = 100

    def validate(self) -> None:
        super().validate()
        if self.ref_partitions is not None and self.ref_partitions < 1:
            raise ConfigError(f"ref_partitions must be at least 1, got {self.ref_partitions}.")
        if self.max_generations < 1:
            raise ConfigError(f"max_generations must be at least 1, got {self.max_generations}.")
        if not 0 <= self.adapt_fraction <= 1:
            raise ConfigError(f"adapt_fraction must be in [0, 1], got {self.adapt_fraction}.")
        if self.alpha < 0:
            raise ConfigError(f"alpha must be at least 0, got {self.alpha}.")

    @property
    def adapt_every(self) -> int:
        """Generations between the vectors' adaptations (past the run's end for 0)."""
        if self.adapt_fraction == 0:
            return np.iinfo(np.int32).max
        return max(1, math.ceil(self.adapt_fraction * self.max_generations))


class RVEA(NSGA2):
    """RVEA on a task, its population evaluated on the mesh (see the module docstring)."""

    def make_strategy(self, config: RVEAConfig, task) -> RVEAStrategy:
        k = num_objectives(task)
        p = config.ref_partitions or default_partitions(config.population_size, k)
        return RVEAStrategy(
            config.population_size,
            task.num_dims,
            das_dennis(p, k),
            alpha=config.alpha,
            adapt_every=config.adapt_every,
            max_generations=config.max_generations,
            **self.variation(config, task),
        )

    def front(self, state) -> dict[str, np.ndarray]:
        """NSGA-II's front, the population without its empty slots."""
        front = super().front(state)
        front["population"] = front["population"][np.asarray(state.strategy_state.valid)]
        return front


registry.register_algorithm(
    "rvea",
    RVEAConfig,
    RVEA,
    "RVEA: multi-objective search by reference vectors and angle-penalised distance",
)
