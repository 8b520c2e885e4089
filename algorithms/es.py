"""Evolution strategies on a sharded population.

Any evosax strategy (CMA-ES, OpenES, SNES, PGPE, DE, PSO, ...), and pycma's
CMA-ES (:mod:`~evorl_pop.algorithms.cma_es`), on any task (black-box
functions, gymnax and brax control), the population sharded over the devices
of a mesh by the engine (:class:`~evorl_pop.core.engine.Engine`)::

    ESConfig ─► make_strategy (by name) + the task ─► ES, an Engine
             ─► evorl_pop.train(config): generations in compiled chunks

OpenES reads its noise from a shared table by default (Salimans et al. 2017,
sec. 2.1), and can take the low-communication path:
:mod:`~evorl_pop.algorithms.open_es`. Strategies are plug-ins
(:data:`evorl_pop.registry.STRATEGIES`): every evosax strategy is registered
here under its name. Restarts (IPOP, BIPOP) and pycma's stop
rules are in :mod:`~evorl_pop.algorithms.restarts`.
"""

from __future__ import annotations

import dataclasses
import inspect
import types

import evosax.algorithms
import jax
import jax.numpy as jnp
import numpy as np
import optax
from evosax.core.fitness_shaping import weights_fitness_shaping_fn

from evorl_pop import registry
from evorl_pop.algorithms.open_es import LowCommunication, NoiseTableOpen_ES
from evorl_pop.base import ConfigError, check_config, float_dtype
from evorl_pop.core.engine import Engine, Generation, State
from evorl_pop.core.interfaces import EVAL_MODES
from evorl_pop.tasks.multiobjective import MO_PREFIX
from evorl_pop.tasks.settings import TaskSettings

# --- strategies by name -----------------------------------------------------------

#: Every strategy by name: evosax's (registered at the end of this module), pycma's
#: CMA-ES (:mod:`~evorl_pop.algorithms.cma_es`) and any plug-in's
#: (:func:`evorl_pop.registry.register_strategy`).
STRATEGIES = registry.STRATEGIES


def strategy_class(name: str) -> type:
    """The class of the strategy registered as ``name`` (ValueError naming the valid ones)."""
    return registry.STRATEGIES.get(name)


OPTIMIZERS = {"adam": optax.adam, "sgd": optax.sgd}

#: Noise samplers of ``Open_ES`` (see :func:`make_strategy`); ``'auto'`` is the table.
NOISE = ("auto", "normal", "table")

#: Values used when ``learning_rate`` / ``sigma_init`` are left as ``None``,
#: for strategies whose evosax defaults (OpenES: SGD at 1e-3, σ = 1) suit no
#: neuroevolution task; other strategies keep evosax's defaults.
RECOMMENDED = {"Open_ES": {"learning_rate": 0.05, "sigma_init": 0.1}}


def elite_shaping(population_size: int, fraction: float):
    """Open_ES fitness shaping that follows only the best ``fraction`` of the population.

    CMA-ES's logarithmic recombination weights (Hansen 2016) on the best
    ``max(1, int(fraction * population_size))`` ranks, none on the rest: the
    mean moves towards the weighted mean of the elite's perturbations, so the
    rare candidate that does better counts in full instead of being averaged
    against every candidate tied on a plateau. Tied candidates take the weight
    of their averaged rank; NaN ranks last.

    Returns:
      An evosax ``fitness_shaping_fn`` (fitness minimised, as evosax's).
    """
    mu = max(1, int(fraction * population_size))
    w = np.log(mu + 0.5) - np.log(np.arange(1, mu + 1))
    weights = jnp.asarray(np.concatenate([w / w.sum(), np.zeros(population_size - mu)]))

    elite = types.SimpleNamespace(weights=weights)

    def shaping(population, fitness, state, params):
        # evosax's lookup by rank; Open_ES descends, so a negative value pulls towards the elite
        return -weights_fitness_shaping_fn(population, fitness, state, elite)

    return shaping


