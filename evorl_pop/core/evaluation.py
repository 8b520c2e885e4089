"""The one evaluator: a population sharded over the ``POP`` axis of a mesh, scored.

Everything the engine's generations, the initial population of population-based
strategies, PBT's intervals and MAP-Elites' batches share::

    make_mesh ─► pad_to_multiple (padded rows masked out)
              ─► evaluate: shmap_vmap / shmap_map, candidate i on fold_in(key, i)
              ─► summarize inside the shard: pmin / pmax, psum, all_gather ─► Summary
              ─► to_minimization (the one sign boundary), worst_for_nonfinite

:mod:`evorl_pop.core.engine` re-exports every name.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from evorl_pop.core.interfaces import MultiObjective
from evorl_pop.distributed import POP_AXIS_NAME, all_gather, pmax, pmin, psum, shmap_map, shmap_vmap

POP = P(POP_AXIS_NAME)

# --- the mesh and padding ----------------------------------------------------------


def make_mesh(num_devices: int | None = None, axis_name: str = POP_AXIS_NAME, devices=None) -> Mesh:
    """A one-dimensional mesh over the first ``num_devices`` devices.

    Args:
      num_devices: how many devices to use; ``None`` uses all of
        ``jax.devices()`` (every process's devices under ``jax.distributed``).
      axis_name: the name of the mesh axis, ``'POP'`` by default.
      devices: an explicit device list, instead of ``jax.devices()``.

    Returns:
      A ``jax.sharding.Mesh`` with the single axis ``axis_name``.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    if not isinstance(num_devices, int | np.integer):
        raise ValueError(f"num_devices must be a count or None (all devices), got {num_devices!r}.")
    if not 1 <= num_devices <= len(devices):
        raise ValueError(
            f"num_devices={num_devices} but {len(devices)} device(s) are available. "
            "On the CPU, call evorl_pop.use_all_cores() or "
            "evorl_pop.run.processes.set_host_devices(N) before JAX starts."
        )
    return Mesh(np.asarray(devices[:num_devices]), (axis_name,))


def check_pop_axis(mesh: Mesh) -> Mesh:
    """``mesh`` itself, or a ValueError when it has no ``'POP'`` axis to shard a population."""
    if POP_AXIS_NAME not in mesh.axis_names:
        raise ValueError(
            f"The mesh has axes {tuple(mesh.axis_names)}; a population is sharded over an axis "
            f"named {POP_AXIS_NAME!r}. Build it with evorl_pop.make_mesh(n)."
        )
    return mesh


def padded_size(size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``size``."""
    return -(-size // multiple) * multiple


def pad_to_multiple(tree, multiple: int, axis: int = 0):
    """Pads the leading axis of every leaf to a multiple of ``multiple``.

    Padded rows repeat the first row, so they hold valid values (no NaN
    sneaks in), and must be masked out of every statistic.

    Args:
      tree: a pytree of arrays sharing the length of ``axis``.
      multiple: e.g. the number of devices of the population axis.
      axis: the axis to pad.

    Returns:
      ``(padded_tree, mask)`` where ``mask`` is a boolean vector that is
        ``True`` for real rows.
    """
    size = jax.tree.leaves(tree)[0].shape[axis]
    total = padded_size(size, multiple)

    def pad(x):
        if total == size:
            return x
        fill = jnp.repeat(jnp.take(x, jnp.array([0]), axis=axis), total - size, axis=axis)
        return jnp.concatenate([x, fill], axis=axis)

    return jax.tree.map(pad, tree), jnp.arange(total) < size


# --- the sign convention and failed evaluations --------------------------------------


def to_minimization(score, maximize):
    """Task score -> evosax fitness (lower is better): the one place signs flip.

    Tasks report scores in their own units (returns maximised, losses
    minimised); evosax minimises. ``maximize`` is one bool, or one per objective
    (a tuple, the last axis of ``score``) for a task with several objectives.
    """
    if isinstance(maximize, tuple):
        return jnp.where(jnp.asarray(maximize), -score, score)
    return -score if maximize else score


def num_objectives(task) -> int:
    """How many objectives ``task`` scores (1 unless it is a
    :class:`~evorl_pop.core.interfaces.MultiObjective` task)."""
    return int(task.num_objectives) if isinstance(task, MultiObjective) else 1


def _per_candidate(flags):
    """``flags`` of shape ``(n, *objectives)`` reduced to ``(n,)``: any objective's."""
    return flags if flags.ndim == 1 else jnp.any(flags, axis=tuple(range(1, flags.ndim)))


def _rows(vector, like):
    """A ``(n,)`` vector shaped to broadcast against the rows of ``like``."""
    return vector.reshape(vector.shape + (1,) * (like.ndim - 1))


def worst_for_nonfinite(fitness):
    """Replaces NaN / inf fitness (minimisation convention) by just-worse-than-worst.

    Every non-finite entry gets the next float above the worst finite fitness,
    so it ranks last without turning means or weighted sums into NaN. If no
    entry is finite, all become the largest finite float: the generation ranks
    as a tie (nothing to learn from it) and cannot enter a best-so-far archive.

    With several objectives (``fitness`` of shape ``(n, k)``), a candidate with
    any non-finite objective failed: each of its objectives becomes
    just-worse-than-worst of that objective's column, so every finite
    candidate dominates it.

    Args:
      fitness: a fitness vector, lower is better (or a ``(n, k)`` matrix).

    Returns:
      ``(clean_fitness, num_nonfinite)``: failed candidates counted once each.
    """
    finite = _rows(~_per_candidate(~jnp.isfinite(fitness)), fitness)
    worst = jnp.max(jnp.where(finite, fitness, -jnp.inf), axis=0)
    largest = jnp.finfo(jnp.result_type(fitness, jnp.float32)).max
    penalty = jnp.where(jnp.any(finite, axis=0), jnp.nextafter(worst, jnp.inf), largest)
    return jnp.where(finite, fitness, penalty), jnp.sum(_per_candidate(~finite))


# --- statistics of an evaluated population ------------------------------------------


@flax.struct.dataclass
class Summary:
    """Global statistics of one evaluated population, in the task's units.

    With ``k`` objectives, ``scores`` is ``(padded_pop, k)`` and each statistic
    has one entry per objective (shape ``(k,)``); ``maximize`` is then a tuple.
    """

    scores: jax.Array  # (padded_pop,) every candidate's score, global order
    best: jax.Array
    worst: jax.Array
    mean: jax.Array  # over finite scores only; NaN when none is finite
    std: jax.Array  # likewise
    num_nonfinite: jax.Array  # int32, candidates with a non-finite score
    info: Any  # the candidates' EvalInfo, summed over the real ones
    maximize: Any = flax.struct.field(pytree_node=False, default=True)  # bool or tuple

    def fitness(self, size: int) -> jax.Array:
        """evosax fitness (minimised) of the ``size`` real candidates, non-finite made worst."""
        return worst_for_nonfinite(to_minimization(self.scores[:size], self.maximize))[0]

    def best_index(self, size: int) -> tuple[jax.Array, jax.Array]:
        """The best of the ``size`` real candidates (one objective), finite fitness only.

        Returns:
          ``(index, fitness)``: the first candidate of lowest finite fitness (evosax's
            minimisation convention) and that fitness; ``(0, inf)`` when none is finite,
            so a generation that failed whole cannot enter a best-so-far archive.
        """
        fitness = to_minimization(self.scores[:size], self.maximize)
        archive = jnp.where(jnp.isfinite(fitness), fitness, jnp.inf)
        index = jnp.argmin(archive)
        return index, archive[index]

    def metrics(self) -> dict[str, jax.Array]:
        """The population statistics every algorithm reports, as metrics.

        With several objectives, ``fitness_best_<i>`` (and mean, worst, std) for
        objective ``i`` from 0, and ``fitness_best`` ... those of objective 0.
        """
        stats = {"best": self.best, "mean": self.mean, "worst": self.worst, "std": self.std}
        metrics = {f"fitness_{name}": value for name, value in stats.items()}
        if self.best.ndim:  # one column per objective
            metrics = {name: value[0] for name, value in metrics.items()}
            for i in range(self.best.shape[0]):
                metrics.update({f"fitness_{name}_{i}": value[i] for name, value in stats.items()})
        return {
            **metrics,
            "num_nonfinite": self.num_nonfinite,
            "env_steps": self.info.steps,
            "episodes": self.info.episodes,
        }


def summarize(scores, info, mask, maximize: bool, axis_name: str | None = POP_AXIS_NAME):
    """Global statistics of a sharded population; call inside the shard.

    Padded slots (``mask`` False) never reach extremes, means or counts;
    NaN / inf scores are counted and left out of extremes and means. With no
    finite score at all, mean and std are NaN (a 0.0 would read as a result).

    With several objectives (``scores`` of shape ``(local_pop, k)``), each
    statistic is per objective, and a candidate with any non-finite objective
    counts once in ``num_nonfinite``.

    Args:
      scores: this device's scores, shape ``(local_pop,)`` (or ``(local_pop, k)``).
      info: this device's per-candidate info pytree (leading axis local_pop).
      mask: ``True`` for real candidates.
      maximize: whether higher scores are better (a tuple: per objective).
      axis_name: the population axis (``None`` when unsharded).

    Returns:
      A :class:`Summary`, identical on every device.
    """
    finite = jnp.isfinite(scores) & _rows(mask, scores)
    failed = mask & _per_candidate(~jnp.isfinite(scores))

    def masked(x):  # the real candidates' sum of an info leaf
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.sum(jnp.where(m, x, jnp.zeros_like(x)), axis=0)

    # one psum for the counts and every info leaf
    local = (jnp.sum(finite, axis=0), jnp.sum(failed))
    (count, num_nonfinite), info = psum((local, jax.tree.map(masked, info)), axis_name)
    hi = pmax(jnp.max(jnp.where(finite, scores, -jnp.inf), axis=0), axis_name)
    lo = pmin(jnp.min(jnp.where(finite, scores, jnp.inf), axis=0), axis_name)
    gathered = all_gather(scores, axis_name, tiled=True, to="invarying")
    # mean and std from the gathered scores: a psum of partial sums rounds by device count
    everywhere = all_gather(finite, axis_name, tiled=True, to="invarying")
    gathered, everywhere = jax.lax.optimization_barrier((gathered, everywhere))
    denom = jnp.maximum(count, 1).astype(jnp.result_type(scores, jnp.float32))
    mean = jnp.sum(jnp.where(everywhere, gathered, 0.0), axis=0) / denom
    var = jnp.sum(jnp.where(everywhere, (gathered - mean) ** 2, 0.0), axis=0) / denom
    none_finite = count == 0
    if isinstance(maximize, tuple):  # per objective
        up = jnp.asarray(maximize)
        best, worst = jnp.where(up, hi, lo), jnp.where(up, lo, hi)
    else:
        best, worst = (hi, lo) if maximize else (lo, hi)
    return Summary(
        scores=gathered,
        best=best,
        worst=worst,
        mean=jnp.where(none_finite, jnp.nan, mean),
        std=jnp.where(none_finite, jnp.nan, jnp.sqrt(var)),
        num_nonfinite=num_nonfinite.astype(jnp.int32),
        info=info,
        maximize=maximize,
    )


def evaluate(fn, candidates, key, mesh: Mesh, maximize: bool, eval_mode: str = "vmap"):
    """Evaluates a population sharded over the ``POP`` axis of ``mesh``: the one evaluator.

    The population is padded to a multiple of the device count (padded
    candidates repeat candidate 0 and are masked out of every statistic);
    candidate ``i`` is evaluated with ``fold_in(key, i)``, so nothing depends
    on the device count.

    Args:
      fn: ``fn(candidate, key) -> (score, info, out)``: a score in the task's
        units (shape ``(k,)`` for a task with ``k`` objectives), an
        :class:`~evorl_pop.base.EvalInfo`, and whatever else each candidate
        returns (``None``, transitions, a trained learner).
      candidates: a pytree whose leaves lead with the population axis.
      key: the evaluation's key.
      mesh: a mesh with a ``'POP'`` axis.
      maximize: whether higher scores are better (a tuple: per objective).
      eval_mode: ``'vmap'`` evaluates each device's slice vectorised, ``'map'``
        one candidate at a time (lower memory), ``'batch'`` with one call of
        ``fn(slice, keys)`` on the device's whole slice (``fn`` vectorised by hand).

    Returns:
      ``(summary, outs)``: the :class:`Summary` (replicated), and the ``out``
        of every candidate, padded and sharded ``P('POP')``.
    """
    candidates, mask = pad_to_multiple(candidates, mesh.shape[POP_AXIS_NAME])
    ids = jnp.arange(mask.shape[0], dtype=jnp.int32)
    # Evaluation has no collectives, so replication checks have nothing to
    # verify; they would only reject simulators whose scan carries start
    # from constants (check_vma=False). The collectives below are checked.
    batch = eval_mode == "batch"  # fn takes the device's whole slice and its keys
    shmap = jax.shard_map if batch else shmap_vmap if eval_mode == "vmap" else shmap_map
    fold = jax.vmap(jax.random.fold_in, (None, 0)) if batch else jax.random.fold_in
    scores, info, outs = shmap(
        lambda c, i: fn(c, fold(key, i)),
        mesh=mesh,
        in_specs=(POP, POP),
        out_specs=POP,
        check_vma=False,
    )(candidates, ids)
    summary = jax.shard_map(
        functools.partial(summarize, maximize=maximize),
        mesh=mesh,
        in_specs=(POP, POP, POP),
        out_specs=P(),
    )(scores, info, mask)
    return summary, outs


def _median(x):
    """``jnp.median`` of a finite vector by partial selection: half of a sort.

    XLA's CPU sort costs more than a ``top_k`` of half the entries; halving both
    middle values before adding keeps the largest floats from overflowing.
    """
    n = x.shape[0]
    lowest = -jax.lax.top_k(-x, n // 2 + 1)[0]  # ascending: the n // 2 + 1 smallest
    return lowest[-1] if n % 2 else lowest[-2] / 2 + lowest[-1] / 2
