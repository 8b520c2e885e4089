"""What a user gets for a command that cannot do what they asked: a one-line error that
says what to change, or the result they meant (plot, render, resume, launch, the run
files' permissions)."""

import fcntl
import hashlib
import os
import stat

import flax.serialization
import matplotlib.axes
import numpy as np
import pytest
import yaml

from evorl_pop import cli
from evorl_pop.base import write_atomic
from evorl_pop.run import plotting, store

FAST = (
    "--strategy Open_ES --task sphere --pop 8 --set num_dims=4 --chunk 1 --devices 1 "
    "--checkpoint-every 100000 --quiet --no-figure"
).split()
GYMNAX = (
    "--task Pendulum-v1 --set episode_length=5 --pop 8 --set hidden_sizes=[4] "
    "--set eval_episodes=1 -g 1 --chunk 1 --devices 1 -q --no-figure"
).split()
COLUMNS = ("generation", "fitness_best", "fitness_mean", "fitness_worst", "env_steps")


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _main(capsys, argv):
    capsys.readouterr()
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def _one_line(err, *words):
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def _run_folder(path, steps, config=None, fitness=None):
    """A run folder of metrics rows at ``steps`` (and a config.yaml of ``config``)."""
    path.mkdir(parents=True)
    fitness = np.arange(1.0, len(steps) + 1) if fitness is None else fitness
    lines = [",".join(COLUMNS)]
    for g, (s, f) in enumerate(zip(steps, fitness, strict=True)):
        lines.append(f"{g + 1},{f},{f - 0.5},{f - 1},{s}")
    (path / store.METRICS_FILENAME).write_text("\n".join(lines) + "\n")
    if config is not None:
        (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def _legend(monkeypatch):
    """The labels of every legend drawn from now on."""
    labels = []
    legend = matplotlib.axes.Axes.legend

    def record(self, *args, **kwargs):
        labels.extend(self.get_legend_handles_labels()[1])
        return legend(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", record)
    return labels


# --- plot ----------------------------------------------------------------------------------


def test_plot_steps_of_seeds_without_common_steps_draws_no_mean(tmp_path, capsys, monkeypatch):
    labels = _legend(monkeypatch)
    a = _run_folder(tmp_path / "a", [100, 200, 300])
    b = _run_folder(tmp_path / "b", [1000, 2000, 3000], fitness=np.array([7.0, 8.0, 9.0]))
    out = tmp_path / "steps.png"
    argv = ["plot", str(a), str(b), "--x", "steps", "--metrics", "best", "--out", str(out)]
    drawn = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda self, *args, **kwargs: drawn.append(args[:2]) or plot(self, *args, **kwargs),
    )
    status, _, err = _main(capsys, argv)
    assert status == 0 and out.exists(), err
    assert labels == ["run, 2 seeds, no common steps to average: best"]
    # each seed's own curve, and no other
    assert [(list(xs), list(ys)) for xs, ys in drawn] == [
        ([100, 200, 300], [1.0, 2.0, 3.0]),
        ([1000, 2000, 3000], [7.0, 8.0, 9.0]),
    ]
    # seeds whose steps overlap: the mean only where both have data
    c = _run_folder(tmp_path / "c", [200, 400, 600])
    xs, mean, lo, hi = plotting._aggregate(
        [plotting.load_run(p) for p in (a, c)], "fitness_best", "steps", "minmax"
    )
    assert xs[0] == 200 and xs[-1] == 300 and np.all(lo <= mean) and np.all(mean <= hi)


def test_plot_out_without_a_type_prints_the_file_it_wrote(tmp_path, capsys):
    run = _run_folder(tmp_path / "run", [10, 20])
    status, out, _ = _main(capsys, ["plot", str(run), "--out", str(tmp_path / "x" / "seeds")])
    assert status == 0 and out.split() == [str(tmp_path / "x" / "seeds.png")]
    assert (tmp_path / "x" / "seeds.png").exists()
    status, _, err = _main(capsys, ["plot", str(run), "--out", str(tmp_path / "f.txt")])
    assert status == 2 and not (tmp_path / "f.txt").exists()
    _one_line(err, "'.txt' is not a figure type", ".png")


def test_plot_metrics_naming_none_is_refused(tmp_path, capsys):
    run = _run_folder(tmp_path / "run", [10, 20])
    status, _, err = _main(capsys, ["plot", str(run), "--metrics", ","])
    assert status == 2 and not (run / "fitness.png").exists()
    _one_line(err, "--metrics names no metric")


def test_plot_legend_names_a_nested_swept_setting(tmp_path, capsys, monkeypatch):
    labels = _legend(monkeypatch)
    runs = []
    for rate in (0.001, 0.01):
        algorithm = {"task": "brax/hopper", "td3": {"actor_lr": rate, "batch_size": 64}}
        config = {"algorithm": "cemrl", "seed": 0, "algorithm_config": algorithm}
        runs.append(str(_run_folder(tmp_path / str(rate), [10, 20], config)))
    out = str(tmp_path / "rates.png")
    status, _, _ = _main(capsys, ["plot", *runs, "--metrics", "best", "--out", out])
    assert status == 0
    assert labels == [
        "cemrl brax/hopper (td3.actor_lr=0.001): best",
        "cemrl brax/hopper (td3.actor_lr=0.01): best",
    ]


def _sweep_top(top):
    """A sweep's top folder: two programs' run folders and sweep.csv."""
    for pop in (8, 16):
        config = {"algorithm": "es", "seed": 0, "algorithm_config": {"population_size": pop}}
        _run_folder(top / f"population_size={pop}", [10, 20], config)
    (top / "sweep.csv").write_text("population_size,fitness_mean\n8,1\n16,2\n")
    return top


def test_plot_a_sweeps_top_folder_draws_its_programs(tmp_path, capsys, monkeypatch):
    labels = _legend(monkeypatch)
    top = _sweep_top(tmp_path / "sweep")
    status, out, err = _main(capsys, ["plot", str(top), "--metrics", "best"])
    assert status == 0, err
    assert out.split() == [str(top / "fitness.png")] and (top / "fitness.png").exists()
    assert labels == ["es (population_size=8): best", "es (population_size=16): best"]


def test_render_a_sweeps_top_folder_names_its_programs(tmp_path, capsys):
    from evorl_pop.run import render

    top = _sweep_top(tmp_path / "sweep")
    status, _, err = _main(capsys, ["render", str(top)])
    assert status == 1
    _one_line(err, "top folder of a sweep", str(top / "population_size=8"))
    assert str(top / "population_size=16") in err
    with pytest.raises(ValueError, match="evorl-pop render .*population_size=8"):
        render.render(top)


# --- render --------------------------------------------------------------------------------


def test_render_of_a_front_per_seed_names_the_seeds_folders(tmp_path, capsys):
    run = tmp_path / "zdt1"
    argv = ["train", "-a", "nsga2", "--task", "mo/zdt1", "--pop", "8", "-g", "1", "--seeds", "2"]
    assert cli.main([*argv, "--devices", "1", "-q", "--no-figure", "--out", str(run)]) == 0
    assert (run / "seed=0" / "front.csv").exists()
    status, out, _ = _main(capsys, ["render", str(run)])
    assert status == 0 and "nothing to render" in out
    assert str(run / "seed=0" / "front.csv") in out and "in the run folder holds" not in out


@pytest.fixture(scope="module")
def gymnax_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("render") / "pendulum"
    assert cli.main(["train", *GYMNAX, "--out", str(run)]) == 0
    return run


def test_render_out_in_a_new_folder_is_written(gymnax_run, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "x.gif"
    status, printed, err = _main(capsys, ["render", str(gymnax_run), "--out", str(out)])
    assert status == 0 and out.exists() and f"wrote {out}" in printed, err


def test_render_out_that_cannot_be_written_is_one_line(gymnax_run, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "x.gif"
    status, _, err = _main(capsys, ["render", str(gymnax_run), "--out", str(out)])
    assert status == 1
    _one_line(err, str(out))


@pytest.mark.parametrize("name", ["x.html", "x"])
def test_render_out_of_another_type_names_the_familys(gymnax_run, tmp_path, capsys, name):
    out = tmp_path / name
    status, _, err = _main(capsys, ["render", str(gymnax_run), "--out", str(out)])
    assert status == 2 and not out.exists()
    _one_line(err, "draws a .gif file", "ending in .gif")


# --- launch, resume --------------------------------------------------------------------------


def test_launch_resume_of_a_missing_run_folder_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nonexist"
    argv = ["launch", "-n", "2", "--", "resume", str(missing), "--more", "1"]
    status, _, err = _main(capsys, argv)
    assert status == 1 and not missing.exists()
    _one_line(err, f"No run folder at {str(missing)!r}")


def test_resume_of_a_run_held_before_its_first_checkpoint_names_the_holder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algorithm: es\n")
    with open(run / store.LOCK_FILENAME, "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        status, _, err = _main(capsys, ["resume", str(run), "--more", "1", "-q"])
    assert status == 1
    _one_line(err, "in use by another evorl-pop process (pid 4242)")
    status, _, err = _main(capsys, ["resume", str(run), "--more", "1", "-q"])
    assert status == 1 and "has no checkpoint" in err  # once released: what the folder holds


def test_resume_to_another_precision_says_force_cannot_do_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", *FAST, "-g", "1", "--checkpoint-every", "1", "--out", str(run)]) == 0
    # the run as one computed in float64: its config and its checkpoint's
    path = run / store.CONFIG_FILENAME
    path.write_text(path.read_text().replace("precision: float32", "precision: float64"))
    data = (run / store.CHECKPOINT_FILENAME).read_bytes()
    payload = flax.serialization.msgpack_restore(data[len(store.MAGIC) + 32 :])
    payload["config"]["precision"] = payload["precision"] = "float64"
    body = flax.serialization.msgpack_serialize(payload)
    (run / store.CHECKPOINT_FILENAME).write_bytes(
        store.MAGIC + hashlib.sha256(body).digest() + body
    )
    for force in ([], ["--force"]):
        argv = ["resume", str(run), "--set", "precision=float32", "--more", "1", "-q", *force]
        status, _, err = _main(capsys, argv)
        assert status == 1 and "Pass --force" not in err
        _one_line(err, "even with --force", "precision=float64")


def test_train_of_no_generations_gives_no_plot_advice(tmp_path, capsys):
    run = tmp_path / "z1"
    argv = ["train", *[a for a in FAST if a != "--no-figure"], "-g", "0", "--out", str(run)]
    status, _, err = _main(capsys, argv)
    assert status == 0 and "evorl-pop plot" not in err, err
    assert not (run / store.FIGURE_FILENAME).exists()


# --- files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_files_written_atomically_get_the_umasks_permissions(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write_atomic(tmp_path / "config.yaml", b"a: 1\n")
        (tmp_path / "plain").write_bytes(b"")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "config.yaml").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert not list(tmp_path.glob(".*.tmp"))
