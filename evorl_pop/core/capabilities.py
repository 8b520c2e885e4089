"""What the run layer reads of an algorithm's config and of the algorithm it builds,
beyond :class:`~evorl_pop.core.interfaces.Algorithm`: each a protocol checked with
``isinstance`` (the memory check, the devices a run takes, the run folder's name,
the replicas' labels, what ``evorl-pop render`` replays)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax

if TYPE_CHECKING:
    from evorl_pop.core.interfaces import Task


@runtime_checkable
class OnTask(Protocol):
    """An algorithm config whose run is on a task named by ``task`` (a registered name,
    ``gym:<id>``, ``brax/<env>``, ...)."""

    task: str


@runtime_checkable
class Populated(Protocol):
    """An algorithm config with a population of ``population_size`` candidates (the memory
    check and the devices a run takes count them)."""

    population_size: int


@runtime_checkable
class NamesStrategy(Protocol):
    """An algorithm config that names its evolution strategy (``strategy: 'Open_ES'``)."""

    strategy: str


@runtime_checkable
class VectorEnvs(Protocol):
    """An algorithm config whose ``gym:`` tasks step ``'sync'`` (in the process) or
    ``'async'`` (a worker process per episode)."""

    vector: str


@runtime_checkable
class Replicated(Protocol):
    """An algorithm that runs replicas in one program (seeds, a sweep's settings:
    :mod:`evorl_pop.run.replicas`)."""

    #: Each replica's labels (``metrics.csv``'s columns): its seed, its swept values.
    labels: list[dict]


@runtime_checkable
class SearchesTask(Protocol):
    """An algorithm that searches a task's flat candidates (the engine: ES and the hybrids
    on it), reporting one solution of it."""

    task: Task

    def mean_solution(self, state: Any) -> jax.Array:
        """The solution ``eval_return`` reports."""


@runtime_checkable
class ReportsReturn(Protocol):
    """An algorithm whose metrics report ``eval_return``: the evaluation behind it, so that
    ``evorl-pop render`` replays its episodes."""

    def evaluation(self, key: jax.Array, state: Any) -> tuple[jax.Array, int]:
        """``(key, episodes)`` of the evaluation ``eval_return`` reports in the generation
        whose key is ``key`` and which ended in ``state``."""


@runtime_checkable
class EvaluatesReturn(Protocol):
    """An algorithm whose ``eval_return`` comes from its own evaluation path (the task's),
    not a plain rollout of its :class:`~evorl_pop.core.interfaces.Acts` policy."""

    def evaluate_return(self, state: Any, key: jax.Array, episodes: int) -> jax.Array:
        """The mean return over ``episodes`` episodes of the policy ``state`` holds, as
        ``eval_return`` computes it (jittable; ``episodes`` static)."""


@runtime_checkable
class RenamesSettings(Protocol):
    """An algorithm config some of whose settings moved: configs written before (files,
    ``--set``, run folders) are read with each old key at its new place."""

    #: Each old key to its new place, dotted where nested (``es_sigma`` -> ``es.sigma``).
    RENAMED: dict[str, str]


@runtime_checkable
class Pooled(Protocol):
    """An environment family whose tasks step one simulator pool that the whole compiled
    program shares (EnvPool's): its environments cannot restart one lane at a time with a
    key of their own (so no learner lanes), and a program holds one run of it (so no
    replicas of seeds or a sweep in one program)."""

    #: True: the family's tasks share one pool per program.
    pooled: bool
