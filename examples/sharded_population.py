"""Shard a population over the CPU devices and collect its fitness extremes.

python examples/sharded_population.py --devices 4 --pop 1000
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--pop", type=int, default=1000, help="population size")
    parser.add_argument("--dims", type=int, default=10, help="solution dimensions")


# before JAX starts; replaces a count in XLA_FLAGS
args = script.start(__doc__, _arguments, runs=False, devices=4)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from evorl_pop import distributed as dist  # noqa: E402
from evorl_pop import make_mesh, pad_to_multiple  # noqa: E402

mesh = make_mesh(None if args.devices == "auto" else args.devices)
population = 3.0 * jax.random.normal(jax.random.key(0), (args.pop, args.dims))
padded, mask = pad_to_multiple(population, mesh.size)  # any size: pad, then mask


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
    f"{args.pop} candidates on {mesh.size} devices: best {float(best):.3f}, "
    f"worst {float(worst):.3f}, top-3 indices {ranks[:3].tolist()}"
)
