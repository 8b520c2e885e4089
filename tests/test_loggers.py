"""TensorBoard and W&B loggers: what they hold read back and checked against metrics.csv, row
by row, across a kill and a resume; a user's own recorder; loggers that are not installed."""

import contextlib
import glob
import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _env import cli_env

from evorl_pop import cli
from evorl_pop.run import loggers, restore, shell, store
from evorl_pop.run.config import resolve_config

pytest.importorskip("tensorboard")
pytest.importorskip("tensorboardX")

SMALL = (
    "--task CartPole-v1 --pop 8 --set episode_length=20 --set hidden_sizes=[4] "
    "--set eval_episodes=1 --devices 1 --quiet --no-figure"
).split()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _env():
    return cli_env()


def _kill_past_checkpoint(run, logged, *args):
    """Starts a long run, and kills it (SIGKILL to its process group, as a scheduler does:
    W&B's service with it) once ``logged(run)`` holds a generation past its checkpoint;
    returns the checkpoint's generation and the last generation logged."""
    long_run = "--generations 100000 --chunk 1 --checkpoint-every 3".split()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evorl_pop.cli",
            "train",
            *SMALL,
            *long_run,
            "--out",
            str(run),
            *args,
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    try:
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "the run logged nothing past a checkpoint"
            time.sleep(0.2)
            if not (run / store.CHECKPOINT_FILENAME).exists():
                continue
            os.killpg(proc.pid, signal.SIGSTOP)  # frozen while we look
            at = restore.load_checkpoint(run).generation
            last = logged(run)
            if at >= 1 and last > at:
                return at, last
            os.killpg(proc.pid, signal.SIGCONT)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run that failed has ended
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tb_generations(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    return ea


def _tb_last(run):
    if not (run / "tb").is_dir():
        return 0
    ea = _tb_generations(run)
    if "generation" not in ea.Tags()["scalars"]:
        return 0
    return max(e.step for e in ea.Scalars("generation"))


def _check_tensorboard(run):
    ea = _tb_generations(run)
    metrics = store.read_metrics(run)
    generations, steps = metrics["generation"].tolist(), metrics["env_steps"].tolist()
    assert generations == list(range(1, len(generations) + 1))
    tags = set(ea.Tags()["scalars"])
    assert tags == {*metrics, *(loggers.ENV_STEPS_PREFIX + c for c in metrics)}
    for column, values in metrics.items():
        expected = values.astype(np.float32)  # TensorBoard keeps float32 scalars
        for tag, x in ((column, generations), (loggers.ENV_STEPS_PREFIX + column, steps)):
            events = ea.Scalars(tag)
            assert [e.step for e in events] == x, tag
            got = np.array([e.value for e in events], np.float32)
            np.testing.assert_array_equal(got, expected, err_msg=tag)
    hparams = [t for t in ea.summary_metadata if t.startswith("_hparams_")]
    assert hparams, "no hyperparameters"
    return ea


def test_tensorboard_holds_every_row_across_kill_and_resume(tmp_path):
    run = tmp_path / "killed"
    at, last = _kill_past_checkpoint(run, _tb_last, "--log", "tensorboard")
    total = last + 2
    assert cli.main(["resume", str(run), "--generations", str(total), "-q"]) == 0
    ea = _check_tensorboard(run)
    assert len(store.read_metrics(run)["generation"]) == total
    assert ea.Images("fitness")[-1].step == total  # the figure at the end
    # a second run beside it, from Python, the logger as an object
    other = tmp_path / "second"
    settings = (
        "task=CartPole-v1 population_size=8 episode_length=20 hidden_sizes=[4] seed=1 "
        "generations=3 devices=1"
    )
    config = resolve_config([], settings.split())
    shell.train(config, other, progress=False, recorders=[loggers.TensorBoard()])
    _check_tensorboard(other)


def _wandb_files(run):
    return sorted(glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb")))


def _rows(run):
    path = run / store.METRICS_FILENAME
    return len(store.read_metrics(run)["generation"]) if path.exists() else 0


def test_wandb_offline_history_across_kill_and_resume_keeps_one_id(tmp_path):
    pytest.importorskip("wandb")
    run = tmp_path / "killed"
    at, last = _kill_past_checkpoint(run, _rows, "--log", "wandb")
    total = last + 2
    assert cli.main(["resume", str(run), "--generations", str(total), "-q"]) == 0
    run_id = (run / loggers.WANDB_ID_FILENAME).read_text().strip()
    files = _wandb_files(run)
    assert len(files) == 2 and all(f.endswith(f"run-{run_id}.wandb") for f in files)
    history = [h for f in files for h in loggers.read_wandb_history(f) if "generation" in h]
    metrics = store.read_metrics(run)
    assert [h["_step"] for h in history] == list(range(1, total + 1))  # no duplicate, none lost
    for column, values in metrics.items():
        got = np.array([h[column] for h in history], np.float64)
        np.testing.assert_array_equal(got, values.astype(np.float64), err_msg=column)


class Rows(store.Recorder):
    """A user's recorder: keeps what it is given."""

    def __init__(self):
        self.rows = []
        self.images = []
        self.ended = None

    def row(self, row):
        self.rows.append(row)

    def image(self, name, path):
        self.images.append(name)

    def finish(self, run, completed):
        self.ended = completed


def test_a_users_recorder_gets_every_row(tmp_path):
    settings = "task=sphere num_dims=3 population_size=8 generations=4 chunk=3 devices=1"
    config = resolve_config([], settings.split())
    mine = Rows()
    shell.train(config, tmp_path / "r", progress=False, recorders=[mine])
    metrics = store.read_metrics(tmp_path / "r")
    assert [int(r["generation"]) for r in mine.rows] == metrics["generation"].tolist()
    for column, values in metrics.items():
        got = np.array([float(r[column]) for r in mine.rows])
        np.testing.assert_array_equal(got, values.astype(np.float64), err_msg=column)
    assert mine.images == ["fitness"] and mine.ended is True


def test_a_logger_not_installed_or_unknown_is_one_line(tmp_path, monkeypatch, capsys):
    find = importlib.util.find_spec
    missing = lambda name, *a: None if name == "tensorboardX" else find(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    out = tmp_path / "r"
    args = ["train", "--task", "sphere", "--set", "num_dims=2", "--pop", "4", "-g", "1", "-q"]
    assert cli.main([*args, "--out", str(out), "--log", "tensorboard"]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "pip install 'evorl-pop[tensorboard]'" in line
    assert not (out / store.METRICS_FILENAME).exists()
    assert cli.main([*args, "--out", str(out), "--set", "loggers=[csv,tensorbord]"]) == 2
    line = capsys.readouterr().err.strip()
    assert "tensorbord" in line and "tensorboard" in line and len(line.splitlines()) == 1
