"""An on-device counter exact past 2**31 without 64-bit JAX.

Cumulative totals (environment steps, episodes, evaluations) outgrow int32
within seconds on an accelerator, and enabling ``jax_enable_x64`` would change
every other dtype. A :class:`Count` keeps the total as two uint32 words, so it
is exact up to 2**64 while each generation's own count stays int32.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Count:
    """A non-negative integer as two uint32 words: ``hi * 2**32 + lo``."""

    hi: jax.Array  # uint32, shape=()
    lo: jax.Array  # uint32, shape=()

    @classmethod
    def zero(cls) -> Count:
        """A count of 0."""
        return cls(hi=jnp.uint32(0), lo=jnp.uint32(0))

    def add(self, n: jax.Array | int) -> Count:
        """The count plus ``n``.

        Args:
          n: a non-negative increment below 2**32 (e.g. one generation's int32
            step count).

        Returns:
          A new :class:`Count`; the low word wraps and carries into the high one.
        """
        lo = self.lo + jnp.asarray(n).astype(jnp.uint32)
        carry = (lo < self.lo).astype(jnp.uint32)  # the sum wrapped past 2**32
        return Count(hi=self.hi + carry, lo=lo)

    def __int__(self) -> int:
        return (int(self.hi) << 32) | int(self.lo)
