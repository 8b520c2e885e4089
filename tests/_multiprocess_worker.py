"""One process of a 2-process x 2-device jax.distributed run (see test_multiprocess)."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, num_processes, process_id = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(
    f"127.0.0.1:{port}", num_processes, process_id, initialization_timeout=60
)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from evorl_pop import distributed, make_mesh  # noqa: E402

mesh = make_mesh()  # every process's devices
fitness_np = np.arange(jax.device_count() * 3, dtype=np.float32)[::-1].copy()
fitness = jax.make_array_from_callback(
    fitness_np.shape, NamedSharding(mesh, P("POP")), lambda idx: fitness_np[idx]
)


def local(f):
    return (
        distributed.pmax(f.max(), "POP"),
        distributed.pmin(f.min(), "POP"),
        distributed.all_gather(f, "POP", tiled=True, to="invarying"),
    )


hi, lo, gathered = jax.jit(
    jax.shard_map(local, mesh=mesh, in_specs=P("POP"), out_specs=(P(), P(), P()))
)(fitness)
doubled = distributed.shmap_vmap(lambda x: 2 * x, mesh, in_specs=P("POP"), out_specs=P("POP"))(
    fitness
)
print(
    json.dumps(
        {
            "initialized": distributed.is_dist_initialized(),
            "process_id": distributed.get_process_id(),
            "device_count": jax.device_count(),
            "ranks": [
                int(s.data[0])
                for s in sorted(
                    distributed.get_global_ranks().addressable_shards,
                    key=lambda s: s.index[0].start,
                )
            ],
            "pmax": float(hi.addressable_data(0)),
            "pmin": float(lo.addressable_data(0)),
            "gathered": np.asarray(gathered.addressable_data(0)).tolist(),
            "doubled_local": sorted(float(v) for s in doubled.addressable_shards for v in s.data),
        }
    ),
    flush=True,
)
jax.distributed.shutdown()
