"""The sharded engine: one evaluator and one population loop for every algorithm.

One generation, as a pure function of ``(state, key)``::

    key ─► ask (replicated strategy state) ─► population (pop × dims)
        ─► [a learner's step on some members: TD3 on CEM-RL's actors, ERL's injection]
        ─► evaluate: padded to a multiple of the devices, sharded P('POP');
           shmap_vmap / shmap_map, candidate i draws its randomness from
           fold_in(key, i), whatever the device count (transitions returned
           when the learner needs them)
        ─► inside the shard: pmin / pmax give the extremes, psum the counts and
           means (padded slots masked out), all_gather the full score vector
        ─► one sign boundary (to_minimization), NaN / inf ranked worst
        ─► [the learner observes the evaluation: its replay buffer]
        ─► tell (replicated) ─► new strategy state
        ─► the engine's best so far (State.best_fitness / best_solution)
        ─► report: the metrics; then the task state is updated

The strategy is any object with evosax's interface (``init``, ``ask(key, state,
params)``, ``tell(key, population, fitness, state, params)``): evosax's own,
the CEM and GA of the hybrid algorithms, and yours. The engine reads nothing
of a strategy's state but the search width (``HasSearchWidth``): it keeps the
best so far itself. :func:`evaluate` (:mod:`evorl_pop.core.evaluation`) is
the one evaluator: the engine's generations, the initial population of
population-based strategies and PBT's intervals all go through it.

The engine calls only what :mod:`evorl_pop.core.interfaces` declares: a
:class:`~evorl_pop.core.interfaces.Strategy`, a
:class:`~evorl_pop.core.interfaces.Task` and an optional
:class:`~evorl_pop.core.interfaces.Learner`; optional capabilities
(``BatchTask``, ``EpisodicTask``, ``KnowsOptimum``, ``SeedsPopulation``,
``ReportsSolution``, ``HasSearchWidth``) are protocols of their own.

Hooks, the public methods a subclass may override (each documented where defined):

* :meth:`Engine.generation`: the middle of a generation, from ask to tell;
  it returns a :class:`Generation`. OpenES's low-communication path replaces
  it (:class:`~evorl_pop.algorithms.open_es.LowCommunicationEngine`, and
  ``ES`` with ``low_communication=True``).
* :meth:`Engine.report`: a generation's metrics, pure. NSGA-II adds its
  front's measures (:class:`~evorl_pop.algorithms.nsga2.NSGA2`).
* :attr:`Engine.multi_objective`: a subclass whose strategy ranks several
  objectives (no one best so far is kept).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop.base import float_dtype
from evorl_pop.core.acting import EngineActing

# the evaluator; `name as name`: re-exported, its names importable from here as well
from evorl_pop.core.evaluation import POP as POP
from evorl_pop.core.evaluation import (
    Summary,
    _median,
    check_pop_axis,
    evaluate,
    make_mesh,
    num_objectives,
    padded_size,
    to_minimization,
)
from evorl_pop.core.evaluation import pad_to_multiple as pad_to_multiple
from evorl_pop.core.evaluation import summarize as summarize
from evorl_pop.core.evaluation import worst_for_nonfinite as worst_for_nonfinite
from evorl_pop.core.interfaces import (
    EVAL_MODES,
    LEARNER_STREAM,
    BatchTask,
    EpisodicTask,
    HasSearchWidth,
    KnowsOptimum,
    ReportsSolution,
    SeedsPopulation,
)
from evorl_pop.core.replicated import replicated
from evorl_pop.distributed import POP_AXIS_NAME

# --- the population loop -------------------------------------------------------------


@flax.struct.dataclass
class State:
    """Everything a run carries from one generation to the next (replicated).

    The best so far is the engine's own, whatever the strategy keeps: the lowest
    finite fitness of every candidate evaluated (minimisation convention, the
    initial population of a population-based strategy included) and that
    candidate. Both are ``None`` for a multi-objective engine (no one best).
    """

    strategy_state: Any  # the strategy's (evosax) state
    task_state: Any  # e.g. the running observation normaliser
    generation: jax.Array  # int32, generations completed
    learner_state: Any = None  # the learner's (replay buffer, networks), if any
    best_fitness: Any = None  # () minimised; inf until a finite fitness is seen
    best_solution: Any = None  # (num_dims,) the candidate of best_fitness; NaN until then


class Generation(NamedTuple):
    """What the middle of a generation (:meth:`Engine.generation`) hands to :meth:`Engine.step`."""

    strategy_state: Any  # after tell
    learner_state: Any  # after the learner's step and observation (``None``: no learner)
    summary: Summary  # the population's evaluation
    metrics: dict  # the learner's (or the generation's own) metrics
    best: Any  # the candidate of ``summary.best_index`` (``None``: a multi-objective engine)


class Engine(EngineActing):
    """A strategy on a task, its population sharded over the ``POP`` axis of a mesh.

    An optional :class:`~evorl_pop.core.interfaces.Learner` takes a step
    between ask and evaluate and observes each evaluation; one that is also
    :class:`~evorl_pop.core.interfaces.ReportsSolution` names the solution
    ``eval_return`` reports instead of the strategy's mean. A learner's
    ``env_steps`` and ``episodes`` metrics add to the evaluation's.
    """

    #: Whether the engine's metrics and strategy take several objectives (a subclass's).
    multi_objective = False
    #: Whether the strategy's ``init``, ``ask`` and ``tell`` run whole on every device
    #: (:func:`~evorl_pop.core.replicated.replicated`, the same on any device count);
    #: ``False`` for a strategy that runs in a ``shard_map`` of its own (NSGA-II's).
    replicate_strategy = True

    def __init__(
        self,
        strategy,
        task,
        mesh: Mesh | None = None,
        strategy_params=None,
        eval_mode: str = "vmap",
        eval_episodes: int = 0,
        learner=None,
    ):
        """Builds the engine.

        Args:
          strategy: a strategy with evosax's interface, built on a flat
            solution of the task's size (``solution=jnp.zeros(task.num_dims)``).
          task: a task (:mod:`evorl_pop.tasks`).
          mesh: a mesh with a ``'POP'`` axis; ``None`` uses every device.
          strategy_params: the strategy's params; ``None``: its defaults.
          eval_mode: ``'vmap'`` evaluates each device's slice vectorised,
            ``'map'`` one candidate at a time (lower memory).
          eval_episodes: when positive, every generation also evaluates the
            strategy's mean (population-based strategies: the best so far; a
            learner may name another) over this many episodes as ``eval_return``.
          learner: a learner (see the class docstring), or ``None``.
        """
        self.strategy = strategy
        self.task = task
        self.learner = learner
        self.mesh = check_pop_axis(make_mesh() if mesh is None else mesh)
        if strategy.num_dims != task.num_dims:
            raise ValueError(
                f"The strategy searches {strategy.num_dims} dimensions but the task "
                f"{task.name!r} has {task.num_dims} parameters; build the strategy with "
                f"solution=jnp.zeros({task.num_dims})."
            )
        if eval_mode not in EVAL_MODES:
            raise ValueError(f"eval_mode must be 'vmap' or 'map', got {eval_mode!r}.")
        if num_objectives(task) != 1 and not self.multi_objective:
            raise ValueError(
                f"The task {task.name!r} has {num_objectives(task)} objectives; an evosax "
                "strategy ranks one. Search it with a multi-objective algorithm (nsga2)."
            )
        # evosax starts JAX's backend when imported: the engine imports it once it is built
        from evosax.algorithms.population_based.base import PopulationBasedAlgorithm

        self.population_size = strategy.population_size
        self.num_devices = self.mesh.shape[POP_AXIS_NAME]
        self.padded_size = padded_size(self.population_size, self.num_devices)
        self.eval_mode = eval_mode
        self.eval_episodes = eval_episodes
        #: ``init(key, population, fitness, params)``: evosax's population-based
        #: strategies, and any that draws its own initial population.
        self.population_based = isinstance(strategy, (PopulationBasedAlgorithm, SeedsPopulation))
        self.params = strategy.default_params if strategy_params is None else strategy_params

    def evaluate(self, population, key, task_state, collect: bool = False):
        """Scores a ``(pop, dims)`` population with :func:`evaluate`.

        Args:
          population: flat candidates, one per row, in global order.
          key: the evaluation's key; candidate ``i`` uses ``fold_in(key, i)``.
          task_state: the task's shared state (replicated).
          collect: also return each candidate's episodes with their transitions.

        Returns:
          ``(summary, episodes)``: a :class:`Summary` (replicated) and, when
            collecting, the episodes, padded and sharded (else ``None``), the
            padded candidates' steps marked not ``valid``.
        """

        task = self.task
        mode = self.eval_mode
        # a batch's episodes are traced once, vmap's twice
        batch = mode == "vmap" and isinstance(task, BatchTask) and not collect
        mode = "batch" if batch else mode

        def one(x, k):
            if collect:
                return task.evaluate(x, k, task_state, collect=True)
            if mode == "batch":
                return (*task.evaluate_batch(x, k, task_state), None)
            return (*task.evaluate(x, k, task_state), None)

        summary, episodes = evaluate(one, population, key, self.mesh, self.task.maximize, mode)
        if collect:  # padded candidates' steps are no steps
            real = jnp.arange(episodes.valid.shape[0]) < self.population_size
            valid = episodes.valid & real.reshape(-1, *[1] * (episodes.valid.ndim - 1))
            episodes = episodes.replace(valid=valid)
        return summary, episodes

    def init(self, key: jax.Array, solution: jax.Array | None = None) -> State:
        """Initial state: the strategy around ``solution`` (default: the task's).

        Population-based strategies (GA, DE, PSO, ...) start from a population
        spread around ``solution`` (normals), evaluated on the mesh; its best
        candidate is the first best so far.
        """
        k_sol, k_init, k_pop, k_eval = jax.random.split(key, 4)
        task_state = self.task.init_state()
        if solution is None:
            solution = self.task.init_solution(k_sol)
        solution = jnp.asarray(solution, float_dtype()).reshape(-1)
        learner = self.learner
        collect = learner is not None and learner.collect
        learner_state = None
        best_fitness = jnp.asarray(jnp.inf, solution.dtype)
        best_solution = jnp.full_like(solution, jnp.nan)
        if self.population_based:
            if learner is not None:  # the initial population's steps are its first data
                learner_state = learner.init(jax.random.fold_in(key, LEARNER_STREAM))
            if isinstance(self.strategy, SeedsPopulation):
                population = self.strategy.initial_population(k_pop)
            else:
                population = solution + jax.random.normal(
                    k_pop, (self.population_size, solution.size)
                )
            summary, episodes = self.evaluate(population, k_eval, task_state, collect)
            if learner is not None:
                learner_state, _ = learner.observe(learner_state, summary, episodes)
            fitness = summary.fitness(self.population_size)
            init = self._replicated(self.strategy.init)
            strategy_state = init(k_init, population, fitness, self.params)
            if not self.multi_objective:
                index, best_fitness = summary.best_index(self.population_size)
                best_solution = population[index]
        else:
            strategy_state = self.strategy.init(k_init, solution, self.params)
            if learner is not None:
                learner_state = learner.init(jax.random.fold_in(key, LEARNER_STREAM))
        if self.multi_objective:
            best_fitness = best_solution = None
        state = State(
            strategy_state, task_state, jnp.int32(0), learner_state, best_fitness, best_solution
        )
        # strong dtypes, replicated over the mesh: the state after a generation
        # has the same types and placement, so the compiled step is reused
        state = jax.tree.map(jnp.asarray, state, jax.tree.map(jnp.result_type, state))
        return jax.lax.with_sharding_constraint(state, NamedSharding(self.mesh, P()))

    def _replicated(self, fn):
        """``fn``, a strategy method, run whole on every device (:attr:`replicate_strategy`)."""
        return replicated(fn, self.mesh) if self.replicate_strategy else fn

    def mean_solution(self, state: State) -> jax.Array:
        """The solution ``eval_return`` reports: the learner's, else the strategy's mean
        (single-objective population-based strategies: the engine's best so far)."""
        if isinstance(self.learner, ReportsSolution):
            return self.learner.eval_solution(state.learner_state)
        if self.population_based and not self.multi_objective:
            return state.best_solution
        return self.strategy.get_mean(state.strategy_state)

    def step(self, state: State, key: jax.Array) -> tuple[State, dict]:
        """One generation: ask, [learner], sharded evaluation, [observe], tell. Pure, jittable.

        The generation's middle is :meth:`generation`, its metrics :meth:`report`;
        ``step`` keeps the best so far and updates the task state with the evaluation.

        Args:
          state: the current :class:`State`.
          key: this generation's key (the learner's: ``fold_in(key, LEARNER_STREAM)``).

        Returns:
          ``(new_state, metrics)``; metrics are scalars in the task's units.
        """
        k_report = jax.random.split(key, 4)[3]
        dtypes = jax.tree.map(jnp.result_type, state)
        out = self.generation(state, key)
        best_fitness, best_solution = state.best_fitness, state.best_solution
        if not self.multi_objective:
            _, fitness = out.summary.best_index(self.population_size)
            better = fitness < best_fitness
            best_fitness = jnp.where(better, fitness, best_fitness)
            best_solution = jnp.where(better, out.best, best_solution)
        new_state = State(
            out.strategy_state,
            state.task_state,
            state.generation + 1,
            out.learner_state,
            best_fitness,
            best_solution,
        )
        metrics = self.report(new_state, out.summary, k_report, out.metrics)
        task_state = self.task.update_state(state.task_state, out.summary.info)
        # same dtypes as the input (evosax returns some leaves weakly typed), so
        # a scan carry or a jitted step sees one signature generation after generation
        new_state = jax.tree.map(jnp.asarray, new_state.replace(task_state=task_state), dtypes)
        return new_state, metrics

    def generation(self, state: State, key: jax.Array) -> Generation:
        """The middle of :meth:`step`: ask, [learner], evaluate, tell, [observe].

        A hook: a subclass may replace it whole (OpenES's low-communication path,
        :class:`~evorl_pop.algorithms.open_es.LowCommunicationEngine`), keeping its keys.

        Args:
          state: the current :class:`State`.
          key: the generation's key; ask, evaluation and tell take the first
            three of ``jax.random.split(key, 4)``, the learner
            ``fold_in(key, LEARNER_STREAM)``.

        Returns:
          A :class:`Generation`; its metrics are the learner's.
        """
        k_ask, k_eval, k_tell, _ = jax.random.split(key, 4)
        learner = self.learner
        learner_state = state.learner_state
        extra = {}
        ask, tell = (self._replicated(f) for f in (self.strategy.ask, self.strategy.tell))
        population, strategy_state = ask(k_ask, state.strategy_state, self.params)
        if learner is not None:
            population, learner_state, extra = learner.step(
                jax.random.fold_in(key, LEARNER_STREAM), learner_state, population, strategy_state
            )
        collect = learner is not None and learner.collect
        summary, episodes = self.evaluate(population, k_eval, state.task_state, collect)
        fitness = summary.fitness(self.population_size)
        strategy_state, _ = tell(k_tell, population, fitness, strategy_state, self.params)
        if learner is not None:
            learner_state, observed = learner.observe(learner_state, summary, episodes)
            extra = {**extra, **observed}
        best = None
        if not self.multi_objective:
            best = population[summary.best_index(self.population_size)[0]]
        return Generation(strategy_state, learner_state, summary, extra, best)

    def report(self, state: State, summary: Summary, key: jax.Array, extra: dict) -> dict:
        """The metrics of a generation: pure, it changes nothing.

        A hook: a subclass may override it (NSGA-II reports its front), calling
        ``super().report`` for the population's statistics if it wants them.

        Args:
          state: the state after the generation, its task state still the one the
            population was evaluated with (:meth:`step` updates it afterwards).
          summary: the generation's :class:`Summary`.
          key: the key of ``eval_return``'s evaluation (with ``eval_episodes > 0``).
          extra: the generation's own metrics (:attr:`Generation.metrics`); a
            learner's ``env_steps`` and ``episodes`` add to the evaluation's.

        Returns:
          The metrics, scalars in the task's units.
        """
        task = self.task
        maximize = task.maximize
        task_state = state.task_state
        extra = dict(extra)
        metrics = summary.metrics()
        metrics.update(
            generation=state.generation,
            fitness_median=to_minimization(
                _median(summary.fitness(self.population_size)), maximize
            ),
            best_so_far=to_minimization(state.best_fitness, maximize),  # an involution
            evaluations=jnp.int32(self.population_size),
        )
        for name in ("env_steps", "episodes"):  # a learner's own episodes add to the count
            metrics[name] = metrics[name] + extra.pop(name, 0)
        if isinstance(state.strategy_state, HasSearchWidth):
            metrics["sigma"] = jnp.mean(state.strategy_state.std)
        if isinstance(task, KnowsOptimum):
            metrics["f_minus_fopt"] = metrics["best_so_far"] - task.optimal_value(task_state)
        if self.eval_episodes > 0:
            metrics["eval_return"] = self.evaluate_solution(
                self.mean_solution(state), key, task_state
            )
        return {**metrics, **extra}

    def evaluate_solution(
        self, solution: jax.Array, key: jax.Array, task_state, episodes: int | None = None
    ) -> jax.Array:
        """``eval_return`` of one flat solution: its mean return over ``episodes``
        (``None``: ``eval_episodes``) episodes of an
        :class:`~evorl_pop.core.interfaces.EpisodicTask`, else its score."""
        task = self.task
        episodes = self.eval_episodes if episodes is None else episodes
        # Replicated, as outside it, but in the mesh's shard_map like the
        # population's evaluation, whose traced episode step it reuses.
        if isinstance(task, EpisodicTask):
            one = functools.partial(task.evaluate_return, episodes=episodes)
        else:  # one evaluation, e.g. of a black-box task
            one = lambda *args: task.evaluate(*args)[0]  # noqa: E731
        return jax.shard_map(one, mesh=self.mesh, in_specs=P(), out_specs=P(), check_vma=False)(
            solution, key, task_state
        )
