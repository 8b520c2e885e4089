"""``evorl-pop render``: a gymnax task's and a Gymnasium task's GIF and a brax task's
HTML viewer, one frame per step, and a printed return equal to the one the run's
evaluation reported."""

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


@pytest.mark.slow
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


@pytest.mark.slow
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
