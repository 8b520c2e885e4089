"""``evorl-pop render``: a gymnax task's and a Gymnasium task's GIF and a brax task's
HTML viewer, one frame per step, and a printed return equal to the one the run's
evaluation reported; a front member of an NSGA-II run (``--member``) and an elite of a
MAP-Elites run (``--cell``, ``--descriptor``), their objectives or return equal to the
task's evaluation, a bad choice a one-line error that leaves the run folder as it was."""

import base64
import json
import os
import re
import zlib

import numpy as np
import pytest

from evorl_pop import cli
from evorl_pop.run import store

SHORT = "--pop 8 --set hidden_sizes=[4] --set eval_episodes=1 -g 3 --chunk 3".split()
QUIET = ["--devices", "1", "-q", "--no-figure"]


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _train(run, *args):
    assert cli.main(["train", *args, *QUIET, "--out", str(run)]) == 0


def _render(capsys, *args):
    capsys.readouterr()
    assert cli.main(["render", *args]) == 0
    return capsys.readouterr().out


def _viewer_system(html):
    """The system and states brax's HTML viewer shows (its JSON, compressed in the page)."""
    assert "brax/visualizer/js/viewer.js" in html  # brax's own viewer
    (encoded,) = re.findall(r'"([A-Za-z0-9+/=]{100,})"', html) or re.findall(
        r"'([A-Za-z0-9+/=]{100,})'", html
    )
    return json.loads(zlib.decompress(base64.b64decode(encoded)))


def _returns(out):
    episodes = [float(x) for x in re.findall(r"episode \d+: return (\S+)", out)]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("return ")]
    return episodes, float(line.split()[1])


def test_render_gymnax_gif_one_frame_per_step_and_the_evaluations_return(tmp_path, capsys):
    from PIL import Image

    run = tmp_path / "pendulum"
    length = 25
    _train(run, "--task", "Pendulum-v1", "--set", f"episode_length={length}", *SHORT)
    out = _render(capsys, str(run))
    episodes, printed = _returns(out)
    reported = store.read_metrics(run)["eval_return"][-1]
    assert printed == float(reported) and episodes == [printed]  # exact, as the run reported
    with Image.open(run / "render.gif") as gif:
        assert gif.n_frames == length  # Pendulum runs to its time limit
    # two episodes of another key: each frame a step, the mean as the evaluation's
    other = tmp_path / "two.gif"
    out = _render(capsys, str(run), "--episodes", "2", "--seed", "5", "--out", str(other))
    episodes, printed = _returns(out)
    assert len(episodes) == 2 and episodes[0] != episodes[1]
    assert printed == pytest.approx(np.mean(np.float32(episodes)), rel=1e-6)
    with Image.open(other) as gif:
        assert gif.n_frames == 2 * length


def test_render_black_box_has_nothing_to_render(tmp_path, capsys):
    run = tmp_path / "sphere"
    _train(run, "--task", "sphere", "--set", "num_dims=2", "--pop", "4", "-g", "1")
    out = _render(capsys, str(run)).strip()
    assert len(out.splitlines()) == 1 and "nothing to render" in out and "sphere" in out
    assert not (run / "render.gif").exists() and not (run / "render.html").exists()


def test_render_a_gymnasium_task_replays_its_evaluation_on_the_host(tmp_path, capsys):
    from PIL import Image

    run = tmp_path / "gym"
    _train(run, "--task", "gym:CartPole-v1", *SHORT)
    out = _render(capsys, str(run))
    episodes, printed = _returns(out)
    reported = store.read_metrics(run)["eval_return"][-1]
    # the plain loop with the evaluation's seeds plays the evaluated episode exactly
    assert printed == float(reported) and episodes == [printed]
    with Image.open(run / "render.gif") as gif:
        assert gif.n_frames == int(printed)  # CartPole pays 1 per step it stays up
    # two episodes of another key: the mean as the evaluation's, a frame per step
    other = tmp_path / "two.gif"
    out = _render(capsys, str(run), "--episodes", "2", "--seed", "5", "--out", str(other))
    episodes, printed = _returns(out)
    assert len(episodes) == 2
    assert printed == pytest.approx(np.mean(np.float32(episodes)), rel=1e-6)
    with Image.open(other) as gif:
        assert gif.n_frames == int(sum(episodes))


