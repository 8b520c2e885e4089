"""The training loop: compiled chunks of generations, and what a run records between them.

Generation ``g`` uses ``fold_in(key, g)``, so a run split into chunks, or
stopped and resumed, gives the result of one piece. Ctrl-C is deferred to the
end of a chunk, so that every process stops after the same one.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from evorl_pop import checkpoint as ckpt_lib
from evorl_pop import config as config_lib
from evorl_pop import metrics_file, multihost
from evorl_pop.config import RunConfig

logger = logging.getLogger("evorl_pop.run")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with a message that says what the run folder holds now."""


def _like(new, old):  # ``new`` without a weak type where ``old`` has none
    same = isinstance(new, jax.Array) and isinstance(old, jax.Array) and new.dtype == old.dtype
    return jax.lax.convert_element_type(new, old.dtype) if same else new


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
    stop: Callable[[], bool] | None = None,
):
    """Runs ``num_generations`` generations in jitted ``lax.scan`` chunks.

    Args:
      algorithm: an object with ``step(state, key) -> (state, metrics)``.
      state: its state, whose integer ``generation`` (counted from the run's
        start) picks the key ``fold_in(key, generation)``.
      key: the run's key.
      num_generations: generations to run from ``state``.
      chunk: generations per compiled chunk.
      callback: ``callback(state, metrics)`` after each chunk, the metrics as
        NumPy arrays over the chunk's generations.
      progress, desc: a progress bar (best / mean fitness, steps/s) and its label.
      generation_offset: generations done before this call (the bar counts from it).
      stop: asked before each chunk; ``True`` raises ``KeyboardInterrupt`` there.

    Returns:
      ``(state, history)``: each metric's NumPy array over all generations run.
    """
    if num_generations < 0 or chunk < 1:
        raise ValueError(f"need generations >= 0 and chunk >= 1, got {num_generations}, {chunk}")

    def body(state, _):
        new_state, metrics = algorithm.step(state, jax.random.fold_in(key, state.generation))
        # A leaf that came back weakly typed would compile the next chunk again.
        return jax.tree.map(_like, new_state, state), metrics

    history: dict[str, list[np.ndarray]] = {}
    total = generation_offset + num_generations
    bar = tqdm(total=total, initial=generation_offset, desc=desc, disable=not progress, unit="gen")
    done, compiled = 0, {}
    while done < num_generations:
        if stop is not None and stop():
            bar.close()
            raise KeyboardInterrupt
        length = min(chunk, num_generations - done)
        if length not in compiled:
            compiled[length] = jax.jit(lambda s, n=length: jax.lax.scan(body, s, None, length=n))
        t0 = time.perf_counter()
        state, metrics = compiled[length](state)
        # Under jax.distributed the metrics span every process's devices: read this process's copy.
        metrics = jax.tree.map(multihost.to_host, metrics)
        elapsed = time.perf_counter() - t0
        done += length
        for name, values in metrics.items():
            history.setdefault(name, []).append(values)
        if callback is not None:
            callback(state, metrics)
        postfix = {k: f"{metrics[f'fitness_{k}'][-1]:.4g}" for k in ("best", "mean")}
        if "env_steps" in metrics and metrics["env_steps"].sum() > 0:
            postfix["steps/s"] = f"{metrics['env_steps'].sum() / elapsed:.3g}"
        bar.set_postfix(postfix)
        bar.update(length)
    bar.close()
    return state, {k: np.concatenate(v) for k, v in history.items()}


@contextlib.contextmanager
def deferred_interrupts():
    """Defers Ctrl-C to the end of the current chunk; a second Ctrl-C stops at once.

    Yields:
      A function, for :func:`train_loop`'s ``stop``, that says whether some
      process was interrupted (a collective under ``jax.distributed``).
    """
    requested = threading.Event()

    def handler(signum, frame):
        requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nstopping after the current chunk (Ctrl-C again to stop at once)", file=sys.stderr)

    if threading.current_thread() is not threading.main_thread():
        yield lambda: multihost.any_process(False)
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: multihost.any_process(requested.is_set())
    finally:
        signal.signal(signal.SIGINT, previous)


