"""Regenerates the README's fitness figures with the command line.

Trains every config in ``figures/configs/`` for three seeds (run folders under
``runs/figures/``), then draws each as the mean over seeds with a min-max band
via ``evorl-pop plot``::

    python figures/regenerate.py            # about a minute on a laptop CPU
"""

from __future__ import annotations

import sys
from pathlib import Path

from evorl_pop import cli

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
TITLES = {
    "cma_es_sphere": "CMA-ES on the 10-D sphere",
    "open_es_cartpole": "OpenES on CartPole-v1",
}


def main(runs_root: str = "runs/figures") -> None:
    """Trains each config for every seed and writes ``figures/<config>.png``.

    Args:
      runs_root: where the run folders go.
    """
    for config in sorted((HERE / "configs").glob("*.yaml")):
        runs = []
        for seed in SEEDS:
            run = Path(runs_root) / f"{config.stem}-seed{seed}"
            argv = ["train", "--config", str(config), "--seed", str(seed), "--out", str(run)]
            if cli.main([*argv, "--overwrite", "--quiet", "--no-figure"]) != 0:
                sys.exit(f"training {config.name} with seed {seed} failed")
            runs.append(str(run))
        out = HERE / f"{config.stem}.png"
        name = TITLES.get(config.stem, config.stem)
        title = f"{name}: mean of {len(SEEDS)} seeds, min-max band"
        if cli.main(["plot", *runs, "--out", str(out), "--title", title]) != 0:
            sys.exit(f"plotting {config.name} failed")


if __name__ == "__main__":
    main(*sys.argv[1:])
