"""Ctrl-C from the first instant of ``evorl-pop train``: while Python starts the command,
while JAX is imported, while the first chunk compiles. Each ends the command with exit
status 130 and one line that says what the run folder holds, never a traceback or an
interrupt dropped in a callback ("Exception ignored") that lets the run go on."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from _env import cli_env

from evorl_pop import cli
from evorl_pop.run import restore, stop, store

ROOT = Path(__file__).resolve().parents[1]
#: A run long enough that nothing but the signal ends it in time.
JOB = (
    "train --strategy CMA_ES --task sphere --pop 8 --set num_dims=3 --chunk 2 --devices 2 "
    "--quiet --no-figure -g 100000"
).split()
LINUX = Path("/proc/self/status").exists()
STOPPED_EARLY = "evorl-pop train: interrupted (Ctrl-C); stopped before training began; "


def _start(run: Path) -> subprocess.Popen:
    # the function the `evorl-pop` script runs (checked below), as a module
    return subprocess.Popen(
        [sys.executable, "-m", "evorl_pop", *JOB, "--out", str(run)],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(ready, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    """Waits until ``ready()``, the process still running."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:g}s"
        time.sleep(0.002)


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler of ``signum`` (Linux's SigCgt mask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return False


def _has_loaded(pid: int, name: str) -> bool:
    """Whether a shared library whose path holds ``name`` is mapped in the process."""
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_command_is_the_entry_that_holds_ctrl_c_before_importing_jax():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["evorl-pop"] == "evorl_pop.__main__:main"
    # Importing the entry (and the package it is in) imports no JAX.
    code = "import sys, evorl_pop.__main__; print(sorted(m for m in sys.modules if 'jax' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def _ends_in_one_line(p: subprocess.Popen, when: str, status: int = 130) -> str:
    """The last line of a stopped command's stderr, once its status and the rest are right."""
    _, err = p.communicate(timeout=300)
    assert p.returncode == status, (when, err[-3000:])
    for dropped in ("Traceback", "Exception ignored", "KeyboardInterrupt"):
        assert dropped not in err, (when, err[-3000:])
    return err.strip().splitlines()[-1]


@pytest.mark.skipif(not LINUX, reason="reads the process's state from /proc")
def test_ctrl_c_before_and_while_jax_is_imported_stops_with_130_and_one_line(tmp_path):
    runs = {when: tmp_path / when for when in ("at_once", "importing_jax")}
    procs = {when: _start(run) for when, run in runs.items()}
    # The first instant the command's own code runs: it has taken SIGTERM (Python does not).
    p = procs["at_once"]
    _until(lambda: _catches(p.pid, signal.SIGTERM), p, "handler")
    p.send_signal(signal.SIGINT)
    # While JAX is imported: its compiled library is loaded, its modules still importing.
    p = procs["importing_jax"]
    _until(lambda: _has_loaded(p.pid, "jaxlib"), p, "jaxlib")
    p.send_signal(signal.SIGINT)
    for when, p in procs.items():
        assert _ends_in_one_line(p, when) == STOPPED_EARLY + "nothing was written", when
        assert not runs[when].exists(), when


@pytest.mark.slow  # compiles; the instants before it are the default tier's
@pytest.mark.skipif(not LINUX, reason="reads the process's state from /proc")
def test_ctrl_c_while_the_first_chunk_compiles_stops_after_it_at_most(tmp_path):
    run = tmp_path / "run"
    p = _start(run)
    # The state is built and config.yaml written: the first chunk is being compiled.
    _until((run / store.CONFIG_FILENAME).exists, p, "config.yaml")
    p.send_signal(signal.SIGINT)
    last = _ends_in_one_line(p, "compiling")
    assert last.startswith("evorl-pop train: interrupted (Ctrl-C) after generation "), last
    if (run / store.CHECKPOINT_FILENAME).exists():  # it stopped after its first chunk
        assert f"evorl-pop resume {run}" in last, last
        assert restore.load_checkpoint(run).generation <= 2  # a chunk at most, not the run
    else:
        assert "no checkpoint was written" in last, last


@pytest.mark.skipif(not LINUX, reason="reads the process's state from /proc")
def test_sigterm_while_importing_jax_stops_with_143(tmp_path):
    p = _start(tmp_path / "run")
    _until(lambda: _has_loaded(p.pid, "jaxlib"), p, "jaxlib")
    p.send_signal(signal.SIGTERM)
    last = _ends_in_one_line(p, "importing_jax", 128 + signal.SIGTERM)
    assert last == STOPPED_EARLY.replace("Ctrl-C", "SIGTERM") + "nothing was written", last
    assert not (tmp_path / "run").exists()


@pytest.fixture
def held():
    """The stop signals held as ``evorl-pop`` holds them, given back afterwards."""
    before = {signum: signal.getsignal(signum) for signum in stop.STOP_SIGNALS}
    yield stop.hold()
    with contextlib.suppress(KeyboardInterrupt):
        stop.release()
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_held_signal_raises_nowhere_and_stops_where_checked(held):
    stop.check()  # nothing came: goes on
    signal.raise_signal(signal.SIGTERM)  # sets the flag, raises nothing here
    assert held.is_set() and held.signum == signal.SIGTERM
    with pytest.raises(stop.Interrupted) as stopped:
        stop.check("what the folder holds", 3)
    assert (stopped.value.status, stopped.value.why) == (143, "SIGTERM")
    assert (str(stopped.value), stopped.value.generation) == ("what the folder holds", 3)
    with pytest.raises(KeyboardInterrupt):  # a second signal: at once
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(stop.Interrupted):  # given back: what came is not forgotten
        stop.release()
    assert stop.held() is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_command_held_with_a_signal_pending_stops_before_it_writes(
    held, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # --devices edits it
    signal.raise_signal(signal.SIGINT)
    run = tmp_path / "run"
    assert cli.main([*JOB[:-2], "-g", "2", "--out", str(run)]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == STOPPED_EARLY + "nothing was written"
    assert not run.exists()
    # a command that is no run gives the signals back, and stops on what came
    with pytest.raises(stop.Interrupted):
        stop.release()
    stop.hold()
    signal.raise_signal(signal.SIGINT)
    assert cli.main(["list"]) == 130
    assert stop.held() is None


def test_a_signal_in_the_last_chunk_leaves_the_run_complete_and_says_so(
    held, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    add = store.Run.add

    def add_then_ctrl_c(self, *args, **kwargs):  # the signal comes as the last chunk ends
        add(self, *args, **kwargs)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(store.Run, "add", add_then_ctrl_c)
    run = tmp_path / "run"
    assert cli.main([*JOB[:-2], "-g", "2", "--out", str(run)]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    want = (
        f"evorl-pop train: interrupted (Ctrl-C) after generation 2; the run is complete in {run}."
    )
    assert last == want
    assert restore.load_checkpoint(run).generation == 2
    assert store.read_metrics(run)["generation"].tolist() == [1, 2]
