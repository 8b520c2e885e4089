"""The sharded evolution-strategy engine.

One generation, as a pure function of ``(state, key)``::

    key ─► ask (replicated strategy state) ─► population (pop × dims)
        ─► padded to a multiple of the devices, sharded P('POP')
        ─► shmap_vmap / shmap_map: each device evaluates its slice; candidate i
           draws its randomness from fold_in(key, i), whatever the device count
        ─► inside the shard: pmin / pmax give the extremes, psum the counts and
           means (padded slots masked out), all_gather the full score vector
        ─► one sign boundary (to_minimization), NaN / inf ranked worst
        ─► tell (replicated) ─► new strategy state

For the Gaussian ES family there is a low-communication path
(``low_communication=True`` with evosax's ``Open_ES``): each device draws the
noise of its own candidates from their global indices, so no device ever holds
the ``pop × dims`` matrix; only scores and one ``psum`` of a ``dims``-vector
cross devices. Its update equals evosax's ``Open_ES.tell`` on the same noise
(with :class:`~evorl_pop.noise_table.NoiseTableOpen_ES`: the table rows its
``ask`` reads).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from evosax.algorithms import Open_ES
from evosax.algorithms.population_based.base import PopulationBasedAlgorithm
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import multihost
from evorl_pop.blackbox import float_dtype
from evorl_pop.distributed import POP_AXIS_NAME, psum, shmap_map, shmap_vmap
from evorl_pop.fitness import to_minimization, worst_for_nonfinite
from evorl_pop.mesh import make_mesh, padded_size
from evorl_pop.noise_table import NoiseTableOpen_ES
from evorl_pop.stats import Summary, summarize

POP = P(POP_AXIS_NAME)


@flax.struct.dataclass
class ESState:
    """Everything a run carries from one generation to the next (replicated)."""

    strategy_state: Any  # evosax state
    task_state: Any  # e.g. the running observation normaliser
    generation: jax.Array  # int32, generations completed


def _median(x):
    """``jnp.median`` of a finite vector by partial selection: half of a sort.

    XLA's CPU sort costs 2-3x a ``top_k`` of half the entries; halving both
    middle values before adding keeps the largest floats from overflowing.
    """
    n = x.shape[0]
    lowest = -jax.lax.top_k(-x, n // 2 + 1)[0]  # ascending: the n // 2 + 1 smallest
    return lowest[-1] if n % 2 else lowest[-2] / 2 + lowest[-1] / 2


def _largest_divisor_at_most(n: int, cap: int) -> int:
    cap = max(1, min(n, cap))
    return next(d for d in range(cap, 0, -1) if n % d == 0)


class ShardedES:
    """Runs an evosax strategy with its population sharded over a ``POP`` mesh axis.

    The strategy must be built on a flat solution vector of the task's size
    (``solution=jnp.zeros(task.num_dims)``); :func:`evorl_pop.algorithms.es.make_strategy`
    does that from a name.
    """

    def __init__(
        self,
        strategy,
        task,
        mesh: Mesh | None = None,
        strategy_params=None,
        eval_mode: str = "vmap",
        eval_episodes: int = 0,
        low_communication: bool = False,
        chunk_bytes: int = 64 << 20,
        init_scale: float = 1.0,
    ):
        """Builds the engine.

        Args:
          strategy: an instance of any ``evosax.algorithms`` class.
          task: a task (:mod:`evorl_pop.tasks`).
          mesh: a mesh with a ``'POP'`` axis; ``None`` uses every device.
          strategy_params: evosax params; ``None`` uses the strategy's defaults.
          eval_mode: ``'vmap'`` evaluates each device's slice vectorised,
            ``'map'`` one candidate at a time (lower memory).
          eval_episodes: when positive, every generation also evaluates the
            strategy's mean (population-based strategies: the best so far) over
            this many episodes and reports it as ``eval_return``.
          low_communication: use the low-communication path (``Open_ES`` only).
          chunk_bytes: low-communication path only: the noise of at most this
            many bytes is held at once per device.
          init_scale: population-based strategies only: spread of the initial
            population around the starting solution.
        """
        self.strategy = strategy
        self.task = task
        self.mesh = make_mesh() if mesh is None else mesh
        if POP_AXIS_NAME not in self.mesh.axis_names:
            raise ValueError(
                f"The mesh has axes {tuple(self.mesh.axis_names)}; the engine shards the "
                f"population over an axis named {POP_AXIS_NAME!r}. Build it with "
                "evorl_pop.make_mesh(n)."
            )
        if strategy.num_dims != task.num_dims:
            raise ValueError(
                f"The strategy searches {strategy.num_dims} dimensions but the task "
                f"{task.name!r} has {task.num_dims} parameters; build the strategy with "
                f"solution=jnp.zeros({task.num_dims})."
            )
        if eval_mode not in ("vmap", "map"):
            raise ValueError(f"eval_mode must be 'vmap' or 'map', got {eval_mode!r}.")
        if low_communication and not isinstance(strategy, Open_ES):
            raise ValueError(
                "low_communication=True needs evosax's Open_ES (the Gaussian family "
                f"whose noise each device can draw itself); got {type(strategy).__name__}."
            )
        self.params = strategy.default_params if strategy_params is None else strategy_params
        self.population_size = strategy.population_size
        self.num_devices = self.mesh.shape[POP_AXIS_NAME]
        self.padded_size = padded_size(self.population_size, self.num_devices)
        self.eval_mode = eval_mode
        self.eval_episodes = eval_episodes
        self.low_communication = low_communication
        self.population_based = isinstance(strategy, PopulationBasedAlgorithm)
        self.init_scale = init_scale
        local = self.padded_size // self.num_devices
        self.chunk = _largest_divisor_at_most(local, chunk_bytes // (4 * task.num_dims))

    # --- evaluation -------------------------------------------------------------

    def _ids_and_mask(self):
        ids = jnp.arange(self.padded_size, dtype=jnp.int32)
        return ids, ids < self.population_size

    def evaluate(self, population, key, task_state) -> Summary:
        """Scores a ``(pop, dims)`` population, sharded over the mesh.

        Args:
          population: flat candidates, one per row, in global order.
          key: the generation's evaluation key; candidate ``i`` uses
            ``fold_in(key, i)``.
          task_state: the task's shared state (replicated).

        Returns:
          A :class:`Summary` (replicated).
        """
        pad = self.padded_size - self.population_size
        if pad:  # padded rows repeat row 0: valid inputs, masked out afterwards
            population = jnp.concatenate([population, jnp.repeat(population[:1], pad, 0)])
        ids, mask = self._ids_and_mask()

        def one(x, i):
            return self.task.evaluate(x, jax.random.fold_in(key, i), task_state)

        shmap = shmap_vmap if self.eval_mode == "vmap" else shmap_map
        # Evaluation has no collectives, so replication checks have nothing to
        # verify; they would only reject simulators whose scan carries start
        # from constants (check_vma=False). The collectives below are checked.
        scores, info = shmap(one, self.mesh, in_specs=(POP, POP), out_specs=POP, check_vma=False)(
            population, ids
        )
        return jax.shard_map(
            functools.partial(summarize, maximize=self.task.maximize),
            mesh=self.mesh,
            in_specs=(POP, POP, POP),
            out_specs=P(),
        )(scores, info, mask)

    def _fitness(self, summary: Summary):
        """evosax fitness (minimised) of the real candidates, non-finite made worst."""
        scores = summary.scores[: self.population_size]
        return worst_for_nonfinite(to_minimization(scores, self.task.maximize))[0]

    # --- the generation -----------------------------------------------------------

    def init(self, key: jax.Array, solution: jax.Array | None = None) -> ESState:
        """Initial state: strategy state around ``solution`` (default: the task's).

        Population-based strategies (GA, DE, PSO, ...) start from a population
        spread ``init_scale`` around ``solution``, evaluated on the mesh.
        """
        k_sol, k_init, k_pop, k_eval = jax.random.split(key, 4)
        if solution is None:
            solution = self.task.init_solution(k_sol)
        # float64 when JAX's 64-bit mode is on, float32 otherwise
        solution = jnp.asarray(solution, float_dtype()).reshape(-1)
        task_state = self.task.init_state()
        if self.population_based:
            noise = jax.random.normal(k_pop, (self.population_size, solution.size))
            population = solution + self.init_scale * noise
            summary = self.evaluate(population, k_eval, task_state)
            strategy_state = self.strategy.init(
                k_init, population, self._fitness(summary), self.params
            )
        else:
            strategy_state = self.strategy.init(k_init, solution, self.params)
        state = ESState(strategy_state, task_state, jnp.int32(0))
        # strong dtypes, replicated over the mesh: the state after a generation
        # has the same types and placement, so the compiled step is reused
        state = jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state)):
            return jax.lax.with_sharding_constraint(state, NamedSharding(self.mesh, P()))
        return multihost.replicate(state, self.mesh)  # device_put, across processes too

    def mean_solution(self, state: ESState) -> jax.Array:
        """The strategy's mean (or, population-based, its best solution so far)."""
        s = state.strategy_state
        return s.best_solution if self.population_based else self.strategy.get_mean(s)

    def step(self, state: ESState, key: jax.Array) -> tuple[ESState, dict]:
        """One generation: ask, sharded evaluation, tell. Pure and jittable.

        Args:
          state: the current :class:`ESState`.
          key: this generation's key.

        Returns:
          ``(new_state, metrics)``; metrics are scalars in the task's units.
        """
        k_ask, k_eval, k_tell, k_mean = jax.random.split(key, 4)
        if self.low_communication:
            strategy_state, summary = self._lowcomm_generation(state, k_ask, k_eval)
        else:
            population, strategy_state = self.strategy.ask(k_ask, state.strategy_state, self.params)
            summary = self.evaluate(population, k_eval, state.task_state)
            strategy_state, _ = self.strategy.tell(
                k_tell, population, self._fitness(summary), strategy_state, self.params
            )
        task_state = self.task.update_state(state.task_state, summary.info)
        new_state = ESState(strategy_state, task_state, state.generation + 1)
        # same dtypes as the input (evosax returns some leaves weakly typed), so
        # a scan carry or a jitted step sees one signature generation after generation
        new_state = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype), new_state, state)
        return new_state, self._metrics(new_state, summary, k_mean, state.task_state)

    def _metrics(self, state: ESState, summary: Summary, key, task_state) -> dict:
        s = state.strategy_state
        best_so_far = to_minimization(s.best_fitness, self.task.maximize)  # involution
        metrics = {
            "generation": state.generation,
            "fitness_best": summary.best,
            "fitness_mean": summary.mean,
            "fitness_worst": summary.worst,
            "fitness_std": summary.std,
            "fitness_median": to_minimization(_median(self._fitness(summary)), self.task.maximize),
            "best_so_far": best_so_far,
            "num_nonfinite": summary.num_nonfinite,
            "evaluations": jnp.int32(self.population_size),
            "env_steps": summary.info.steps,
            "episodes": summary.info.episodes,
        }
        if hasattr(self.task, "optimal_value"):
            metrics["f_minus_fopt"] = best_so_far - self.task.optimal_value(task_state)
        if hasattr(s, "std"):
            metrics["sigma"] = jnp.mean(s.std)
        if self.eval_episodes > 0:
            solution = self.mean_solution(state)
            if hasattr(self.task, "evaluate_return"):
                value = self.task.evaluate_return(solution, key, task_state, self.eval_episodes)
            else:
                value = self.task.evaluate(solution, key, task_state)[0]
            metrics["eval_return"] = value
        return metrics

    def run(self, state: ESState, key: jax.Array, num_generations: int):
        """``num_generations`` generations under one ``lax.scan`` (not jitted here).

        Generation ``g`` of the run uses ``fold_in(key, state.generation + g)``,
        so a run split into chunks equals the same run in one piece.

        Returns:
          ``(state, metrics)`` with metrics stacked along a leading axis.
        """

        def body(state, _):
            return self.step(state, jax.random.fold_in(key, state.generation))

        return jax.lax.scan(body, state, None, length=num_generations)

    # --- low-communication Gaussian ES ----------------------------------------------

    def _noise(self, key, index):
        """The standard-normal direction of global candidate ``index``."""
        es = self.strategy
        if es.use_antithetic_sampling:
            half = self.population_size // 2
            sign = jnp.where(index < half, 1.0, -1.0)
            return sign * self._direction(key, index % half)
        return self._direction(key, index)

    def _direction(self, key, row):
        if isinstance(self.strategy, NoiseTableOpen_ES):  # the rows its own ask reads
            return self.strategy.directions(key, row[None])[0]
        return jax.random.normal(jax.random.fold_in(key, row), (self.strategy.num_dims,))

    def noise_matrix(self, key):
        """All candidates' noise, as the full-matrix reference would draw it."""
        return jax.vmap(lambda i: self._noise(key, i))(jnp.arange(self.population_size))

    def _lowcomm_generation(self, state: ESState, k_ask, k_eval):
        es, params, s = self.strategy, self.params, state.strategy_state
        task_state, n = state.task_state, self.population_size
        ids, mask = self._ids_and_mask()
        chunk = self.chunk

        def noise(ids_c):
            return jax.vmap(lambda i: self._noise(k_ask, i))(ids_c)

        def evaluate_local(local_ids):
            def evaluate_chunk(ids_c):
                x = s.mean + s.std * noise(ids_c)
                keys = jax.vmap(lambda i: jax.random.fold_in(k_eval, i))(ids_c)
                return jax.vmap(self.task.evaluate, in_axes=(0, 0, None))(x, keys, task_state)

            out = jax.lax.map(evaluate_chunk, local_ids.reshape(-1, chunk))
            return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), out)

        # as in `evaluate`: no collectives here, so no replication checks
        scores, info = jax.shard_map(
            evaluate_local, mesh=self.mesh, in_specs=POP, out_specs=POP, check_vma=False
        )(ids)

        def update_local(scores, info, local_ids, local_mask):
            summary = summarize(scores, info, local_mask, self.task.maximize)
            fitness = self._fitness(summary)
            shaped = es.fitness_shaping_fn(None, fitness, s, params)
            shaped = jnp.concatenate([shaped, jnp.zeros(self.padded_size - n)])

            def accumulate(total, ids_c):  # the noise is drawn again, chunk by chunk
                return total + shaped[ids_c] @ noise(ids_c), None

            zeros = jax.lax.pcast(jnp.zeros(es.num_dims), POP_AXIS_NAME, to="varying")
            partial_sum, _ = jax.lax.scan(accumulate, zeros, local_ids.reshape(-1, chunk))
            grad = psum(partial_sum, POP_AXIS_NAME) / (n * s.std)  # Open_ES's estimate
            updates, opt_state = es.optimizer.update(grad, s.opt_state, s.mean)
            best = jnp.argmin(fitness)
            better = fitness[best] < s.best_fitness
            best_candidate = s.mean + s.std * self._noise(k_ask, best)
            new = s.replace(
                mean=optax.apply_updates(s.mean, updates),
                std=es.std_schedule(s.generation_counter),
                opt_state=opt_state,
                best_solution=jnp.where(better, best_candidate, s.best_solution),
                best_fitness=jnp.where(better, fitness[best], s.best_fitness),
                generation_counter=s.generation_counter + 1,
            )
            return new, summary

        return jax.shard_map(
            update_local, mesh=self.mesh, in_specs=(POP, POP, POP, POP), out_specs=P()
        )(scores, info, ids, mask)
