"""Host devices and precision, settled before JAX starts: core counts, limits, auto."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from evorl_pop import backend
from evorl_pop.config import RunConfig, resolve_config


@pytest.fixture
def cores(monkeypatch, tmp_path):
    """Six cores by affinity, no cgroup limit, and no device count in XLA_FLAGS."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1")
    return tmp_path


def test_available_cores_respects_affinity_and_cgroup_limits(cores):
    assert backend.available_cores(cores) == 6
    (cores / "cpu.max").write_text("max 100000\n")
    assert backend.available_cores(cores) == 6
    (cores / "cpu.max").write_text("250000 100000\n")  # cgroup v2: 2.5 CPUs
    assert backend.available_cores(cores) == 3
    v1 = cores / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert backend.available_cores(v1) == 2
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # v1: no limit
    assert backend.available_cores(v1) == 6


def test_use_all_cores_and_explicit_counts(cores, monkeypatch):
    monkeypatch.setattr(backend, "available_cores", lambda: 6)
    assert backend.use_all_cores() == 6
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=6"
    # A count the user put in XLA_FLAGS wins over auto, an explicit count over both.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert backend.use_all_cores() == 3
    assert "replaces the count of 3" in backend.set_host_devices(4)
    assert backend.host_device_count() == 4
    for count in (0, 1024, 9999):
        with pytest.raises(ValueError, match="--devices auto"):
            backend.set_host_devices(count)
    assert backend.host_device_count() == 4


def test_auto_devices_follow_cores_and_population(cores, monkeypatch):
    monkeypatch.setattr(backend, "available_cores", lambda: 2)

    def devices(*overrides):
        return backend.mesh_devices(resolve_config([], list(overrides)))

    assert devices("population_size=1024") == 2  # capped by the cores, not the 8 devices
    assert devices("population_size=127") == 1  # at least 64 candidates a device
    assert devices("task=sphere", "population_size=1024") == 1  # black-box: cheap to evaluate
    assert devices("devices=3") == 3
    assert devices("devices=null") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert devices("population_size=1024") == min(8, jax.device_count())


def test_precision_cannot_change_once_jax_started():
    backend.set_precision("float32")  # the mode JAX runs in: nothing to do
    with pytest.raises(ValueError, match="already started in float32"):
        backend.set_precision("float64")
    with pytest.raises(ValueError, match="float32' or 'float64"):
        backend.set_precision("float16")


def test_cli_sets_cores_and_float64_before_jax_starts():
    code = (
        "from evorl_pop import backend, cli\n"
        "assert cli.main(['train', '--precision', 'float64', '--print-config']) == 0\n"
        "import jax, jax.numpy as jnp\n"
        "print(jnp.zeros(1).dtype, jax.device_count(), backend.available_cores())\n"
    )
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    dtype, devices, cores = out.stdout.split()[-3:]
    assert dtype == "float64" and devices == cores


def test_examples_explicit_devices_win_over_xla_flags(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    common = importlib.import_module("_common")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(sys, "argv", ["example", "--devices", "3"])
    assert common.parse("example").devices == 3
    assert backend.host_device_count() == 3
    assert "replaces the count of 8" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["example", "--devices", "9999"])
    with pytest.raises(SystemExit):
        common.parse("example")
    assert "--devices auto" in capsys.readouterr().err


def test_run_config_devices_default_to_auto():
    assert RunConfig().devices == "auto" and RunConfig().precision == "float32"
