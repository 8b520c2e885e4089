"""The ``evorl-pop`` command line: train, resume, plot, list, launch.

JAX reads the number of simulated CPU devices and its 64-bit mode when its
backend starts, so the commands settle both (:mod:`evorl_pop.backend`) from
the merged config before they import the modules that use JAX.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap

from evorl_pop import __version__, backend, launcher, registry
from evorl_pop import config as config_lib
from evorl_pop.config import ConfigError

EXAMPLES = {
    "train": """
  evorl-pop train                                   OpenES on CartPole-v1, 40 generations
  evorl-pop train --strategy CMA_ES --task sphere --set num_dims=20 --generations 200
  evorl-pop train --config my_run.yaml --set population_size=1024 --devices 2
  evorl-pop train --print-config > my_run.yaml      write the defaults, edit, then --config""",
    "resume": """
  evorl-pop resume runs/es-CartPole-v1-0-20250101-120000
  evorl-pop resume RUN --more 100                   100 generations beyond the checkpoint
  evorl-pop resume RUN --generations 500            up to 500 generations in total
  evorl-pop resume RUN --set learning_rate=0.01 --force""",
    "plot": """
  evorl-pop plot RUN                                writes RUN/fitness.png
  evorl-pop plot runs/seed0 runs/seed1 runs/seed2 --band std --out seeds.png
  evorl-pop plot RUN --x steps --metrics best,mean --svg""",
    "launch": """
  evorl-pop launch -n 2 --devices-per-process 2 -- train --pop 2048 --out runs/two
  evorl-pop launch -n 2 -- resume runs/two          continue it, on another layout
  evorl-pop launch -n 4 --gpus-per-process 1 -- train --config big.yaml""",
}
DESCRIPTIONS = {
    "train": "Start a run. Writes config.yaml, metrics.csv (one row per generation), "
    "checkpoint.msgpack, train.log and fitness.png into the run folder. With no options: "
    "OpenES on CartPole-v1, population 256, 40 generations (under a minute on a CPU).",
    "resume": "Continue a run from its checkpoint up to its configured number of generations "
    "(or --generations / --more). The result equals an uninterrupted run's bit for bit (on the "
    "same devices). A config that differs from the checkpoint's, other than generations, chunk, "
    "checkpoint interval and devices, is refused unless --force. Metrics rows written after the "
    "checkpoint are dropped first.",
    "plot": "Draw best / mean / worst fitness against generations or environment steps. Runs "
    "with the same config except for the seed are drawn as their mean with a shaded band.",
    "launch": "Start N processes of one run on this machine (jax.distributed over loopback, "
    "gloo collectives between CPU devices): each runs `evorl-pop COMMAND ... --coordinator "
    "127.0.0.1:PORT --num-processes N --process-id I`. Their output is forwarded with a [pI] "
    "prefix; when one fails, the others are stopped (SIGTERM, then SIGKILL) and launch exits "
    "non-zero naming it. Ctrl-C is passed on to every process. The process ids are printed and "
    "written to RUN/launch.json (a train without --out gets its run folder here) or --pid-file.",
    "list": "List what can be named in a config: algorithms, ES strategies, environments and "
    "black-box functions.",
}


def _int(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
        return value

    return parse


def _devices(text: str) -> int | str:
    try:
        return text if text == "auto" else int(text)  # the config checks the range
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer, got {text!r}") from None


def _add_run_settings(p: argparse.ArgumentParser, resume: bool) -> None:
    # fmt: off
    p.add_argument("--config", metavar="FILE", help="a YAML (or .toml) run config"
                   + (" merged over the run's config.yaml" if resume else "")
                   + "; see --print-config for the layout")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run setting (generations=100) or an algorithm field, bare or "
                   "nested (population_size=1024, hidden_sizes=64,64, sigma_init=null, "
                   "learning_rate=1e-3, td3.batch_size=64); repeatable; applied last")
    p.add_argument("--chunk", type=_int(1), metavar="N", help="generations per compiled chunk; "
                   "metrics are written between chunks (default from the config: 5)")
    p.add_argument("--checkpoint-every", type=_int(0), metavar="N", help="checkpoint once N "
                   "generations have passed since the last one, at a chunk boundary; 0: only at "
                   "the end (default from the config: 10)")
    p.add_argument("--devices", type=_devices, metavar="auto|N", help="devices on the population "
                   "axis; on the CPU N simulated host devices (replacing a count in XLA_FLAGS); "
                   "auto: one per core (or XLA_FLAGS's count), at least 64 candidates each "
                   f"(default: {'the run setting' if resume else 'auto'})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("--no-figure", action="store_true", help="do not draw fitness.png at the end")
    group = p.add_argument_group("several processes (jax.distributed)", "Join a run that spans "
        "several processes (hosts): every process runs the same command with its own "
        "--process-id; process 0 writes the files. Without these options, "
        "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID are read, and in a cluster "
        "job (SLURM, Open MPI) JAX detects everything itself. See also 'evorl-pop launch'.")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0's coordinator service, reachable from all")
    group.add_argument("--num-processes", type=_int(1), metavar="N", help="processes in the run")
    group.add_argument("--process-id", type=_int(0), metavar="I", help="this process's index")
    group.add_argument("--heartbeat-timeout", type=_int(1), metavar="S", help="seconds after "
                       "which a silent process counts as dead and the others stop; also how long "
                       "to wait for the coordinator at start-up (at least 20) (default: 30)")
    # fmt: on


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``evorl-pop``.

    Returns:
      An ``argparse.ArgumentParser`` with the subcommands train, resume, plot, list and launch.
    """
    parser = argparse.ArgumentParser(
        prog="evorl-pop",
        description="Neuroevolution populations sharded over JAX devices: train evolution "
        "strategies (and hybrid evolutionary RL), resume runs, plot fitness curves.",
        epilog="Run 'evorl-pop COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"evorl-pop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        examples = EXAMPLES.get(name)
        return sub.add_parser(
            name,
            help=help,
            description=textwrap.fill(DESCRIPTIONS[name], 88),
            epilog=f"examples:{examples}" if examples else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    # fmt: off
    p = command("train", "start a run in a new run folder")
    p.add_argument("--algorithm", "-a", metavar="NAME", help="see 'evorl-pop list' (default: es)")
    p.add_argument("--strategy", metavar="NAME", help="ES strategy, e.g. Open_ES, CMA_ES, SNES")
    p.add_argument("--task", "-t", metavar="NAME", help="environment (CartPole-v1, Pendulum-v1, "
                   "...) or black-box function (sphere, ...) (default: CartPole-v1)")
    p.add_argument("--population-size", "--pop", "-p", type=int, metavar="N",
                   dest="population_size", help="candidates per generation (default: 256)")
    p.add_argument("--generations", "-g", type=_int(0), metavar="N",
                   help="generations to run (default: 40)")
    p.add_argument("--seed", "-s", type=_int(0), metavar="N", help="random seed (default: 0)")
    p.add_argument("--precision", choices=("float32", "float64"),
                   help="float64: JAX's 64-bit mode for the whole run (default: float32)")
    p.add_argument("--out", "-o", metavar="DIR",
                   help="the run folder (default: RUNS_ROOT/<algorithm>-<task>-<seed>-<time>)")
    p.add_argument("--runs-root", metavar="DIR", default="runs", help="default: runs")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config as YAML and exit")
    _add_run_settings(p, resume=False)

    p = command("resume", "continue a run from its last checkpoint")
    p.add_argument("run", metavar="RUN", help="the run folder")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--generations", "-g", type=_int(0), metavar="N", help="new total")
    group.add_argument("--more", type=_int(0), metavar="N", help="N beyond the checkpoint")
    p.add_argument("--force", action="store_true", help="continue with a changed config")
    _add_run_settings(p, resume=True)

    p = command("plot", "draw fitness curves of one or more runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or metrics.csv files)")
    p.add_argument("--out", "-o", metavar="FILE",
                   help="the PNG (default: RUN/fitness.png for one run, else fitness.png)")
    p.add_argument("--x", choices=("generation", "steps"), default="generation",
                   help="generations or cumulative environment steps (default: generation)")
    p.add_argument("--metrics", default="best,mean,worst", metavar="LIST",
                   help="comma-separated: best, mean, worst or metrics.csv columns")
    p.add_argument("--band", choices=("minmax", "std"), default="minmax",
                   help="band over the seeds of one config: min-max or mean ± std")
    p.add_argument("--svg", action="store_true", help="also write an SVG beside the PNG")
    p.add_argument("--title", metavar="TEXT", help="figure title")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--log-y", action="store_true", help="logarithmic fitness axis")
    scale.add_argument("--linear-y", action="store_true", help="linear fitness axis (default: "
                       "log when positive values span over 3 decades)")

    p = command("launch", "run train or resume as several processes on this machine")
    p.add_argument("-n", "--nproc", "--num-processes", dest="nproc", type=_int(1), default=2,
                   metavar="N", help="number of processes (default: 2)")
    p.add_argument("--devices-per-process", type=_int(1), metavar="K", help="CPU devices each "
                   "process simulates (default: 1, or XLA_FLAGS as is with --gpus-per-process)")
    p.add_argument("--gpus-per-process", type=_int(1), metavar="K",
                   help="give process I the GPUs I*K..I*K+K-1 (JAX_LOCAL_DEVICE_IDS)")
    p.add_argument("--port", type=_int(1), metavar="P", help="coordinator port (default: free)")
    p.add_argument("--grace-period", type=float, default=10.0, metavar="S",
                   help="seconds from SIGTERM to SIGKILL when stopping (default: 10)")
    p.add_argument("--pid-file", metavar="FILE",
                   help="write the process ids here as JSON (default: RUN/launch.json)")
    p.add_argument("launch_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="train or resume with its options")

    command("list", "list algorithms, strategies, environments and black-box tasks")
    # fmt: on
    return parser


def _join(args) -> bool:
    """Joins a ``jax.distributed`` run if asked to; the environment then sets the devices."""
    from evorl_pop import multihost

    timeout = (
        {} if args.heartbeat_timeout is None else {"heartbeat_timeout": args.heartbeat_timeout}
    )
    return multihost.initialize(args.coordinator, args.num_processes, args.process_id, **timeout)


def _precheck(args, sources, overrides) -> None:
    """Joins a multi-process run, then sets host devices and precision, before JAX starts.

    Errors in the config are left to the full check that follows.
    """
    joined = _join(args)
    try:
        data = config_lib.merge(sources, overrides)
    except ConfigError:
        return
    devices, note = data.get("devices", "auto"), None
    try:
        if joined:
            pass  # every process's device count comes from the environment
        elif isinstance(devices, int):
            note = backend.set_host_devices(devices)
        elif devices in ("auto", None) and backend.host_device_count() is not None:
            note = f"devices={devices} keeps the {backend.host_device_count()} that XLA_FLAGS names"
        elif devices in ("auto", None):
            backend.use_all_cores()
        backend.set_precision(data.get("precision", "float32"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if note and not args.quiet:
        print(f"evorl-pop {args.command}: {note}", file=sys.stderr)


def _train_overrides(args) -> list[str]:
    flags = ("algorithm", "strategy", "task", "population_size", "generations", "seed", "chunk",
             "checkpoint_every", "devices", "precision")  # fmt: skip
    return [
        f"{f}={getattr(args, f)}" for f in flags if getattr(args, f) is not None
    ] + args.overrides


def _summary(result) -> str:
    history, parts = result.history, [f"generation {result.generation}"]
    parts.append(f"{result.env_steps:,} env steps")
    if len(history.get("fitness_best", ())):
        parts.append(f"best {history['fitness_best'][-1]:.6g}")
        parts.append(f"mean {history['fitness_mean'][-1]:.6g}")
    return ", ".join([*parts, f"{result.wall_time:.1f}s"])


def _cmd_train(args) -> int:
    sources, overrides = [args.config] if args.config else [], _train_overrides(args)
    _precheck(args, sources, overrides)
    from evorl_pop import runner  # uses JAX: only once devices and precision are set

    config = config_lib.resolve_config(sources, overrides)
    if args.print_config:
        sys.stdout.write(config_lib.dumps(config))
        return 0
    args.run = str(args.out or runner.default_run_dir(config, args.runs_root))  # for Ctrl-C
    if not args.quiet and runner.is_writer():
        print(f"run folder: {args.run}", file=sys.stderr)
    result = runner.train(
        config, args.run, progress=not args.quiet, overwrite=args.overwrite,
        figure=not args.no_figure,
    )  # fmt: skip
    if not args.quiet and runner.is_writer():
        print(f"done: {_summary(result)}", file=sys.stderr)
    return 0


def _cmd_resume(args) -> int:
    sources = [os.path.join(args.run, "config.yaml"), args.config]
    devices = [] if args.devices is None else [f"devices={args.devices}"]
    _precheck(args, [s for s in sources if s and os.path.exists(s)], args.overrides + devices)
    from evorl_pop import runner  # uses JAX: only once devices and precision are set

    result = runner.resume(
        args.run, generations=args.generations, more=args.more, overrides=args.overrides,
        config_file=args.config, force=args.force, devices=args.devices, chunk=args.chunk,
        checkpoint_every=args.checkpoint_every, progress=not args.quiet,
        figure=not args.no_figure,
    )  # fmt: skip
    if not args.quiet and runner.is_writer():
        print(f"done: {_summary(result)}", file=sys.stderr)
    return 0


def _launch_run_folder(command: list[str]) -> str | None:
    """The run folder a launched command names; a ``train`` without ``--out`` gets one here."""
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            args, _ = build_parser().parse_known_args(command)
    except SystemExit:
        return None  # not a command launch takes: launch itself says so
    if args.command == "resume":
        return args.run
    if args.command != "train" or args.out:
        return getattr(args, "out", None)
    from evorl_pop import runner  # this process never computes: its devices do not matter

    config = config_lib.resolve_config([args.config] if args.config else [], _train_overrides(args))
    command += ["--out", str(runner.default_run_dir(config, args.runs_root))]
    return command[-1]


def _cmd_launch(args) -> int:
    devices = args.devices_per_process
    if devices is None and args.gpus_per_process is None:
        devices = 1
    command = args.launch_command[1:] if args.launch_command[:1] == ["--"] else args.launch_command
    run_dir = None if args.pid_file else _launch_run_folder(command)
    try:
        return launcher.launch(
            command, args.nproc, devices_per_process=devices, port=args.port,
            gpus_per_process=args.gpus_per_process, grace_period=args.grace_period,
            pid_file=args.pid_file or (run_dir and os.path.join(run_dir, launcher.RECORD_FILENAME)),
        )  # fmt: skip
    except launcher.LaunchError as err:
        print(f"evorl-pop launch: error: {err}", file=sys.stderr)
        return 2


def _cmd_plot(args) -> int:
    from evorl_pop import plotting

    out = args.out or "fitness.png"
    if args.out is None and len(args.runs) == 1 and os.path.isdir(args.runs[0]):
        out = os.path.join(args.runs[0], "fitness.png")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    log_y = True if args.log_y else False if args.linear_y else None
    written = plotting.plot_runs(
        args.runs, out=out, x=args.x, metrics=metrics, band=args.band, svg=args.svg,
        title=args.title, log_y=log_y,
    )  # fmt: skip
    print("\n".join(map(str, written)))
    return 0


def _cmd_list(args) -> int:
    print("algorithms:")
    for spec in registry.specs():
        missing = spec.missing_package()
        status = f"  (not installed: pip install {missing})" if missing else ""
        print(f"  {spec.name:8s} {spec.description}{status}")
    from evorl_pop.algorithms.es import STRATEGIES  # imports JAX-using modules
    from evorl_pop.blackbox import bbob_task_names
    from evorl_pop.envs import ENV_FACTORIES
    from evorl_pop.tasks import BLACKBOX_FUNCTIONS

    for title, names in (
        ("strategies (es --strategy)", STRATEGIES),
        ("environments (--task)", ENV_FACTORIES),
        ("black-box tasks (--task, with --set num_dims=N)", BLACKBOX_FUNCTIONS),
        ("BBOB functions (--task, with --set num_dims=N --set instance=I)", bbob_task_names()),
    ):
        print(f"{title}:")
        print(textwrap.fill(", ".join(sorted(names)), 88, initial_indent="  ",
                            subsequent_indent="  "))  # fmt: skip
    return 0


def main(argv=None) -> int:
    """Runs ``evorl-pop``.

    Args:
      argv: the arguments (``None``: ``sys.argv[1:]``).

    Returns:
      The exit status: 0 on success, 1 for a run or checkpoint error, 2 for a
      bad config or usage, 130 when interrupted.
    """
    args = build_parser().parse_args(argv)
    run = {"train": _cmd_train, "resume": _cmd_resume, "plot": _cmd_plot, "list": _cmd_list,
           "launch": _cmd_launch}[args.command]  # fmt: skip
    from evorl_pop.checkpoint import CheckpointError  # no JAX backend starts on import
    from evorl_pop.runner import RunError

    try:
        return run(args)
    except ConfigError as err:
        print(f"evorl-pop {args.command}: config error: {err}", file=sys.stderr)
        return 2
    except (CheckpointError, RunError) as err:
        print(f"evorl-pop {args.command}: error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # e.g. more devices than there are, a run without metrics
        print(f"evorl-pop {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # the runner's message says what the run folder holds
        print(
            f"\nevorl-pop {args.command}: interrupted; {err or 'stopped before training began'}",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
