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
:mod:`~evorl_pop.tasks.multiobjective`, or any task with ``num_objectives``);
a single-objective task (a black-box function, an environment) runs as ``k = 1``,
NSGA-II then being a genetic algorithm with elitist survival. Each generation
reports the front's size, its hypervolume against a fixed reference point
(``ref_point``, or the problem's), and IGD / IGD+ where the true front is
known. At the end the run writes ``front.csv`` and ``front.png``
(:meth:`NSGA2.export`).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.algorithms.es import ESConfig
from evorl_pop.base import ConfigError, check_config, float_dtype
from evorl_pop.core.engine import Engine, num_objectives, to_minimization
from evorl_pop.core.pareto import crowding_distance, hypervolume, igd, nondominated_ranks
from evorl_pop.tasks.multiobjective import MO_PREFIX, make_mo_task

#: The search box of a task that has none of its own (policy weights): every parameter.
DEFAULT_BOUNDS = (-10.0, 10.0)


# --- variation: SBX and polynomial mutation ------------------------------------------


def sbx(key, first, second, lower, upper, eta: float, prob: float, prob_var: float = 0.5):
    """Simulated binary crossover of parent pairs in ``[lower, upper]`` (Deb and Agrawal 1995;
    the bounded form of Deb's NSGA-II code).

    Each pair crosses with probability ``prob``; then each variable with
    probability ``prob_var`` (and parents that differ there), its two children
    spread around the parents' mean with the distribution index ``eta``, and
    given to either child at random.

    Args:
      key: the crossover's key.
      first, second: ``(pairs, dims)`` parents.
      lower, upper: the bounds (scalars or ``(dims,)``).

    Returns:
      The two ``(pairs, dims)`` children.
    """
    k_u, k_var, k_pair, k_swap = jax.random.split(key, 4)
    shape = first.shape
    u = jax.random.uniform(k_u, shape, first.dtype)
    low, high = jnp.minimum(first, second), jnp.maximum(first, second)
    diff = high - low
    cross = (
        (jax.random.uniform(k_var, shape) < prob_var)
        & (jax.random.uniform(k_pair, shape[:1] + (1,)) < prob)
        & (diff > 1e-14)
    )
    safe = jnp.where(cross, diff, 1.0)
    power = 1.0 / (eta + 1.0)

    def spread(beta):
        alpha = 2.0 - beta ** -(eta + 1.0)
        inside = u <= 1.0 / alpha
        return jnp.where(
            inside,
            (u * alpha) ** power,
            (1.0 / jnp.where(inside, 1.0, 2.0 - u * alpha)) ** power,
        )

    mid = low + high
    c1 = 0.5 * (mid - spread(1.0 + 2.0 * (low - lower) / safe) * diff)
    c2 = 0.5 * (mid + spread(1.0 + 2.0 * (upper - high) / safe) * diff)
    c1, c2 = jnp.clip(c1, lower, upper), jnp.clip(c2, lower, upper)
    swap = jax.random.uniform(k_swap, shape) < 0.5
    a, b = jnp.where(swap, c2, c1), jnp.where(swap, c1, c2)
    return jnp.where(cross, a, first), jnp.where(cross, b, second)


def polynomial_mutation(key, x, lower, upper, eta: float, prob: float):
    """Deb's bounded polynomial mutation: each variable with probability ``prob`` moves
    by a perturbation of distribution index ``eta`` that stays within the bounds."""
    k_which, k_u = jax.random.split(key)
    mutate = jax.random.uniform(k_which, x.shape) < prob
    u = jax.random.uniform(k_u, x.shape, x.dtype)
    span = upper - lower
    to_low, to_high = (x - lower) / span, (upper - x) / span
    power = 1.0 / (eta + 1.0)
    down = u < 0.5
    # each power taken once, of the side each variable moves to (the same values)
    near = jnp.where(down, 1.0 - to_low, 1.0 - to_high) ** (eta + 1.0)
    base_down = 2.0 * u + (1.0 - 2.0 * u) * near
    base_up = 2.0 * (1.0 - u) + 2.0 * (u - 0.5) * near
    root = jnp.where(down, base_down, base_up) ** power
    delta = jnp.where(down, root - 1.0, 1.0 - root)
    return jnp.where(mutate, jnp.clip(x + delta * span, lower, upper), x)


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
    best_solution: jax.Array  # (dims,) member 0: a non-dominated extreme
    best_fitness: jax.Array  # (k,) its fitness, minimised


class NSGA2Strategy:
    """NSGA-II with evosax's interface (``init / ask / tell``) on ``(pop, k)`` fitness.

    Args:
      population_size: members kept each generation, and offspring made.
      num_dims: variables of a candidate.
      lower, upper: the search box (every variable).
      crossover_prob, eta_crossover: SBX's per-pair probability and index.
      mutation_prob, eta_mutation: polynomial mutation's per-variable probability
        (``None``: ``1 / num_dims``) and index.
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
    ):
        self.population_size = population_size
        self.num_dims = num_dims
        self.lower, self.upper = float(lower), float(upper)
        self.crossover_prob = crossover_prob
        self.eta_crossover = eta_crossover
        self.mutation_prob = 1.0 / num_dims if mutation_prob is None else mutation_prob
        self.eta_mutation = eta_mutation

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
            best_solution=population[0],
            best_fitness=fitness[0],
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
        children = polynomial_mutation(
            k_mutate, children, self.lower, self.upper, self.eta_mutation, self.mutation_prob
        )
        return children, state

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
        return state.best_solution


class OnEveryDevice:
    """A strategy whose ``init``, ``ask`` and ``tell`` run whole on every device of
    ``mesh``, replicated in and out (a ``shard_map`` over ``P()``).

    Left to the compiler, the replicated sort could be split across the devices
    after the sharded evaluation, with a collective in every iteration of its
    loop over the fronts; on every device whole, it needs none.
    """

    on_every_device = True  # its own shard_map: the engine calls it as it is

    def __init__(self, strategy, mesh):
        self.inner = strategy
        self.mesh = mesh

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _replicated(self, fn):
        return jax.shard_map(fn, mesh=self.mesh, in_specs=P(), out_specs=P())

    def init(self, key, population, fitness, params=None):
        return self._replicated(self.inner.init)(key, population, fitness)

    def ask(self, key, state, params=None):
        return self._replicated(self.inner.ask)(key, state)

    def tell(self, key, population, fitness, state, params=None):
        return self._replicated(self.inner.tell)(key, population, fitness, state)


# --- the config and the algorithm ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NSGA2Config:
    """Configuration of an NSGA-II run. Every field can be overridden.

    Attributes:
      task: a multi-objective problem (``mo/zdt1``, ``mo/zdt2``, ``mo/zdt3``,
        ``mo/dtlz1``, ``mo/dtlz2``), a multi-objective brax task (``mo/halfcheetah``,
        ``mo/hopper``, ``mo/hopper3``, ``mo/ant``), or any task of ``es``
        (one objective).
      population_size: members kept, and offspring made, each generation.
      num_dims: the variables (``None``: the problem's default; 10 for a
        black-box function).
      num_objectives: DTLZ problems: the objectives (``None``: 3).
      bounds: ``[lower, upper]`` of every variable (``None``: the problem's box,
        ``[-10, 10]`` for a task without one, such as a policy's weights).
      crossover_prob: SBX: the probability that a pair of parents crosses.
      eta_crossover: SBX's distribution index (larger: children nearer their parents).
      mutation_prob: polynomial mutation's probability per variable (``None``: 1 / num_dims).
      eta_mutation: polynomial mutation's distribution index.
      ref_point: the hypervolume's reference point, in the task's units, one
        value per objective (``None``: the problem's; no hypervolume for a task
        without one).
      measures: compute the front's hypervolume, IGD and IGD+ every generation
        (false: only its size, for timing the search alone).

    The other fields are the task's settings, as ``es``'s (single-objective tasks).
    """

    task: str = "mo/zdt1"
    population_size: int = 100
    num_dims: int | None = None
    num_objectives: int | None = None
    bounds: tuple[float, ...] | None = None
    crossover_prob: float = 0.9
    eta_crossover: float = 15.0
    mutation_prob: float | None = None
    eta_mutation: float = 20.0
    ref_point: tuple[float, ...] | None = None
    measures: bool = True
    x0: float = 3.0  # black-box functions: es's x0 (NSGA-II starts uniform in the bounds)
    instance: int = 1  # BBOB tasks: the instance seed
    hidden_sizes: tuple[int, ...] = (32,)  # control tasks: the policy's hidden layers
    activation: str = "tanh"  # control tasks: 'tanh', 'relu' or 'elu'
    policy: str = "auto"  # control tasks: 'auto', 'mlp', 'cnn' or 'keypoints', as es's
    episode_length: int | None = None  # control tasks: steps per episode (None: the env's)
    episodes: int = 1  # control tasks: episodes per candidate
    backend: str | None = None  # brax tasks: the physics backend (None: spring, if it has)
    impl: str = "jax"  # Playground tasks: the MJX implementation
    vector: str = "sync"  # gym: tasks: 'sync' or 'async' stepping

    @property
    def multi_objective(self) -> bool:
        """Whether ``task`` names a multi-objective problem (``mo/<problem>``)."""
        return self.task.startswith(MO_PREFIX)

    def _es_config(self) -> ESConfig:
        """An ``es`` config with this one's task settings: it checks and builds the task."""
        shared = {f.name for f in dataclasses.fields(ESConfig)} & {
            f.name for f in dataclasses.fields(self)
        }
        values = {name: getattr(self, name) for name in shared}
        for name in ("num_dims", "backend"):  # None: es's default
            if values.get(name) is None:
                values.pop(name, None)
        return ESConfig(**values)

    def validate(self) -> None:
        """Raises a :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        check_config(
            self,
            least={
                "population_size": 2,
                "num_dims": 1,
                "num_objectives": 1,
                "episodes": 1,
                "eta_crossover": 0,
                "eta_mutation": 0,
            },
        )
        for name in ("crossover_prob", "mutation_prob"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {value}.")
        if self.bounds is not None and (
            len(self.bounds) != 2 or not self.bounds[0] < self.bounds[1]
        ):
            raise ConfigError(f"bounds must be [lower, upper], lower < upper; got {self.bounds}.")
        if self.multi_objective:
            try:
                task = self.make_task()
            except ValueError as err:
                raise ConfigError(f"task: {err}") from None
        else:
            if self.num_objectives not in (None, 1):
                raise ConfigError(
                    f"num_objectives: {self.task!r} has one objective; the multi-objective "
                    f"problems are {MO_PREFIX}<problem> (mo/zdt1, mo/dtlz2, ...)."
                )
            self._es_config().validate()
            task = None
        k = task.num_objectives if task is not None else 1
        if self.ref_point is not None and len(self.ref_point) != k:
            raise ConfigError(
                f"ref_point has {len(self.ref_point)} value(s); {self.task} has {k} objective(s)."
            )

    def make_task(self):
        """The task ``task`` names, with this config's settings."""
        if self.multi_objective:
            control = ("hidden_sizes", "activation", "episodes", "episode_length", "backend")
            settings = {name: getattr(self, name) for name in control}
            return make_mo_task(self.task, self.num_dims, self.num_objectives, **settings)
        return self._es_config().make_task()


class NSGA2(Engine):
    """NSGA-II on a task, its population evaluated on the mesh: the engine with
    :class:`NSGA2Strategy`, multi-objective metrics and the exported front."""

    multi_objective = True

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
        self.population_based = True
        self.num_objectives = num_objectives(task)
        ref = config.ref_point if config.ref_point is not None else getattr(task, "ref_point", None)
        self.ref_point = None if ref is None else tuple(float(r) for r in ref)
        front = getattr(task, "pareto_front", None)
        self.true_front = None if front is None else np.asarray(front())

    @staticmethod
    def variation(config: NSGA2Config, task) -> dict:
        """The strategy's search box and variation settings, from ``config``."""
        lower, upper = config.bounds or getattr(task, "bounds", DEFAULT_BOUNDS)
        return {
            "lower": lower,
            "upper": upper,
            "crossover_prob": config.crossover_prob,
            "eta_crossover": config.eta_crossover,
            "mutation_prob": config.mutation_prob,
            "eta_mutation": config.eta_mutation,
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

    def _metrics(self, state, summary, key, extra):
        """The population's statistics (per objective) and the front's measures."""
        del key
        metrics = summary.metrics()
        metrics.update(
            generation=state.generation,
            evaluations=jnp.int32(self.population_size),
            **self.front_metrics(state.strategy_state),
        )
        for name in ("env_steps", "episodes"):
            metrics[name] = metrics[name] + extra.pop(name, 0)
        task_state = self.task.update_state(state.task_state, summary.info)
        return {**metrics, **extra}, task_state

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
        k, dims = front["objectives"].shape[1], front["parameters"].shape[1]
        with open(run_dir / "front.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(
                ["index", *(f"f{i}" for i in range(k)), "born", *(f"x{j}" for j in range(dims))]
            )
            for i, obj, born, x in zip(
                front["index"], front["objectives"], front["born"], front["parameters"], strict=True
            ):
                writer.writerow([int(i), *map(repr, map(float, obj)), int(born), *map(float, x)])
        path = run_dir / "front.png"
        plot_front(front, path, self.task.name, self.true_front)
        figures = {"front": path}
        if self.ref_point is not None and "hypervolume" in metrics:
            curve = run_dir / "hypervolume.png"
            title = f"{self.task.name}: hypervolume against {list(self.ref_point)}"
            plot_curve(metrics["generation"], metrics["hypervolume"], curve, title)
            figures["hypervolume"] = curve
        return figures


def plot_curve(generations, values, out: Path, title: str) -> None:
    """The hypervolume over the run's generations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8), dpi=120)
    ax.plot(generations, values, "-", color="C0")
    ax.set(xlabel="generation", ylabel="hypervolume", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot_front(front: dict, out: Path, title: str, true_front=None) -> None:
    """Draws the front's objectives: one scatter for 1 or 2 objectives, each pair of
    objectives for more; the population in grey, the front coloured by generation born."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives, population = front["objectives"], front["population"]
    k = objectives.shape[1]
    pairs = [(0, 0)] if k == 1 else list(itertools.combinations(range(k), 2))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 4), squeeze=False)
    for ax, (i, j) in zip(axes[0], pairs, strict=True):
        if k == 1:
            xs, ys, px, py = (
                front["index"],
                objectives[:, 0],
                np.arange(len(population)),
                population[:, 0],
            )
            ax.set_xlabel("member")
            ax.set_ylabel("f0")
        else:
            xs, ys, px, py = objectives[:, i], objectives[:, j], population[:, i], population[:, j]
            ax.set_xlabel(f"f{i}")
            ax.set_ylabel(f"f{j}")
            if true_front is not None:
                ax.scatter(
                    true_front[:, i], true_front[:, j], s=1, c="k", alpha=0.3, label="true front"
                )
        ax.scatter(px, py, s=8, c="lightgrey", label="population")
        points = ax.scatter(xs, ys, s=12, c=front["born"], cmap="viridis", label="front")
    fig.colorbar(points, ax=axes[0].tolist(), label="generation born")
    axes[0][0].legend(loc="best", fontsize="small")
    fig.suptitle(f"{title}: {len(objectives)} non-dominated")
    fig.savefig(out, dpi=100)
    plt.close(fig)


registry.register_algorithm(
    "nsga2",
    NSGA2Config,
    NSGA2,
    "NSGA-II: multi-objective search (mo/zdt1, mo/dtlz2, ...), hypervolume and the front",
)
