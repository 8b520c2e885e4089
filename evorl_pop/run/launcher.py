"""``evorl-pop launch``: several processes of one run on this machine, as ``torchrun`` does.

Process ``i`` runs ``evorl-pop COMMAND ... --coordinator 127.0.0.1:PORT
--num-processes n --process-id i`` with its own CPU devices or GPUs, its output
forwarded as ``[pi] ...``. When one fails the others are stopped (SIGTERM, then
SIGKILL after a grace period); Ctrl-C, SIGTERM and SIGUSR1 are passed on to
every process (SIGHUP, a closed terminal, as SIGTERM), which stops after its
current chunk with a checkpoint; processes whose launcher dies stop the same way
(see :func:`evorl_pop.run.stop.watch_launcher`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from evorl_pop.base import RunError, write_atomic
from evorl_pop.run import processes, stop

RESERVED_OPTIONS = ("--coordinator", "--num-processes", "--process-id")  # set by launch
RECORD_FILENAME = "launch.json"  # the record of the launched processes, in the run folder


class LaunchError(ValueError):
    """A launch that cannot start as asked (the message says why)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: Signals the launcher passes on to every process (then SIGKILL after the grace period).
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


def _child_setup() -> None:  # runs in the child before exec
    # A launcher started in the background inherits an ignored SIGINT; the
    # children must still turn the Ctrl-C it passes on into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _forward(stream, out, prefix: str, lock: threading.Lock) -> None:
    """Copies a child's stream to ``out``, each line (or progress-bar update) prefixed.

    Reads to the end even once ``out`` cannot be written (a closed terminal gives
    EIO after a hang-up): a child whose pipe is not drained would block on its next
    line instead of stopping.
    """
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace").rstrip("\n")
        # A progress bar rewrites its line with '\r': show each update as a line.
        pieces = [p for p in text.split("\r") if p.strip()] or [text]
        with lock, contextlib.suppress(OSError, ValueError):  # ValueError: `out` was closed
            out.write("".join(f"{prefix}{piece}\n" for piece in pieces))
            out.flush()
    stream.close()


