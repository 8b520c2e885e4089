"""Many replicas of one algorithm in one compiled program: seeds and hyperparameter sweeps.

``seeds=N`` (``evorl-pop train --seeds N``) runs seeds ``s0 .. s0+N-1`` of any
registered algorithm; ``sweep=["learning_rate=0.01,0.03", ...]`` (``--sweep``) runs
every setting of the grid (the product of the lists) with each of those seeds. All of
them are stacked on one leading replica axis (setting-major, seed-minor) and stepped
by one ``vmap`` of the algorithm's own step, inside the same compiled chunks as a
single run::

    seed s ─► key(s) ─► split ─► (init key_s, run key_s)       as a single run of seed s
    init:  vmap(init)(init keys)                                every replica's state
    step:  vmap(step)(states, fold_in(run key_s, g) for each replica)

A swept value enters the program as data: the algorithm of a replica is built,
while the step is traced, from its config with the swept fields set to traced
scalars, so replica ``(setting, s)`` computes what a single run of that setting
and ``--seed s`` computes (to float tolerance: a batched program may round
differently). A field that the algorithm reads as a Python value (a population
size, a network's width, a choice) cannot be traced: :func:`program_keys` finds
them by tracing, and ``evorl-pop train --sweep`` runs one program per value of
those, in turn. Each replica's population stays sharded on the ``POP`` axis, as
in a single run; the replica axis is vectorised inside each device.

The metrics of a generation have one value per replica: ``metrics.csv`` gets one
row per generation and replica, labelled by a ``seed`` column and one column per
swept field (:attr:`Replicas.labels`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evorl_pop.base import ConfigError
from evorl_pop.core.interfaces import REPLICA_AXIS, Exports

#: The label column of a replica's seed in ``metrics.csv``.
SEED = "seed"


def parse_sweep(items: Iterable[str]) -> dict[str, list]:
    """``['learning_rate=0.01,0.03', 'hidden_sizes=[32],[64,64]']`` as ``{key: values}``,
    each value read as ``--set`` reads one (``1e-3``, ``[64, 64]``, ``null``).

    Raises:
      ConfigError: an item that is not ``KEY=V1,V2,...``, an empty value, a key twice.
    """
    grid: dict[str, list] = {}
    for item in items:
        key, sep, text = (part.strip() for part in str(item).partition("="))
        if not sep or not key or not text:
            raise ConfigError(
                f"sweep: {item!r} is not KEY=V1,V2,... (e.g. --sweep learning_rate=0.01,0.03)."
            )
        if key in grid:
            raise ConfigError(f"sweep: {key} is swept twice; give its values once.")
        grid[key] = [_value(key, text, part) for part in _split(text)]
    return grid


def format_sweep(grid: Mapping[str, list]) -> tuple[str, ...]:
    """A grid as the ``sweep`` items :func:`parse_sweep` reads back to it."""

    def text(value):
        return value if isinstance(value, str) else json.dumps(value)

    return tuple(f"{key}={','.join(map(text, values))}" for key, values in grid.items())


def _split(text: str) -> list[str]:
    """``text`` cut at its commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _value(key: str, text: str, part: str) -> Any:
    """One swept value, read as ``--set key=part`` reads it."""
    if not part.strip():
        raise ConfigError(f"sweep: {key} has an empty value in {text!r}; give V1,V2,...")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"value={part.strip()}"]))["value"]
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"sweep: cannot read {part!r} in {key}={text}: {err}") from None


