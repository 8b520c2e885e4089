"""Distributed primitives for populations and data-parallel gradients.

Populations are sharded over the mesh axis :data:`POP_AXIS_NAME`; gradient
minibatches over :data:`DP_AXIS_NAME`. Every collective accepts
``axis_name=None`` (``dp_axis_name=None``) and then does nothing, so one code
path serves a single device and a mesh.
"""

from evorl_pop.distributed.comm import (
    all_gather,
    get_global_ranks,
    get_process_id,
    is_dist_initialized,
    pmax,
    pmean,
    pmin,
    psum,
    split_key_to_devices,
)
from evorl_pop.distributed.gradients import agent_gradient_update, gradient_update
from evorl_pop.distributed.sharding import shmap_map, shmap_vmap, tree_device_put

#: Mesh axis name for data-parallel gradient updates.
DP_AXIS_NAME = "DP"
#: Mesh axis name along which populations are sharded.
POP_AXIS_NAME = "POP"

__all__ = [
    "DP_AXIS_NAME",
    "POP_AXIS_NAME",
    "agent_gradient_update",
    "all_gather",
    "get_global_ranks",
    "get_process_id",
    "gradient_update",
    "is_dist_initialized",
    "pmax",
    "pmean",
    "pmin",
    "psum",
    "shmap_map",
    "shmap_vmap",
    "split_key_to_devices",
    "tree_device_put",
]
