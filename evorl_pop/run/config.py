"""Run configuration and the algorithm registry.

A :class:`RunConfig` holds run settings and the algorithm's own frozen config
under ``algorithm_config`` (``evorl-pop train --print-config`` shows the YAML).
OmegaConf merges files and ``key=value`` overrides onto the algorithm's
defaults, checks types and keys, and writes YAML; on top, a string is never
taken for a number, keys renamed since are read with a note naming the new
one, and impossible values are refused, all as :class:`ConfigError`.

Algorithms are plug-ins (:mod:`evorl_pop.registry`): each registers its
config class and algorithm class in its own file. Every algorithm follows one
interface (:class:`~evorl_pop.core.interfaces.Algorithm`): a frozen dataclass
config with ``validate()``, and a class ``Algorithm(config, mesh=None)`` with
``init(key) -> state`` (a pytree with an integer ``generation`` field) and a
pure ``step(state, key) -> (state, metrics)``. A config's ``plugins`` names
the modules of a user's own plug-ins, imported before its algorithm is looked
up, so a run folder resumes with them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
import types
import typing
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from evorl_pop import registry
from evorl_pop.base import ConfigError, did_you_mean, read_text, write_atomic
from evorl_pop.core.capabilities import RenamesSettings
from evorl_pop.core.interfaces import SetsOwnSettings


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run: which algorithm, how to run it, and the algorithm's config."""

    algorithm: str = "es"  # a registry name (`evorl-pop list`)
    seed: int = 0  # split into an init key and the run key generations fold their index into
    generations: int = 40  # in total
    chunk: int = 5  # generations per compiled lax.scan; metrics and checkpoints between chunks
    # a checkpoint once this many generations have passed since the last (and at the end)
    checkpoint_every: int = 10
    devices: int | str | None = "auto"  # a count, None (all) or auto: processes.mesh_devices
    precision: str = "float32"  # float32, or float64 (JAX's 64-bit mode for the whole run)
    # where metrics go besides metrics.csv (always written): tensorboard, wandb (run/loggers.py)
    loggers: tuple[str, ...] = ("csv",)
    wandb_project: str | None = None  # None: $WANDB_PROJECT, else evorl-pop
    wandb_entity: str | None = None  # None: $WANDB_ENTITY, else the account's default
    algorithm_config: Any = None  # the algorithm's frozen config dataclass (None: defaults)
    # modules of plug-ins to import first (evorl-pop --plugin MODULE): their algorithms,
    # strategies, learners and environment families become names a config can use
    plugins: tuple[str, ...] = ()
    # replicas of seeds seed .. seed+seeds-1 in one compiled program (evorl_pop.run.replicas)
    seeds: int = 1
    # KEY=V1,V2,...: each setting of the grid (the product) with each seed, in that program
    sweep: tuple[str, ...] = ()

    def __post_init__(self):
        if self.plugins:
            _load_plugins(self.plugins)
        if self.algorithm_config is None:
            object.__setattr__(self, "algorithm_config", _spec(self.algorithm).config_class())


#: Run settings that may change when a run is resumed: they do not change its result.
RESUMABLE_FIELDS = (
    "generations",
    "chunk",
    "checkpoint_every",
    "devices",
    "loggers",
    "wandb_project",
    "wandb_entity",
)

#: The loggers a run config may name (``csv`` is always on).
LOGGERS = ("csv", "tensorboard", "wandb")

#: Algorithm config keys that were renamed: still read, with a note naming the new key.
RENAMED = {"episode_steps": "episode_length"}
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes

_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
_WORDS = {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}


def _load_plugins(modules) -> None:
    try:
        registry.load_plugins(modules or ())
    except registry.PluginError as err:
        raise ConfigError(f"plugins: {err}") from None