def make_strategy(
    name: str,
    population_size: int,
    num_dims: int,
    learning_rate: float | None = None,
    sigma_init: float | None = None,
    optimizer: str = "adam",
    noise: str = "auto",
    **kwargs,
):
    """Builds an evosax strategy over a flat ``num_dims`` vector.

    Args:
      name: a key of :data:`STRATEGIES` (``'CMA_ES'``, ``'Open_ES'``, ``'SNES'``, ...).
      population_size: candidates per generation.
      num_dims: the search-space dimension.
      learning_rate: for strategies with an optax optimizer: its learning
        rate (``None``: :data:`RECOMMENDED`, else the strategy's default optimizer).
      sigma_init: initial search width: ``std_init`` for strategies whose
        params have one, else a constant ``std_schedule`` (``None``:
        :data:`RECOMMENDED`, else the strategy's default).
      optimizer: ``'adam'`` or ``'sgd'``, with ``learning_rate``.
      noise: ``Open_ES``'s sampler: ``'table'`` (:class:`NoiseTableOpen_ES`:
        slices of one shared table of normals at random offsets, five times
        cheaper to draw on a CPU; ``table_size`` and ``table_seed`` go in
        ``kwargs``) or ``'normal'`` (evosax's own: fresh normals every
        generation). ``'auto'``: the table for ``Open_ES``; every other
        strategy draws its own noise.
      **kwargs: further constructor arguments of the strategy.

    Returns:
      ``(strategy, params)``.

    Raises:
      ValueError: an unknown name (listing the valid ones) or a population
        size the strategy cannot take.
    """
    cls = strategy_class(name)
    accepted = dict(inspect.signature(cls.__init__).parameters)
    if noise not in NOISE:
        raise ValueError(f"noise must be one of {list(NOISE)}, got {noise!r}.")
    if noise == "table" or (noise == "auto" and name == "Open_ES"):
        if name != "Open_ES":
            raise ValueError(f"noise='table' is an Open_ES sampler; {name} draws its own noise.")
        cls = NoiseTableOpen_ES  # takes Open_ES's arguments and the table's
        accepted |= inspect.signature(cls.__init__).parameters
    recommended = RECOMMENDED.get(name, {})
    if learning_rate is None:
        learning_rate = recommended.get("learning_rate")
    if sigma_init is None:
        sigma_init = recommended.get("sigma_init")
    if learning_rate is not None:
        if "optimizer" not in accepted:
            raise ValueError(f"{name} has no optimizer, so learning_rate cannot be set.")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}.")
        kwargs["optimizer"] = OPTIMIZERS[optimizer](learning_rate)
    if population_size < 2:
        raise ValueError(f"population_size must be at least 2, got {population_size}.")
    required = [
        n
        for n, p in accepted.items()
        if n not in ("self", "population_size", "solution")
        and p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and n not in kwargs
    ]
    if required:
        raise ValueError(
            f"{name} needs the constructor argument(s) {', '.join(required)}, which no "
            f"config field sets; build it in Python: make_strategy({name!r}, ..., "
            f"{required[0]}=...), then pass the strategy to evorl_pop.core.Engine."
        )
    try:
        strategy = cls(population_size=population_size, solution=jnp.zeros(num_dims), **kwargs)
    except AssertionError as err:
        even = population_size + population_size % 2
        raise ValueError(
            f"{name} cannot take population_size={population_size}: {err} "
            f"Try population_size={even if even != population_size else population_size + 2}."
        ) from err
    registry.check_built(f"strategy {name!r}", strategy, "Strategy")
    params = strategy.default_params
    if sigma_init is not None:
        # evosax's params, not a project object: only some of its strategies have std_init
        if hasattr(params, "std_init"):
            params = params.replace(std_init=jnp.asarray(sigma_init, float_dtype()))
        elif "std_schedule" in accepted:
            strategy = cls(
                population_size=population_size,
                solution=jnp.zeros(num_dims),
                std_schedule=optax.constant_schedule(sigma_init),
                **kwargs,
            )
        else:
            raise ValueError(f"{name} has no initial search width to set (sigma_init).")
    return strategy, params


