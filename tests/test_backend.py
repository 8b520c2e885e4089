"""Host devices and precision, settled before JAX starts: core counts, limits, auto."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from evorl_pop import make_mesh
from evorl_pop.run import processes
from evorl_pop.run.config import RunConfig, resolve_config


@pytest.fixture
def cores(monkeypatch, tmp_path):
    """Six cores by affinity, no cgroup limit, and no device count in XLA_FLAGS."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1")
    return tmp_path


def test_available_cores_respects_affinity_and_cgroup_limits(cores):
    assert processes.available_cores(cores) == 6
    (cores / "cpu.max").write_text("max 100000\n")
    assert processes.available_cores(cores) == 6
    (cores / "cpu.max").write_text("250000 100000\n")  # cgroup v2: 2.5 CPUs
    assert processes.available_cores(cores) == 3
    v1 = cores / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert processes.available_cores(v1) == 2
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # v1: no limit
    assert processes.available_cores(v1) == 6


def test_use_all_cores_and_explicit_counts(cores, monkeypatch):
    monkeypatch.setattr(processes, "available_cores", lambda: 6)
    assert processes.use_all_cores() == 6
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=6"
    # A count the user put in XLA_FLAGS wins over auto, an explicit count over both.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert processes.use_all_cores() == 3
    assert "replaces the count of 3" in processes.set_host_devices(4)
    assert processes.host_device_count() == 4
    for count in (0, 1024, 9999):
        with pytest.raises(ValueError, match="--devices auto"):
            processes.set_host_devices(count)
    assert processes.host_device_count() == 4


def test_auto_devices_follow_cores_and_population(cores, monkeypatch):
    monkeypatch.setattr(processes, "available_cores", lambda: 2)

    def devices(*overrides):
        return processes.mesh_devices(resolve_config([], list(overrides)))

    assert devices("population_size=1024") == 2  # capped by the cores, not the 8 devices
    assert devices("population_size=127") == 1  # at least 64 candidates a device
    assert devices("task=sphere", "population_size=1024") == 1  # black-box: cheap to evaluate
    # Sync Gymnasium envs step one device at a time in a process; worker processes do not.
    assert devices("task=gym:CartPole-v1", "population_size=1024") == 1
    assert devices("task=gym:CartPole-v1", "population_size=1024", "vector=async") == 2
    assert devices("devices=3") == 3
    assert devices("devices=null") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert devices("population_size=1024") == min(8, jax.device_count())


def test_precision_cannot_change_once_jax_started():
    processes.set_precision("float32")  # the mode JAX runs in: nothing to do
    with pytest.raises(ValueError, match="already started in float32"):
        processes.set_precision("float64")
    with pytest.raises(ValueError, match="float32' or 'float64"):
        processes.set_precision("float16")


def test_cli_sets_cores_and_float64_before_jax_starts():
    code = (
        "from evorl_pop import cli\nfrom evorl_pop.run import processes\n"
        "assert cli.main(['train', '--precision', 'float64', '--print-config']) == 0\n"
        "import jax, jax.numpy as jnp\n"
        "print(jnp.zeros(1).dtype, jax.device_count(), processes.available_cores())\n"
    )
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    dtype, devices, cores = out.stdout.split()[-3:]
    assert dtype == "float64" and devices == cores


def test_examples_explicit_devices_win_over_xla_flags(monkeypatch, capsys):
    from evorl_pop.run import script

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(sys, "argv", ["example", "--devices", "3"])
    assert script.start("An example.", runs=False).devices == 3
    assert processes.host_device_count() == 3
    assert "replaces the count of 8" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["example", "--devices", "9999"])
    with pytest.raises(SystemExit):
        script.start("An example.", runs=False)
    assert "--devices auto" in capsys.readouterr().err


@pytest.mark.parametrize("count", ["auto", 2.0, 0, 9999])
def test_make_mesh_refuses_what_is_not_a_device_count_in_one_line(count):
    with pytest.raises(ValueError, match="num_devices") as err:
        make_mesh(count)
    assert len(str(err.value).splitlines()) == 1
    assert make_mesh(None).size == jax.device_count() and make_mesh(2).size == 2


def test_run_config_devices_default_to_auto():
    assert RunConfig().devices == "auto" and RunConfig().precision == "float32"


@pytest.fixture
def cache_config():
    """JAX's compilation cache settings, unset for the test and restored after it."""
    names = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    saved = [getattr(jax.config, name) for name in names]
    jax.config.update(names[0], None)
    yield
    for name, value in zip(names, saved, strict=True):
        jax.config.update(name, value)


def test_compilation_cache_folder_and_opting_out(cache_config, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(processes.CACHE_ENV, "off")
    assert processes.use_compilation_cache() is None
    assert jax.config.jax_compilation_cache_dir is None
    monkeypatch.delenv(processes.CACHE_ENV)
    default = str(tmp_path / "xdg" / "evorl_pop" / "jax")
    assert processes.use_compilation_cache() == default and Path(default).is_dir()
    assert jax.config.jax_compilation_cache_dir == default
    assert jax.config.jax_compilation_cache_max_size == processes.CACHE_MAX_BYTES
    # A folder JAX already has (JAX_COMPILATION_CACHE_DIR, or set before) is kept.
    assert processes.use_compilation_cache(tmp_path / "other") == default
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv(processes.CACHE_ENV, str(tmp_path / "env"))
    assert processes.use_compilation_cache() == str(tmp_path / "env")
    jax.config.update("jax_compilation_cache_dir", None)
    assert processes.use_compilation_cache(tmp_path / "arg") == str(tmp_path / "arg")
    jax.config.update("jax_compilation_cache_dir", None)
    # A folder that cannot be made: no cache rather than a failure at the first compile.
    (tmp_path / "a-file").write_text("")
    assert processes.use_compilation_cache(tmp_path / "a-file" / "cache") is None
    assert jax.config.jax_compilation_cache_dir is None


def test_a_rerun_loads_its_programs_from_the_cache_and_repeats_the_run(tmp_path):
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "XLA_FLAGS": "",
        "JAX_PLATFORMS": "cpu",
        processes.CACHE_ENV: str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # keep every program
    }
    job = ["--task", "sphere", "--pop", "16", "-g", "4", "--chunk", "2", "--devices", "1"]

    def train(name):
        out = subprocess.run(
            [sys.executable, "-m", "evorl_pop.cli", "train", *job, "-q", "--no-figure",
             "--out", str(tmp_path / name)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "Error reading persistent compilation cache" not in out.stderr
        return {p.name: p.read_bytes() for p in cache.iterdir() if p.name.endswith("-atime")}

    first = train("first")
    assert first, "the first run left nothing in the cache"
    second = train("second")
    # The rerun compiled nothing new (no new entries) and read every entry it had
    # (a read stamps the entry's access time).
    assert second.keys() == first.keys()
    assert all(second[name] != first[name] for name in first)
    log = (tmp_path / "second" / "train.log").read_text()
    assert f"compilation cache: {cache}" in log

    def rows(name):  # all but the wall time
        lines = (tmp_path / name / "metrics.csv").read_text().splitlines()
        return [line.split(",")[:2] + line.split(",")[3:] for line in lines]

    assert rows("second") == rows("first")
