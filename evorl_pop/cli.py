"""The ``evorl-pop`` command line: train, resume, plot, list, launch.

JAX reads the number of simulated CPU devices and its 64-bit mode when its
backend starts, so the commands settle both (:mod:`evorl_pop.run.processes`)
from the merged config before they import the modules that use JAX.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np

from evorl_pop import registry, tasks
from evorl_pop.base import CheckpointError, ConfigError, RunError, __version__
from evorl_pop.run import config as config_lib
from evorl_pop.run import launcher, processes, replicas, restore, shell, stop, store
from evorl_pop.run import sweep as sweep_lib

# (summary, more description, examples) of each command.
COMMANDS = {
    "train": (
        "start a run in a new run folder",
        " (default: OpenES on CartPole-v1, 40 generations), writing config.yaml, metrics.csv, "
        "checkpoint.msgpack, train.log and fitness.png",
        """
  evorl-pop train --strategy CMA_ES --task sphere --set num_dims=20 --generations 200
  evorl-pop train --print-config > my_run.yaml; evorl-pop train --config my_run.yaml""",
    ),
    "resume": (
        "continue a run from its last checkpoint",
        ", bit for bit (on the same devices); a config that differs in more than generations, "
        "chunk, checkpoint-every and devices needs --force",
        """
  evorl-pop resume RUN --more 100 --set learning_rate=0.01 --force""",
    ),
    "plot": (
        "draw fitness curves of one or more runs",
        "; runs that differ only in the seed are drawn as their mean with a band",
        """
  evorl-pop plot runs/seed0 runs/seed1 --band std --out seeds.png --x steps --svg""",
    ),
    "launch": (
        "run train or resume as several processes on this machine",
        " (jax.distributed over loopback); when one fails the others are stopped; the process "
        "ids go to RUN/launch.json or --pid-file",
        """
  evorl-pop launch -n 2 --devices-per-process 2 -- train --pop 2048 --out runs/two""",
    ),
    "render": (
        "show a run's best policy acting in its environment",
        ", from the last checkpoint: brax tasks as brax's HTML viewer (RUN/render.html), gymnax "
        "tasks as an animated GIF with the step and return on each frame (RUN/render.gif); "
        "prints the return, the run's evaluation's for the same policy and key (by default the "
        "last evaluation's key)",
        """
  evorl-pop render runs/hopper --episodes 2 --seed 3 --out hopper.html""",
    ),
    "list": ("list algorithms, strategies, environments and black-box tasks", "", None),
}


def duration(text: str) -> float:
    """Seconds from ``'3600'``, ``'90m'``, ``'2h'``, ``'1h30m'`` or ``'1:30:00'`` (H:M:S)."""
    try:
        if ":" in text:
            return float(sum(float(p) * 60**i for i, p in enumerate(reversed(text.split(":")))))
        units = {"h": 3600, "m": 60, "s": 1}
        total = 0.0
        number = ""
        for char in text.strip().lower():
            if char in units and number:
                total += float(number) * units[char]
                number = ""
            else:
                number += char
        seconds = total + (float(number) if number else 0.0)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: give seconds (3600), 90m, 2h, 1h30m or 1:30:00"
        )
    return seconds


def _add(p, options, exclusive: bool = False) -> None:
    """Adds ``(flags, help, argparse keywords)`` rows to a parser (mutually exclusive ones)."""
    p = p.add_mutually_exclusive_group() if exclusive else p
    for flags, help, kwargs in options:
        p.add_argument(*flags.split(), help=help, **kwargs)


def _floats(text: str) -> tuple[float, ...]:
    """``'0.5,0.25'`` as ``(0.5, 0.25)`` (``--descriptor``)."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        message = f"expected numbers separated by commas, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


