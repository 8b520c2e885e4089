"""Start-up of ``evorl-pop train`` with an empty and with a filled compilation cache.

    python benchmarks/bench_startup.py [--only pendulum,breakout,hopper] [--reps 1]

Each row runs one short ``evorl-pop train`` (a fresh process: imports, tracing,
compiling, a few generations) three ways, side by side in one run: without
the compilation cache (``EVORL_POP_COMPILATION_CACHE=off``), with an empty
cache (the first run of a program, which also writes it), and with the cache
that run filled (a rerun, a resume, another seed). It prints the wall time of
each process and the ratio of the cold start to the warm one, and checks that
the three runs wrote the same metrics (all but the wall time). Times are the
best of ``--reps``; a cold cache is emptied before each repetition.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOBS = {
    "pendulum": ["--task", "Pendulum-v1", "--pop", "256", "-g", "10"],
    "breakout": ["--task", "Breakout-MinAtar", "--pop", "64", "-g", "4", "--chunk", "2",
                 "--set", "episode_length=200"],
    "hopper": ["--task", "brax/hopper", "--pop", "64", "-g", "4", "--chunk", "2",
               "--set", "episode_length=1000"],
}  # fmt: skip


def train(job, cache, out):
    """Seconds of one ``evorl-pop train`` process, and its metrics rows but the wall time."""
    env = {**os.environ, "EVORL_POP_COMPILATION_CACHE": str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    argv = [sys.executable, "-m", "evorl_pop.cli", "train", *job, "--devices", "1", "-q",
            "--no-figure", "--out", str(out)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(job)} failed:\n{done.stderr[-3000:]}")
    lines = (out / "metrics.csv").read_text().splitlines()
    return seconds, [line.split(",")[:2] + line.split(",")[3:] for line in lines]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(JOBS), help="rows, comma-separated")
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    print("| job | no cache (s) | empty cache (s) | filled cache (s) | empty / filled |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in args.only.split(","):
            best = {"off": [], "empty": [], "filled": []}
            rows = []
            for rep in range(args.reps):
                cache = tmp / f"cache-{name}-{rep}"
                for kind in best:
                    where = "off" if kind == "off" else cache
                    seconds, metrics = train(JOBS[name], where, tmp / f"{name}-{kind}-{rep}")
                    best[kind].append(seconds)
                    rows.append(metrics)
                shutil.rmtree(cache)
            same = all(r == rows[0] for r in rows)
            off, empty, filled = (min(best[k]) for k in ("off", "empty", "filled"))
            print(
                f"| {name} | {off:.1f} | {empty:.1f} | {filled:.1f} | {empty / filled:.2f}x"
                f"{'' if same else ' (metrics differ!)'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
