"""NSGA-II (Deb, Pratap, Agarwal and Meyarivan 2002) on a sharded population.

A multi-objective genetic algorithm in JAX, with fixed shapes, as an evosax-style
strategy run by the engine (:class:`~evorl_pop.core.engine.Engine`): one
generation is the engine's ask -> evaluate (the one evaluator, sharded over
``POP``) -> tell::

    ask   binary tournaments by the crowded comparison (lower front, then larger
          crowding distance) ─► SBX crossover ─► polynomial mutation, in bounds
    tell  parents + offspring ─► non-dominated fronts ─► crowding distance
          ─► the best population_size survive, by front then crowding

The task returns ``k`` objectives per candidate (``mo/zdt1``, ``mo/dtlz2``:
:mod:`~evorl_pop.tasks.multiobjective`, or any
:class:`~evorl_pop.core.interfaces.MultiObjective` task);
a single-objective task (a black-box function, an environment) runs as ``k = 1``,
NSGA-II then being a genetic algorithm with elitist survival. Each generation
reports the front's size (:meth:`NSGA2.report`), its hypervolume against a
fixed reference point (``ref_point``, or the task's:
:class:`~evorl_pop.core.interfaces.ReferencePoint`), and IGD / IGD+ where the
true front is known (:class:`~evorl_pop.core.interfaces.ParetoFront`). At the
end the run writes ``front.csv`` and ``front.png`` (:meth:`NSGA2.export`).

The variation operators are in :mod:`~evorl_pop.algorithms.mo_variation`, the
config in :mod:`~evorl_pop.algorithms.mo_config`, the files and figures in
:mod:`~evorl_pop.algorithms.mo_plots`; this module re-exports their names.
"""

from __future__ import annotations

from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.algorithms.mo_config import NSGA2Config
from evorl_pop.algorithms.mo_plots import plot_curve, plot_front, write_front_csv
from evorl_pop.algorithms.mo_variation import DEFAULT_BOUNDS, polynomial_mutation, sbx
from evorl_pop.base import float_dtype
from evorl_pop.core.engine import Engine, num_objectives, to_minimization
from evorl_pop.core.interfaces import ParetoFront, ReferencePoint
from evorl_pop.core.pareto import crowding_distance, hypervolume, igd, nondominated_ranks

# --- the strategy ------------------------------------------------------------------------


@flax.struct.dataclass
class NSGAState:
    """The population after survival, best first (front, then crowding distance)."""

    population: jax.Array  # (pop, dims)
    fitness: jax.Array  # (pop, k), minimised
    rank: jax.Array  # (pop,) int32, 0: the non-dominated front
    crowding: jax.Array  # (pop,) within each front; inf at its extremes
    born: jax.Array  # (pop,) int32: the generation that created each member (0: initial)
    generation: jax.Array  # int32, tells so far


