"""Every example runs as a user starts it (its default --devices auto), in two generations
(the README's and the documentation's code blocks: tests/test_docs.py)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop.run import store

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# example -> (its figure, its run folders)
TRAINING = {
    "openes_cartpole.py": ("openes_cartpole.png", ["openes-cartpole"]),
    "openes_pendulum.py": ("openes_pendulum.png", ["openes-pendulum"]),
    "openes_minatar.py": ("openes_breakout.png", ["openes-breakout"]),
    "openes_brax.py": ("openes_brax.png", ["openes-brax"]),
    "openes_playground.py": ("openes_playground.png", ["openes-playground"]),
    "openes_gymnasium.py": ("openes_gymnasium.png", ["openes-gymnasium"]),
    "cmaes_blackbox.py": ("cmaes_blackbox.png", ["cmaes-sphere", "cmaes-ellipsoid",
                                                 "cmaes-rosenbrock"]),
    "cemrl_pendulum.py": ("cemrl_pendulum.png", ["cemrl-pendulum"]),
    "cemrl_brax.py": ("cemrl_brax.png", ["cemrl-brax"]),
    "erl_pendulum.py": ("erl_pendulum.png", ["erl-pendulum"]),
    "pbt_pendulum.py": ("pbt_pendulum.png", ["pbt-pendulum"]),
    "pbt_ppo_brax.py": ("pbt_ppo_brax.png", ["pbt-ppo-brax"]),
    "ppo_brax.py": ("ppo_brax.png", ["ppo-brax"]),
    "ppo_minatar.py": ("ppo_breakout.png", ["ppo-breakout"]),
    "sac_pendulum.py": ("sac_pendulum.png", ["sac-pendulum"]),
}  # fmt: skip


def _run(script, *args, returncode=0, cwd=None, **env):
    """Runs a script as a user starts it (it sets its own devices); its completed process."""
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", **env}
    out = subprocess.run([sys.executable, str(script), *args], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == returncode, out.stderr[-3000:]
    return out


def test_every_example_is_tested():
    others = {"python_objective.py", "sharded_population.py"}
    assert {p.name for p in EXAMPLES.glob("[!_]*.py")} == set(TRAINING) | others


# In the default tier, the quick ones; the rest (brax, Playground, the learners: 15-80 s
# each, most of it compiling) in the long tier (--full)
QUICK = {"openes_cartpole.py", "cmaes_blackbox.py", "openes_gymnasium.py"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n in QUICK else pytest.mark.slow) for n in TRAINING]
)
def test_example_trains_and_draws_its_figure(name, tmp_path):
    figure, runs = TRAINING[name]
    _run(EXAMPLES / name, "--generations", "2", "--quiet", "--runs", str(tmp_path / "runs"),
         "--figures", str(tmp_path / "figures"))  # fmt: skip
    assert (tmp_path / "figures" / figure).stat().st_size > 0
    for run in runs:
        assert store.read_metrics(tmp_path / "runs" / run)["generation"].tolist() == [1, 2]


def test_a_setting_that_cannot_run_ends_an_example_in_one_line(tmp_path):
    out = _run(EXAMPLES / "openes_pendulum.py", "--generations", "-1", "--quiet", "--runs",
               str(tmp_path / "runs"), "--figures", str(tmp_path), returncode=1)  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "openes_pendulum.py: error: generations must be >= 0, got -1."
    )


def test_a_brax_example_without_brax_names_the_install_in_one_line(tmp_path):
    (tmp_path / "brax").mkdir()  # a brax that cannot be imported, first on the path
    (tmp_path / "brax" / "__init__.py").write_text("raise ImportError('no brax here')\n")
    out = _run(EXAMPLES / "openes_brax.py", "--generations", "1", "--quiet", "--runs",
               str(tmp_path / "runs"), "--figures", str(tmp_path), returncode=1,
               PYTHONPATH=str(tmp_path))  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("openes_brax.py: error: brax tasks need brax, which is not installed")
    assert line.endswith("install it with: pip install -e '.[brax]'"), line


def test_python_objective_example_reaches_rosenbrocks_optimum():
    stdout = _run(EXAMPLES / "python_objective.py").stdout
    first = stdout.splitlines()[0]  # f = ... after N evaluations (reached 1e-10), x = [...]
    assert "(reached 1e-10)" in first and float(first.split()[2]) < 1e-10, stdout
    x = np.array(first.split("x = [")[1].rstrip("]").split(), float)
    np.testing.assert_allclose(x, np.ones(8), atol=1e-4)  # scipy's rosen: optimum at x = 1


def test_sharded_population_example_equals_the_unsharded_ranking():
    stdout = _run(EXAMPLES / "sharded_population.py", "--devices", "3", "--pop", "100").stdout
    fitness = np.asarray(jnp.sum((3.0 * jax.random.normal(jax.random.key(0), (100, 10))) ** 2, 1))
    top3 = np.argsort(fitness)[:3].tolist()
    expected = (f"100 candidates on 3 devices: best {fitness.min():.3f}, worst "
                f"{fitness.max():.3f}, top-3 indices {top3}")  # fmt: skip
    assert stdout.strip() == expected
