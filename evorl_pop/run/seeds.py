"""Many seeds of one algorithm in one compiled program (``evorl-pop train --seeds N``).

A run of ``seeds=N`` from ``seed=s0`` holds the replicas of seeds ``s0 .. s0+N-1`` of any
registered algorithm, stacked on a leading seed axis and stepped by one ``vmap`` of the
algorithm's own step, inside the same compiled chunks as a single run::

    seed s ─► key(s) ─► split ─► (init key_s, run key_s)   as a single run of seed s
    init:  vmap(algorithm.init)(init keys)                 every seed's state, stacked
    step:  vmap(algorithm.step)(states, fold_in(run key_s, g) for each s)

so seed ``s`` of a multi-seed run computes what ``--seed s`` alone computes (to float
tolerance: a batched program may round differently). The population of every seed stays
sharded on the ``POP`` axis of the mesh, as in a single run; the seed axis is vectorised
inside each device.

The metrics of a generation have one value per seed: ``metrics.csv`` gets one row per
generation and seed, with a ``seed`` column.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


def run_keys(seed: int, seeds: int = 1) -> tuple[jax.Array, jax.Array]:
    """``(init key, run key)`` of a run of ``seed`` (one seed), or of each of ``seeds``
    seeds from ``seed`` (stacked, shape ``(seeds,)``): each seed's keys as its single run's."""
    keys = [jax.random.split(jax.random.key(seed + i)) for i in range(seeds)]
    if seeds == 1:
        return keys[0][0], keys[0][1]
    return jnp.stack([k[0] for k in keys]), jnp.stack([k[1] for k in keys])


@flax.struct.dataclass
class SeedsState:
    """Every seed's state of the algorithm, stacked on a leading axis."""

    generation: jax.Array  # int32: generations completed, the same for every seed
    seeds: Any  # the algorithm's state of each seed, leading axis (seeds,)


class Seeds:
    """An algorithm's replicas of ``seeds`` seeds, stepped together.

    It meets the :class:`~evorl_pop.core.interfaces.Algorithm` protocol with keys of
    shape ``(seeds,)``: :meth:`init` takes the seeds' init keys, :meth:`step` each seed's
    generation key.

    Args:
      algorithm: the algorithm of one seed (its state a pytree with ``generation``).
      seeds: how many seeds.
    """

    def __init__(self, algorithm, seeds: int):
        if seeds < 1:
            raise ValueError(f"seeds must be at least 1, got {seeds}.")
        self.algorithm = algorithm
        self.num_seeds = seeds

    def init(self, keys: jax.Array) -> SeedsState:
        """Every seed's first state from its init key (``keys``: shape ``(seeds,)``)."""
        return SeedsState(generation=jnp.int32(0), seeds=jax.vmap(self.algorithm.init)(keys))

    def step(self, state: SeedsState, keys: jax.Array) -> tuple[SeedsState, dict]:
        """One generation of every seed, seed ``s`` with ``keys[s]``; each metric has
        one value per seed."""
        inner, metrics = jax.vmap(self.algorithm.step)(state.seeds, keys)
        return SeedsState(generation=state.generation + 1, seeds=inner), metrics

    def seed_state(self, state: SeedsState, index: int) -> Any:
        """The state of seed number ``index`` (0 for the run's first seed), as its single
        run's."""
        return jax.tree.map(lambda x: x[index], state.seeds)
