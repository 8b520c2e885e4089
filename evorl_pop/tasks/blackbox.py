"""Black-box tasks: test functions, the BBOB suite and objectives written in Python.

Three task kinds, all minimised:

* :class:`BlackBoxTask`: the classic test functions (``sphere``,
  ``ellipsoid``, ``rosenbrock``, ``rastrigin``) in any dimension;
* :class:`BBOBTask`: the 24 noiseless BBOB functions (Hansen et al. 2009,
  https://inria.hal.science/inria-00362633) as evosax implements them
  (``evosax.problems.bbob``), in any dimension, each instance seed with its own
  shift ``x_opt``, rotations ``R, Q`` and optimal value ``f_opt``. The
  instance data is the task state, so one compiled run serves every instance
  (it is a traced argument, not a constant), and the metrics report
  ``f_minus_fopt``, the best value so far minus ``f_opt``.
* :class:`PythonTask`: a user's ``f(x: np.ndarray) -> float`` (or batched
  ``f(X) -> np.ndarray``) called through ``jax.pure_callback`` from inside each
  device's shard, so a non-JAX objective runs under the same engine, sharding,
  logs and checkpoints::

      evaluate ─► pure_callback (per device: its slice of the population)
               ─► host: f(x) per row, or f(X) once ─► checked shape ─► scores

All run at the precision JAX runs at: with 64-bit mode on, candidates,
scores and instance data are float64.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from evosax.problems.bbob.bbob_fns import bbob_fns
from evosax.problems.bbob.meta_bbob import MetaBBOBProblem

from evorl_pop.base import EvalInfo, ObjectiveError, did_you_mean, float_dtype

# --- black-box functions (all minimised, optimum 0 at the origin unless noted) ---


def sphere(x):
    """BBOB's sphere (f1), unshifted: optimum 0 at the origin."""
    # f1 takes no rotation (R, Q): none is built, so any dimension fits in memory
    return bbob_fns["sphere"](x, jnp.zeros_like(x), None, None, x.shape[-1])[0]


def ellipsoid(x, condition: float = 1e6):
    """Separable ellipsoid; axis scales from 1 to ``condition``."""
    d = x.shape[-1]
    scales = condition ** (jnp.arange(d) / max(d - 1, 1))
    return jnp.sum(scales * x**2)


def rosenbrock(x):
    """Rosenbrock's valley; optimum 0 at ``x = 1``."""
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rastrigin(x):
    return 10.0 * x.shape[-1] + jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x))


BLACKBOX_FUNCTIONS: dict[str, Callable] = {
    "sphere": sphere,
    "ellipsoid": ellipsoid,
    "rosenbrock": rosenbrock,
    "rastrigin": rastrigin,
}


def _check_function(kind: str, name: str, valid, num_dims: int) -> None:
    """ValueError for a function ``valid`` lacks (with the nearest), or fewer than 2 dimensions."""
    if name not in valid:
        hint = did_you_mean(name, valid, 3)
        raise ValueError(f"Unknown {kind} {name!r}.{hint} Valid: {', '.join(valid)}.")
    if num_dims < 2:
        raise ValueError(f"num_dims must be at least 2, got {num_dims}.")


@dataclasses.dataclass(frozen=True)
class BlackBoxTask:
    """Minimise a black-box function of a ``num_dims`` vector.

    Attributes:
      function: a name in :data:`BLACKBOX_FUNCTIONS`.
      num_dims: dimension of the search space.
      x0: every coordinate of the starting point.
    """

    function: str = "sphere"
    num_dims: int = 10
    x0: float = 3.0
    maximize = False

    def __post_init__(self):
        _check_function("black-box function", self.function, BLACKBOX_FUNCTIONS, self.num_dims)

    @property
    def name(self) -> str:
        return f"{self.function}-{self.num_dims}d"

    def init_solution(self, key):
        del key
        return jnp.full((self.num_dims,), self.x0, float_dtype())

    def init_state(self):
        return ()

    def evaluate(self, solution, key, task_state):
        del key, task_state
        value = BLACKBOX_FUNCTIONS[self.function](solution)
        return value, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))

    def optimal_value(self, task_state):
        del task_state
        return jnp.zeros((), float_dtype())

    def update_state(self, task_state, info_total):
        return task_state


#: The 24 noiseless BBOB functions in suite order (f1 ... f24), by evosax's names.
BBOB_FUNCTIONS: tuple[str, ...] = tuple(bbob_fns)
#: Task names of the BBOB functions: ``bbob/<name>``.
BBOB_PREFIX = "bbob/"
MAX_INSTANCE = 2**31 - 1
_NOISELESS = {"noise_model_names": "noiseless", "use_stabilization": True}


