"""evorl_pop: neuroevolution populations sharded over JAX device meshes."""

from evorl_pop import distributed
from evorl_pop.backend import use_all_cores, use_compilation_cache
from evorl_pop.mesh import make_mesh, pad_to_multiple

__version__ = "0.1.0"

__all__ = ["distributed", "make_mesh", "pad_to_multiple", "use_all_cores", "use_compilation_cache"]
