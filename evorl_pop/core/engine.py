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

The strategy is any object with evosax's interface (``init``, ``ask(key, state,
params)``, ``tell(key, population, fitness, state, params)``): evosax's own,
and the CEM and GA of the hybrid algorithms. :func:`evaluate` is the one
evaluator: the engine's generations, the initial population of
population-based strategies and PBT's intervals all go through it.

The engine calls only what :mod:`evorl_pop.core.interfaces` declares: a
:class:`~evorl_pop.core.interfaces.Strategy`, a
:class:`~evorl_pop.core.interfaces.Task` and an optional
:class:`~evorl_pop.core.interfaces.Learner`; optional capabilities
(``BatchTask``, ``EpisodicTask``, ``KnowsOptimum``, ``SeedsPopulation``,
``ReportsSolution``) are protocols of their own. A subclass can replace the
middle of a generation (:meth:`Engine.generation`), as OpenES's
low-communication path does (:mod:`evorl_pop.algorithms.open_es`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop.base import float_dtype
from evorl_pop.core.interfaces import (
    LEARNER_STREAM,
    BatchTask,
    EpisodicTask,
    HasSearchWidth,
    KnowsOptimum,
    MultiObjective,
    ReportsSolution,
    SeedsPopulation,
)
from evorl_pop.core.replicated import replicated
from evorl_pop.distributed import POP_AXIS_NAME, all_gather, pmax, pmin, psum, shmap_map, shmap_vmap

POP = P(POP_AXIS_NAME)

# --- the mesh and padding ----------------------------------------------------------


def make_mesh(num_devices: int | None = None, axis_name: str = POP_AXIS_NAME, devices=None) -> Mesh:
    """A one-dimensional mesh over the first ``num_devices`` devices.

    Args:
      num_devices: how many devices to use; ``None`` uses all of
        ``jax.devices()`` (every process's devices under ``jax.distributed``).
      axis_name: the name of the mesh axis, ``'POP'`` by default.
      devices: an explicit device list, instead of ``jax.devices()``.

    Returns:
      A ``jax.sharding.Mesh`` with the single axis ``axis_name``.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    if not isinstance(num_devices, int | np.integer):
        raise ValueError(f"num_devices must be a count or None (all devices), got {num_devices!r}.")
    if not 1 <= num_devices <= len(devices):
        raise ValueError(
            f"num_devices={num_devices} but {len(devices)} device(s) are available. "
            "On the CPU, call evorl_pop.use_all_cores() or "
            "evorl_pop.run.processes.set_host_devices(N) before JAX starts."
        )
    return Mesh(np.asarray(devices[:num_devices]), (axis_name,))


def check_pop_axis(mesh: Mesh) -> Mesh:
    """``mesh`` itself, or a ValueError when it has no ``'POP'`` axis to shard a population."""
    if POP_AXIS_NAME not in mesh.axis_names:
        raise ValueError(
            f"The mesh has axes {tuple(mesh.axis_names)}; a population is sharded over an axis "
            f"named {POP_AXIS_NAME!r}. Build it with evorl_pop.make_mesh(n)."
        )
    return mesh


def padded_size(size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``size``."""
    return -(-size // multiple) * multiple


def pad_to_multiple(tree, multiple: int, axis: int = 0):
    """Pads the leading axis of every leaf to a multiple of ``multiple``.

    Padded rows repeat the first row, so they hold valid values (no NaN
    sneaks in), and must be masked out of every statistic.

    Args:
      tree: a pytree of arrays sharing the length of ``axis``.
      multiple: e.g. the number of devices of the population axis.
      axis: the axis to pad.

    Returns:
      ``(padded_tree, mask)`` where ``mask`` is a boolean vector that is
      ``True`` for real rows.
    """
    size = jax.tree.leaves(tree)[0].shape[axis]
    total = padded_size(size, multiple)

    def pad(x):
        if total == size:
            return x
        fill = jnp.repeat(jnp.take(x, jnp.array([0]), axis=axis), total - size, axis=axis)
        return jnp.concatenate([x, fill], axis=axis)

    return jax.tree.map(pad, tree), jnp.arange(total) < size


# --- the sign convention and failed evaluations --------------------------------------


def to_minimization(score, maximize):
    """Task score -> evosax fitness (lower is better): the one place signs flip.

    Tasks report scores in their own units (returns maximised, losses
    minimised); evosax minimises. ``maximize`` is one bool, or one per objective
    (a tuple, the last axis of ``score``) for a task with several objectives.
    """
    if isinstance(maximize, tuple):
        return jnp.where(jnp.asarray(maximize), -score, score)
    return -score if maximize else score


def num_objectives(task) -> int:
    """How many objectives ``task`` scores (1 unless it is a
    :class:`~evorl_pop.core.interfaces.MultiObjective` task)."""
    return int(task.num_objectives) if isinstance(task, MultiObjective) else 1


def _per_candidate(flags):
    """``flags`` of shape ``(n, *objectives)`` reduced to ``(n,)``: any objective's."""
    return flags if flags.ndim == 1 else jnp.any(flags, axis=tuple(range(1, flags.ndim)))


def _rows(vector, like):
    """A ``(n,)`` vector shaped to broadcast against the rows of ``like``."""
    return vector.reshape(vector.shape + (1,) * (like.ndim - 1))


def worst_for_nonfinite(fitness):
    """Replaces NaN / inf fitness (minimisation convention) by just-worse-than-worst.

    Every non-finite entry gets the next float above the worst finite fitness,
    so it ranks last without turning means or weighted sums into NaN. If no
    entry is finite, all become the largest finite float: the generation ranks
    as a tie (nothing to learn from it) and cannot enter a best-so-far archive.

    With several objectives (``fitness`` of shape ``(n, k)``), a candidate with
    any non-finite objective failed: each of its objectives becomes
    just-worse-than-worst of that objective's column, so every finite
    candidate dominates it.

    Args:
      fitness: a fitness vector, lower is better (or a ``(n, k)`` matrix).

    Returns:
      ``(clean_fitness, num_nonfinite)``: failed candidates counted once each.
    """
    finite = _rows(~_per_candidate(~jnp.isfinite(fitness)), fitness)
    worst = jnp.max(jnp.where(finite, fitness, -jnp.inf), axis=0)
    largest = jnp.finfo(jnp.result_type(fitness, jnp.float32)).max
    penalty = jnp.where(jnp.any(finite, axis=0), jnp.nextafter(worst, jnp.inf), largest)
    return jnp.where(finite, fitness, penalty), jnp.sum(_per_candidate(~finite))


# --- statistics of an evaluated population ------------------------------------------


@flax.struct.dataclass
class Summary:
    """Global statistics of one evaluated population, in the task's units.

    With ``k`` objectives, ``scores`` is ``(padded_pop, k)`` and each statistic
    has one entry per objective (shape ``(k,)``); ``maximize`` is then a tuple.
    """

    scores: jax.Array  # (padded_pop,) every candidate's score, global order
    best: jax.Array
    worst: jax.Array
    mean: jax.Array  # over finite scores only; NaN when none is finite
    std: jax.Array  # likewise
    num_nonfinite: jax.Array  # int32, candidates with a non-finite score
    info: Any  # the candidates' EvalInfo, summed over the real ones
    maximize: Any = flax.struct.field(pytree_node=False, default=True)  # bool or tuple

    def fitness(self, size: int) -> jax.Array:
        """evosax fitness (minimised) of the ``size`` real candidates, non-finite made worst."""
        return worst_for_nonfinite(to_minimization(self.scores[:size], self.maximize))[0]

    def metrics(self) -> dict[str, jax.Array]:
        """The population statistics every algorithm reports, as metrics.

        With several objectives, ``fitness_best_<i>`` (and mean, worst, std) for
        objective ``i`` from 0, and ``fitness_best`` ... those of objective 0.
        """
        stats = {"best": self.best, "mean": self.mean, "worst": self.worst, "std": self.std}
        metrics = {f"fitness_{name}": value for name, value in stats.items()}
        if self.best.ndim:  # one column per objective
            metrics = {name: value[0] for name, value in metrics.items()}
            for i in range(self.best.shape[0]):
                metrics.update({f"fitness_{name}_{i}": value[i] for name, value in stats.items()})
        return {
            **metrics,
            "num_nonfinite": self.num_nonfinite,
            "env_steps": self.info.steps,
            "episodes": self.info.episodes,
        }


def summarize(scores, info, mask, maximize: bool, axis_name: str | None = POP_AXIS_NAME):
    """Global statistics of a sharded population; call inside the shard.

    Padded slots (``mask`` False) never reach extremes, means or counts;
    NaN / inf scores are counted and left out of extremes and means. With no
    finite score at all, mean and std are NaN (a 0.0 would read as a result).

    With several objectives (``scores`` of shape ``(local_pop, k)``), each
    statistic is per objective, and a candidate with any non-finite objective
    counts once in ``num_nonfinite``.

    Args:
      scores: this device's scores, shape ``(local_pop,)`` (or ``(local_pop, k)``).
      info: this device's per-candidate info pytree (leading axis local_pop).
      mask: ``True`` for real candidates.
      maximize: whether higher scores are better (a tuple: per objective).
      axis_name: the population axis (``None`` when unsharded).

    Returns:
      A :class:`Summary`, identical on every device.
    """
    finite = jnp.isfinite(scores) & _rows(mask, scores)
    failed = mask & _per_candidate(~jnp.isfinite(scores))

    def masked(x):  # the real candidates' sum of an info leaf
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.sum(jnp.where(m, x, jnp.zeros_like(x)), axis=0)

    # one psum for the counts and every info leaf
    local = (jnp.sum(finite, axis=0), jnp.sum(failed))
    (count, num_nonfinite), info = psum((local, jax.tree.map(masked, info)), axis_name)
    hi = pmax(jnp.max(jnp.where(finite, scores, -jnp.inf), axis=0), axis_name)
    lo = pmin(jnp.min(jnp.where(finite, scores, jnp.inf), axis=0), axis_name)
    gathered = all_gather(scores, axis_name, tiled=True, to="invarying")
    # mean and std from the gathered scores: a psum of partial sums rounds by device count
    everywhere = all_gather(finite, axis_name, tiled=True, to="invarying")
    gathered, everywhere = jax.lax.optimization_barrier((gathered, everywhere))
    denom = jnp.maximum(count, 1).astype(jnp.result_type(scores, jnp.float32))
    mean = jnp.sum(jnp.where(everywhere, gathered, 0.0), axis=0) / denom
    var = jnp.sum(jnp.where(everywhere, (gathered - mean) ** 2, 0.0), axis=0) / denom
    none_finite = count == 0
    if isinstance(maximize, tuple):  # per objective
        up = jnp.asarray(maximize)
        best, worst = jnp.where(up, hi, lo), jnp.where(up, lo, hi)
    else:
        best, worst = (hi, lo) if maximize else (lo, hi)
    return Summary(
        scores=gathered,
        best=best,
        worst=worst,
        mean=jnp.where(none_finite, jnp.nan, mean),
        std=jnp.where(none_finite, jnp.nan, jnp.sqrt(var)),
        num_nonfinite=num_nonfinite.astype(jnp.int32),
        info=info,
        maximize=maximize,
    )


def evaluate(fn, candidates, key, mesh: Mesh, maximize: bool, eval_mode: str = "vmap"):
    """Evaluates a population sharded over the ``POP`` axis of ``mesh``: the one evaluator.

    The population is padded to a multiple of the device count (padded
    candidates repeat candidate 0 and are masked out of every statistic);
    candidate ``i`` is evaluated with ``fold_in(key, i)``, so nothing depends
    on the device count.

    Args:
      fn: ``fn(candidate, key) -> (score, info, out)``: a score in the task's
        units (shape ``(k,)`` for a task with ``k`` objectives), an
        :class:`~evorl_pop.base.EvalInfo`, and whatever else each candidate
        returns (``None``, transitions, a trained learner).
      candidates: a pytree whose leaves lead with the population axis.
      key: the evaluation's key.
      mesh: a mesh with a ``'POP'`` axis.
      maximize: whether higher scores are better (a tuple: per objective).
      eval_mode: ``'vmap'`` evaluates each device's slice vectorised, ``'map'``
        one candidate at a time (lower memory), ``'batch'`` with one call of
        ``fn(slice, keys)`` on the device's whole slice (``fn`` vectorised by hand).

    Returns:
      ``(summary, outs)``: the :class:`Summary` (replicated), and the ``out``
      of every candidate, padded and sharded ``P('POP')``.
    """
    candidates, mask = pad_to_multiple(candidates, mesh.shape[POP_AXIS_NAME])
    ids = jnp.arange(mask.shape[0], dtype=jnp.int32)
    # Evaluation has no collectives, so replication checks have nothing to
    # verify; they would only reject simulators whose scan carries start
    # from constants (check_vma=False). The collectives below are checked.
    batch = eval_mode == "batch"  # fn takes the device's whole slice and its keys
    shmap = jax.shard_map if batch else shmap_vmap if eval_mode == "vmap" else shmap_map
    fold = jax.vmap(jax.random.fold_in, (None, 0)) if batch else jax.random.fold_in
    scores, info, outs = shmap(
        lambda c, i: fn(c, fold(key, i)),
        mesh=mesh,
        in_specs=(POP, POP),
        out_specs=POP,
        check_vma=False,
    )(candidates, ids)
    summary = jax.shard_map(
        functools.partial(summarize, maximize=maximize),
        mesh=mesh,
        in_specs=(POP, POP, POP),
        out_specs=P(),
    )(scores, info, mask)
    return summary, outs


def _median(x):
    """``jnp.median`` of a finite vector by partial selection: half of a sort.

    XLA's CPU sort costs more than a ``top_k`` of half the entries; halving both
    middle values before adding keeps the largest floats from overflowing.
    """
    n = x.shape[0]
    lowest = -jax.lax.top_k(-x, n // 2 + 1)[0]  # ascending: the n // 2 + 1 smallest
    return lowest[-1] if n % 2 else lowest[-2] / 2 + lowest[-1] / 2


# --- the population loop -------------------------------------------------------------


@flax.struct.dataclass
class State:
    """Everything a run carries from one generation to the next (replicated)."""

    strategy_state: Any  # the strategy's (evosax) state
    task_state: Any  # e.g. the running observation normaliser
    generation: jax.Array  # int32, generations completed
    learner_state: Any = None  # the learner's (replay buffer, networks), if any


class Engine:
    """A strategy on a task, its population sharded over the ``POP`` axis of a mesh.

    An optional :class:`~evorl_pop.core.interfaces.Learner` takes a step
    between ask and evaluate and observes each evaluation; one that is also
    :class:`~evorl_pop.core.interfaces.ReportsSolution` names the solution
    ``eval_return`` reports instead of the strategy's mean. A learner's
    ``env_steps`` and ``episodes`` metrics add to the evaluation's.
    """

    #: Whether the engine's metrics and strategy take several objectives (a subclass's).
    multi_objective = False

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
        if eval_mode not in ("vmap", "map"):
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
        self.population_based = isinstance(strategy, PopulationBasedAlgorithm)
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
        spread around ``solution`` (normals), evaluated on the mesh.
        """
        k_sol, k_init, k_pop, k_eval = jax.random.split(key, 4)
        task_state = self.task.init_state()
        if solution is None:
            solution = self.task.init_solution(k_sol)
        solution = jnp.asarray(solution, float_dtype()).reshape(-1)
        learner = self.learner
        collect = learner is not None and learner.collect
        learner_state = None
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
            init = replicated(self.strategy.init, self.mesh)
            strategy_state = init(k_init, population, fitness, self.params)
        else:
            strategy_state = self.strategy.init(k_init, solution, self.params)
            if learner is not None:
                learner_state = learner.init(jax.random.fold_in(key, LEARNER_STREAM))
        state = State(strategy_state, task_state, jnp.int32(0), learner_state)
        # strong dtypes, replicated over the mesh: the state after a generation
        # has the same types and placement, so the compiled step is reused
        state = jax.tree.map(jnp.asarray, state, jax.tree.map(jnp.result_type, state))
        return jax.lax.with_sharding_constraint(state, NamedSharding(self.mesh, P()))

    def mean_solution(self, state: State) -> jax.Array:
        """The solution ``eval_return`` reports: the learner's, else the strategy's mean
        (population-based strategies: the best so far)."""
        if isinstance(self.learner, ReportsSolution):
            return self.learner.eval_solution(state.learner_state)
        s = state.strategy_state
        return s.best_solution if self.population_based else self.strategy.get_mean(s)

    def step(self, state: State, key: jax.Array) -> tuple[State, dict]:
        """One generation: ask, [learner], sharded evaluation, [observe], tell. Pure, jittable.

        Args:
          state: the current :class:`State`.
          key: this generation's key (the learner's: ``fold_in(key, LEARNER_STREAM)``).

        Returns:
          ``(new_state, metrics)``; metrics are scalars in the task's units.
        """
        k_report = jax.random.split(key, 4)[3]
        dtypes = jax.tree.map(jnp.result_type, state)
        strategy_state, learner_state, summary, extra = self.generation(state, key)
        new_state = State(strategy_state, state.task_state, state.generation + 1, learner_state)
        metrics, task_state = self._metrics(new_state, summary, k_report, extra)
        # same dtypes as the input (evosax returns some leaves weakly typed), so
        # a scan carry or a jitted step sees one signature generation after generation
        new_state = jax.tree.map(jnp.asarray, new_state.replace(task_state=task_state), dtypes)
        return new_state, metrics

    def generation(self, state: State, key: jax.Array) -> tuple[Any, Any, Summary, dict]:
        """The middle of :meth:`step`: ask, [learner], evaluate, tell, [observe].

        Args:
          state: the current :class:`State`.
          key: the generation's key; ask, evaluation and tell take the first
            three of ``jax.random.split(key, 4)``, the learner
            ``fold_in(key, LEARNER_STREAM)``.

        Returns:
          ``(strategy_state, learner_state, summary, metrics)``: the metrics are
          the learner's.
        """
        k_ask, k_eval, k_tell, _ = jax.random.split(key, 4)
        learner = self.learner
        learner_state = state.learner_state
        extra = {}
        ask, tell = (replicated(f, self.mesh) for f in (self.strategy.ask, self.strategy.tell))
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
        return strategy_state, learner_state, summary, extra

    def _metrics(self, state: State, summary: Summary, key, extra) -> tuple[dict, Any]:
        """The generation's metrics, and the task state updated with its evaluation."""
        s = state.strategy_state
        task = self.task
        maximize = task.maximize
        task_state = state.task_state  # the one the generation was evaluated with
        best_so_far = to_minimization(s.best_fitness, maximize)  # involution
        metrics = summary.metrics()
        metrics.update(
            generation=state.generation,
            fitness_median=to_minimization(
                _median(summary.fitness(self.population_size)), maximize
            ),
            best_so_far=best_so_far,
            evaluations=jnp.int32(self.population_size),
        )
        for name in ("env_steps", "episodes"):  # a learner's own episodes add to the count
            metrics[name] = metrics[name] + extra.pop(name, 0)
        if isinstance(s, HasSearchWidth):
            metrics["sigma"] = jnp.mean(s.std)
        solution = self.mean_solution(state) if self.eval_episodes > 0 else None
        if isinstance(task, KnowsOptimum):
            metrics["f_minus_fopt"] = best_so_far - task.optimal_value(task_state)
        new_task_state = task.update_state(task_state, summary.info)
        if solution is not None:
            # Replicated, as outside it, but in the mesh's shard_map like the
            # population's evaluation, whose traced episode step it reuses.
            if isinstance(task, EpisodicTask):
                one = functools.partial(task.evaluate_return, episodes=self.eval_episodes)
            else:  # one evaluation, e.g. of a black-box task
                one = lambda *args: task.evaluate(*args)[0]  # noqa: E731
            metrics["eval_return"] = jax.shard_map(
                one, mesh=self.mesh, in_specs=P(), out_specs=P(), check_vma=False
            )(solution, key, task_state)
        return {**metrics, **extra}, new_task_state
