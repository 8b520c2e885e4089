"""The configuration of the multi-objective algorithms (NSGA-II, and NSGA-III's, which
extends it): the problem, the variation operators and the front's measures."""

from __future__ import annotations

import dataclasses

from evorl_pop.base import ConfigError, check_config
from evorl_pop.tasks.multiobjective import MO_PREFIX
from evorl_pop.tasks.settings import TaskSettings


@dataclasses.dataclass(frozen=True)
class NSGA2Config(TaskSettings):
    """Configuration of an NSGA-II run. Every field can be overridden.

    The task's fields are the task settings block's
    (:class:`~evorl_pop.tasks.settings.TaskSettings`): a multi-objective problem
    (``mo/zdt1`` .. ``mo/zdt4``, ``mo/zdt6``, ``mo/dtlz1`` .. ``mo/dtlz7``,
    ``mo/wfg1`` .. ``mo/wfg9``), a
    multi-objective brax task (``mo/halfcheetah``, ``mo/hopper``, ``mo/hopper3``,
    ``mo/ant``), or any task of ``es`` (one objective); ``num_dims``: the variables
    (``None``: the problem's default; 10 for a black-box function); ``backend``:
    ``None``, spring where the task has it.

    Attributes:
      population_size: members kept, and offspring made, each generation.
      num_objectives: DTLZ and WFG problems: the objectives (``None``: 3).
      bounds: ``[lower, upper]`` of every variable (``None``: the problem's box,
        ``[-10, 10]`` for a task without one, such as a policy's weights).
      crossover_prob: SBX: the probability that a pair of parents crosses (0.9:
        Deb et al. 2002's NSGA-II experiments, and pymoo's ``SBX``).
      eta_crossover: SBX's distribution index, larger: children nearer their
        parents (15: pymoo's ``NSGA2`` default; Deb et al. 2002 used 20).
      mutation_prob: polynomial mutation's probability per variable (``None``:
        1 / num_dims, Deb et al. 2002).
      eta_mutation: polynomial mutation's distribution index (20: Deb et al. 2002,
        pymoo).
      mutation_child_prob: the probability that a child is mutated at all (then each
        variable with ``mutation_prob``; 1.0: every child, Deb et al. 2002).
      ref_point: the hypervolume's reference point, in the task's units, one
        value per objective (``None``: the problem's; no hypervolume for a task
        without one).
      measures: compute the front's hypervolume, IGD and IGD+ every generation
        (false: only its size, for timing the search alone).
    """

    task: str = "mo/zdt1"
    num_dims: int | None = None
    backend: str | None = None
    population_size: int = 100
    num_objectives: int | None = None
    bounds: tuple[float, ...] | None = None
    crossover_prob: float = 0.9
    eta_crossover: float = 15.0
    mutation_prob: float | None = None
    eta_mutation: float = 20.0
    mutation_child_prob: float = 1.0
    ref_point: tuple[float, ...] | None = None
    measures: bool = True

    TASK_KINDS = ("blackbox", "env", "mo")

    @property
    def multi_objective(self) -> bool:
        """Whether ``task`` names a multi-objective problem (``mo/<problem>``)."""
        return self.task.startswith(MO_PREFIX)

    def validate(self) -> None:
        """Raises a :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        self.check_task()
        check_config(
            self,
            least={
                "population_size": 2,
                "num_objectives": 1,
                "eta_crossover": 0,
                "eta_mutation": 0,
            },
        )
        for name in ("crossover_prob", "mutation_prob", "mutation_child_prob"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {value}.")
        if self.bounds is not None and (
            len(self.bounds) != 2 or not self.bounds[0] < self.bounds[1]
        ):
            raise ConfigError(f"bounds must be [lower, upper], lower < upper; got {self.bounds}.")
        if self.multi_objective:
            try:
                task = self.make_task()
            except ValueError as err:
                raise ConfigError(f"task: {err}") from None
        else:
            if self.num_objectives not in (None, 1):
                raise ConfigError(
                    f"num_objectives: {self.task!r} has one objective; the multi-objective "
                    f"problems are {MO_PREFIX}<problem> (mo/zdt1, mo/dtlz2, ...)."
                )
            task = None
        k = task.num_objectives if task is not None else 1
        if self.ref_point is not None and len(self.ref_point) != k:
            raise ConfigError(
                f"ref_point has {len(self.ref_point)} value(s); {self.task} has {k} objective(s)."
            )

    def make_task(self, **extra):
        """The task ``task`` names, with this config's settings (a multi-objective
        problem's ``num_objectives`` among them)."""
        if self.multi_objective:
            extra = {"num_objectives": self.num_objectives, **extra}
        return super().make_task(**extra)
