"""The ``evorl-pop`` command line: train, resume, plot, list, launch.

JAX reads the number of simulated CPU devices when its backend starts, so
this module imports nothing that starts it until ``--devices`` (or a resumed
run's ``devices`` setting) is in the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import textwrap

_DEVICE_FLAG = "--xla_force_host_platform_device_count"

EXAMPLES_TRAIN = """\
examples:
  evorl-pop train                                   OpenES on CartPole-v1, 40 generations
  evorl-pop train --strategy CMA_ES --task sphere --set num_dims=20 --generations 200
  evorl-pop train --config my_run.yaml --set population_size=1024 --devices 2
  evorl-pop train --print-config > my_run.yaml      write the defaults, edit, then --config
"""

EXAMPLES_RESUME = """\
examples:
  evorl-pop resume runs/es-CartPole-v1-0-20250101-120000
  evorl-pop resume RUN --more 100                   100 generations beyond the checkpoint
  evorl-pop resume RUN --generations 500            up to 500 generations in total
  evorl-pop resume RUN --set learning_rate=0.01 --force
"""

EXAMPLES_PLOT = """\
examples:
  evorl-pop plot RUN                                writes RUN/fitness.png
  evorl-pop plot runs/seed0 runs/seed1 runs/seed2 --band std --out seeds.png
  evorl-pop plot RUN --x steps --metrics best,mean --svg
"""


EXAMPLES_LAUNCH = """\
examples:
  evorl-pop launch -n 2 --devices-per-process 2 -- train --pop 2048 --out runs/two
  evorl-pop launch -n 2 -- resume runs/two          continue it, on another layout
  evorl-pop launch -n 4 --gpus-per-process 1 -- train --config big.yaml
"""


def _set_devices(n: int | None) -> None:
    """Asks for ``n`` host (CPU) devices; must run before JAX's backend starts."""
    if n is None:
        return
    flags = re.sub(rf"{_DEVICE_FLAG}=\S+", "", os.environ.get("XLA_FLAGS", "")).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={n}".strip()


