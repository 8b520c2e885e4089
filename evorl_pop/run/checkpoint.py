"""A checkpoint file: the state on the host and what a resume needs beside it.

A checkpoint holds the state on the host (its full value, gathered across
processes), with the run key, config, counters, precision and the metrics
rows up to it (so a damaged ``metrics.csv`` is rebuilt on resume). On disk::

    MAGIC (16 bytes) | SHA-256 of the payload (32 bytes) | msgpack payload

so damage is detected by the checksum rather than restored
(:func:`evorl_pop.run.restore.load_checkpoint` reads it back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import zlib

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import write_atomic
from evorl_pop.run.state_dicts import serializable

MAGIC = b"evorl-pop-ckpt\x00\x01"
FORMAT_VERSION = 1


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
    devices: int = 0  # devices on the population axis that computed it (0: not recorded)


def precision(state) -> str:
    """``'float64'`` when a float JAX array (or shape) in ``state`` is 64-bit, else ``float32``."""
    wide = any(
        isinstance(x, jax.Array | jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating)
        and jnp.dtype(x.dtype).itemsize == 8
        for x in jax.tree.leaves(state)
    )
    return "float64" if wide else "float32"


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Writes a checkpoint, its state already on the host, atomically to ``path``."""
    payload = {f.name: getattr(ckpt, f.name) for f in dataclasses.fields(ckpt)}
    serializable(ckpt.state)
    payload.update(
        format=FORMAT_VERSION,
        state=flax.serialization.to_state_dict(ckpt.state),
        metrics_columns=list(ckpt.metrics_columns),
        metrics_rows=zlib.compress((ckpt.metrics_rows or "").encode()),
    )
    body = flax.serialization.msgpack_serialize(payload)
    write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body)