# compiles brax's step for a minute: the exhaustive tier, with Playground's HTML viewer
@pytest.mark.exhaustive
def test_render_brax_html_viewer_with_a_frame_per_step(tmp_path, capsys):
    pytest.importorskip("brax")
    run = tmp_path / "reacher"
    length = 12  # reacher never ends early
    _train(run, "--task", "brax/reacher", "--set", f"episode_length={length}", *SHORT)
    out = _render(capsys, str(run))
    episodes, printed = _returns(out)
    assert printed == float(store.read_metrics(run)["eval_return"][-1]) and episodes == [printed]
    system = _viewer_system((run / "render.html").read_text())
    assert len(system["states"]["x"]) == length


@pytest.mark.exhaustive
def test_render_playground_in_braxs_viewer_with_a_frame_per_step(tmp_path, capsys):
    pytest.importorskip("mujoco_playground")
    run = tmp_path / "cheetah"
    length = 12
    _train(run, "--task", "playground/CheetahRun", "--set", f"episode_length={length}", *SHORT)
    out = _render(capsys, str(run))
    episodes, printed = _returns(out)
    assert printed == float(store.read_metrics(run)["eval_return"][-1])
    # the drawn episode, stepped in one scan rather than the rollout's loops: MJX's sums
    # may round differently there
    np.testing.assert_allclose(episodes, [printed], rtol=1e-5)
    system = _viewer_system((run / "render.html").read_text())
    assert len(system["states"]["x"]) == length
    # the bodies of Playground's cheetah, the world left out, as brax's viewer names them
    assert {"torso", "bthigh", "fthigh"} <= set(system["geoms"])
    assert np.asarray(system["states"]["x"][0]["pos"]).shape == (len(system["link_names"]), 3)


@pytest.mark.slow
def test_render_pbt_takes_the_best_member_and_its_reported_return(tmp_path, capsys):
    config = tmp_path / "pbt.yaml"
    config.write_text(
        "algorithm: pbt\nseed: 3\ngenerations: 2\nchunk: 1\nalgorithm_config:\n"
        "  population_size: 3\n  interval: 20\n  episode_length: 10\n  learning_starts: 10\n"
        "  updates_per_step: 0.5\n  buffer_capacity: 64\n  eval_episodes: 1\n"
        "  td3: {actor_hidden_sizes: [8], critic_hidden_sizes: [16], batch_size: 16}\n"
    )
    run = tmp_path / "pbt"
    _train(run, "--config", str(config))
    out = _render(capsys, str(run))
    episodes, printed = _returns(out)
    metrics = store.read_metrics(run)
    best = max(metrics[f"member{i}_return"][-1] for i in range(3))
    assert printed == float(best) and episodes == [printed]


# --- one of many: a front's member, an archive's elite -------------------------------------


