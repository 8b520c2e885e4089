"""An environment family from a user's own module (``tests/plugins/toy_env.py``: point
masses in JAX), found by ``--plugin`` and as an installed entry point: ES learns its
task through the command line, ``evorl-pop list`` shows it, its names are checked as
the built-in ones, and ``evorl-pop render`` draws its episodes."""

import importlib
import re

import numpy as np
import pytest
from _plugins import install_entry_points, plugin_env, run_cli
from PIL import Image

from evorl_pop.run import config, store
from evorl_pop.tasks.control import JaxEnvFamily

# OpenES on toy/reach: 16 linear policies, 4 episodes of 20 steps each, the mean policy
# evaluated on 16 episodes
SETTINGS = {
    "hidden_sizes": "[]",
    "episodes": 4,
    "episode_length": 20,
    "eval_episodes": 16,
    "learning_rate": 0.3,
    "sigma_init": 0.3,
}
REACH = ["--task", "toy/reach", "--pop", "16", "--seed", "1", "--devices", "1", "-g", "15"]
REACH += [arg for name, value in SETTINGS.items() for arg in ("--set", f"{name}={value}")]


def _train(out, *args, env=None):
    result = run_cli("train", "-q", "--no-figure", "--out", str(out), *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return store.read_metrics(out)


def _learned(metrics) -> None:
    """The mean policy ends nearer its targets than it started: the first one stays about
    0.7 from a random target over 20 steps (a return below -12), one that heads for it at
    full speed gets there in about ten (a return of about -6)."""
    returns = metrics["eval_return"]
    assert returns[0] < -12, returns
    assert returns[-1] > -9 and returns[-1] > returns[0] + 5, returns


def test_es_learns_a_plugin_family_task_and_renders_its_episodes(tmp_path):
    run = tmp_path / "reach"
    metrics = _train(run, "--plugin", "toy_env", *REACH)
    _learned(metrics)
    assert config.read_mapping(run / "config.yaml")["plugins"] == ["toy_env"]
    # render needs no --plugin: the run folder records it
    drawn = run_cli("render", str(run), "--episodes", "2", "--seed", "5")
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    episodes = [float(x) for x in re.findall(r"^episode \d: return (\S+)", drawn.stdout, re.M)]
    printed = float(re.search(r"^return (\S+) ", drawn.stdout, re.M).group(1))
    assert len(episodes) == 2 and episodes[0] != episodes[1], drawn.stdout
    np.testing.assert_allclose(printed, np.mean(np.float32(episodes)), rtol=1e-6)
    with Image.open(run / "render.gif") as gif:
        assert gif.n_frames == 2 * 20  # a frame per step of each fixed-length episode


def test_the_family_is_listed_and_its_names_checked(tmp_path):
    listed = run_cli("list", "--plugin", "toy_env")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^  toy: point masses in JAX", listed.stdout, re.M), listed.stdout
    assert "toy/reach-1d" in re.split(r"[,\s]+", listed.stdout)
    wrong = run_cli("train", "--plugin", "toy_env", "--task", "toy/rech", "--out", str(tmp_path))
    assert wrong.returncode == 2
    assert "task: unknown value 'toy/rech'. Did you mean 'toy/reach'?" in wrong.stderr
    without = run_cli("train", "--task", "toy/reach", "--out", str(tmp_path / "none"))
    assert without.returncode == 2 and "unknown value 'toy/reach'" in without.stderr


def test_an_installed_entry_point_brings_the_family(tmp_path):
    env = plugin_env(install_entry_points(tmp_path / "site", {"toy_env": "toy_env"}))
    metrics = _train(tmp_path / "run", *REACH, env=env)
    _learned(metrics)
    again = _train(tmp_path / "again", "--plugin", "toy_env", *REACH)
    np.testing.assert_array_equal(metrics["eval_return"], again["eval_return"])


def test_the_deprecated_import_path_gives_the_family_base_with_a_warning():
    module = importlib.import_module("evorl_pop.tasks.jax_family")
    with pytest.warns(DeprecationWarning, match="from evorl_pop.tasks.control import"):
        assert module.JaxEnvFamily is JaxEnvFamily
    with pytest.raises(AttributeError, match="no attribute 'Other'"):
        _ = module.Other
