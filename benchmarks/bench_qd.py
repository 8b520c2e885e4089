"""MAP-Elites: the archive's memory per device, and evaluations per second.

    python benchmarks/bench_qd.py [--cells 65536] [--no-arm]
        [--walker2d --seeds 5 --generations 100 [--qdax-python PATH]
         [--fusion-emitters-off] [--ceiling]]

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
per seed after ``--generations``, and evaluations per second.

``--qdax-python PATH``: the same run with QDax 0.5.0's own MAP-Elites, side by side,
at equal evaluations (the initial batch and ``--generations`` batches of 100), each
seed in a subprocess of that Python: QDax's ``create_default_brax_task_components``
(its ``walker2d_uni``, the spring backend), ``compute_cvt_centroids``, a
``MixingEmitter`` of ``isoline_variation`` only and ``default_qd_metrics`` with its
reward offset. QDax pins other versions of jax and brax than this project, so it
lives in a virtual environment of its own::

    python3.11 -m venv /work/qdax-venv
    /work/qdax-venv/bin/pip install qdax==0.5.0 jax==0.5.3 brax==0.12.3 \
        flax==0.10.6 tensorflow-probability==0.25

then ``--qdax-python /work/qdax-venv/bin/python``. Each side's seed runs in a process
of its own. ``--fusion-emitters-off``: every side also runs with
``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false``, seed by seed beside the default.
``--ceiling``: beside each seed, brax's walker2d step alone (:data:`CEILING_SCRIPT`, a
batch of 100 episodes of 100 steps, no policy or archive) in this project's Python and
QDax's: the evaluations per second neither MAP-Elites can pass on that stack.

QDax starts every episode from one fixed initial state (its ``deterministic``
default); evorl_pop resets each candidate's episode from its own key.
"""

import argparse
import json
import os
import subprocess
import sys
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

#: XLA's CPU code generation without its fusion emitters (docs/benchmarks/bench-qd.md
#: measures what it changes for brax's spring step).
NO_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"

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


#: QDax's side of the walker2d comparison, run by ``--qdax-python``: arguments seed,
#: generations, batch, episode length, cells, CVT samples, generations per chunk; prints
#: one JSON line.
QDAX_SCRIPT = """
import functools, json, sys, time
import jax
import jax.numpy as jnp
import qdax.tasks.brax.v2 as environments
from qdax.core.containers.mapelites_repertoire import compute_cvt_centroids
from qdax.core.emitters.mutation_operators import isoline_variation
from qdax.core.emitters.standard_emitters import MixingEmitter
from qdax.core.map_elites import MAPElites
from qdax.tasks.brax.v2.env_creators import create_default_brax_task_components
from qdax.utils.metrics import default_qd_metrics

seed, generations, batch, episode, cells, samples, chunk = map(int, sys.argv[1:8])
task = "walker2d_uni"
keys = jax.random.split(jax.random.key(seed), 5)
env, policy, scoring_fn = create_default_brax_task_components(
    task, keys[0], episode_length=episode
)
observations = jnp.zeros((batch, env.observation_size))
params = jax.vmap(policy.init)(jax.random.split(keys[1], batch), observations)
variation = functools.partial(isoline_variation, iso_sigma=0.005, line_sigma=0.05)
emitter = MixingEmitter(
    mutation_fn=None, variation_fn=variation, variation_percentage=1.0, batch_size=batch
)
offset = environments.reward_offset[task] * episode
me = MAPElites(
    scoring_function=scoring_fn,
    emitter=emitter,
    metrics_function=functools.partial(default_qd_metrics, qd_offset=offset),
)
centroids = compute_cvt_centroids(
    num_descriptors=env.descriptor_length, num_init_cvt_samples=samples,
    num_centroids=cells, minval=0.0, maxval=1.0, key=keys[2],
)
repertoire, emitter_state, _ = me.init(params, centroids, keys[3])
many = jax.jit(lambda c: jax.lax.scan(me.scan_update, c, None, length=chunk))
carry, metrics = jax.block_until_ready(many((repertoire, emitter_state, keys[4])))
start = time.perf_counter()
rounds = max(generations // chunk - 1, 1)
for _ in range(rounds):
    carry, metrics = jax.block_until_ready(many(carry))
elapsed = time.perf_counter() - start
print(json.dumps({
    "qd_score": float(metrics["qd_score"][-1]),
    "coverage": float(metrics["coverage"][-1]) / 100,
    "evaluations_per_s": rounds * chunk * batch / elapsed,
}))
"""


#: The physics alone, run by ``--ceiling`` in each side's Python: brax's walker2d (spring)
#: reset and stepped 100 times for a batch of 100 with a fixed open-loop action, no
#: policy, archive or descriptor; prints the environment steps per second, after
#: compiling, over 5 batches.
CEILING_SCRIPT = """
import json, time
import jax
import jax.numpy as jnp
from brax import envs

env = envs.get_environment("walker2d", backend="spring")
batch, steps = 100, 100


def episodes(keys):
    state = jax.vmap(env.reset)(keys)

    def body(state, t):
        action = jnp.broadcast_to(0.5 * jnp.tanh(jnp.sin(t + jnp.arange(6.0))), (batch, 6))
        state = jax.vmap(env.step)(state, action)
        return state, state.reward

    return jax.lax.scan(body, state, jnp.arange(float(steps)))[1].sum()


run = jax.jit(episodes)
keys = jax.random.split(jax.random.PRNGKey(0), batch)
jax.block_until_ready(run(keys))
start = time.perf_counter()
for _ in range(5):
    jax.block_until_ready(run(keys))
print(json.dumps({"steps_per_s": 5 * batch * steps / (time.perf_counter() - start)}))
"""


