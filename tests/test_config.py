"""Run configs: typed loading from YAML / TOML, overrides, clear errors; backend set-up."""

import dataclasses

import pytest

from evorl_pop.algorithms.es import ESConfig
from evorl_pop.base import ConfigError
from evorl_pop.run import config
from evorl_pop.run.config import RunConfig


def test_defaults_are_the_es_defaults():
    cfg = RunConfig()
    assert cfg.algorithm == "es"
    assert cfg.algorithm_config == ESConfig()
    config.validate(cfg)


def test_round_trip_keeps_types_and_tuples(tmp_path):
    cfg = RunConfig(
        algorithm_config=ESConfig(hidden_sizes=(64, 32), sigma_init=0.1, normalize_obs=True),
        seed=3,
        generations=7,
        devices=2,
    )
    path = tmp_path / "run.yaml"
    config.save(cfg, path)
    back = config.load(path)
    assert back == cfg
    assert back.algorithm_config.hidden_sizes == (64, 32)
    assert isinstance(back.algorithm_config.sigma_init, float)
    # The same config written by hand as TOML reads back equal.
    toml = tmp_path / "run.toml"
    toml.write_text(
        "seed = 3\ngenerations = 7\ndevices = 2\n[algorithm_config]\n"
        "hidden_sizes = [64, 32]\nsigma_init = 0.1\nnormalize_obs = true\n"
    )
    assert config.load(toml) == cfg
    with pytest.raises(ConfigError, match="written as YAML"):
        config.save(cfg, tmp_path / "out.toml")


def test_scientific_notation_in_files_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm_config:\n  learning_rate: 1e-3\n  sigma_init: 2E-2\n")
    cfg = config.resolve_config([path], ["x0=1e1"])
    assert cfg.algorithm_config.learning_rate == 1e-3
    assert cfg.algorithm_config.sigma_init == 2e-2
    assert cfg.algorithm_config.x0 == 10.0
    assert config.resolve_config([], ["learning_rate=1e-3"]) == config.resolve_config(
        [], ["learning_rate=0.001"]
    )