def bbob_task_names() -> list[str]:
    """``bbob/<name>`` for every BBOB function, in suite order."""
    return [BBOB_PREFIX + name for name in BBOB_FUNCTIONS]


#: Every black-box task by name: the test functions, then the BBOB suite.
BLACKBOX_TASKS: tuple[str, ...] = (*BLACKBOX_FUNCTIONS, *bbob_task_names())


@flax.struct.dataclass
class BBOBInstance:
    """One BBOB instance: where the optimum is, its value, the rotations."""

    x_opt: jax.Array  # (num_dims,)
    f_opt: jax.Array  # shape=()
    R: jax.Array  # (num_dims, num_dims) rotation
    Q: jax.Array  # (num_dims, num_dims) rotation


def bbob_instance(function: str, num_dims: int, instance: int) -> BBOBInstance:
    """The data of a BBOB instance, as evosax's ``BBOBProblem(seed=instance)`` draws it.

    Drawn in float32 whatever the precision (then cast to the default float),
    so a float32 and a float64 run of the same instance face the same problem.

    Args:
      function: a name in :data:`BBOB_FUNCTIONS`.
      num_dims: the dimension.
      instance: the instance seed, in ``[1, 2**31 - 1]``.

    Returns:
      A :class:`BBOBInstance`.
    """
    dtype = float_dtype()
    return BBOBInstance(*(jnp.asarray(a, dtype) for a in _instance_data(num_dims, instance)))


@functools.cache
def _sampler(num_dims: int) -> MetaBBOBProblem:
    # what BBOBProblem builds; the draw does not depend on the function, and
    # one sampler per dimension compiles its draw once for every instance
    return MetaBBOBProblem(["sphere"], num_dims, num_dims, _NOISELESS)


@functools.lru_cache(maxsize=1024)
def _instance_data(num_dims: int, instance: int) -> tuple[np.ndarray, ...]:
    # as BBOBProblem(function, num_dims, seed=instance); concrete even when
    # called while tracing (a task's init_state inside jit)
    with jax.ensure_compile_time_eval(), jax.enable_x64(False):
        key_params, _ = jax.random.split(jax.random.key(instance))
        params = _sampler(num_dims).sample_params(key_params)
        return tuple(np.asarray(a) for a in (params.x_opt, params.f_opt, params.R, params.Q))


@dataclasses.dataclass(frozen=True)
class BBOBTask:
    """Minimise a noiseless BBOB function; ``f_opt`` is known, so is ``f - f_opt``.

    Attributes:
      function: a name in :data:`BBOB_FUNCTIONS` (``'ellipsoidal_rotated'``, ...).
      num_dims: dimension of the search space.
      instance: instance seed, ``1 .. 2**31 - 1`` (shift, rotations, ``f_opt``).
      x0: every coordinate of the starting point; ``None``: uniform in
        ``[-4, 4]^num_dims`` from the initialisation key.
    """

    function: str = "sphere"
    num_dims: int = 10
    instance: int = 1
    x0: float | None = None
    maximize = False

    def __post_init__(self):
        _check_function("BBOB function", self.function, BBOB_FUNCTIONS, self.num_dims)
        if not 1 <= self.instance <= MAX_INSTANCE:
            raise ValueError(
                f"BBOB instance must be an integer in [1, {MAX_INSTANCE}] (the seed of the "
                f"shift, rotations and f_opt), got {self.instance}."
            )

    @property
    def name(self) -> str:
        return f"{BBOB_PREFIX}{self.function}-{self.num_dims}d-i{self.instance}"

    def init_solution(self, key):
        if self.x0 is None:
            return jax.random.uniform(key, (self.num_dims,), float_dtype(), -4.0, 4.0)
        return jnp.full((self.num_dims,), self.x0, float_dtype())

    def init_state(self) -> BBOBInstance:
        return bbob_instance(self.function, self.num_dims, self.instance)

    def evaluate(self, solution, key, task_state: BBOBInstance):
        del key
        s = task_state
        value, penalty = bbob_fns[self.function](solution, s.x_opt, s.R, s.Q, self.num_dims)
        return value + penalty + s.f_opt, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))

    def optimal_value(self, task_state: BBOBInstance):
        """``f_opt`` of the instance in ``task_state``."""
        return task_state.f_opt

    def update_state(self, task_state, info_total):
        return task_state