def flatten(data: Mapping, prefix: str = "") -> dict:
    """A nested mapping with dotted keys: ``{'a': {'b': 1}}`` as ``{'a.b': 1}``."""
    out = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _check_scalars(data: Mapping, cls, prefix: str = "") -> None:
    """Refuses what OmegaConf would convert silently: ``'10'`` or ``True`` for an int, ..."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        hint, name = hints.get(key, Any), f"{prefix}{key}"
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            _check_scalars(value, hint, f"{name}.")
        elif typing.get_origin(hint) is tuple and isinstance(value, list | tuple):
            for i, item in enumerate(value):
                _check_scalar(item, typing.get_args(hint)[0], f"{name}[{i}]")
        elif typing.get_origin(hint) is tuple and value is not None:
            raise ConfigError(
                f"{name}: expected a list, got {value!r}: write {name}=[{value}] "
                f"(--set {name}={value},{value} for two)."
            )
        elif not dataclasses.is_dataclass(hint) and typing.get_origin(hint) is not tuple:
            _check_scalar(value, hint, name)


def _check_scalar(value, hint, name: str) -> None:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if union else (hint,)
    if (
        type(value) in allowed
        or (type(value) is int and float in allowed)
        or not all(a in _WORDS or a is type(None) for a in allowed)
    ):
        return
    words = " or ".join(_WORDS.get(a, "null") for a in allowed)
    raise ConfigError(f"{name}: expected {words}, got {value!r} ({type(value).__name__}).")


def _key_error(err: ConfigKeyError, algorithm: str) -> ConfigError:
    key = str(err.full_key).removeprefix("algorithm_config.")
    algorithm_keys = [*flatten(OmegaConf.structured(_spec(algorithm).config_class()))]
    if str(err.full_key) == key and key in algorithm_keys:
        return ConfigError(
            f"{key!r} is a field of the {algorithm} config: put it under algorithm_config "
            f"(in a file), or pass --set {key}=... (a bare algorithm field is found there)."
        )
    hint = did_you_mean(key, [*_RUN_FIELDS, *algorithm_keys], cutoff=0.5)
    return ConfigError(f"Unknown key {key!r} in the {algorithm} run config.{hint}")


_noted: set[str] = set()


def _moved(algorithm: Mapping, name: str | None) -> Mapping:
    """``algorithm`` (an algorithm config mapping) with the keys its config class moved
    (:class:`~evorl_pop.core.capabilities.RenamesSettings`: old name to the new, dotted
    where nested) at their new place, with a DeprecationWarning for each; a value already
    at the new place is kept. Only a built-in algorithm's module is imported for it (a
    plug-in's is not loaded yet)."""
    modules = {module.rsplit(".", 1)[-1]: module for module in registry.BUILTIN["algorithm"]}
    spec = None
    # Not imported here before JAX is set up (merge's first pass settles the devices); the
    # checked pass (from_dict) maps the keys once the config class is imported.
    if isinstance(name, str) and modules.get(name) in sys.modules:
        spec = registry.ALGORITHMS.find(name)
    renames = spec is not None and isinstance(spec.config_class, RenamesSettings)
    moved = spec.config_class.RENAMED if renames else {}
    if not moved.keys() & algorithm.keys():
        return algorithm
    algorithm = dict(algorithm)
    for old, new in moved.items():
        if old not in algorithm:
            continue
        message = f"{old} is now {new} (--set {new}=...); read as {new}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        if message not in _noted:  # a command line merges its layers more than once
            _noted.add(message)
            print(f"note: {message}", file=sys.stderr)
        *sections, last = new.split(".")
        node = algorithm
        for section in sections:
            node[section] = node = dict(node.get(section) or {})
        value = algorithm.pop(old)
        node.setdefault(last, value)
    return algorithm


def _renamed(data: Mapping, algorithm_name: str | None = None) -> Mapping:
    """``data`` with renamed algorithm keys under their new names (a note for each);
    ``algorithm_name``: the algorithm where ``data`` does not name it."""
    algorithm = data.get("algorithm_config")
    if not isinstance(algorithm, Mapping):
        return data
    algorithm = _moved(algorithm, data.get("algorithm", algorithm_name))
    if RENAMED.keys() & algorithm.keys():
        algorithm = dict(algorithm)
        for old, new in RENAMED.items():
            if old in algorithm:
                print(f"note: {old} is now called {new}; read as {new}", file=sys.stderr)
                algorithm.setdefault(new, algorithm.pop(old))
    return {**data, "algorithm_config": algorithm}


def from_dict(data: Mapping, check: bool = True) -> RunConfig:
    """Builds a run config from a mapping in ``config.yaml``'s layout.

    Missing keys keep the algorithm's own defaults: ``td3: {batch_size: 64}``
    keeps the rest of that algorithm's TD3 settings, not ``TD3Config()``'s.

    Args:
      data: run settings plus an ``algorithm_config`` mapping.
      check: also check the values (see :func:`validate`); the run shell
        leaves that to the algorithm it builds, which checks its config once.

    Raises:
      ConfigError: an unknown key (with the nearest valid one), a wrong type or value.
    """
    data = _renamed(data)
    _check_scalars({k: v for k, v in data.items() if k != "algorithm_config"}, RunConfig)
    if data.get("plugins"):
        _load_plugins(data["plugins"])
    algorithm = data.get("algorithm", "es")
    cls = _spec(algorithm).config_class
    if isinstance(data.get("algorithm_config"), Mapping):
        data = {**data, "algorithm_config": _moved(data["algorithm_config"], algorithm)}
        _check_scalars(data["algorithm_config"], cls)
    elif data.get("algorithm_config") is not None:
        raise ConfigError(
            f"algorithm_config: expected a mapping of the {algorithm} config's fields "
            f"(algorithm_config: {{population_size: 64}}), got {data['algorithm_config']!r}."
        )
    schema = OmegaConf.structured(RunConfig(algorithm, algorithm_config=cls()))
    try:
        config = OmegaConf.to_object(OmegaConf.merge(schema, data))
    except ConfigKeyError as err:
        raise _key_error(err, algorithm) from None
    except OmegaConfBaseException as err:
        where = str(err.full_key or "").removeprefix("algorithm_config.")
        raise ConfigError(f"{where}: {str(err.msg).splitlines()[0]}") from None
    except (TypeError, ValueError) as err:  # raised by a config's own __post_init__
        raise ConfigError(f"{algorithm} config: {err}") from None
    if check:
        validate(config)
    return config


