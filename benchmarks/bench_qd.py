"""MAP-Elites: the archive's memory per device, and evaluations per second.

    python benchmarks/bench_qd.py [--cells 65536] [--walker2d --seeds 5 --generations 100]

Memory: an empty archive of ``--cells`` cells for the genotype of QDax's walker2d
policy (an MLP 64 x 64 on walker2d's 17 observations and 6 actions: 5,702 weights),
sharded by cell on 1, 2 and 4 devices: the bytes one device holds, which should be
the whole archive's divided by the devices.

Speed: generations of MAP-Elites on ``qd/arm`` (8 joints, batch 1,024, a 32 x 32
grid) in compiled chunks, after compilation, on 1, 2 and 4 simulated CPU devices of
this machine (they share its cores).

``--walker2d``: MAP-Elites on ``qd/walker2d_uni`` with QDax's notebook settings
(batch 100, 100-step episodes, 1,024 CVT cells from 50,000 samples, iso 0.005 /
line 0.05, MLP 64 x 64, tanh output, brax's spring backend): QD-score and coverage
per seed after ``--generations``, and evaluations per second. (The comparison with
QDax itself, in an environment of its own, is not part of this script.)
"""

import argparse
import os
import time

import numpy as np

os.environ["XLA_FLAGS"] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.mapelites import MapElites, MapElitesConfig  # noqa: E402
from evorl_pop.core.archive import ShardedArchive  # noqa: E402

WALKER_WEIGHTS = 17 * 64 + 64 + 64 * 64 + 64 + 64 * 6 + 6


def memory(cells: int) -> None:
    side = int(round(cells**0.5))
    print(f"an empty archive of {side * side:,} cells x {WALKER_WEIGHTS:,} float32 weights:")
    for n in (1, 2, 4):
        archive = ShardedArchive(make_mesh(n), (0, 0), (1, 1), cells_per_dim=(side, side))
        state = jax.block_until_ready(archive.empty(WALKER_WEIGHTS))
        device = jax.devices()[0]
        held = sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(state)
            for shard in leaf.addressable_shards
            if shard.device == device
        )
        total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
        print(f"  {n} device(s): {held / 2**20:8.1f} MiB on device 0 ({held / total:.3f} of all)")


def run(config: MapElitesConfig, devices: int, generations: int, seed: int = 0, chunk: int = 10):
    """``(seconds per generation after compiling, last metrics)``."""
    me = MapElites(config, mesh=make_mesh(devices))

    @jax.jit
    def many(state, key):
        def body(s, g):
            return me.step(s, jax.random.fold_in(key, g))

        return jax.lax.scan(body, state, state.generation + jax.numpy.arange(chunk))

    state = jax.block_until_ready(jax.jit(me.init)(jax.random.key(seed)))
    state, metrics = jax.block_until_ready(many(state, jax.random.key(seed + 1)))  # compiles
    start = time.perf_counter()
    for _ in range(max(generations // chunk - 1, 1)):
        state, metrics = jax.block_until_ready(many(state, jax.random.key(seed + 1)))
    elapsed = time.perf_counter() - start
    done = max(generations // chunk - 1, 1) * chunk
    return elapsed / done, jax.tree.map(lambda x: float(x[-1]), metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=65_536)
    parser.add_argument("--walker2d", action="store_true")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=100)
    args = parser.parse_args()
    memory(args.cells)
    arm = MapElitesConfig(task="qd/arm", population_size=1024, cells_per_dim=32)
    print("qd/arm, batch 1,024, 32 x 32 grid:")
    for n in (1, 2, 4):
        seconds, metrics = run(arm, n, 50)
        print(
            f"  {n} device(s): {1024 / seconds:12,.0f} evaluations/s "
            f"(coverage {metrics['coverage']:.1%} after 50 generations)"
        )
    if not args.walker2d:
        return
    walker = MapElitesConfig(
        task="qd/walker2d_uni",
        population_size=100,
        episode_length=100,
        archive="cvt",
        num_cells=1024,
        cvt_samples=50_000,
        iso_sigma=0.005,
        line_sigma=0.05,
        hidden_sizes=(64, 64),
    )
    scores, coverages = [], []
    for seed in range(args.seeds):
        seconds, metrics = run(walker, 1, args.generations, seed=seed)
        scores.append(metrics["qd_score"])
        coverages.append(metrics["coverage"])
        print(
            f"  seed {seed}: QD-score {scores[-1]:,.0f}, coverage {coverages[-1]:.1%}, "
            f"{100 / seconds:,.0f} evaluations/s"
        )
    q = np.percentile(scores, [25, 50, 75])
    print(f"walker2d_uni: QD-score median {q[1]:,.0f} (IQR {q[0]:,.0f} to {q[2]:,.0f})")


if __name__ == "__main__":
    main()
