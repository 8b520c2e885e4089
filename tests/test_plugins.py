"""Plug-ins from a user's own module: an algorithm and a strategy in one file
(``tests/plugins/toy_es.py``), found by ``--plugin`` and as an installed entry point."""

import csv

import numpy as np
import pytest
from _plugins import PLUGINS_DIR, install_entry_points, plugin_env, run_cli

from evorl_pop import registry
from evorl_pop.run import config

SPHERE = ["--task", "sphere", "--pop", "16", "--seed", "3", "--set", "num_dims=5"]


def _metrics(run_dir) -> dict[str, np.ndarray]:
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def _train(out, *args, env=None):
    result = run_cli("train", "-q", "--no-figure", "--out", str(out), *args, env=env)
    assert result.returncode == 0, result.stderr
    return _metrics(out)


def test_a_plugin_algorithm_trains_on_any_device_count_and_resumes(tmp_path):
    args = ["-a", "toy_es", "--plugin", "toy_es", *SPHERE, "--generations", "30"]
    one = _train(tmp_path / "one", *args, "--devices", "1")
    two = _train(tmp_path / "two", *args, "--devices", "2")
    # sphere at x0 = 3 in 5-D starts at 45; its optimum is 0
    assert one["fitness_best"][0] > 5.0
    assert one["best_so_far"][-1] < 0.05 * one["fitness_best"][0]
    np.testing.assert_allclose(two["fitness_best"], one["fitness_best"], rtol=1e-5, atol=1e-9)
    # the run folder records the plug-in: resume needs no --plugin
    saved = config.read_mapping(tmp_path / "one" / "config.yaml")
    assert saved["plugins"] == ["toy_es"]
    resumed = run_cli("resume", str(tmp_path / "one"), "-q", "--no-figure", "--more", "5")
    assert resumed.returncode == 0, resumed.stderr
    assert len(_metrics(tmp_path / "one")["generation"]) == 35


def test_a_plugin_strategy_runs_in_the_es_algorithm_as_in_its_own(tmp_path):
    own = _train(
        tmp_path / "own",
        *["-a", "toy_es", "--plugin", "toy_es", *SPHERE, "--generations", "8"],
        *["--set", "sigma_init=0.5"],
    )
    es = _train(
        tmp_path / "es",
        *["--strategy", "Toy_ES", "--plugin", "toy_es", *SPHERE, "--generations", "8"],
        *["--set", "sigma_init=0.5", "--set", "x0=3.0"],
    )
    for column in ("fitness_best", "fitness_mean", "sigma"):
        np.testing.assert_allclose(es[column], own[column], rtol=1e-6)
    assert own["sigma"][0] != own["sigma"][-1]  # the 1/5th rule moved the step size


def test_an_installed_entry_point_needs_no_plugin_option(tmp_path):
    site = install_entry_points(tmp_path / "site", {"toy": "toy_es"})
    env = plugin_env(site)
    listed = run_cli("list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "toy_es" in listed.stdout and "Toy_ES" in listed.stdout
    metrics = _train(tmp_path / "run", "-a", "toy_es", *SPHERE, "--generations", "10", env=env)
    assert metrics["best_so_far"][-1] < metrics["fitness_best"][0]


def test_an_unknown_plugin_or_name_says_what_to_change(tmp_path):
    missing = run_cli("train", "--plugin", "no_such_plugin_module", "--out", str(tmp_path / "x"))
    assert missing.returncode == 2
    assert "Cannot import the plug-in module 'no_such_plugin_module'" in missing.stderr
    assert not (tmp_path / "x").exists()
    unknown = run_cli("train", "-a", "toy_ess", "--plugin", "toy_es", "--out", str(tmp_path / "y"))
    assert unknown.returncode == 2
    assert "Did you mean 'toy_es'?" in unknown.stderr and "--plugin MODULE" in unknown.stderr


def test_registering_in_python_needs_no_file(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS_DIR))
    registry.import_plugin("toy_es")
    assert registry.ALGORITHMS.get("toy_es").config_class.__module__ == "toy_es"
    assert registry.STRATEGIES.get("Toy_ES").__name__ == "ToyES"
    with pytest.raises(registry.PluginError, match="Valid strategies:.*Toy_ES"):
        registry.STRATEGIES.get("Toy_ESS")
