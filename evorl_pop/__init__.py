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

Importing ``evorl_pop`` starts no JAX backend, so the device count and the
precision can still be set (:func:`use_all_cores`); the names below that need
JAX's backend are imported when first used.
"""

from evorl_pop import distributed
from evorl_pop.run.processes import set_precision, use_all_cores, use_compilation_cache

__version__ = "0.1.0"

_LAZY = {
    "make_mesh": "evorl_pop.core.engine",
    "pad_to_multiple": "evorl_pop.core.engine",
    "train": "evorl_pop.run.shell",
    "resume": "evorl_pop.run.shell",
}


def __getattr__(name: str):
    if name in _LAZY:  # evosax and gymnax start JAX's backend when imported
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'evorl_pop' has no attribute {name!r}")


__all__ = [
    "distributed",
    "make_mesh",
    "pad_to_multiple",
    "resume",
    "set_precision",
    "train",
    "use_all_cores",
    "use_compilation_cache",
]
