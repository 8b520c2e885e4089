"""MOEA/D (Zhang and Li 2007) on a sharded population: one member per weight vector,
each the best found for its scalar subproblem, improved by its neighbours' offspring.

The generation, in the engine's ask -> evaluate (sharded over ``POP``) -> tell::

    ask   for each subproblem i: two distinct parents from its neighbourhood B(i)
          (the T nearest weight vectors, i's own included), or, with probability
          1 - neighbour_prob, from the whole population ─► SBX (the first child)
          ─► polynomial mutation: one offspring y_i per subproblem
    tell  for i = 0, 1, ..., N - 1, in order (a lax.scan over the offspring):
            z <- min(z, F(y_i))                                   the ideal point
            for j in B(i), visited in random order: x_j <- y_i wherever
            g(y_i | w_j, z) <= g(x_j | w_j, z), at most max_replacements times

The weights are Das and Dennis's points of the simplex (NSGA-III's reference
directions), the most that are no more than ``population_size`` (exactly that
many with two objectives; ``population_size`` copies of ``[1]`` with one). The
scalarising function ``g`` is Tchebycheff's (``decomposition: tchebycheff``) or the
penalty-based boundary intersection (``pbi``, penalty ``pbi_theta = 5``).

The defaults are Zhang and Li's 2007 algorithm: parents always from the
neighbourhood (``neighbour_prob = 1``) and every improved neighbour replaced
(``max_replacements = None``). ``neighbour_prob < 1`` and a finite
``max_replacements`` are the later variants' (MOEA/D-DE, Li and Zhang 2009),
the replacements always among the neighbourhood.

Batched: the classic algorithm makes, evaluates and inserts one offspring at a
time, so offspring ``i`` may have parents that offspring ``< i`` just replaced.
Here the ``N`` offspring are all made from the population at the start of the
generation and evaluated together on the ``POP`` axis; then the scan applies
their ideal-point updates and replacements one offspring at a time, in
subproblem order, on the replicated state: exactly the sequential updates, given
those offspring. The only difference from the classic loop is where the parents
come from (the generation's start, as pymoo's ParallelMOEAD).
"""

from __future__ import annotations

import dataclasses

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

#: The scalarising functions, by the name ``decomposition`` takes.
DECOMPOSITIONS = ("tchebycheff", "pbi")
#: A zero weight's stand-in in Tchebycheff's function (so no objective is ignored).
ZERO_WEIGHT = 1e-6


def tchebycheff(fitness, weights, ideal):
    """``max_j w_j |f_j - z_j|`` of each row (zero weights as :data:`ZERO_WEIGHT`)."""
    weights = jnp.where(weights > 0, weights, ZERO_WEIGHT)
    return jnp.max(weights * jnp.abs(fitness - ideal), axis=-1)


def pbi(fitness, weights, ideal, theta: float = 5.0):
    """The penalty-based boundary intersection ``d1 + theta * d2`` of each row: ``d1``
    the distance from ``z`` along the weight's direction, ``d2`` the distance to it."""
    unit = weights / jnp.linalg.norm(weights, axis=-1, keepdims=True)
    t = fitness - ideal
    d1 = jnp.abs(jnp.sum(t * unit, axis=-1))
    d2 = jnp.linalg.norm(t - d1[..., None] * unit, axis=-1)
    return d1 + theta * d2


def neighbourhoods(weights: np.ndarray, size: int) -> np.ndarray:
    """Each weight's ``size`` nearest weights (Euclidean), itself first; ties by the
    nearest index (copies of one weight: a ring of neighbours)."""
    distance = np.linalg.norm(weights[:, None] - weights[None], axis=-1)
    index = np.arange(len(weights))
    apart = np.abs(index[None] - index[:, None])
    return np.lexsort((apart, distance), axis=1)[:, :size].astype(np.int32)