# The options of each command, a row each: (flags, help, argparse keywords).
# fmt: off
N = {"metavar": "N"}
DIR = {"metavar": "DIR"}
FILE = {"metavar": "FILE"}
FLAG = {"action": "store_true"}
N0 = N1 = {"type": int, **N}  # ranges are checked with the config, in one line
K1 = {"type": int, "metavar": "K"}
TRAIN = [
    ("--algorithm -a", "see 'evorl-pop list' (default: es)", {"metavar": "NAME"}),
    ("--strategy", "ES strategy, e.g. Open_ES, CMA_ES, SNES", {"metavar": "NAME"}),
    ("--task -t", "environment or black-box function (default: CartPole-v1)", {"metavar": "NAME"}),
    ("--population-size --pop -p", "candidates per generation (default: 256)",
     {"type": int, "dest": "population_size", **N}),
    ("--generations -g", "generations to run (default: 40)", N0),
    ("--seed -s", "random seed (default: 0)", N0),
    ("--seeds", "run seeds S .. S+N-1 in one compiled program (default: 1)", N1),
    ("--sweep", "every value of an algorithm setting, with every seed (repeatable: the "
     "grid is the product); values that enter the program as data share one program",
     {"action": "append", "metavar": "KEY=V1,V2,..."}),
    ("--precision", "the dtype of the solutions and the strategy (default: float32)",
     {"choices": ("float32", "float64")}),
    ("--out -o", "the run folder (default: RUNS_ROOT/<algorithm>-<task>-<seed>-<time>)", DIR),
    ("--runs-root", "the folder of the runs' folders", {"default": "runs", **DIR}),
    ("--overwrite", "replace an earlier run in --out", FLAG),
    ("--print-config", "print the resolved config as YAML and exit", FLAG),
]
PLUGIN = ("--plugin", "import MODULE first, with the algorithms, strategies, learners and "
          "environment families it registers (repeatable)",
          {"dest": "plugins", "action": "append", "default": [], "metavar": "MODULE"})
SETTINGS = [
    (PLUGIN[0], PLUGIN[1] + "; recorded in the run's config", PLUGIN[2]),
    ("--set", "override a setting, applied last: generations=100, hidden_sizes=64,64, "
     "td3.batch_size=64, sigma_init=null",
     {"dest": "overrides", "action": "append", "default": [], "metavar": "KEY=VALUE"}),
    ("--chunk", "generations per compiled chunk (default: 5)", N1),
    ("--checkpoint-every", "generations between checkpoints; 0: at the end (default: 10)", N0),
    ("--log", "also log to tensorboard (RUN/tb) or wandb (offline unless logged in); "
     "repeatable; adds to the config's loggers",
     {"action": "append", "default": [], "choices": ("csv", "tensorboard", "wandb"),
      "metavar": "LOGGER"}),
    ("-q --quiet", "no progress bar and no summary", FLAG),
    ("--no-figure", "do not draw fitness.png at the end", FLAG),
    ("--time-limit", "stop with a checkpoint before this much training time has passed "
     "(seconds, or 90m, 2h, 1:30:00; exit status 124)", {"type": duration, "metavar": "T"}),
]
PROCESSES = [
    ("--coordinator", "address of process 0's coordinator", {"metavar": "HOST:PORT"}),
    ("--num-processes", "processes in the run", N1),
    ("--process-id", "this process's index", {"type": int, "metavar": "I"}),
    ("--heartbeat-timeout", "seconds until a silent process counts as dead (default: 100)",
     {"type": int, "default": 100, "metavar": "S"}),
    ("--connect-timeout", "seconds to wait for the coordinator to answer (default: 30)",
     {"type": int, "default": 30, "metavar": "S"}),
]
PROCESSES_DEFAULT = ("Default: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, "
                     "or the cluster's.")
