"""The core: the sharded engine (one evaluator, one population loop), the mesh,
padding, population statistics and the sign convention.

The core imports only :mod:`evorl_pop.distributed` and :mod:`evorl_pop.base`.
"""

from evorl_pop.core.engine import (
    Engine,
    State,
    Summary,
    evaluate,
    make_mesh,
    pad_to_multiple,
    summarize,
    to_minimization,
    worst_for_nonfinite,
)

__all__ = [
    "Engine",
    "State",
    "Summary",
    "evaluate",
    "make_mesh",
    "pad_to_multiple",
    "summarize",
    "to_minimization",
    "worst_for_nonfinite",
]
