"""Host-side training loop: compiled chunks of generations, logging in between."""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np
from tqdm.auto import tqdm

from evorl_pop.multihost import tree_to_host


def _like(new, old):
    if isinstance(new, jax.Array) and isinstance(old, jax.Array) and new.dtype == old.dtype:
        return jax.lax.convert_element_type(new, old.dtype)
    return new


def train_loop(
    algorithm,
    state,
    key: jax.Array,
    num_generations: int,
    chunk: int = 10,
    callback: Callable[[object, dict], None] | None = None,
    progress: bool = True,
    desc: str = "train",
    generation_offset: int = 0,
):
    """Runs ``num_generations`` generations in jitted ``lax.scan`` chunks.

    Generation ``g`` uses ``fold_in(key, g)`` (``g`` counted from the run's
    start, ``state.generation``), so splitting a run into chunks, or stopping
    and resuming it, gives the same result as running it in one piece.

    Args:
      algorithm: an object with ``step(state, key) -> (state, metrics)``.
      state: its state, with an integer ``generation`` field.
      key: the run's key.
      num_generations: generations to run from ``state``.
      chunk: generations per compiled chunk; logging happens between chunks.
      callback: called as ``callback(state, metrics)`` after each chunk with
        that chunk's metrics as NumPy arrays (leading axis: generations).
      progress: show a progress bar with best / mean fitness and steps/s.
      desc: the progress bar's label.
      generation_offset: generations the run completed before this call
        (a resumed run); only the progress bar counts from it.

    Returns:
      ``(state, history)``: history maps each metric name to a NumPy array
      over all generations run.
    """
    if num_generations < 0 or chunk < 1:
        raise ValueError(
            f"need num_generations >= 0 and chunk >= 1, got {num_generations}, {chunk}"
        )

    def body(state, _):
        new_state, metrics = algorithm.step(state, jax.random.fold_in(key, state.generation))
        # Keep the carry's input types: a leaf that comes back weakly typed
        # would change the next chunk's input types and compile it again.
        new_state = jax.tree.map(_like, new_state, state)
        return new_state, metrics

    history: dict[str, list[np.ndarray]] = {}
    bar = tqdm(
        total=generation_offset + num_generations,
        initial=generation_offset,
        desc=desc,
        disable=not progress,
        unit="gen",
        leave=True,
    )
    done = 0
    compiled = {}
    while done < num_generations:
        length = min(chunk, num_generations - done)
        if length not in compiled:
            compiled[length] = jax.jit(lambda s, n=length: jax.lax.scan(body, s, None, length=n))
        t0 = time.perf_counter()
        state, metrics = compiled[length](state)
        # Under jax.distributed the metrics span every process's devices and
        # are not fully addressable: read this process's replica.
        metrics = tree_to_host(metrics)
        elapsed = time.perf_counter() - t0
        done += length
        for name, values in metrics.items():
            history.setdefault(name, []).append(values)
        if callback is not None:
            callback(state, metrics)
        postfix = {
            "best": f"{metrics['fitness_best'][-1]:.4g}",
            "mean": f"{metrics['fitness_mean'][-1]:.4g}",
        }
        if "env_steps" in metrics and metrics["env_steps"].sum() > 0:
            postfix["steps/s"] = f"{metrics['env_steps'].sum() / elapsed:.3g}"
        bar.set_postfix(postfix)
        bar.update(length)
    bar.close()
    return state, {k: np.concatenate(v) for k, v in history.items()}
