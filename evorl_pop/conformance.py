"""What a plug-in's entry lacks of the protocol it meets (:mod:`evorl_pop.core.interfaces`).

:mod:`evorl_pop.registry` checks every entry as it is registered, and again the
objects built from it before anything compiles, so that a plug-in missing a method
is refused in one line naming it. This module imports nothing of evorl_pop: the
protocols come as arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def declared(protocol: type) -> tuple[str, ...]:
    """The members ``protocol`` declares, in its order: its annotated attributes, then
    its methods and properties."""
    members = vars(protocol)
    attributes = tuple(members.get("__annotations__", {}))
    methods = tuple(
        key
        for key, value in members.items()
        if not key.startswith("_") and (callable(value) or isinstance(value, property))
    )
    return attributes + methods


def _annotated(cls: type, member: str) -> bool:
    return any(member in vars(k).get("__annotations__", {}) for k in cls.__mro__)


def _population_based(entry: Any) -> bool:
    """Whether ``entry`` is one of evosax's population-based strategies, which report
    their best candidate and have no mean (no ``get_mean``)."""
    from evosax.algorithms.population_based.base import (  # noqa: PLC0415
        PopulationBasedAlgorithm,
    )

    cls = entry if isinstance(entry, type) else type(entry)
    return issubclass(cls, PopulationBasedAlgorithm)


#: Members a protocol declares that some of its implementations may lack: protocol name
#: to member to the test of an entry that needs none.
EXEMPT = {"Strategy": {"get_mean": _population_based}}


def lacks(entry: Any, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``entry`` lacks.

    A class is checked for the protocol's methods and properties (one it sets in
    ``__init__`` counts where the class annotates it); the protocol's attributes,
    which an instance may set in ``__init__``, are checked on an instance only.
    """
    attributes = vars(protocol).get("__annotations__", {})
    exempt_when = EXEMPT.get(protocol.__name__, {})
    missing = []
    for member in declared(protocol):
        if not isinstance(entry, type):
            present = hasattr(entry, member)
        elif member in attributes:
            continue  # set in __init__: checked once built
        else:
            present = hasattr(entry, member) or _annotated(entry, member)
        exempt = exempt_when.get(member)
        if not present and not (exempt and exempt(entry)):
            missing.append(member)
    return missing


def lacking(where: str, what: str, missing: list[str], protocol: type) -> str:
    """One line: ``where: what lacks a, b (core.interfaces.<Protocol> declares ...)``
    (the protocol named by its module under evorl_pop)."""
    declares = ", ".join(declared(protocol))
    lacks_ = ", ".join(missing)
    named = f"{protocol.__module__.removeprefix('evorl_pop.')}.{protocol.__name__}"
    return f"{where}: {what} lacks {lacks_} ({named} declares {declares})"


def settings_problem(settings: Any, needs: tuple[str, ...]) -> str:
    """What keeps ``settings`` (a config class or instance) from being a dataclass with
    the members ``needs``, or ``''``."""
    what = settings.__name__ if isinstance(settings, type) else type(settings).__name__
    problems = [] if dataclasses.is_dataclass(settings) else ["is not a dataclass"]
    if lacking_members := [member for member in needs if not hasattr(settings, member)]:
        problems.append(f"lacks {', '.join(lacking_members)}")
    if not problems:
        return ""
    return f"{what} {' and '.join(problems)} (settings are a dataclass with {', '.join(needs)})"