def _join(args) -> bool:
    """Joins a multi-process run if one is asked for; before JAX's backend starts.

    Returns:
      Whether this process is part of a ``jax.distributed`` run; its device
      count then comes from the environment (``XLA_FLAGS``, the launcher, the
      scheduler), not from ``--devices``.
    """
    from evorl_pop import multihost

    kwargs = {}
    if args.heartbeat_timeout is not None:
        kwargs["heartbeat_timeout"] = args.heartbeat_timeout
    return multihost.initialize(args.coordinator, args.num_processes, args.process_id, **kwargs)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _add_run_settings(p: argparse.ArgumentParser, resume: bool) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML (.yaml/.yml) or TOML (.toml) run config"
        + (" whose keys override the run's config.yaml" if resume else "")
        + "; see --print-config for the layout",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field, run setting (generations, seed, chunk, ...) or "
        "algorithm field (population_size, hidden_sizes=64,64, sigma_init=null, ...); "
        "repeat for several; applied after --config and the other flags",
    )
    p.add_argument(
        "--chunk",
        type=_positive,
        metavar="N",
        help="generations per compiled chunk; metrics are written (and the progress bar "
        "updated) between chunks (default from the config: 5)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_non_negative,
        metavar="N",
        help="checkpoint once N generations have passed since the last checkpoint, at a chunk "
        "boundary; 0: only at the end (default from the config: 10)",
    )
    p.add_argument(
        "--devices",
        type=_positive,
        metavar="N",
        help="devices on the population axis; on the CPU this many host devices are "
        "simulated (XLA_FLAGS=--xla_force_host_platform_device_count=N) "
        "(default: all devices" + (", or the run's setting" if resume else "") + ")",
    )
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar and no summary on the console"
    )
    p.add_argument("--no-figure", action="store_true", help="do not draw fitness.png at the end")
    group = p.add_argument_group(
        "several processes (jax.distributed)",
        "Join a run that spans several processes (hosts): every process runs the same "
        "command with its own --process-id; process 0 writes the files. Without these "
        "options, JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID are read, "
        "and in a cluster job (SLURM, Open MPI) JAX detects everything itself. "
        "See also 'evorl-pop launch'.",
    )
    group.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="address of process 0's coordinator service, reachable from every process",
    )
    group.add_argument(
        "--num-processes", type=_positive, metavar="N", help="number of processes in the run"
    )
    group.add_argument(
        "--process-id", type=_non_negative, metavar="I", help="this process's index, 0..N-1"
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=_positive,
        metavar="S",
        default=None,
        help="seconds after which a silent process counts as dead and the others stop with "
        "an error instead of waiting (default: 30)",
    )


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
    from evorl_pop import __version__

    parser.add_argument("--version", action="version", version=f"evorl-pop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "train",
        help="start a run in a new run folder",
        description="Start a run. Writes config.yaml, metrics.csv (one row per generation), "
        "checkpoint.msgpack, train.log and fitness.png into the run folder. With no options: "
        "OpenES on CartPole-v1, population 256, 40 generations (under a minute on a CPU).",
        epilog=EXAMPLES_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--algorithm",
        "-a",
        metavar="NAME",
        help="algorithm name, see 'evorl-pop list' (default: es)",
    )
    p.add_argument(
        "--strategy",
        metavar="NAME",
        help="ES strategy, e.g. Open_ES, CMA_ES, SNES (default: Open_ES)",
    )
    p.add_argument(
        "--task",
        "-t",
        metavar="NAME",
        help="environment (CartPole-v1, Pendulum-v1, ...) or black-box function "
        "(sphere, rosenbrock, ...) (default: CartPole-v1)",
    )
    p.add_argument(
        "--population-size",
        "--pop",
        "-p",
        type=_positive,
        metavar="N",
        dest="population_size",
        help="candidates per generation (default: 256)",
    )
    p.add_argument(
        "--generations",
        "-g",
        type=_non_negative,
        metavar="N",
        help="generations to run (default: 40)",
    )
    p.add_argument("--seed", "-s", type=_non_negative, metavar="N", help="random seed (default: 0)")
    p.add_argument(
        "--out",
        "-o",
        metavar="DIR",
        help="the run folder (default: RUNS_ROOT/<algorithm>-<task>-<seed>-<timestamp>)",
    )
    p.add_argument(
        "--runs-root",
        metavar="DIR",
        default="runs",
        help="where default run folders go (default: runs)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an earlier run's files in --out"
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as YAML and exit without training",
    )
    _add_run_settings(p, resume=False)

    p = sub.add_parser(
        "resume",
        help="continue a run from its last checkpoint",
        description="Continue a run from its checkpoint up to its configured number of "
        "generations (or --generations / --more). The result equals an uninterrupted run's "
        "bit for bit (on the same devices). A config that differs from the checkpoint's, "
        "other than generations, chunk, checkpoint interval and devices, is refused unless "
        "--force. Metrics rows written after the checkpoint are dropped first.",
        epilog=EXAMPLES_RESUME,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="the run folder")
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--generations",
        "-g",
        type=_non_negative,
        metavar="N",
        help="new total number of generations",
    )
    group.add_argument(
        "--more", type=_non_negative, metavar="N", help="run N generations beyond the checkpoint"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="continue even though the config differs from the checkpoint's",
    )
    _add_run_settings(p, resume=True)

    p = sub.add_parser(
        "plot",
        help="draw fitness curves of one or more runs",
        description="Draw best / mean / worst fitness against generations or environment "
        "steps. Runs with the same config except for the seed are drawn as their mean with "
        "a shaded band.",
        epilog=EXAMPLES_PLOT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or metrics.csv files)")
    p.add_argument(
        "--out",
        "-o",
        metavar="FILE",
        help="the PNG to write (default: RUN/fitness.png for one run, fitness.png for several)",
    )
    p.add_argument(
        "--x",
        choices=("generation", "steps"),
        default="generation",
        help="x axis: generations or cumulative environment steps (default: generation)",
    )
    p.add_argument(
        "--metrics",
        default="best,mean,worst",
        metavar="LIST",
        help="comma-separated: best, mean, worst, or metrics.csv column names "
        "(default: best,mean,worst)",
    )
    p.add_argument(
        "--band",
        choices=("minmax", "std"),
        default="minmax",
        help="band over the runs of one config: min-max or mean ± std (default: minmax)",
    )
    p.add_argument("--svg", action="store_true", help="also write an SVG beside the PNG")
    p.add_argument("--title", metavar="TEXT", help="figure title")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--log-y", action="store_true", help="logarithmic fitness axis")
    scale.add_argument(
        "--linear-y",
        action="store_true",
        help="linear fitness axis (default: log when positive values span over 3 decades)",
    )

    p = sub.add_parser(
        "launch",
        help="run train or resume as several processes on this machine",
        description="Start N processes of one run on this machine (jax.distributed over "
        "loopback, gloo collectives between CPU devices): each runs `evorl-pop COMMAND ... "
        "--coordinator 127.0.0.1:PORT --num-processes N --process-id I`. Their output is "
        "forwarded with a [pI] prefix; when one fails, the others are stopped (SIGTERM, then "
        "SIGKILL) and launch exits non-zero naming it. Ctrl-C is passed on to every process. "
        "The process ids are printed and written to RUN/launch.json (or --pid-file).",
        epilog=EXAMPLES_LAUNCH,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n",
        "--nproc",
        "--num-processes",
        dest="nproc",
        type=_positive,
        default=2,
        metavar="N",
        help="number of processes (default: 2)",
    )
    p.add_argument(
        "--devices-per-process",
        type=_positive,
        metavar="K",
        help="CPU devices each process simulates (XLA_FLAGS); the population axis then has "
        "N*K devices (default: 1, or leave XLA_FLAGS as it is with --gpus-per-process)",
    )
    p.add_argument(
        "--gpus-per-process",
        type=_positive,
        metavar="K",
        help="give process I the GPUs I*K..I*K+K-1 (JAX_LOCAL_DEVICE_IDS)",
    )
    p.add_argument(
        "--port", type=_positive, metavar="P", help="coordinator port (default: a free one)"
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds from SIGTERM to SIGKILL when stopping the processes (default: 10)",
    )
    p.add_argument(
        "--pid-file",
        metavar="FILE",
        help="write the processes' ids here as JSON (default: RUN/launch.json when the "
        "command names its run folder)",
    )
    p.add_argument(
        "launch_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the evorl-pop command to run: train or resume with its options",
    )

    sub.add_parser(
        "list",
        help="list algorithms, strategies, environments and black-box tasks",
        description="List what can be named in a config: algorithms, ES strategies, "
        "environments and black-box functions.",
    )
    return parser


