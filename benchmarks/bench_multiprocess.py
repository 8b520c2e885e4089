"""Two devices in one process against two processes of one device, side by side.

    python benchmarks/bench_multiprocess.py [--pop 2048] [--gens 40] [--chunk 5] [--reps 1]

Runs the same OpenES job on CartPole-v1 (4-32-2 MLP, 500-step episodes) twice
through ``evorl-pop launch``, one after the other:

1. 1 process x 2 CPU devices (the population axis inside one process);
2. 2 processes x 1 CPU device (jax.distributed over loopback, gloo collectives).

Generations per second are read from each run's ``metrics.csv``: the
cumulative wall time at chunk boundaries, leaving out the first chunk (it
includes compilation). The table shows both rates and their ratio; with
``--reps`` > 1 each layout is launched that many times (alternating) and its
best rate is kept.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = (("1 process x 2 devices", 1, 2), ("2 processes x 1 device", 2, 1))


def generations_per_second(run: Path, chunk: int) -> float:
    """Generations per second after the first (compiling) chunk.

    Args:
      run: a finished run folder.
      chunk: its generations per chunk.

    Returns:
      The rate over chunk-end rows, whose wall times are measured (rows inside
      a chunk share its time out evenly).
    """
    with open(run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["generation"]) % chunk == 0]
    first, last = rows[0], rows[-1]
    gens = int(last["generation"]) - int(first["generation"])
    return gens / (float(last["wall_time"]) - float(first["wall_time"]))


def launch(out: Path, processes: int, devices: int, args) -> float:
    """One launch of the job; returns its generations per second."""
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    launcher = f"launch -n {processes} --devices-per-process {devices} --"
    train = (
        f"train --strategy Open_ES --task CartPole-v1 --pop {args.pop} --generations {args.gens} "
        f"--chunk {args.chunk} --checkpoint-every 0 --seed 0 "
        "--set sigma_init=0.1 --set learning_rate=0.05 -q --no-figure"
    )
    command = [sys.executable, "-m", "evorl_pop.cli", *launcher.split(), *train.split()]
    command += ["--out", str(out)]  # a path may hold spaces
    t0 = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"launch failed ({processes} x {devices}):\n{result.stderr[-3000:]}")
    rate = generations_per_second(out, args.chunk)
    print(
        f"  {processes} process(es) x {devices} device(s): {rate:.2f} gen/s "
        f"(launch to exit {time.perf_counter() - t0:.1f}s)",
        file=sys.stderr,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pop", type=int, default=2048, help="population size (default 2048)")
    parser.add_argument("--gens", type=int, default=40, help="generations per run (default 40)")
    parser.add_argument("--chunk", type=int, default=5, help="generations per chunk (default 5)")
    parser.add_argument("--reps", type=int, default=1, help="launches per layout (default 1)")
    args = parser.parse_args()
    if args.gens < 2 * args.chunk:
        parser.error("--gens must be at least two chunks")
    best = {name: 0.0 for name, _, _ in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name, processes, devices in LAYOUTS:
                out = Path(tmp) / f"{processes}x{devices}-{rep}"
                best[name] = max(best[name], launch(out, processes, devices, args))
    one, two = (best[name] for name, _, _ in LAYOUTS)
    print(
        f"OpenES, CartPole-v1, population {args.pop}, {args.gens} generations, chunk {args.chunk}"
    )
    print()
    print("| layout | generations/s |")
    print("|---|---|")
    for name, _, _ in LAYOUTS:
        print(f"| {name} | {best[name]:.2f} |")
    print(f"| ratio (2 processes / 1 process) | {two / one:.2f} |")


if __name__ == "__main__":
    main()
