"""figures/regenerate.py: every figure in figures/ has the command that draws it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
_spec = importlib.util.spec_from_file_location("regenerate", FIGURES / "regenerate.py")
regenerate = importlib.util.module_from_spec(_spec)
sys.modules["regenerate"] = regenerate  # its dataclass looks its module up there
_spec.loader.exec_module(regenerate)


def test_every_figure_has_a_recipe_whose_script_draws_it():
    drawn = {p.name for p in FIGURES.glob("*.png")}
    assert drawn - set(regenerate.FIGURES) == set()
    for name, recipe in regenerate.FIGURES.items():
        assert recipe.group in regenerate.GROUPS, name
        program = recipe.commands[0].split()[0]
        if program.endswith(".py"):
            script = ROOT / program
            assert script.is_file(), (name, program)
            assert name in script.read_text(), f"{program} does not name {name}"


def _chosen(*args):
    return regenerate.chosen(regenerate.parse(list(args)))


def test_the_options_choose_groups_or_named_figures():
    es = ["cmaes_blackbox.png", "openes_cartpole.png", "openes_pendulum.png"]
    assert _chosen()[:3] == es and set(_chosen()) == {*es, "openes_cartpole_8_seeds.png"}
    assert set(_chosen("--hybrid")) - set(_chosen()) == {"cemrl_pendulum.png", "erl_pendulum.png"}
    assert "openes_brax.png" in _chosen("--long") and "openes_brax.png" not in _chosen()
    assert set(_chosen("--group", "qd")) - set(_chosen()) == {
        "mapelites_arm.png",
        "mapelites_walker2d.png",
        "pgame_walker2d.png",
    }
    assert set(_chosen("--all")) == set(regenerate.FIGURES)
    assert _chosen("ppo_brax.png", "--long") == ["ppo_brax.png"]
    with pytest.raises(SystemExit, match="no recipe for"):
        _chosen("nope.png")


def test_main_runs_each_command_from_the_root(monkeypatch):
    runs = []

    def run(command, cwd):
        runs.append((command, cwd))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(regenerate.subprocess, "run", run)
    regenerate.main(["openes_cartpole.png", "openes_cartpole_8_seeds.png", "--seeds", "2"])
    (example, cwd), (train, _), (plot, _) = runs
    assert cwd == ROOT
    script = str(ROOT / "examples/openes_cartpole.py")
    assert example == [sys.executable, script, "--quiet", "--seeds", "2"]
    # the README's commands for its figure of eight seeds
    assert Path(train[0]).name == "evorl-pop" and Path(plot[0]).name == "evorl-pop"
    assert " ".join(train).find("train --seeds 8 --pop 64") > 0
    assert " ".join(plot).find("--metrics mean --band std") > 0
    assert plot[-1] == "figures/openes_cartpole_8_seeds.png"

    def fail(command, cwd):
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(regenerate.subprocess, "run", fail)
    with pytest.raises(SystemExit, match="ppo_brax.png: examples/ppo_brax.py --quiet failed"):
        regenerate.main(["ppo_brax.png"])
