"""Quality-diversity tasks: a score and a behaviour descriptor per candidate.

Each task here is a :class:`~evorl_pop.core.interfaces.Task` and a
:class:`~evorl_pop.core.interfaces.Describes`: ``evaluate_descriptor`` returns
``(score, info, descriptor)``, and the task states its descriptor's size and
bounds, the bounds of its genotype and the offset of its QD-score. Both are
maximised black-box problems, fast enough for tests:

* ``qd/arm``: a planar arm of ``num_dims`` joints (links of length ``1 / num_dims``);
  genotype ``x`` in ``[0, 1]^n``, the joint angles ``2 pi x - pi``; fitness
  ``-Var(x)`` (the variance of the normalised angles: straight arms are best),
  descriptor the end effector's ``(x, y)`` in ``[0, 1]^2``; QD offset ``0.25``
  (the variance of numbers in ``[0, 1]`` is at most ``1/4``).
* ``qd/rastrigin_proj``: ``-rastrigin(x)`` on ``[-5.12, 5.12]^n``, descriptor the
  means of the first and second half of ``x`` (a projection), in
  ``[-5.12, 5.12]^2``; QD offset ``40.36 * n`` (Rastrigin's largest value per
  coordinate on the box is about 40.35).

A user's own task becomes a quality-diversity task by adding these attributes and
``evaluate_descriptor``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from evorl_pop.base import EvalInfo, did_you_mean, float_dtype
from evorl_pop.tasks.blackbox import rastrigin

#: The prefix of the quality-diversity tasks' names.
QD_PREFIX = "qd/"


def _no_info() -> EvalInfo:
    return EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))


@dataclasses.dataclass(frozen=True)
class _QDTask:
    """What the black-box QD tasks share: a genotype box, no task state."""

    num_dims: int = 8
    maximize = True
    descriptor_size = 2

    def __post_init__(self):
        if self.num_dims < 2:
            raise ValueError(f"num_dims must be at least 2, got {self.num_dims}.")

    def init_solution(self, key):
        del key
        low, high = self.genotype_bounds
        return jnp.full((self.num_dims,), (low + high) / 2, float_dtype())

    def init_state(self):
        return ()

    def update_state(self, task_state, info_total):
        return task_state

    def evaluate(self, solution, key, task_state):
        score, info, _ = self.evaluate_descriptor(solution, key, task_state)
        return score, info


@dataclasses.dataclass(frozen=True)
class ArmTask(_QDTask):
    """A planar arm: reach every point with the straightest arm (see the module docstring)."""

    genotype_bounds = (0.0, 1.0)
    descriptor_bounds = ((0.0, 0.0), (1.0, 1.0))
    qd_offset = 0.25

    @property
    def name(self) -> str:
        return f"{QD_PREFIX}arm-{self.num_dims}d"

    def evaluate_descriptor(self, solution, key, task_state):
        del key, task_state
        x = jnp.clip(solution, 0.0, 1.0)
        angles = jnp.cumsum(2 * jnp.pi * x - jnp.pi)
        n = self.num_dims
        end = jnp.stack([jnp.sum(jnp.cos(angles)), jnp.sum(jnp.sin(angles))]) / (2 * n) + 0.5
        return -jnp.var(x), _no_info(), end


@dataclasses.dataclass(frozen=True)
class RastriginProjTask(_QDTask):
    """Rastrigin with the means of the two halves of the genotype as its descriptor."""

    genotype_bounds = (-5.12, 5.12)
    descriptor_bounds = ((-5.12, -5.12), (5.12, 5.12))

    @property
    def name(self) -> str:
        return f"{QD_PREFIX}rastrigin_proj-{self.num_dims}d"

    @property
    def qd_offset(self) -> float:
        return 40.36 * self.num_dims

    def evaluate_descriptor(self, solution, key, task_state):
        del key, task_state
        x = jnp.clip(solution, -5.12, 5.12)
        half = self.num_dims // 2
        descriptor = jnp.stack([jnp.mean(x[:half]), jnp.mean(x[half:])])
        return -rastrigin(x), _no_info(), descriptor


#: Every quality-diversity task by name.
QD_TASKS = {f"{QD_PREFIX}arm": ArmTask, f"{QD_PREFIX}rastrigin_proj": RastriginProjTask}


def make_qd_task(name: str, num_dims: int = 8):
    """The quality-diversity task ``name`` (one of :data:`QD_TASKS`) in ``num_dims`` dimensions.

    Raises:
      ValueError: an unknown name (naming the valid ones), or fewer than 2 dimensions.
    """
    if name not in QD_TASKS:
        hint = did_you_mean(name, QD_TASKS)
        raise ValueError(f"Unknown QD task {name!r}.{hint} Valid: {', '.join(QD_TASKS)}.")
    return QD_TASKS[name](num_dims=num_dims)
