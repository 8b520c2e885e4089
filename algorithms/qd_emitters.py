"""MAP-Elites' emitters: how a generation's candidates come from the archive.

Every emitter has the one generation shape of MAP-Elites
(:class:`~evorl_pop.algorithms.mapelites.MapElites`)::

    ask:      (archive, emitter state) ─► candidates (and what tell needs of them)
    evaluate: the one evaluator, sharded P('POP')
    tell:     (archive before and after the insertion, the candidates' fitness
              and descriptors) ─► the emitter's new state

* ``isoline`` (:class:`IsolineEmitter`, the default): isoline variation of two parents
  drawn uniformly over the filled cells (Vassiliades & Mouret 2018); no state.
* ``es`` (:class:`ESEmitter`, ME-ES, Colas et al. 2020): an OpenES (evosax's
  ``Open_ES``, built by :func:`~evorl_pop.algorithms.es.make_strategy`) whose centre is
  an elite drawn uniformly over the filled cells, moved for ``es.period`` generations,
  then started again from a newly drawn elite. Its candidates are rewarded by their
  fitness (``es.reward: fitness``, ME-ES's exploitation) or by their novelty
  (``novelty``: the mean distance of the descriptor to its ``es.novelty_neighbours``
  nearest elites, ME-ES's exploration). Every candidate is offered to the archive.
* ``cma_me`` (:class:`CMAMEEmitter`, CMA-ME's improvement emitter, Fontaine et al.
  2020): a CMA-ES (evosax's ``CMA_ES``) whose candidates are ranked by how they
  improve the archive (:func:`improvement_ranks`: new cells first, by fitness, then
  improved cells, by the improvement, then the rest); evosax's recombination weights
  follow that ranking. When no candidate of a generation improves the archive, it
  starts again from an elite drawn uniformly over the filled cells.
* ``pga_me`` (:class:`~evorl_pop.algorithms.pgame.PGAMEEmitter`, PGA-ME, Nilsson &
  Cully 2021): part of the batch from isoline variation, the rest from TD3
  policy-gradient steps on elites and the TD3 greedy actor; brax tasks only.

Each emitter registers itself here (:func:`evorl_pop.registry.register_emitter`) with
its settings dataclass (:class:`EsEmitterConfig`, :class:`CmaEmitterConfig`), which
MAP-Elites' config holds in the field of the emitter's name (``--set es.sigma=0.1``).

The emitters' states are small (the CMA-ES's covariance is ``num_dims^2``) and
replicated: every device computes the same update from the same replicated batch,
so the run does not depend on the device count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.algorithms.es import make_strategy
from evorl_pop.base import ConfigError, check_config

#: What an ES emitter's candidates are rewarded by.
ES_REWARDS = ("fitness", "novelty")


def prefixed_checks(prefix: str, settings, **checks) -> None:
    """:func:`~evorl_pop.base.check_config` of an emitter's ``settings`` (``choices``,
    ``least``, ``positive``, ``widths``), its messages naming each setting where a config
    holds it (``es.period``)."""
    try:
        check_config(settings, **checks)
    except ConfigError as err:
        raise ConfigError(f"{prefix}{err}") from None


@dataclasses.dataclass(frozen=True)
class EsEmitterConfig:
    """ME-ES's settings (``emitter: es``; a MAP-Elites config's ``es``).

    Attributes:
      sigma: the OpenES's noise width.
      learning_rate: the OpenES's Adam learning rate.
      period: generations from one centre before a new elite is drawn.
      reward: ``'fitness'`` or ``'novelty'`` (the mean distance of the descriptor to its
        ``novelty_neighbours`` nearest elites).
      novelty_neighbours: with ``reward='novelty'``: the nearest elites.
    """

    sigma: float = 0.05
    learning_rate: float = 0.05
    period: int = 10
    reward: str = "fitness"
    novelty_neighbours: int = 10

    def validate(self, config) -> None:
        """Raises a ConfigError naming a setting that cannot run with MAP-Elites' ``config``."""
        checks = {"choices": {"reward": ES_REWARDS}}
        least = {"period": 1, "novelty_neighbours": 1}
        prefixed_checks("es.", self, **checks, least=least, positive=("sigma", "learning_rate"))
        if config.population_size % 2 or config.population_size < 2:
            raise ConfigError(
                f"population_size must be even and at least 2 with emitter=es (OpenES draws "
                f"antithetic pairs), got {config.population_size}."
            )


