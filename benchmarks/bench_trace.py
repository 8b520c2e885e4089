"""Start-up cost of a population's evaluation: the vectorised path against the batch one.

    python benchmarks/bench_trace.py [--tasks brax/hopper,playground/HopperHop] [--reps 2]

The engine evaluates a device's slice of a control task with
``ControlTask.evaluate_batch``: its episodes are traced once. ``jax.vmap`` of
``ControlTask.evaluate`` (the path before it, still what a ``vmap`` of one
candidate's evaluation runs) traces them twice: the episode function is a
``custom_vmap``, whose unbatched form is traced before its batching rule.
For a physics simulator each trace is seconds. Side by side in one process,
interleaved, best of ``--reps``: the seconds to trace (``lower``) and to
compile the evaluation of a population of 8 (episodes of 10 steps), and
whether the two paths score it the same. The compilation cache is off.
"""

import argparse
import os
import time

os.environ.setdefault("EVORL_POP_COMPILATION_CACHE", "off")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.core.engine import evaluate  # noqa: E402
from evorl_pop.tasks import ControlTask  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--tasks", default="CartPole-v1,brax/hopper,playground/HopperHop")
    parser.add_argument("--pop", type=int, default=8)
    parser.add_argument("--episode-length", type=int, default=10)
    parser.add_argument("--reps", type=int, default=2)
    return parser.parse_args(argv)


def timed(task, mode, pop, key):
    """(trace seconds, compile seconds, scores) of one fresh evaluation program."""
    mesh, state = make_mesh(1), task.init_state()

    def one(x, k):
        if mode == "batch":
            return (*task.evaluate_batch(x, k, state), None)
        return (*task.evaluate(x, k, state), None)

    program = jax.jit(lambda p, k: evaluate(one, p, k, mesh, True, mode)[0].fitness(len(p)))
    start = time.perf_counter()
    lowered = program.lower(pop, key)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    return traced - start, done - traced, np.asarray(compiled(pop, key))


def main(args):
    print(f"{'task':22s} {'path':6s} {'trace s':>8s} {'compile s':>10s} {'total s':>8s}  ratio")
    for name in args.tasks.split(","):
        task = ControlTask(name, (16,), episode_length=args.episode_length)
        pop = 0.1 * jax.random.normal(jax.random.key(0), (args.pop, task.num_dims))
        key = jax.random.key(1)
        best, scores = {}, {}
        for _ in range(args.reps):
            for mode in ("vmap", "batch"):  # interleaved: the machine's load hits both
                jax.clear_caches()
                trace, compile_, scores[mode] = timed(task, mode, pop, key)
                old = best.get(mode, (float("inf"),))
                best[mode] = min(old, (trace + compile_, trace, compile_))
        for mode in ("vmap", "batch"):
            total, trace, compile_ = best[mode]
            ratio = f"{best['vmap'][0] / total:5.2f}x" if mode == "batch" else ""
            print(f"{name:22s} {mode:6s} {trace:8.1f} {compile_:10.1f} {total:8.1f}  {ratio}")
        same = np.array_equal(scores["vmap"], scores["batch"])
        print(f"{'':22s} same scores: {same}")
        if not same:
            raise SystemExit(f"{name}: the two paths scored the population differently")


if __name__ == "__main__":
    main(parse_args())