class PythonTask:
    """Minimise (or maximise) a Python function of a flat float vector.

    ``f`` runs on the host of each device, through ``jax.pure_callback``,
    on that device's slice of the population: once per candidate
    (``f(x) -> float``) or once per slice (``batched=True``:
    ``f(X) -> array of len(X)``). It is called once more at construction, at
    the starting point, so a wrong return shape or an exception is reported
    before any JAX code runs.
    """

    def __init__(
        self,
        f: Callable[[np.ndarray], Any],
        num_dims: int,
        x0: float | np.ndarray = 0.0,
        batched: bool = False,
        maximize: bool = False,
        optimal_value: float | None = None,
        name: str | None = None,
    ):
        """Builds the task.

        Args:
          f: the objective; takes float64 (64-bit mode) or float32 NumPy arrays.
          num_dims: dimension of the search space.
          x0: the starting point (a scalar fills every coordinate).
          batched: ``f`` takes a ``(n, num_dims)`` matrix and returns ``n`` scores.
          maximize: whether higher scores are better.
          optimal_value: ``f*`` when known: the metrics then report ``f_minus_fopt``.
          name: shown in errors and logs (default: ``f.__name__``).
        """
        if not callable(f):
            raise ValueError(f"f must be a callable f(x) -> float, got {type(f).__name__}.")
        if num_dims < 1:
            raise ValueError(f"num_dims must be at least 1, got {num_dims}.")
        self.f = f
        self.num_dims = num_dims
        self.batched = batched
        self.maximize = maximize
        self.name = name or getattr(f, "__name__", type(f).__name__)
        self.x0 = np.broadcast_to(np.asarray(x0, np.float64), (num_dims,)).copy()
        if optimal_value is not None:
            self.optimal_value = lambda task_state: jnp.asarray(optimal_value, float_dtype())
        try:
            self._host(self.x0.astype(float_dtype()))
        except ObjectiveError as err:
            raise ValueError(str(err)) from None

    def _host(self, x: np.ndarray) -> np.ndarray:
        """Scores of ``x`` (shape ``(..., num_dims)``) from ``f``, shape ``x.shape[:-1]``."""
        x = np.asarray(x)
        rows = x.reshape(-1, self.num_dims)
        form = "f(X)" if self.batched else "f(x)"
        try:
            out = self.f(rows) if self.batched else [self.f(r) for r in rows]
            out = np.asarray(out, dtype=x.dtype)
        except Exception as err:
            raise ObjectiveError(
                f"The objective {self.name!r} raised {type(err).__name__}: {err}"
            ) from err
        want = (len(rows),)
        if out.shape != want:
            got = out.shape if self.batched else out.shape[1:]
            expected = f"an array of shape {want}" if self.batched else "one float"
            raise ObjectiveError(
                f"The objective {self.name!r} returned shape {got} from {form}; it must "
                f"return {expected}"
                + (" (or pass batched=True if it scores a matrix)." if not self.batched else ".")
            )
        return out.reshape(x.shape[:-1])

    def _host_bits(self, dtype, bits: np.ndarray) -> np.ndarray:
        """:meth:`_host` on floats passed as raw 32-bit words, its scores returned alike."""
        wide = np.dtype(dtype).itemsize == 8  # a float64 is two words
        x = np.ascontiguousarray(bits).view(dtype)
        out = self._host(x[..., 0] if wide else x)
        return out.reshape(-1).view(np.uint32).reshape(out.shape + ((2,) if wide else ()))

    def init_solution(self, key):
        del key
        return jnp.asarray(self.x0, float_dtype())

    def init_state(self):
        return ()

    def evaluate(self, solution, key, task_state):
        del key, task_state
        # The callback may run on a thread that a scoped jax.enable_x64 does not
        # reach, where JAX would cast float64 arguments and results to float32:
        # both cross as raw 32-bit words.
        wide = solution.dtype.itemsize == 8
        result = jax.ShapeDtypeStruct(solution.shape[:-1] + ((2,) if wide else ()), jnp.uint32)
        host = functools.partial(self._host_bits, solution.dtype)
        bits = jax.lax.bitcast_convert_type(solution, jnp.uint32)
        # expand_dims: under the engine's vmap, f sees a device's whole slice at once
        value = jax.pure_callback(host, result, bits, vmap_method="expand_dims")
        value = jax.lax.bitcast_convert_type(value, solution.dtype)
        return value, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))

    def update_state(self, task_state, info_total):
        return task_state
