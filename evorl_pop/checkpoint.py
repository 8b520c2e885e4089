"""Checkpoints: everything needed to continue a run, written atomically.

The state is held on the host (its full value, gathered across processes),
with the run key, config, counters, precision and the metrics rows up to the
checkpoint (so a damaged ``metrics.csv`` is repaired on resume). On disk::

    MAGIC (16 bytes) | SHA-256 of the payload (32 bytes) | msgpack payload

so damage is detected by the checksum rather than restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import config as config_lib
from evorl_pop.multihost import is_key, put, to_host

MAGIC = b"evorl-pop-ckpt\x00\x01"
FORMAT_VERSION = 1
FILENAME = "checkpoint.msgpack"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit the run."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The contents of a checkpoint file."""

    state: dict  # the state as nested dicts of NumPy arrays (flax to_state_dict)
    key: np.ndarray  # the run key's raw data, of PRNG implementation `key_impl`
    key_impl: str
    config: dict  # the run config, config.yaml's layout
    generation: int  # generations completed
    env_steps: int  # a Python int: no overflow
    wall_time: float  # seconds of training, across resumes
    metrics_columns: tuple[str, ...] = ()
    # metrics.csv's rows up to `generation`, without header (None: older checkpoints)
    metrics_rows: str | None = None
    precision: str = "float32"  # the state's float type


def precision(state) -> str:
    """``'float64'`` when a float JAX array (or shape) in ``state`` is 64-bit, else ``float32``."""
    wide = any(
        isinstance(x, jax.Array | jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating)
        and jnp.dtype(x.dtype).itemsize == 8
        for x in jax.tree.leaves(state)
    )
    return "float64" if wide else "float32"


def save(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Writes a checkpoint, its state already on the host, atomically to ``path``."""
    payload = {f.name: getattr(ckpt, f.name) for f in dataclasses.fields(ckpt)}
    payload.update(
        format=FORMAT_VERSION,
        state=flax.serialization.to_state_dict(ckpt.state),
        metrics_columns=list(ckpt.metrics_columns),
        metrics_rows=zlib.compress((ckpt.metrics_rows or "").encode()),
    )
    body = flax.serialization.msgpack_serialize(payload)
    config_lib.write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body)


def load(path: str | os.PathLike) -> Checkpoint:
    """Reads and verifies a checkpoint file (or a run folder's).

    Raises:
      CheckpointError: the file is missing, unreadable, damaged or of an unknown format.
    """
    path = Path(path) / FILENAME if Path(path).is_dir() else Path(path)
    name = repr(str(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(
            f"No checkpoint at {name}: the run wrote none yet (it stops before its "
            "first checkpoint, see --checkpoint-every) or this is not a run folder."
        ) from None
    except OSError as err:
        raise CheckpointError(f"Cannot read the checkpoint {name}: {err.strerror}.") from None
    digest, body = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
    if data[: len(MAGIC)] != MAGIC:
        raise CheckpointError(f"{name} is not an evorl-pop checkpoint (bad header).")
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(
            f"The checkpoint {name} is damaged (checksum mismatch: truncated or "
            "overwritten). Nothing was changed; restore it from a copy or start the run again."
        )
    try:
        p = flax.serialization.msgpack_restore(body)
    except Exception as err:  # msgpack raises several types for bad input
        raise CheckpointError(f"The checkpoint {name} does not decode: {err}") from None
    if p.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint {name} has format {p.get('format')!r}; this version of "
            f"evorl-pop reads format {FORMAT_VERSION}."
        )
    rows = p.get("metrics_rows")
    p.update(
        key=np.asarray(p["key"]),
        metrics_columns=tuple(p.get("metrics_columns", ())),
        metrics_rows=None if rows is None else zlib.decompress(rows).decode(),
    )
    return Checkpoint(**{f.name: p[f.name] for f in dataclasses.fields(Checkpoint) if f.name in p})


def restore_key(ckpt: Checkpoint) -> jax.Array:
    """The run key of a checkpoint, as a typed key array."""
    return jax.random.wrap_key_data(jnp.asarray(ckpt.key), impl=ckpt.key_impl)


def restore_state(template: Any, ckpt: Checkpoint):
    """Puts a checkpoint's state into the structure, dtypes and shardings of ``template``
    (a fresh state of the same algorithm and config), so that the resumed computation
    sees exactly the inputs of an uninterrupted run; CheckpointError if it does not fit."""
    expected = precision(template)
    if ckpt.precision != expected:
        raise CheckpointError(
            f"The checkpoint holds a {ckpt.precision} state, but this run computes in "
            f"{expected}: resume with precision: {ckpt.precision} (the run's own "
            "setting), or start a new run."
        )

    host_template = jax.tree.map(lambda x: to_host(x) if is_key(x) else x, template)
    unfit = "The checkpoint's state does not fit this algorithm and config:"
    try:
        restored = flax.serialization.from_state_dict(host_template, ckpt.state)
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{unfit} {err}") from None

    def place(saved, like, original):
        saved = np.asarray(saved)
        # Only shapes and dtypes are compared: no transfer of arrays that span processes.
        shape, dtype = np.shape(like), np.dtype(getattr(like, "dtype", np.asarray(like).dtype))
        if saved.shape != shape or saved.dtype != dtype:
            raise CheckpointError(
                f"{unfit} an array of {saved.shape} {saved.dtype} where {shape} {dtype} was "
                "expected."
            )
        if not isinstance(original, jax.Array):
            return saved
        if is_key(original):
            saved = jax.random.wrap_key_data(saved, impl=jax.random.key_impl(original))
        return put(saved, original.sharding)

    return jax.tree.map(place, restored, host_template, template)
