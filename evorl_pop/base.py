"""The bottom of the package: small types and helpers every layer shares.

Nothing here imports another module of evorl_pop. It holds the error classes
(each says what to change), the evaluation record a task returns for one
candidate, the float type of a run, an exact counter, atomic file writes and
the "did you mean" hint of every error about a name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import secrets
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import jax_private

__version__ = "0.1.0"

# --- errors ------------------------------------------------------------------------


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type or impossible value."""


class RunError(RuntimeError):
    """A run that cannot start or continue as asked (the message says why)."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit the run."""


class ObjectiveError(RuntimeError):
    """A Python objective raised or returned something other than its scores."""


def objective_error(err: jax.errors.JaxRuntimeError) -> BaseException:
    """The one-line :class:`ObjectiveError` a failed Python objective raised, the
    ``KeyboardInterrupt`` of a Ctrl-C inside it, else ``err``.

    An exception inside ``jax.pure_callback`` reaches the caller as a
    ``JaxRuntimeError`` carrying the whole host traceback; a run catches it
    and raises ``objective_error(err)`` instead: the objective's own message,
    or the interrupt, so that a caller's ``except KeyboardInterrupt`` sees it.
    """
    marker = f"{ObjectiveError.__name__}: "
    text = str(err).splitlines()
    lines = [line for line in text if marker in line]
    if any(line.strip().startswith("KeyboardInterrupt") for line in text):
        jax_private.drop_failed_callbacks()
        return KeyboardInterrupt()
    if not lines:
        return err
    jax_private.drop_failed_callbacks()
    return ObjectiveError(lines[-1].split(marker, 1)[1])


def did_you_mean(value, valid, n: int = 1, cutoff: float = 0.6) -> str:
    """`` Did you mean 'X'?`` naming the ``n`` valid names nearest ``value``, ignoring
    case ('cma_es' finds CMA_ES), or ``''`` when none is near (``difflib``'s ``cutoff``)."""
    lower = {str(v).lower(): v for v in valid}
    close = difflib.get_close_matches(str(value).lower(), list(lower), n=n, cutoff=cutoff)
    return f" Did you mean {', '.join(repr(lower[c]) for c in close)}?" if close else ""


def check_config(
    config,
    choices: dict | None = None,
    least: dict | None = None,
    positive: tuple[str, ...] = (),
    nonnegative: tuple[str, ...] = (),
    widths: tuple[str, ...] = (),
) -> None:
    """The checks every config's ``validate()`` starts with, as :class:`ConfigError`.

    Args:
      config: a config dataclass.
      choices: field name to its valid values (the error names the nearest one).
      least: field name to its smallest allowed value (``None`` values pass).
      positive: fields that must be ``> 0`` (NaN fails).
      nonnegative: fields that must be ``>= 0`` (NaN fails).
      widths: fields of a network's layer widths, each at least 1 (``hidden_sizes``).
    """
    for name, valid in (choices or {}).items():
        value = getattr(config, name)
        if value not in valid:
            hint = did_you_mean(value, valid)
            listed = ", ".join(sorted(map(str, valid)))
            raise ConfigError(f"{name}: unknown value {value!r}.{hint} Valid: {listed}.")
    for name, bound in (least or {}).items():
        value = getattr(config, name)
        if value is not None and value < bound:
            raise ConfigError(f"{name} must be at least {bound}, got {value}.")
    for name in positive:
        if not (value := getattr(config, name)) > 0:
            raise ConfigError(f"{name} must be > 0, got {value}.")
    for name in nonnegative:
        if not (value := getattr(config, name)) >= 0:
            raise ConfigError(f"{name} must be >= 0, got {value}.")
    for name in widths:
        value = getattr(config, name)
        if any(width < 1 for width in value):
            raise ConfigError(f"{name} must be at least 1, got {list(value)}.")


# --- environments and numbers ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of an environment.

    Attributes:
      name: registry name, e.g. ``'CartPole-v1'``.
      obs_shape: shape of one observation.
      discrete: ``True`` for a discrete action space.
      action_dim: number of actions (discrete) or action vector length.
      action_low: lower bounds of continuous actions (``None`` if discrete).
      action_high: upper bounds of continuous actions (``None`` if discrete).
      max_steps: episode length limit.
      terminates: whether an episode can end before ``max_steps`` (a fall, a
        goal); rollouts of environments that never do skip the work queue of
        :func:`~evorl_pop.tasks.rollout.rollout_queue`, which has nothing to gain there.
      action_heads: discrete actions of several dimensions (a multi-discrete space): the
        number of choices of each, one categorical head per dimension, their logits
        concatenated (``action_dim`` is their sum) and the action a vector of one
        index per head; empty: one head.
      action_mask: ``(start, stop)``: the entries of the flattened observation that
        mark each logit's action valid (1) or not (0); the policies never pick an
        invalid one. ``None``: every action is valid.
    """

    name: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None
    max_steps: int
    terminates: bool = True
    action_heads: tuple[int, ...] = ()
    action_mask: tuple[int, int] | None = None

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))


#: ``float_dtype()``: the run's float type, float64 when JAX's 64-bit mode is on,
#: else float32 (JAX's canonical form of float64).
float_dtype = functools.partial(jax.dtypes.canonicalize_dtype, jnp.float64)


@flax.struct.dataclass
class EvalInfo:
    """What evaluating one candidate cost, beside its score; summed over a population."""

    steps: jax.Array  # int32: environment steps this evaluation took
    episodes: jax.Array  # int32: episodes it ran
    moments: Any = None  # observation sums (rollout.ObsMoments) when observations are normalised


# --- files -------------------------------------------------------------------------


#: The largest text file the program reads (a config, metrics.csv): more is not one.
MAX_TEXT_BYTES = 1 << 30


def read_text(path: str | os.PathLike, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """The text of a file of at most ``limit`` bytes: a ``ValueError`` naming the file
    and ``what`` it should be when it is larger or not UTF-8 (``OSError`` when unreadable)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{str(path)!r} is larger than {limit:,} bytes: not {what}.")
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{str(path)!r} is not {what}: it holds bytes that are not UTF-8 text (at byte "
            f"{err.start})."
        ) from None


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that a reader (or a process killed mid-write)
    sees the old file or the new one, never a mix."""
    path = Path(path)
    while True:  # created as open() creates a file: mode 0o666 less the umask
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
