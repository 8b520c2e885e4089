"""``metrics.csv``: its columns, its lines and reading it back.

Rows are appended between chunks with one ``os.write`` on a file opened with
``O_APPEND`` (:class:`~evorl_pop.run.recorders.MetricsCSV`), so a killed process
leaves only whole lines (at worst a last line without its newline, which
readers and :func:`~evorl_pop.run.restore.truncate_metrics` drop); floats are
written with ``repr`` so they read back bit for bit.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np

from evorl_pop.base import read_text
from evorl_pop.run.folder import METRICS_FILENAME

LEADING = ("generation", "env_steps", "wall_time")
_FIRST = ("fitness_best", "fitness_mean", "fitness_worst", "fitness_std", "best_so_far")


def columns_for(metric_names, labels=()) -> tuple[str, ...]:
    """The CSV columns for an algorithm's metric names, in order; ``labels``: a replica's
    label columns (its seed, its swept values), after the leading ones."""
    names = ["env_steps_gen" if n == "env_steps" else n for n in metric_names]
    names = [n for n in names if n not in LEADING and n not in labels]
    first = [n for n in _FIRST if n in names]
    return (*LEADING, *labels, *first, *sorted(n for n in names if n not in first))


def _whole_lines(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _format(value) -> str:
    if isinstance(value, bool | int | np.bool_ | np.integer):
        return str(int(value))
    return "nan" if math.isnan(value) else repr(float(value))


def csv_lines(rows, columns) -> list[str]:
    """Rows (mappings from column name to a scalar) as CSV lines; a missing column is empty."""
    return [",".join(_format(r[c]) if c in r else "" for c in columns) + "\n" for r in rows]


def read_metrics_lines(columns, lines) -> dict[str, np.ndarray]:
    """Rows of ``metrics.csv`` (whole lines, no header) as int64 or float64 NumPy columns;
    ValueError for lines that are not of those ``columns``."""
    body = list(csv.reader(lines))
    if columns and columns[0] != LEADING[0] or any(len(r) != len(columns) for r in body):
        raise ValueError("not the columns of a metrics file")
    out = {}
    for i, name in enumerate(columns):
        values = [r[i] for r in body]
        try:
            out[name] = np.array([int(v) for v in values], dtype=np.int64)
        except ValueError:
            out[name] = np.array([float(v) if v else np.nan for v in values], np.float64)
    return out


def read_metrics(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A metrics file's (or a run folder's) columns as int64 or float64 NumPy arrays.

    A last line cut short is left out; a file that is not a metrics CSV is a ValueError.
    """
    path = Path(path) / METRICS_FILENAME if Path(path).is_dir() else Path(path)
    try:
        header, *lines = _whole_lines(read_text(path, "a metrics CSV")) or [""]
        out = read_metrics_lines(next(csv.reader([header])) if header else [], lines)
    except ValueError as err:  # also UnicodeDecodeError: a binary file
        raise ValueError(
            f"{str(path)!r} is not an evorl-pop metrics CSV ({err}); give a run folder or its "
            f"{METRICS_FILENAME}."
        ) from None
    return out
