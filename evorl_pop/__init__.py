"""evorl_pop: neuroevolution populations sharded over JAX device meshes.

The package, layer by layer (imports only go down)::

    run         the command line, the run shell (train, resume), configs,
                the run folder and its recorders, plots, processes, launcher
    algorithms  ES, pycma's CMA-ES, restarts, CEM-RL, ERL, PBT (top-level
                folder, installed as evorl_pop.algorithms)
    rl          learners' pieces: the replay buffer, TD3 over a 'DP' axis
    tasks       black-box functions, environments, rollouts, policies
    core        the sharded engine: one evaluator, one population loop
    distributed the collectives, sharded maps and gradient updates
    base        errors, the evaluation record, the float type, atomic writes

Importing ``evorl_pop`` imports its layers when they are first used, and
(but the algorithms, which import evosax's) starts no JAX backend, so the device
count and the precision can still be set (:func:`use_all_cores`) after it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, imported when first used
    from evorl_pop import base, core, distributed, rl, run, tasks
    from evorl_pop.base import __version__
    from evorl_pop.core.engine import make_mesh, pad_to_multiple
    from evorl_pop.run.processes import set_precision, use_all_cores, use_compilation_cache
    from evorl_pop.run.shell import resume, train

#: Where each of the package's names lives; a name is imported when first used, so
#: ``evorl-pop`` can take Ctrl-C (:mod:`evorl_pop.__main__`) before JAX is imported.
_WHERE = {
    "base": "evorl_pop.base",
    "core": "evorl_pop.core",
    "distributed": "evorl_pop.distributed",
    "rl": "evorl_pop.rl",
    "run": "evorl_pop.run",
    "tasks": "evorl_pop.tasks",
    "__version__": "evorl_pop.base",
    "make_mesh": "evorl_pop.core.engine",
    "pad_to_multiple": "evorl_pop.core.engine",
    "set_precision": "evorl_pop.run.processes",
    "use_all_cores": "evorl_pop.run.processes",
    "use_compilation_cache": "evorl_pop.run.processes",
    "resume": "evorl_pop.run.shell",
    "train": "evorl_pop.run.shell",
}

__all__ = [
    "__version__",
    "base",
    "core",
    "distributed",
    "make_mesh",
    "pad_to_multiple",
    "resume",
    "rl",
    "run",
    "set_precision",
    "tasks",
    "train",
    "use_all_cores",
    "use_compilation_cache",
]


def __getattr__(name: str):
    """Imports one of the package's names on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'evorl_pop' has no attribute {name!r}")
    module = importlib.import_module(_WHERE[name])
    value = module if module.__name__ == f"evorl_pop.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
