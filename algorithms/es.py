"""Evolution strategies on a sharded population: the runner.

Any evosax strategy (CMA-ES, OpenES, SNES, PGPE, DE, PSO, ...) on any task
(black-box functions, gymnax control), the population sharded over the
devices of a mesh::

    from evorl_pop.algorithms.es import ES, ESConfig

    es = ES(ESConfig(strategy="Open_ES", task="CartPole-v1", population_size=256))
    state, history = es.train(jax.random.key(0), num_generations=50)
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect

import evosax.algorithms
import jax
import jax.numpy as jnp
import numpy as np
import optax

from evorl_pop.engine import ESState, ShardedES
from evorl_pop.envs import BRAX_PREFIX
from evorl_pop.tasks import make_task
from evorl_pop.training import train_loop

STRATEGIES: dict[str, type] = dict(evosax.algorithms.algorithms)

OPTIMIZERS = {"adam": optax.adam, "sgd": optax.sgd}

#: Values used when ``learning_rate`` / ``sigma_init`` are left as ``None``,
#: for strategies whose evosax defaults (OpenES: SGD at 1e-3, σ = 1) suit no
#: neuroevolution task; other strategies keep evosax's defaults.
RECOMMENDED = {"Open_ES": {"learning_rate": 0.05, "sigma_init": 0.1}}


def make_strategy(
    name: str,
    population_size: int,
    num_dims: int,
    learning_rate: float | None = None,
    sigma_init: float | None = None,
    optimizer: str = "adam",
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
      **kwargs: further constructor arguments of the strategy.

    Returns:
      ``(strategy, params)``.

    Raises:
      ValueError: an unknown name (listing the valid ones) or a population
        size the strategy cannot take.
    """
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, STRATEGIES, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"Unknown strategy {name!r}.{hint} Valid strategies: {', '.join(sorted(STRATEGIES))}."
        )
    cls = STRATEGIES[name]
    accepted = inspect.signature(cls.__init__).parameters
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
            f"{required[0]}=...), then pass the strategy to evorl_pop.engine.ShardedES."
        )
    try:
        strategy = cls(population_size=population_size, solution=jnp.zeros(num_dims), **kwargs)
    except AssertionError as err:
        even = population_size + population_size % 2
        raise ValueError(
            f"{name} cannot take population_size={population_size}: {err} "
            f"Try population_size={even if even != population_size else population_size + 2}."
        ) from err
    params = strategy.default_params
    if sigma_init is not None:
        if hasattr(params, "std_init"):
            params = params.replace(std_init=jnp.float32(sigma_init))
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
class ESConfig:
    """Configuration of an ES run. Every field can be overridden.

    Attributes:
      strategy: evosax strategy name, see :data:`STRATEGIES`.
      task: black-box function (``sphere``, ``ellipsoid``, ``rosenbrock``,
        ``rastrigin``) or environment name (``CartPole-v1``, ``Pendulum-v1``, ...).
      population_size: candidates per generation.
      sigma_init: initial search width (``None``: see :data:`RECOMMENDED`).
      learning_rate: optimizer learning rate for gradient-style ES (``None``:
        see :data:`RECOMMENDED`).
      optimizer: ``'adam'`` or ``'sgd'``.
      num_dims: black-box tasks: dimension.
      x0: black-box tasks: every coordinate of the starting point.
      hidden_sizes: control tasks: MLP hidden layers (after the CNN's
        convolutions for image observations).
      activation: control tasks: ``'tanh'``, ``'relu'`` or ``'elu'``.
      policy: control tasks: ``'auto'`` (a CNN for image observations such as
        MinAtar's, else an MLP on the flattened observation), ``'mlp'`` or ``'cnn'``.
      episode_length: control tasks: steps after which an episode ends
        (``None``: the environment's own limit; 1000 for brax).
      backend: brax tasks: physics backend, ``'spring'`` (default: the
        fastest), ``'positional'``, ``'generalized'`` (brax's default, the
        most accurate) or ``'mjx'`` (where mujoco's MJX is installed).
      episodes: control tasks: episodes per candidate.
      normalize_obs: control tasks: running observation normalisation.
      eval_episodes: episodes to evaluate the strategy's mean each generation
        and report as ``eval_return`` (0: off; black-box tasks: one evaluation).
      eval_mode: ``'vmap'`` (fast) or ``'map'`` (low memory) per device.
      low_communication: OpenES only: each device draws its own noise.
    """

    strategy: str = "Open_ES"
    task: str = "CartPole-v1"
    population_size: int = 256
    sigma_init: float | None = None
    learning_rate: float | None = None
    optimizer: str = "adam"
    num_dims: int = 10
    x0: float = 3.0
    hidden_sizes: tuple[int, ...] = (32,)
    activation: str = "tanh"
    policy: str = "auto"
    episode_length: int | None = None
    backend: str = "spring"
    episodes: int = 1
    normalize_obs: bool = False
    eval_episodes: int = 8
    eval_mode: str = "vmap"
    low_communication: bool = False

    def make_task(self):
        from evorl_pop.tasks import BLACKBOX_FUNCTIONS

        if self.task in BLACKBOX_FUNCTIONS:
            return make_task(self.task, num_dims=self.num_dims, x0=self.x0)
        return make_task(
            self.task,
            hidden_sizes=tuple(self.hidden_sizes),
            activation=self.activation,
            episodes=self.episodes,
            normalize_obs=self.normalize_obs,
            episode_length=self.episode_length,
            backend=self.backend if self.task.startswith(BRAX_PREFIX) else None,
            policy=self.policy,
        )


