"""Run configuration: typed frozen dataclasses, YAML / TOML files, overrides.

A run is described by a :class:`RunConfig`: the algorithm's registry name, its
own frozen config dataclass (e.g. :class:`evorl_pop.algorithms.es.ESConfig`)
and run settings (seed, generations, chunk, checkpoint interval, devices). On
disk it is a YAML (or TOML) mapping::

    algorithm: es
    seed: 0
    generations: 40
    chunk: 5
    checkpoint_every: 10
    devices: null
    algorithm_config:
      strategy: Open_ES
      task: CartPole-v1
      population_size: 256
      hidden_sizes: [32]

Every value is checked against the dataclass's type hints, so a string where
an int belongs, an unknown key (reported with the nearest valid one) or an
impossible value (a population of 0, negative generations) is a
:class:`ConfigError` before anything runs. This module imports no JAX itself;
algorithm modules are imported only when a config of theirs is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import os
import tempfile
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from evorl_pop import registry


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type or impossible value."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run: which algorithm, its config, and how to run it.

    Attributes:
      algorithm: a registry name (``evorl-pop list``), ``'es'`` by default.
      algorithm_config: the algorithm's frozen config dataclass (``None``: its defaults).
      seed: the run's seed; ``jax.random.key(seed)`` is split into an init
        key and the run key that every generation folds its index into.
      generations: total generations of the run.
      chunk: generations per compiled ``lax.scan`` chunk; metrics are written
        and checkpoints taken between chunks.
      checkpoint_every: take a checkpoint once at least this many generations
        have passed since the last one (and always at the end); ``0``: only at the end.
      devices: devices on the population axis (``None``: all of them).
    """

    algorithm: str = "es"
    algorithm_config: Any = None
    seed: int = 0
    generations: int = 40
    chunk: int = 5
    checkpoint_every: int = 10
    devices: int | None = None

    def __post_init__(self):
        if self.algorithm_config is None:
            spec = _spec(self.algorithm)
            object.__setattr__(self, "algorithm_config", spec.config_class())


#: Run settings that may change when a run is resumed: they do not change its result.
RESUMABLE_FIELDS = ("generations", "chunk", "checkpoint_every", "devices")

_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "algorithm_config")


def _spec(name: str) -> registry.AlgorithmSpec:
    try:
        return registry.get(name)
    except ValueError as err:
        raise ConfigError(f"algorithm: {err}") from None


# --- types --------------------------------------------------------------------------


def _type_name(hint) -> str:
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and typing.get_origin(hint) is None:
        return {
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "bool": "a boolean",
        }.get(hint.__name__, hint.__name__)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0]).removeprefix('an ').removeprefix('a ')}s"
        return f"a list of {len(args)} values"
    return str(hint)


def coerce(value, hint, name: str):
    """Checks ``value`` against a type hint, converting only where lossless.

    ints become floats where a float is expected and lists become tuples; a
    string is never taken for a number, nor a bool for an int.

    Args:
      value: a value read from YAML, TOML or a parsed ``--set``.
      hint: the dataclass field's type hint.
      name: the field's name, for the error message.

    Returns:
      The value, of the hinted type.

    Raises:
      ConfigError: the value does not fit the hint.
    """

    def fail():
        return ConfigError(
            f"{name}: expected {_type_name(hint)}, got {value!r} ({type(value).__name__})."
        )

    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise fail()
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, name)
            except ConfigError:
                pass
        raise fail()
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail()
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise fail()
    if hint is str:
        if isinstance(value, str):
            return value
        raise fail()
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise fail()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise fail()
        return tuple(
            coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):  # a nested config, e.g. an algorithm's optimiser settings
            return dataclass_from_dict(hint, value, name)
        raise ConfigError(f"{name}: expected a mapping of {hint.__name__} fields, got {value!r}.")
    if hint is object:
        return value
    raise ConfigError(f"{name}: cannot check values of type {hint!r}.")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unknown_key(key: str, valid, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"Unknown key {key!r} in {where}.{hint} Valid keys: {', '.join(sorted(valid))}."
    )


