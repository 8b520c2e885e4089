"""MAP-Elites: an archive of the best candidate of every behaviour, sharded by cell.

Quality-diversity (Mouret & Clune 2015): the descriptor space of a task
(:class:`~evorl_pop.core.interfaces.Describes`: ``qd/arm``, ``qd/rastrigin_proj``)
is cut into cells, a grid or a CVT, and each cell keeps its elite. A generation has
the shape of every other algorithm's::

    ask:      the emitter's candidates;
              by default parents drawn uniformly over the filled cells of every
              device ─► isoline variation (Vassiliades & Mouret 2018):
                 x + iso_sigma * N(0, I) + line_sigma * N(0, 1) * (y - x),
                 clipped to the task's genotype bounds; or ME-ES's OpenES
                 (emitter: es), or CMA-ME's CMA-ES (emitter: cma_me), or
                 PGA-ME's TD3 policy-gradient steps beside isoline variation
                 (emitter: pga_me), or a plug-in's
    evaluate: the one evaluator (score, descriptor), sharded P('POP')
    tell:     the candidates inserted into the archive, each device into its cells;
              the emitter told the batch (and the archive before and after)

The emitters are in :mod:`~evorl_pop.algorithms.qd_emitters` and
:mod:`~evorl_pop.algorithms.pgame`; a plug-in adds its own with
:func:`evorl_pop.registry.register_emitter`.

The archive (:mod:`evorl_pop.core.archive`) is sharded across the devices by cell,
so memory per device is proportional to cells / devices, and a run gives the same
archive on any device count (bit for bit where the evaluations are: a physics
simulator's episodes may round differently on a slice of another size, and a brax
task's archives then part). Its metrics per generation: ``qd_score`` (the sum over
filled cells of fitness plus the task's ``qd_offset``, QDax's convention, so that
each term is non-negative), ``coverage``, ``archive_size``, ``archive_fitness_max``
and ``archive_fitness_mean``, beside the evaluated batch's ``fitness_*``. At the end
of a run, ``archive.npz``, ``qd.png`` (QD-score and coverage curves) and
``archive.png`` (2-D descriptors) in the run folder.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.algorithms.pgame import PgEmitterConfig
from evorl_pop.algorithms.qd_emitters import CmaEmitterConfig, EsEmitterConfig, isoline_variation
from evorl_pop.base import ConfigError, check_config, did_you_mean, float_dtype
from evorl_pop.core.archive import KINDS, Archive, ShardedArchive, cvt_centroids
from evorl_pop.core.engine import evaluate, make_mesh
from evorl_pop.core.interfaces import EVAL_MODES, Describes
from evorl_pop.rl.hybrid import changed_settings
from evorl_pop.tasks.qd import QD_TASKS
from evorl_pop.tasks.settings import TaskSettings

__all__ = ["MapElites", "MapElitesConfig", "MapElitesState", "isoline_variation"]

#: The settings of the built-in emitters before each had its own section: old flat name
#: to the new, dotted name (read with a DeprecationWarning naming the new one).
RENAMED_SETTINGS = {
    "es_sigma": "es.sigma",
    "es_learning_rate": "es.learning_rate",
    "es_period": "es.period",
    "es_reward": "es.reward",
    "novelty_neighbours": "es.novelty_neighbours",
    "cma_sigma": "cma_me.sigma",
    **{
        f"pg_{name}": f"pga_me.{name}"
        for name in (
            "proportion",
            "critic_hidden_sizes",
            "critic_updates",
            "steps",
            "batch_size",
            "critic_lr",
            "actor_lr",
            "policy_lr",
            "buffer_size",
        )
    },
}

ARCHIVE_FILENAME = "archive.npz"
FIGURE_FILENAME = "archive.png"
PROGRESS_FILENAME = "qd.png"


@functools.lru_cache(maxsize=8)
def _cvt(seed: int, num_cells: int, samples: int, low, high, iterations: int) -> np.ndarray:
    """:func:`~evorl_pop.core.archive.cvt_centroids` from ``seed``, computed once per
    process (a run, its resume and its render build the algorithm again)."""
    return cvt_centroids(jax.random.key(seed), num_cells, samples, low, high, iterations)


@dataclasses.dataclass(frozen=True)
class MapElitesConfig(TaskSettings):
    """Configuration of a MAP-Elites run. Every field can be overridden.

    The task's fields are the task settings block's
    (:class:`~evorl_pop.tasks.settings.TaskSettings`): a quality-diversity task
    (``qd/arm``, ``qd/rastrigin_proj``, ``qd/hopper_uni``, ``qd/walker2d_uni``,
    ``qd/halfcheetah_uni``, ``qd/ant_uni``, ``qd/ant_omni``); ``num_dims``: the
    black-box tasks' genotype dimension (the arm's joints); the brax tasks read
    ``hidden_sizes`` (64, 64 here), ``activation``, ``episode_length`` (``None``: 1000)
    and ``backend``.

    Attributes:
      population_size: candidates per generation (and in the initial batch).
      archive: ``'grid'`` (``cells_per_dim`` cells per descriptor dimension) or
        ``'cvt'`` (``num_cells`` centroids by k-means on ``cvt_samples`` uniform
        samples, ``cvt_iterations`` Lloyd steps, from ``cvt_seed``).
      cells_per_dim: grid archives: cells per descriptor dimension.
      num_cells: CVT archives: cells.
      cvt_samples: CVT archives: the uniform samples of the descriptor box k-means runs on.
      cvt_iterations: CVT archives: Lloyd's k-means steps.
      cvt_seed: CVT archives: the seed of the samples (the centroids depend on it only).
      emitter: how candidates are made, a registered emitter's name
        (:mod:`~evorl_pop.algorithms.qd_emitters`): ``'isoline'`` (isoline variation),
        ``'es'`` (ME-ES: an OpenES centred on an elite), ``'cma_me'`` (CMA-ME: a CMA-ES
        ranked by archive improvement), ``'pga_me'`` (PGA-ME: TD3 policy-gradient steps
        beside isoline variation; brax tasks only) or a plug-in's (``--plugin MODULE``).
      iso_sigma: isoline variation's isotropic Gaussian width (``isoline``, ``pga_me``).
      line_sigma: isoline variation's width along the line between the two parents.
      es: ME-ES's settings (:class:`~evorl_pop.algorithms.qd_emitters.EsEmitterConfig`:
        ``--set es.sigma=0.1``).
      cma_me: CMA-ME's settings
        (:class:`~evorl_pop.algorithms.qd_emitters.CmaEmitterConfig`).
      pga_me: PGA-ME's settings (:class:`~evorl_pop.algorithms.pgame.PgEmitterConfig`).
      emitter_settings: the settings of an emitter without a field of its own here (a
        plug-in's), as changes to its registered defaults, e.g. ``{sigma: 0.1}``
        (``--set emitter_settings.sigma=0.1``); the emitter's settings check them.
      eval_mode: ``'vmap'`` (fast) or ``'map'`` (low memory) per device.
    """

    task: str = "qd/arm"
    num_dims: int | None = 8
    hidden_sizes: tuple[int, ...] = (64, 64)
    population_size: int = 128
    archive: str = "grid"
    cells_per_dim: int = 32
    num_cells: int = 1024
    cvt_samples: int = 50_000
    cvt_iterations: int = 30
    cvt_seed: int = 0
    emitter: str = "isoline"
    iso_sigma: float = 0.005
    line_sigma: float = 0.05
    es: EsEmitterConfig = dataclasses.field(default_factory=EsEmitterConfig)
    cma_me: CmaEmitterConfig = dataclasses.field(default_factory=CmaEmitterConfig)
    pga_me: PgEmitterConfig = dataclasses.field(default_factory=PgEmitterConfig)
    emitter_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_mode: str = "vmap"

    TASK_KINDS = ("qd",)

    #: Keys of configs written before the emitters had their own settings, read at their
    #: new place (:mod:`evorl_pop.run.config`).
    RENAMED = RENAMED_SETTINGS

    def validate(self) -> None:
        """Raises a :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        if self.task not in QD_TASKS:
            raise ConfigError(
                f"task: mapelites needs a task with behaviour descriptors "
                f"({', '.join(QD_TASKS)}), and {self.task!r} has none: -a es optimises it, "
                f"or choose task=qd/arm."
            )
        self.check_task()
        check_config(
            self,
            choices={"archive": KINDS, "eval_mode": EVAL_MODES},
            least={
                "num_dims": 2,
                "population_size": 1,
                "cells_per_dim": 1,
                "num_cells": 1,
                "cvt_iterations": 0,
            },
            nonnegative=("iso_sigma", "line_sigma"),
        )
        if self.archive == "cvt" and self.cvt_samples < self.num_cells:
            raise ConfigError(
                f"cvt_samples must be at least num_cells={self.num_cells}, got {self.cvt_samples}."
            )
        settings = self.emitter_config()
        if settings is not None:
            settings.validate(self)

    def emitter_spec(self) -> registry.EmitterSpec:
        """The registered emitter ``emitter`` names.

        Raises:
          ConfigError: an unknown emitter, naming the registered ones.
        """
        spec = registry.EMITTERS.find(self.emitter)
        if spec is not None:
            return spec
        valid = registry.EMITTERS.names()
        hint = did_you_mean(self.emitter, valid)
        raise ConfigError(
            f"emitter: unknown value {self.emitter!r}.{hint} Valid: {', '.join(valid)}. "
            "An emitter of your own: --plugin MODULE."
        )

    def _has_section(self) -> bool:
        names = {f.name for f in dataclasses.fields(self)}
        return self.emitter in names and dataclasses.is_dataclass(getattr(self, self.emitter))

    def emitter_config(self) -> Any:
        """The chosen emitter's settings: this config's field of its name, else its
        registered defaults changed by ``emitter_settings`` (``None``: it has none).

        Raises:
          ConfigError: an unknown emitter; ``emitter_settings`` given for an emitter with
            a field of its own or without settings, or naming settings it does not have.
        """
        spec = self.emitter_spec()
        if self._has_section():
            if self.emitter_settings:
                example = next(iter(self.emitter_settings))
                raise ConfigError(
                    f"emitter_settings: {self.emitter}'s settings are under {self.emitter} "
                    f"(--set {self.emitter}.{example}=...); leave emitter_settings empty."
                )
            return getattr(self, self.emitter)
        if spec.settings is None:
            if self.emitter_settings:
                raise ConfigError(
                    f"emitter_settings: the emitter {self.emitter!r} has no settings; leave "
                    "emitter_settings empty."
                )
            return None
        return changed_settings(spec.settings(), self.emitter_settings, "emitter_settings.")


@flax.struct.dataclass
class MapElitesState:
    """A MAP-Elites run's state: the archive (sharded by cell), the task's state, the
    emitter's state (replicated; none for isoline variation)."""

    archive: Archive
    task_state: Any
    generation: jax.Array  # int32, generations completed
    emitter: Any = ()


class MapElites:
    """MAP-Elites with an emitter (isoline variation by default), its archive sharded
    over the ``POP`` axis."""

    def __init__(self, config: MapElitesConfig, mesh=None, task=None):
        """Builds the task and the archive.

        Args:
          config: a :class:`MapElitesConfig`.
          mesh: a mesh with a ``'POP'`` axis (``None``: every device).
          task: a ready task with descriptors instead of ``config.task``.

        Raises:
          ConfigError: a value of ``config`` that cannot run, or a task without descriptors.
        """
        if task is None:
            config.validate()
            task = config.make_task()
        elif not isinstance(task, Describes):
            raise ConfigError(
                f"task: MAP-Elites needs a task with behaviour descriptors (descriptor_size, "
                f"descriptor_bounds, genotype_bounds, qd_offset, evaluate_descriptor); "
                f"{type(task).__name__} has none."
            )
        self.config = config
        self.task = task
        self.mesh = make_mesh() if mesh is None else mesh
        low, high = task.descriptor_bounds
        if config.archive == "grid":
            cells = (config.cells_per_dim,) * task.descriptor_size
            self.archive = ShardedArchive(self.mesh, low, high, cells_per_dim=cells)
        else:
            centroids = _cvt(
                config.cvt_seed,
                config.num_cells,
                config.cvt_samples,
                tuple(low),
                tuple(high),
                config.cvt_iterations,
            )
            self.archive = ShardedArchive(self.mesh, low, high, centroids=centroids)
        self.population_size = config.population_size
        spec = config.emitter_spec()
        emitter = spec.emitter_class(self.archive, task, config, config.emitter_config())
        where = f"emitter {spec.name!r}"
        self.emitter = registry.check_built(where, emitter, "Emitter")
        if emitter.collect:  # its episodes' steps are handed to observe
            registry.check_built(where, emitter, "ObservesEpisodes")

    def _evaluate(self, population, key, task_state, emitter_state=()):
        """``(summary, quality, descriptors, emitter_state)``: the batch's statistics
        (task units), its fitness maximised and its descriptors, replicated; an emitter
        that learns from the episodes (``collect``) observes their transitions."""
        task = self.task
        collect = self.emitter.collect

        def one(x, k):
            if collect:  # a brax task's episode with its transitions (checked by config)
                return task.episode(x, k, collect=True)
            return task.evaluate_descriptor(x, k, task_state)

        summary, outs = evaluate(
            one, population, key, self.mesh, task.maximize, self.config.eval_mode
        )
        n = population.shape[0]
        descriptors = outs
        if collect:  # padded candidates' steps are no steps
            descriptors, transitions, valid = outs
            real = jnp.arange(valid.shape[0]) < n
            valid = valid & real[:, None]
            emitter_state = self.emitter.observe(emitter_state, transitions, valid)
        scores = summary.scores[:n]
        quality = scores if task.maximize else -scores
        return summary, quality, descriptors[:n], emitter_state

    def _initial_population(self, key):
        bounds = self.task.genotype_bounds
        if bounds is None:  # the task's own initialisation (a policy's weights), per key
            keys = jax.random.split(key, self.population_size)
            return jax.vmap(self.task.init_solution)(keys).astype(float_dtype())
        shape = (self.population_size, self.task.num_dims)
        return jax.random.uniform(key, shape, float_dtype(), *bounds)

    def init(self, key: jax.Array) -> MapElitesState:
        """The archive after a batch of uniform random genotypes (within the task's
        genotype bounds; without bounds, the task's ``init_solution`` of a key each)."""
        k_pop, k_eval = jax.random.split(key)
        task_state = self.task.init_state()
        population = self._initial_population(k_pop)
        emitter = (
            self.emitter.init(None, jax.random.fold_in(key, 1)) if self.emitter.collect else ()
        )
        _, quality, descriptors, emitter = self._evaluate(population, k_eval, task_state, emitter)
        archive = self.archive.empty(self.task.num_dims)
        archive, _ = self.archive.insert(archive, population, quality, descriptors)
        if not self.emitter.collect:
            emitter = self.emitter.init(archive, jax.random.fold_in(key, 1))
        state = MapElitesState(archive, task_state, jnp.int32(0), emitter)
        state = jax.tree.map(jnp.asarray, state, jax.tree.map(jnp.result_type, state))
        replicated = NamedSharding(self.mesh, P())
        rest = jax.lax.with_sharding_constraint(state.replace(archive=None), replicated)
        return rest.replace(archive=archive)

    def ask(self, state: MapElitesState, key) -> jax.Array:
        """A generation's candidates, from the emitter (isoline variation: of parents
        drawn over the archive)."""
        return self.emitter.ask(state.archive, state.emitter, key)[0]

    def step(self, state: MapElitesState, key: jax.Array) -> tuple[MapElitesState, dict]:
        """One generation: ask, evaluate, insert, tell the emitter. Pure, jittable."""
        k_ask, k_eval = jax.random.split(key)
        population, asked = self.emitter.ask(state.archive, state.emitter, k_ask)
        summary, quality, descriptors, emitter = self._evaluate(
            population, k_eval, state.task_state, state.emitter
        )
        archive, added = self.archive.insert(state.archive, population, quality, descriptors)
        # replicated, so that the emitter's sums over the batch (an ES's gradient) are
        # each computed whole on every device, in one order on any device count
        replicated = NamedSharding(self.mesh, P())
        told = jax.lax.with_sharding_constraint((quality, descriptors), replicated)
        emitter, emitter_metrics = self.emitter.tell(
            state.archive, archive, emitter, asked, *told, jax.random.fold_in(k_ask, 1)
        )
        task_state = self.task.update_state(state.task_state, summary.info)
        new = MapElitesState(archive, task_state, state.generation + 1, emitter)
        new = jax.tree.map(jnp.asarray, new, jax.tree.map(jnp.result_type, state))
        metrics = summary.metrics()
        metrics.update(
            generation=new.generation,
            evaluations=jnp.int32(self.population_size),
            archive_added=added,
            **self.archive.metrics(archive, self.task.qd_offset),
            **emitter_metrics,
        )
        return new, metrics

    def export(self, state: MapElitesState, run_dir: Path, metrics: dict) -> dict[str, Path]:
        """Writes ``archive.npz`` (``genotypes``, ``fitness``: ``-inf`` for an empty
        cell, ``descriptors``, ``centroids``, ``filled``), ``qd.png`` (the QD-score and
        coverage over the generations of ``metrics.csv``) and, for 2-D descriptors,
        ``archive.png``, a heat map of the elites' fitness over the descriptor space."""
        data = self.archive.to_numpy(state.archive)
        run_dir = Path(run_dir)
        with open(run_dir / ARCHIVE_FILENAME, "wb") as f:
            np.savez(f, **data)
        figures = {}
        title = f"MAP-Elites ({self.config.emitter}) on {self.task.name}"
        if len(metrics.get("generation", ())):
            figures["qd"] = run_dir / PROGRESS_FILENAME
            plot_progress(metrics, figures["qd"], title)
        if self.task.descriptor_size == 2:
            figures["archive"] = run_dir / FIGURE_FILENAME
            plot_archive(data, self.archive, figures["archive"], title=title)
        return figures


def plot_progress(metrics: dict, out: Path, title: str = "") -> None:
    """The QD-score and the coverage over the generations (``metrics``: a run's
    ``metrics.csv`` columns), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, column, label in zip(
        axes, ("qd_score", "coverage"), ("QD-score", "coverage"), strict=True
    ):
        ax.plot(metrics["generation"], metrics[column])
        ax.set(xlabel="generation", ylabel=label)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_archive(data: dict, archive: ShardedArchive, out: Path, title: str = "") -> None:
    """A heat map of a 2-D archive's elites' fitness (``data``: :meth:`ShardedArchive.to_numpy`):
    a grid's cells as an image, a CVT's cells as their Voronoi regions (each pixel
    coloured by its nearest centroid); empty cells white."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = archive.low, archive.high
    fitness = np.where(data["filled"], data["fitness"], np.nan)
    if archive.grid is not None:
        image = fitness.reshape(archive.grid)
    else:  # each pixel of a 256 x 256 raster takes its nearest centroid's value
        axes = [np.linspace(lo, hi, 256) for lo, hi in zip(low, high, strict=True)]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
        c = data["centroids"].astype(np.float64)
        nearest = np.argmin(((grid[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
        image = fitness[nearest].reshape(256, 256)
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    shown = ax.imshow(
        image.T,
        origin="lower",
        extent=(low[0], high[0], low[1], high[1]),
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
    )
    fig.colorbar(shown, ax=ax, label="fitness")
    coverage = data["filled"].mean()
    ax.set(xlabel="descriptor 1", ylabel="descriptor 2")
    ax.set_title(f"{title}\n{int(data['filled'].sum())} elites, coverage {coverage:.1%}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


registry.register_algorithm(
    "mapelites",
    MapElitesConfig,
    MapElites,
    "MAP-Elites quality-diversity, its archive of elites sharded across devices by cell",
)
