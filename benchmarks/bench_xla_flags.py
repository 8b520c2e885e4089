"""XLA:CPU's fusion emitters on and off, in whole ``evorl-pop train`` runs.

    python benchmarks/bench_xla_flags.py [--cases brax,playground,gymnax,ppo]
        [--reps 2] [--generations 8]

Each case is a short whole run of ``evorl-pop train`` in its own process, once
with ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`` and once with an empty
``XLA_FLAGS`` (XLA's default), one device (ES: no evaluation of the mean). A
run's rate is its best generation after the first (which compiles), from
``metrics.csv``'s steps and times. The two runs of a pair follow each other,
their order alternating from one repetition to the next (on a shared machine,
a busy minute then weighs on both); a case's rate is its best over ``--reps``
repetitions.

Prints one row per case: steps per second with the emitters (XLA's default),
without them, and the ratio without / with (above 1: the flag is faster).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

#: The flag measured.
FLAG = "--xla_cpu_use_fusion_emitters=false"

#: Each case: its label and the ``evorl-pop train`` arguments of one run.
CASES = {
    "brax": (
        "OpenES brax/hopper, pop 64, 200 steps",
        "-t brax/hopper -p 64 --set episode_length=200 --set eval_episodes=0",
    ),
    "playground": (
        "OpenES playground/CartpoleBalance, pop 32, 100 steps",
        "-t playground/CartpoleBalance -p 32 --set episode_length=100 --set eval_episodes=0",
    ),
    "gymnax": (
        "OpenES CartPole-v1, pop 256, 500 steps",
        "-t CartPole-v1 -p 256 --set eval_episodes=0",
    ),
    "ppo": ("PPO CartPole-v1, 32 envs x 64 steps", "-a ppo -t CartPole-v1"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="of " + ", ".join(CASES))
    parser.add_argument("--reps", type=int, default=2, help="pairs of runs per case")
    parser.add_argument("--generations", type=int, default=8, help="generations of one run")
    return parser.parse_args(argv)


def run_rate(arguments: str, flag: bool, generations: int) -> float:
    """Environment steps per second of one whole run: its best generation after the first."""
    import numpy as np

    from evorl_pop.run import store

    env = dict(os.environ, XLA_FLAGS=FLAG if flag else "")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        command = [
            *f"train {arguments} -g {generations} --chunk 1 --devices 1".split(),
            *"--no-figure -q --out".split(),
            out,
        ]
        done = subprocess.run(
            [sys.executable, "-m", "evorl_pop", *command], env=env, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        rows = store.read_metrics(out)
    steps = rows["env_steps_gen"][1:]
    wall = np.diff(rows["wall_time"])
    return float(np.max(steps / wall))


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"{'case':54s} {'fusion emitters':>16s} {'flag':>12s} {'ratio':>6s}")
    for case in args.cases.split(","):
        label, arguments = CASES[case]
        best = {False: 0.0, True: 0.0}
        for rep in range(args.reps):
            for flag in (False, True) if rep % 2 == 0 else (True, False):
                best[flag] = max(best[flag], run_rate(arguments, flag, args.generations))
        ratio = best[True] / best[False]
        print(f"{label:54s} {best[False]:16,.0f} {best[True]:12,.0f} {ratio:6.2f}", flush=True)


if __name__ == "__main__":
    main()
