"""Shard a population over the CPU devices and collect its fitness extremes.

python examples/sharded_population.py --devices 4 --pop 1000
"""

import argparse

from evorl_pop import backend

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, default=4, help="simulated CPU devices")
parser.add_argument("--pop", type=int, default=1000, help="population size")
parser.add_argument("--dims", type=int, default=10, help="solution dimensions")
args = parser.parse_args()
backend.set_host_devices(args.devices)  # before JAX starts; replaces a count in XLA_FLAGS

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from evorl_pop import distributed as dist  # noqa: E402
from evorl_pop import make_mesh, pad_to_multiple  # noqa: E402

mesh = make_mesh(args.devices)
population = 3.0 * jax.random.normal(jax.random.key(0), (args.pop, args.dims))
padded, mask = pad_to_multiple(population, args.devices)  # any size: pad, then mask


def sphere(x):
    return jnp.sum(x**2)


fitness = dist.shmap_vmap(sphere, mesh, in_specs=P("POP"), out_specs=P("POP"))(padded)


def extremes(f, valid):
    best = dist.pmin(jnp.min(jnp.where(valid, f, jnp.inf)), "POP")
    worst = dist.pmax(jnp.max(jnp.where(valid, f, -jnp.inf)), "POP")
    return best, worst, dist.all_gather(f, "POP", tiled=True, to="invarying")


best, worst, gathered = jax.shard_map(
    extremes, mesh=mesh, in_specs=(P("POP"), P("POP")), out_specs=(P(), P(), P())
)(fitness, mask)
ranks = jnp.argsort(gathered[: args.pop])
print(
    f"{args.pop} candidates on {args.devices} devices: best {float(best):.3f}, "
    f"worst {float(worst):.3f}, top-3 indices {ranks[:3].tolist()}"
)
