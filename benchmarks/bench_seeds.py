"""Many seeds in one compiled program against one run per seed, side by side.

    python benchmarks/bench_seeds.py [--seeds 8] [--only openes,ppo]

Each case runs twice, as a user would from a shell, with wall time measured around
the commands (process start, compilation and training, everything):

* ``evorl-pop train --seeds N``: the N seeds in one program;
* N separate ``evorl-pop train --seed s`` runs, one after the other.

Each arm starts with an empty compilation cache of its own (the separate runs
then load what the first one compiled, as they would on a user's machine). The
table also checks that seed ``s`` of the multi-seed run ended where its own run
ended (the last generation's mean fitness, to float tolerance) and prints the
final mean fitness over seeds with its standard error.

Cases: OpenES on CartPole-v1 (population 64, 40 generations) and PPO on
CartPole-v1 (the learners guide's command: default settings, 30 generations).
Goal on a 2-core CPU: at least 4x faster for OpenES, 2x for PPO.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from evorl_pop.run import store

CASES = {
    "openes": ["--strategy", "Open_ES", "--task", "CartPole-v1", "--pop", "64", "-g", "40"],
    "ppo": ["-a", "ppo", "--task", "CartPole-v1", "-g", "30"],
}


def train(args: list[str], out: str, cache: str) -> float:
    """Seconds of one ``evorl-pop train`` command, from process start to exit."""
    env = dict(os.environ, EVORL_POP_COMPILATION_CACHE=cache)
    command = [sys.executable, "-m", "evorl_pop.cli", "train", *args, "-q", "--out", out]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds


def last_means(metrics: dict, seeds: int) -> np.ndarray:
    """The last generation's mean fitness of each seed (rows of a multi-seed run)."""
    last = metrics["generation"] == metrics["generation"].max()
    values = metrics["fitness_mean"][last]
    assert len(values) == seeds
    return values


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--only", default=",".join(CASES), help="cases, comma-separated")
    args = parser.parse_args(argv)
    n = args.seeds
    print(f"{os.cpu_count()} cores; {n} seeds; wall time of whole commands, cold caches")
    print(
        f"{'case':8s} {'one program':>12s} {f'{n} runs':>10s} {'speed-up':>9s}  final mean fitness"
    )
    for case in args.only.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            many_dir = os.path.join(tmp, "many")
            many = train([*CASES[case], "--seeds", str(n)], many_dir, os.path.join(tmp, "c1"))
            single, finals = 0.0, []
            for s in range(n):
                out = os.path.join(tmp, f"seed{s}")
                single += train([*CASES[case], "--seed", str(s)], out, os.path.join(tmp, "c2"))
                finals.append(last_means(store.read_metrics(out), 1)[0])
            together = last_means(store.read_metrics(many_dir), n)
        same = np.allclose(together, finals, rtol=1e-4, atol=1e-3)
        error = together.std(ddof=1) / np.sqrt(n)
        print(
            f"{case:8s} {many:11.1f}s {single:9.1f}s {single / many:8.2f}x  "
            f"{together.mean():.1f} ± {error:.1f} (s.e.); each seed as its own run: {same}"
        )


if __name__ == "__main__":
    main()