@dataclasses.dataclass(frozen=True)
class ESConfig(TaskSettings):
    """Configuration of an ES run. Every field can be overridden.

    The task's fields (``task``, ``num_dims``, ``hidden_sizes``, ``episodes``, ...) are
    the task settings block's (:class:`~evorl_pop.tasks.settings.TaskSettings`): a
    black-box function (``sphere``, ``ellipsoid``, ``rosenbrock``, ``rastrigin``), a
    BBOB function (``bbob/ellipsoidal_rotated``, ...; see
    :data:`evorl_pop.tasks.blackbox.BBOB_FUNCTIONS`), an environment (``CartPole-v1``,
    ``Pendulum-v1``, ``brax/hopper``, ``playground/CheetahRun``, ...) or ``gym:<id>``,
    any registered Gymnasium environment, stepped on the host
    (:class:`~evorl_pop.tasks.gym_envs.GymTask`).

    Attributes:
      strategy: evosax strategy name, see :data:`STRATEGIES`.
      population_size: candidates per generation.
      sigma_init: initial search width (``None``: see :data:`RECOMMENDED`).
      learning_rate: optimizer learning rate for gradient-style ES (``None``:
        see :data:`RECOMMENDED`).
      optimizer: ``'adam'`` or ``'sgd'``.
      eval_episodes: episodes to evaluate the strategy's mean each generation
        and report as ``eval_return`` (0: off; black-box tasks: one evaluation).
      eval_mode: ``'vmap'`` (fast) or ``'map'`` (low memory) per device.
      low_communication: OpenES only: each device draws its own noise.
      elite: Open_ES: the update follows only this fraction of the
        population, the best, with CMA-ES's logarithmic weights
        (:func:`elite_shaping`; 0: evosax's centered ranks of all).
      noise: OpenES's sampler: ``'auto'`` or ``'table'`` (a shared table of
        normals read at random offsets, cheaper to draw), or ``'normal'``
        (evosax's own draw); see :func:`make_strategy`.
    """

    strategy: str = "Open_ES"
    population_size: int = 256
    sigma_init: float | None = None
    learning_rate: float | None = None
    optimizer: str = "adam"
    eval_episodes: int = 8
    eval_mode: str = "vmap"
    low_communication: bool = False
    noise: str = "auto"
    elite: float = 0.0

    def validate(self) -> None:
        """Raises a :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        if self.task.startswith(MO_PREFIX):
            raise ConfigError(
                f"task: {self.task!r} has several objectives and an evolution strategy ranks "
                "one; search it with -a nsga2 (or -a nsga3 for 3 objectives or more)."
            )
        self.check_task()
        check_config(
            self,
            choices={"optimizer": OPTIMIZERS, "eval_mode": EVAL_MODES, "noise": NOISE},
            least={"population_size": 2, "eval_episodes": 0},
        )
        try:
            STRATEGIES.get(self.strategy)
        except registry.PluginError as err:
            raise ConfigError(f"strategy: {err}") from None
        if self.noise == "table" and self.strategy != "Open_ES":
            raise ConfigError(
                f"noise='table' is an Open_ES sampler; {self.strategy} draws its own."
            )
        if not 0 <= self.elite <= 1:
            raise ConfigError(f"elite must be a fraction in [0, 1], got {self.elite}.")
        if self.elite and self.strategy != "Open_ES":
            raise ConfigError(
                f"elite shapes Open_ES's update; {self.strategy} weighs its candidates "
                "itself: leave elite at 0."
            )
        for name in ("sigma_init", "learning_rate"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 (or null for the default), got {value}.")


class ES(Engine):
    """An evosax strategy on a task, its population sharded over a mesh: the engine
    built from an :class:`ESConfig`."""

    def __init__(self, config: ESConfig, mesh=None, task=None):
        """Builds the strategy and the task, and the engine that runs them.

        Args:
          config: an :class:`ESConfig`.
          mesh: a mesh with a ``'POP'`` axis (``None``: every device).
          task: a ready task instead of ``config.task`` (e.g. a custom policy).

        Raises:
          ConfigError: a value of ``config`` that cannot run (see ``ESConfig.validate``).
        """
        config.validate()
        self.config = config
        if task is None:
            task = config.make_task()
        else:
            registry.check_built("ES(config, task=...)", task, "Task")
        shaping = elite_shaping(config.population_size, config.elite) if config.elite else None
        strategy, params = make_strategy(
            config.strategy,
            config.population_size,
            task.num_dims,
            learning_rate=config.learning_rate,
            sigma_init=config.sigma_init,
            optimizer=config.optimizer,
            noise=config.noise,
            **({"fitness_shaping_fn": shaping} if shaping else {}),
        )
        super().__init__(
            strategy,
            task,
            mesh=mesh,
            strategy_params=params,
            eval_mode=config.eval_mode,
            eval_episodes=config.eval_episodes,
        )
        #: OpenES's low-communication path (``config.low_communication``), or ``None``.
        self.low_communication = LowCommunication(self) if config.low_communication else None

    def generation(self, state: State, key: jax.Array) -> Generation:
        """The engine's generation, or OpenES's low-communication one (the engine's hook)."""
        if self.low_communication is not None:
            return self.low_communication.generation(state, key)
        return super().generation(state, key)


# --- what this module registers ---------------------------------------------------

for _name, _cls in evosax.algorithms.algorithms.items():
    registry.register_strategy(_name, _cls)
registry.register_algorithm(
    "es", ESConfig, ES, "any evosax evolution strategy on a black-box function or an environment"
)
