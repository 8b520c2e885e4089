"""Checkpoints: everything needed to continue a run, written atomically.

A checkpoint holds the algorithm state (brought to the host with
``jax.device_get``: the full replicated value, never one device's shard), the
run key, the run config, the generation reached and the host-side counters
(cumulative env steps, wall time). On disk it is::

    MAGIC (16 bytes) | SHA-256 of the payload (32 bytes) | msgpack payload

written to a temporary file in the same folder and moved into place with
``os.replace``, so a process killed mid-write leaves the previous checkpoint
intact, and a damaged file is detected by its checksum rather than restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.config import write_atomic

MAGIC = b"evorl-pop-ckpt\x00\x01"
FORMAT_VERSION = 1
FILENAME = "checkpoint.msgpack"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit the run."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The contents of a checkpoint file.

    Attributes:
      state: the algorithm state as a nested dict of NumPy arrays
        (``flax.serialization.to_state_dict``); see :func:`restore_state`.
      key: the run key's raw data (``jax.random.key_data``).
      key_impl: the name of the key's PRNG implementation.
      config: the run config as a plain mapping (``config.yaml``'s layout).
      generation: generations completed.
      env_steps: environment steps so far (a Python int, no overflow).
      wall_time: seconds of training so far, across resumes.
      metrics_columns: the column names of the run's metrics file.
    """

    state: dict
    key: np.ndarray
    key_impl: str
    config: dict
    generation: int
    env_steps: int
    wall_time: float
    metrics_columns: tuple[str, ...] = ()


def _to_host(tree):
    """The state as NumPy arrays; typed PRNG keys become their raw data.

    Replicated arrays that span several processes are read from this
    process's copy; arrays sharded across processes are gathered, which every
    process must then do (see :func:`evorl_pop.multihost.to_host`).
    """
    from evorl_pop.multihost import to_host

    return jax.tree.map(to_host, tree)


def save(
    path: str | os.PathLike,
    state,
    key: jax.Array,
    config: dict,
    generation: int,
    env_steps: int,
    wall_time: float,
    metrics_columns=(),
) -> None:
    """Writes a checkpoint atomically.

    Args:
      path: the checkpoint file (usually ``RUN/checkpoint.msgpack``).
      state: the algorithm state (a pytree of arrays, possibly sharded, or
        already on the host as NumPy arrays, see :func:`host_state`).
      key: the run key (a typed key array).
      config: the run config as a plain mapping.
      generation: generations completed.
      env_steps: cumulative environment steps.
      wall_time: cumulative training seconds.
      metrics_columns: the metrics file's columns.
    """
    payload = {
        "format": FORMAT_VERSION,
        "state": flax.serialization.to_state_dict(_to_host(state)),
        "key": _to_host(key),
        "key_impl": str(jax.random.key_impl(key)),
        "config": config,
        "generation": int(generation),
        "env_steps": int(env_steps),
        "wall_time": float(wall_time),
        "metrics_columns": list(metrics_columns),
    }
    body = flax.serialization.msgpack_serialize(payload)
    write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body)


