"""Plug-ins: algorithms, strategies, learners, environment families and emitters by name.

Every plug-in registers itself in the file that defines it, at import::

    # my_package/my_algorithm.py
    from evorl_pop import registry

    registry.register_algorithm("my_es", config=Config, algorithm=MyES,
                                description="my ES on a sharded population")

A registry finds an entry in three places, in this order, and only as far as
it must: the project's own plug-in modules (:data:`BUILTIN`, imported lazily:
a module whose last name part is the one asked for first, so ``-a cemrl``
imports ``evorl_pop.algorithms.cemrl`` and nothing else), the modules of the
``evorl_pop.plugins`` entry point group (a user's installed package), and the
modules named with :func:`load_plugins` (``evorl-pop --plugin MODULE``, a
config's ``plugins:``). A built-in module that needs a third-party package
that is not installed makes its entries unavailable, with the package named;
an import error inside the project's own code is raised.

This module imports nothing of evorl_pop but :mod:`evorl_pop.base` and
:mod:`evorl_pop.conformance` (which checks each entry against its protocol as it is
registered), so any layer may register into it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from evorl_pop import conformance
from evorl_pop.base import did_you_mean

T = TypeVar("T")

#: The entry point group whose modules are plug-ins (``pyproject.toml``:
#: ``[project.entry-points."evorl_pop.plugins"]`` ``my_plugin = "my_package.my_module"``).
ENTRY_POINT_GROUP = "evorl_pop.plugins"

#: The project's own plug-in modules, by kind: adding one is one line here.
BUILTIN: dict[str, tuple[str, ...]] = {
    "algorithm": (
        "evorl_pop.algorithms.es",
        "evorl_pop.algorithms.a2c",
        "evorl_pop.algorithms.cemrl",
        "evorl_pop.algorithms.ddpg",
        "evorl_pop.algorithms.dqn",
        "evorl_pop.algorithms.erl",
        "evorl_pop.algorithms.impala",
        "evorl_pop.algorithms.mapelites",
        "evorl_pop.algorithms.moead",
        "evorl_pop.algorithms.nsga2",
        "evorl_pop.algorithms.nsga3",
        "evorl_pop.algorithms.pbt",
        "evorl_pop.algorithms.ppo",
        "evorl_pop.algorithms.rvea",
        "evorl_pop.algorithms.sac",
    ),
    "strategy": ("evorl_pop.algorithms.es", "evorl_pop.algorithms.cma_es"),
    "learner": (
        "evorl_pop.rl.td3",
        "evorl_pop.algorithms.sac",
        "evorl_pop.algorithms.ppo",
        "evorl_pop.algorithms.dqn",
        "evorl_pop.algorithms.ddpg",
        "evorl_pop.algorithms.a2c",
        "evorl_pop.algorithms.impala",
    ),
    "environment family": (
        "evorl_pop.tasks.brax_envs",
        "evorl_pop.tasks.envpool_envs",
        "evorl_pop.tasks.gym_envs",
        "evorl_pop.tasks.gymnax_envs",
        "evorl_pop.tasks.jumanji_envs",
        "evorl_pop.tasks.marl_envs",
        "evorl_pop.tasks.playground_envs",
    ),
    "emitter": ("evorl_pop.algorithms.qd_emitters", "evorl_pop.algorithms.pgame"),
}


def _third_party(err: ImportError) -> bool:
    """Whether an import failed for a missing package outside this project."""
    return (
        isinstance(err, ModuleNotFoundError)
        and bool(err.name)
        and err.name.split(".")[0] not in ("evorl_pop", "algorithms")
    )


class PluginError(ValueError):
    """A plug-in module that cannot be imported, or an unknown or unavailable name."""


# --- what a registered entry must have (evorl_pop.conformance) ------------------------

#: The protocols entries are checked against, by name: :mod:`evorl_pop.core.interfaces`
#: adds its own as it is imported (importing evorl_pop, and so this module, imports it).
PROTOCOLS: dict[str, type] = {}


def _protocol(name: str) -> type:
    return PROTOCOLS[name]


def check_class(where: str, cls: Any, name: str) -> None:
    """Raises a :class:`PluginError` unless ``cls`` is a class with the methods of the
    protocol ``core.interfaces.<name>``; ``where`` names the registration."""
    if not isinstance(cls, type):
        raise PluginError(f"{where}: takes a class that meets core.interfaces.{name}, got {cls!r}")
    protocol = _protocol(name)
    if missing := conformance.lacks(cls, protocol):
        raise PluginError(conformance.lacking(where, cls.__name__, missing, protocol))


def check_built(where: str, entry: Any, name: str, what: str = "") -> Any:
    """Returns ``entry``, an object built from a plug-in, before anything compiles; raises
    a :class:`PluginError` where it lacks a member of the protocol
    ``core.interfaces.<name>`` (attributes set in ``__init__`` included). ``what``
    names it in the message (default: ``the <class> built``)."""
    protocol = _protocol(name)
    if missing := conformance.lacks(entry, protocol):
        what = what or f"the {type(entry).__name__} built"
        raise PluginError(conformance.lacking(where, what, missing, protocol))
    return entry


def _check_settings(where: str, settings: Any, needs: tuple[str, ...]) -> None:
    if problem := conformance.settings_problem(settings, needs):
        raise PluginError(f"{where}: {problem}")


def _check_callable(where: str, what: str, value: Any) -> None:
    if not callable(value):
        raise PluginError(f"{where}: {what} must be callable, got {type(value).__name__}")


_loaded_entry_points = False
#: Modules imported as plug-ins, in order (``--plugin``, configs, entry points).
_plugin_modules: list[str] = []
#: Built-in modules that could not be imported: module name to the missing package.
_unavailable: dict[str, str] = {}


def import_plugin(module: str) -> Any:
    """Imports a plug-in module (it registers what it defines).

    Raises:
      PluginError: the module is not found, naming it; errors raised inside
        the module itself propagate unchanged.
    """
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and module.startswith(err.name):
            raise PluginError(
                f"Cannot import the plug-in module {module!r}: no module named {err.name!r}. "
                "Name an importable module (installed, or on PYTHONPATH)."
            ) from None
        raise
    if module not in _plugin_modules:
        _plugin_modules.append(module)
    return imported


def load_plugins(modules: Iterable[str]) -> None:
    """Imports each plug-in module of ``modules`` (once; see :func:`import_plugin`)."""
    for module in modules:
        import_plugin(module)


def loaded_plugins() -> tuple[str, ...]:
    """The plug-in modules imported so far, in order."""
    return tuple(_plugin_modules)


def entry_point_modules() -> tuple[str, ...]:
    """The modules of the installed ``evorl_pop.plugins`` entry points."""
    return tuple(
        ep.value.split(":")[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )


def load_entry_points() -> None:
    """Imports the modules of the ``evorl_pop.plugins`` entry points (once)."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    load_plugins(entry_point_modules())