def dataclass_from_dict(cls, data: dict, where: str):
    """Builds a frozen config dataclass from a mapping, checking every value.

    Args:
      cls: the dataclass.
      data: field names to values; missing fields keep their defaults.
      where: what the mapping is, for error messages (e.g. ``'es config'``).

    Returns:
      An instance of ``cls``.

    Raises:
      ConfigError: an unknown key (naming the nearest valid one) or a wrong type.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys to values, got {data!r}.")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(str(key), names, where)
        values[key] = coerce(value, hints[key], key)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def _plain(value):
    """A value as YAML / TOML can hold it: tuples become lists, dataclasses mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _flatten(data: dict, prefix: str = "") -> dict:
    """``{'a': {'b': 1}}`` as ``{'a.b': 1}``."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def to_dict(config: RunConfig) -> dict:
    """A run config as a plain mapping (the layout of ``config.yaml``).

    Args:
      config: a :class:`RunConfig`.

    Returns:
      A dict of plain values, with the algorithm config under ``algorithm_config``.
    """
    out = {name: getattr(config, name) for name in ("algorithm", *_RUN_FIELDS[1:])}
    out["algorithm_config"] = {
        f.name: _plain(getattr(config.algorithm_config, f.name))
        for f in dataclasses.fields(config.algorithm_config)
    }
    return out


def from_dict(data: dict, check: bool = True) -> RunConfig:
    """Builds and checks a run config from a mapping (``config.yaml``'s layout).

    Args:
      data: run settings plus an ``algorithm_config`` mapping; missing keys
        keep their defaults.
      check: also check the values (see :func:`validate`).

    Returns:
      A :class:`RunConfig`.

    Raises:
      ConfigError: an unknown key, a wrong type or an impossible value.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"A run config must be a mapping, got {data!r}.")
    data = dict(data)
    algorithm = data.pop("algorithm", "es")
    if not isinstance(algorithm, str):
        raise ConfigError(f"algorithm: expected a string, got {algorithm!r}.")
    spec = _spec(algorithm)
    algorithm_config = dataclass_from_dict(
        spec.config_class, data.pop("algorithm_config", None) or {}, f"{algorithm} config"
    )
    hints = _hints(RunConfig)
    run = {}
    for key, value in data.items():
        if key not in _RUN_FIELDS:
            raise _unknown_key(str(key), [*_RUN_FIELDS, "algorithm_config"], "the run config")
        run[key] = coerce(value, hints[key], key)
    config = RunConfig(algorithm=algorithm, algorithm_config=algorithm_config, **run)
    if check:
        validate(config)
    return config


def _parse_scalar(text: str, hint):
    """Parses the text of a ``--set key=value`` for a field of type ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    plain = (
        [a for a in args if a is not type(None)]
        if origin in (typing.Union, types.UnionType)
        else [hint]
    )
    if plain == [str]:
        # Keep strings verbatim ('yes' or '1e3' are names here, not booleans or numbers).
        return None if text.lower() in ("null", "none", "~") and len(args) > 1 else text
    if (
        any(typing.get_origin(a) is tuple for a in plain)
        and "," in text
        and not text.lstrip().startswith(("[", "("))
    ):
        text = f"[{text}]"
    if text.lstrip().startswith("("):
        text = "[" + text.strip()[1:-1] + "]"
    if text.lower() == "none":
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"Cannot parse the value {text!r}: {err}") from None


def apply_overrides(config: RunConfig, overrides: typing.Iterable[str]) -> RunConfig:
    """Applies ``key=value`` overrides to a run config.

    A key names a run setting (``generations``, ``seed``, ...), ``algorithm``,
    or a field of the algorithm config, bare (``population_size``) or
    prefixed (``algorithm_config.population_size``). Values are parsed as YAML
    (``[64, 64]``, ``64,64``, ``null``, ``true``) and type-checked.

    Args:
      config: the config to start from.
      overrides: strings ``key=value``.

    Returns:
      The new :class:`RunConfig` (validated).

    Raises:
      ConfigError: a malformed override, an unknown key (with the nearest
        valid one), a wrong type or an impossible value.
    """
    data = to_dict(config)
    overrides = list(overrides)
    # A changed algorithm brings its own config: apply it first.
    for item in overrides:
        key, _, text = item.partition("=")
        if key.strip() == "algorithm" and text.strip() != data["algorithm"]:
            data["algorithm"] = text.strip()
            data["algorithm_config"] = {}
    spec = _spec(data["algorithm"])
    run_hints = _hints(RunConfig)
    for item in overrides:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise ConfigError(f"Override {item!r} is not of the form key=value.")
        if key == "algorithm":
            continue
        if key in _RUN_FIELDS:
            data[key] = _parse_scalar(text, run_hints[key])
            continue
        # An algorithm field, possibly nested: 'td3.batch_size'.
        path = key.removeprefix("algorithm_config.").split(".")
        target, cls = data["algorithm_config"], spec.config_class
        valid = [*_RUN_FIELDS, *_flatten(_plain(spec.config_class()))]
        for i, part in enumerate(path):
            hints = _hints(cls)
            if part not in hints:
                raise _unknown_key(key, valid, f"the {data['algorithm']} run config")
            if i == len(path) - 1:
                target[part] = _parse_scalar(text, hints[part])
            else:
                cls = hints[part]
                if not dataclasses.is_dataclass(cls):
                    raise ConfigError(
                        f"{'.'.join(path[: i + 1])} has no fields; set it as a whole."
                    )
                target = target.setdefault(part, {})
    return from_dict(data)


def replace(config: RunConfig, **changes) -> RunConfig:
    """``dataclasses.replace`` for run settings and algorithm fields alike, validated.

    Args:
      config: a run config.
      **changes: run settings or algorithm config fields; ``None`` values are skipped.

    Returns:
      The new, validated :class:`RunConfig`.
    """
    data = to_dict(config)
    for key, value in changes.items():
        if value is None:
            continue
        if key in _RUN_FIELDS or key == "algorithm":
            data[key] = value
        else:
            data["algorithm_config"][key] = _plain(value)
    return from_dict(data)


# --- files --------------------------------------------------------------------------


def load(path: str | os.PathLike) -> RunConfig:
    """Reads a run config from a YAML (``.yaml`` / ``.yml``) or TOML (``.toml``) file.

    Args:
      path: the file.

    Returns:
      The validated :class:`RunConfig`.

    Raises:
      ConfigError: the file is missing, does not parse, or holds a bad config.
    """
    return from_dict(read_mapping(path))


def read_mapping(path: str | os.PathLike) -> dict:
    """Reads a config file into a plain mapping, without checking it.

    Args:
      path: a YAML or TOML file.

    Returns:
      The mapping.

    Raises:
      ConfigError: the file is missing or does not parse.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"Cannot read the config file {str(path)!r}: {err.strerror}.") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"The config file {str(path)!r} does not parse: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"The config file {str(path)!r} must hold a mapping, got {data!r}.")
    return data