def load(path: str | os.PathLike) -> Checkpoint:
    """Reads and verifies a checkpoint file.

    Args:
      path: the checkpoint file, or a run folder holding one.

    Returns:
      A :class:`Checkpoint`.

    Raises:
      CheckpointError: the file is missing, truncated, damaged or of an
        unknown format; the message says which.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    return parse(read_bytes(path), path)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The raw bytes of a checkpoint file, unchecked.

    Args:
      path: the checkpoint file, or a run folder holding one.

    Returns:
      The file's bytes (see :func:`parse`).

    Raises:
      CheckpointError: the file is missing or unreadable.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(
            f"No checkpoint at {str(path)!r}: the run wrote none yet (it stops before its "
            "first checkpoint, see --checkpoint-every) or this is not a run folder."
        ) from None
    except OSError as err:
        raise CheckpointError(
            f"Cannot read the checkpoint {str(path)!r}: {err.strerror}."
        ) from None


def parse(data: bytes, path: str | os.PathLike = FILENAME) -> Checkpoint:
    """Verifies and decodes the bytes of a checkpoint file.

    Args:
      data: the file's bytes (e.g. read by process 0 and broadcast).
      path: where they came from, for error messages.

    Returns:
      A :class:`Checkpoint`.

    Raises:
      CheckpointError: truncated, damaged or of an unknown format.
    """
    path = Path(path)
    head, digest, body = (
        data[: len(MAGIC)],
        data[len(MAGIC) : len(MAGIC) + 32],
        data[len(MAGIC) + 32 :],
    )
    if head != MAGIC:
        raise CheckpointError(f"{str(path)!r} is not an evorl-pop checkpoint (bad header).")
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(
            f"The checkpoint {str(path)!r} is damaged (checksum mismatch: truncated or "
            "overwritten). Nothing was changed; restore it from a copy or start the run again."
        )
    try:
        payload = flax.serialization.msgpack_restore(body)
    except Exception as err:  # msgpack raises several types for bad input
        raise CheckpointError(f"The checkpoint {str(path)!r} does not decode: {err}") from None
    if payload.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint {str(path)!r} has format {payload.get('format')!r}; "
            f"this version of evorl-pop reads format {FORMAT_VERSION}."
        )
    return Checkpoint(
        state=payload["state"],
        key=np.asarray(payload["key"]),
        key_impl=payload["key_impl"],
        config=payload["config"],
        generation=int(payload["generation"]),
        env_steps=int(payload["env_steps"]),
        wall_time=float(payload["wall_time"]),
        metrics_columns=tuple(payload.get("metrics_columns", ())),
    )


def host_state(state):
    """A state's arrays as NumPy, ready for :func:`save` on the writing process.

    Call it on every process: a leaf sharded across processes is gathered
    with a collective.

    Args:
      state: the algorithm state.

    Returns:
      The same structure with NumPy leaves (typed keys as raw key data).
    """
    return _to_host(state)


def restore_key(ckpt: Checkpoint) -> jax.Array:
    """The run key of a checkpoint, as a typed key array."""
    return jax.random.wrap_key_data(jnp.asarray(ckpt.key), impl=ckpt.key_impl)


def restore_state(template: Any, state_dict: dict):
    """Puts a checkpoint's state into the structure and placement of ``template``.

    Each restored leaf gets the template leaf's dtype check and its sharding,
    so the resumed computation sees exactly the inputs of an uninterrupted run.

    Args:
      template: a freshly initialised state of the same algorithm and config
        (e.g. ``algorithm.init(init_key)``).
      state_dict: :attr:`Checkpoint.state`.

    Returns:
      The restored state.

    Raises:
      CheckpointError: the saved state does not fit the template (a changed
        config that alters the state's structure, shapes or dtypes).
    """
    from evorl_pop.multihost import put, to_host

    host_template = jax.tree.map(
        lambda x: (
            to_host(x)
            if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
            else x
        ),
        template,
    )
    try:
        restored = flax.serialization.from_state_dict(host_template, state_dict)
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"The checkpoint's state does not fit this algorithm and config: {err}"
        ) from None

    def place(saved, like, original):
        saved_arr = np.asarray(saved)
        # Only shapes and dtypes are compared: no transfer of arrays that span processes.
        shape = tuple(np.shape(like))
        dtype = np.dtype(like.dtype if hasattr(like, "dtype") else np.asarray(like).dtype)
        if saved_arr.shape != shape or saved_arr.dtype != dtype:
            raise CheckpointError(
                "The checkpoint's state does not fit this algorithm and config: an array "
                f"of {saved_arr.shape} {saved_arr.dtype} where {shape} {dtype} was expected."
            )
        if isinstance(original, jax.Array):
            # Every process holds the same saved value and builds its own
            # shards from it (multihost.put: plain device_put for one process).
            if jnp.issubdtype(original.dtype, jax.dtypes.prng_key):
                saved_arr = jax.random.wrap_key_data(saved_arr, impl=jax.random.key_impl(original))
            return put(saved_arr, original.sharding)
        return saved_arr

    return jax.tree.map(place, restored, host_template, template)
