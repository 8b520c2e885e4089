"""How runs end under a cluster's signals and bad files: a checkpoint, the resume
command, one line that says what to do, and nothing already written lost."""

import errno
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import typing

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _env import cli_env
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from evorl_pop import cli
from evorl_pop.base import CheckpointError
from evorl_pop.run import lock, plotting, restore, shell, stop, store

# A black-box run whose chunks take milliseconds: a signal finds it mid-run.
FAST = (
    "--strategy Open_ES --task sphere --pop 8 --set num_dims=4 --chunk 1 "
    "--checkpoint-every 100000 --quiet --no-figure"
).split()
COLUMNS = ("generation", "fitness_best", "fitness_mean", "env_steps")


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    # In-process commands with --devices edit XLA_FLAGS; undo it afterwards.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _env(**extra):
    return cli_env(**extra)


def _start(*args, launch=False):
    command = ["launch", "-n", "2", "--", *args] if launch else list(args)
    return subprocess.Popen(
        [sys.executable, "-m", "evorl_pop.cli", *command],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _rows(run) -> int:
    path = run / store.METRICS_FILENAME
    return max(len(path.read_text().splitlines()) - 1, 0) if path.exists() else 0


def _wait_rows(run, proc, n=3, timeout=300):
    deadline = time.time() + timeout
    while _rows(run) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "no metrics rows in time"
        time.sleep(0.05)


def _metrics(run):
    m = store.read_metrics(run)
    return {k: m[k] for k in COLUMNS}


def _same_rows(a, b, rtol=0.0):
    n = len(b["generation"])
    for k in COLUMNS:
        np.testing.assert_allclose(a[k][:n], b[k], rtol=rtol, err_msg=k)


def _main(capsys, argv):
    status = cli.main(argv)
    return status, capsys.readouterr().err


# --- signals ----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_checkpoints_tells_how_to_resume_and_the_resume_is_exact(tmp_path, sig):
    run = tmp_path / "run folder"  # a space: the printed command must still paste
    proc = _start("train", *FAST, "--generations", "1000000", "--out", str(run))
    _wait_rows(run, proc)
    running = _rows(run)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    ckpt = restore.load_checkpoint(run)
    assert ckpt.generation >= running and _rows(run) == ckpt.generation
    line = err.strip().splitlines()[-1]
    assert f"interrupted ({signal.Signals(sig).name}) after generation {ckpt.generation}" in line
    command = line.split("`")[1]
    assert shlex.split(command) == ["evorl-pop", "resume", str(run)]
    assert command in (run / store.LOG_FILENAME).read_text()
    # Resumed to a few generations more, it equals an uninterrupted run of that length.
    total = str(ckpt.generation + 3)
    assert cli.main(["resume", str(run), "--generations", total, "-q", "--no-figure"]) == 0
    whole = tmp_path / "whole"
    assert cli.main(["train", *FAST, "--generations", total, "--out", str(whole)]) == 0
    _same_rows(_metrics(run), _metrics(whole))
    assert len(_metrics(run)["generation"]) == int(total)


def test_a_time_limit_stops_with_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    status, err = _main(
        capsys, ["train", *FAST, "-g", "100000000", "--time-limit", "2s", "--out", str(run)]
    )
    assert status == 124, err
    generation = restore.load_checkpoint(run).generation
    assert 0 < generation < 100000000 and _rows(run) == generation
    assert "time limit of 2s" in err and "evorl-pop resume" in err
    with pytest.raises(SystemExit):
        cli.main(["train", *FAST, "--time-limit", "soon", "--out", str(run)])
    assert "not a duration" in capsys.readouterr().err


# A hang-up (the launcher's terminal closed) reaches the processes as SIGTERM.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_a_launch_stops_both_processes_after_the_same_generation(tmp_path, sig):
    run = tmp_path / "run"
    proc = _start("train", *FAST, "--generations", "1000000", "--out", str(run), launch=True)
    _wait_rows(run, proc)
    proc.send_signal(sig)
    start = time.time()
    out, err = proc.communicate(timeout=60)
    assert time.time() - start < 30 and proc.returncode == 128 + sig, err[-3000:]
    lines = [ln for ln in err.splitlines() if "interrupted (SIGTERM) after generation" in ln]
    generations = {ln[:4]: int(ln.split("after generation ")[1].split(";")[0]) for ln in lines}
    assert sorted(generations) == ["[p0]", "[p1]"], err[-3000:]
    assert generations["[p0]"] == generations["[p1]"] == restore.load_checkpoint(run).generation
    # one way on: process 0's, which wrote the checkpoint (process 1 may have looked first)
    hints = {ln[:4]: ln.split("; ", 1)[1] for ln in lines}
    assert hints["[p0]"] == f"continue from its last checkpoint with `evorl-pop resume {run}`."
    assert hints["[p1]"] == "process 0 writes the run folder, and its message says how to go on."


def test_children_of_a_killed_launcher_end(tmp_path):
    run = tmp_path / "run"
    proc = _start("train", *FAST, "--generations", "1000000", "--out", str(run), launch=True)
    _wait_rows(run, proc)
    pids = [p["pid"] for p in json.loads((run / "launch.json").read_text())["processes"]]
    proc.kill()
    proc.communicate()
    deadline = time.time() + 30
    alive = pids
    while alive and time.time() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if _alive(p)]
    for p in alive:  # leave nothing behind, then fail
        os.kill(p, signal.SIGKILL)
    assert not alive, f"processes {alive} outlived their launcher by 30 s"


