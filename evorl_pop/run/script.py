"""Scripts on the run shell: what every example shares.

::

    args = script.start(__doc__, generations=40)   # options; devices before JAX starts
    from evorl_pop.algorithms.es import ESConfig    # then what uses JAX
    results = script.train(args, {"openes-cartpole": ESConfig(...)},
                           "openes_cartpole.png", "OpenES on CartPole-v1", chunk=5)

:func:`start` parses the shared options (``--devices``, ``--seed``, and for
scripts that train: ``--seeds``, ``--generations``, ``--runs``,
``--figures``, ``--quiet``), sets the device count and the compilation cache
before JAX starts, and makes an error that says what to change (a config, a
run folder, a checkpoint) and Ctrl-C end the script in one line.
:func:`train` builds each run config the way the command line does, trains
every seed through :func:`evorl_pop.train` and draws them in one figure with
the code behind ``evorl-pop plot``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from evorl_pop.base import CheckpointError, ConfigError, RunError
from evorl_pop.run import config as config_lib
from evorl_pop.run import processes, shell

#: The examples' run folders and figures go under the repository's root.
ROOT = Path(__file__).resolve().parents[2]


def _one_line_exit(kind, value, traceback):
    """Ctrl-C, or an error that says what to change (a config, a run folder, a checkpoint),
    ends a script in one line instead of a traceback."""
    name = Path(sys.argv[0]).name
    if issubclass(kind, ConfigError | RunError | CheckpointError):
        print(f"{name}: error: {value}", file=sys.stderr)  # exit status 1
        return None
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, traceback)
    # The run shell's message says how to continue the run (a checkpoint is written on Ctrl-C).
    print(f"\n{name}: interrupted{f'; {value}' if str(value) else ''}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # End as Python ends on Ctrl-C, killed by SIGINT (it does so only for KeyboardInterrupt
    # itself, not for its subclass evorl_pop.run.stop.Interrupted).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def start(
    doc: str,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    runs: bool = True,
    **defaults,
) -> argparse.Namespace:
    """A script's options, parsed; the devices and compilation cache set before JAX starts.

    Args:
      doc: the script's docstring (its first line describes it).
      add_arguments: adds the script's own options to the parser.
      runs: the script trains into run folders (``--seeds``, ``--generations``,
        ``--runs``, ``--figures``, ``--quiet``); else only ``--devices`` and ``--seed``.
      **defaults: defaults of the shared options (``generations``, ``devices``).

    Returns:
      The parsed options.
    """
    sys.excepthook = _one_line_exit
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument(
        "--devices",
        type=lambda text: text if text == "auto" else int(text),
        default=defaults.get("devices", "auto"),
        help="CPU devices to shard the population over: N, or auto: one per core"
        f"{', at least 64 candidates each' if runs else ''}; N replaces a count XLA_FLAGS "
        "names (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    if runs:
        parser.add_argument(
            "--seeds",
            type=int,
            default=1,
            help="train seeds seed .. seed+N-1 "
            "and plot their mean with a min-max band (default %(default)s)",
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
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    try:  # before anything uses JAX
        if args.devices == "auto":
            processes.use_all_cores()
        elif note := processes.set_host_devices(args.devices):
            print(f"note: {note}", file=sys.stderr)
        processes.use_compilation_cache()
    except ValueError as err:
        parser.error(str(err))
    return args


def train(
    args: argparse.Namespace,
    configs: Mapping[str, object],
    figure: str,
    title: str,
    metrics: Sequence[str] = ("best", "mean", "worst"),
    x: str = "generation",
    **settings,
) -> dict:
    """Trains each algorithm config for ``args.seeds`` seeds, then draws them in one figure.

    Run folders are ``args.runs/name`` (one seed) or ``args.runs/name-seedS``;
    the runs of one config that differ only in the seed are drawn as a mean
    with a band, as ``evorl-pop plot`` draws them.

    Args:
      args: the options :func:`start` parsed.
      configs: run name to an algorithm's config (``ESConfig(...)``, ...).
      figure, title: the figure's file name in ``args.figures``, and its title.
      metrics, x: what the figure draws (see :func:`evorl_pop.run.plotting.plot_runs`).
      **settings: run settings (``chunk``, ``checkpoint_every``, ...) besides the
        seed, generations and devices, which come from ``args``.

    Returns:
      Run name to the :class:`~evorl_pop.run.session.RunResult` of its first seed.
    """
    from evorl_pop.run import plotting  # matplotlib: only when a figure is drawn

    run_dirs = []
    results = {}
    for name, algorithm_config in configs.items():
        config = config_lib.RunConfig(
            config_lib.name_of(algorithm_config),
            algorithm_config=algorithm_config,
            generations=args.generations,
            devices=args.devices,
            **settings,
        )
        for seed in range(args.seed, args.seed + args.seeds):
            run_dir = args.runs / (name if args.seeds == 1 else f"{name}-seed{seed}")
            result = shell.train(
                dataclasses.replace(config, seed=seed),
                run_dir,
                progress=not args.quiet,
                overwrite=True,
                figure=False,
            )
            run_dirs.append(run_dir)
            results.setdefault(name, result)
    args.figures.mkdir(parents=True, exist_ok=True)
    if args.seeds > 1:
        title = f"{title}: mean of {args.seeds} seeds, min-max band"
    paths = plotting.plot_runs(
        run_dirs, out=args.figures / figure, x=x, title=title, metrics=metrics
    )
    print(f"figure: {paths[0]}")
    return results