class NSGA2Strategy:
    """NSGA-II with evosax's interface (``init / ask / tell``) on ``(pop, k)`` fitness.

    Args:
      population_size: members kept each generation, and offspring made.
      num_dims: variables of a candidate.
      lower, upper: the search box (every variable).
      crossover_prob, eta_crossover: SBX's per-pair probability and index.
      mutation_prob, eta_mutation: polynomial mutation's per-variable probability
        (``None``: ``1 / num_dims``) and index.
      mutation_child_prob: the probability that a child is mutated at all.
    """

    def __init__(
        self,
        population_size: int,
        num_dims: int,
        lower: float = DEFAULT_BOUNDS[0],
        upper: float = DEFAULT_BOUNDS[1],
        crossover_prob: float = 0.9,
        eta_crossover: float = 15.0,
        mutation_prob: float | None = None,
        eta_mutation: float = 20.0,
        mutation_child_prob: float = 1.0,
    ):
        self.population_size = population_size
        self.num_dims = num_dims
        self.lower, self.upper = float(lower), float(upper)
        self.crossover_prob = crossover_prob
        self.eta_crossover = eta_crossover
        self.mutation_prob = 1.0 / num_dims if mutation_prob is None else mutation_prob
        self.eta_mutation = eta_mutation
        self.mutation_child_prob = mutation_child_prob

    @property
    def default_params(self):
        return ()  # the hyperparameters are the strategy's attributes (compile-time)

    def initial_population(self, key):
        """Uniform in the search box."""
        shape = (self.population_size, self.num_dims)
        return jax.random.uniform(key, shape, float_dtype(), self.lower, self.upper)

    def survive(self, key, population, fitness, born, generation) -> NSGAState:
        """The ``population_size`` best of ``population``: by front, then crowding distance."""
        del key
        n = self.population_size
        rank = nondominated_ranks(fitness, needed=n)
        crowding = crowding_distance(fitness, rank)
        order = jnp.lexsort((jnp.arange(rank.shape[0]), -crowding, rank))[:n]
        fitness = fitness[order]
        population = population[order]
        return self.state(
            population, fitness, rank[order], crowding[order], born[order], generation
        )

    @staticmethod
    def state(population, fitness, rank, crowding, born, generation) -> NSGAState:
        """The state of survivors ordered best first."""
        return NSGAState(
            population=population,
            fitness=fitness,
            rank=rank,
            crowding=crowding,
            born=born,
            generation=generation,
        )

    def init(self, key, population, fitness, params=None):
        del params
        fitness = fitness.reshape(population.shape[0], -1)
        born = jnp.zeros(population.shape[0], jnp.int32)
        return self.survive(key, population, fitness, born, jnp.int32(0))

    def select(self, key, state: NSGAState, count: int):
        """``count`` parents, each the winner of a binary tournament by the crowded
        comparison (lower front, then larger crowding distance; a tie: the first drawn)."""
        a, b = jax.random.randint(key, (2, count), 0, self.population_size)
        better_b = (state.rank[b] < state.rank[a]) | (
            (state.rank[b] == state.rank[a]) & (state.crowding[b] > state.crowding[a])
        )
        return jnp.where(better_b, b, a)

    def ask(self, key, state: NSGAState, params=None):
        del params
        k_select, k_cross, k_mutate = jax.random.split(key, 3)
        pairs = -(-self.population_size // 2)
        parents = state.population[self.select(k_select, state, 2 * pairs)]
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
        if self.mutation_child_prob < 1.0:  # else the key as before: the same runs
            k_mutate, k_child = jax.random.split(k_mutate)
            spared = jax.random.uniform(k_child, (children.shape[0], 1)) >= self.mutation_child_prob
        mutated = polynomial_mutation(
            k_mutate, children, self.lower, self.upper, self.eta_mutation, self.mutation_prob
        )
        if self.mutation_child_prob < 1.0:
            mutated = jnp.where(spared, children, mutated)
        return mutated, state

    def tell(self, key, population, fitness, state: NSGAState, params=None):
        del params
        generation = state.generation + 1
        born = jnp.full(population.shape[0], generation, jnp.int32)
        new = self.survive(
            key,
            jnp.concatenate([state.population, population]),
            jnp.concatenate([state.fitness, fitness.reshape(population.shape[0], -1)]),
            jnp.concatenate([state.born, born]),
            generation,
        )
        return new, {}

    def get_mean(self, state: NSGAState):
        """Member 0: a non-dominated extreme (the solution ``evorl-pop render`` shows)."""
        return state.population[0]


class OnEveryDevice:
    """A strategy whose ``init``, ``ask`` and ``tell`` run whole on every device of
    ``mesh``, replicated in and out (a ``shard_map`` over ``P()``).

    Left to the compiler, the replicated sort could be split across the devices
    after the sharded evaluation, with a collective in every iteration of its
    loop over the fronts; on every device whole, it needs none.
    """

    def __init__(self, strategy: NSGA2Strategy, mesh):
        self.inner = strategy
        self.mesh = mesh
        self.population_size = strategy.population_size
        self.num_dims = strategy.num_dims

    @property
    def default_params(self):
        return self.inner.default_params

    def initial_population(self, key):
        return self.inner.initial_population(key)

    def get_mean(self, state):
        return self.inner.get_mean(state)

    def _replicated(self, fn):
        return jax.shard_map(fn, mesh=self.mesh, in_specs=P(), out_specs=P())

    def init(self, key, population, fitness, params=None):
        return self._replicated(self.inner.init)(key, population, fitness)

    def ask(self, key, state, params=None):
        return self._replicated(self.inner.ask)(key, state)

    def tell(self, key, population, fitness, state, params=None):
        return self._replicated(self.inner.tell)(key, population, fitness, state)


# --- the algorithm ---------------------------------------------------------------------


class NSGA2(Engine):
    """NSGA-II on a task, its population evaluated on the mesh: the engine with
    :class:`NSGA2Strategy`, multi-objective metrics and the exported front."""

    multi_objective = True
    replicate_strategy = False  # OnEveryDevice runs it in a shard_map of its own

    def __init__(self, config: NSGA2Config, mesh=None, task=None):
        """Builds the strategy and the task, and the engine that runs them.

        Args:
          config: an :class:`NSGA2Config`.
          mesh: a mesh with a ``'POP'`` axis (``None``: every device).
          task: a ready task instead of ``config.task`` (any ``num_objectives``).

        Raises:
          ConfigError: a value of ``config`` that cannot run.
        """
        config.validate()
        self.config = config
        task = config.make_task() if task is None else task
        super().__init__(self.make_strategy(config, task), task, mesh=mesh)
        self.strategy = OnEveryDevice(self.strategy, self.mesh)
        self.num_objectives = num_objectives(task)
        ref = config.ref_point
        if ref is None and isinstance(task, ReferencePoint):
            ref = task.ref_point
        self.ref_point = None if ref is None else tuple(float(r) for r in ref)
        known = isinstance(task, ParetoFront)
        self.true_front = np.asarray(task.pareto_front()) if known else None

    @staticmethod
    def variation(config: NSGA2Config, task) -> dict:
        """The strategy's search box and variation settings, from ``config``."""
        box = task.bounds if isinstance(task, ParetoFront) else DEFAULT_BOUNDS
        lower, upper = config.bounds or box
        return {
            "lower": lower,
            "upper": upper,
            "crossover_prob": config.crossover_prob,
            "eta_crossover": config.eta_crossover,
            "mutation_prob": config.mutation_prob,
            "eta_mutation": config.eta_mutation,
            "mutation_child_prob": config.mutation_child_prob,
        }

    def make_strategy(self, config: NSGA2Config, task) -> NSGA2Strategy:
        """The strategy the engine runs: :class:`NSGA2Strategy`."""
        return NSGA2Strategy(config.population_size, task.num_dims, **self.variation(config, task))

    def minimised(self, scores):
        """Scores in the task's units, as the ``(n, k)`` minimised fitness (and back)."""
        scores = jnp.asarray(scores).reshape(scores.shape[0], -1)
        return to_minimization(scores, self.task.maximize)

    def front_metrics(self, s: NSGAState) -> dict:
        """The front's size, hypervolume (with a reference point) and IGD / IGD+ (with
        the true front) of a strategy state."""
        front = s.rank == 0
        metrics = {"front_size": jnp.sum(front, dtype=jnp.int32)}
        if not self.config.measures:
            return metrics
        dtype, maximize = s.fitness.dtype, self.task.maximize

        def measures(fitness, front):
            out = {}
            if self.ref_point is not None:
                ref = to_minimization(jnp.asarray(self.ref_point, dtype), maximize)
                out["hypervolume"] = hypervolume(fitness, ref.reshape(-1), front)
            if self.true_front is not None:
                true = to_minimization(jnp.asarray(self.true_front, dtype), maximize)
                out["igd"] = igd(fitness, true, front)
                out["igd_plus"] = igd(fitness, true, front, plus=True)
            return out

        # replicated in and out, as the state: 3 objectives or more call the host, on
        # each device, instead of the compiler moving the front to one device
        on_every_device = jax.shard_map(measures, mesh=self.mesh, in_specs=P(), out_specs=P())
        return {**metrics, **on_every_device(s.fitness, front)}

    def report(self, state, summary, key, extra) -> dict:
        """The population's statistics (per objective) and the front's measures: the
        engine's :meth:`~evorl_pop.core.engine.Engine.report` hook, pure."""
        del key
        extra = dict(extra)
        metrics = summary.metrics()
        metrics.update(
            generation=state.generation,
            evaluations=jnp.int32(self.population_size),
            **self.front_metrics(state.strategy_state),
        )
        for name in ("env_steps", "episodes"):
            metrics[name] = metrics[name] + extra.pop(name, 0)
        return {**metrics, **extra}

    def front(self, state) -> dict[str, np.ndarray]:
        """The final population's non-dominated members: ``index`` (in the population),
        ``objectives`` in the task's units, ``parameters`` and ``born`` (generation)."""
        s = state.strategy_state
        keep = np.asarray(s.rank) == 0
        objectives = np.asarray(self.minimised(s.fitness))  # the sign flip is an involution
        return {
            "index": np.flatnonzero(keep),
            "objectives": objectives[keep],
            "parameters": np.asarray(s.population)[keep],
            "born": np.asarray(s.born)[keep],
            "population": objectives,
        }

    def export(self, state, run_dir: Path, metrics: dict) -> dict[str, Path]:
        """Writes ``front.csv`` (each front member's index, objectives, generation born and
        parameters), ``front.png`` (a scatter of the objectives, coloured by the
        generation born; pairwise projections for 3 objectives or more) and, with a
        reference point, ``hypervolume.png`` (the run's hypervolume per generation)."""
        run_dir = Path(run_dir)
        front = self.front(state)
        write_front_csv(front, run_dir / "front.csv")
        path = run_dir / "front.png"
        plot_front(front, path, self.task.name, self.true_front)
        figures = {"front": path}
        if self.ref_point is not None and "hypervolume" in metrics:
            curve = run_dir / "hypervolume.png"
            title = f"{self.task.name}: hypervolume against {list(self.ref_point)}"
            plot_curve(metrics["generation"], metrics["hypervolume"], curve, title)
            figures["hypervolume"] = curve
        return figures


registry.register_algorithm(
    "nsga2",
    NSGA2Config,
    NSGA2,
    "NSGA-II: multi-objective search (mo/zdt1, mo/dtlz2, ...), hypervolume and the front",
)
