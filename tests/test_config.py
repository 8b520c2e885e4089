"""Run configs: typed loading from YAML / TOML, overrides, clear errors."""

import dataclasses

import pytest

from evorl_pop import config as config_lib
from evorl_pop import registry
from evorl_pop.algorithms.es import ESConfig
from evorl_pop.config import ConfigError, RunConfig


def test_defaults_are_the_es_defaults():
    cfg = RunConfig()
    assert cfg.algorithm == "es"
    assert cfg.algorithm_config == ESConfig()
    config_lib.validate(cfg)


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_round_trip_keeps_types_and_tuples(tmp_path, fmt):
    cfg = RunConfig(
        algorithm_config=ESConfig(hidden_sizes=(64, 32), sigma_init=0.1, normalize_obs=True),
        seed=3,
        generations=7,
        devices=2,
    )
    path = tmp_path / f"run.{fmt}"
    config_lib.save(cfg, path)
    back = config_lib.load(path)
    assert back == cfg
    assert back.algorithm_config.hidden_sizes == (64, 32)
    assert isinstance(back.algorithm_config.sigma_init, float)


def test_partial_file_keeps_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generations: 3\nalgorithm_config:\n  task: sphere\n  strategy: CMA_ES\n")
    cfg = config_lib.load(path)
    assert cfg.generations == 3
    assert cfg.algorithm_config == ESConfig(task="sphere", strategy="CMA_ES")


def test_int_is_accepted_for_a_float():
    cfg = config_lib.from_dict({"algorithm_config": {"x0": 2}})
    assert cfg.algorithm_config.x0 == 2.0 and isinstance(cfg.algorithm_config.x0, float)


@pytest.mark.parametrize(
    "data, words",
    [
        ({"algorithm_config": {"populaton_size": 8}}, ["populaton_size", "population_size"]),
        ({"generatons": 8}, ["generatons", "generations"]),
        ({"algorithm": "ess"}, ["ess", "'es'"]),
    ],
)
def test_unknown_key_names_the_nearest(data, words):
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(data)
    for word in words:
        assert word in str(err.value)
    assert "Did you mean" in str(err.value)


@pytest.mark.parametrize(
    "data, words",
    [
        ({"algorithm_config": {"population_size": "many"}}, ["population_size", "integer", "many"]),
        ({"algorithm_config": {"population_size": 8.5}}, ["population_size", "integer"]),
        ({"algorithm_config": {"normalize_obs": "yes please"}}, ["normalize_obs", "boolean"]),
        ({"algorithm_config": {"hidden_sizes": ["a"]}}, ["hidden_sizes[0]", "integer"]),
        ({"algorithm_config": {"hidden_sizes": 32}}, ["hidden_sizes", "list"]),
        ({"generations": "10"}, ["generations", "integer"]),
        ({"seed": True}, ["seed", "integer"]),
    ],
)
def test_wrong_types_are_named(data, words):
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(data)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "data, words",
    [
        ({"algorithm_config": {"population_size": 0}}, ["population_size", "at least 2", "0"]),
        ({"generations": -1}, ["generations", ">= 0"]),
        ({"chunk": 0}, ["chunk", ">= 1"]),
        ({"algorithm_config": {"sigma_init": -0.1}}, ["sigma_init", "> 0"]),
        ({"algorithm_config": {"hidden_sizes": [32, 0]}}, ["hidden_sizes"]),
        ({"algorithm_config": {"strategy": "CMA-ES"}}, ["strategy", "CMA_ES"]),
        ({"algorithm_config": {"task": "cartpole"}}, ["task", "CartPole"]),
    ],
)
def test_impossible_values_are_named(data, words):
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(data)
    for word in words:
        assert word in str(err.value)


def test_overrides_parse_and_check():
    cfg = config_lib.apply_overrides(
        RunConfig(),
        [
            "population_size=64",
            "hidden_sizes=16,16",
            "algorithm_config.sigma_init=0.05",
            "learning_rate=null",
            "generations=5",
            "task=Pendulum-v1",
            "normalize_obs=true",
        ],
    )
    a = cfg.algorithm_config
    assert (a.population_size, a.hidden_sizes, a.sigma_init, a.learning_rate) == (
        64,
        (16, 16),
        0.05,
        None,
    )
    assert (cfg.generations, a.task, a.normalize_obs) == (5, "Pendulum-v1", True)
    assert config_lib.apply_overrides(
        RunConfig(), ["hidden_sizes=[8]"]
    ).algorithm_config.hidden_sizes == (8,)
    with pytest.raises(ConfigError, match="population_size.*integer"):
        config_lib.apply_overrides(RunConfig(), ["population_size=abc"])
    with pytest.raises(ConfigError, match="Did you mean 'sigma_init'"):
        config_lib.apply_overrides(RunConfig(), ["sigma_int=0.1"])
    with pytest.raises(ConfigError, match="key=value"):
        config_lib.apply_overrides(RunConfig(), ["population_size"])


def test_bad_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="Cannot read"):
        config_lib.load(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("generations: [1,\n")
    with pytest.raises(ConfigError, match="does not parse"):
        config_lib.load(bad)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("generations = = 3\n")
    with pytest.raises(ConfigError, match="does not parse"):
        config_lib.load(bad_toml)


def test_registry_lists_es_and_names_unknowns():
    assert "es" in registry.names()
    spec = registry.get("es")
    assert spec.config_class is ESConfig
    with pytest.raises(ValueError, match="Did you mean 'es'"):
        registry.get("ess")
    # every available algorithm's default config validates and round-trips
    for name in registry.names():
        cls = registry.get(name).config_class
        assert dataclasses.is_dataclass(cls)
        cfg = RunConfig(algorithm=name)
        assert config_lib.from_dict(config_lib.to_dict(cfg), check=False) == cfg


@pytest.mark.skipif("cemrl" not in registry.names(), reason="CEM-RL not available")
@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_nested_algorithm_configs_round_trip_and_override(tmp_path, fmt):
    cfg = config_lib.apply_overrides(
        RunConfig(algorithm="cemrl"), ["td3.batch_size=64", "population_size=6"]
    )
    assert cfg.algorithm_config.td3.batch_size == 64 and cfg.algorithm_config.population_size == 6
    path = tmp_path / f"c.{fmt}"
    config_lib.save(cfg, path)
    assert config_lib.load(path) == cfg
    with pytest.raises(ConfigError, match="Did you mean 'td3.batch_size'"):
        config_lib.apply_overrides(cfg, ["td3.batch_sze=3"])
