"""The interfaces a plug-in meets: each method documented once, here.

The engine, the run shell and the algorithms call only what these declare::

    Strategy    init / ask / tell            (evosax's; any evosax strategy is one)
    Task        evaluate a flat candidate    (black-box functions, environments)
                (MultiObjective, ReferencePoint, ParetoFront: tasks of several objectives)
    Learner     step / observe beside a population (CEM-RL's, ERL's RL part)
    ReplayLearner  actors trained from a population's replay buffer (TD3, SAC, yours)
    Algorithm   init(key) -> state, step(state, key) -> (state, metrics)
    Emitter     init / ask / tell on a MAP-Elites archive (quality-diversity)
    Exports     an algorithm's result beyond one solution (an archive, a front)
    Acts        the policy an algorithm's state holds (evorl-pop render)
    Recorder    what a run records (metrics.csv, TensorBoard, W&B, yours)
    Env         reset / step in JAX; EnvFamily builds them by name

An algorithm on :class:`~evorl_pop.core.engine.Engine` changes a generation
through its declared hooks, ``generation`` and ``report`` (documented there),
never through its private methods.

A capability that only some implementations have is a protocol of its own
(``BatchTask``, ``EpisodicTask``, ...), checked with ``isinstance`` where it
is used; a class meets a protocol by having its members, no base class
needed. Register a plug-in with :mod:`evorl_pop.registry`.

Key streams: the engine derives the keys of a generation's parts from its
key with the named constants below, so a plug-in that draws keys of its own
never collides with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax

from evorl_pop import registry
from evorl_pop.base import EnvSpec, EvalInfo

#: How the engine evaluates a device's slice of the population: ``'vmap'`` vectorised,
#: ``'map'`` one candidate at a time (lower memory).
EVAL_MODES = ("vmap", "map")

#: ``fold_in(key, LEARNER_STREAM)``: the learner's key, at ``init`` and in every generation.
LEARNER_STREAM = 4

#: The ``vmap`` axis of a run's replicas (seeds and a sweep's settings in one program,
#: :mod:`evorl_pop.run.replicas`). The settings of a sweep share their seeds' keys, so
#: what must tell replicas apart beyond their keys (the host's environments of each) reads
#: :func:`replica_index`.
REPLICA_AXIS = "REPLICA"


def replica_index() -> jax.Array | int:
    """This replica's index on :data:`REPLICA_AXIS` where a run's replicas are mapped, else
    0 (a single run)."""
    try:
        return jax.lax.axis_index(REPLICA_AXIS)
    except NameError:  # the axis is bound only inside the replicas' vmap
        return 0


# --- strategies ------------------------------------------------------------------------


@runtime_checkable
class Strategy(Protocol):
    """An evolution strategy with evosax's interface, on flat ``num_dims`` vectors.

    Every evosax strategy is one, and so are the CEM and GA of the hybrids.
    evosax minimises: ``fitness`` is lower-is-better (the engine converts a
    task's scores once, :func:`~evorl_pop.core.engine.to_minimization`).

    What the engine (:class:`~evorl_pop.core.engine.Engine`) reads, and nothing
    more: ``population_size``, ``num_dims``, ``default_params`` (when it is given
    no params), ``init``, ``ask``, ``tell`` (its metrics unused) and ``get_mean``
    (the solution ``eval_return`` reports, but for a population-based strategy
    on one objective, whose reported solution is the engine's best so far).
    A strategy is population-based when it is evosax's ``PopulationBasedAlgorithm``
    or :class:`SeedsPopulation`: its ``init`` takes the evaluated initial
    population. The state is the strategy's own: the engine passes it along and
    reads only ``std`` where it is :class:`HasSearchWidth`. The best so far
    (``best_so_far``) is the engine's (``State.best_fitness``, ``best_solution``):
    a state needs no ``best_fitness`` or ``best_solution``.
    """

    population_size: int
    num_dims: int

    @property
    def default_params(self) -> Any:
        """The strategy's hyperparameters (a pytree), unless the caller gives its own."""

    def init(self, key: jax.Array, solution_or_population: jax.Array, *args) -> Any:
        """The first state: ``init(key, solution, params)`` for a distribution-based
        strategy, ``init(key, population, fitness, params)`` for a population-based one."""

    def ask(self, key: jax.Array, state: Any, params: Any) -> tuple[jax.Array, Any]:
        """``(population, state)``: ``population_size`` candidates, shape ``(pop, num_dims)``."""

    def tell(
        self, key: jax.Array, population: jax.Array, fitness: jax.Array, state: Any, params: Any
    ) -> tuple[Any, Any]:
        """``(state, metrics)`` after the population's ``fitness`` (minimised, finite)."""

    def get_mean(self, state: Any) -> jax.Array:
        """The distribution's mean: the solution a generation reports (evosax's
        population-based strategies have none: they report their best candidate)."""


@runtime_checkable
class SeedsPopulation(Protocol):
    """A population-based strategy that draws its own initial population."""

    def initial_population(self, key: jax.Array) -> jax.Array:
        """``(pop, num_dims)`` candidates to evaluate before ``init``."""


@runtime_checkable
class ReadsDirections(Protocol):
    """A Gaussian strategy whose noise rows can be read one by one (a noise table)."""

    def directions(self, key: jax.Array, rows: jax.Array) -> jax.Array:
        """The standard-normal directions ``rows`` of the generation whose ask key is ``key``."""


@runtime_checkable
class HasSearchWidth(Protocol):
    """A strategy state with a search width, reported as the ``sigma`` metric (its mean)."""

    std: jax.Array


# --- tasks -------------------------------------------------------------------------------


@runtime_checkable
class Task(Protocol):
    """What a flat candidate vector is scored on.

    Scores stay in the task's own units (``maximize`` says which way is better).
    """

    name: str
    num_dims: int
    maximize: bool

    def init_solution(self, key: jax.Array) -> jax.Array:
        """The starting point of the search, shape ``(num_dims,)``."""

    def init_state(self) -> Any:
        """State every candidate shares (a running observation normaliser, a BBOB instance)."""

    def update_state(self, task_state: Any, info: EvalInfo) -> Any:
        """``task_state`` after a generation whose :class:`~evorl_pop.base.EvalInfo`,
        summed over the whole population, is ``info``."""

    def evaluate(self, solution: jax.Array, key: jax.Array, task_state: Any, **kwargs) -> Any:
        """``(score, info)`` of one candidate; with ``collect=True`` (tasks with episodes,
        for a learner that collects) ``(score, info, episodes)``."""


@runtime_checkable
class BatchTask(Protocol):
    """A task that evaluates a device's whole slice at once, faster than a vmap of
    :meth:`Task.evaluate` (its episodes are traced once)."""

    def evaluate_batch(self, solutions: jax.Array, keys: jax.Array, task_state: Any) -> Any:
        """``(scores, info)`` of a slice of candidates with their keys."""


@runtime_checkable
class EpisodicTask(Protocol):
    """A task whose solution can be evaluated over several episodes (``eval_return``)."""

    def evaluate_return(
        self, solution: jax.Array, key: jax.Array, task_state: Any, episodes: int
    ) -> jax.Array:
        """The mean return of ``solution`` over ``episodes`` noise-free episodes."""


@runtime_checkable
class Describes(Protocol):
    """A task whose evaluation also returns a behaviour descriptor (quality-diversity:
    MAP-Elites files each candidate in the cell of its descriptor).

    ``descriptor_bounds`` is ``(low, high)``, each a tuple of ``descriptor_size``
    floats; ``genotype_bounds`` is ``(low, high)`` floats every coordinate of a
    genotype stays in (``None``: unbounded). ``qd_offset`` is added to every elite's
    fitness in the QD-score, so that each term is non-negative.
    """

    descriptor_size: int
    descriptor_bounds: tuple[tuple[float, ...], tuple[float, ...]]
    genotype_bounds: tuple[float, float] | None
    qd_offset: float

    def evaluate_descriptor(self, solution: jax.Array, key: jax.Array, task_state: Any) -> Any:
        """``(score, info, descriptor)`` of one candidate; descriptor ``(descriptor_size,)``."""


@runtime_checkable
class MultiObjective(Protocol):
    """A task that scores ``num_objectives`` objectives: its ``evaluate`` returns a vector
    of that many scores, and ``maximize`` holds one flag per objective."""

    num_objectives: int
    maximize: tuple[bool, ...]


@runtime_checkable
class ReferencePoint(Protocol):
    """A multi-objective task with a reference point for the hypervolume, in its own
    units, one value per objective (``mo/zdt1``'s, a multi-objective brax task's)."""

    ref_point: tuple[float, ...]


@runtime_checkable
class ParetoFront(ReferencePoint, Protocol):
    """A multi-objective benchmark problem that knows its true Pareto front (IGD and IGD+
    against it), its reference point and its search box (``mo/zdt1``, ``mo/dtlz2``)."""

    #: ``(lower, upper)``: the bounds of every variable.
    bounds: tuple[float, float]

    def pareto_front(self, size: int = 1000) -> Any:
        """About ``size`` points of the true front, a NumPy ``(n, num_objectives)``
        array in the task's units."""


@runtime_checkable
class KnowsOptimum(Protocol):
    """A benchmark function with a known optimal value (``f_minus_fopt``)."""

    def optimal_value(self, task_state: Any) -> jax.Array:
        """The optimal value, in the task's units."""


@runtime_checkable
class PolicyTask(Protocol):
    """A task on an environment whose candidates are a policy's flat weights
    (:class:`~evorl_pop.tasks.control.ControlTask`): the policy a candidate is."""

    env: Any
    policy: Any
    episode_length: int | None
    normalize_obs: bool

    def policy_params(self, solution: jax.Array, obs_norm: Any) -> Any:
        """The policy's parameters of the flat ``solution``, as its episodes run them
        (``obs_norm``: the observation normaliser, or ``None``)."""


# --- learners beside a population ------------------------------------------------------


@runtime_checkable
class Learner(Protocol):
    """A learner that takes a step between ask and evaluate and observes each evaluation
    (CEM-RL's and ERL's RL part). Its ``env_steps`` and ``episodes`` metrics add to
    the evaluation's."""

    #: Whether the population's evaluations return their episodes' transitions.
    collect: bool

    def init(self, key: jax.Array) -> Any:
        """The learner's first state (networks, optimiser states, replay buffer)."""

    def step(
        self, key: jax.Array, learner_state: Any, population: jax.Array, strategy_state: Any
    ) -> tuple[jax.Array, Any, dict]:
        """``(population, learner_state, metrics)``: the asked population, changed as the
        learner sees fit (trained actors, an injected member), before it is evaluated."""

    def observe(self, learner_state: Any, summary: Any, episodes: Any) -> tuple[Any, dict]:
        """``(learner_state, metrics)`` after the evaluation (its
        :class:`~evorl_pop.core.engine.Summary` and, when collecting, its episodes)."""


@runtime_checkable
class ReportsSolution(Protocol):
    """A learner whose own solution ``eval_return`` reports, instead of the strategy's."""

    def eval_solution(self, learner_state: Any) -> jax.Array:
        """The flat solution to evaluate."""


@runtime_checkable
class ReplayLearner(Protocol):
    """An off-policy learner whose actors are a population's members: the RL part of CEM-RL
    and ERL, fed by the replay buffer that the population's evaluations fill.

    A learner spec's ``hybrid.learner`` builds one (:mod:`evorl_pop.registry`). An actor's
    parameters are a member's flat weights unravelled by the population's task; a learner
    state holds an actor and the part every actor shares (the critics). Subclassing
    :class:`evorl_pop.rl.hybrid.ReplayLearner` gives the buffer, the learning gate and
    CEM-RL's :meth:`train_actors`; a learner then defines the other methods.
    """

    #: The metrics :meth:`learn` returns, NaN in a generation that does not learn.
    LOSSES: tuple[str, ...]

    def init(self, key: jax.Array) -> Any:
        """A fresh learner state, with an actor of its own (ERL's learner)."""

    def init_shared(self, key: jax.Array) -> Any:
        """A fresh shared part, without an actor (CEM-RL's critic)."""

    def actor(self, learner_state: Any) -> Any:
        """The actor's parameters in a learner state."""

    def shared(self, learner_state: Any) -> Any:
        """The part of a learner state that the actors share."""

    def with_actor(self, shared: Any, params: Any) -> Any:
        """The learner state of actor ``params`` beside ``shared``, its optimiser fresh."""

    def learn(self, learner_state: Any, buffer: Any, key: jax.Array) -> tuple[Any, dict]:
        """``(learner_state, losses)`` after gradient updates on minibatches of ``buffer``
        (replicated in and out; the minibatches split over the devices)."""

    def explore(self, params: Any, key: jax.Array, noise_std: float) -> Any:
        """An exploration episode of actor ``params``, its transitions collected
        (:class:`~evorl_pop.tasks.rollout.Episode`); ``noise_std``: ERL's
        ``exploration_noise``, for a learner that adds action noise."""

    def empty_buffer(self) -> Any:
        """An empty replay buffer (:class:`~evorl_pop.rl.replay.ReplayBuffer`)."""

    def ready(self, buffer: Any) -> jax.Array:
        """Whether ``buffer`` holds enough steps to learn from (the learning gate)."""

    def learn_if(self, ready: jax.Array, fn: Any, *operands: Any) -> Any:
        """``fn(*operands)`` (which returns ``(*operands, losses)``) when ``ready``, else
        the operands unchanged and NaN :attr:`LOSSES`."""

    def train_actors(
        self, shared: Any, flat: jax.Array, buffer: Any, key: jax.Array
    ) -> tuple[Any, jax.Array, dict]:
        """``(shared, flat, losses)``: each actor of ``flat`` (``(actors, num_params)``) in
        turn trained by :meth:`learn` against ``shared``, which trains along."""


# --- quality-diversity emitters --------------------------------------------------------


@runtime_checkable
class Emitter(Protocol):
    """How MAP-Elites' candidates come from its archive (``emitter:`` of its config).

    Built as ``cls(archive, task, config, settings)``: the
    :class:`~evorl_pop.core.archive.ShardedArchive`, the task (with descriptors,
    :class:`Describes`), the MAP-Elites config (``population_size``, ``iso_sigma``, ...)
    and the emitter's own settings (the frozen dataclass it is registered with,
    :func:`evorl_pop.registry.register_emitter`; ``None`` for an emitter without
    settings). A generation::

        ask:      (archive, emitter state) -> population_size candidates
        evaluate: MAP-Elites' one evaluator, sharded over the devices
        tell:     (archive before and after the insertion, the candidates' fitness
                  and descriptors) -> the emitter's new state and metrics

    The emitter state is a pytree, replicated on every device (``()``: none); every
    method is pure and jittable. Candidates are flat genotypes of ``task.num_dims``,
    clipped to ``task.genotype_bounds`` where the task has them.
    """

    #: Whether the evaluations return their episodes' transitions (a task with an
    #: environment), which MAP-Elites then gives to ``observe`` (:class:`ObservesEpisodes`).
    collect: bool

    def init(self, archive_state: Any, key: jax.Array) -> Any:
        """The first emitter state, from the archive after the initial batch (``None``
        where ``collect``: the state exists before that batch, whose episodes it observes)."""

    def ask(self, archive_state: Any, emitter_state: Any, key: jax.Array) -> tuple[jax.Array, Any]:
        """``(candidates, asked)``: ``(population_size, num_dims)`` candidates, and what
        :meth:`tell` needs of them (``None``: nothing)."""

    def tell(
        self,
        before: Any,
        after: Any,
        emitter_state: Any,
        asked: Any,
        quality: jax.Array,
        descriptors: jax.Array,
        key: jax.Array,
    ) -> tuple[Any, dict]:
        """``(emitter_state, metrics)`` after the batch: ``before`` and ``after`` the archive
        states around its insertion, ``quality`` its fitness (maximised, ``(batch,)``) and
        ``descriptors`` (``(batch, descriptor_size)``), replicated. Metrics are scalars,
        named ``emitter_*`` by convention."""


@runtime_checkable
class ObservesEpisodes(Protocol):
    """An emitter whose ``collect`` is true: it sees every evaluated episode's steps."""

    def observe(self, emitter_state: Any, transitions: Any, valid: jax.Array) -> Any:
        """The emitter state after the batch's transitions (``valid``: the real steps)."""


# --- algorithms and what records them ----------------------------------------------------


@runtime_checkable
class Algorithm(Protocol):
    """What the run shell runs: built as ``cls(config, mesh=None)`` from a registered config."""

    def init(self, key: jax.Array) -> Any:
        """The first state: a pytree with an integer ``generation`` field."""

    def step(self, state: Any, key: jax.Array) -> tuple[Any, dict]:
        """One generation, pure and jittable: ``(state, metrics)``, metrics scalars."""


@runtime_checkable
class SetsOwnSettings(Protocol):
    """An algorithm config some of whose fields the algorithm sets itself (PBT's searched
    hyperparameters): a sweep over them would change nothing, so it is refused."""

    def set_by_algorithm(self) -> tuple[str, ...]:
        """The fields the algorithm sets itself, dotted where nested (``td3.actor_lr``)."""


class Acting(NamedTuple):
    """A deterministic policy as an algorithm's evaluation runs it: episodes of ``env``
    stepped by ``policy(params, obs)`` (observations normalised by ``obs_norm`` where it
    is not ``None``), at most ``episode_length`` steps (``None``: the environment's)."""

    env: Any
    policy: Any
    params: Any
    obs_norm: Any = None
    episode_length: int | None = None


@runtime_checkable
class Acts(Protocol):
    """An algorithm on an environment whose state holds a policy to show (``evorl-pop
    render``): the solution an engine reports (ES and the hybrids,
    :class:`~evorl_pop.core.acting.EngineActing`), a learner's deterministic policy,
    PBT's best member."""

    def acting(self, state: Any) -> Acting:
        """The policy the algorithm's evaluation runs, from ``state``."""


@runtime_checkable
class Exports(Protocol):
    """An algorithm whose result is more than one solution (an archive of elites, a
    Pareto front): the run writes it into the run folder at the end, beside ``fitness.png``."""

    def export(self, state: Any, run_dir: Path, metrics: dict) -> dict[str, Path]:
        """Writes the result of ``state`` into ``run_dir`` (data files and figures);
        ``metrics``: the run's ``metrics.csv`` columns so far (NumPy arrays), for curves.
        Returns the figures written, by name (``{'archive': run_dir / 'archive.png'}``),
        which the recorders are shown as images."""


@runtime_checkable
class Recorder(Protocol):
    """What a run records, one method per moment (:class:`evorl_pop.run.recorders.Recorder`
    implements each as doing nothing: subclass it and override the ones you need).

    The run shell calls, on every process (only ``run.writer`` should write
    files): ``start`` once, ``row`` for each generation, ``flush`` after each
    chunk, ``image`` for each figure and ``finish`` at the end, in that order.
    """

    def start(self, run: Any, state: Any) -> None:
        """The run starts (``run.generation``: 0) or resumes (from a checkpoint) at ``state``."""

    def row(self, row: dict[str, Any]) -> None:
        """One generation's metrics: the columns of ``metrics.csv`` (NumPy scalars)."""

    def flush(self, run: Any, state: Any) -> None:
        """A chunk's rows are all in; ``state`` is the run's state after it."""

    def image(self, name: str, path: Path) -> None:
        """A figure the run drew (``fitness`` at the end)."""

    def finish(self, run: Any, completed: bool) -> None:
        """The run ends: ``completed``, or interrupted (Ctrl-C, a signal, an error)."""


# --- environments ------------------------------------------------------------------------


@runtime_checkable
class Env(Protocol):
    """An environment stepped in JAX, one episode at a time (vmapped for many)."""

    spec: EnvSpec

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """``(observation, state)`` of a new episode."""

    def step(
        self, key: jax.Array, state: Any, action: jax.Array
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array]:
        """``(observation, state, reward, done)`` after ``action``; the caller resets."""


@runtime_checkable
class EnvFamily(Protocol):
    """Environments built by name: gymnax's, brax's (``brax/<env>``), MuJoCo Playground's
    (``playground/<Task>``), Gymnasium's (``gym:<id>``), yours.

    A family registers itself in the module that defines it
    (:func:`evorl_pop.registry.register_env_family`). Tasks, environments, the
    configs' checks, ``evorl-pop list`` and ``evorl-pop render`` ask, family by
    family, which one :meth:`owns` a name, and then only that one. Its module
    imports its simulator only once an environment is built, so that listing and
    checking names stay cheap. :class:`evorl_pop.tasks.control.JaxEnvFamily`
    is the part every family stepped in JAX shares.
    """

    #: One line for ``evorl-pop list``: what the environments are, how their names look.
    description: str
    #: How a name looks, for messages: ``'brax/<env>'``, ``'gym:<Gymnasium id>'``.
    pattern: str
    #: The family's own settings: a config field it reads, to its valid values (brax's
    #: ``{'backend': BACKENDS}``); the configs check them and hand them to this family only.
    settings: dict[str, tuple[str, ...]]
    #: Whether :meth:`make_env` builds environments stepped in JAX (for every algorithm);
    #: ``False``: the family steps on the host, and only :meth:`make_task` builds (ES) tasks.
    steps_in_jax: bool
    #: The file type ``evorl-pop render`` draws its episodes as (``'html'``, ``'gif'``),
    #: or ``None``: there is nothing to draw.
    drawing: str | None
    #: A quick task of the family, with continuous actions where it has them (the
    #: matrix test runs every algorithm on it), or ``None``: the first of :meth:`names`.
    example: str | None

    def names(self) -> tuple[str, ...]:
        """The names it lists (``evorl-pop list``, the configs' choices); none for a family
        that takes any id of another registry (Gymnasium's)."""

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of its environments, listed or not."""

    def make_env(self, name: str, **settings) -> Env:
        """The environment ``name``; ``settings``: ``episode_length`` (every family) and
        the family's own :attr:`settings`, any of them left out for its default."""

    def make_task(self, name: str, **kwargs) -> Task:
        """The task of environment ``name`` (a neuroevolution task: a policy's flat
        weights, scored by its return); ``kwargs``:
        :class:`~evorl_pop.tasks.control.ControlTask`'s arguments (the policy, the
        episodes, ...) and the family's own :attr:`settings`."""

    def draw(self, env: Env, episodes: list, out: Path) -> int:
        """Draws ``episodes`` of ``env`` into the file ``out`` (its type: :attr:`drawing`);
        returns the frames written. Each episode is a
        :class:`~evorl_pop.tasks.drawing.Trajectory`: the environment's states after
        each step, its observations, the return so far."""


#: What a plug-in is checked against as it registers, and once built (:mod:`evorl_pop.registry`).
registry.PROTOCOLS.update(
    {
        p.__name__: p
        for p in (
            Strategy,
            Task,
            ReplayLearner,
            Algorithm,
            Env,
            EnvFamily,
            Emitter,
            ObservesEpisodes,
        )
    }
)