def _override_layer(overrides: Iterable[str]) -> dict:
    """``key=value`` strings as a mapping; bare algorithm fields go under ``algorithm_config``."""
    items = []
    for item in overrides:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(f"Override {item!r} is not of the form key=value.")
        if key.split(".")[0] not in _RUN_FIELDS:
            key = f"algorithm_config.{key}"
        if "," in value and not value.startswith(("[", "{", "'", '"')):
            value = f"[{value}]"  # hidden_sizes=64,64 is a list
        items.append(f"{key}={value}")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(items))
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"Cannot parse the overrides {items}: {err}") from None


def merge(sources: Iterable = (), overrides: Iterable[str] = ()) -> dict:
    """The plain mapping of YAML / TOML files or mappings, then ``key=value`` overrides, unchecked.

    A source that names another algorithm drops the algorithm config before it.
    """
    merged = OmegaConf.create()
    for source in [*sources, _override_layer(overrides)]:
        layer = source if isinstance(source, Mapping) else read_mapping(source)
        layer = _renamed(layer, merged.get("algorithm"))
        if "algorithm" in merged and layer.get("algorithm", merged.algorithm) != merged.algorithm:
            merged.pop("algorithm_config", None)
        merged = OmegaConf.merge(merged, layer)
    return OmegaConf.to_container(merged)


def resolve_config(
    sources: Iterable = (), overrides: Iterable[str] = (), check: bool = True
) -> RunConfig:
    """The run config of files and mappings merged in order, then overrides.

    An override's key is a run setting, ``algorithm``, or an algorithm field,
    bare (``population_size``, ``td3.batch_size``) or under ``algorithm_config.``;
    its value is YAML (``1e-3``, ``[64, 64]``, ``null``), ``64,64`` a list.

    Args:
      sources: YAML / TOML file paths or mappings (e.g. a checkpoint's config).
      overrides: ``key=value`` strings.
      check: also check the values (see :func:`from_dict`).

    Raises:
      ConfigError: an unreadable file, a malformed override, an unknown key, a wrong value.
    """
    return from_dict(merge(sources, overrides), check)


def load(path: str | os.PathLike) -> RunConfig:
    """``resolve_config([path])``."""
    return resolve_config([path])


def read_mapping(path: str | os.PathLike) -> dict:
    """A YAML (or ``.toml``) config file as a plain mapping, unchecked.

    Raises:
      ConfigError: the file is missing or does not parse.
    """
    path = Path(path)
    try:
        text = read_text(path, "a YAML or TOML run config", MAX_CONFIG_BYTES)
    except OSError as err:
        raise ConfigError(f"Cannot read the config file {str(path)!r}: {err.strerror}.") from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        data = OmegaConf.create(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, OmegaConfBaseException) as err:
        raise ConfigError(f"The config file {str(path)!r} does not parse: {err}") from None
    if not OmegaConf.is_dict(data):
        raise ConfigError(f"The config file {str(path)!r} must hold a mapping, got {text!r}.")
    return OmegaConf.to_container(data)


def to_dict(config: RunConfig) -> dict:
    """A run config as a plain mapping: ``config.yaml`` read back (lists for tuples)."""
    return OmegaConf.to_container(OmegaConf.create(dumps(config)))