def test_a_launch_whose_terminal_is_gone_still_drains_its_processes_output():
    """After a hang-up, writing to the closed terminal fails (EIO): the launcher keeps
    reading each process's output, so a process with more to say than a pipe holds
    (64 KiB) does not block on it but ends."""
    import threading

    from evorl_pop.run import launcher

    class ClosedTerminal:
        def write(self, text):
            raise OSError(errno.EIO, "Input/output error")

        def flush(self):
            pass

    lines = 20_000  # about 1 MB
    child = subprocess.Popen(
        [sys.executable, "-c", f"for i in range({lines}): print('x' * 50)"], stdout=subprocess.PIPE
    )
    args = (child.stdout, ClosedTerminal(), "[p0] ", threading.Lock())
    forward = threading.Thread(target=launcher._forward, args=args)
    forward.start()
    try:
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
    forward.join(timeout=60)
    assert not forward.is_alive()
    assert child.stdout.closed  # read to its end, then closed


def test_a_process_that_has_stopped_with_the_others_exits_with_them(tmp_path, monkeypatch):
    """A launcher's death reaches its processes half a second apart: one may already be
    exiting (the other stopped them both) when its own notice comes. That SIGTERM must
    not cut short the exit, whose shutdown barrier the other process is waiting in."""
    watched = (signal.SIGTERM, signal.SIGUSR1)
    before = {sig: signal.getsignal(sig) for sig in watched}
    try:
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
        assert cli.main(["train", *FAST, "-g", "1", "--out", str(tmp_path / "one")]) == 0
        # one process: a signal still stops it
        assert all(signal.getsignal(sig) is stop.at_once for sig in watched)
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
        assert cli.main(["train", *FAST, "-g", "1", "--out", str(tmp_path / "two")]) == 0
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in watched)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _alive(pid) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # not our child: raises; a zombie counts as gone
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_ctrl_c_in_a_python_objective_is_a_keyboard_interrupt(tmp_path):
    script = tmp_path / "objective.py"
    script.write_text(
        "import jax\n"
        "from evorl_pop.algorithms.es import ESConfig\n"
        "from evorl_pop.algorithms.restarts import minimize\n"
        "from evorl_pop.tasks.blackbox import PythonTask\n"
        "calls = 0\n"
        "def f(x):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls == 20:  # where a Ctrl-C lands when the callback runs on the main thread\n"
        "        raise KeyboardInterrupt\n"
        "    return float((x ** 2).sum())\n"
        "try:\n"
        "    minimize(ESConfig(strategy='CMA_ES', population_size=8), jax.random.key(0),\n"
        "             None, PythonTask(f, 4))\n"
        "except KeyboardInterrupt:\n"
        "    print('caught KeyboardInterrupt')\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "caught KeyboardInterrupt" in out.stdout, out.stderr[-3000:]


# --- another device count ---------------------------------------------------------------


def test_a_resume_on_another_device_count_continues_as_a_fresh_run_there(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main(["train", *FAST, "-g", "6", "--devices", "1", "--out", str(one)]) == 0
    status, err = _main(capsys, ["resume", str(one), "-g", "12", "--devices", "2", "-q"])
    assert status == 0 and "resuming on 2 device(s) a run checkpointed on 1" in err
    assert cli.main(["train", *FAST, "-g", "12", "--devices", "2", "--out", str(two)]) == 0
    _same_rows(_metrics(one), _metrics(two), rtol=1e-5)


# --- files that are not what they should be --------------------------------------------


def test_unreadable_config_files_are_named_in_one_line(tmp_path, capsys):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"population_size: 8\n\xff\xfe\x00")
    for path, words in (("/dev/zero", "is larger than"), (binary, "not UTF-8")):
        status, err = _main(capsys, ["train", "--config", str(path), "--out", str(tmp_path)])
        assert status == 2 and words in err and str(path) in err, err
        assert len(err.strip().splitlines()) == 1


def test_a_metrics_file_that_is_not_text_is_rebuilt_from_the_checkpoint(tmp_path, capsys):
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *FAST, "-g", "4", "--out", str(run)]) == 0
    path = run / store.METRICS_FILENAME
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe" + path.read_bytes()[40:])
    status, err = _main(capsys, ["resume", str(run), "-g", "6", "-q", "--no-figure"])
    assert status == 0 and "rebuilt from the checkpoint" in err, err
    assert cli.main(["train", *FAST, "-g", "6", "--out", str(whole)]) == 0
    _same_rows(_metrics(run), _metrics(whole))


def _write_payload(run, payload):
    body = flax.serialization.msgpack_serialize(payload)
    (run / store.CHECKPOINT_FILENAME).write_bytes(
        store.MAGIC + hashlib.sha256(body).digest() + body
    )


