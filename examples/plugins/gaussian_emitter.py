"""A MAP-Elites emitter of one's own: Gaussian mutation of elites.

Each candidate is an elite drawn uniformly over the archive's filled cells, plus
``sigma * N(0, I)``, clipped to the task's genotype bounds. The module registers the
emitter ``gaussian`` with its settings when it is imported::

    PYTHONPATH=examples/plugins evorl-pop train -a mapelites --plugin gaussian_emitter \\
        --set emitter=gaussian --set emitter_settings.sigma=0.05 --generations 10

The run folder's ``config.yaml`` records the plug-in, so ``evorl-pop resume`` finds the
emitter again (the module must still be importable).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import ConfigError


@dataclasses.dataclass(frozen=True)
class GaussianEmitterConfig:
    """The Gaussian emitter's settings (``--set emitter_settings.NAME=VALUE``).

    Attributes:
      sigma: the mutation's width, in genotype units.
    """

    sigma: float = 0.02

    def validate(self, config) -> None:
        """Raises a ConfigError for settings that cannot run with MAP-Elites' ``config``."""
        del config  # any population size will do
        if not self.sigma > 0:
            raise ConfigError(f"emitter_settings.sigma must be > 0, got {self.sigma}.")


class GaussianEmitter:
    """Gaussian mutation of elites drawn uniformly over the archive."""

    collect = False  # black-box evaluations: no episodes to observe

    def __init__(self, archive, task, config, settings: GaussianEmitterConfig):
        self.archive = archive
        self.task = task
        self.population_size = config.population_size
        self.sigma = settings.sigma

    def init(self, archive_state, key):
        """No state: every generation draws afresh from the archive."""
        del archive_state, key
        return ()

    def ask(self, archive_state, emitter_state, key):
        """``population_size`` mutated elites; nothing for ``tell``."""
        del emitter_state
        k_parents, k_noise = jax.random.split(key)
        parents = self.archive.sample(archive_state, k_parents, self.population_size)
        noise = jax.random.normal(k_noise, parents.shape, parents.dtype)
        children = parents + self.sigma * noise
        bounds = self.task.genotype_bounds
        return (children if bounds is None else jnp.clip(children, *bounds)), None

    def tell(self, before, after, emitter_state, asked, quality, descriptors, key):
        """Nothing to learn; one metric: the share of the batch with a valid descriptor."""
        del before, after, asked, key
        valid = jnp.isfinite(quality) & jnp.all(jnp.isfinite(descriptors), axis=-1)
        return emitter_state, {"emitter_valid": jnp.mean(valid.astype(jnp.float32))}


registry.register_emitter(
    "gaussian", GaussianEmitter, GaussianEmitterConfig, "Gaussian mutation of elites"
)
