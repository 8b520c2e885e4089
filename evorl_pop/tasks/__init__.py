"""Tasks: what a candidate solution (a flat parameter vector) is scored on.

A task turns one flat vector into a score and a little bookkeeping:

* ``evaluate(solution, key, task_state) -> (score, info)`` for one candidate
  (``info``: an :class:`~evorl_pop.base.EvalInfo`),
* ``init_solution(key)`` the starting point, ``init_state()`` any state shared
  by all candidates (the running observation normaliser, a BBOB instance),
* ``update_state(task_state, info_total)`` folds in ``info`` summed over the
  whole population (with ``psum``: statistics merged across devices),
* ``maximize``: whether higher scores are better (returns) or lower (losses),
* ``num_dims`` and ``name``.

Scores stay in the task's own units everywhere in logs and plots; the single
conversion to evosax's minimisation is :func:`evorl_pop.core.engine.to_minimization`.

Modules: :mod:`~evorl_pop.tasks.blackbox` (test functions, BBOB, Python
objectives), :mod:`~evorl_pop.tasks.envs` (environments by name, through the
environment families: :mod:`~evorl_pop.tasks.gymnax_envs`,
:mod:`~evorl_pop.tasks.brax_envs` and :mod:`~evorl_pop.tasks.playground_envs`
in JAX, :mod:`~evorl_pop.tasks.gym_envs` for Gymnasium environments stepped on
the host, :class:`~evorl_pop.tasks.control.JaxEnvFamily` for a family of your own),
:mod:`~evorl_pop.tasks.control` (the control task),
:mod:`~evorl_pop.tasks.policies` (the networks),
:mod:`~evorl_pop.tasks.rollout` (every episode), :mod:`~evorl_pop.tasks.obs_norm`
and :mod:`~evorl_pop.tasks.vbn` (observation and layer normalisation),
:mod:`~evorl_pop.tasks.drawing` (episodes drawn, for ``evorl-pop render``),
:mod:`~evorl_pop.tasks.qd` (tasks with behaviour descriptors, for quality-diversity).
"""

from evorl_pop import registry
from evorl_pop.base import did_you_mean
from evorl_pop.tasks.blackbox import (
    BBOB_PREFIX,
    BLACKBOX_FUNCTIONS,
    BLACKBOX_TASKS,
    BBOBTask,
    BlackBoxTask,
    PythonTask,
)
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.envs import env_family, env_names, make_env
from evorl_pop.tasks.multiobjective import MO_PREFIX, MOTask, make_mo_task
from evorl_pop.tasks.qd import QD_TASKS, make_qd_task


def task_names() -> tuple[str, ...]:
    """Every task name :func:`make_task` accepts: black-box functions, BBOB, environments
    (besides the names of families that list none, such as any ``gym:<id>`` of
    Gymnasium's registry)."""
    return (*BLACKBOX_TASKS, *env_names())


def make_task(name: str, **kwargs):
    """A task by name: a black-box function, a BBOB function or an environment.

    Args:
      name: ``'sphere'``, ``'ellipsoid'``, ``'rosenbrock'``, ``'rastrigin'``, a
        BBOB function ``'bbob/<name>'`` (``'bbob/ellipsoidal_rotated'``, see
        :data:`evorl_pop.tasks.blackbox.BBOB_FUNCTIONS`), a multi-objective
        problem ``'mo/<problem>'`` (:class:`MOTask`: ``num_dims``,
        ``num_objectives``), an environment such as
        ``'CartPole-v1'``, ``'brax/hopper'`` or ``'playground/CheetahRun'``, a
        Gymnasium environment ``'gym:<id>'`` (``'gym:LunarLander-v3'``), or a name
        of a plug-in's environment family.
      **kwargs: passed to :class:`BlackBoxTask`, :class:`BBOBTask`
        (``num_dims``, ``instance``, ``x0``), or the environment family's
        ``make_task`` (:class:`ControlTask`'s arguments and the family's own
        settings, such as brax's ``backend``; Gymnasium's
        :class:`~evorl_pop.tasks.gym_envs.GymTask`).

    Returns:
      The task.
    """
    if name in BLACKBOX_FUNCTIONS:
        return BlackBoxTask(function=name, **kwargs)
    if name.startswith(BBOB_PREFIX):
        return BBOBTask(function=name[len(BBOB_PREFIX) :], **kwargs)
    if name.startswith(MO_PREFIX):  # several objectives: for nsga2 and nsga3
        return make_mo_task(name, **kwargs)
    family = env_family(name)
    if family is not None:
        where = f"{type(family).__name__}.make_task({name!r})"
        return registry.check_built(where, family.make_task(name, **kwargs), "Task")
    names = task_names()
    hint = did_you_mean(name, names, 3)
    unlisted = "".join(
        f", or {family.pattern}"
        for _, family in registry.ENV_FAMILIES.items()
        if not family.names()
    )
    raise ValueError(f"Unknown task {name!r}.{hint} Valid: {', '.join(sorted(names))}{unlisted}.")


__all__ = [
    "BBOBTask",
    "BlackBoxTask",
    "ControlTask",
    "MOTask",
    "PythonTask",
    "QD_TASKS",
    "env_family",
    "make_env",
    "make_qd_task",
    "make_task",
    "task_names",
]