class Session:
    """What a run records between chunks: metrics, warnings, and a checkpoint once
    ``checkpoint_every`` generations have passed since the last (and at the end).

    A session of a new run starts from ``state``; a resumed one from the checkpoint ``ckpt``.
    """

    def __init__(self, run_dir: Path, config: RunConfig, run_key, state, ckpt=None):
        self.run_dir, self.config, self.run_key, self.state = run_dir, config, run_key, state
        self.writer, self.start, self.metrics = jax.process_index() == 0, time.perf_counter(), None
        counters = (ckpt.generation, ckpt.env_steps, ckpt.wall_time) if ckpt else (0, 0, 0.0)
        self.generation, self.env_steps, self.wall_time = counters
        self.wall_base = self.wall_time
        self.columns = ckpt.metrics_columns if ckpt and ckpt.metrics_columns else None
        self.rows = (ckpt.metrics_rows or "").splitlines(keepends=True) if ckpt else []
        # A new run checkpoints even at generation 0, so that `-g 0` can be resumed.
        self.saved_generation = self.generation if ckpt else -1

    def callback(self, state, metrics) -> None:
        """Records a chunk's metrics (see :func:`train_loop`), then checkpoints if due."""
        n = len(next(iter(metrics.values())))
        generation = int(multihost.to_host(state.generation))
        wall = self.wall_base + time.perf_counter() - self.start
        rows = []
        for i in range(n):
            self.env_steps += int(metrics["env_steps"][i]) if "env_steps" in metrics else 0
            row = {"env_steps_gen" if k == "env_steps" else k: v[i] for k, v in metrics.items()}
            row.update(
                generation=generation - n + 1 + i,
                env_steps=self.env_steps,
                # Time within a chunk is shared out evenly: the host sees only its end.
                wall_time=self.wall_time + (wall - self.wall_time) * (i + 1) / n,
            )
            rows.append(row)
        self.wall_time, self.generation, self.state = wall, generation, state
        self.columns = self.columns or metrics_file.columns_for(metrics)
        self.rows.append(metrics_file.format_rows(rows, self.columns))
        if self.writer:
            if self.metrics is None:
                self.metrics = metrics_file.MetricsWriter(self.run_dir / metrics_file.FILENAME,
                                                          self.columns)  # fmt: skip
            self.metrics.append(rows)
            if failed := [r["generation"] for r in rows if np.isnan(r.get("fitness_mean", 0.0))]:
                which = f"generation{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
                text = f"{which}: no finite fitness (all candidates NaN or inf); the run goes on"
                logger.warning("warning: %s", text)
                print(f"warning: {text}", file=sys.stderr)
            best, mean = (float(rows[-1].get(f"fitness_{k}", np.nan)) for k in ("best", "mean"))
            logger.info("generation %d/%d  best %.6g  mean %.6g  env steps %d  %.1fs",
                        generation, self.config.generations, best, mean, self.env_steps,
                        self.wall_time)  # fmt: skip
        every = self.config.checkpoint_every
        if every and generation - max(self.saved_generation, 0) >= every:
            self.checkpoint()

    def checkpoint(self, collective: bool = True) -> None:
        """Saves the latest state reached, unless saved already; every process calls it.

        Args:
          collective: ``False`` skips a save that needs a collective (after an
            immediate interruption the other processes may not take part).
        """
        if self.state is None or self.saved_generation == self.generation:
            return
        if not collective and any(  # a leaf that only a gather across processes reads
            isinstance(x, jax.Array)
            and not (x.is_fully_addressable or x.sharding.is_fully_replicated)
            for x in jax.tree.leaves(self.state)
        ):
            logger.info("no checkpoint at generation %d (interrupted)", self.generation)
            return
        state = jax.tree.map(multihost.to_host, self.state)
        if self.writer:
            ckpt = ckpt_lib.Checkpoint(
                state, multihost.to_host(self.run_key), str(jax.random.key_impl(self.run_key)),
                config_lib.to_dict(self.config), self.generation, self.env_steps, self.wall_time,
                self.columns or (), "".join(self.rows), ckpt_lib.precision(self.state),
            )  # fmt: skip
            ckpt_lib.save(self.run_dir / ckpt_lib.FILENAME, ckpt)
            logger.info("checkpoint at generation %d", self.generation)
        self.saved_generation = self.generation
