"""How a run stops early: Ctrl-C, SIGTERM, SIGUSR1, its time limit, a launcher that is gone.

::

    what arrives                        what the run does                    exit status
    Ctrl-C (SIGINT)                     stops after the current chunk;       130
                                        a second one stops at once
    SIGTERM, SIGUSR1 (a scheduler)      as Ctrl-C                            143, 138
    the session's time limit            stops before a chunk would pass it   124
    the launcher is gone (kill -9)      SIGTERM to itself; exits within a
                                        minute in any case
    a signal before the session         stops at the next safe point         as above
                                        (`evorl-pop`), or at once (the API)

A stop after a chunk is the same on every process (:class:`Poll` asks them
all), so they checkpoint the same generation. The run shell then raises
:class:`Interrupted`, whose message says what the run folder holds and how to
go on; the command line prints it (:func:`report`) and exits with its status.

The run shell arms the controller: a :class:`Flag` handles the stop signals
during a session (:data:`STOP_SIGNALS`), and the session reads it between
chunks, through a :class:`Poll` when there is a time limit or other
processes. ``evorl-pop`` holds the stop signals from its first instant
(:func:`hold`, before JAX is imported): a signal sets the flag its session takes
over, and the command stops where it checks (:func:`check`), never inside an
import or a callback that would drop the interrupt. The Python entry points
stop at once on a signal before the session (:func:`at_once`). The command line
follows a launcher (:func:`watch_launcher`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evorl_pop.run.recorders import Run

# This module imports no JAX at its top: ``evorl-pop`` holds the stop signals with it
# (:func:`hold`) before anything heavy is imported.

#: Signals that stop a run at the end of its chunk (SIGUSR1: SLURM's early notice).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
#: The exit status of a run that reached its time limit, as timeout(1) ends a command.
TIME_LIMIT_STATUS = 124
#: The variable that tells a launched process its launcher's pid (see :func:`watch_launcher`).
LAUNCHER_PID = "EVORL_POP_LAUNCHER_PID"


class Interrupted(KeyboardInterrupt):
    """A run stopped early (Ctrl-C, a signal, its time limit), with a message that says
    what the run folder holds now.

    Attributes:
      status: the command line's exit status.
      why: what stopped it (``'Ctrl-C'``, ``'SIGTERM'``, ``'time limit of 60s'``).
      generation: the generations completed, if the session had begun.
    """

    def __init__(
        self,
        message: str = "",
        status: int = 130,
        why: str = "Ctrl-C",
        generation: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.why = why
        self.generation = generation


class Requested(KeyboardInterrupt):
    """:func:`~evorl_pop.run.loop.train_loop` stopped between chunks, as its ``stop`` asked."""


def signal_name(signum: int) -> str:
    """``'Ctrl-C'`` for SIGINT, else the signal's name (``'SIGTERM'``)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Flag(threading.Event):
    """Set by the first stop signal of a session: the run stops after its current chunk.

    :meth:`handler` is the session's handler of :data:`STOP_SIGNALS`; a second
    signal stops at once. ``signum`` is the signal that set the flag.
    """

    signum: int | None = None

    def handler(self, signum: int, frame) -> None:
        if self.is_set():
            raise KeyboardInterrupt  # the second signal: at once
        self.signum = signum
        self.set()
        name = signal_name(signum)
        print(
            f"\n{name}: stopping after the current chunk ({name} again to stop at once)",
            file=sys.stderr,
            flush=True,
        )


class Poll:
    """Whether to stop before the next chunk, for a session with a time limit or with
    other processes (without either, the :class:`Flag` alone answers).

    It stops for the time limit when another chunk as long as the last would pass
    it. Under ``jax.distributed`` the answer is a collective: every process stops
    after the same chunk when one of them was told to stop.

    Args:
      flag: the session's flag.
      time_limit: seconds the session may train, from now (``None``: no limit).
    """

    def __init__(self, flag: Flag, time_limit: float | None = None):
        self.flag = flag
        self.time_limit = time_limit
        self.t0 = time.monotonic()
        self.last = self.t0
        self.out_of_time = False

    def __call__(self) -> bool:
        import jax

        from evorl_pop.run import processes

        now = time.monotonic()
        chunk = now - self.last
        self.last = now
        if self.time_limit is not None and now - self.t0 + chunk > self.time_limit:
            self.out_of_time = True
        local = self.flag.is_set() or self.out_of_time
        return local if jax.process_count() == 1 else processes.any_process(local)


def reason(flag: Flag, poll) -> tuple[str, int]:
    """What stopped a session that its poll stopped, and the exit status that says so.

    Args:
      flag: the session's flag.
      poll: what the session asked between chunks (a :class:`Poll`, or the flag's ``is_set``).
    """
    if flag.signum is not None:
        return signal_name(flag.signum), 128 + flag.signum
    if isinstance(poll, Poll) and poll.out_of_time:
        return f"time limit of {poll.time_limit:g}s", TIME_LIMIT_STATUS
    return "another process was stopped", 128 + signal.SIGTERM


def interrupted(err: KeyboardInterrupt, flag: Flag, poll, run: Run) -> Interrupted:
    """The :class:`Interrupted` a session ends with, for the ``err`` that stopped it.

    Args:
      err: :class:`Requested` (the poll said stop: every process stopped after the
        same chunk), an :class:`Interrupted` (a signal before the session's own
        handlers) or a plain ``KeyboardInterrupt`` (a second signal, or Ctrl-C
        before the session's handlers).
      flag, poll: the session's flag and poll.
      run: the run; its folder and generation go into the message.
    """
    if isinstance(err, Requested):
        why, status = reason(flag, poll)
    elif isinstance(err, Interrupted):
        why = err.why
        status = err.status
    else:
        signum = flag.signum or signal.SIGINT
        why = signal_name(signum)
        status = 128 + signum
    from evorl_pop.run import folder

    return Interrupted(folder.resume_hint(run.run_dir), status, why, run.generation)


