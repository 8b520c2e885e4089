"""OpenAI-ES with its noise read from a shared table (Salimans et al. 2017, sec. 2.1).

Drawing fresh standard normals for every candidate costs, on a CPU, about as
much as a small network's rollout step for the whole population: 180k
normals (1,024 candidates × 353 parameters, mirrored) take over a millisecond.
Salimans et al. draw one large table of normals once; candidate ``i`` reads
the ``num_dims`` consecutive entries from a random offset ``o_i``:

    z_i = table[o_i : o_i + num_dims],   o_i ~ U{0, ..., table_size - num_dims}

Each generation then draws only one offset per candidate (per antithetic
pair). The update is evosax's :class:`~evosax.algorithms.Open_ES` ``tell``,
unchanged: ``grad = Σ_i f_i (x_i - m) / σ / (λ σ)``.

The table is a function of ``table_seed`` alone, rebuilt identically in
every process, so a run resumes exactly and every device reads the same
noise whatever the device count. It lives on the strategy (a constant of the
compiled generation), not in its state: checkpoints do not grow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from evosax.algorithms import Open_ES

from evorl_pop.blackbox import float_dtype

#: 2^22 normals (16 MiB in float32): about 4 million distinct windows for
#: networks of up to a few hundred thousand parameters.
DEFAULT_TABLE_SIZE = 1 << 22


class NoiseTableOpen_ES(Open_ES):
    """evosax's ``Open_ES`` whose candidates read their noise from a shared table."""

    def __init__(
        self,
        population_size: int,
        solution,
        table_size: int = DEFAULT_TABLE_SIZE,
        table_seed: int = 0,
        **kwargs,
    ):
        """Builds the strategy and its table.

        Args:
          population_size: candidates per generation (even).
          solution: a template solution (its flattened size is ``num_dims``).
          table_size: normals in the table; at least ``num_dims`` (ValueError
            below). Two candidates share a direction only when they draw the
            same offset, so it should exceed ``num_dims`` many times over.
          table_seed: the table's PRNG seed.
          **kwargs: ``Open_ES``'s own arguments (``optimizer``,
            ``std_schedule``, ``use_antithetic_sampling``, ...).
        """
        super().__init__(population_size, solution, **kwargs)
        if table_size < self.num_dims:
            raise ValueError(
                f"table_size={table_size} is smaller than the {self.num_dims} parameters a "
                f"candidate reads from it; pass table_size >= {self.num_dims} (the default "
                f"{DEFAULT_TABLE_SIZE} or more)."
            )
        self.table_size = table_size
        self.table_seed = table_seed
        self.noise_table = jax.random.normal(
            jax.random.key(table_seed), (table_size,), float_dtype()
        )

    @property
    def num_directions(self) -> int:
        """Distinct directions per generation: one per antithetic pair, or per candidate."""
        n = self.population_size
        return n // 2 if self.use_antithetic_sampling else n

    def directions(self, key: jax.Array, rows: jax.Array) -> jax.Array:
        """The noise directions ``rows`` (indices below :attr:`num_directions`) of one generation.

        Args:
          key: the generation's ask key.
          rows: integer indices of the directions to read.

        Returns:
          ``(len(rows), num_dims)`` standard-normal rows of the table.
        """
        highest = self.table_size - self.num_dims
        offsets = jax.random.randint(key, (self.num_directions,), 0, highest + 1)

        def read(offset):
            return jax.lax.dynamic_slice(self.noise_table, (offset,), (self.num_dims,))

        return jax.vmap(read)(offsets[rows])

    def _ask(self, key, state, params):
        z = self.directions(key, jnp.arange(self.num_directions))
        if self.use_antithetic_sampling:
            z = jnp.concatenate([z, -z])
        return state.mean + state.std * z, state