def run_ceiling(python: str, flags: str = "") -> float:
    """:data:`CEILING_SCRIPT`'s environment steps per second in a subprocess of ``python``
    with the XLA flags ``flags``."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    out = subprocess.run(
        [python, "-c", CEILING_SCRIPT], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"the physics-only run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["steps_per_s"]


def run_qdax(python: str, seed: int, generations: int, chunk: int = 10, flags: str = "") -> dict:
    """QDax's MAP-Elites on walker2d_uni (:data:`QDAX_SCRIPT`) in a subprocess of
    ``python`` with the XLA flags ``flags`` (one device, as evorl_pop's run here): its
    last QD-score, coverage (a fraction) and evaluations/s."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    args = [seed, generations, 100, 100, 1024, 50_000, chunk]
    out = subprocess.run(
        [python, "-c", QDAX_SCRIPT, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"QDax's run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(name: str, values: list[float], fmt: str) -> str:
    q = np.percentile(values, [0, 50, 100])
    return f"{name} median {q[1]:{fmt}} (range {q[0]:{fmt}} to {q[2]:{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=65_536)
    parser.add_argument("--walker2d", action="store_true")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=100)
    parser.add_argument("--qdax-python", help="a Python with QDax 0.5.0 (see the docstring)")
    parser.add_argument("--no-arm", action="store_true", help="skip the arm's speed")
    parser.add_argument(
        "--fusion-emitters-off",
        action="store_true",
        help=f"also run every side with XLA_FLAGS={NO_FUSION_EMITTERS}",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also time brax's walker2d step alone in each side's Python, seed by seed",
    )
    parser.add_argument("--one-walker2d-seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_walker2d_seed is not None:
        seconds, metrics = run(walker2d_config(), 1, args.generations, seed=args.one_walker2d_seed)
        result = {"qd_score": metrics["qd_score"], "coverage": metrics["coverage"]}
        print(json.dumps({**result, "evaluations_per_s": 100 / seconds}))
        return
    memory(args.cells)
    arm = MapElitesConfig(task="qd/arm", population_size=1024, cells_per_dim=32)
    if not args.no_arm:
        print("qd/arm, batch 1,024, 32 x 32 grid:")
    for n in () if args.no_arm else (1, 2, 4):
        seconds, metrics = run(arm, n, 50)
        print(
            f"  {n} device(s): {1024 / seconds:12,.0f} evaluations/s "
            f"(coverage {metrics['coverage']:.1%} after 50 generations)"
        )
    if not args.walker2d:
        return
    flag_sets = [""]
    if args.fusion_emitters_off:
        flag_sets.append(NO_FUSION_EMITTERS)
    evaluations = 100 * (1 + args.generations)
    print(f"walker2d_uni, {args.generations} generations ({evaluations:,} evaluations):")
    sides = {}
    ceilings = {}
    for seed in range(args.seeds):
        for flags in flag_sets:
            label = " (fusion emitters off)" if flags else ""
            runs = {f"evorl_pop{label}": run_walker2d_seed(sys.executable, seed, args, flags)}
            if args.qdax_python:
                runs[f"QDax 0.5.0{label}"] = run_qdax(
                    args.qdax_python, seed, args.generations, flags=flags
                )
            if args.ceiling:
                pythons = {"this project's JAX": sys.executable, "QDax's JAX": args.qdax_python}
                for stack, python in pythons.items():
                    if python:
                        rate = run_ceiling(python, flags)
                        ceilings.setdefault(f"{stack}{label}", []).append(rate)
                        text = f"{rate:,.0f} steps/s ({rate / 100:,.0f} episodes/s)"
                        print(f"  physics alone, {stack}{label}: {text}", flush=True)
            for side, result in runs.items():
                row = (result["qd_score"], result["coverage"], result["evaluations_per_s"])
                sides.setdefault(side, []).append(row)
                print(
                    f"  {side:34s} seed {seed}: QD-score {row[0]:,.0f}, coverage {row[1]:.1%}, "
                    f"{row[2]:,.0f} evaluations/s",
                    flush=True,
                )
    for stack, rates in ceilings.items():
        print(f"physics alone, {stack}: {_summary('steps/s', rates, ',.0f')}")
    for side, rows in sides.items():
        score, coverage, speed = (list(column) for column in zip(*rows, strict=True))
        print(
            f"{side}: {_summary('QD-score', score, ',.0f')}; "
            f"{_summary('coverage', coverage, '.1%')}; "
            f"{_summary('evaluations/s', speed, ',.0f')}"
        )


def walker2d_config() -> MapElitesConfig:
    """QDax's notebook settings for walker2d_uni (the module docstring)."""
    return MapElitesConfig(
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


def run_walker2d_seed(python: str, seed: int, args, flags: str) -> dict:
    """evorl_pop's MAP-Elites on walker2d_uni for one seed, on one device, in a process
    of its own with the XLA flags ``flags``: its last QD-score, coverage and
    evaluations/s."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    command = [python, __file__, "--one-walker2d-seed", str(seed)]
    command += ["--generations", str(args.generations)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"evorl_pop's run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
