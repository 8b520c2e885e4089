"""A learner plug-in (``tests/plugins/toy_learner.py``) from the command line: the toy
learner as an algorithm of its own (then resumed from its run folder), as CEM-RL's and
ERL's RL part (``--plugin``), and as PBT's members (an installed entry point).

Each run is a few generations of 20-step Pendulum-v1 episodes.
"""

import math

import numpy as np
import pytest
import yaml
from _plugins import install_entry_points, plugin_env, run_cli

from evorl_pop.run import store

QUIET = ["-q", "--no-figure", "--devices", "1"]
LOSSES = ("toy_critic_loss", "toy_actor_loss")


def _sets(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def _metrics(run) -> dict:
    return store.read_metrics(run / store.METRICS_FILENAME)


def _learned(rows, generations: list[bool]) -> None:
    """The toy learner's losses are NaN in the generations that did not learn, finite
    in those that did."""
    for name in LOSSES:
        assert np.isfinite(rows[name]).tolist() == generations, (name, rows[name])


def test_the_toy_algorithm_trains_and_resumes(tmp_path):
    run = tmp_path / "toy"
    # 40 steps per generation; the updates start once 60 are in the buffer: in the second
    settings = _sets("episode_length=20", "interval=40", "learning_starts=60", "toy.batch_size=16")
    args = ["train", "-a", "toy", "--plugin", "toy_learner", "-g", "2", "--out", str(run)]
    out = run_cli(*args, *settings, *QUIET)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algorithm"] == "toy" and saved["plugins"] == ["toy_learner"]
    rows = _metrics(run)
    assert rows["generation"].tolist() == [1, 2] and rows["env_steps"].tolist() == [40, 80]
    _learned(rows, [False, True])

    # the run folder names its plug-in, so a resume needs no --plugin
    out = run_cli("resume", str(run), "--generations", "3", "-q", "--no-figure")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _metrics(run)
    assert rows["generation"].tolist() == [1, 2, 3] and rows["env_steps"].tolist()[-1] == 120
    _learned(rows, [False, True, True])
    assert math.isfinite(rows["fitness_best"][-1])


@pytest.mark.parametrize("algorithm", ["cemrl", "erl"])
def test_the_toy_learner_is_a_hybrids_rl_part(tmp_path, algorithm):
    run = tmp_path / algorithm
    common = (
        "learner=toy",
        "learning_starts=40",
        "episode_length=20",
        "eval_episodes=1",
        "learner_settings.batch_size=16",
        "learner_settings.hidden_sizes=[8]",
    )
    own = {
        "cemrl": ("num_elites=2", "num_rl_actors=2", "updates_per_actor=3"),
        "erl": ("num_elites=1", "sync_period=1", "updates_per_generation=3"),
    }[algorithm]
    args = ["train", "-a", algorithm, "--plugin", "toy_learner", "--pop", "4", "-g", "2"]
    out = run_cli(*args, *_sets(*common, *own), *QUIET, "--out", str(run))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _metrics(run)
    # CEM-RL learns once the first generation's 80 steps are in; ERL's learner also
    # explores before it learns, so its first generation learns already
    _learned(rows, [False, True] if algorithm == "cemrl" else [True, True])
    injected = [0, 2] if algorithm == "cemrl" else [1, 1]
    assert rows["rl_actors_injected"].tolist() == injected
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["plugins"] == ["toy_learner"]
    toy = saved["algorithm_config"]
    assert toy["learner"] == "toy"
    assert toy["learner_settings"] == {"batch_size": 16, "hidden_sizes": [8]}


def test_the_toy_learner_as_pbt_members_from_an_entry_point(tmp_path):
    site = install_entry_points(tmp_path / "site", {"toy": "toy_learner"})
    run = tmp_path / "pbt"
    settings = _sets(
        "learner=toy",
        "population_size=3",
        "interval=40",
        "episode_length=20",
        "learning_starts=20",
        "updates_per_step=0.5",
        "buffer_capacity=200",
        "eval_episodes=1",
        "learner_settings.batch_size=16",
    )
    args = ["train", "-a", "pbt", "-g", "2", "--out", str(run), *settings, *QUIET]
    out = run_cli(*args, env=plugin_env(site))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _metrics(run)
    _learned(rows, [True, True])  # from each member's first episode on
    assert rows["env_steps"].tolist() == [120, 240] and rows["replaced"].tolist() == [1, 1]
    # each member trained with its own searched values, within the toy learner's ranges
    for name, low, high in (("learning_rate", 1e-4, 1e-2), ("discount", 0.8, 0.99)):
        values = np.stack([rows[f"member{i}_{name}"] for i in range(3)])
        assert np.all((values >= low * (1 - 1e-6)) & (values <= high * (1 + 1e-6))), name
        assert len(np.unique(values[:, 0])) == 3, name