def _files(run):
    """Every file of a run folder with its size and modification time."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run.rglob("*"))}


def _fails(capsys, *args):
    """``evorl-pop render`` with a bad choice: exit 2, one line on stderr."""
    capsys.readouterr()
    assert cli.main(["render", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


@pytest.mark.slow
def test_render_a_black_box_front_says_front_csv_holds_it(tmp_path, capsys):
    run = tmp_path / "zdt1"
    _train(run, "-a", "nsga2", "--task", "mo/zdt1", "--pop", "8", "-g", "2")
    before = _files(run)
    out = _render(capsys, str(run), "--member", "0").strip()
    assert len(out.splitlines()) == 1 and "front.csv" in out and "nothing to render" in out
    # a choice on a run with one policy: an error naming the options' runs
    sphere = tmp_path / "sphere"
    _train(sphere, "--task", "sphere", "--set", "num_dims=2", "--pop", "4", "-g", "1")
    assert "--member" in _fails(capsys, str(sphere), "--member", "0")
    assert _files(run) == before


@pytest.mark.exhaustive
def test_render_a_front_member_of_mo_halfcheetah(tmp_path, capsys):
    pytest.importorskip("brax")
    import csv

    import jax

    from evorl_pop.tasks import make_task

    run = tmp_path / "mo"
    length = 10  # halfcheetah never ends early
    settings = ["--set", f"episode_length={length}", "--set", "hidden_sizes=[4]"]
    _train(run, "-a", "nsga2", "--task", "mo/halfcheetah", "--pop", "8", "-g", "2", *settings)
    with open(run / "front.csv") as f:
        rows = list(csv.DictReader(f))
    last = len(rows) - 1
    before = _files(run)
    err = _fails(capsys, str(run), "--member", str(len(rows) + 3))
    assert f"valid: 0..{last}" in err or (last == 0 and "valid: 0" in err)
    assert "--member" in _fails(capsys, str(run), "--cell", "0")
    assert _files(run) == before
    out = _render(capsys, str(run), "--member", str(last), "--episodes", "2", "--seed", "7")
    system = _viewer_system((run / "render.html").read_text())
    assert len(system["states"]["x"]) == 2 * length
    # the drawn episodes' objectives: the task's evaluation with key(7)'s two episodes
    task = make_task("mo/halfcheetah", episode_length=length, hidden_sizes=(4,), episodes=2)
    x = np.asarray([float(rows[last][f"x{j}"]) for j in range(task.num_dims)], np.float32)
    expected, _ = jax.jit(task.evaluate)(x, jax.random.key(7), ())
    (line,) = [ln for ln in out.splitlines() if ln.startswith("mean over 2 episode(s)")]
    drawn = json.loads(line.split("episode(s): ", 1)[1].split(" (")[0])
    np.testing.assert_allclose(drawn, np.asarray(expected), rtol=1e-5)


@pytest.mark.exhaustive
def test_render_an_elite_of_qd_hopper_uni_by_cell_and_descriptor(tmp_path, capsys):
    pytest.importorskip("brax")
    run = tmp_path / "qd"
    settings = "--set episode_length=10 --set hidden_sizes=[4] --set cells_per_dim=4".split()
    _train(run, "-a", "mapelites", "--task", "qd/hopper_uni", "--pop", "8", "-g", "2", *settings)
    with np.load(run / "archive.npz") as data:
        filled = np.flatnonzero(data["filled"])
        centroids = data["centroids"]
        fitness = data["fitness"]
    empty = int(np.flatnonzero(~np.isfinite(fitness))[0])
    before = _files(run)
    err = _fails(capsys, str(run), "--cell", str(empty))
    assert f"--cell {empty} is empty" in err and "valid:" in err
    assert "0..3" in _fails(capsys, str(run), "--cell", "4")  # a grid of 4 cells
    assert _files(run) == before
    cell = int(filled[-1])
    out = _render(capsys, str(run), "--cell", str(cell))
    assert f"cell {cell} of qd/hopper_uni" in out
    ret, evaluation = re.findall(r"episode 1: return (\S+) \(the task's evaluation: (\S+)\)", out)[
        0
    ]
    assert float(ret) == pytest.approx(float(evaluation.rstrip("),")), rel=1e-5)
    system = _viewer_system((run / "render.html").read_text())
    assert 1 <= len(system["states"]["x"]) <= 10
    # the filled cell nearest a descriptor: its centroid's own coordinates name it
    d = ",".join(str(float(v)) for v in centroids[cell])
    assert f"cell {cell} of" in _render(capsys, str(run), "--descriptor", d)
