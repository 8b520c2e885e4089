"""Generations run the way the run shell runs them, for tests that need no run folder."""

import jax

from evorl_pop.run.shell import train_loop


def run(algorithm, state, key, generations, chunk=None):
    """``generations`` generations from ``state`` in one compiled chunk (or chunks of ``chunk``):
    ``(state, metrics)``, each metric a NumPy array over the generations."""
    return train_loop(algorithm, state, key, generations, chunk or max(generations, 1),
                      progress=False)  # fmt: skip


def train(algorithm, key, generations, chunk=None):
    """``algorithm`` initialised from ``key``'s first half, then :func:`run` with its second."""
    init_key, run_key = jax.random.split(key)
    return run(algorithm, algorithm.init(init_key), run_key, generations, chunk)
