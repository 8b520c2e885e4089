"""OpenAI-ES at scale: a shared noise table, and a generation that sends only scores.

Salimans et al. (2017), "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning". Two of its devices, on evosax's ``Open_ES``:

* :class:`NoiseTableOpen_ES` (sec. 2.1): candidates read their noise from one
  shared table of normals at random offsets instead of drawing it.
* :class:`LowCommunication` (sec. 2.1, "communicating only scalars"): each
  device draws the noise of its own candidates from their global indices, so
  no device ever holds the ``pop x dims`` matrix; only scores and one
  ``psum`` of a ``dims``-vector cross devices::

      ids ─► each device: noise(ids) ─► candidates ─► scores (sharded)
          ─► summarize: extremes, means, all_gather of the scores
          ─► each device: shaped scores @ noise(its ids), drawn again in blocks
          ─► psum ─► Open_ES's gradient estimate ─► optax step (replicated)

  Its update equals evosax's ``Open_ES.tell`` on the same noise. A strategy
  that :class:`~evorl_pop.core.interfaces.ReadsDirections` (the noise table)
  has its rows read from there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from evosax.algorithms import Open_ES
from jax.sharding import PartitionSpec as P

from evorl_pop.base import float_dtype
from evorl_pop.core.engine import POP, Engine, Generation, State, summarize
from evorl_pop.core.interfaces import ReadsDirections
from evorl_pop.distributed import POP_AXIS_NAME, psum

#: The low-communication path holds at most this much noise at once per device.
NOISE_BLOCK_BYTES = 64 << 20

# --- OpenAI-ES with a noise table ---------------------------------------------------

#: 2^22 normals (16 MiB in float32): about 4 million distinct windows for
#: networks of up to a few hundred thousand parameters.
DEFAULT_TABLE_SIZE = 1 << 22


class NoiseTableOpen_ES(Open_ES):
    """evosax's ``Open_ES`` whose candidates read their noise from a shared table.

    Drawing fresh standard normals for every candidate costs, on a CPU, about
    as much as a small network's rollout step for the whole population.
    Salimans et al. (2017) draw one large table of normals once; candidate
    ``i`` reads the ``num_dims`` consecutive entries from a random offset:
    ``z_i = table[o_i : o_i + num_dims]``, ``o_i ~ U{0, ..., table_size - num_dims}``.
    The update is evosax's ``Open_ES.tell``, unchanged. The table is a
    function of ``table_seed`` alone, rebuilt identically in every process,
    so a run resumes exactly and every device reads the same noise; it lives
    on the strategy (a constant of the compiled generation), not in its
    state, so checkpoints do not grow.
    """

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


# --- the low-communication generation ----------------------------------------------


class LowCommunication:
    """OpenES's generation with each device drawing its own candidates' noise.

    Args:
      engine: the engine whose strategy (evosax's ``Open_ES`` or
        :class:`NoiseTableOpen_ES`), task, mesh and population it runs.

    Raises:
      ValueError: another strategy, or an engine with a learner.
    """

    def __init__(self, engine: Engine):
        if not isinstance(engine.strategy, Open_ES) or engine.learner is not None:
            raise ValueError(
                "low_communication=True needs evosax's Open_ES (the Gaussian family whose "
                "noise each device can draw itself) and no learner; got "
                f"{type(engine.strategy).__name__}."
            )
        self.engine = engine
        self.strategy = engine.strategy
        self.population_size = engine.population_size
        self.padded_size = engine.padded_size
        local = engine.padded_size // engine.num_devices
        per_row = float_dtype().itemsize * engine.task.num_dims
        cap = max(1, min(local, NOISE_BLOCK_BYTES // per_row))
        #: Candidates whose noise a device holds at once: a divisor of its slice.
        self.noise_block = next(d for d in range(cap, 0, -1) if local % d == 0)

    def _noise(self, key, index):
        """The standard-normal direction of global candidate ``index``."""
        es = self.strategy
        if es.use_antithetic_sampling:
            half = self.population_size // 2
            sign = jnp.where(index < half, 1.0, -1.0)
            return sign * self._direction(key, index % half)
        return self._direction(key, index)

    def _direction(self, key, row):
        if isinstance(self.strategy, ReadsDirections):  # the rows its own ask reads
            return self.strategy.directions(key, row[None])[0]
        return jax.random.normal(jax.random.fold_in(key, row), (self.strategy.num_dims,))

    def noise_matrix(self, key):
        """All candidates' noise, as the full-matrix reference would draw it."""
        return jax.vmap(lambda i: self._noise(key, i))(jnp.arange(self.population_size))

    def generation(self, state: State, key: jax.Array) -> Generation:
        """:meth:`Engine.generation <evorl_pop.core.engine.Engine.generation>` on this path,
        with the same keys; no learner, no metrics of its own."""
        k_ask, k_eval, _, _ = jax.random.split(key, 4)
        engine = self.engine
        es = self.strategy
        params = engine.params
        s = state.strategy_state
        task_state = state.task_state
        n = self.population_size
        block = self.noise_block
        ids = jnp.arange(self.padded_size, dtype=jnp.int32)
        mask = ids < n

        def noise(ids_c):
            return jax.vmap(lambda i: self._noise(k_ask, i))(ids_c)

        def evaluate_local(local_ids):
            def evaluate_block(ids_c):
                x = s.mean + s.std * noise(ids_c)
                keys = jax.vmap(lambda i: jax.random.fold_in(k_eval, i))(ids_c)
                return jax.vmap(engine.task.evaluate, in_axes=(0, 0, None))(x, keys, task_state)

            out = jax.lax.map(evaluate_block, local_ids.reshape(-1, block))
            return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), out)

        # as in `evaluate`: no collectives here, so no replication checks
        scores, info = jax.shard_map(
            evaluate_local, mesh=engine.mesh, in_specs=POP, out_specs=POP, check_vma=False
        )(ids)

        def update_local(scores, info, local_ids, local_mask):
            summary = summarize(scores, info, local_mask, engine.task.maximize)
            fitness = summary.fitness(n)
            shaped = es.fitness_shaping_fn(None, fitness, s, params)
            shaped = jnp.concatenate([shaped, jnp.zeros(self.padded_size - n)])

            def accumulate(total, ids_c):  # the noise is drawn again, block by block
                return total + shaped[ids_c] @ noise(ids_c), None

            zeros = jax.lax.pcast(jnp.zeros(es.num_dims), POP_AXIS_NAME, to="varying")
            partial_sum, _ = jax.lax.scan(accumulate, zeros, local_ids.reshape(-1, block))
            grad = psum(partial_sum, POP_AXIS_NAME) / (n * s.std)  # Open_ES's estimate
            updates, opt_state = es.optimizer.update(grad, s.opt_state, s.mean)
            best = jnp.argmin(fitness)
            better = fitness[best] < s.best_fitness
            best_candidate = s.mean + s.std * self._noise(k_ask, best)
            new = s.replace(
                mean=optax.apply_updates(s.mean, updates),
                std=es.std_schedule(s.generation_counter),
                opt_state=opt_state,
                best_solution=jnp.where(better, best_candidate, s.best_solution),
                best_fitness=jnp.where(better, fitness[best], s.best_fitness),
                generation_counter=s.generation_counter + 1,
            )
            return new, summary

        strategy_state, summary = jax.shard_map(
            update_local, mesh=engine.mesh, in_specs=(POP, POP, POP, POP), out_specs=P()
        )(scores, info, ids, mask)
        best = s.mean + s.std * self._noise(k_ask, summary.best_index(n)[0])
        return Generation(strategy_state, None, summary, {}, best)


class LowCommunicationEngine(Engine):
    """An :class:`~evorl_pop.core.engine.Engine` whose generations take the
    :class:`LowCommunication` path (same arguments, ``learner`` excepted): its
    :meth:`~evorl_pop.core.engine.Engine.generation` hook is replaced."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.low_communication = LowCommunication(self)

    @property
    def noise_block(self) -> int:
        return self.low_communication.noise_block

    def noise_matrix(self, key: jax.Array) -> jax.Array:
        return self.low_communication.noise_matrix(key)

    def generation(self, state: State, key: jax.Array) -> Generation:
        return self.low_communication.generation(state, key)