def _import_builtin(module: str) -> None:
    if module in _unavailable:
        return
    try:
        importlib.import_module(module)
    except ImportError as err:
        if not _third_party(err):
            raise
        _unavailable[module] = err.name


def unavailable(kind: str) -> dict[str, str]:
    """Built-in modules of ``kind`` that need a package that is not installed: module to package."""
    for module in BUILTIN[kind]:
        _import_builtin(module)
    return {m: p for m, p in _unavailable.items() if m in BUILTIN[kind]}


class Registry(Generic[T]):
    """Entries of one kind by name, filled by the modules that define them.

    Args:
      kind: what the entries are, for messages (``'algorithm'``, ``'strategy'``, ...).
      builtin: the project's own modules that register entries of this kind.
    """

    def __init__(self, kind: str, builtin: tuple[str, ...] = (), plural: str | None = None):
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.builtin = builtin
        self._entries: dict[str, T] = {}
        self._complete = False

    def register(self, name: str, entry: T) -> T:
        """Registers ``entry`` under ``name`` (replacing an earlier one) and returns it."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.kind} is registered under a non-empty name, got {name!r}.")
        self._entries[name] = entry
        return entry

    def _load_all(self) -> None:
        if self._complete:
            return
        for module in self.builtin:
            _import_builtin(module)
        load_entry_points()
        self._complete = True

    def find(self, name: str) -> T | None:
        """The entry ``name``, importing only as many plug-in modules as it takes; ``None``
        when no module registers it."""
        if name in self._entries:
            return self._entries[name]
        for module in self.builtin:  # by convention first: evorl_pop.algorithms.<name>
            if module.rsplit(".", 1)[-1] == name:
                _import_builtin(module)
                if name in self._entries:
                    return self._entries[name]
        self._load_all()
        return self._entries.get(name)

    def get(self, name: str) -> T:
        """The entry ``name``.

        Raises:
          PluginError: an unknown name (with the nearest ones and every valid
            name), or one whose module needs a package that is not installed.
        """
        entry = self.find(name)
        if entry is not None:
            return entry
        for module, package in _unavailable.items():
            if module in self.builtin and module.rsplit(".", 1)[-1] == name:
                raise PluginError(
                    f"The {self.kind} {name!r} needs the package {package!r}, which is not "
                    f"installed: pip install {package}"
                )
        names = self.names()
        hint = did_you_mean(name, names)
        raise PluginError(
            f"Unknown {self.kind} {name!r}.{hint} Valid {self.plural}: {', '.join(names)}. "
            f"A plug-in of your own: --plugin MODULE (or an {ENTRY_POINT_GROUP!r} entry point)."
        )

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def names(self) -> list[str]:
        """Every registered name, sorted (every plug-in module imported first)."""
        self._load_all()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` of every registered entry, sorted by name."""
        return [(name, self._entries[name]) for name in self.names()]