def _train_config(args):
    from evorl_pop import config as config_lib

    data = config_lib.read_mapping(args.config) if args.config else {}
    if args.algorithm:
        data["algorithm"] = args.algorithm
    base = config_lib.from_dict(data, check=False)
    fields = {f.name for f in dataclasses.fields(base.algorithm_config)}

    def alias(*names):
        # Algorithms name the same thing differently (task / env_name, population_size / pop_size).
        return next((n for n in names if n in fields), names[0])

    overrides = [
        f"{name}={value}"
        for name, value in (
            ("strategy", args.strategy),
            (alias("task", "env_name", "env"), args.task),
            (alias("population_size", "pop_size"), args.population_size),
            ("generations", args.generations),
            ("seed", args.seed),
            ("chunk", args.chunk),
            ("checkpoint_every", args.checkpoint_every),
            ("devices", args.devices),
        )
        if value is not None
    ]
    return config_lib.apply_overrides(base, [*overrides, *args.overrides])


def _summary(result) -> str:
    history = result.history
    parts = [f"generation {result.generation}", f"{result.env_steps:,} env steps"]
    if "fitness_best" in history and len(history["fitness_best"]):
        parts.append(f"best {history['fitness_best'][-1]:.6g}")
        parts.append(f"mean {history['fitness_mean'][-1]:.6g}")
    parts.append(f"{result.wall_time:.1f}s")
    return ", ".join(parts)


def _cmd_train(args) -> int:
    if not _join(args):
        _set_devices(args.devices)
    from evorl_pop import config as config_lib
    from evorl_pop import runner

    config = _train_config(args)
    if args.print_config:
        sys.stdout.write(config_lib.dumps(config))
        return 0
    run_dir = args.out or runner.default_run_dir(config, args.runs_root)
    args.run = str(run_dir)  # for the message on Ctrl-C
    if not args.quiet and runner.is_writer():
        print(f"run folder: {run_dir}", file=sys.stderr)
    result = runner.train(
        config,
        run_dir,
        progress=not args.quiet,
        overwrite=args.overwrite,
        figure=not args.no_figure,
    )
    if not args.quiet and runner.is_writer():
        print(f"done: {_summary(result)}", file=sys.stderr)
    return 0


