"""The compiled chunk loop: generations run as jitted ``lax.scan`` chunks.

Generation ``g`` uses ``fold_in(run key, g)``, so a run split into chunks, or
stopped and resumed, gives the result of one piece. The run shell
(:mod:`evorl_pop.run.shell`) runs it; tests, guides and benchmarks call
:func:`train_loop` and :func:`chunk_fn` on an algorithm directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from evorl_pop.base import (
    objective_error,
)
from evorl_pop.run import processes
from evorl_pop.run import stop as stop_lib


def chunk_fn(algorithm, length: int):
    """``length`` generations as one compiled ``lax.scan``: ``(state, key) -> (state, metrics)``,
    generation ``g`` with ``fold_in(key, g)`` (``g`` the state's ``generation``; a multi-seed
    run's keys, one per seed, each folded), the metrics stacked over the chunk.
    :func:`train_loop` runs them; benchmarks time them."""

    def body(carry, _):
        state, key = carry
        dtypes = jax.tree.map(lambda x: x.dtype, state)
        if jnp.ndim(key):  # a multi-seed run: seed s folds g into its own run key
            generation_key = jax.vmap(jax.random.fold_in, (0, None))(key, state.generation)
        else:
            generation_key = jax.random.fold_in(key, state.generation)
        new_state, metrics = algorithm.step(state, generation_key)
        # A leaf that came back weakly typed would compile the next chunk again.
        return (jax.tree.map(jnp.asarray, new_state, dtypes), key), metrics

    def chunk(state, key):
        (state, _), metrics = jax.lax.scan(body, (state, key), None, length=length)
        return state, metrics

    return jax.jit(chunk)


def train_loop(
    algorithm,
    state,
    key: jax.Array,
    num_generations: int,
    chunk: int = 5,
    callback: Callable[[object, dict], None] | None = None,
    progress: bool = True,
    desc: str = "train",
    generation_offset: int = 0,
    stop: Callable[[], bool] | None = None,
):
    """Runs ``num_generations`` generations in jitted ``lax.scan`` chunks.

    Args:
      algorithm: an object with ``step(state, key) -> (state, metrics)``.
      state: its state, whose integer ``generation`` (counted from the run's
        start) picks the key ``fold_in(key, generation)``.
      key: the run's key.
      num_generations: generations to run from ``state``.
      chunk: generations per compiled chunk (a run config's ``chunk``).
      callback: ``callback(state, metrics)`` after each chunk, the metrics as
        NumPy arrays over the chunk's generations.
      progress, desc: a progress bar (best / mean fitness, steps/s) and its label.
      generation_offset: generations done before this call (the bar counts from it).
      stop: asked before each chunk; ``True`` raises
        :class:`~evorl_pop.run.stop.Requested` (a ``KeyboardInterrupt``) there.

    Returns:
      ``(state, history)``: each metric's NumPy array over all generations run.
    """
    if num_generations < 0 or chunk < 1:
        raise ValueError(f"need generations >= 0 and chunk >= 1, got {num_generations}, {chunk}")
    history: dict[str, list[np.ndarray]] = {}
    total = generation_offset + num_generations
    bar = tqdm(total=total, initial=generation_offset, desc=desc, disable=not progress, unit="gen")
    done = 0
    compiled = {}
    while done < num_generations:
        if stop is not None and stop():
            bar.close()
            raise stop_lib.Requested
        length = min(chunk, num_generations - done)
        if length not in compiled:
            compiled[length] = chunk_fn(algorithm, length)
        t0 = time.perf_counter()
        many = jax.process_count() > 1
        try:
            # Every device's part: a replicated output is read from one device, while
            # another may still be running (a host callback then outlives the run).
            state, metrics = jax.block_until_ready(compiled[length](state, key))
            # One transfer; under jax.distributed the metrics span every process's devices.
            metrics = jax.tree.map(processes.to_host, metrics) if many else jax.device_get(metrics)
        except jax.errors.JaxRuntimeError as err:  # a Python objective's error in one line
            raise objective_error(err) from None
        elapsed = time.perf_counter() - t0
        done += length
        for name, values in metrics.items():
            history.setdefault(name, []).append(values)
        if callback is not None:
            callback(state, metrics)
        best = np.mean(metrics["fitness_best"][-1])  # a multi-seed run: the seeds' mean
        mean = np.mean(metrics["fitness_mean"][-1])
        postfix = {"best": f"{best:.4g}", "mean": f"{mean:.4g}"}
        if "env_steps" in metrics and metrics["env_steps"].sum() > 0:
            postfix["steps/s"] = f"{metrics['env_steps'].sum() / elapsed:.3g}"
        bar.set_postfix(postfix)
        bar.update(length)
    bar.close()
    return state, dict(zip(history, map(np.concatenate, history.values()), strict=True))