def told(err: KeyboardInterrupt, run_dir: Path) -> KeyboardInterrupt:
    """A stop that came before the session's own handlers (while the run folder was
    taken, the state built), with the message of what the run folder holds.

    Returns:
      ``err`` itself when it says so already, or when nothing was written (the
        command line then says the run stopped before training began); else an
        :class:`Interrupted` with the command that starts or resumes the run.
    """
    from evorl_pop.run import folder

    if str(err) or not (run_dir / folder.CONFIG_FILENAME).exists():
        return err
    status, why = (err.status, err.why) if isinstance(err, Interrupted) else (130, "Ctrl-C")
    return Interrupted(folder.resume_hint(run_dir), status, why)


#: The command's flag while :func:`hold` holds the stop signals (``None``: not held).
_held: Flag | None = None


def hold() -> Flag:
    """Holds the stop signals for ``evorl-pop`` from its first instant, before JAX is imported.

    A signal only sets the returned flag: raising ``KeyboardInterrupt`` in whatever
    runs then could lose it (one raised in a garbage-collector callback or a
    finalizer is printed as "Exception ignored" and dropped). The command stops
    where it checks (:func:`check`: after the imports, after joining the other
    processes, after building the state), and a session takes the flag as its own,
    so a signal before it stops the run before its first chunk. A second signal
    stops at once. Calling it again re-installs the handlers (after
    ``jax.distributed``'s, which takes SIGTERM) and keeps the flag.

    Returns:
      The flag (its ``signum``: the first signal).
    """
    global _held
    if _held is None:
        _held = Flag()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_held)
    return _held


def _on_held(signum: int, frame) -> None:
    flag = _held
    if flag is None or flag.is_set():
        raise KeyboardInterrupt  # the second signal: at once
    flag.signum = signum
    flag.set()
    name = signal_name(signum)
    # Never raises: stderr may be closed, or be written by the code it interrupted.
    with contextlib.suppress(Exception):
        print(f"\n{name}: stopping ({name} again to stop at once)", file=sys.stderr, flush=True)


def held() -> Flag | None:
    """The flag of :func:`hold`, while the stop signals are held."""
    return _held


def check(message: str = "", generation: int | None = None) -> None:
    """Raises :class:`Interrupted` when a stop signal came while they are held.

    Args:
      message: what the run folder holds (empty: nothing was written).
      generation: the generations completed, if a session ran.
    """
    flag = _held
    if flag is not None and flag.is_set():
        raise Interrupted(message, 128 + flag.signum, signal_name(flag.signum), generation)


def release() -> None:
    """Ends :func:`hold` (for a command that is no run): Ctrl-C raises
    ``KeyboardInterrupt`` again and the other stop signals end the process; a signal
    that came while held raises :class:`Interrupted` now."""
    global _held
    if _held is None:
        return
    for signum in STOP_SIGNALS:
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, default)
    try:
        check()
    finally:
        _held = None


def at_once(signum: int, frame) -> None:
    """The command line's handler of SIGTERM and SIGUSR1 until a session takes over:
    the command ends as Ctrl-C ends it."""
    raise Interrupted("", 128 + signum, signal.Signals(signum).name)


def ignore_stop_signals() -> None:
    """Ignores SIGTERM and SIGUSR1 in a multi-process run whose session has ended.

    What is left is the exit, which waits for the other processes
    (jax.distributed's shutdown barrier). A SIGTERM now, such as a dead launcher's
    notice reaching a process that had already stopped with the others, would cut
    the exit short and leave them waiting out their shutdown timeout. SIGKILL,
    and the deadline of :func:`watch_launcher`, still end it.
    """
    for signum in STOP_SIGNALS[1:]:
        signal.signal(signum, signal.SIG_IGN)


def report(err: KeyboardInterrupt, command: str) -> int:
    """Prints the line that ends an interrupted command; returns its exit status."""
    told = isinstance(err, Interrupted)
    why, generation = (err.why, err.generation) if told else ("Ctrl-C", None)
    when = "" if generation is None else f" after generation {generation}"
    what = str(err) or "stopped before training began; nothing was written"
    print(f"\nevorl-pop {command}: interrupted ({why}){when}; {what}", file=sys.stderr)
    return err.status if told else 130


def watch_launcher(grace: float = 60.0, every: float = 0.5) -> None:
    """In a process that ``evorl-pop launch`` started: when the launcher is gone
    (killed, even by SIGKILL), stop as SIGTERM stops a run (after the current chunk,
    with a checkpoint), and exit after ``grace`` seconds in any case.

    Output goes to ``/dev/null`` from then on: nothing reads it. A thread polls the
    parent's pid, which works on every POSIX system (Linux's parent-death signal
    would reach JAX's own SIGTERM handler before the run's). Without
    :data:`LAUNCHER_PID` in the environment it does nothing.
    """
    pid = os.environ.get(LAUNCHER_PID, "")
    if not pid.isdigit():
        return

    def watch():
        while os.getppid() == int(pid):
            time.sleep(every)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="watch-launcher", daemon=True).start()
