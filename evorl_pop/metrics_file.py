"""Per-generation metrics as a CSV file that is never half-written.

Rows are appended between chunks with one ``os.write`` on a file opened with
``O_APPEND``, so a killed process leaves only whole lines (at worst a last
line without its newline, which readers and :func:`truncate` drop). Floats
are written with ``repr`` so they read back bit for bit.

Columns: ``generation`` (1-based), ``env_steps`` (cumulative, summed on the
host in Python ints), ``wall_time`` (cumulative seconds), the fitness
statistics, then the algorithm's other metrics by name, its per-generation
``env_steps`` renamed ``env_steps_gen``.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np

from evorl_pop.config import write_atomic

FILENAME = "metrics.csv"
LEADING = ("generation", "env_steps", "wall_time")
_FIRST = ("fitness_best", "fitness_mean", "fitness_worst", "fitness_std", "best_so_far")


def columns_for(metric_names) -> tuple[str, ...]:
    """The CSV columns for an algorithm's metric names, in order."""
    names = ["env_steps_gen" if n == "env_steps" else n for n in metric_names]
    names = [n for n in names if n not in LEADING]
    first = [n for n in _FIRST if n in names]
    return (*LEADING, *first, *sorted(n for n in names if n not in first))


def _whole_lines(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _format(value) -> str:
    if isinstance(value, bool | int | np.bool_ | np.integer):
        return str(int(value))
    return "nan" if math.isnan(value) else repr(float(value))


def format_rows(rows, columns) -> str:
    """Rows (mappings from column name to a scalar) as CSV lines; a missing column is empty."""
    return "".join(",".join(_format(r[c]) if c in r else "" for c in columns) + "\n" for r in rows)


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A metrics file's (or a run folder's) columns as int64 or float64 NumPy arrays.

    A last line cut short is left out; a file that is not a metrics CSV is a ValueError.
    """
    path = Path(path) / FILENAME if Path(path).is_dir() else Path(path)
    try:
        header, *body = list(csv.reader(_whole_lines(path.read_text()))) or [[]]
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


def restore(path: str | os.PathLike, columns, rows: str) -> None:
    """Makes the file hold exactly a header of ``columns`` and ``rows`` (atomically):
    a resumed run so drops rows past its checkpoint and writes back lost or cut ones."""
    path, data = Path(path), ",".join(columns) + "\n" + rows
    if not (path.exists() and path.read_text() == data):
        write_atomic(path, data.encode())


def truncate(path: str | os.PathLike, generation: int) -> tuple[str, ...] | None:
    """Keeps only the rows up to ``generation`` (atomically), and no line cut short;
    returns the header's columns, or ``None`` when there is no file (or no header)."""
    path = Path(path)
    lines = _whole_lines(path.read_text() if path.exists() else "")
    if not lines:
        return None
    columns = tuple(next(csv.reader(lines[:1])))
    rows = [ln for ln in lines[1:] if (g := ln.split(",", 1)[0]).isdigit() and int(g) <= generation]
    restore(path, columns, "".join(rows))
    return columns


class MetricsWriter:
    """Appends whole rows of per-generation metrics to a CSV file."""

    def __init__(self, path: str | os.PathLike, columns):
        """Opens ``path`` for rows of ``columns``; writes the header if it is missing or empty."""
        self.path, self.columns = Path(path), tuple(columns)
        if not self.path.exists() or self.path.stat().st_size == 0:
            write_atomic(self.path, (",".join(self.columns) + "\n").encode())

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