def _cmd_resume(args) -> int:
    devices = args.devices
    if _join(args):
        devices = None  # every process's devices: the environment sets the count
    elif devices is None:
        # The run's own setting, read without starting JAX.
        import yaml

        try:
            with open(os.path.join(args.run, "config.yaml")) as f:
                devices = (yaml.safe_load(f) or {}).get("devices")
        except (OSError, yaml.YAMLError, AttributeError):
            devices = None
        devices = devices if isinstance(devices, int) and devices >= 1 else None
    _set_devices(devices)
    from evorl_pop import runner

    result = runner.resume(
        args.run,
        generations=args.generations,
        more=args.more,
        overrides=args.overrides,
        config_file=args.config,
        force=args.force,
        devices=args.devices,
        chunk=args.chunk,
        checkpoint_every=args.checkpoint_every,
        progress=not args.quiet,
        figure=not args.no_figure,
    )
    if not args.quiet and runner.is_writer():
        print(f"done: {_summary(result)}", file=sys.stderr)
    return 0


def _cmd_launch(args) -> int:
    from evorl_pop import launcher

    devices = args.devices_per_process
    if devices is None and args.gpus_per_process is None:
        devices = 1
    try:
        return launcher.launch(
            args.launch_command,
            args.nproc,
            devices_per_process=devices,
            port=args.port,
            gpus_per_process=args.gpus_per_process,
            grace_period=args.grace_period,
            pid_file=args.pid_file,
        )
    except launcher.LaunchError as err:
        print(f"evorl-pop launch: error: {err}", file=sys.stderr)
        return 2


def _cmd_plot(args) -> int:
    from evorl_pop import plotting

    out = args.out
    if out is None:
        out = (
            os.path.join(args.runs[0], "fitness.png")
            if len(args.runs) == 1 and os.path.isdir(args.runs[0])
            else "fitness.png"
        )
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    log_y = True if args.log_y else False if args.linear_y else None
    written = plotting.plot_runs(
        args.runs,
        out=out,
        x=args.x,
        metrics=metrics,
        band=args.band,
        svg=args.svg,
        title=args.title,
        log_y=log_y,
    )
    for path in written:
        print(path)
    return 0


def _wrap(items) -> str:
    return textwrap.fill(", ".join(items), width=88, initial_indent="  ", subsequent_indent="  ")


def _cmd_list(args) -> int:
    from evorl_pop import registry

    print("algorithms:")
    for name in registry.names(available_only=False):
        spec = registry._REGISTRY[name]
        status = "" if spec.available() else "  (not installed)"
        print(f"  {name:8s} {spec.description}{status}")
    from evorl_pop.algorithms.es import STRATEGIES
    from evorl_pop.blackbox import bbob_task_names
    from evorl_pop.envs import ENV_FACTORIES
    from evorl_pop.tasks import BLACKBOX_FUNCTIONS

    print("strategies (es --strategy):")
    print(_wrap(sorted(STRATEGIES)))
    print("environments (--task):")
    print(_wrap(sorted(ENV_FACTORIES)))
    print("black-box tasks (--task, with --set num_dims=N):")
    print(_wrap(sorted(BLACKBOX_FUNCTIONS)))
    print("BBOB functions (--task, with --set num_dims=N --set instance=I):")
    print(_wrap(bbob_task_names()))
    return 0


def main(argv=None) -> int:
    """Runs ``evorl-pop``.

    Args:
      argv: the arguments (``None``: ``sys.argv[1:]``).

    Returns:
      The exit status: 0 on success, 1 for a run or checkpoint error, 2 for a
      bad config or usage, 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {
        "train": _cmd_train,
        "resume": _cmd_resume,
        "plot": _cmd_plot,
        "list": _cmd_list,
        "launch": _cmd_launch,
    }
    from evorl_pop.checkpoint import CheckpointError
    from evorl_pop.config import ConfigError
    from evorl_pop.runner import RunError

    try:
        return commands[args.command](args)
    except ConfigError as err:
        print(f"evorl-pop {args.command}: config error: {err}", file=sys.stderr)
        return 2
    except (CheckpointError, RunError) as err:
        print(f"evorl-pop {args.command}: error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # e.g. more devices than there are, a run without metrics
        print(f"evorl-pop {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\nevorl-pop {args.command}: interrupted; the last completed chunk is "
            f"checkpointed: continue with `evorl-pop resume {getattr(args, 'run', 'RUN')}`.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
