"""The evorl-pop command line: kill and resume, config errors, help, list, plot."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _env import cli_env, run_cli
from flax.traverse_util import flatten_dict

from evorl_pop import cli
from evorl_pop.base import CheckpointError
from evorl_pop.run import config, restore, store

# A job that compiles quickly and then runs long enough (a few seconds) to be
# killed in the middle: OpenES on CartPole, small population, 2 generations a chunk.
JOB = (
    "--strategy Open_ES --task CartPole-v1 --pop 32 --seed 5 --chunk 2 --checkpoint-every 2 "
    "--devices 2 --set sigma_init=0.1 --set learning_rate=0.05"
).split()
GENERATIONS = 120


def _env():
    return cli_env()


def _cli(*args, **kwargs):
    return run_cli(*args, env=_env(), **kwargs)


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    # In-process commands with --devices edit XLA_FLAGS; undo it afterwards.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# long tier: test_faults' resume after a signal stays in the default tier
@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    ckpt_path = killed / store.CHECKPOINT_FILENAME
    job = [sys.executable, "-m", "evorl_pop.cli", "train", *JOB, "-g", str(GENERATIONS), "-q"]
    proc = subprocess.Popen(
        [*job, "--out", str(killed), "--no-figure"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # Meanwhile, the same job uninterrupted (the two share the cores).
    reference = subprocess.Popen(
        [*job, "--out", str(whole)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not ckpt_path.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(0.05)  # a few chunks further, so rows past the checkpoint may exist
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    _, reference_err = reference.communicate(timeout=600)
    assert reference.returncode == 0, reference_err
    at_kill = restore.load_checkpoint(killed)
    assert 0 < at_kill.generation < GENERATIONS, "the run ended before it was killed"

    # Every line of the metrics file is whole, and it parses.
    text = (killed / store.METRICS_FILENAME).read_text()
    assert text.endswith("\n")
    rows = _rows(killed / store.METRICS_FILENAME)
    assert [int(r["generation"]) for r in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        assert all(v != "" for v in r.values())
        [float(v) for v in r.values()]

    resumed = _cli("resume", str(killed), "--quiet")
    assert resumed.returncode == 0, resumed.stderr

    a, b = restore.load_checkpoint(killed), restore.load_checkpoint(whole)
    assert a.generation == b.generation == GENERATIONS
    assert a.env_steps == b.env_steps
    np.testing.assert_array_equal(a.key, b.key)
    flat_a, flat_b = _flat(a.state), _flat(b.state)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)

    rows_a, rows_b = _rows(killed / "metrics.csv"), _rows(whole / "metrics.csv")
    assert len(rows_a) == len(rows_b) == GENERATIONS
    for ra, rb in zip(rows_a, rows_b, strict=True):
        ra.pop("wall_time"), rb.pop("wall_time")
        assert ra == rb
    assert (killed / "fitness.png").stat().st_size > 0
    log = (killed / "train.log").read_text()
    assert f"resume from generation {at_kill.generation}" in log


def _flat(tree):
    return {k: np.asarray(v) for k, v in flatten_dict(tree, sep="/").items() if v is not None}


def test_train_names_its_run_folder_once_the_run_is_built(tmp_path, capsys):
    """A value only the built run can check (PPO's num_envs) stops the command before
    it names a folder; a run that starts names its folder, once."""
    bad = tmp_path / "bad"
    assert cli.main(["train", "-a", "ppo", "--set", "num_envs=0", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "num_envs must be at least 1, got 0" in err
    assert "run folder" not in err and not bad.exists()
    good = tmp_path / "good"
    job = ["--strategy", "CMA_ES", "--task", "sphere", "--pop", "8", "--set", "num_dims=3"]
    assert cli.main(["train", *job, "--generations", "2", "--no-figure", "--out", str(good)]) == 0
    assert capsys.readouterr().err.count(f"run folder: {good}") == 1


# --- in-process commands (the 8 simulated devices of conftest) -------------------------

SMALL = (
    "--strategy CMA_ES --task sphere --pop 8 --set num_dims=3 --chunk 2 --checkpoint-every 2 "
    "--devices 2 --quiet"
).split()


def _train(out, *extra):
    return cli.main(["train", *SMALL, "--generations", "4", "--out", str(out), *extra])


def test_resume_refuses_a_changed_config_unless_forced(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--no-figure") == 0
    before = (run / "metrics.csv").read_text()
    assert cli.main(["resume", str(run), "--more", "2", "--set", "population_size=10", "-q"]) == 1
    err = capsys.readouterr().err
    assert "population_size: 8 -> 10" in err and "--force" in err
    assert (run / "metrics.csv").read_text() == before
    # The same refusal when config.yaml was edited by hand.
    edited = (run / "config.yaml").read_text().replace("population_size: 8", "population_size: 12")
    (run / "config.yaml").write_text(edited)
    assert cli.main(["resume", str(run), "--more", "2", "-q"]) == 1
    assert "population_size: 8 -> 12" in capsys.readouterr().err
    # Run settings may change; --force accepts the rest.
    assert cli.main(["resume", str(run), "--more", "2", "--chunk", "1", "--force", "-q"]) == 0
    rows = _rows(run / "metrics.csv")
    assert [int(r["generation"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert restore.load_checkpoint(run).config["algorithm_config"]["population_size"] == 12


def test_resume_to_a_total_and_nothing_to_do(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--no-figure") == 0
    assert cli.main(["resume", str(run), "--generations", "6", "-q", "--no-figure"]) == 0
    assert restore.load_checkpoint(run).generation == 6
    assert cli.main(["resume", str(run), "-q", "--no-figure"]) == 0  # already there
    assert restore.load_checkpoint(run).generation == 6
    assert cli.main(["resume", str(run), "--generations", "3", "-q"]) == 1
    assert "past the requested total" in capsys.readouterr().err


def test_missing_and_corrupt_checkpoints_are_clear_and_change_nothing(tmp_path, capsys):
    assert cli.main(["resume", str(tmp_path / "nowhere"), "-q"]) == 1
    assert "No run folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["resume", str(empty), "-q"]) == 1
    assert "No checkpoint" in capsys.readouterr().err

    run = tmp_path / "run"
    assert _train(run, "--no-figure") == 0
    data = bytearray((run / store.CHECKPOINT_FILENAME).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run / store.CHECKPOINT_FILENAME).write_bytes(bytes(data))
    (run / "metrics.csv").write_text((run / "metrics.csv").read_text() + "5,1,2.0")
    snapshot = {p.name: p.read_bytes() for p in run.iterdir()}
    assert cli.main(["resume", str(run), "--more", "2", "-q"]) == 1
    assert "damaged" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == snapshot
    (run / store.CHECKPOINT_FILENAME).write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CheckpointError, match="damaged"):
        restore.load_checkpoint(run)
    (run / store.CHECKPOINT_FILENAME).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not an evorl-pop checkpoint"):
        restore.load_checkpoint(run)


def test_train_refuses_to_overwrite_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--no-figure") == 0
    assert _train(run) == 1
    assert "holds a run already" in capsys.readouterr().err
    assert _train(run, "--overwrite", "--no-figure") == 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "populaton_size=8"], ["populaton_size", "Did you mean 'population_size'"]),
        (["--set", "SIGMA_INIT=0.1"], ["SIGMA_INIT", "Did you mean 'sigma_init'"]),
        (["--set", "population_size=many"], ["population_size", "integer", "many"]),
        (["--pop", "1"], ["population_size", "at least 2"]),
        (["--pop", "0"], ["population_size", "at least 2"]),
        (["--set", "generations=-3"], ["generations", ">= 0"]),
        (["--set", "rollout_lanes=0"], ["rollout_lanes", "at least 1"]),
        (["--task", "sphear"], ["sphear", "sphere"]),
        (["--strategy", "cma_es"], ["'cma_es'", "Did you mean 'CMA_ES'"]),
        (["--task", "cartpole"], ["'cartpole'", "Did you mean 'CartPole-v1'"]),
        (["--algorithm", "ES"], ["'ES'", "Did you mean 'es'"]),
    ],
)
def test_train_config_errors(tmp_path, capsys, args, words):
    assert cli.main(["train", "--out", str(tmp_path / "r"), "-q", *args]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert not (tmp_path / "r").exists()


def test_config_file_and_print_config(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('generations = 3\n[algorithm_config]\ntask = "sphere"\nhidden_sizes = [4, 4]\n')
    assert cli.main(["train", "--config", str(path), "--seed", "2", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "generations: 3" in out and "task: sphere" in out and "seed: 2" in out
    assert "- 4\n  - 4" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm_config:\n  stratgy: CMA_ES\n")
    assert cli.main(["train", "--config", str(bad), "--print-config"]) == 2
    assert "Did you mean 'strategy'" in capsys.readouterr().err


def test_print_config_takes_scientific_notation_and_every_algorithm(capsys):
    assert cli.main(["train", "--set", "learning_rate=1e-3", "--print-config"]) == 0
    assert "learning_rate: 0.001" in capsys.readouterr().out
    for algorithm in ("cemrl", "erl"):
        settings = "--set task=MountainCarContinuous-v0 --set population_size=6".split()
        args = ["train", "-a", algorithm, *settings, "--print-config"]
        assert cli.main(args) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"algorithm: {algorithm}" in out and "task: MountainCarContinuous-v0" in out
        assert "population_size: 6" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--devices", "1024"], ["devices=1024", "--devices auto"]),
        (["--devices", "9999"], ["devices=9999", "--devices auto"]),
        (["--precision", "float64"], ["float64", "already started in float32"]),
    ],
)
def test_settings_jax_cannot_take_are_refused_before_it_starts(tmp_path, capsys, args, words):
    assert cli.main(["train", *args, "--out", str(tmp_path / "r"), "-q", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    for word in words:
        assert word in err


def test_top_level_algorithm_field_in_a_file_says_where_it_belongs(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("population_size: 64\n")
    assert cli.main(["train", "--config", str(path), "--print-config"]) == 2
    assert "under algorithm_config" in capsys.readouterr().err


def test_devices_auto_equals_the_explicit_count(tmp_path, monkeypatch):
    from evorl_pop.run import processes

    monkeypatch.setattr(processes, "available_cores", lambda: 2)
    monkeypatch.setenv("XLA_FLAGS", "")  # no user count: auto follows the cores
    job = (
        "train --task CartPole-v1 --pop 128 -g 2 --chunk 2 -q --set hidden_sizes=[4] "
        "--set eval_episodes=0 --no-figure"
    ).split()
    assert cli.main([*job, "--out", str(tmp_path / "auto")]) == 0
    assert cli.main([*job, "--devices", "2", "--out", str(tmp_path / "two")]) == 0
    assert "2 device(s) on the population axis" in (tmp_path / "auto" / "train.log").read_text()
    rows = [_rows(tmp_path / name / "metrics.csv") for name in ("auto", "two")]
    for row in (*rows[0], *rows[1]):
        row.pop("wall_time")
    assert rows[0] == rows[1] and len(rows[0]) == 2


def test_launch_without_out_records_its_processes_in_the_run_folder(tmp_path):
    train = "train --task sphere --pop 8 -g 1 --set num_dims=2 -q --no-figure".split()
    result = _cli("launch", "-n", "1", "--", *train, "--runs-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (run,) = tmp_path.iterdir()
    assert (run / "config.yaml").exists()
    record = json.loads((run / "launch.json").read_text())
    assert record["num_processes"] == 1 and len(record["processes"]) == 1


@pytest.mark.parametrize("command", [[], ["train"], ["resume"], ["plot"], ["list"]])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: evorl-pop" in out
    for option in {
        "train": ["--devices", "--set", "--config", "--checkpoint-every", "--chunk", "--quiet"],
        "resume": ["--generations", "--more", "--force"],
        "plot": ["--x", "--svg", "--out", "--band"],
        "list": ["algorithms", "strategies"],
        "": ["train", "resume", "plot", "list"],
    }[command[0] if command else ""]:
        assert option in out


def test_console_script_help():
    result = subprocess.run(
        [Path(sys.executable).with_name("evorl-pop"), "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "--devices" in result.stdout


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    words = ["algorithms:", "es ", "CMA_ES", "Open_ES", "CartPole-v1", "sphere", "rosenbrock"]
    for word in [*words, "playground/CheetahRun", "gym:ID"]:
        assert word in out
    # every name whole, never split at a line end ("Freeway-" / "MinAtar")
    from evorl_pop import registry
    from evorl_pop.algorithms.es import STRATEGIES
    from evorl_pop.tasks.blackbox import bbob_task_names
    from evorl_pop.tasks.envs import env_names

    names = {*STRATEGIES.names(), *env_names(), *bbob_task_names(), *registry.EMITTERS.names()}
    assert {"isoline", "es", "cma_me", "pga_me"} <= set(registry.EMITTERS.names())
    tokens = set(re.split(r"[,\s]+", out))
    assert names <= tokens, names - tokens


def test_output_into_a_closed_pipe_ends_quietly():
    # `evorl-pop list | head -1`: the reader is gone before the output ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "evorl_pop.cli", "list"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_plot_two_runs(tmp_path, capsys, monkeypatch):
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # titles as <text>
    runs = []
    for seed in (0, 1):
        runs.append(tmp_path / f"seed{seed}")
        assert _train(runs[-1], "--seed", str(seed)) == 0
        assert (runs[-1] / "fitness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "both.png"
    assert cli.main(["plot", *map(str, runs), "--out", str(out), "--svg", "--band", "std"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = out.with_suffix(".svg").read_text()
    assert svg.lstrip().startswith("<?xml")
    assert "f − f* (best so far)" in svg  # the sphere knows f* = 0: a panel of f − f*
    out_steps = tmp_path / "steps.png"
    cartpole = [tmp_path / f"cartpole{seed}" for seed in (0, 1)]  # runs with environment steps
    for seed, run in enumerate(cartpole):
        argv = ["--task", "CartPole-v1", "--pop", "8", "-g", "2", "--seed", str(seed)]
        assert cli.main(["train", *argv, "--devices", "2", "-q", "--out", str(run)]) == 0
    assert cli.main(["plot", *map(str, cartpole), "--x", "steps", "-o", str(out_steps)]) == 0
    assert out_steps.exists()
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2
    assert "No metrics" in capsys.readouterr().err
    # a black-box task has no environment steps to draw against
    assert cli.main(["plot", *map(str, runs), "--x", "steps", "-o", str(out_steps)]) == 2
    assert "took no environment steps: plot it with --x generation" in capsys.readouterr().err


def test_plot_of_other_algorithms_labels_them_briefly_and_shows_a_lone_point(
    tmp_path, recwarn, monkeypatch
):
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # labels as <text>
    runs = []
    for algorithm, generations in (("erl", 1), ("cemrl", 3), ("pbt", 3)):
        runs.append(tmp_path / algorithm)
        runs[-1].mkdir()
        config.save(config.resolve_config([], [f"algorithm={algorithm}"]), runs[-1] / "config.yaml")
        columns = store.columns_for(("fitness_best", "fitness_mean", "fitness_worst"))
        rows = [
            dict(
                generation=g,
                env_steps=100 * g,
                wall_time=0.1 * g,
                fitness_best=-g,
                fitness_mean=-2 * g,
                fitness_worst=-3 * g,
            )
            for g in range(1, generations + 1)
        ]
        restore.restore_metrics(
            runs[-1] / store.METRICS_FILENAME, columns, "".join(store.csv_lines(rows, columns))
        )
    out = tmp_path / "all.png"
    assert cli.main(["plot", *map(str, runs), "--out", str(out), "--svg"]) == 0
    svg = out.with_suffix(".svg").read_text()
    labels = re.findall(r"<text[^>]*>([^<]*): (?:best|mean|worst)</text>", svg)
    assert len(labels) == 9 and labels[0].startswith("erl Pendulum-v1"), labels
    # settings that differ, not every field of three algorithms (nor nested ones, td3)
    assert all(label.count("=") <= 4 and "td3" not in label for label in labels), labels
    assert "algorithm=" not in svg and "f − f*" not in svg  # no f* in Pendulum
    assert 'xlink:href="#m' in svg  # erl's single generation is drawn as markers
    assert not [w for w in recwarn if w.filename.endswith("plotting.py")]


def test_metrics_file_truncates_rows_past_a_generation(tmp_path):
    path = tmp_path / "metrics.csv"
    columns = ("generation", "env_steps", "wall_time", "x")
    rows = [
        {"generation": g, "env_steps": 10 * g, "wall_time": 0.5, "x": 0.1 * g} for g in (1, 2, 3)
    ]
    restore.restore_metrics(path, columns, "".join(store.csv_lines(rows, columns)))
    with open(path, "a") as f:
        f.write("4,40,0.5,0.")  # a write cut short
    assert store.read_metrics(path)["generation"].tolist() == [1, 2, 3]
    assert restore.truncate_metrics(path, 2) == ("generation", "env_steps", "wall_time", "x")
    data = store.read_metrics(path)
    assert data["generation"].tolist() == [1, 2]
    assert data["x"].tolist() == [0.1, 0.2]  # floats read back exactly
    assert path.read_text().endswith("\n")


def test_an_empty_out_is_refused_not_replaced(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "-g", "1", "--pop", "8", "-q", "--no-figure", "--out", ""]) == 2
    assert "--out is empty: name the run folder" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
