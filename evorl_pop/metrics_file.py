"""Per-generation metrics as a CSV file that is never half-written.

One row per generation. Rows are appended between compiled chunks with a
single ``os.write`` per chunk on a file opened with ``O_APPEND``, so a
process killed at any moment leaves only whole lines (at worst a last line
without its newline, which readers and :func:`truncate` drop). Floats are
written with ``repr`` so they read back bit for bit.

Columns: ``generation`` (1-based: the row of the g-th generation),
``env_steps`` (cumulative, summed on the host in Python ints),
``wall_time`` (cumulative seconds), then the fitness statistics, then the
algorithm's other metrics by name, with its per-generation ``env_steps``
renamed ``env_steps_gen`` (a metric named ``generation`` repeats the first
column and is left out).
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np

from evorl_pop import config as config_lib

FILENAME = "metrics.csv"
LEADING = ("generation", "env_steps", "wall_time")
_FIRST = ("fitness_best", "fitness_mean", "fitness_worst", "fitness_std", "best_so_far")


def columns_for(metric_names) -> tuple[str, ...]:
    """The CSV columns for an algorithm's metric names.

    Args:
      metric_names: the keys of the algorithm's metrics dict, in order.

    Returns:
      The column names.
    """
    names = ["env_steps_gen" if n == "env_steps" else n for n in metric_names]
    names = [n for n in names if n not in LEADING]
    first = [n for n in _FIRST if n in names]
    return (*LEADING, *first, *sorted(n for n in names if n not in first))


def _format(value) -> str:
    if isinstance(value, bool | int | np.bool_ | np.integer):
        return str(int(value))
    return "nan" if math.isnan(value) else repr(float(value))


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a metrics file.

    A last line without its newline (a write cut short) is ignored.

    Args:
      path: a metrics CSV, or a run folder holding one.

    Returns:
      Column name to a NumPy array (int64 for integer columns, float64 else).

    Raises:
      FileNotFoundError: no metrics file there.
      ValueError: the file is not a metrics CSV.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    try:
        lines = path.read_text().splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]
        rows = list(csv.reader(io.StringIO("".join(lines))))
        header, body = (rows[0], rows[1:]) if rows else ([], [])
        if header and header[0] != LEADING[0] or any(len(r) != len(header) for r in body):
            raise ValueError("not the columns of a metrics file")
        out = {}
        for i, name in enumerate(header):
            values = [r[i] for r in body]
            try:
                out[name] = np.array([int(v) for v in values], dtype=np.int64)
            except ValueError:
                out[name] = np.array([float(v) if v else np.nan for v in values], np.float64)
    except ValueError as err:  # also UnicodeDecodeError: a binary file
        raise ValueError(
            f"{str(path)!r} is not an evorl-pop metrics CSV ({err}); give a run folder or its "
            f"{FILENAME}."
        ) from None
    return out


def format_rows(rows, columns) -> str:
    """Rows as CSV lines in the order of ``columns``.

    Args:
      rows: mappings from column name to a scalar; a missing column is written empty.
      columns: the column names.

    Returns:
      The lines, each ending in a newline.
    """
    return "".join(",".join(_format(r[c]) if c in r else "" for c in columns) + "\n" for r in rows)


def restore(path: str | os.PathLike, columns, rows: str) -> None:
    """Makes the file hold exactly a header and ``rows`` (atomically, only if it differs).

    A resumed run restores its metrics this way from its checkpoint: rows
    past the checkpoint are dropped, lost or cut rows and a cut header are
    written back.

    Args:
      path: the metrics file.
      columns: the column names.
      rows: the CSV lines (see :func:`format_rows`).
    """
    path = Path(path)
    data = (",".join(columns) + "\n" + rows).encode()
    if not (path.exists() and path.read_bytes() == data):
        config_lib.write_atomic(path, data)


def truncate(path: str | os.PathLike, generation: int) -> tuple[str, ...] | None:
    """Keeps only the rows up to ``generation`` (atomically), for a resumed run.

    Rows written after the checkpoint the run resumes from are dropped, so
    no generation is ever listed twice; so is a last line cut short.

    Args:
      path: the metrics file.
      generation: the last generation to keep (the checkpoint's).

    Returns:
      The header's columns, or ``None`` when there is no file (or no header).
    """
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    lines = [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
    if not lines:
        return None
    keep = lines[:1] + [
        line for line in lines[1:] if line.split(",", 1)[0].isdigit()
        and int(line.split(",", 1)[0]) <= generation
    ]  # fmt: skip
    if "".join(keep) != text:
        config_lib.write_atomic(path, "".join(keep).encode())
    return tuple(next(csv.reader(lines[:1])))


class MetricsWriter:
    """Appends whole rows of per-generation metrics to a CSV file."""

    def __init__(self, path: str | os.PathLike, columns):
        """Opens the file, writing the header when it is missing or empty.

        Args:
          path: the metrics file.
          columns: its column names (see :func:`columns_for`).
        """
        self.path, self.columns = Path(path), tuple(columns)
        if not self.path.exists() or self.path.stat().st_size == 0:
            config_lib.write_atomic(self.path, (",".join(self.columns) + "\n").encode())

    def append(self, rows) -> None:
        """Appends rows (see :func:`format_rows`) in one write."""
        data = format_rows(rows, self.columns).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