def replace(state, children, child_fitness, order, weights, neighbours, limit, decompose):
    """Each offspring's ideal-point update and replacements, in subproblem order.

    Args:
      state: the :class:`MOEADState` before the updates.
      children, child_fitness: offspring ``i`` of subproblem ``i``, ``(N, dims)``, ``(N, k)``.
      order: ``(N, T)``: the order each offspring visits its neighbourhood in (a
        permutation of ``0 .. T - 1`` per row).
      weights: ``(N, k)``; neighbours: ``(N, T)`` indices.
      limit: the most members one offspring replaces.
      decompose: ``g(fitness, weights, ideal)``, row by row.

    Returns:
      ``(population, fitness, born, ideal)`` after every offspring.
    """
    generation = state.generation + 1
    children, child_fitness, order, weights, neighbours = map(
        jnp.asarray, (children, child_fitness, order, weights, neighbours)
    )

    def one(carry, i):
        population, fitness, born, ideal = carry
        ideal = jnp.minimum(ideal, child_fitness[i])
        rows = neighbours[i][order[i]]
        current = decompose(fitness[rows], weights[rows], ideal)
        offered = decompose(child_fitness[i][None], weights[rows], ideal)
        better = offered <= current
        take = better & (jnp.cumsum(better) <= limit)
        population = population.at[rows].set(
            jnp.where(take[:, None], children[i], population[rows])
        )
        fitness = fitness.at[rows].set(jnp.where(take[:, None], child_fitness[i], fitness[rows]))
        born = born.at[rows].set(jnp.where(take, generation, born[rows]))
        return (population, fitness, born, ideal), None

    start = (state.population, state.fitness, state.born, state.ideal)
    steps = jnp.arange(children.shape[0])
    return jax.lax.scan(one, start, steps)[0]


@flax.struct.dataclass
class MOEADState(NSGAState):
    """Member ``i`` is subproblem ``i``'s (weight ``i``); ``rank``: 0 on the population's
    non-dominated front, else 1; ``crowding``: zeros (MOEA/D has none)."""

    ideal: jax.Array  # (k,) the least of each objective seen so far


class MOEADStrategy(NSGA2Strategy):
    """MOEA/D with evosax's interface (module docstring).

    Args:
      weights: ``(N, k)`` weight vectors, one subproblem (and member) each.
      num_dims: variables of a candidate.
      neighbours: T, the neighbourhood's size (at most N).
      neighbour_prob: the probability that a subproblem's parents are its neighbours'.
      max_replacements: the most members an offspring replaces (``None``: T).
      decomposition: ``'tchebycheff'`` or ``'pbi'``; theta: PBI's penalty.
      variation: NSGA-II's search box and variation settings.
    """

    def __init__(
        self,
        weights,
        num_dims: int,
        neighbours: int = 20,
        neighbour_prob: float = 1.0,
        max_replacements: int | None = None,
        decomposition: str = "tchebycheff",
        theta: float = 5.0,
        **variation,
    ):
        weights = np.asarray(weights, np.float64)
        super().__init__(weights.shape[0], num_dims, **variation)
        self.weights = weights
        size = min(neighbours, weights.shape[0])
        self.neighbours = neighbourhoods(weights, size)
        self.neighbour_prob = neighbour_prob
        self.max_replacements = size if max_replacements is None else max_replacements
        self.decomposition = decomposition
        self.theta = theta

    def decompose(self, fitness, weights, ideal):
        """The subproblems' scalar values: ``g(fitness | weights, ideal)`` row by row."""
        if self.decomposition == "pbi":
            return pbi(fitness, weights, ideal, self.theta)
        return tchebycheff(fitness, weights, ideal)

    @staticmethod
    def moead_state(population, fitness, born, ideal, generation) -> MOEADState:
        """The state, its ranks those of the population's non-dominated front."""
        dominated = jnp.any(dominates(fitness), axis=0)
        zeros = jnp.zeros(fitness.shape[0], fitness.dtype)
        return MOEADState(
            population=population,
            fitness=fitness,
            rank=dominated.astype(jnp.int32),
            crowding=zeros,
            born=born,
            generation=generation,
            ideal=ideal,
        )

    def init(self, key, population, fitness, params=None):
        del key, params
        fitness = fitness.reshape(population.shape[0], -1)
        born = jnp.zeros(population.shape[0], jnp.int32)
        return self.moead_state(population, fitness, born, jnp.min(fitness, axis=0), jnp.int32(0))

    def parents(self, key, count: int):
        """Two distinct parents per subproblem: from its neighbourhood with probability
        ``neighbour_prob``, else from the whole population."""
        k_pool, k_near, k_first, k_second = jax.random.split(key, 4)
        size = self.neighbours.shape[1]
        near = jnp.argsort(jax.random.uniform(k_near, (count, size)), axis=1)
        rows = jnp.asarray(self.neighbours)
        pick = jnp.take_along_axis(rows, near[:, : min(2, size)], axis=1)
        near_a, near_b = pick[:, 0], pick[:, -1]
        any_a = jax.random.randint(k_first, (count,), 0, count)
        shift = jax.random.randint(k_second, (count,), 0, max(count - 1, 1))
        any_b = (any_a + 1 + shift) % count
        use_near = jax.random.uniform(k_pool, (count,)) < self.neighbour_prob
        return jnp.where(use_near, near_a, any_a), jnp.where(use_near, near_b, any_b)

    def ask(self, key, state: MOEADState, params=None):
        del params
        k_parents, k_cross, k_mutate = jax.random.split(key, 3)
        a, b = self.parents(k_parents, self.population_size)
        child, _ = sbx(
            k_cross,
            state.population[a],
            state.population[b],
            self.lower,
            self.upper,
            self.eta_crossover,
            self.crossover_prob,
        )
        child = polynomial_mutation(
            k_mutate, child, self.lower, self.upper, self.eta_mutation, self.mutation_prob
        )
        return child, state

    def tell(self, key, population, fitness, state: MOEADState, params=None):
        del params
        fitness = fitness.reshape(population.shape[0], -1)
        shape = self.neighbours.shape
        order = jnp.argsort(jax.random.uniform(key, shape), axis=1)
        weights = jnp.asarray(self.weights, fitness.dtype)
        rows = jnp.asarray(self.neighbours)
        limit = self.max_replacements
        members, values, born, ideal = replace(
            state, population, fitness, order, weights, rows, limit, self.decompose
        )
        return self.moead_state(members, values, born, ideal, state.generation + 1), {}

    def get_mean(self, state: MOEADState):
        """The front's member best in the first objective (one objective: the best)."""
        return state.population[jnp.lexsort((state.fitness[:, 0], state.rank))[0]]


