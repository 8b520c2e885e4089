"""Shared command-line set-up of the examples (device count before JAX starts)."""

import argparse
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse(description: str, add_arguments=None, **defaults):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--devices",
        type=int,
        default=defaults.get("devices", 1),
        help="CPU devices to shard the population over (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument(
        "--generations",
        type=int,
        default=defaults.get("generations"),
        help="generations to run (default %(default)s)",
    )
    parser.add_argument(
        "--runs",
        type=Path,
        default=ROOT / "runs" / "examples",
        help="folder for the run folders (default %(default)s)",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=ROOT / "figures",
        help="folder for the figure (default %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    if args.devices > 1 and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    return args


def train_and_plot(configs, args, figure_name, title, x="generation"):
    """Trains each ``(name, RunConfig)`` into ``args.runs/name`` and plots them together."""
    from evorl_pop import plotting, runner

    run_dirs = []
    for name, config in configs:
        run_dir = args.runs / name
        result = runner.train(config, run_dir, progress=not args.quiet, overwrite=True)
        run_dirs.append(run_dir)
        yield name, result
    args.figures.mkdir(parents=True, exist_ok=True)
    paths = plotting.plot_runs(run_dirs, out=args.figures / figure_name, x=x, title=title)
    print(f"figure: {paths[0]}")
