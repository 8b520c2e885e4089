"""The policy an engine's run shows, and the evaluation behind its ``eval_return``.

:class:`EngineActing` gives :class:`~evorl_pop.core.engine.Engine` (ES and the hybrids
on it) :class:`~evorl_pop.core.interfaces.Acts`,
:class:`~evorl_pop.core.capabilities.ReportsReturn` and
:class:`~evorl_pop.core.capabilities.EvaluatesReturn`, for a task on an environment
(:class:`~evorl_pop.core.interfaces.PolicyTask`).
"""

from __future__ import annotations

from typing import Any

import jax

from evorl_pop.core.interfaces import Acting, PolicyTask

#: The report's key in ``jax.random.split(generation_key, 4)`` (the engine's step).
REPORT_KEY = 3


class EngineActing:
    """:meth:`acting`, :meth:`evaluation` and :meth:`evaluate_return` of an engine, from
    its ``task``, ``eval_episodes``, ``mean_solution`` and ``evaluate_solution``."""

    def acting(self, state: Any) -> Acting:
        """The policy of the solution ``eval_return`` reports (the strategy's mean, the
        best so far, a learner's), observations normalised as the task normalises them.

        Raises:
          TypeError: the task is not one of a policy on an environment.
        """
        task = self.task
        if not isinstance(task, PolicyTask):
            raise TypeError(f"the task {task.name!r} has no policy: it is not on an environment.")
        obs_norm = state.task_state if task.normalize_obs else None
        params = task.policy_params(self.mean_solution(state), obs_norm)
        return Acting(task.env, task.policy, params, obs_norm, task.episode_length)

    def evaluation(self, key: jax.Array, state: Any) -> tuple[jax.Array, int]:
        """The generation's report key (the last of ``split(key, 4)``) and ``eval_episodes``."""
        return jax.random.split(key, 4)[REPORT_KEY], self.eval_episodes

    def evaluate_return(self, state: Any, key: jax.Array, episodes: int) -> jax.Array:
        """The task's mean return of :meth:`mean_solution` over ``episodes``, as the
        engine's step reports it (replicated over the mesh)."""
        return self.evaluate_solution(self.mean_solution(state), key, state.task_state, episodes)
