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
import inspect
import types

import evosax.algorithms
import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
import optax
from evosax.algorithms.distribution_based import cma_es
from evosax.core.fitness_shaping import weights_fitness_shaping_fn
from flax import struct

from evorl_pop.blackbox import BBOB_PREFIX, float_dtype, objective_errors
from evorl_pop.engine import ESState, ShardedES
from evorl_pop.envs import BRAX_PREFIX
from evorl_pop.noise_table import NoiseTableOpen_ES
from evorl_pop.registry import did_you_mean
from evorl_pop.tasks import make_task
from evorl_pop.training import train_loop


@struct.dataclass
class _PycmaState(cma_es.State):
    flat_generations: jax.Array
    scaling: jax.Array  # pycma's sigma_vec: per-coordinate scale of the genotype
    transform: jax.Array  # phenotype = transform @ genotype
    transform_inv: jax.Array
    transformed: jax.Array  # bool: the main axes have been moved into ``transform``


def _pycma_weights(population, fitness, state, params):
    """The recombination weight of each candidate by its rank, ties broken by index.

    Args:
      population: the candidates (unused).
      fitness: their fitness, lower is better; NaN ranks last.
      state: the strategy state (unused).
      params: the strategy parameters, with ``weights`` in rank order.

    Returns:
      Each candidate's weight (all zero when every fitness is NaN).
    """
    order = jnp.argsort(jnp.where(jnp.isnan(fitness), jnp.inf, fitness), stable=True)
    weights = params.weights[jnp.argsort(order)]
    return jnp.where(jnp.all(jnp.isnan(fitness)), jnp.zeros_like(weights), weights)


