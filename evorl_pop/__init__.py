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

Importing ``evorl_pop`` (its layers but the algorithms, which import evosax's)
starts no JAX backend, so the device count and the precision can still be set
(:func:`use_all_cores`) after it.
"""

from evorl_pop import base, core, distributed, rl, run, tasks
from evorl_pop.base import __version__
from evorl_pop.core.engine import make_mesh, pad_to_multiple
from evorl_pop.run.processes import set_precision, use_all_cores, use_compilation_cache
from evorl_pop.run.shell import resume, train

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