@dataclasses.dataclass(frozen=True)
class CmaEmitterConfig:
    """CMA-ME's settings (``emitter: cma_me``; a MAP-Elites config's ``cma_me``).

    Attributes:
      sigma: the CMA-ES's initial step size.
    """

    sigma: float = 0.05

    def validate(self, config) -> None:
        """Raises a ConfigError naming a setting that cannot run with MAP-Elites' ``config``."""
        prefixed_checks("cma_me.", self, positive=("sigma",))
        if config.population_size < 2:
            raise ConfigError("population_size must be at least 2 with emitter=cma_me.")


def isoline_variation(key, x, y, iso_sigma: float, line_sigma: float, bounds=None):
    """Isoline variation (Vassiliades & Mouret 2018) of parents ``x`` and ``y`` (rows):
    ``x + iso_sigma * N(0, I) + line_sigma * N(0, 1) * (y - x)``, one normal per row for
    the line, clipped to ``bounds = (low, high)`` unless ``None``."""
    k_iso, k_line = jax.random.split(key)
    iso = jax.random.normal(k_iso, x.shape, x.dtype) * iso_sigma
    line = jax.random.normal(k_line, x.shape[:1] + (1,) * (x.ndim - 1), x.dtype) * line_sigma
    children = x + iso + line * (y - x)
    return children if bounds is None else jnp.clip(children, *bounds)


def improvement_ranks(quality, incumbent, valid):
    """CMA-ME's ranking of a batch by archive improvement (Fontaine et al. 2020).

    Args:
      quality: ``(batch,)`` the candidates' fitness (maximised).
      incumbent: ``(batch,)`` the fitness of the elite of each candidate's cell in the
        archive before the batch (``-inf``: the cell is empty).
      valid: ``(batch,)`` the candidates the archive can take (finite fitness and
        descriptor).

    Returns:
      ``(ranks, improving)``: each candidate's rank, ``0`` the best: first the
        candidates that fill an empty cell, by fitness (highest first), then those that
        beat their cell's elite, by the improvement ``quality - incumbent``, then the
        others by that (negative) difference, then the invalid ones; ties keep the batch
        order. ``improving`` counts the first two groups.
    """
    new = valid & ~jnp.isfinite(incumbent)
    improved = valid & ~new & (quality > incumbent)
    tier = jnp.where(new, 3, jnp.where(improved, 2, jnp.where(valid, 1, 0)))
    gain = jnp.where(new, quality, quality - jnp.where(new, 0.0, incumbent))
    value = jnp.where(valid, gain, 0.0)
    order = jnp.lexsort((-value, -tier))  # the last key sorts first; stable
    n = quality.shape[0]
    ranks = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    return ranks, jnp.sum(new | improved, dtype=jnp.int32)


def _valid(quality, descriptors):
    return jnp.isfinite(quality) & jnp.all(jnp.isfinite(descriptors), axis=-1)


def _select(flag, new, old):
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)


class IsolineEmitter:
    """Isoline variation of parents drawn uniformly over the archive's filled cells."""

    collect = False  # its evaluations need no transitions

    def __init__(self, archive, task, config, settings=None):
        del settings  # isoline variation's widths are the config's iso_sigma, line_sigma
        self.archive = archive
        self.task = task
        self.config = config

    def init(self, archive_state, key):
        del archive_state, key
        return ()

    def ask(self, archive_state, emitter_state, key):
        k_parents, k_vary = jax.random.split(key)
        count = 2 * self.config.population_size
        parents = self.archive.sample(archive_state, k_parents, count)
        x, y = jnp.split(parents, 2)
        c = self.config
        bounds = self.task.genotype_bounds
        return isoline_variation(k_vary, x, y, c.iso_sigma, c.line_sigma, bounds), None

    def tell(self, before, after, emitter_state, asked, quality, descriptors, key):
        return emitter_state, {}


@flax.struct.dataclass
class StrategyEmitterState:
    """An ES or CMA-ME emitter's evosax state and its generations since its centre was drawn."""

    strategy: Any
    age: jax.Array  # int32
    restarts: jax.Array  # int32, centres drawn after the first