class CMA_ES_pycma(evosax.algorithms.CMA_ES):
    """evosax's CMA-ES with pycma's default settings (``cma`` 4.x, ``CMA_active=True``).

    evosax's update is kept (its active covariance update included: negative
    recombination weights, their vectors rescaled to Mahalanobis length
    ``sqrt(n)``, Hansen 2016, eqs. 46-53); what differs is pycma's choice of
    constants and two rules:

    * ``c_mu = 2 (μ_eff - 2 + 1/μ_eff + 1/4) / ((n + 2)² + μ_eff)`` (pycma's
      rank-μ offset 1/4), ``c_1`` times ``min(1, λ/6)``, and the negative
      weights recomputed from these rates;
    * ``c_σ = min(1/2, (μ_eff + 2) / (n + μ_eff + 3))``,
      ``d_σ = 1 + 2 max(0, a sqrt((μ_eff - 1)/(n + 1)) - 1) + c_σ`` with
      ``a = max(1, 3 (1 - 2^(-n/9)))``, and the exact ``E||N(0, I)||``;
    * ``h_σ``: ``||p_σ||² / (1 - (1 - c_σ)^(2g)) / n < 2 + 4/(n + 1)``, and the
      change of ``log σ`` in one generation clipped to ``[-1, 1]``.

    The recombination weights go by rank with ties broken by candidate order,
    as pycma's sort does (evosax averages tied ranks and truncates them, so on
    a plateau, e.g. BBOB's step ellipsoid, tied candidates share one weight
    and the weights no longer sum to one). C starts as pycma's,
    ``diag(exp(1e-4 i / n))``; the state also counts
    consecutive generations whose best fitness equals the one at rank
    ``⌊3λ/4⌋`` (``flat_generations``, for pycma's ``tolflatfitness``).

    pycma's ``conditioncov_alleviate`` (default ``(1e8, 1e12)``) is kept, as
    pycma applies it before sampling: once the ratio of C's largest to
    smallest diagonal entry reaches the first value, C becomes its correlation
    matrix and its scales move into ``scaling`` (pycma's ``sigma_vec``);
    once C's condition number (from the last eigendecomposition) reaches the
    second, C's square root moves, once per run, into a linear
    genotype-phenotype map (``transform``) and C starts again from the
    identity. The distribution is unchanged, but from then on ``mean``,
    ``C`` and ``p_c`` live in the genotype coordinates, as pycma's do, and so
    do the stop rules of :class:`Minimizer` that read them. ``ask`` returns
    phenotypes, ``tell`` takes phenotypes; :meth:`get_mean` is the
    phenotype mean.
    """

    def __init__(
        self,
        population_size: int,
        solution: jax.Array,
        fitness_shaping_fn=None,
        metrics_fn=cma_es.metrics_fn,
        conditioncov_alleviate: tuple[float, float] | None = (1e8, 1e12),
    ):
        """evosax's constructor, with :func:`_pycma_weights` as the default fitness shaping.

        Args:
          population_size: λ.
          solution: a solution of the searched shape.
          fitness_shaping_fn: evosax's fitness shaping (``None``: by rank, as pycma).
          metrics_fn: evosax's metrics.
          conditioncov_alleviate: pycma's option of that name: the coordinate
            condition and the condition of C at which C's scaling moves into
            the genotype-phenotype map (``None``: never).
        """
        shaping = fitness_shaping_fn or _pycma_weights
        super().__init__(population_size, solution, shaping, metrics_fn)
        alleviate = conditioncov_alleviate or (np.inf, np.inf)
        self.alleviate_coordinates, self.alleviate_axes = float(alleviate[0]), float(alleviate[-1])

    @property
    def _default_params(self):
        params = super()._default_params
        n, lam, mu = self.num_dims, self.population_size, self.num_elites
        w_prime = jnp.log((lam + 1) / 2) - jnp.log(jnp.arange(1, lam + 1))
        mu_eff = params.mu_eff
        mu_eff_minus = jnp.sum(w_prime[mu:]) ** 2 / jnp.sum(w_prime[mu:] ** 2)
        c_1 = min(1.0, lam / 6) * 2 / ((n + 1.3) ** 2 + mu_eff)
        c_mu = jnp.minimum(1 - c_1, 2 * (0.25 + mu_eff + 1 / mu_eff - 2) / ((n + 2) ** 2 + mu_eff))
        alpha = jnp.minimum(
            jnp.minimum(1 + c_1 / c_mu, 1 + 2 * mu_eff_minus / (mu_eff + 2)),
            (1 - c_1 - c_mu) / (n * c_mu),
        )
        negative = w_prime < 0
        weights = jnp.where(
            negative,
            alpha * w_prime / jnp.sum(jnp.where(negative, -w_prime, 0.0)),
            w_prime / jnp.sum(jnp.where(negative, 0.0, w_prime)),
        )
        c_std = jnp.minimum(0.5, (mu_eff + 2) / (n + mu_eff + 3))
        a = max(1.0, 3 * (1 - 0.5 ** (n / 9)))
        d_std = 1 + 2 * jnp.maximum(0.0, a * jnp.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_std
        chi_n = jnp.sqrt(2.0) * jnp.exp(
            jax.scipy.special.gammaln((n + 1) / 2) - jax.scipy.special.gammaln(n / 2)
        )
        return params.replace(
            weights=weights,
            c_1=c_1,
            c_mu=c_mu,
            c_std=c_std,
            d_std=d_std,
            chi_n=chi_n,
            std_max=jnp.inf,  # pycma bounds σ by no constant
        )

    def _initial_C(self):
        return jnp.diag(jnp.exp(1e-4 / self.num_dims * jnp.arange(self.num_dims)))

    def _init(self, key, params):
        state = super()._init(key, params)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        # pycma's initial C: the identity with a tiny spread, which breaks the symmetry
        fields["C"] = self._initial_C()
        eye = jnp.eye(self.num_dims)
        return _PycmaState(
            **fields,
            flat_generations=jnp.int32(0),
            scaling=jnp.ones(self.num_dims),
            transform=eye,
            transform_inv=eye,
            transformed=jnp.bool_(False),
        )

    def get_mean(self, state):
        """The mean in the search space (the phenotype of ``state.mean``)."""
        return self._unravel_solution(state.transform @ state.mean)

    def _ask(self, key, state, params):
        """pycma's alleviation of C's conditioning, then sampling from C's eigendecomposition.

        evosax's ``ask`` adds ``1e-8 I`` to C, keeps it, and floors the eigenvalues
        at 1e-8: absolute constants that, next to C's smallest eigenvalues on
        a badly conditioned problem, widen the narrow axes generation after
        generation. pycma adds nothing; the floor here, the float's
        resolution relative to the largest eigenvalue (below it an eigenvalue
        is rounding noise), only keeps ``C^(-1/2)`` finite.

        Before sampling, as pycma's ``ask``: at a coordinate condition
        ``max C_ii / min C_ii`` of at least ``alleviate_coordinates``, C
        becomes its correlation matrix, ``scaling *= sqrt(C_ii)`` and ``p_c /=
        sqrt(C_ii)``; then, once per run, at a condition of at least
        ``alleviate_axes`` (of C as last decomposed, as pycma's ``B`` and ``D``
        are then), the map ``diag(scaling) C^(1/2)`` moves into ``transform``,
        the mean and ``p_c`` into the new coordinates, and C and ``scaling``
        start again. Candidates are ``transform (mean + σ scaling C^(1/2) z)``.
        """
        dtype = state.mean.dtype
        C = (state.C + state.C.T) / 2
        diagonal = jnp.diag(C)
        coordinates = jnp.max(diagonal) / jnp.min(diagonal) >= self.alleviate_coordinates
        factors = jnp.where(coordinates, jnp.sqrt(diagonal), 1.0)
        correlation = C / jnp.outer(factors, factors)
        C = jnp.where(coordinates, (correlation + correlation.T) / 2, C)
        scaling = state.scaling * factors
        p_c = state.p_c / factors

        eigenvalues, B = jnp.linalg.eigh(C)
        floor = jnp.finfo(C.dtype).eps * jnp.max(eigenvalues)
        D = jnp.sqrt(jnp.maximum(eigenvalues, floor))

        # C as last decomposed: this generation's if the coordinates changed, else the last one's
        B_last = jnp.where(coordinates, B, state.B)
        D_last = jnp.where(coordinates, D, state.D)
        axes = ~state.transformed & ((D_last[-1] / D_last[0]) ** 2 >= self.alleviate_axes)
        root = (B_last * D_last) @ B_last.T
        root_inv = (B_last / D_last) @ B_last.T
        transform = jnp.where(axes, scaling[:, None] * root, state.transform)
        transform_inv = jnp.where(axes, root_inv / scaling, state.transform_inv)
        mean = jnp.where(axes, transform_inv @ state.mean, state.mean)
        p_c = jnp.where(axes, root_inv @ p_c, p_c)
        scaling = jnp.where(axes, 1.0, scaling)
        C0 = self._initial_C().astype(dtype)
        C = jnp.where(axes, C0, C)
        B = jnp.where(axes, jnp.eye(self.num_dims, dtype=dtype), B)
        D = jnp.where(axes, jnp.sqrt(jnp.diag(C0)), D)

        z = jax.random.normal(key, (self.population_size, self.num_dims), dtype)
        genotypes = mean + state.std * scaling * ((z * D) @ B.T)
        population = genotypes @ transform.T
        return population, state.replace(
            C=C,
            B=B,
            D=D,
            mean=mean,
            p_c=p_c,
            scaling=scaling,
            transform=transform,
            transform_inv=transform_inv,
            transformed=state.transformed | axes,
        )

    def _tell(self, key, population, fitness, state, params):
        """evosax's update, in the coordinates where C is the covariance: genotype / scaling."""
        encoded = (population @ state.transform_inv.T) / state.scaling
        new = super()._tell(
            key, encoded, fitness, state.replace(mean=state.mean / state.scaling), params
        )
        return new.replace(mean=new.mean * state.scaling)

    def tell(self, key, population, fitness, state, params):
        """evosax's ``tell``, and the count of flat generations.

        Args:
          key: the PRNG key.
          population: the generation's candidates.
          fitness: their fitness, lower is better.
          state: the strategy state.
          params: the strategy parameters.

        Returns:
          ``(state, metrics)`` as evosax's ``tell``.
        """
        ranked = jnp.sort(fitness)
        flat = ranked[0] >= ranked[int(0.75 * self.population_size)]
        state, metrics = super().tell(key, population, fitness, state, params)
        flat_generations = jnp.where(flat, state.flat_generations + 1, 0).astype(jnp.int32)
        return state.replace(flat_generations=flat_generations), metrics

    def h_std(self, norm_p_std, generation_counter, params):
        """pycma's stall indicator of the rank-one update (``generation_counter`` from 1)."""
        squared = norm_p_std**2 / (1 - (1 - params.c_std) ** (2 * generation_counter))
        return squared / self.num_dims < 2 + 4 / (self.num_dims + 1)

    def update_std(self, std, norm_p_std, params):
        """evosax's step-size update, its change of ``log σ`` clipped to ``[-1, 1]`` as pycma's."""
        change = (params.c_std / params.d_std) * (norm_p_std / params.chi_n - 1)
        std = std * jnp.exp(jnp.clip(change, -1.0, 1.0))
        return jnp.clip(std, min=params.std_min, max=params.std_max)


STRATEGIES: dict[str, type] = dict(evosax.algorithms.algorithms, CMA_ES_pycma=CMA_ES_pycma)

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
      noise: ``Open_ES``'s sampler: ``'table'`` (:class:`~evorl_pop.noise_table.NoiseTableOpen_ES`:
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
    if name not in STRATEGIES:
        hint = did_you_mean(name, STRATEGIES, 3)
        raise ValueError(
            f"Unknown strategy {name!r}.{hint} Valid strategies: {', '.join(sorted(STRATEGIES))}."
        )
    cls = STRATEGIES[name]
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
class ESConfig:
    """Configuration of an ES run. Every field can be overridden.

    Attributes:
      strategy: evosax strategy name, see :data:`STRATEGIES`.
      task: black-box function (``sphere``, ``ellipsoid``, ``rosenbrock``,
        ``rastrigin``), BBOB function (``bbob/ellipsoidal_rotated``, ...; see
        :data:`evorl_pop.blackbox.BBOB_FUNCTIONS`) or environment name
        (``CartPole-v1``, ``Pendulum-v1``, ...).
      population_size: candidates per generation.
      sigma_init: initial search width (``None``: see :data:`RECOMMENDED`).
      learning_rate: optimizer learning rate for gradient-style ES (``None``:
        see :data:`RECOMMENDED`).
      optimizer: ``'adam'`` or ``'sgd'``.
      num_dims: black-box tasks: dimension.
      x0: black-box tasks: every coordinate of the starting point.
      instance: BBOB tasks: the instance seed (shift, rotations, ``f_opt``), from 1.
      hidden_sizes: control tasks: MLP hidden layers (after the CNN's
        convolutions for image observations).
      activation: control tasks: ``'tanh'``, ``'relu'`` or ``'elu'``.
      policy: control tasks: ``'auto'`` (a CNN for image observations such as
        MinAtar's, else an MLP on the flattened observation), ``'mlp'``, ``'cnn'``
        or ``'keypoints'`` (each image channel's spatial soft-argmax, then
        the MLP: :class:`~evorl_pop.networks.Keypoints`).
      episode_length: control tasks: steps after which an episode ends
        (``None``: the environment's own limit; 1000 for brax).
      backend: brax tasks: physics backend, ``'spring'`` (default: the
        fastest), ``'positional'``, ``'generalized'`` (brax's default, the
        most accurate) or ``'mjx'`` (where mujoco's MJX is installed).
      episodes: control tasks: episodes per candidate.
      normalize_obs: control tasks: running observation normalisation.
      virtual_batch_norm: control tasks: standardise the policy's hidden
        layers over a fixed batch of observations of random play (Salimans et
        al. 2017), folded into each candidate's weights.
      rollout_lanes: control tasks: episodes a device steps at once, each lane
        taking the next pending episode as its own ends (``None``: 16 on a
        CPU, the whole slice on an accelerator).
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
    task: str = "CartPole-v1"
    population_size: int = 256
    sigma_init: float | None = None
    learning_rate: float | None = None
    optimizer: str = "adam"
    num_dims: int = 10
    x0: float = 3.0
    instance: int = 1
    hidden_sizes: tuple[int, ...] = (32,)
    activation: str = "tanh"
    policy: str = "auto"
    episode_length: int | None = None
    backend: str = "spring"
    episodes: int = 1
    normalize_obs: bool = False
    virtual_batch_norm: bool = False
    rollout_lanes: int | None = None
    eval_episodes: int = 8
    eval_mode: str = "vmap"
    low_communication: bool = False
    noise: str = "auto"
    elite: float = 0.0

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.config.ConfigError` naming a value that cannot run."""
        from evorl_pop.config import ConfigError, check_choice
        from evorl_pop.tasks import BLACKBOX_FUNCTIONS, task_names

        check_choice("strategy", self.strategy, STRATEGIES)
        check_choice("task", self.task, task_names())
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("activation", self.activation, ("tanh", "relu", "elu"))
        check_choice("eval_mode", self.eval_mode, ("vmap", "map"))
        check_choice("noise", self.noise, NOISE)
        if self.noise == "table" and self.strategy != "Open_ES":
            raise ConfigError(
                f"noise='table' is an Open_ES sampler; {self.strategy} draws its own."
            )
        for name, least in (("population_size", 2), ("num_dims", 1), ("episodes", 1),
                            ("eval_episodes", 0)):  # fmt: skip
            if getattr(self, name) < least:
                raise ConfigError(f"{name} must be at least {least}, got {getattr(self, name)}.")
        if not 0 <= self.elite <= 1:
            raise ConfigError(f"elite must be a fraction in [0, 1], got {self.elite}.")
        if self.elite and self.strategy != "Open_ES":
            raise ConfigError(
                f"elite shapes Open_ES's update; {self.strategy} weighs its candidates "
                "itself: leave elite at 0."
            )
        if (lanes := self.rollout_lanes) is not None and lanes < 1:
            raise ConfigError(f"rollout_lanes must be at least 1 (or null), got {lanes}.")
        blackbox = self.task in BLACKBOX_FUNCTIONS or self.task.startswith(BBOB_PREFIX)
        for name in ("normalize_obs", "virtual_batch_norm"):
            if blackbox and getattr(self, name):
                raise ConfigError(
                    f"{name} applies to environment tasks (a policy network), not to the "
                    f"black-box task {self.task!r}: leave it false."
                )
        if any(h < 1 for h in self.hidden_sizes):
            raise ConfigError(f"hidden_sizes must be at least 1, got {list(self.hidden_sizes)}.")
        for name in ("sigma_init", "learning_rate"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 (or null for the default), got {value}.")

    def make_task(self):
        from evorl_pop.tasks import BLACKBOX_FUNCTIONS

        if self.task in BLACKBOX_FUNCTIONS:
            return make_task(self.task, num_dims=self.num_dims, x0=self.x0)
        if self.task.startswith(BBOB_PREFIX):
            return make_task(self.task, num_dims=self.num_dims, x0=self.x0, instance=self.instance)
        return make_task(
            self.task,
            hidden_sizes=tuple(self.hidden_sizes),
            activation=self.activation,
            episodes=self.episodes,
            normalize_obs=self.normalize_obs,
            episode_length=self.episode_length,
            backend=self.backend if self.task.startswith(BRAX_PREFIX) else None,
            policy=self.policy,
            lanes=self.rollout_lanes,
            virtual_batch_norm=self.virtual_batch_norm,
        )


class ES:
    """An evosax strategy on a task, its population sharded over a mesh."""

    def __init__(self, config: ESConfig, mesh=None, task=None):
        """Builds the run.

        Args:
          config: an :class:`ESConfig`.
          mesh: a mesh with a ``'POP'`` axis (``None``: every device).
          task: a ready task instead of ``config.task`` (e.g. a custom policy).

        Raises:
          ConfigError: a value of ``config`` that cannot run (see ``ESConfig.validate``).
        """
        config.validate()
        self.config = config
        self.task = config.make_task() if task is None else task
        self.strategy, params = make_strategy(
            config.strategy,
            config.population_size,
            self.task.num_dims,
            learning_rate=config.learning_rate,
            sigma_init=config.sigma_init,
            optimizer=config.optimizer,
            noise=config.noise,
            **({"fitness_shaping_fn": elite_shaping(config.population_size, config.elite)}
               if config.elite else {}),
        )  # fmt: skip
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
        with objective_errors():
            state = self.init(init_key)
            return train_loop(self, state, run_key, num_generations, chunk, **kwargs)


# --- black-box minimisation with restarts ------------------------------------------

#: Why a run ended; ``'running'`` never leaves :class:`Minimizer`.
STOP_REASONS = (
    "running",
    "target",
    "budget",
    "maxiter",
    "tolfun",
    "tolfunhist",
    "tolx",
    "tolconditioncov",
    "tolstagnation",
    "tolflatfitness",
    "tolfacupx",
    "noeffectcoord",
    "noeffectaxis",
    "tolxstagnation",
    "tolupsigma",
)
RESTART_STRATEGIES = ("ipop", "bipop")


@dataclasses.dataclass(frozen=True)
class StopRules:
    """pycma's termination criteria of one run, with its option names and defaults.

    Attributes:
      tolfun: the generation's fitness range and the range of the best
        fitness over the last ``10 + 30 n / λ`` generations are both below it.
      tolfunhist: that history (at least 10 generations) has a range below it.
      tolx: every ``σ·sqrt(C_ii)`` and ``σ·|p_c,i|`` is below it (CMA-ES family).
      tolconditioncov: the condition number of ``C`` exceeds it.
      tolstagnation: stop when the medians of the best and of the median
        fitness (sampled every 5 generations) stop improving over about
        ``100 + 100 n^1.5 / λ0`` generations (λ0: the first run's population)
        and the best is that old.
      tolflatfitness: generations tolerated in a row whose best fitness
        equals the one at rank ``⌊3λ/4⌋`` (strategies that count them,
        ``CMA_ES_pycma``).
      tolfacupx: some ``σ·sqrt(C_ii)`` exceeds ``σ0`` times it (CMA-ES family).
      tolupsigma: ``σ / sqrt(λ_max(C))`` exceeds ``σ0`` times it: σ has grown
        while C shrank, "creeping" (CMA-ES family).
      tolxstagnation: ``(δ, t0, f)``: stop when the mean has stayed within
        ``δ·sqrt(max(1, t / T))`` of where it was ``t`` generations ago, for
        ``t > T = t0 + f·g`` generations (``None``: off).
      noeffect: stop when adding ``0.2 σ·sqrt(C_ii)`` leaves some coordinate
        of the mean unchanged (``noeffectcoord``), or ``0.1 σ`` times the
        principal axis ``g mod n`` leaves the mean unchanged (``noeffectaxis``).

    With ``CMA_ES_pycma``, as in pycma, the rules read the genotype: its mean,
    ``σ·scaling·sqrt(C_ii)`` for ``σ·sqrt(C_ii)``, and C after pycma's
    alleviation of its conditioning (so ``tolconditioncov`` practically
    never fires, C's condition starting again at 1e12).
    """

    tolfun: float = 1e-11
    tolfunhist: float = 1e-12
    tolx: float = 1e-11
    tolconditioncov: float = 1e14
    tolstagnation: bool = True
    tolxstagnation: tuple[float, float, float] | None = (1e-9, 20.0, 0.1)
    tolflatfitness: int = 1
    tolfacupx: float = 1e3
    noeffect: bool = True
    tolupsigma: float = 1e20


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run of a restart sequence.

    Attributes:
      population_size: its population size λ.
      sigma: its initial step size.
      regime: ``'first'``, ``'large'`` (IPOP doubling) or ``'small'`` (BIPOP).
      max_generations: its generation limit (``maxiter``).
      evaluations: the evaluations it used.
      stop: why it ended, one of :data:`STOP_REASONS`.
      best: its best fitness.
    """

    population_size: int
    sigma: float
    regime: str
    max_generations: int
    evaluations: int
    stop: str
    best: float


@dataclasses.dataclass(frozen=True)
class MinimizeResult:
    """Outcome of :func:`minimize`.

    Attributes:
      converged: whether some run reached the target.
      evaluations: function evaluations spent, restarts included, up to the
        generation that reached the target (or in all, if none did).
      best: the best fitness found.
      restarts: restarts used.
      f_minus_fopt: ``best - f*`` when the task knows ``f*``, else ``None``.
      runs: every run, in order.
      x: the best solution found.
    """

    converged: bool
    evaluations: int
    best: float
    restarts: int
    f_minus_fopt: float | None = None
    runs: tuple[RunRecord, ...] = ()
    x: np.ndarray | None = None


def default_max_generations(num_dims: int, population_size: int) -> int:
    """pycma's default ``maxiter``: ``100 + ⌊150 (n + 3)^2 / sqrt(λ)⌋``."""
    return 100 + int(150 * (num_dims + 3) ** 2 // population_size**0.5)


def default_tolstagnation(num_dims: int, population_size: int) -> int:
    """pycma's default ``tolstagnation`` in generations: ``⌊100 + 100 n^1.5 / λ⌋``."""
    return int(100 + 100 * num_dims**1.5 / population_size)


def _shift_in(buffer, value):
    """Newest-first history: ``value`` at index 0, the oldest entry dropped."""
    return jnp.roll(buffer, 1).at[0].set(value)


def _window_median(buffer, start, stop):
    """Median of ``buffer[start:stop]`` for traced bounds (entries outside become +inf)."""
    idx = jnp.arange(buffer.shape[0])
    inside = (idx >= start) & (idx < stop)
    ranked = jnp.sort(jnp.where(inside, buffer, jnp.inf))
    count = stop - start
    return 0.5 * (ranked[(count - 1) // 2] + ranked[count // 2])


#: Compiled runs, shared by every :class:`Minimizer` of the same task and settings.
_RUNS: dict[tuple, tuple] = {}


def _rescale_covariance(s):
    """CMA-ES state with ``C``'s eigenvalues centred on 1, the distribution unchanged.

    ``σ²C`` is all that CMA-ES samples from, so ``(σ, C, p_c) -> (σ√k, C/k,
    p_c/√k)`` leaves every generation as it was (``p_σ`` is invariant), with
    ``k = √(λ_max λ_min)`` of the last eigendecomposition. It keeps ``C`` where
    evosax's absolute constants are negligible: ``ask`` adds ``1e-8 I`` to ``C``
    and floors its eigenvalues at ``1e-8``, which once the scale of ``C`` has
    drifted to ~1e-7 caps its condition number far below the 1e6 of an
    ill-conditioned function (BBOB f12 stalled at f - f* ~ 1e-5 in 2-D).
    """
    if not all(hasattr(s, name) for name in ("C", "D", "p_c", "std")) or s.C.ndim != 2:
        return s
    k = jnp.max(s.D) * jnp.min(s.D)
    return s.replace(C=s.C / k, std=s.std * jnp.sqrt(k), p_c=s.p_c / jnp.sqrt(k))


class Minimizer:
    """Restarted runs of one black-box task, each compiled once per population size.

    One run is a ``lax.while_loop`` of engine generations that stops at the
    target, the evaluation budget, ``maxiter`` or one of :class:`StopRules`;
    the starting point, step size, task state (e.g. a BBOB instance) and
    limits are traced arguments, so every run with the same population size
    reuses one compiled loop, on every instance.
    """

    def __init__(self, config: ESConfig, mesh=None, task=None, stop_rules: StopRules = StopRules()):
        """Builds the minimiser.

        Args:
          config: the run configuration (a task to minimise; its
            ``population_size`` is the first run's, its ``sigma_init`` the step size).
          mesh: the device mesh (``None``: every device).
          task: a ready task instead of ``config.task`` (e.g. a
            :class:`~evorl_pop.blackbox.PythonTask`).
          stop_rules: the termination criteria of each run.
        """
        self.config = config
        self.mesh = mesh
        self.task = config.make_task() if task is None else task
        if self.task.maximize:
            raise ValueError(f"minimize needs a task to minimise, not {self.task.name!r}.")
        self.stop_rules = stop_rules

    def _run_fn(self, population_size: int, history: int):
        """The compiled run for ``population_size``, its long history ``history`` long."""
        cache_key = (
            self.config,
            self.mesh,
            self.task,
            self.stop_rules,
            population_size,
            history,
            jax.config.x64_enabled,
        )
        if cache_key in _RUNS:
            return _RUNS[cache_key]
        config = dataclasses.replace(self.config, population_size=population_size)
        es = ES(config, mesh=self.mesh, task=self.task)
        rules, n, lam = self.stop_rules, self.task.num_dims, population_size
        short = int(10 + 30 * n / lam)  # pycma keeps this many generations of the best
        optimal_value = getattr(self.task, "optimal_value", None)
        # CMA_ES_pycma has no absolute constants to keep C away from, and keeps σ and C as
        # pycma does (tolupsigma reads them)
        rescale = not isinstance(es.strategy, CMA_ES_pycma)

        def run(
            key, x0, sigma, task_state, max_generations, budget_generations, target, tolstagnation
        ):
            init_key, run_key = jax.random.split(key)
            state = es.engine.init(init_key, x0).replace(task_state=task_state)
            s = state.strategy_state
            if hasattr(s, "std"):
                state = state.replace(strategy_state=s.replace(std=jnp.asarray(sigma, s.std.dtype)))
            fopt = optimal_value(task_state) if optimal_value else 0.0
            dtype = s.mean.dtype
            empty = jnp.full((short,), jnp.inf, dtype)
            carry = dict(
                state=state,
                gen=jnp.int32(0),
                reason=jnp.int32(0),
                best=jnp.asarray(jnp.inf, dtype),
                best_gen=jnp.int32(0),
                hist=empty,
                hist_size=jnp.int32(0),
                hist_best=jnp.full((history,), jnp.inf, dtype),
                hist_median=jnp.full((history,), jnp.inf, dtype),
                long_size=jnp.int32(0),
                anchor=x0,
                anchor_gen=jnp.int32(0),
            )

            def body(c):
                state, m = es.engine.step(c["state"], jax.random.fold_in(run_key, c["gen"]))
                if rescale:
                    state = state.replace(strategy_state=_rescale_covariance(state.strategy_state))
                gen = c["gen"] + 1
                f_best, f_worst = m["fitness_best"], m["fitness_worst"]
                improved = f_best < c["best"]
                best = jnp.where(improved, f_best, c["best"])
                best_gen = jnp.where(improved, gen, c["best_gen"])
                hist = _shift_in(c["hist"], f_best)
                hist_size = jnp.minimum(c["hist_size"] + 1, short)
                sample = gen % 5 == 0
                hist_best = jnp.where(sample, _shift_in(c["hist_best"], f_best), c["hist_best"])
                hist_median = jnp.where(
                    sample, _shift_in(c["hist_median"], m["fitness_median"]), c["hist_median"]
                )
                long_size = jnp.minimum(c["long_size"] + sample, history)
                filled = jnp.arange(short) < hist_size
                hist_range = jnp.max(jnp.where(filled, hist, -jnp.inf)) - jnp.min(
                    jnp.where(filled, hist, jnp.inf)
                )
                s = state.strategy_state
                checks = [
                    f_best - fopt < target,
                    gen >= budget_generations,
                    gen >= max_generations,
                    (f_worst - f_best < rules.tolfun) & (hist_range < rules.tolfun),
                    (hist_size > 9) & (hist_range < rules.tolfunhist),
                ]
                covariance = hasattr(s, "C") and hasattr(s, "p_c")
                scaling = getattr(s, "scaling", 1.0)  # pycma's sigma_vec
                spread = s.std * scaling * jnp.sqrt(jnp.diag(s.C)) if covariance else None
                checks.append(
                    jnp.all(spread < rules.tolx)
                    & jnp.all(s.std * jnp.abs(scaling * s.p_c) < rules.tolx)
                    if covariance
                    else False
                )
                if hasattr(s, "D"):
                    checks.append(jnp.max(s.D) > rules.tolconditioncov**0.5 * jnp.min(s.D))
                else:
                    checks.append(False)
                if rules.tolstagnation:
                    window = jnp.maximum(tolstagnation / 10, long_size / 10).astype(jnp.int32)
                    older = lambda h: _window_median(h, window, 2 * window)  # noqa: E731
                    newer = lambda h: _window_median(h, 0, window)  # noqa: E731
                    checks.append(
                        (gen > n * (5 + 100 / lam))
                        & (gen - best_gen > tolstagnation / 2)
                        & (long_size > 100)
                        & (2 * window < long_size)
                        & (newer(hist_median) >= older(hist_median))
                        & (newer(hist_best) >= older(hist_best))
                    )
                else:
                    checks.append(False)
                checks.append(
                    s.flat_generations > rules.tolflatfitness
                    if hasattr(s, "flat_generations")
                    else False
                )
                checks.append(jnp.any(spread > rules.tolfacupx * sigma) if covariance else False)
                noeffect = covariance and rules.noeffect
                checks.append(jnp.any(s.mean == s.mean + 0.2 * spread) if noeffect else False)
                if rules.noeffect and hasattr(s, "B") and hasattr(s, "D"):
                    axis = 0.1 * s.std * s.D[gen % n] * scaling * s.B[:, gen % n]
                    checks.append(jnp.all(s.mean == s.mean + axis))
                else:
                    checks.append(False)
                # pycma's tolxstagnation: the mean has not left a small ball for long
                anchor, anchor_gen = c["anchor"], c["anchor_gen"]
                if rules.tolxstagnation is not None:
                    delta, offset, fraction = rules.tolxstagnation
                    threshold = offset + fraction * gen
                    radius = delta * jnp.sqrt(jnp.maximum(1.0, (gen - anchor_gen) / threshold))
                    moved = (gen == 1) | (jnp.linalg.norm(s.mean - anchor) > radius)
                    anchor = jnp.where(moved, s.mean, anchor)
                    anchor_gen = jnp.where(moved, gen, anchor_gen)
                    checks.append(gen - anchor_gen > threshold)
                else:
                    checks.append(False)
                if hasattr(s, "D") and hasattr(s, "std"):
                    checks.append(s.std / jnp.max(s.D) > rules.tolupsigma * sigma)
                else:
                    checks.append(False)
                fired = jnp.stack([jnp.asarray(x) for x in checks])
                reason = jnp.where(jnp.any(fired), jnp.argmax(fired) + 1, 0).astype(jnp.int32)
                return dict(
                    state=state,
                    gen=gen,
                    reason=reason,
                    best=best,
                    best_gen=best_gen,
                    hist=hist,
                    hist_size=hist_size,
                    hist_best=hist_best,
                    hist_median=hist_median,
                    long_size=long_size,
                    anchor=anchor,
                    anchor_gen=anchor_gen,
                )

            c = jax.lax.while_loop(lambda c: c["reason"] == 0, body, carry)
            best_x = es.engine.mean_solution(c["state"])
            if hasattr(c["state"].strategy_state, "best_solution"):
                best_x = c["state"].strategy_state.best_solution
            return c["gen"], c["reason"], c["best"], c["best"] - fopt, best_x

        compiled = (jax.jit(run), es)
        _RUNS[cache_key] = compiled
        return compiled

    def minimize(
        self,
        key: jax.Array,
        target: float = 1e-8,
        max_evaluations: int | None = None,
        restarts: int = 0,
        restart_strategy: str = "ipop",
        max_generations: int | None = None,
        x0=None,
        task_state=None,
    ) -> MinimizeResult:
        """Runs, and restarts, until the target, the budget or the last restart.

        Restarts as in pycma's ``cma.fmin``: IPOP-CMA-ES (Auger & Hansen 2005)
        doubles the population at each restart; BIPOP-CMA-ES (Hansen 2009,
        https://inria.hal.science/inria-00382093) interleaves those large runs
        with small ones, λ = ⌊λ0 (λ_large / λ0)^(U²)⌋ (λ_large: the last large
        run's population) and σ = σ0 · 0.01^U (U uniform in [0, 1]), each
        started whenever the small runs have used fewer evaluations than the
        large ones, and given at most half their total. The first run counts
        as small. Every run starts at ``x0``; like pycma's, every run keeps
        the first run's ``maxiter`` (the small ones capped as above) and
        ``tolstagnation``, the defaults for λ0.

        Args:
          key: the PRNG key.
          target: success once a generation's best ``f - f*`` is below it
            (``f`` itself when the task does not know ``f*``).
          max_evaluations: one budget for all runs together, never exceeded
            (``None``: no limit but ``max_generations`` per run).
          restarts: restarts with a larger population allowed (BIPOP's small
            runs do not count).
          restart_strategy: ``'ipop'`` or ``'bipop'``.
          max_generations: generations per run (``None``: pycma's default,
            :func:`default_max_generations`).
          x0: the starting point (``None``: the task's).
          task_state: the task's state (``None``: the task's own; e.g. another
            BBOB instance's data, without recompiling).

        Returns:
          A :class:`MinimizeResult`.
        """
        if restart_strategy not in RESTART_STRATEGIES:
            raise ValueError(
                f"restart_strategy must be one of {RESTART_STRATEGIES}, got {restart_strategy!r}."
            )
        if restarts < 0 or (max_evaluations is not None and max_evaluations < 1):
            raise ValueError(
                f"need restarts >= 0 and max_evaluations >= 1, got {restarts}, {max_evaluations}."
            )
        config, task, n = self.config, self.task, self.task.num_dims
        lam0 = config.population_size
        sigma0 = config.sigma_init
        if sigma0 is None:
            sigma0 = float(make_strategy(config.strategy, lam0, n)[1].std_init)
        x0_key, runs_key = jax.random.split(key)
        x0 = task.init_solution(x0_key) if x0 is None else x0
        x0 = jnp.asarray(x0, float_dtype()).reshape(n)
        task_state = task.init_state() if task_state is None else task_state
        budget = max_evaluations if max_evaluations is not None else 2**62
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
        # as in pycma, whose options are evaluated once, for the first run's population
        maxiter0 = max_generations or default_max_generations(n, lam0)
        tolstagnation = default_tolstagnation(n, lam0)

        runs: list[RunRecord] = []
        used, small, large, runs_with_small = 0, [], [], 0
        best, best_precision, converged, spent = np.inf, np.inf, False, None
        best_x = np.asarray(x0)
        for irun in range(2**31):
            sigma, regime = sigma0, "first"
            lam, maxiter = lam0, maxiter0
            if irun > 0 and restart_strategy == "bipop" and sum(small) < max(1, sum(large)):
                regime, runs_with_small = "small", runs_with_small + 1
                sigma = sigma0 * 0.01 ** rng.uniform()
                lam = int(lam0 * (2.0 ** (irun - runs_with_small)) ** (rng.uniform() ** 2))
                maxiter = min(maxiter0, int(np.ceil(0.5 * sum(large) / lam)))
            elif irun > 0:
                regime = "large"
                lam = lam0 * 2 ** (irun - runs_with_small)
            budget_generations = (budget - used) // lam
            if budget_generations < 1:
                break
            # static per population size and call: restarts and instances share the compiled run
            longest = min(maxiter0, budget // lam)
            history = min(20_000, longest // 5 + 1)
            run, _ = self._run_fn(lam, history)
            with objective_errors():
                gens, reason, run_best, precision, run_x = jax.device_get(
                    run(
                        jax.random.fold_in(runs_key, irun),
                        x0,
                        sigma,
                        task_state,
                        maxiter,
                        min(budget_generations, 2**31 - 1),
                        target,
                        tolstagnation,
                    )
                )
            evaluations = int(gens) * lam
            used += evaluations
            stop = STOP_REASONS[int(reason)]
            runs.append(
                RunRecord(lam, float(sigma), regime, maxiter, evaluations, stop, float(run_best))
            )
            (large if regime == "large" else small).append(evaluations)
            if float(run_best) < best:
                best, best_x = float(run_best), np.asarray(run_x)
            best_precision = min(best_precision, float(precision))
            if stop == "target":
                converged, spent = True, used
                break
            if irun + 1 - runs_with_small > restarts:
                break
        has_fopt = hasattr(task, "optimal_value")
        return MinimizeResult(
            converged=converged,
            evaluations=used if spent is None else spent,
            best=best,
            restarts=max(len(runs) - 1, 0),
            f_minus_fopt=best_precision if has_fopt else None,
            runs=tuple(runs),
            x=best_x,
        )


def minimize(
    config: ESConfig,
    key: jax.Array,
    target: float = 1e-8,
    max_evaluations: int | None = None,
    restarts: int = 0,
    restart_strategy: str = "ipop",
    max_generations: int | None = None,
    x0=None,
    mesh=None,
    task=None,
    stop_rules: StopRules = StopRules(),
) -> MinimizeResult:
    """Minimises a black-box task to ``target``, with IPOP or BIPOP restarts.

    Shorthand for ``Minimizer(config, mesh, task, stop_rules).minimize(...)``;
    reuse one :class:`Minimizer` to run many instances or seeds without
    recompiling.

    Args:
      config: the run configuration (its population is the first run's).
      key: the PRNG key.
      target: success once a generation's best ``f - f*`` is below it.
      max_evaluations: one budget for all runs, never exceeded (``None``: none).
      restarts: restarts with a larger population allowed.
      restart_strategy: ``'ipop'`` or ``'bipop'``.
      max_generations: generations per run (``None``: pycma's default).
      x0: the starting point of every run (``None``: the task's).
      mesh: the device mesh.
      task: a ready task instead of ``config.task``.
      stop_rules: the termination criteria of each run.

    Returns:
      A :class:`MinimizeResult`.
    """
    return Minimizer(config, mesh, task, stop_rules).minimize(
        key,
        target=target,
        max_evaluations=max_evaluations,
        restarts=restarts,
        restart_strategy=restart_strategy,
        max_generations=max_generations,
        x0=x0,
    )