# --- algorithms ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: what the run shell builds from a config.

    Attributes:
      name: the registry name (``'es'``, ``'cemrl'``, ...).
      config_class: its frozen config dataclass, with ``validate()`` raising
        a :class:`~evorl_pop.base.ConfigError` for settings that cannot run.
      algorithm_class: ``algorithm_class(config, mesh=None)``, an
        :class:`~evorl_pop.core.interfaces.Algorithm`.
      description: one line for ``evorl-pop list``.
      module: the module that registered it.
    """

    name: str
    config_class: type
    algorithm_class: type
    description: str = ""
    module: str = ""


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", BUILTIN["algorithm"])


def register_algorithm(
    name: str, config: type, algorithm: type, description: str = ""
) -> AlgorithmSpec:
    """Registers an algorithm: ``algorithm(config_instance, mesh=None)`` builds it.

    Args:
      name: the name on the command line (``-a NAME``) and in config files.
      config: its frozen config dataclass (with ``validate()``).
      algorithm: its class (see :class:`~evorl_pop.core.interfaces.Algorithm`).
      description: one line for ``evorl-pop list``.

    Returns:
      The new :class:`AlgorithmSpec`.

    Raises:
      PluginError: a config that is not a dataclass with ``validate``, or an algorithm
        class that lacks a method of :class:`~evorl_pop.core.interfaces.Algorithm` or
        is not built as ``algorithm(config, mesh=None)``.
    """
    where = f"register_algorithm({name!r})"
    if not isinstance(config, type):
        raise PluginError(f"{where}: config takes the config class, got {config!r}")
    _check_settings(where, config, ("validate",))
    check_class(where, algorithm, "Algorithm")
    try:
        inspect.signature(algorithm).bind(object(), mesh=None)
    except TypeError:
        raise PluginError(
            f"{where}: {algorithm.__name__} is not built as {algorithm.__name__}(config, "
            f"mesh=None) (its signature: {inspect.signature(algorithm)})"
        ) from None
    spec = AlgorithmSpec(name, config, algorithm, description, algorithm.__module__)
    return ALGORITHMS.register(name, spec)


# --- strategies ------------------------------------------------------------------------

#: Strategy classes with evosax's interface, by name (``ESConfig.strategy``).
STRATEGIES: Registry[type] = Registry("strategy", BUILTIN["strategy"], "strategies")


def register_strategy(name: str, cls: type) -> type:
    """Registers a strategy class with evosax's constructor and interface
    (:class:`~evorl_pop.core.interfaces.Strategy`) under ``name``; returns ``cls``.

    Raises:
      PluginError: ``cls`` is not a class, or lacks a method of the protocol.
    """
    check_class(f"register_strategy({name!r})", cls, "Strategy")
    return STRATEGIES.register(name, cls)


def strategy(name: str | None = None) -> Callable[[type], type]:
    """Class decorator: registers the strategy under ``name`` (default: the class's name)."""

    def decorate(cls: type) -> type:
        return register_strategy(name or cls.__name__, cls)

    return decorate


# --- learners ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HybridPart:
    """A learner as the RL part of CEM-RL and ERL: the population's members are its actors,
    trained from the replay buffer their evaluations fill.

    Attributes:
      defaults: its settings in those algorithms' configs, where no field carries its
        name (``learner_settings`` changes them there): a frozen dataclass with
        ``validate()`` and ``batch_size``, the global minibatch that the replay buffer
        must hold and the devices split.
      actor_task: ``actor_task(config, settings)``: the population's
        :class:`~evorl_pop.tasks.control.ControlTask` on ``config.task``, whose policy is
        the learner's actor and whose episodes keep their transitions.
      learner: ``learner(task, config, settings, mesh, num_updates, algorithm)``: the
        :class:`~evorl_pop.core.interfaces.ReplayLearner` beside the population, taking
        ``num_updates`` gradient updates per ``learn`` (``algorithm`` names it in errors).
    """

    defaults: Any
    actor_task: Callable[..., Any]
    learner: Callable[..., Any]

    #: Always: a hybrid's learner learns from the buffer its population fills.
    replay = True


@dataclasses.dataclass(frozen=True)
class MemberPart:
    """A learner as one member of PBT's population of whole learners.

    Attributes:
      defaults: its settings in PBT's config, where no field carries its name.
      member: ``member(settings, config)``: what PBT trains and evaluates on one device
        (:class:`~evorl_pop.algorithms.pbt_members.Member`); ``settings`` take PBT's
        ``task`` and ``episode_length`` where they have those fields.
      searchable: the hyperparameters PBT may search: values a member trains with as
        traced scalars, so a new value never recompiles.
      default_search: ``(name, low, high, log)`` of those PBT searches unless told otherwise.
      losses: the metrics of a member's training that PBT reports, each its mean over
        the interval (NaN before it learns).
      replay: whether the members learn from PBT's own replay buffer (``buffer_capacity``,
        ``learning_starts``), which must then hold one ``batch_size`` of the settings.
    """

    defaults: Any
    member: Callable[..., Any]
    searchable: tuple[str, ...]
    default_search: tuple[tuple[str, float, float, bool], ...] = ()
    losses: tuple[str, ...] = ()
    replay: bool = False


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """One learner: what the algorithms whose config names it in ``learner`` build.

    Attributes:
      hybrid: its part as CEM-RL's and ERL's RL part (``None``: it cannot be one).
      member: its part as a PBT member (``None``: it cannot be one).
      description: one line for ``evorl-pop list``.
    """

    hybrid: HybridPart | None = None
    member: MemberPart | None = None
    description: str = ""


#: Learners by name (``learner:`` of CEM-RL, ERL and PBT; see :func:`register_learner`).
LEARNERS: Registry[LearnerSpec] = Registry("learner", BUILTIN["learner"])


def register_learner(name: str, spec: LearnerSpec) -> LearnerSpec:
    """Registers a learner under ``name`` (``learner=NAME`` in a config); returns ``spec``.

    Args:
      name: the learner's name; a config whose algorithm has a field of that name
        (``td3``, ``sac``, ``ppo``) takes its settings from there, any other from
        the algorithm's ``learner_settings``.
      spec: its :class:`LearnerSpec`.
    """
    where = f"register_learner({name!r})"
    if not isinstance(spec, LearnerSpec):
        raise PluginError(f"{where}: takes a LearnerSpec, got {type(spec).__name__}")
    if spec.hybrid is None and spec.member is None:
        raise PluginError(f"{where}: its LearnerSpec has neither a hybrid nor a member part")
    if (hybrid := spec.hybrid) is not None:
        _check_settings(f"{where} hybrid.defaults", hybrid.defaults, ("validate", "batch_size"))
        _check_callable(where, "hybrid.actor_task", hybrid.actor_task)
        _check_callable(where, "hybrid.learner", hybrid.learner)
        if isinstance(hybrid.learner, type):
            check_class(f"{where} hybrid.learner", hybrid.learner, "ReplayLearner")
    if (member := spec.member) is not None:
        _check_settings(f"{where} member.defaults", member.defaults, ("validate",))
        _check_callable(where, "member.member", member.member)
        unsearchable = [s[0] for s in member.default_search if s[0] not in member.searchable]
        if unsearchable:
            raise PluginError(
                f"{where}: member.default_search names {', '.join(unsearchable)}, "
                f"not in member.searchable ({', '.join(member.searchable)})"
            )
    return LEARNERS.register(name, spec)


def learners_with(part: str) -> list[str]:
    """The names of the learners that have ``part`` (``'hybrid'`` or ``'member'``), sorted."""
    return [name for name, spec in LEARNERS.items() if getattr(spec, part) is not None]


# --- environment families ------------------------------------------------------------------

#: Environment families by name (gymnax, brax, Playground, Gymnasium, ...): who builds an
#: environment name (:func:`evorl_pop.tasks.envs.env_family`).
ENV_FAMILIES: Registry[Any] = Registry(
    "environment family", BUILTIN["environment family"], "environment families"
)


def register_env_family(name: str, family: Any) -> Any:
    """Registers an environment family under ``name``; returns it.

    Args:
      name: the family's name (``'brax'``, ``'gym'``, ...), for ``evorl-pop list``.
      family: an :class:`~evorl_pop.core.interfaces.EnvFamily` (the environments
        whose names it :meth:`~evorl_pop.core.interfaces.EnvFamily.owns`).

    Returns:
      ``family``.

    Raises:
      PluginError: ``family`` is a class (register an instance) or lacks a member of
        the protocol.
    """
    where = f"register_env_family({name!r})"
    if isinstance(family, type):
        raise PluginError(
            f"{where}: takes an instance, got the class {family.__name__} "
            f"(register_env_family({name!r}, {family.__name__}()))"
        )
    return ENV_FAMILIES.register(
        name, check_built(where, family, "EnvFamily", type(family).__name__)
    )


# --- quality-diversity emitters ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EmitterSpec:
    """One MAP-Elites emitter: what ``emitter: NAME`` builds.

    Attributes:
      name: the registry name (``'isoline'``, ``'es'``, ...).
      emitter_class: ``emitter_class(archive, task, config, settings)``, an
        :class:`~evorl_pop.core.interfaces.Emitter`.
      settings: its frozen settings dataclass, whose defaults are the emitter's and whose
        ``validate(config)`` raises a :class:`~evorl_pop.base.ConfigError` for settings
        that cannot run with the MAP-Elites ``config``; ``None``: no settings.
      description: one line for messages and listings.
      module: the module that registered it.
    """

    name: str
    emitter_class: type
    settings: type | None = None
    description: str = ""
    module: str = ""


#: Emitters by name (``emitter:`` of MAP-Elites; see :func:`register_emitter`).
EMITTERS: Registry[EmitterSpec] = Registry("emitter", BUILTIN["emitter"])


def register_emitter(
    name: str, emitter: type, settings: type | None = None, description: str = ""
) -> EmitterSpec:
    """Registers a MAP-Elites emitter under ``name`` (``emitter=NAME`` in a config).

    Args:
      name: the emitter's name. A MAP-Elites config field of that name (``es``,
        ``cma_me``, ``pga_me``) holds a built-in emitter's settings; any other emitter's
        are its ``settings`` defaults changed by ``emitter_settings``.
      emitter: its class (see :class:`~evorl_pop.core.interfaces.Emitter`).
      settings: its frozen settings dataclass with ``validate(config)``, or ``None``.
      description: one line.

    Returns:
      The new :class:`EmitterSpec`.

    Raises:
      PluginError: an emitter class without a member the interface declares (with
        ``collect``: also ``observe``), or settings that are not a frozen dataclass with
        ``validate``, in one line naming what is missing.
    """
    where = f"register_emitter({name!r})"
    check_class(where, emitter, "Emitter")
    if getattr(emitter, "collect", False):  # the class's flag; a built one's is checked again
        check_class(where, emitter, "ObservesEpisodes")
    if settings is not None:
        _check_settings(where, settings, ("validate",))
        if not settings.__dataclass_params__.frozen:
            raise PluginError(f"{where}: {settings.__name__} must be a frozen dataclass")
    spec = EmitterSpec(name, emitter, settings, description, emitter.__module__)
    return EMITTERS.register(name, spec)
