"""Training across processes: evorl-pop launch, equal results, a killed process, resume.

Runs under ``evorl-pop launch`` (2 processes x 2 CPU devices over loopback,
gloo collectives) are compared with single-process runs of the same seed on
4 devices and on 1 device, in-process (the 8 simulated devices of conftest).
"""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from _env import cli_env
from flax.traverse_util import flatten_dict

from evorl_pop import cli
from evorl_pop.run import launcher, restore, store

OPENES = [
    "--strategy", "Open_ES", "--task", "CartPole-v1", "--pop", "16", "--seed", "3",
    "--set", "sigma_init=0.1", "--set", "learning_rate=0.05",
]  # fmt: skip
CMAES = ["--strategy", "CMA_ES", "--task", "sphere", "--pop", "8", "--set", "num_dims=4"]
FITNESS = ("fitness_best", "fitness_mean", "fitness_worst")


def _env():
    return cli_env()


def _launch(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "evorl_pop.cli", "launch", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    # In-process commands with --devices edit XLA_FLAGS; undo it afterwards.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _fitness(run):
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {name: np.array([float(r[name]) for r in rows]) for name in FITNESS}


def _flat(tree):
    return {k: np.asarray(v) for k, v in flatten_dict(tree, sep="/").items() if v is not None}


def _assert_same_state(a, b, rtol=1e-3, atol=1e-3):
    # Eigenvectors (CMA-ES) amplify float differences of a changed reduction order.
    flat_a, flat_b = _flat(a.state), _flat(b.state)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        x, y = flat_a[name], flat_b[name]
        if x.dtype.kind in "iub":
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize(
    "job",
    # CMA-ES's: the exhaustive tier (OpenES's runs the same two-process path)
    [
        pytest.param(OPENES, id="openes-cartpole", marks=pytest.mark.slow),
        pytest.param(CMAES, id="cmaes-sphere", marks=pytest.mark.exhaustive),
    ],
)
def test_two_processes_equal_one_process_and_one_device(tmp_path, job):
    common = [*job, "--generations", "6", "--chunk", "3", "--checkpoint-every", "3", "-q"]
    multi = tmp_path / "2x2"
    result = _launch(
        "-n", "2", "--devices-per-process", "2", "--",
        "train", *common, "--no-figure", "--out", str(multi),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((multi / "launch.json").read_text())
    assert [p["process_id"] for p in record["processes"]] == [0, 1]
    log = (multi / "train.log").read_text()
    assert "4 device(s) on the population axis, 2 process(es)" in log
    # Only process 0 writes: one header, one row per generation.
    assert (multi / "metrics.csv").read_text().count("generation,") == 1

    for devices in ("4", "1"):
        out = tmp_path / f"1x{devices}"
        assert cli.main(["train", *common, "--devices", devices, "--out", str(out)]) == 0
        reference = _fitness(out)
        got = _fitness(multi)
        for name in FITNESS:
            assert len(got[name]) == 6
            np.testing.assert_allclose(
                got[name], reference[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} vs {out.name}"
            )
        _assert_same_state(restore.load_checkpoint(multi), restore.load_checkpoint(out))


KILL_JOB = [
    *OPENES, "--generations", "120", "--chunk", "2", "--checkpoint-every", "2", "-q",
    "--no-figure",
]  # fmt: skip


@pytest.mark.slow
def test_killed_process_stops_the_launch_and_the_run_resumes(tmp_path):
    run, whole = tmp_path / "killed", tmp_path / "whole"
    launch = subprocess.Popen(
        [sys.executable, "-m", "evorl_pop.cli", "launch", "-n", "2",
         "--devices-per-process", "2", "--grace-period", "5", "--",
         "train", *KILL_JOB, "--out", str(run)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    captured = {}
    readers = [
        threading.Thread(target=lambda n, s: captured.__setitem__(n, s.read()), args=(n, s))
        for n, s in (("out", launch.stdout), ("err", launch.stderr))
    ]
    for t in readers:
        t.start()
    deadline = time.time() + 240
    while not (run / store.CHECKPOINT_FILENAME).exists():
        assert launch.poll() is None, "the launch ended before its first checkpoint"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    pids = {
        p["process_id"]: p["pid"]
        for p in json.loads((run / "launch.json").read_text())["processes"]
    }
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.time()
    try:
        returncode = launch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        launch.kill()
        pytest.fail("the launcher did not stop within 60 seconds of a dead process")
    stopped_after = time.time() - killed_at
    for t in readers:
        t.join(timeout=10)
    err = captured.get("err", "")
    assert returncode != 0
    assert stopped_after < 60
    assert "process 1" in err and "SIGKILL" in err, err[-3000:]
    for pid in pids.values():  # no process of the run is left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    at_kill = restore.load_checkpoint(run)  # the last checkpoint is whole
    assert 0 < at_kill.generation < 120, "the run ended before it was killed"

    # Resume on another layout: 2 processes x 1 device.
    resumed = _launch("-n", "2", "--devices-per-process", "1", "--", "resume", str(run), "-q")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"resume from generation {at_kill.generation}" in (run / "train.log").read_text()

    assert cli.main(["train", *KILL_JOB, "--devices", "2", "--out", str(whole)]) == 0
    a, b = restore.load_checkpoint(run), restore.load_checkpoint(whole)
    assert a.generation == b.generation == 120
    assert a.env_steps == b.env_steps
    np.testing.assert_array_equal(a.key, b.key)
    _assert_same_state(a, b)
    got, reference = _fitness(run), _fitness(whole)
    for name in FITNESS:
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_launch_refuses_reserved_options_and_other_commands():
    with pytest.raises(launcher.LaunchError, match="set by launch itself"):
        launcher.launch(["train", "--process-id", "0"], 2)
    with pytest.raises(launcher.LaunchError, match="'train' or 'resume'"):
        launcher.launch(["plot", "RUN"], 2)
    assert launcher.describe_exit(-9) == "signal SIGKILL"
    assert launcher.describe_exit(3) == "exit code 3"


@pytest.mark.slow
def test_without_the_launcher_survivors_fail_instead_of_hanging(tmp_path):
    # Two processes started by hand; the coordinator notices the dead one when
    # its heartbeats stop, and the survivor terminates with an error.
    run = tmp_path / "bare"
    port = launcher.free_port()
    env = _env()
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "evorl_pop.cli", "train", *KILL_JOB,
             "--generations", "5000", "--out", str(run),
             "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(i), "--heartbeat-timeout", "5"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]  # fmt: skip
    try:
        deadline = time.time() + 240
        while not (run / store.CHECKPOINT_FILENAME).exists():
            assert procs[0].poll() is None and procs[1].poll() is None
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        procs[1].send_signal(signal.SIGKILL)
        try:
            returncode = procs[0].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the surviving process hung after its peer died")
        assert returncode != 0
        assert 0 < restore.load_checkpoint(run).generation < 5000
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_ctrl_c_reaches_every_process_and_they_checkpoint(tmp_path):
    run = tmp_path / "interrupted"
    launch = subprocess.Popen(
        [sys.executable, "-m", "evorl_pop.cli", "launch", "-n", "2", "--",
         "train", *KILL_JOB, "--generations", "5000", "--out", str(run)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while not (run / store.CHECKPOINT_FILENAME).exists():
        assert launch.poll() is None, launch.communicate()[1][-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    launch.send_signal(signal.SIGINT)
    try:
        _, err = launch.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        launch.kill()
        pytest.fail("Ctrl-C did not stop the launch")
    assert launch.returncode == 130
    assert "[p0] evorl-pop train: interrupted" in err and "[p1] evorl-pop train: interrupted" in err
    assert "stopped (Ctrl-C) after generation" in (run / "train.log").read_text()
    assert 0 < restore.load_checkpoint(run).generation < 5000
