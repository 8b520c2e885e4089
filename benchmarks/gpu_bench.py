"""Engine against the rollout ceilings on a GPU, populations 4,096 to 65,536.

    bash benchmarks/gpu_bench.sh            # from the repository root
    python benchmarks/gpu_bench.py [--pops 4096 16384 65536] [--reps 5] [--gens 3]

For CartPole-v1 (4-32-2 MLP, 500 steps) and Pendulum-v1 (3-16-16-1 ReLU MLP,
200 steps) and each population: the ceiling of :mod:`ceilings` (the plain
``jit(vmap(scan(step_env)))`` rollout, median seconds) and whole OpenES
generations of the engine on one device (median seconds per generation), with
the environment steps per second each achieved. The engine stops an episode's
steps once it has ended; the ceiling scans every step. Then, if
``benchmarks/bench_brax.py`` exists, its run at population 4,096. A failing row
prints its error and the table goes on.
"""

import argparse
import importlib.util
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEEDED = ("jax", "evosax", "gymnax", "flax", "optax")
MISSING = [m for m in NEEDED if not importlib.util.find_spec(m)]
if MISSING:
    sys.exit(f"gpu_bench: missing Python packages {MISSING}; put them on PYTHONPATH (wheels).")

import jax  # noqa: E402

sys.path.insert(0, str(HERE))
import ceilings  # noqa: E402

import evorl_pop  # noqa: E402

# Not installed (PYTHONPATH=. alone): `algorithms/` installs as evorl_pop.algorithms
if importlib.util.find_spec("evorl_pop.algorithms") is None:
    evorl_pop.__path__.append(str(HERE.parent))

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import make_strategy  # noqa: E402
from evorl_pop.core.engine import Engine  # noqa: E402
from evorl_pop.run.shell import chunk_fn  # noqa: E402
from evorl_pop.tasks import ControlTask  # noqa: E402

JOBS = {
    "CartPole-v1": (ceilings.cartpole_rollout, ceilings.CARTPOLE_STEPS, {"hidden_sizes": (32,)}),
    "Pendulum-v1": (
        ceilings.pendulum_rollout,
        ceilings.PENDULUM_STEPS,
        {"hidden_sizes": (16, 16), "activation": "relu"},
    ),
}


def median_seconds(fn, args, reps):
    out = jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], out


def row(env, pop, reps, gens):
    ceiling, steps, task_kwargs = JOBS[env]
    run, params, key = ceiling(pop)
    t_ceil, _ = median_seconds(run, (params, key), reps)
    task = ControlTask(env, **task_kwargs)
    strategy, es_params = make_strategy("Open_ES", pop, task.num_dims, sigma_init=0.1)
    engine = Engine(strategy, task, make_mesh(1), es_params)
    state = engine.init(jax.random.key(0))
    run = chunk_fn(engine, gens)
    generations = lambda s, k: run(s, k)[1]["env_steps"]  # noqa: E731
    t_run, env_steps = median_seconds(generations, (state, jax.random.key(1)), reps)
    t_gen = t_run / gens
    engine_rate = int(env_steps.sum()) / t_run  # steps actually taken
    return [
        env,
        f"{pop:,}",
        f"{1e3 * t_ceil:.2f}",
        f"{pop * steps / t_ceil / 1e6:,.1f}",
        f"{1e3 * t_gen:.2f}",
        f"{engine_rate / 1e6:,.1f}",
        f"{t_gen / t_ceil:.3f}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pops", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gens", type=int, default=3, help="generations per timed call")
    parser.add_argument("--brax-timeout", type=int, default=240)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, devices: {jax.devices()}", flush=True)
    header = [
        "task",
        "population",
        "ceiling ms",
        "ceiling M steps/s",
        "engine ms/gen",
        "engine M steps/s",
        "engine / ceiling",
    ]
    rows = []
    for env in JOBS:
        for pop in args.pops:
            print(f"... {env} population {pop}", flush=True)
            try:
                rows.append(row(env, pop, args.reps, args.gens))
            except Exception as e:  # one failing row must not lose the others
                traceback.print_exc()
                rows.append([env, f"{pop:,}", f"failed: {type(e).__name__}", "", "", "", ""])
            print("    " + "  ".join(rows[-1][2:]), flush=True)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print(f"\nOpenES generations on one {jax.default_backend()} device against the rollout ceiling")
    for r in [header, *rows]:
        print("  " + "  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)))
    sys.stdout.flush()
    brax = HERE / "bench_brax.py"
    if brax.exists():
        print(f"\n{brax.name} --pop 4096 --cores 0", flush=True)
        try:
            # the same import fix as above, then the script as __main__
            boot = (
                "import importlib.util, runpy, sys; import evorl_pop\n"
                "if importlib.util.find_spec('evorl_pop.algorithms') is None:\n"
                f"    evorl_pop.__path__.append({str(HERE.parent)!r})\n"
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
            )
            cmd = [sys.executable, "-c", boot, str(brax), "--pop", "4096", "--cores", "0"]
            subprocess.run(cmd, timeout=args.brax_timeout, check=True)
        except (subprocess.SubprocessError, OSError) as e:
            print(f"{brax.name} failed: {e}", flush=True)
    else:
        print("\n(no benchmarks/bench_brax.py: brax row skipped)", flush=True)


if __name__ == "__main__":
    main()
