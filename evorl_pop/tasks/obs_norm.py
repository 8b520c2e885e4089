"""Running observation normalisation: statistics summed over a population's episodes.

Each evaluation sums the raw observations its episodes saw (:class:`ObsMoments`);
the sums of the whole population are added across devices (``psum``) and merged
into the running mean and variance (:class:`ObsNorm`) that every candidate
of the next generation normalises its observations with.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class ObsNorm:
    """Running mean / variance of observations (Chan et al. parallel merge)."""

    count: jax.Array  # shape=(), float32: observations seen
    mean: jax.Array  # shape=obs_shape
    var: jax.Array  # shape=obs_shape

    @classmethod
    def create(cls, obs_shape) -> ObsNorm:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.ones(obs_shape))

    def normalize(self, obs, clip: float = 5.0):
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)

    def merge(self, moments: ObsMoments) -> ObsNorm:
        """Folds in a batch's moments (sums that may come from a ``psum``)."""
        n = moments.count
        safe_n = jnp.maximum(n, 1.0)
        batch_mean = moments.total / safe_n
        batch_var = jnp.maximum(moments.total_sq / safe_n - batch_mean**2, 0.0)
        total = self.count + n
        w = n / jnp.maximum(total, 1.0)
        delta = batch_mean - self.mean
        mean = self.mean + w * delta
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * w
        var = jnp.where(total > 0, m2 / jnp.maximum(total, 1.0), self.var)
        keep = n > 0
        return ObsNorm(
            count=total,
            mean=jnp.where(keep, mean, self.mean),
            var=jnp.where(keep, var, self.var),
        )


@flax.struct.dataclass
class ObsMoments:
    """Sums over observations; add them (``psum``) and merge into :class:`ObsNorm`."""

    count: jax.Array
    total: jax.Array
    total_sq: jax.Array

    @classmethod
    def zeros(cls, obs_shape) -> ObsMoments:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.zeros(obs_shape))
