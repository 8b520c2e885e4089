"""Reading a run folder back: a checkpoint verified and put into the shapes,
dtypes and shardings of a fresh state, and ``metrics.csv`` made to hold exactly
the checkpoint's rows, so that a resumed run continues as an uninterrupted one.

The files are those :mod:`evorl_pop.run.store` writes (its docstring gives
their layout).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import CheckpointError, read_text, write_atomic
from evorl_pop.run import processes
from evorl_pop.run.checkpoint import FORMAT_VERSION, MAGIC, Checkpoint, precision
from evorl_pop.run.folder import CHECKPOINT_FILENAME
from evorl_pop.run.metrics_csv import _whole_lines
from evorl_pop.run.state_dicts import serializable


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Reads and verifies a checkpoint file (or a run folder's).

    Raises:
      CheckpointError: the file is missing, unreadable, damaged or of an unknown format.
    """
    if not Path(path).exists():
        raise CheckpointError(f"{str(path)!r} does not exist: give a run folder or its checkpoint.")
    path = Path(path) / CHECKPOINT_FILENAME if Path(path).is_dir() else Path(path)
    name = repr(str(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        from evorl_pop.run import sweep  # it reads run folders: imported where it is needed

        if told := sweep.top_folder(path.parent, "resume"):
            raise CheckpointError(told) from None
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
    if not isinstance(p, dict) or p.get("format") != FORMAT_VERSION:
        found = p.get("format") if isinstance(p, dict) else type(p).__name__
        raise CheckpointError(
            f"The checkpoint {name} has format {found!r}; this version of "
            f"evorl-pop reads format {FORMAT_VERSION}."
        )
    try:
        rows = p.get("metrics_rows")
        p.update(
            key=np.asarray(p["key"]),
            metrics_columns=tuple(p.get("metrics_columns", ())),
            metrics_rows=None if rows is None else zlib.decompress(rows).decode(),
        )
        fields = {f.name: p[f.name] for f in dataclasses.fields(Checkpoint) if f.name in p}
        ckpt = Checkpoint(**fields)
        if not (isinstance(ckpt.config, dict) and isinstance(ckpt.generation, int)):
            raise TypeError("no config mapping or generation count")
    except (KeyError, TypeError, ValueError, AttributeError, zlib.error) as err:
        raise CheckpointError(
            f"The checkpoint {name} passes its checksum but does not hold a checkpoint "
            f"({type(err).__name__}: {err}); it was written by something else: restore it "
            "from a copy or start the run again."
        ) from None
    return ckpt


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

    host_template = jax.tree.map(
        lambda x: processes.to_host(x) if processes.is_key(x) else x, template
    )
    unfit = "The checkpoint's state does not fit this algorithm and config:"
    serializable(host_template)
    try:
        restored = flax.serialization.from_state_dict(host_template, ckpt.state)
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{unfit} {err}") from None

    def place(saved, like, original):
        saved = np.asarray(saved)
        # Only shapes and dtypes are compared: no transfer of arrays that span processes.
        shape = np.shape(like)
        typed = isinstance(like, jax.Array | jax.ShapeDtypeStruct | np.ndarray | np.generic)
        dtype = np.dtype(like.dtype if typed else np.asarray(like).dtype)
        if saved.shape != shape or saved.dtype != dtype:
            raise CheckpointError(
                f"{unfit} an array of {saved.shape} {saved.dtype} where {shape} {dtype} was "
                "expected."
            )
        if not isinstance(original, jax.Array):
            return saved
        if processes.is_key(original):
            saved = jax.random.wrap_key_data(saved, impl=jax.random.key_impl(original))
        return processes.put(saved, original.sharding)

    return jax.tree.map(place, restored, host_template, template)


# --- metrics.csv ---------------------------------------------------------------------


def restore_metrics(path: str | os.PathLike, columns, rows: str) -> None:
    """Makes the file hold exactly a header of ``columns`` and ``rows`` (atomically):
    a resumed run so drops rows past its checkpoint and writes back lost or cut ones."""
    path = Path(path)
    data = ",".join(columns) + "\n" + rows
    if not (path.exists() and _text_or_none(path) == data):
        write_atomic(path, data.encode())


def _text_or_none(path: Path) -> str | None:
    """A metrics file's text, or ``None`` (logged) when it is not text: the checkpoint's
    rows replace it."""
    try:
        return read_text(path, "a metrics CSV")
    except ValueError as err:
        print(
            f"warning: {err} It is rebuilt from the checkpoint, which holds every row.",
            file=sys.stderr,
        )
        return None


def truncate_metrics(path: str | os.PathLike, generation: int) -> tuple[str, ...] | None:
    """Keeps only the rows up to ``generation`` (atomically), and no line cut short;
    returns the header's columns, or ``None`` when there is no file (or no header)."""
    path = Path(path)
    lines = _whole_lines((_text_or_none(path) or "") if path.exists() else "")
    if not lines:
        return None
    columns = tuple(next(csv.reader(lines[:1])))
    rows = [ln for ln in lines[1:] if (g := ln.split(",", 1)[0]).isdigit() and int(g) <= generation]
    restore_metrics(path, columns, "".join(rows))
    return columns