def dumps(config: RunConfig, fmt: str = "yaml") -> str:
    """A run config as YAML or TOML text.

    Args:
      config: the config.
      fmt: ``'yaml'`` or ``'toml'``.

    Returns:
      The text; reading it back gives an equal config.
    """
    data = to_dict(config)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    if fmt != "toml":
        raise ValueError(f"fmt must be 'yaml' or 'toml', got {fmt!r}.")
    return _toml_dumps(data)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{k} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{ " + ", ".join(items) + " }"
    raise ValueError(f"cannot write {value!r} as TOML")


def _toml_dumps(data: dict) -> str:
    # TOML has no null: a None value is written as an absent key (its default must be None).
    out = io.StringIO()
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in tables and value is not None:
            out.write(f"{key} = {_toml_value(value)}\n")
    for name, table in tables.items():
        out.write(f"\n[{name}]\n")
        for key, value in table.items():
            if value is not None:
                out.write(f"{key} = {_toml_value(value)}\n")
    return out.getvalue()


def save(config: RunConfig, path: str | os.PathLike) -> None:
    """Writes a run config atomically (YAML, or TOML for a ``.toml`` path).

    Args:
      config: the config.
      path: the file to write; replaced in one step, never half-written.
    """
    path = Path(path)
    write_atomic(path, dumps(config, "toml" if path.suffix == ".toml" else "yaml").encode())


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and ``os.replace``.

    A reader (or a process killed mid-write) sees either the old file or the
    new one, never a mix.

    Args:
      path: the destination.
      data: the bytes to write.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


# --- values -------------------------------------------------------------------------


def validate(config: RunConfig) -> None:
    """Checks that a run config can run.

    Run settings are checked here; the algorithm config by the validator its
    registry entry names, and by its own ``validate()`` method if it has one.

    Args:
      config: the config.

    Raises:
      ConfigError: an impossible value, saying which and why.
    """
    if config.generations < 0:
        raise ConfigError(f"generations must be >= 0, got {config.generations}.")
    if config.chunk < 1:
        raise ConfigError(f"chunk must be >= 1, got {config.chunk}.")
    if config.checkpoint_every < 0:
        raise ConfigError(
            f"checkpoint_every must be >= 0 (0: only at the end), got {config.checkpoint_every}."
        )
    if config.devices is not None and config.devices < 1:
        raise ConfigError(f"devices must be >= 1 (or null for all), got {config.devices}.")
    if config.seed < 0:
        raise ConfigError(f"seed must be >= 0, got {config.seed}.")
    spec = _spec(config.algorithm)
    try:
        if spec.validator is not None:
            spec.validator(config.algorithm_config)
        own = getattr(config.algorithm_config, "validate", None)
        if callable(own):
            own()
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _choice(name: str, value: str, valid) -> None:
    if value not in valid:
        close = difflib.get_close_matches(value, list(valid), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{name}: unknown value {value!r}.{hint} Valid: {', '.join(sorted(valid))}."
        )


def validate_es_config(config) -> None:
    """Checks an :class:`~evorl_pop.algorithms.es.ESConfig`.

    Args:
      config: the ES config.

    Raises:
      ConfigError: an unknown strategy or task, or an impossible value.
    """
    from evorl_pop.algorithms.es import OPTIMIZERS, STRATEGIES
    from evorl_pop.tasks import task_names

    _choice("strategy", config.strategy, STRATEGIES)
    _choice("task", config.task, task_names())
    _choice("optimizer", config.optimizer, OPTIMIZERS)
    _choice("activation", config.activation, ("tanh", "relu", "elu"))
    _choice("eval_mode", config.eval_mode, ("vmap", "map"))
    if config.population_size < 2:
        raise ConfigError(f"population_size must be at least 2, got {config.population_size}.")
    for name in ("num_dims", "episodes"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(config, name)}.")
    if config.eval_episodes < 0:
        raise ConfigError(f"eval_episodes must be >= 0, got {config.eval_episodes}.")
    if any(h < 1 for h in config.hidden_sizes):
        raise ConfigError(f"hidden_sizes must all be at least 1, got {list(config.hidden_sizes)}.")
    for name in ("sigma_init", "learning_rate"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{name} must be > 0 (or null for the default), got {value}.")