def describe_exit(returncode: int) -> str:
    """``'exit code 3'`` or ``'signal SIGKILL'`` for a ``Popen.returncode`` (negative: a signal)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    with contextlib.suppress(ValueError):
        return f"signal {signal.Signals(-returncode).name}"
    return f"signal {-returncode}"


def launch(
    command: Sequence[str],
    num_processes: int,
    devices_per_process: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    gpus_per_process: int | None = None,
    grace_period: float = 30.0,
    pid_file: str | os.PathLike | None = None,
    python: str = sys.executable,
    out=None,
    err=None,
) -> int:
    """Runs ``num_processes`` processes of one ``evorl-pop`` command on this machine.

    Args:
      command: the ``evorl-pop`` arguments, ``train ...`` or ``resume ...``.
      num_processes: how many processes.
      devices_per_process: CPU devices each simulates (``None``: ``XLA_FLAGS`` as it is).
      port, host: the coordinator's address (port ``None``: a free one).
      gpus_per_process: give process ``i`` the GPUs ``i*k .. i*k+k-1`` (``None``: all).
      grace_period: seconds between SIGTERM (or the passed-on SIGINT) and SIGKILL.
      pid_file: where to write the record of the processes as JSON.
      python, out, err: the interpreter; where output and the launcher's messages go.

    Returns:
      0 when every process succeeded; else the failed process's exit code
        (128 + the signal number when it was killed), 130 after Ctrl-C.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    command = list(command)
    command = command[1:] if command[:1] == ["--"] else command
    if not command or command[0] not in ("train", "resume"):
        raise LaunchError(
            "launch runs 'train' or 'resume': evorl-pop launch -n 2 -- train [OPTIONS], "
            f"got {' '.join(command) or 'no command'!r}."
        )
    if reserved := [a.split("=")[0] for a in command if a.split("=")[0] in RESERVED_OPTIONS]:
        raise LaunchError(f"{reserved[0]} is set by launch itself; leave it out.")
    counts = (
        ("-n", num_processes),
        ("--devices-per-process", devices_per_process),
        ("--gpus-per-process", gpus_per_process),
    )
    for name, value in counts:
        if value is not None and value < 1:
            raise LaunchError(f"{name} must be >= 1, got {value}.")
    if command[0] == "resume" and pid_file is not None:  # RUN/launch.json: RUN must exist
        folder = Path(pid_file).parent
        if not folder.is_dir() and any(Path(a) == folder for a in command[1:]):
            raise RunError(f"No run folder at {str(folder)!r}.")
    coordinator = f"{host}:{free_port(host) if port is None else port}"
    lock = threading.Lock()

    def say(message: str) -> None:
        with lock, contextlib.suppress(OSError, ValueError):  # a closed terminal: carry on
            err.write(f"[launch] {message}\n")
            err.flush()

    joining = ["--coordinator", coordinator, "--num-processes", str(num_processes)]
    children: list[subprocess.Popen] = []
    for i in range(num_processes):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", stop.LAUNCHER_PID: str(os.getpid())}
        env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
        if devices_per_process is not None:
            flags = env.get("XLA_FLAGS", "")
            env["XLA_FLAGS"] = processes.with_host_devices(flags, devices_per_process)
        if gpus_per_process is not None:
            ids = range(i * gpus_per_process, (i + 1) * gpus_per_process)
            env["JAX_LOCAL_DEVICE_IDS"] = ",".join(map(str, ids))
        argv = [python, "-m", "evorl_pop", *command, *joining, "--process-id", str(i)]
        # Own process groups: a terminal's Ctrl-C reaches the launcher only, which
        # passes it on once to each process.
        children.append(
            subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_child_setup,
            )
        )
        say(f"process {i}: pid {children[i].pid}")
    if pid_file is not None:
        record = dict(
            coordinator=coordinator,
            num_processes=num_processes,
            command=command,
            devices_per_process=devices_per_process,
            launcher_pid=os.getpid(),
            processes=[dict(process_id=i, pid=c.pid) for i, c in enumerate(children)],
        )
        try:
            Path(pid_file).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(pid_file, (json.dumps(record, indent=2) + "\n").encode())
        except OSError as error:
            say(f"cannot write {pid_file}: {error.strerror}")

    readers = [
        threading.Thread(target=_forward, args=(s, sink, f"[p{i}] ", lock), daemon=True)
        for i, c in enumerate(children)
        for s, sink in ((c.stdout, out), (c.stderr, err))
    ]
    for t in readers:
        t.start()

    def stop_all(first_signal: int) -> None:
        """Sends ``first_signal`` to every running process, SIGKILL after the grace period."""
        for sig, wait in ((first_signal, grace_period), (signal.SIGKILL, 5.0)):
            running = [c for c in children if c.poll() is None]
            for c in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.pid, sig)  # the process and anything it started
            deadline = time.monotonic() + wait
            while any(c.poll() is None for c in running) and time.monotonic() < deadline:
                time.sleep(0.05)

    received = []

    def on_signal(signum, frame):
        received.append(signum)
        raise SystemExit(128 + signum)

    # Ctrl-C must reach the launcher even when it was started with SIGINT ignored.
    handlers = {sig: on_signal for sig in FORWARDED}
    handlers[signal.SIGINT] = signal.default_int_handler
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, h) for sig, h in handlers.items()} if main else {}
    status = 0
    try:
        while (codes := [c.poll() for c in children]) != [0] * num_processes:
            i = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
            if i is None:
                time.sleep(0.1)
                continue
            what = describe_exit(codes[i])
            say(f"process {i} (pid {children[i].pid}) failed with {what}; stopping the others")
            stop_all(signal.SIGTERM)
            status = 128 - codes[i] if codes[i] < 0 else codes[i]
            say(f"error: process {i} failed ({what})")
            break
    except KeyboardInterrupt:
        say("interrupted: passing Ctrl-C on to every process")
        stop_all(signal.SIGINT)
        status = 130
    except SystemExit:  # SIGTERM, SIGUSR1, SIGHUP: each process stops after its chunk
        signum = received[-1] if received else signal.SIGTERM
        # A run stops on SIGTERM, not on a hang-up, whose default is to die at once.
        passed = signal.SIGTERM if signum == signal.SIGHUP else signum
        name, what = signal.Signals(signum).name, signal.Signals(passed).name
        say(f"{name}: passing {'it' if passed == signum else what} on to every process")
        stop_all(passed)
        status = 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop_all(signal.SIGKILL)
        for t in readers:
            t.join(timeout=5.0)
    return status