def dumps(config: RunConfig) -> str:
    """A run config as YAML; reading it back gives an equal config."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def differences(old: RunConfig, new: RunConfig) -> list[str]:
    """Lines ``'key: old -> new'`` of the settings that differ, but those a resume may change."""
    a, b = flatten(to_dict(old)), flatten(to_dict(new))
    return [
        f"{key.removeprefix('algorithm_config.')}: {a.get(key)!r} -> {b.get(key)!r}"
        for key in sorted(set(a) | set(b), key=lambda k: (k.count("."), k))
        if key not in RESUMABLE_FIELDS and a.get(key) != b.get(key)
    ]


def save(config: RunConfig, path: str | os.PathLike) -> None:
    """Writes a run config as YAML, atomically (see :func:`write_atomic`)."""
    if Path(path).suffix not in (".yaml", ".yml"):
        raise ConfigError(f"Run configs are written as YAML: name the file .yaml, not {path}.")
    write_atomic(path, dumps(config).encode())


def validate(config: RunConfig, algorithm: bool = True) -> None:
    """Checks that a run config can run; ConfigError names an impossible value and why.

    Args:
      config: the run config.
      algorithm: also check the algorithm config (its ``validate()``); the
        algorithm's constructor does that too.
    """
    limits = (("generations", 0), ("chunk", 1), ("checkpoint_every", 0), ("seed", 0), ("seeds", 1))
    for name, least in limits:
        if getattr(config, name) < least:
            raise ConfigError(f"{name} must be >= {least}, got {getattr(config, name)}.")
    if config.seed + config.seeds - 1 >= 2**63:
        raise ConfigError(f"seed must be below 2**63 (a 64-bit integer), got {config.seed}.")
    if config.precision not in ("float32", "float64"):
        hint = did_you_mean(config.precision, ("float32", "float64"))
        raise ConfigError(
            f"precision: unknown value {config.precision!r}.{hint} Valid: float32, float64."
        )
    for name in config.loggers:
        if name not in LOGGERS:
            hint = did_you_mean(name, LOGGERS)
            raise ConfigError(
                f"loggers: unknown logger {name!r}.{hint} Valid: {', '.join(LOGGERS)}."
            )
    devices = config.devices
    if not (devices in (None, "auto") or (isinstance(devices, int) and devices >= 1)):
        raise ConfigError(f"devices must be auto, null (all) or a count >= 1, got {devices!r}.")
    if algorithm:
        config.algorithm_config.validate()
    if config.sweep:
        check_sweep(config)


def check_sweep(config: RunConfig) -> None:
    """Checks every setting of a run config's sweep before anything runs.

    Raises:
      ConfigError: a malformed item, a key that is no field of the algorithm's config (with
        the nearest), a value of the wrong type, or a setting the config refuses.
    """
    from evorl_pop.run import replicas

    grid = replicas.parse_sweep(config.sweep)
    own = config.algorithm_config
    for key, values in grid.items():
        if isinstance(own, SetsOwnSettings) and key in own.set_by_algorithm():
            raise ConfigError(
                f"sweep: {config.algorithm} sets {key} itself (it searches it), so every value "
                "of the sweep would run the same; sweep a setting it keeps, or change its search."
            )
        if key.split(".")[0] in _RUN_FIELDS:
            raise ConfigError(
                f"sweep: {key} is a run setting; a sweep takes fields of the algorithm's config "
                "(seeds: --seeds N)."
            )
        replicas.with_values(config.algorithm_config, {key: values[0]}, checked=False)  # a field?
        for value in values:
            nested = value
            for part in reversed(key.split(".")):
                nested = {part: nested}
            try:
                _check_scalars(nested, type(config.algorithm_config))
            except ConfigError as err:
                raise ConfigError(f"sweep: {err}") from None
    for setting in replicas.settings(grid):
        try:
            replicas.with_values(config.algorithm_config, setting).validate()
        except (TypeError, ValueError) as err:  # a config's own __post_init__
            where = ", ".join(f"{k}={v}" for k, v in setting.items())
            raise ConfigError(f"sweep: {where}: {err}") from None


# --- the algorithm registry ----------------------------------------------------------

#: An algorithm's entry in the registry (:mod:`evorl_pop.registry`).
AlgorithmSpec = registry.AlgorithmSpec


def _spec(name: str) -> AlgorithmSpec:
    try:
        return registry.ALGORITHMS.get(name)
    except registry.PluginError as err:
        raise ConfigError(f"algorithm: {err}") from None


def names() -> list[str]:
    """Every registered algorithm's name, sorted (every plug-in module imported)."""
    return registry.ALGORITHMS.names()


def specs() -> list[AlgorithmSpec]:
    """Every registered algorithm, sorted by name."""
    return [spec for _, spec in registry.ALGORITHMS.items()]


def get(name: str) -> AlgorithmSpec:
    """The spec of a registered algorithm.

    Raises:
      PluginError: an unknown name (with the nearest valid one), or one whose
        module needs a package that is not installed.
    """
    return registry.ALGORITHMS.get(name)


def name_of(algorithm_config) -> str:
    """The registry name of an algorithm config's class (ConfigError if none)."""
    for spec in specs():
        if type(algorithm_config) is spec.config_class:
            return spec.name
    raise ConfigError(
        f"No registered algorithm has the config class {type(algorithm_config).__name__}; "
        "register it (evorl_pop.registry.register_algorithm) or pass a RunConfig."
    )