class _StrategyEmitter:
    """What the ES and CMA-ME emitters share: an evosax strategy, started at an elite."""

    collect = False

    def __init__(self, archive, task, strategy, params):
        self.archive = archive
        self.task = task
        self.strategy = strategy
        self.params = params

    def _replicated(self, fn):
        """``fn`` computed whole on every device inside ``shard_map``: the partitioner
        could otherwise split its sums across the devices, which rounds differently on
        another device count."""
        return jax.shard_map(fn, mesh=self.archive.mesh, in_specs=P(), out_specs=P())

    def _start(self, archive_state, key):
        k_centre, k_init = jax.random.split(key)
        centre = self.archive.sample(archive_state, k_centre, 1)[0]
        return self._replicated(self.strategy.init)(k_init, centre, self.params)

    def init(self, archive_state, key):
        zero = jnp.zeros((), jnp.int32)
        return StrategyEmitterState(self._start(archive_state, key), zero, zero)

    def ask(self, archive_state, emitter_state, key):
        del archive_state
        ask = self._replicated(self.strategy.ask)
        raw, strategy = ask(key, emitter_state.strategy, self.params)
        bounds = self.task.genotype_bounds
        population = raw if bounds is None else jnp.clip(raw, *bounds)
        return population, (strategy, raw)

    def _tell(self, after, emitter_state, asked, loss, restart, key):
        """The strategy told ``loss`` (minimised), started again at an elite of ``after``
        where ``restart``."""
        strategy, raw = asked
        k_tell, k_start = jax.random.split(key)
        tell = self._replicated(self.strategy.tell)
        strategy, _ = tell(k_tell, raw, loss, strategy, self.params)
        fresh = self._start(after, k_start)
        new = StrategyEmitterState(
            _select(restart, fresh, strategy),
            jnp.where(restart, 0, emitter_state.age + 1),
            emitter_state.restarts + restart.astype(jnp.int32),
        )
        return new, {"emitter_restarts": new.restarts}


class ESEmitter(_StrategyEmitter):
    """ME-ES: an OpenES centred on an elite, rewarded by fitness or novelty."""

    def __init__(self, archive, task, config, settings: EsEmitterConfig):
        strategy, params = make_strategy(
            "Open_ES",
            config.population_size,
            task.num_dims,
            learning_rate=settings.learning_rate,
            sigma_init=settings.sigma,
            noise="normal",
        )
        super().__init__(archive, task, strategy, params)
        self.config = config
        self.settings = settings

    def tell(self, before, after, emitter_state, asked, quality, descriptors, key):
        del before
        valid = _valid(quality, descriptors)
        if self.settings.reward == "novelty":
            safe = jnp.where(valid[:, None], descriptors, 0.0)
            reward = self.archive.novelty(after, safe, self.settings.novelty_neighbours)
        else:
            reward = quality
        loss = jnp.where(valid, -reward, jnp.inf)  # evosax minimises
        restart = emitter_state.age + 1 >= self.settings.period
        return self._tell(after, emitter_state, asked, loss, restart, key)


class CMAMEEmitter(_StrategyEmitter):
    """CMA-ME's improvement emitter: a CMA-ES ranked by archive improvement."""

    def __init__(self, archive, task, config, settings: CmaEmitterConfig):
        strategy, params = make_strategy(
            "CMA_ES", config.population_size, task.num_dims, sigma_init=settings.sigma
        )
        super().__init__(archive, task, strategy, params)
        self.config = config
        self.settings = settings

    def tell(self, before, after, emitter_state, asked, quality, descriptors, key):
        valid = _valid(quality, descriptors)
        incumbent = self.archive.fitness_at(before, self.archive.cells(before, descriptors))
        ranks, improving = improvement_ranks(quality, incumbent, valid)
        restart = improving == 0
        new, metrics = self._tell(
            after, emitter_state, asked, ranks.astype(quality.dtype), restart, key
        )
        return new, {**metrics, "emitter_improving": improving}


registry.register_emitter(
    "isoline", IsolineEmitter, None, "isoline variation of parents drawn over the archive"
)
registry.register_emitter(
    "es", ESEmitter, EsEmitterConfig, "ME-ES: an OpenES centred on an elite, by fitness or novelty"
)
registry.register_emitter(
    "cma_me", CMAMEEmitter, CmaEmitterConfig, "CMA-ME: a CMA-ES ranked by archive improvement"
)