@dataclasses.dataclass(frozen=True)
class MOEADConfig(NSGA2Config):
    """Configuration of a MOEA/D run: :class:`~evorl_pop.algorithms.nsga2.NSGA2Config`'s
    fields (SBX's defaults Zhang and Li's: every pair crosses, index 20), and

    Attributes:
      population_size: the most weight vectors (and members): the Das-Dennis
        points no more than it (exactly it with two objectives).
      ref_partitions: Das-Dennis partitions of each objective's axis (``None``:
        the most whose points are no more than ``population_size``).
      neighbours: T, each weight's neighbourhood (itself included).
      neighbour_prob: delta, the probability of parents from the neighbourhood
        (1: Zhang and Li 2007; else from the whole population).
      max_replacements: n_r, the most members one offspring replaces (``None``:
        every improved neighbour, Zhang and Li 2007).
      decomposition: ``tchebycheff`` or ``pbi``.
      pbi_theta: PBI's penalty on the distance to the weight's direction.
    """

    population_size: int = 100
    crossover_prob: float = 1.0
    eta_crossover: float = 20.0
    ref_partitions: int | None = None
    neighbours: int = 20
    neighbour_prob: float = 1.0
    max_replacements: int | None = None
    decomposition: str = "tchebycheff"
    pbi_theta: float = 5.0

    def validate(self) -> None:
        super().validate()
        for name in ("ref_partitions", "max_replacements"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}.")
        if self.neighbours < 2:
            raise ConfigError(f"neighbours must be at least 2, got {self.neighbours}.")
        if not 0 <= self.neighbour_prob <= 1:
            raise ConfigError(
                f"neighbour_prob must be a probability in [0, 1], got {self.neighbour_prob}."
            )
        if self.decomposition not in DECOMPOSITIONS:
            raise ConfigError(
                f"decomposition must be one of {', '.join(DECOMPOSITIONS)}; "
                f"got {self.decomposition!r}."
            )
        if self.pbi_theta < 0:
            raise ConfigError(f"pbi_theta must be at least 0, got {self.pbi_theta}.")


def weight_vectors(config, k: int) -> np.ndarray:
    """The Das-Dennis weights of a config (``ref_partitions``, ``population_size``) for
    ``k`` objectives; one objective: ``population_size`` copies of ``[1]``."""
    if k == 1:
        return np.ones((config.population_size, 1))
    return das_dennis(config.ref_partitions or default_partitions(config.population_size, k), k)


class MOEAD(NSGA2):
    """MOEA/D on a task, its population evaluated on the mesh (see the module docstring)."""

    def make_strategy(self, config: MOEADConfig, task) -> MOEADStrategy:
        return MOEADStrategy(
            weight_vectors(config, num_objectives(task)),
            task.num_dims,
            neighbours=config.neighbours,
            neighbour_prob=config.neighbour_prob,
            max_replacements=config.max_replacements,
            decomposition=config.decomposition,
            theta=config.pbi_theta,
            **self.variation(config, task),
        )


registry.register_algorithm(
    "moead",
    MOEADConfig,
    MOEAD,
    "MOEA/D: multi-objective search by decomposition (Tchebycheff or PBI subproblems)",
)
