"""pycma's CMA-ES in evosax: evosax's update with pycma's constants and rules.

Hansen (2016), "The CMA Evolution Strategy: A Tutorial", with the defaults and
rules of pycma (``cma`` 4.x, ``CMA_active=True``): :class:`CMA_ES_pycma` keeps
evosax's update (its active covariance update included) and takes pycma's
learning rates, step-size damping, stall indicator, tie-breaking and
conditioning alleviation, so that a run takes pycma's path and its
evaluation counts (``benchmarks/bench_cmaes.py``). Every ES run reaches it by
the strategy name ``CMA_ES_pycma``; :mod:`evorl_pop.algorithms.restarts`
adds pycma's stop rules and IPOP / BIPOP restarts.
"""

from __future__ import annotations

import dataclasses

import evosax.algorithms
import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from evosax.algorithms.distribution_based import cma_es
from flax import struct

from evorl_pop import registry


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
        n = self.num_dims
        lam = self.population_size
        mu = self.num_elites
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
        # pycma bounds σ by no constant
        return params.replace(
            weights=weights,
            c_1=c_1,
            c_mu=c_mu,
            c_std=c_std,
            d_std=d_std,
            chi_n=chi_n,
            std_max=jnp.inf,
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


registry.register_strategy("CMA_ES_pycma", CMA_ES_pycma)