def settings(grid: Mapping[str, list]) -> list[dict]:
    """Every setting of a grid, the product of its lists in order (the last key fastest)."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def run_keys(seed: int, seeds: int = 1, repeat: int = 1) -> tuple[jax.Array, jax.Array]:
    """``(init keys, run keys)``, stacked, of ``repeat`` settings times ``seeds`` seeds
    from ``seed``: each replica's keys as its single run's."""
    keys = [jax.random.split(jax.random.key(seed + i)) for i in range(seeds)] * repeat
    return jnp.stack([k[0] for k in keys]), jnp.stack([k[1] for k in keys])


_UNCHECKED: dict[type, type] = {}


def _unchecked_class(cls: type) -> type:
    """A subclass of a config class whose ``validate`` does nothing: its traced values
    were checked as the concrete ones, before."""
    if cls not in _UNCHECKED:
        _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None})
    return _UNCHECKED[cls]


def with_values(config, values: Mapping[str, Any], checked: bool = True):
    """``config`` (a frozen dataclass) with the fields ``values`` names set, a dotted key
    (``td3.actor_lr``) in the nested config. ``checked=False``: the values may be traced
    arrays, and the configs they change skip ``__post_init__`` and ``validate``.

    Raises:
      ConfigError: a key that is not a field (with the nearest).
    """
    nested: dict[str, dict] = {}
    own: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(config)}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head not in names or (rest and not dataclasses.is_dataclass(getattr(config, head))):
            from evorl_pop.base import did_you_mean

            hint = did_you_mean(head, names)
            raise ConfigError(f"sweep: {key!r} is not a field of the algorithm's config.{hint}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, inner in nested.items():
        own[head] = with_values(getattr(config, head), inner, checked)
    if checked:
        return dataclasses.replace(config, **own)
    out = object.__new__(_unchecked_class(type(config)))
    for field in dataclasses.fields(config):
        object.__setattr__(out, field.name, own.get(field.name, getattr(config, field.name)))
    return out


def with_values_mapping(config: Mapping, values: Mapping[str, Any]) -> dict:
    """A config mapping (``config.yaml``'s ``algorithm_config``) with the dotted keys of
    ``values`` set."""
    out = dict(config)
    for key, value in values.items():
        head, _, rest = key.partition(".")
        out[head] = with_values_mapping(out.get(head) or {}, {rest: value}) if rest else value
    return out


@flax.struct.dataclass
class ReplicasState:
    """Every replica's state of the algorithm, stacked on a leading axis."""

    generation: jax.Array  # int32: generations completed, the same for every replica
    replicas: Any  # the algorithm's state of each replica, leading axis (replicas,)


class Replicas:
    """An algorithm's replicas: each setting of a sweep's grid with each of ``seeds``
    seeds from ``seed``, stepped together.

    It meets the :class:`~evorl_pop.core.interfaces.Algorithm` protocol with keys of
    shape ``(replicas,)``: :meth:`init` takes the replicas' init keys, :meth:`step`
    each replica's generation key (:func:`run_keys`).

    Args:
      algorithm_class: the registered algorithm, built as ``cls(config, mesh=mesh)``.
      config: its config (the swept fields' values in it are not used).
      mesh: the run's mesh.
      seed, seeds: the replicas' seeds, ``seed .. seed+seeds-1``.
      grid: swept field (dotted for a nested one) to its values; every value must enter
        the program as data (:func:`program_keys` says which do not).

    Raises:
      ConfigError: a swept value the config refuses.
    """

    def __init__(self, algorithm_class, config, mesh, seed: int, seeds: int, grid=None):
        if seeds < 1:
            raise ConfigError(f"seeds must be >= 1, got {seeds}.")
        self.algorithm_class, self.config, self.mesh = algorithm_class, config, mesh
        self.grid = dict(grid or {})
        self.settings = settings(self.grid)
        for setting in self.settings[1:] if self.grid else ():  # checked as concrete values
            with_values(config, setting).validate()
        first = with_values(config, self.settings[0]) if self.grid else config
        #: The algorithm of the first replica, built from concrete values.
        self.algorithm = algorithm_class(first, mesh=mesh)
        self.num_seeds = seeds
        #: Each replica's labels (``metrics.csv``'s columns): its seed, its swept values.
        self.labels = [{SEED: seed + s, **c} for c in self.settings for s in range(seeds)]
        self.values = {key: jnp.asarray([label[key] for label in self.labels]) for key in self.grid}

    def __len__(self) -> int:
        return len(self.labels)

    def _traced(self, values):
        """The algorithm of a replica whose swept values are ``values`` (traced)."""
        if not values:
            return self.algorithm
        return self.algorithm_class(with_values(self.config, values, False), mesh=self.mesh)

    def init(self, keys: jax.Array) -> ReplicasState:
        """Every replica's first state from its init key (``keys``: shape ``(replicas,)``)."""
        init = jax.vmap(lambda v, k: self._traced(v).init(k), axis_name=REPLICA_AXIS)
        states = init(self.values, keys)
        return ReplicasState(generation=jnp.int32(0), replicas=states)

    def step(self, state: ReplicasState, keys: jax.Array) -> tuple[ReplicasState, dict]:
        """One generation of every replica, replica ``r`` with ``keys[r]``; each metric
        has one value per replica."""
        step = jax.vmap(lambda v, s, k: self._traced(v).step(s, k), axis_name=REPLICA_AXIS)
        inner, metrics = step(self.values, state.replicas, keys)
        return ReplicasState(generation=state.generation + 1, replicas=inner), metrics

    def export(self, state: ReplicasState, run_dir: Path, metrics: dict) -> dict[str, Path]:
        """Each replica's result beyond one solution (an algorithm that
        :class:`~evorl_pop.core.interfaces.Exports` it: an archive, a front), in a folder
        of its own, ``run_dir/seed=3,learning_rate=0.01/``, with its own rows of
        ``metrics``; nothing for other algorithms."""
        if not isinstance(self.algorithm, Exports):
            return {}
        figures = {}
        for index, label in enumerate(self.labels):
            algorithm, inner = self.replica(state, index)
            out = Path(run_dir) / folder(label)
            out.mkdir(exist_ok=True)
            rows = np.ones(len(metrics.get("generation", ())), bool)
            for key, value in label.items():
                rows &= metrics[key] == value
            own = {k: v[rows] for k, v in metrics.items() if k not in label}
            for name, path in algorithm.export(inner, out, own).items():
                figures[f"{name}/{folder(label)}"] = path
        return figures

    def replica(self, state: ReplicasState, index: int) -> tuple[Any, Any]:
        """``(algorithm, state)`` of replica ``index``, as its single run's (the algorithm
        built from its concrete values)."""
        own = {k: v for k, v in self.labels[index].items() if k != SEED}
        algorithm = self.algorithm_class(with_values(self.config, own), mesh=self.mesh)
        return algorithm, jax.tree.map(lambda x: x[index], state.replicas)


def folder(label: Mapping[str, Any]) -> str:
    """A replica's (or a sweep group's) folder name: ``seed=3,learning_rate=0.01``."""
    return ",".join(f"{k}={v}" for k, v in label.items()).replace("/", "_").replace(" ", "")


def build(algorithm_class, run_config, mesh) -> tuple[Replicas, jax.Array, jax.Array]:
    """``(replicas, init keys, run keys)`` of a run config's seeds and sweep in one program.

    Raises:
      ConfigError: a swept key that cannot enter the program as data, or a value the
        algorithm's config refuses.
    """
    grid = parse_sweep(run_config.sweep)
    config = run_config.algorithm_config
    static = program_keys(algorithm_class, config, mesh, grid)
    if static:
        raise ConfigError(
            f"sweep: {', '.join(static)} cannot enter one program as data (the algorithm "
            "reads it as a Python value: a size, a choice); evorl-pop train --sweep runs one "
            "program per value of such a key, in turn."
        )
    replicas = Replicas(algorithm_class, config, mesh, run_config.seed, run_config.seeds, grid)
    init_keys, run_keys_ = run_keys(run_config.seed, run_config.seeds, len(replicas.settings))
    return replicas, init_keys, run_keys_


def program_keys(algorithm_class, config, mesh, grid: Mapping[str, list]) -> list[str]:
    """The swept fields that cannot enter one program as data: those the algorithm reads
    as Python values (shapes, choices), found by tracing a replica of two values of
    each field alone (nothing is compiled or run)."""
    static = []
    for key, values in grid.items():
        pair = {key: [values[0], values[-1]]}
        try:
            replicas = Replicas(algorithm_class, config, mesh, 0, 1, pair)
            keys = run_keys(0, 1, 2)
            state = jax.eval_shape(replicas.init, keys[0])
            jax.eval_shape(replicas.step, state, keys[1])
        except ConfigError:
            raise
        except Exception:  # a tracer where Python needs a value: its own program
            static.append(key)
    return static


def summary(rows: list[dict], keys: Iterable[str], metric: str = "fitness_mean") -> list[str]:
    """The last generation of a run of replicas, one line per setting: ``metric``'s mean
    ± standard error over its seeds (``keys``: the swept fields)."""
    keys = list(keys)
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row.get(metric, np.nan))
    lines = []
    generation = rows[-1]["generation"] if rows else 0
    for setting, values in groups.items():
        values = np.asarray(values, np.float64)
        finite = values[np.isfinite(values)]
        where = ", ".join(f"{k}={v}" for k, v in zip(keys, setting, strict=True))
        where = f" ({where})" if where else ""
        if not len(finite):
            lines.append(f"{metric}{where}: no finite value over {len(values)} seeds")
            continue
        error = finite.std(ddof=1) / np.sqrt(len(finite)) if len(finite) > 1 else np.nan
        lines.append(
            f"{metric} at generation {generation}{where}: {finite.mean():.6g} ± {error:.3g} "
            f"(mean ± standard error over {len(finite)} of {len(values)} seeds)"
        )
    return lines
