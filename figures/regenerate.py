"""Regenerates every figure in this folder from the examples.

Each example trains its runs (three seeds each, under ``runs/examples/``) and
draws them with the same code as ``evorl-pop plot``::

    python figures/regenerate.py            # ES figures: about two minutes on a laptop CPU
    python figures/regenerate.py --hybrid   # also CEM-RL and ERL on Pendulum (about 5 more minutes)
    python figures/regenerate.py --long     # also PBT, brax and MinAtar, one seed each (the
                                            # README's runs; about 20 minutes on 2 cores)

``pbt_vs_fixed.png`` and ``hybrid_pendulum.png`` come from ``benchmarks/bench_pbt.py``
and ``benchmarks/bench_hybrid.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ES_EXAMPLES = ["cmaes_blackbox.py", "openes_cartpole.py", "openes_pendulum.py"]
HYBRID_EXAMPLES = ["cemrl_pendulum.py", "erl_pendulum.py"]
LONG_EXAMPLES = [
    "pbt_pendulum.py",
    "openes_brax.py",
    "cemrl_brax.py",
    "openes_minatar.py",
    "openes_playground.py",
    "openes_gymnasium.py",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per ES figure")
    parser.add_argument("--hybrid", action="store_true", help="also the hybrid RL figures")
    parser.add_argument("--long", action="store_true", help="also PBT, brax and MinAtar")
    args = parser.parse_args()
    names = ES_EXAMPLES + (HYBRID_EXAMPLES if args.hybrid else [])
    jobs = [[name, "--seeds", str(args.seeds), "--quiet"] for name in names]
    jobs += [[name, "--quiet"] for name in LONG_EXAMPLES if args.long]
    for name, *flags in jobs:
        print(f"== {name}", flush=True)
        if subprocess.run([sys.executable, str(EXAMPLES / name), *flags]).returncode != 0:
            sys.exit(f"{name} failed")


if __name__ == "__main__":
    main()
