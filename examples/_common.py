"""Shared command-line set-up of the examples (device count before JAX starts)."""

import argparse
import os
import signal
import sys
from pathlib import Path

from evorl_pop import backend

ROOT = Path(__file__).resolve().parents[1]


def _one_line_exit(kind, value, traceback):
    """Ctrl-C, or an error that says what to change (a config, a run folder, a checkpoint),
    ends an example in one line instead of a traceback."""
    from evorl_pop.checkpoint import CheckpointError
    from evorl_pop.config import ConfigError
    from evorl_pop.rundir import RunError

    if issubclass(kind, ConfigError | RunError | CheckpointError):
        print(f"{Path(sys.argv[0]).name}: error: {value}", file=sys.stderr)  # exit status 1
        return None
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, traceback)
    # The runner's message says how to continue the run (a checkpoint is written on Ctrl-C).
    print(f"\n{Path(sys.argv[0]).name}: interrupted{f'; {value}' if str(value) else ''}",
          file=sys.stderr, flush=True)  # fmt: skip
    sys.stdout.flush()
    # End as Python ends on Ctrl-C, killed by SIGINT (it does so only for KeyboardInterrupt
    # itself, not for the runner's subclass of it).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def parse(description: str, add_arguments=None, runs: bool = True, **defaults):
    """The examples' shared options, parsed; sets the devices before JAX starts.

    ``runs=False``: only ``--devices`` and ``--seed`` (an example without run folders).
    """
    sys.excepthook = _one_line_exit
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--devices",
        type=lambda text: text if text == "auto" else int(text),
        default=defaults.get("devices", "auto"),
        help="CPU devices to shard the population over: N, or auto: one per core"
        f"{', at least 64 candidates each' if runs else ''}; N replaces a count XLA_FLAGS "
        "names (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    if runs:  # the options of examples that train into run folders
        _add_run_options(parser, defaults)
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    try:  # before anything uses JAX
        if args.devices == "auto":
            backend.use_all_cores()
        elif note := backend.set_host_devices(args.devices):
            print(f"note: {note}", file=sys.stderr)
        backend.use_compilation_cache()
    except ValueError as err:
        parser.error(str(err))
    return args


def _add_run_options(parser, defaults):
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train seeds seed .. seed+N-1 and plot their mean with a min-max "
        "band (default %(default)s)",
    )
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


def train_and_plot(
    configs, args, figure_name, title, x="generation", metrics=("best", "mean", "worst")
):
    """Trains each ``(name, RunConfig)`` for ``args.seeds`` seeds, then plots them together.

    Run folders are ``args.runs/name`` (one seed) or ``args.runs/name-seedS``;
    runs of one config that differ only in the seed are drawn as a mean with a
    band, exactly as ``evorl-pop plot`` draws them.

    Yields:
      ``(name, result)`` for the first seed of each config.
    """
    import dataclasses

    from evorl_pop import plotting, runner

    run_dirs = []
    for name, config in configs:
        for offset in range(args.seeds):
            seed = config.seed + offset
            run_dir = args.runs / (name if args.seeds == 1 else f"{name}-seed{seed}")
            result = runner.train(
                dataclasses.replace(config, seed=seed),
                run_dir,
                progress=not args.quiet,
                overwrite=True,
                figure=False,
            )
            run_dirs.append(run_dir)
            if offset == 0:
                yield name, result
    args.figures.mkdir(parents=True, exist_ok=True)
    if args.seeds > 1:
        title = f"{title}: mean of {args.seeds} seeds, min-max band"
    paths = plotting.plot_runs(
        run_dirs, out=args.figures / figure_name, x=x, title=title, metrics=metrics
    )
    print(f"figure: {paths[0]}")