class ES:
    """An evosax strategy on a task, its population sharded over a mesh."""

    def __init__(self, config: ESConfig, mesh=None, task=None):
        """Builds the run.

        Args:
          config: an :class:`ESConfig`.
          mesh: a mesh with a ``'POP'`` axis (``None``: every device).
          task: a ready task instead of ``config.task`` (e.g. a custom policy).
        """
        self.config = config
        self.task = config.make_task() if task is None else task
        self.strategy, params = make_strategy(
            config.strategy,
            config.population_size,
            self.task.num_dims,
            learning_rate=config.learning_rate,
            sigma_init=config.sigma_init,
            optimizer=config.optimizer,
        )
        self.engine = ShardedES(
            self.strategy,
            self.task,
            mesh=mesh,
            strategy_params=params,
            eval_mode=config.eval_mode,
            eval_episodes=config.eval_episodes,
            low_communication=config.low_communication,
        )

    def init(self, key: jax.Array) -> ESState:
        return self.engine.init(key)

    def step(self, state: ESState, key: jax.Array):
        return self.engine.step(state, key)

    def train(self, key: jax.Array, num_generations: int, chunk: int = 10, **kwargs):
        """Initialises from ``key`` and runs ``num_generations`` generations.

        Returns:
          ``(state, history)`` as :func:`evorl_pop.training.train_loop`.
        """
        init_key, run_key = jax.random.split(key)
        state = self.init(init_key)
        return train_loop(self, state, run_key, num_generations, chunk, **kwargs)


@dataclasses.dataclass(frozen=True)
class MinimizeResult:
    """Outcome of :func:`minimize`.

    Attributes:
      converged: whether some run reached the target.
      evaluations: function evaluations spent, restarts included, up to the
        generation that reached the target (or in all, if none did).
      best: the best fitness found.
      restarts: restarts used.
    """

    converged: bool
    evaluations: int
    best: float
    restarts: int


def minimize(
    config: ESConfig,
    key: jax.Array,
    target: float = 1e-8,
    max_generations: int = 2000,
    restarts: int = 2,
    stall_generations: int | None = None,
    stall_tolerance: float = 1e-11,
    mesh=None,
) -> MinimizeResult:
    """Minimises a black-box task to ``target``, restarting a stalled run.

    A run stalls when its best fitness has changed by less than
    ``stall_tolerance`` over ``stall_generations`` generations (pycma's
    ``tolfun`` criterion; default ``10 + 30 * dims / popsize``) while still
    above ``target`` (e.g. CMA-ES in Rosenbrock's local optimum). It then
    restarts from the same starting point with a fresh key; the evaluations
    of the stalled run, up to its detection, count.

    Args:
      config: the run configuration (a black-box task).
      key: the PRNG key.
      target: stop at the first generation whose best fitness is below it.
      max_generations: generations per run.
      restarts: restarts allowed after stalls.
      stall_generations: see above.
      stall_tolerance: see above.
      mesh: the device mesh.

    Returns:
      A :class:`MinimizeResult`.
    """
    es = ES(config, mesh=mesh)
    if es.task.maximize:
        raise ValueError(f"minimize needs a black-box task to minimise, not {config.task!r}.")
    window = stall_generations or int(10 + 30 * es.task.num_dims / config.population_size)

    @jax.jit
    def run(key):
        init_key, run_key = jax.random.split(key)
        _, metrics = es.engine.run(es.init(init_key), run_key, max_generations)
        return metrics["fitness_best"]

    evaluations, best = 0, float("inf")
    for attempt in range(restarts + 1):
        history = np.asarray(run(jax.random.fold_in(key, attempt)))
        best = min(best, float(np.min(history)))
        hit = np.flatnonzero(history < target)
        if hit.size:
            return MinimizeResult(
                True, evaluations + int(hit[0] + 1) * config.population_size, best, attempt
            )
        so_far = np.minimum.accumulate(history)
        flat = np.flatnonzero(so_far[:-window] - so_far[window:] < stall_tolerance)
        stop = int(flat[0] + window + 1) if flat.size else max_generations
        evaluations += stop * config.population_size
    return MinimizeResult(False, evaluations, best, restarts)
