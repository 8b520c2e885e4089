"""Regenerates the figures in this folder with the examples, benchmarks and commands that draw them.

    python figures/regenerate.py            # ES figures: about two minutes on a laptop CPU
    python figures/regenerate.py --hybrid   # also CEM-RL and ERL on Pendulum (about 5 more minutes)
    python figures/regenerate.py --long     # also PBT, brax and MinAtar, one seed each (the
                                            # README's runs; about 20 minutes on 2 cores)
    python figures/regenerate.py --group learners --group qd   # groups by name (--list)
    python figures/regenerate.py --all      # every figure (hours on a laptop CPU)
    python figures/regenerate.py ppo_brax.png pbt_vs_fixed.png # these figures only
    python figures/regenerate.py --list     # each figure, its group and its command

The examples train under ``runs/examples/`` and draw with the same code as
``evorl-pop plot``; the ES and hybrid examples run ``--seeds`` seeds (three by
default) and draw their mean with a band, the others the one seed the figures
in the README and the docs show.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Recipe:
    """How one figure is drawn.

    Attributes:
      group: the group that regenerates it (``--group``; ``es`` runs by default).
      commands: the commands, in order, as a shell would split them: each a script
        under the repository (``.py``) or ``evorl-pop``, then its arguments.
      seeds: the first command is an example that takes ``--seeds``.
    """

    group: str
    commands: tuple[str, ...]
    seeds: bool = False


def example(group: str, command: str, seeds: bool = False) -> Recipe:
    """The recipe of a figure an example draws (``examples/<command>``, quietly)."""
    return Recipe(group, (f"examples/{command} --quiet",), seeds)


def benchmark(command: str) -> Recipe:
    """The recipe of a figure a benchmark draws (``benchmarks/<command>``)."""
    return Recipe("benchmarks", (f"benchmarks/{command}",))


EIGHT_SEEDS = "runs/examples/openes-cartpole-8-seeds"  # under the root, where commands run

#: Every figure in this folder, by file name.
FIGURES: dict[str, Recipe] = {
    "cmaes_blackbox.png": example("es", "cmaes_blackbox.py", seeds=True),
    "openes_cartpole.png": example("es", "openes_cartpole.py", seeds=True),
    "openes_pendulum.png": example("es", "openes_pendulum.py", seeds=True),
    "openes_cartpole_8_seeds.png": Recipe(
        "es",
        (
            f"evorl-pop train --seeds 8 --pop 64 -q --no-figure --overwrite --out {EIGHT_SEEDS}",
            f"evorl-pop plot {EIGHT_SEEDS} --metrics mean --band std --title 'OpenES on "
            "CartPole-v1: 8 seeds in one program (band: ±1 std)' "
            "--out figures/openes_cartpole_8_seeds.png",
        ),
    ),
    "cemrl_pendulum.png": example("hybrid", "cemrl_pendulum.py", seeds=True),
    "erl_pendulum.png": example("hybrid", "erl_pendulum.py", seeds=True),
    "pbt_pendulum.png": example("long", "pbt_pendulum.py"),
    "openes_brax.png": example("long", "openes_brax.py"),
    "cemrl_brax.png": example("long", "cemrl_brax.py"),
    "openes_breakout.png": example("long", "openes_minatar.py"),
    "openes_breakout_keypoints.png": example(
        "long",
        "openes_minatar.py --policy keypoints --elite 0.1 --pop 256 --restarts 48 "
        "--restart-generations 100 --generations 300",
    ),
    "openes_playground.png": example("long", "openes_playground.py"),
    "openes_gymnasium.png": example("long", "openes_gymnasium.py"),
    "ppo_breakout.png": example("learners", "ppo_minatar.py"),
    "ppo_brax.png": example("learners", "ppo_brax.py"),
    "sac_pendulum.png": example("learners", "sac_pendulum.py"),
    "pbt_ppo_brax.png": example("learners", "pbt_ppo_brax.py"),
    "mapelites_arm.png": example("qd", "mapelites_arm.py"),
    "mapelites_walker2d.png": example("qd", "mapelites_walker2d.py"),
    "pgame_walker2d.png": example("qd", "pgame_walker2d.py"),
    "nsga2_zdt1.png": example("mo", "nsga2_zdt1.py"),
    "nsga2_halfcheetah.png": example("mo", "nsga2_halfcheetah.py"),
    "hybrid_pendulum.png": benchmark("bench_hybrid.py"),
    "pbt_vs_fixed.png": benchmark("bench_pbt.py"),
    "pbt_ppo_vs_fixed.png": benchmark("bench_pbt.py --learner ppo --steps 40960 --interval 2048"),
}

GROUPS = ("es", "hybrid", "long", "learners", "qd", "mo", "benchmarks")


def argv(command: str) -> list[str]:
    """A recipe's command as the process to start: a script under this Python, ``evorl-pop``
    from this Python's environment."""
    program, *args = shlex.split(command)
    if program == "evorl-pop":
        beside = Path(sys.executable).with_name("evorl-pop")
        return [str(beside) if beside.exists() else shutil.which("evorl-pop") or program, *args]
    return [sys.executable, str(ROOT / program), *args]


def chosen(args: argparse.Namespace) -> list[str]:
    """The figures the options name, in :data:`FIGURES`' order."""
    unknown = sorted(set(args.figures) - set(FIGURES))
    if unknown:
        sys.exit(f"no recipe for {unknown}; the figures: {', '.join(FIGURES)}")
    groups = {"es", *args.group}
    groups |= {"hybrid"} if args.hybrid else set()
    groups |= {"long"} if args.long else set()
    groups |= set(GROUPS) if args.all else set()
    if args.figures:
        return [name for name in FIGURES if name in args.figures]
    return [name for name, recipe in FIGURES.items() if recipe.group in groups]


def parse(argv_: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", nargs="*", help="figure file names (default: by group)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per ES and hybrid figure")
    parser.add_argument("--hybrid", action="store_true", help="also the group hybrid")
    parser.add_argument("--long", action="store_true", help="also the group long")
    parser.add_argument("--group", action="append", default=[], choices=GROUPS)
    parser.add_argument("--all", action="store_true", help="every group")
    parser.add_argument("--list", action="store_true", help="print the recipes and stop")
    return parser.parse_args(argv_)


def main(argv_: list[str] | None = None) -> None:
    args = parse(argv_)
    if args.list:
        for name, recipe in FIGURES.items():
            lines = " && ".join(recipe.commands)
            print(f"{name:32} {recipe.group:11} {lines}")
        return
    for name in chosen(args):
        recipe = FIGURES[name]
        print(f"== {name}", flush=True)
        for i, command in enumerate(recipe.commands):
            extra = ["--seeds", str(args.seeds)] if recipe.seeds and i == 0 else []
            if subprocess.run([*argv(command), *extra], cwd=ROOT).returncode != 0:
                sys.exit(f"{name}: {command} failed")


if __name__ == "__main__":
    main()