RESUME_TOTAL = [  # one or the other
    ("--generations -g", "new total", N0),
    ("--more", "N beyond the checkpoint", N0),
]
PLOT = [
    ("runs", "run folders (or metrics.csv files)", {"nargs": "+", "metavar": "RUN"}),
    ("--out -o", "the PNG (default: RUN/fitness.png, or fitness.png for several)", FILE),
    ("--x", "x axis", {"choices": ("generation", "steps"), "default": "generation"}),
    ("--metrics", "comma-separated: best, mean, worst or metrics.csv columns",
     {"default": "best,mean,worst", "metavar": "LIST"}),
    ("--band", "band over seeds", {"choices": ("minmax", "std"), "default": "minmax"}),
    ("--svg", "also write an SVG beside the PNG", FLAG),
    ("--title", "figure title", {"metavar": "TEXT"}),
]
PLOT_SCALE = [  # one or the other
    ("--log-y", "logarithmic fitness axis", FLAG),
    ("--linear-y", "linear (default: log over 3 decades)", FLAG),
]
LAUNCH = [
    ("-n --nproc --num-processes", "number of processes (default: 2)",
     {"dest": "nproc", "default": 2, **N1}),
    ("--devices-per-process", "CPU devices of each process (default: 1)", K1),
    ("--gpus-per-process", "give process I the GPUs I*K..I*K+K-1", K1),
    ("--port", "coordinator port (default: free)", {"type": int, "metavar": "P"}),
    ("--grace-period", "seconds from SIGTERM to SIGKILL (default: 30)",
     {"type": float, "default": 30.0, "metavar": "S"}),
    ("--pid-file", "write the process ids here as JSON (default: RUN/launch.json)", FILE),
    ("launch_command", "train or resume", {"nargs": argparse.REMAINDER, "metavar": "-- CMD"}),
]
RENDER = [
    ("run", "the run folder", {"metavar": "RUN"}),
    ("--episodes", "episodes to run (default: 1)", {"type": int, "default": 1, **N}),
    ("--seed", "key jax.random.key(S) (default: the key of the run's last evaluation)",
     {"type": int, "metavar": "S"}),
    ("--out -o", "the file (default: RUN/render.html or RUN/render.gif)", FILE),
    ("--member", "an NSGA run on an mo/ brax task: front member I (front.csv's index)",
     {"type": int, "metavar": "I"}),
    ("--cell", "a MAP-Elites run on a qd/ brax task: the elite of cell I (archive.npz)",
     {"type": int, "metavar": "I"}),
    ("--descriptor", "a MAP-Elites run: the filled cell nearest to the descriptor d1,d2,...",
     {"type": _floats, "metavar": "D"}),
]
# fmt: on


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``evorl-pop``, with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="evorl-pop",
        description="Neuroevolution populations sharded over JAX devices: train evolution "
        "strategies (and hybrid evolutionary RL), resume runs, plot fitness curves.",
        epilog="Run 'evorl-pop COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"evorl-pop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = {}
    for name, (summary, more, examples) in COMMANDS.items():
        p[name] = sub.add_parser(
            name,
            help=summary,
            description=textwrap.fill(summary[0].upper() + summary[1:] + more + ".", 88),
            epilog=f"examples:{examples}" if examples else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    _add(p["train"], TRAIN)
    p["resume"].add_argument("run", metavar="RUN", help="the run folder")
    _add(p["resume"], RESUME_TOTAL, exclusive=True)
    _add(p["resume"], [("--force", "continue with a changed config", FLAG)])
    for name, resume in (("train", False), ("resume", True)):
        merged = " merged over the run's config.yaml" if resume else ""
        default = "the run setting" if resume else "auto"
        config_help = f"a YAML (or .toml) run config{merged}; see --print-config for the layout"
        devices_help = f"devices on the population axis (default: {default})"
        rows = [("--config", config_help, FILE), *SETTINGS]
        _add(p[name], [*rows, ("--devices", devices_help, {"metavar": "auto|N"})])
        group = p[name].add_argument_group("several processes (jax.distributed)", PROCESSES_DEFAULT)
        _add(group, PROCESSES)
    _add(p["plot"], PLOT)
    _add(p["plot"], PLOT_SCALE, exclusive=True)
    _add(p["launch"], LAUNCH)
    _add(p["list"], [PLUGIN])
    _add(p["render"], RENDER)
    return parser


def _precheck(args, sources, overrides) -> None:
    """Joins a multi-process run, sets host devices, precision and the compilation cache
    (config errors: later)."""
    try:
        data = config_lib.merge(sources, overrides)
    except ConfigError:
        data = None
    if stop.LAUNCHER_PID in os.environ:  # a process evorl-pop launch started ends with it
        stop.watch_launcher()
    joined = processes.initialize(
        args.coordinator,
        args.num_processes,
        args.process_id,
        args.heartbeat_timeout,
        connect_timeout=args.connect_timeout,
    )
    if data is None:
        return
    devices = data.get("devices", "auto")
    xla = processes.host_device_count()
    note = None
    try:
        if joined:
            pass  # a joined process's device count comes from the environment
        elif isinstance(devices, int):
            note = processes.set_host_devices(devices)
        elif devices in ("auto", None) and xla is not None:
            note = f"devices={devices} keeps the {xla} that XLA_FLAGS names"
        elif devices in ("auto", None):
            processes.use_all_cores()
        processes.set_precision(data.get("precision", "float32"))
        processes.use_compilation_cache()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if note and not args.quiet:
        print(f"evorl-pop {args.command}: {note}", file=sys.stderr)


def _overrides(args) -> list[str]:
    """The command's setting flags as ``key=value`` overrides, then ``--set``'s."""
    flags = (
        "algorithm strategy task population_size generations seed seeds chunk checkpoint_every "
        "devices precision"
    ).split()
    # as YAML strings: a name is never parsed as a mapping (gym:) or a number
    names = {"algorithm", "strategy", "task", "precision"}
    given = [
        f"{f}={json.dumps(v) if f in names else v}"
        for f in flags
        if (v := getattr(args, f, None)) is not None
    ]
    if getattr(args, "sweep", None):
        given.append(f"sweep={json.dumps(args.sweep)}")
    return given + args.overrides


def _sweep_top(run: str) -> bool:
    """Whether ``run`` is the top folder of a sweep of several programs; RunError for one
    that holds no plan to resume from."""
    if os.path.exists(os.path.join(run, "config.yaml")):
        return False
    if os.path.exists(os.path.join(run, sweep_lib.PLAN)):
        return True
    if told := sweep_lib.top_folder(run, "resume"):  # programs, but no plan to resume from
        raise RunError(told)
    return False


def _say_sweep(args, where) -> None:
    """Names a sweep's summary files (unless ``-q``)."""
    if not args.quiet and store.is_writer():
        where = Path(where)
        print(f"sweep: {where / sweep_lib.TABLE}, {where / sweep_lib.FIGURE}", file=sys.stderr)


def _cmd_train(args) -> int:
    """``train`` and ``resume``."""
    resume = args.command == "resume"
    overrides = _overrides(args)
    sources = [os.path.join(args.run, "config.yaml")] if resume else []
    top = resume and _sweep_top(args.run)  # a sweep of several programs: its plan
    sources = [os.path.join(args.run, sweep_lib.PLAN)] if top else sources
    sources += [args.config] if args.config else []
    present = [s for s in sources if os.path.exists(s)]
    if args.plugins:  # added to the plug-ins the config names
        try:
            named = config_lib.merge(present, overrides).get("plugins") or []
        except ConfigError:
            named = []
        overrides.append(f"plugins=[{','.join(dict.fromkeys([*named, *args.plugins]))}]")
    if args.log:  # added to the loggers the config names
        try:
            named = config_lib.merge(present, overrides).get("loggers") or ["csv"]
        except ConfigError:
            named = ["csv"]  # the config's own error comes where it is read
        overrides.append(f"loggers=[{','.join(dict.fromkeys([*named, *args.log]))}]")
    _precheck(args, present, overrides)
    # After jax.distributed (whose preemption notifier takes SIGTERM): a signal before
    # the session's own handlers ends the command as Ctrl-C does.
    if stop.held():  # evorl-pop: the signals set the flag the session takes over
        stop.hold()
        stop.check()
    else:
        for signum in stop.STOP_SIGNALS[1:]:
            signal.signal(signum, stop.at_once)
    show = dict(progress=not args.quiet, figure=not args.no_figure, time_limit=args.time_limit)
    try:
        said = () if args.quiet else (_SayRunFolder(),)
        if top:
            config = config_lib.resolve_config(sources, overrides)
            config = dataclasses.replace(config, generations=config.generations + (args.more or 0))
            kwargs = dict(recorders=said, **show)
            runs = sweep_lib.resume(
                config, args.run, shell.train, shell.resume, overrides, args.force, **kwargs
            )
            result = runs[-1]
            _say_sweep(args, args.run)
        elif resume:
            result = shell.resume(args.run, overrides, args.config, args.more, args.force, **show)
            if (where := sweep_lib.refresh(args.run)) is not None:  # a sweep's: its summary
                _say_sweep(args, where)
        else:
            # values are checked once, where the run is built (here only for --print-config)
            config = config_lib.resolve_config(sources, overrides, check=args.print_config)
            if args.print_config:
                sys.stdout.write(config_lib.dumps(config))
                return 0
            if args.out == "":
                raise ConfigError(
                    "--out is empty: name the run folder, or leave --out out for a new folder "
                    f"under {args.runs_root}/."
                )
            run_dir = args.out or store.default_run_dir(config, args.runs_root)
            kwargs = dict(overwrite=args.overwrite, recorders=said, **show)
            if config.sweep:
                result = sweep_lib.train(config, run_dir, shell.train, **kwargs)[-1]
                _say_sweep(args, run_dir)
            else:
                result = shell.train(config, run_dir, **kwargs)
    finally:
        if jax.distributed.is_initialized():  # the exit waits for the other processes
            stop.ignore_stop_signals()
    # A signal in the last chunk (or a program of a sweep) came when the run was complete.
    stop.check(f"the run is complete in {result.run_dir}.", result.generation)
    if not args.quiet and store.is_writer():
        h = result.history
        parts = [f"generation {result.generation}", f"{result.env_steps:,} env steps"]
        last = {k: np.asarray(v[-1]) for k, v in h.items() if len(v)}
        labels = result.labels
        if "fitness_best" in last and labels:  # replicas: each setting over its seeds
            rows = [
                {**label, "generation": result.generation, "fitness_mean": v}
                for label, v in zip(labels, last["fitness_mean"], strict=True)
            ]
            swept = [k for k in labels[0] if k != "seed"]
            parts.append("; ".join(replicas.summary(rows, swept)))
        elif "fitness_best" in last:
            parts += [f"best {last['fitness_best']:.6g}", f"mean {last['fitness_mean']:.6g}"]
        print(f"done: {', '.join([*parts, f'{result.wall_time:.1f}s'])}", file=sys.stderr)
    return 0


_cmd_resume = _cmd_train


class _SayRunFolder(store.Recorder):
    """Names the run folder once the run is built and holds it (a config value that
    cannot run stops before, and names no folder)."""

    def start(self, run: store.Run, state) -> None:
        if run.writer:
            print(f"run folder: {run.run_dir}", file=sys.stderr)


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
    config = config_lib.resolve_config([args.config] if args.config else [], _overrides(args))
    command += ["--out", str(store.default_run_dir(config, args.runs_root))]
    return command[-1]


def _cmd_launch(args) -> int:
    devices = args.devices_per_process
    if devices is None and args.gpus_per_process is None:
        devices = 1
    command = args.launch_command[1:] if args.launch_command[:1] == ["--"] else args.launch_command
    run_dir = None if args.pid_file else _launch_run_folder(command)
    pid_file = args.pid_file or (run_dir and os.path.join(run_dir, launcher.RECORD_FILENAME))
    return launcher.launch(
        command,
        args.nproc,
        devices_per_process=devices,
        port=args.port,
        gpus_per_process=args.gpus_per_process,
        grace_period=args.grace_period,
        pid_file=pid_file,
    )


def _cmd_plot(args) -> int:
    from evorl_pop.run import plotting

    out = args.out or "fitness.png"
    if args.out is None and len(args.runs) == 1 and os.path.isdir(args.runs[0]):
        out = os.path.join(args.runs[0], "fitness.png")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    log_y = True if args.log_y else False if args.linear_y else None
    try:
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
    except OSError as err:  # a read-only run folder, a full disk
        raise RunError(
            f"Cannot write {str(err.filename or out)!r}: {err.strerror or err}; "
            "draw it elsewhere with --out FILE."
        ) from None
    print("\n".join(map(str, written)))
    return 0


def _cmd_render(args) -> int:
    if told := sweep_lib.top_folder(args.run, "render"):
        raise RunError(told)
    ckpt = restore.load_checkpoint(args.run)
    processes.set_precision(ckpt.config.get("precision", "float32"))
    processes.use_compilation_cache()
    from evorl_pop.run import render  # JAX's backend starts here, with the run's precision

    chosen = {"member": args.member, "cell": args.cell, "descriptor": args.descriptor}
    print(render.render(args.run, args.episodes, args.seed, args.out, **chosen))
    return 0


def _cmd_list(args) -> int:
    registry.load_plugins(args.plugins)
    print("algorithms:")
    missing = {m.rsplit(".", 1)[-1]: p for m, p in registry.unavailable("algorithm").items()}
    width = max(len(name) for name in [*(s.name for s in config_lib.specs()), *missing, "es"])
    for spec in config_lib.specs():
        print(f"  {spec.name:{width}s} {spec.description}")
    for name, package in missing.items():
        print(f"  {name:{width}s} (not installed: pip install {package})")
    from evorl_pop.algorithms.es import STRATEGIES  # imports evosax, which starts JAX

    for title, names in (
        ("strategies (es --strategy)", STRATEGIES.names()),
        ("learners (cemrl, erl, pbt: --set learner=NAME)", registry.LEARNERS.names()),
        ("quality-diversity emitters (mapelites: --set emitter=NAME)", registry.EMITTERS.names()),
        ("environments (--task)", tasks.envs.env_names()),
        ("black-box tasks (--task, with --set num_dims=N)", tasks.blackbox.BLACKBOX_FUNCTIONS),
        (
            "BBOB functions (--task, with --set num_dims=N --set instance=I)",
            tasks.blackbox.bbob_task_names(),
        ),
        ("quality-diversity tasks (-a mapelites --task)", tasks.qd.QD_TASKS),
        (
            "multi-objective tasks (-a nsga2, nsga3, moead or rvea --task)",
            tasks.multiobjective.mo_task_names(),
        ),
    ):
        print(f"{title}:")
        text = ", ".join(sorted(names))
        indent = "  "
        wrapped = textwrap.fill(
            text, 88, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )
        print(wrapped)
    print("environment families (--task NAME; --set SETTING=VALUE for a family's own):")
    for name, family in registry.ENV_FAMILIES.items():
        own = "".join(f"; --set {key}={'|'.join(valid)}" for key, valid in family.settings.items())
        line = f"{name}: {family.description}{own}"
        print(textwrap.fill(line, 88, initial_indent="  ", subsequent_indent="    "))
    return 0


def main(argv=None) -> int:
    """Runs ``evorl-pop`` on ``argv`` (``None``: ``sys.argv[1:]``).

    Returns:
      The exit status: 0 on success, 1 for a run or checkpoint error, 2 for a
        bad config or usage, 130 when interrupted, 141 when the reader of its
        output has gone (``evorl-pop list | head``).
    """
    args = build_parser().parse_args(argv)
    try:
        if args.command not in ("train", "resume"):
            stop.release()  # a command that is no run: Ctrl-C stops it at once
        status = globals()[f"_cmd_{args.command}"](args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        return 141  # as a program that SIGPIPE ended
    except (CheckpointError, RunError, ValueError) as err:  # ConfigError: a ValueError
        # A ValueError is a usage error, e.g. more devices than there are.
        status = 1 if isinstance(err, CheckpointError | RunError) else 2
        kind = "config error" if isinstance(err, ConfigError) else "error"
        print(f"evorl-pop {args.command}: {kind}: {err}", file=sys.stderr)
        return status
    except KeyboardInterrupt as err:  # the run shell's message says what the run folder holds
        return stop.report(err, args.command)


if __name__ == "__main__":
    sys.exit(main())
