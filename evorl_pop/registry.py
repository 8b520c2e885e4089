"""Algorithm registry: a name to its config class and algorithm class.

Every algorithm follows one interface: a frozen dataclass config, and a class
``Algorithm(config, mesh=None)`` with ``init(key) -> state`` (a pytree with an
integer ``generation`` field) and a pure ``step(state, key) -> (state,
metrics)``. The command line, configuration files and checkpoints find
algorithms here. Entries are imported lazily, so listing names is cheap and an
algorithm whose module is absent (or fails to import) is simply unavailable.

Adding an algorithm is one line::

    register("cemrl", "evorl_pop.algorithms.cemrl", "Config", "CEMRL", "CEM-RL ...")
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """Where to find one algorithm.

    Attributes:
      name: the registry name (``'es'``, ``'cemrl'``, ...).
      module: the module that defines it.
      config: the name of its frozen config dataclass in ``module``.
      algorithm: the name of its algorithm class in ``module``.
      description: one line for ``evorl-pop list``.
      validate: an optional ``'package.module:function'`` path of a function
        that takes a config and raises ``ValueError`` for impossible settings.
    """

    name: str
    module: str
    config: str
    algorithm: str
    description: str = ""
    validate: str | None = None

    def load(self):
        """Imports the module.

        Returns:
          The imported module.

        Raises:
          ValueError: the module cannot be imported (the algorithm is unavailable).
        """
        try:
            return importlib.import_module(self.module)
        except ImportError as err:
            raise ValueError(
                f"Algorithm {self.name!r} is registered but its module {self.module!r} "
                f"cannot be imported: {err}"
            ) from err

    @property
    def config_class(self) -> type:
        """The algorithm's config dataclass."""
        return getattr(self.load(), self.config)

    @property
    def algorithm_class(self) -> type:
        """The algorithm class, ``cls(config, mesh=None)``."""
        return getattr(self.load(), self.algorithm)

    @property
    def validator(self) -> Callable | None:
        """The validation function named by ``validate``, if any."""
        if self.validate is None:
            return None
        module, _, function = self.validate.partition(":")
        return getattr(importlib.import_module(module), function)

    def available(self) -> bool:
        """Whether the module imports and defines both classes."""
        try:
            module = self.load()
        except ValueError:
            return False
        return hasattr(module, self.config) and hasattr(module, self.algorithm)


_REGISTRY: dict[str, AlgorithmSpec] = {}


def register(
    name: str,
    module: str,
    config: str,
    algorithm: str,
    description: str = "",
    validate: str | None = None,
) -> AlgorithmSpec:
    """Registers an algorithm under ``name`` (replacing any earlier entry).

    Args:
      name: the registry name used on the command line and in config files.
      module: the dotted module path, imported on first use.
      config: the config dataclass's name in that module.
      algorithm: the algorithm class's name in that module.
      description: one line for ``evorl-pop list``.
      validate: optional ``'package.module:function'`` path of a
        ``validate(config)`` function that raises ``ValueError``.

    Returns:
      The new :class:`AlgorithmSpec`.
    """
    spec = AlgorithmSpec(name, module, config, algorithm, description, validate)
    _REGISTRY[name] = spec
    return spec


def names(available_only: bool = True) -> list[str]:
    """Registered algorithm names, sorted.

    Args:
      available_only: leave out algorithms whose module does not import.

    Returns:
      A sorted list of names.
    """
    return sorted(n for n, s in _REGISTRY.items() if not available_only or s.available())


def get(name: str) -> AlgorithmSpec:
    """The spec of an available algorithm.

    Args:
      name: a registry name.

    Returns:
      Its :class:`AlgorithmSpec`.

    Raises:
      ValueError: an unknown or unavailable name, with the nearest valid one.
    """
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown algorithm {name!r}.{hint} Available: {', '.join(names())}.")
    spec = _REGISTRY[name]
    spec.load()  # raises a clear error when the module is missing
    return spec


register(
    "es",
    "evorl_pop.algorithms.es",
    "ESConfig",
    "ES",
    "any evosax evolution strategy on a black-box function or a gymnax task",
    validate="evorl_pop.config:validate_es_config",
)
# Hybrid evolutionary RL: listed once their modules exist.
register("cemrl", "evorl_pop.algorithms.cemrl", "Config", "CEMRL", "CEM-RL: CEM + TD3")
register("erl", "evorl_pop.algorithms.erl", "Config", "ERL", "ERL: a GA population + a TD3 learner")
register("pbt", "evorl_pop.algorithms.pbt", "Config", "PBT", "PBT: a population of TD3 learners")
