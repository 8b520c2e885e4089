"""Algorithm registry: a name to its config class and algorithm class.

Every algorithm follows one interface: a frozen dataclass config, and a class
``Algorithm(config, mesh=None)`` with ``init(key) -> state`` (a pytree with an
integer ``generation`` field) and a pure ``step(state, key) -> (state,
metrics)``. The command line, configuration files and checkpoints find
algorithms here. Entries are imported lazily, so listing names is cheap; an
algorithm that needs an optional third-party package that is not installed is
unavailable, while an import error inside the project's own code is raised.

Adding an algorithm is one line::

    register("cemrl", "evorl_pop.algorithms.cemrl", "Config", "CEMRL", "CEM-RL ...")
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib


def did_you_mean(value, valid, n: int = 1, cutoff: float = 0.6) -> str:
    """`` Did you mean 'X'?`` naming the ``n`` valid names nearest ``value``, ignoring
    case ('cma_es' finds CMA_ES), or ``''`` when none is near (``difflib``'s ``cutoff``)."""
    lower = {str(v).lower(): v for v in valid}
    close = difflib.get_close_matches(str(value).lower(), list(lower), n=n, cutoff=cutoff)
    return f" Did you mean {', '.join(repr(lower[c]) for c in close)}?" if close else ""


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """Where to find one algorithm.

    Attributes:
      name: the registry name (``'es'``, ``'cemrl'``, ...).
      module: the module that defines it.
      config: the name of its frozen config dataclass in ``module``.
      algorithm: the name of its algorithm class in ``module``.
      description: one line for ``evorl-pop list``.

    A config class may define ``validate()``, raising ``ValueError`` for
    settings that cannot run; the run config calls it.
    """

    name: str
    module: str
    config: str
    algorithm: str
    description: str = ""

    def load(self):
        """Imports the module.

        Returns:
          The imported module.

        Raises:
          ValueError: a third-party package the module needs is not installed.
          ImportError: the project's own code fails to import (a bug, not a missing package).
        """
        try:
            return importlib.import_module(self.module)
        except ImportError as err:
            if not _third_party(err):
                raise
            raise ValueError(
                f"Algorithm {self.name!r} needs the package {err.name!r}, which is not "
                f"installed: pip install {err.name}"
            ) from err

    def missing_package(self) -> str | None:
        """The not-installed third-party package that makes the algorithm unavailable, if any."""
        try:
            self.load()
        except ValueError as err:
            return err.__cause__.name
        return None

    @property
    def config_class(self) -> type:
        """The algorithm's config dataclass."""
        return getattr(self.load(), self.config)

    @property
    def algorithm_class(self) -> type:
        """The algorithm class, ``cls(config, mesh=None)``."""
        return getattr(self.load(), self.algorithm)

    def available(self) -> bool:
        """Whether the algorithm's packages are installed (see :meth:`missing_package`)."""
        return self.missing_package() is None


def _third_party(err: ImportError) -> bool:
    """Whether an import failed for a missing package outside this project."""
    return (
        isinstance(err, ModuleNotFoundError)
        and bool(err.name)
        and (err.name.split(".")[0] not in ("evorl_pop", "algorithms"))
    )


_REGISTRY: dict[str, AlgorithmSpec] = {}


def register(
    name: str,
    module: str,
    config: str,
    algorithm: str,
    description: str = "",
) -> AlgorithmSpec:
    """Registers an algorithm under ``name`` (replacing any earlier entry).

    Args:
      name: the registry name used on the command line and in config files.
      module: the dotted module path, imported on first use.
      config: the config dataclass's name in that module.
      algorithm: the algorithm class's name in that module.
      description: one line for ``evorl-pop list``.

    Returns:
      The new :class:`AlgorithmSpec`.
    """
    spec = AlgorithmSpec(name, module, config, algorithm, description)
    _REGISTRY[name] = spec
    return spec


def names(available_only: bool = True) -> list[str]:
    """Registered algorithm names, sorted.

    Args:
      available_only: leave out algorithms whose third-party packages are missing.

    Returns:
      A sorted list of names.
    """
    return sorted(n for n, s in _REGISTRY.items() if not available_only or s.available())


def specs() -> list[AlgorithmSpec]:
    """Every registered algorithm, available or not, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


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
        hint = did_you_mean(name, _REGISTRY)
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
)
# Hybrid evolutionary RL.
register("cemrl", "evorl_pop.algorithms.cemrl", "Config", "CEMRL", "CEM-RL: CEM + TD3")
register("erl", "evorl_pop.algorithms.erl", "Config", "ERL", "ERL: a GA population + a TD3 learner")
register("pbt", "evorl_pop.algorithms.pbt", "Config", "PBT", "PBT: a population of TD3 learners")