def test_sources_merge_in_order_and_resume_differences(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generations: 3\nalgorithm_config:\n  task: sphere\n  num_dims: 4\n")
    cfg = config.resolve_config(
        [path, {"algorithm_config": {"num_dims": 5}}], ["generations=6", "x0=1"]
    )
    assert (cfg.generations, cfg.algorithm_config.task, cfg.algorithm_config.num_dims) == (
        6,
        "sphere",
        5,
    )
    assert cfg.algorithm_config.x0 == 1.0
    base = config.resolve_config([path])
    assert config.differences(base, cfg) == ["num_dims: 4 -> 5", "x0: 3.0 -> 1.0"]
    # Run settings a resume may change are not differences.
    assert config.differences(base, config.resolve_config([path], ["devices=3"])) == []


def test_partial_file_keeps_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generations: 3\nalgorithm_config:\n  task: sphere\n  strategy: CMA_ES\n")
    cfg = config.load(path)
    assert cfg.generations == 3
    assert cfg.algorithm_config == ESConfig(task="sphere", strategy="CMA_ES")


def test_int_is_accepted_for_a_float():
    cfg = config.from_dict({"algorithm_config": {"x0": 2}})
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
        config.from_dict(data)
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
        config.from_dict(data)
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
        config.from_dict(data)
    for word in words:
        assert word in str(err.value)


def test_overrides_parse_and_check():
    cfg = config.resolve_config(
        [],
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
    assert config.resolve_config([], ["hidden_sizes=[8]"]).algorithm_config.hidden_sizes == (8,)
    with pytest.raises(ConfigError, match="population_size.*integer"):
        config.resolve_config([], ["population_size=abc"])
    with pytest.raises(ConfigError, match="Did you mean 'sigma_init'"):
        config.resolve_config([], ["sigma_int=0.1"])
    with pytest.raises(ConfigError, match="key=value"):
        config.resolve_config([], ["population_size"])


def test_policy_settings_on_a_black_box_task_are_refused():
    for field in ("normalize_obs", "virtual_batch_norm"):
        with pytest.raises(
            ConfigError, match=rf"^{field} does not apply to the black-box task 'sphere'"
        ):
            config.resolve_config([], ["task=sphere", f"{field}=true"])
    vbn = config.resolve_config([], ["task=Breakout-MinAtar", "virtual_batch_norm=true"])
    assert vbn.algorithm_config.virtual_batch_norm is True


def test_top_level_algorithm_field_says_where_it_belongs():
    with pytest.raises(ConfigError, match="population_size.*under algorithm_config"):
        config.from_dict({"population_size": 64})


def test_bad_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="Cannot read"):
        config.load(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("generations: [1,\n")
    with pytest.raises(ConfigError, match="does not parse"):
        config.load(bad)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("generations = = 3\n")
    with pytest.raises(ConfigError, match="does not parse"):
        config.load(bad_toml)


def test_registry_lists_es_and_names_unknowns():
    assert "es" in config.names()
    spec = config.get("es")
    assert spec.config_class is ESConfig
    with pytest.raises(ValueError, match="Did you mean 'es'"):
        config.get("ess")
    # every registered algorithm imports; its default config round-trips
    for name in config.names():
        cls = config.get(name).config_class
        assert dataclasses.is_dataclass(cls)
        cfg = RunConfig(algorithm=name)
        assert config.from_dict(config.to_dict(cfg), check=False) == cfg


def test_nested_algorithm_configs_round_trip_and_override(tmp_path):
    cfg = config.resolve_config([], ["algorithm=cemrl", "td3.batch_size=64", "population_size=6"])
    assert cfg.algorithm_config.td3.batch_size == 64 and cfg.algorithm_config.population_size == 6
    path = tmp_path / "c.yaml"
    config.save(cfg, path)
    assert config.load(path) == cfg
    with pytest.raises(ConfigError, match="Did you mean 'td3.batch_size'"):
        config.resolve_config([path], ["td3.batch_sze=3"])


def test_nested_config_from_a_file_keeps_the_algorithms_defaults(tmp_path):
    # CEM-RL's own critic is (128, 128), not TD3Config's class default (256, 256).
    default = RunConfig(algorithm="cemrl").algorithm_config.td3
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: cemrl\nalgorithm_config:\n  td3:\n    batch_size: 64\n")
    from_file = config.load(path)
    from_set = config.resolve_config([], ["algorithm=cemrl", "td3.batch_size=64"])
    assert from_file == from_set
    assert from_file.algorithm_config.td3 == dataclasses.replace(default, batch_size=64)
    assert from_file.algorithm_config.td3.critic_hidden_sizes == default.critic_hidden_sizes
    # Resuming with --config merges the same way onto the run's own config.
    saved = config.to_dict(RunConfig(algorithm="cemrl"))
    assert config.resolve_config([saved, path]) == from_set


def test_registry_tells_a_missing_package_from_a_broken_module(tmp_path, monkeypatch):
    from evorl_pop import registry

    (tmp_path / "algo_missing_dep.py").write_text("import package_that_is_not_installed_x\n")
    (tmp_path / "algo_broken.py").write_text("from evorl_pop.run.config import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds = {"algorithm": (*registry.BUILTIN["algorithm"], "algo_missing_dep")}
    monkeypatch.setattr(registry, "BUILTIN", {**registry.BUILTIN, **kinds})
    algorithms = registry.Registry("algorithm", kinds["algorithm"])
    with pytest.raises(
        registry.PluginError, match="package_that_is_not_installed_x.*not installed"
    ):
        algorithms.get("algo_missing_dep")
    assert registry.unavailable("algorithm") == {
        "algo_missing_dep": "package_that_is_not_installed_x"
    }
    broken = registry.Registry("algorithm", ("algo_broken",))
    with pytest.raises(ImportError, match="no_such_name"):
        broken.get("algo_broken")
    # a plug-in module named by the user that does not exist says so
    with pytest.raises(ConfigError, match="no_such_plugin_module"):
        config.resolve_config([], ["plugins=[no_such_plugin_module]"])


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("hidden_sizes", (0,), "hidden_sizes must be at least 1, got [0]"),  # was a ZeroDivision
        ("eval_episodes", -1, "eval_episodes must be at least 0"),  # was accepted
        ("strategy", "CMAES", "Did you mean 'CMA_ES'?"),
    ],
)
def test_es_from_python_checks_its_config_as_the_command_line_does(field, value, words):
    from evorl_pop.algorithms.es import ES

    with pytest.raises(ConfigError) as err:
        ES(ESConfig(task="Pendulum-v1", **{field: value}))
    assert words in str(err.value)


def test_an_algorithm_config_that_is_no_mapping_is_named():
    with pytest.raises(ConfigError, match=r"algorithm_config: expected a mapping .* got 3\."):
        config.from_dict({"algorithm": "es", "algorithm_config": 3})
