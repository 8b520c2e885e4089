"""MAP-Elites' emitters as registered plug-ins: the registry's checks, each emitter's own
settings (and the old flat names, read at their new place), and the example plug-in
emitter of ``examples/plugins/`` run as a user runs it: train, resume, render."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import flax.serialization
import numpy as np
import pytest
import yaml
from _env import cli_env, run_cli

from evorl_pop import cli, conformance, registry
from evorl_pop.algorithms.mapelites import RENAMED_SETTINGS, MapElites, MapElitesConfig
from evorl_pop.algorithms.pgame import PgEmitterConfig
from evorl_pop.algorithms.qd_emitters import CmaEmitterConfig, EsEmitterConfig
from evorl_pop.base import ConfigError
from evorl_pop.core import interfaces
from evorl_pop.rl.td3 import ActorState
from evorl_pop.run import config, store

EXAMPLE_PLUGINS = Path(__file__).parents[1] / "examples" / "plugins"


class _Complete:
    collect = False

    def __init__(self, archive, task, config, settings):
        pass

    def init(self, archive_state, key):
        return ()

    def ask(self, archive_state, emitter_state, key):
        return None, None

    def tell(self, before, after, emitter_state, asked, quality, descriptors, key):
        return emitter_state, {}


def test_an_emitter_without_a_declared_member_is_refused_at_once_in_one_line():
    class Missing:
        collect = False

        def init(self, archive_state, key):
            return ()

        def ask(self, archive_state, emitter_state, key):
            return None, None

    with pytest.raises(registry.PluginError) as err:
        registry.register_emitter("test_missing", Missing)
    message = str(err.value)
    assert "\n" not in message and "lacks tell" in message and "test_missing" in message
    assert "test_missing" not in registry.EMITTERS._entries

    class Collects(_Complete):
        collect = True  # its episodes need observe

    with pytest.raises(registry.PluginError, match="lacks observe"):
        registry.register_emitter("test_collects", Collects)

    class Mutable:
        def validate(self, config):
            pass

    with pytest.raises(registry.PluginError, match="Mutable is not a dataclass"):
        registry.register_emitter("test_settings", _Complete, Mutable)

    @dataclasses.dataclass
    class Unfrozen:
        def validate(self, config):
            pass

    with pytest.raises(registry.PluginError, match="Unfrozen must be a frozen dataclass"):
        registry.register_emitter("test_settings", _Complete, Unfrozen)


def test_the_declared_members_are_the_protocols_and_the_built_ins_meet_it():
    assert conformance.declared(interfaces.Emitter) == ("collect", "init", "ask", "tell")
    assert registry.PROTOCOLS["Emitter"] is interfaces.Emitter
    names = registry.EMITTERS.names()
    assert {"isoline", "es", "cma_me", "pga_me"} <= set(names)
    me = MapElites(MapElitesConfig(emitter="cma_me", num_dims=4, cells_per_dim=4))
    assert isinstance(me.emitter, interfaces.Emitter)
    assert not conformance.lacks(me.emitter, interfaces.Emitter)
    spec = registry.EMITTERS.get("pga_me")
    assert spec.settings is PgEmitterConfig and issubclass(spec.emitter_class, object)
    assert hasattr(spec.emitter_class, "observe")


def test_an_unknown_emitter_names_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        MapElitesConfig(emitter="cma").validate()
    message = str(err.value)
    assert "emitter: unknown value 'cma'. Did you mean 'cma_me'?" in message
    assert "cma_me, es, isoline, pga_me" in message and "--plugin" in message


def test_each_emitter_checks_its_own_settings():
    with pytest.raises(ConfigError, match=r"^es\.sigma must be > 0, got 0.0\.$"):
        MapElitesConfig(emitter="es", es=EsEmitterConfig(sigma=0.0)).validate()
    with pytest.raises(ConfigError, match=r"^es\.period must be at least 1, got 0\.$"):
        MapElitesConfig(emitter="es", es=EsEmitterConfig(period=0)).validate()
    # another emitter's settings are not its business
    MapElitesConfig(emitter="isoline", es=EsEmitterConfig(period=0)).validate()
    with pytest.raises(ConfigError, match=r"cma_me\.sigma must be > 0"):
        MapElitesConfig(emitter="cma_me", cma_me=CmaEmitterConfig(sigma=-1.0)).validate()
    with pytest.raises(ConfigError, match=r"under es \(--set es\.sigma=\.\.\.\)"):
        MapElitesConfig(emitter="es", emitter_settings={"sigma": 0.1}).validate()
    with pytest.raises(ConfigError, match="'isoline' has no settings"):
        MapElitesConfig(emitter_settings={"sigma": 0.1}).validate()


def _flat_layout(algorithm_config: dict) -> dict:
    """An algorithm config mapping in the layout before the emitters had sections."""
    flat = {k: v for k, v in algorithm_config.items() if k not in ("es", "cma_me", "pga_me")}
    flat.pop("emitter_settings", None)
    for old, new in RENAMED_SETTINGS.items():
        section, name = new.split(".")
        flat[old] = algorithm_config[section][name]
    return flat


def test_old_flat_names_are_read_at_their_new_place_with_a_deprecation_warning(tmp_path):
    overrides = ["algorithm=mapelites", "emitter=es", "es_sigma=0.1", "pg_critic_hidden_sizes=8,8"]
    with pytest.warns(DeprecationWarning, match=r"es_sigma is now es\.sigma"):
        read = config.resolve_config([], overrides).algorithm_config
    assert read.es == EsEmitterConfig(sigma=0.1)
    assert read.pga_me == PgEmitterConfig(critic_hidden_sizes=(8, 8))
    assert read == MapElitesConfig(
        emitter="es",
        es=EsEmitterConfig(sigma=0.1),
        pga_me=PgEmitterConfig(critic_hidden_sizes=(8, 8)),
    )
    # a config.yaml written before: every flat name, each at its new place
    written = config.to_dict(config.RunConfig("mapelites", algorithm_config=read))
    written["algorithm_config"] = _flat_layout(written["algorithm_config"])
    written["algorithm_config"]["cma_sigma"] = 0.3
    assert "es" not in written["algorithm_config"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written))
    with pytest.warns(DeprecationWarning, match=r"cma_sigma is now cma_me\.sigma"):
        loaded = config.load(path).algorithm_config
    assert loaded == MapElitesConfig(
        emitter="es",
        es=EsEmitterConfig(sigma=0.1),
        cma_me=CmaEmitterConfig(sigma=0.3),
        pga_me=PgEmitterConfig(critic_hidden_sizes=(8, 8)),
    )
    # the new names are written back
    assert "es:\n    sigma: 0.1" in config.dumps(config.load(path))


def _rows(run):
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


def _to_flat_layout(run: Path) -> None:
    """Rewrites a run folder's config.yaml and checkpoint as a run written before the
    emitters had sections would hold them."""
    data = config.read_mapping(run / "config.yaml")
    data["algorithm_config"] = _flat_layout(data["algorithm_config"])
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    path = run / store.CHECKPOINT_FILENAME
    raw = path.read_bytes()
    payload = flax.serialization.msgpack_restore(raw[len(store.MAGIC) + 32 :])
    payload["config"]["algorithm_config"] = _flat_layout(payload["config"]["algorithm_config"])
    body = flax.serialization.msgpack_serialize(payload)
    path.write_bytes(store.MAGIC + hashlib.sha256(body).digest() + body)


# three runs of the CLI in this process, each compiling: over 20 s on 2 cores
@pytest.mark.slow
def test_a_run_folder_with_the_old_flat_names_resumes_as_the_uninterrupted_run(tmp_path):
    args = ["-a", "mapelites", "--task", "qd/arm", "--devices", "1", "--chunk", "1", "-q"]
    args += ["--set", "population_size=8", "--set", "cells_per_dim=6", "--no-figure"]
    args += ["--set", "emitter=es", "--set", "es.period=2", "--set", "es.sigma=0.1"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert cli.main(["train", *args, "-g", "3", "--out", str(whole)]) == 0
    assert cli.main(["train", *args, "-g", "2", "--out", str(part)]) == 0
    _to_flat_layout(part)
    assert "es_period: 2" in (part / "config.yaml").read_text()
    with pytest.warns(DeprecationWarning, match=r"es_period is now es\.period"):
        assert cli.main(["resume", str(part), "--more", "1", "-q", "--no-figure"]) == 0
    resumed, uninterrupted = _rows(part), _rows(whole)
    assert list(resumed) == list(uninterrupted) and "emitter_restarts" in resumed
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)


def _run_cli(*args, cwd):
    """``evorl-pop ARGS`` in a new process that can import the example plug-ins."""
    return run_cli(*args, env=cli_env(PYTHONPATH=str(EXAMPLE_PLUGINS)), cwd=cwd)


# three commands in new processes, each importing JAX and compiling: half a minute on 2 cores
@pytest.mark.slow
def test_the_example_plugin_emitter_trains_resumes_and_renders(tmp_path, monkeypatch):
    settings = ["--set", "emitter=gaussian", "--set", "emitter_settings.sigma=0.05"]
    args = ["-a", "mapelites", "--task", "qd/arm", "--devices", "1", "--chunk", "1", "-q"]
    args += ["--set", "population_size=16", "--set", "cells_per_dim=8", *settings]
    part = tmp_path / "part"
    done = _run_cli(
        "train", "--plugin", "gaussian_emitter", *args, "-g", "2", "--out", str(part), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = config.read_mapping(part / "config.yaml")
    assert written["plugins"] == ["gaussian_emitter"]
    assert written["algorithm_config"]["emitter_settings"] == {"sigma": 0.05}
    # resume and render need no --plugin: the run folder records it
    done = _run_cli("resume", str(part), "--more", "1", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    drawn = _run_cli("render", str(part), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    assert re.search(r"nothing to render: .*'qd/arm' run's result is many", drawn.stdout)
    # the same three generations in this process, uninterrupted
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGINS))
    whole = tmp_path / "whole"
    main_args = ["train", "--plugin", "gaussian_emitter", *args, "-g", "3", "--out", str(whole)]
    assert cli.main([*main_args, "--no-figure"]) == 0
    resumed, uninterrupted = _rows(part), _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 3
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    np.testing.assert_array_equal(resumed["emitter_valid"], 1.0)
    archive = np.load(part / "archive.npz")
    genotypes = archive["genotypes"][archive["filled"]]
    assert genotypes.min() >= 0.0 and genotypes.max() <= 1.0  # clipped to the arm's bounds
    assert archive["filled"].sum() == resumed["archive_size"][-1] > 16
    with pytest.raises(ConfigError, match=r"emitter_settings\.sigam: not a setting .* sigma"):
        config.resolve_config(
            [], ["algorithm=mapelites", *settings[1::2], "emitter_settings.sigam=1"]
        )


def test_one_actor_state_whose_checkpoint_entries_are_those_of_before():
    """TD3's and SAC's actors are one ActorState; SAC's, without a target, keeps the
    checkpoint entries of before (params, opt_state), so its run folders still resume."""
    params = {"w": np.arange(3.0, dtype=np.float32)}
    opt = {"mu": np.ones(3, np.float32)}
    sac_actor = ActorState(params, None, opt)
    saved = flax.serialization.to_state_dict(sac_actor)
    assert sorted(saved) == ["opt_state", "params"]
    back = flax.serialization.from_state_dict(ActorState(params, None, opt), saved)
    assert back.target_params is None
    np.testing.assert_array_equal(back.params["w"], params["w"])
    td3_actor = ActorState(params, {"w": params["w"] + 1}, opt)
    saved = flax.serialization.to_state_dict(td3_actor)
    assert sorted(saved) == ["opt_state", "params", "target_params"]
    back = flax.serialization.from_state_dict(td3_actor, saved)
    np.testing.assert_array_equal(back.target_params["w"], params["w"] + 1)
    with pytest.raises(ValueError, match="target_params"):
        flax.serialization.from_state_dict(td3_actor, {"params": saved["params"], "opt_state": {}})