def test_a_checkpoint_with_a_valid_checksum_but_no_checkpoint_inside(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", *FAST, "-g", "2", "--out", str(run)]) == 0
    data = (run / store.CHECKPOINT_FILENAME).read_bytes()
    good = flax.serialization.msgpack_restore(data[len(store.MAGIC) + 32 :])
    for damage in (
        lambda p: p.pop("key"),
        lambda p: p.update(metrics_rows=b"not zlib"),
        lambda p: p.update(config="a string"),
        lambda p: p.update(generation="two"),
    ):
        payload = dict(good)
        damage(payload)
        _write_payload(run, payload)
        with pytest.raises(CheckpointError, match="does not hold a checkpoint"):
            restore.load_checkpoint(run)
    _write_payload(run, [1, 2, 3])
    with pytest.raises(CheckpointError, match="format"):
        restore.load_checkpoint(run)


def test_a_seed_beyond_64_bits_and_a_scalar_for_a_list_are_one_line_errors(tmp_path, capsys):
    for argv, words in (
        (["--seed", str(2**64)], "seed must be below 2**63"),
        (["--set", "hidden_sizes=64"], "write hidden_sizes=[64]"),
    ):
        status, err = _main(capsys, ["train", *argv, "-q", "--out", str(tmp_path / "x")])
        assert status == 2 and words in err and len(err.strip().splitlines()) == 1, err


# --- disks that are full or read-only ---------------------------------------------------


def test_a_figure_that_cannot_be_written_still_ends_the_run_with_done(
    tmp_path, capsys, monkeypatch
):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "fitness.png"))

    monkeypatch.setattr(plotting, "plot_runs", full)
    argv = ["train", *[a for a in FAST if a not in ("--quiet", "--no-figure")]]
    status, err = _main(capsys, [*argv, "-g", "2", "--out", str(tmp_path / "run")])
    assert status == 0 and "done: generation 2" in err and "Traceback" not in err, err
    assert "no figure (No space left on device)" in err
    status, err = _main(capsys, ["plot", str(tmp_path / "run")])
    assert status == 1 and "--out FILE" in err and len(err.strip().splitlines()) == 1, err


def test_a_run_folder_that_cannot_be_created_is_one_line(tmp_path, capsys, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(lock, "write_atomic", full)
    status, err = _main(capsys, ["train", *FAST, "-g", "2", "--out", str(tmp_path / "run")])
    assert status == 1 and "No space left" in err and len(err.strip().splitlines()) == 1, err


# --- a run stopped before its first checkpoint ------------------------------------------


def test_a_run_without_a_checkpoint_is_started_again_not_resumed(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", *FAST, "-g", "2", "--out", str(run)]) == 0
    (run / store.CHECKPOINT_FILENAME).unlink()  # as a kill before the first checkpoint
    status, err = _main(capsys, ["resume", str(run)])
    assert status == 1 and "has no checkpoint" in err, err
    command = shlex.split(err.split("`")[1])
    assert command[:2] == ["evorl-pop", "train"] and "--overwrite" in command
    assert cli.main([*command[1:], "-q", "--no-figure"]) == 0  # it runs as printed
    # a write a kill cut short is cleared when the run folder is taken again
    stale = run / f".{store.CHECKPOINT_FILENAME}.abc123.tmp"
    stale.write_bytes(b"partial")
    assert cli.main(["resume", str(run), "--more", "1", "-q", "--no-figure"]) == 0
    assert not stale.exists()


class _Slow(typing.NamedTuple):
    generation: object
    x: object


class _OneSlowDevice:
    """Device 1's host callback takes 0.4 s; the replicated output is device 0's, which
    does not wait for it."""

    def __init__(self, finished):
        self.finished = finished

    def host(self, index, generation):  # the generation keeps XLA from merging the calls
        index = int(np.asarray(index).reshape(-1)[0])
        if index == 1:
            time.sleep(0.4)
        self.finished.append(index)
        return np.float32(0)

    def step(self, state, key):
        def per_device(x, generation):
            index = jax.lax.axis_index("POP")
            done = jax.pure_callback(
                self.host, jax.ShapeDtypeStruct((), jnp.float32), index, generation
            )
            return x + 0 * done  # device 1's value is dropped: P() keeps device 0's

        mesh = Mesh(np.array(jax.devices()[:2]), ("POP",))
        # check_vma=False: the output is replicated only by this test's construction.
        x = jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(
            state.x, state.generation
        )
        return _Slow(state.generation + 1, x), {"fitness_best": x, "fitness_mean": x}


def test_train_loop_returns_after_every_device_has_run():
    # A host callback still running when the interpreter exits aborts the process.
    finished = []
    state = _Slow(jnp.int32(0), jnp.float32(1))
    # The first chunk (which compiles) waits for every device, and each chunk waits for
    # the last one's outputs on every device: the last chunk is the one that can outrun.
    shell.train_loop(_OneSlowDevice(finished), state, jax.random.key(0), 3, chunk=1, progress=False)
    assert sorted(finished) == [0, 0, 0, 1, 1, 1]
