"""An algorithm plug-in: the cross-entropy method on a black-box function.

Importing this module registers the algorithm ``cross_entropy``, so that::

    PYTHONPATH=examples/plugins evorl-pop train --plugin cross_entropy \\
        -a cross_entropy --task sphere --set num_dims=4

trains it. An algorithm is a config dataclass with ``validate()`` and a class built
as ``CrossEntropy(config, mesh=None)`` with ``init(key)`` (a state with an integer
``generation``) and a pure ``step(state, key) -> (state, metrics)``
(``evorl_pop.core.interfaces.Algorithm``). Its config embeds the task settings block
(``evorl_pop.tasks.settings.TaskSettings``: ``task``, ``num_dims``, ``x0``, ...), which
checks the task's settings and builds the task. This one runs on one device: it does
not use ``mesh``.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import ConfigError
from evorl_pop.tasks.settings import TaskSettings


@dataclasses.dataclass(frozen=True)
class Config(TaskSettings):
    """Settings of ``cross_entropy``: the task settings block's (``task``: a black-box
    function such as ``sphere`` or ``rastrigin``, minimised; ``num_dims``: its dimension;
    ``x0``: every coordinate of the first mean), and

    Attributes:
      population_size: candidates per generation.
      elite_fraction: the share of the best candidates the next Gaussian is fitted to.
      sigma_init: the first standard deviation of every coordinate.
      smoothing: the share of the last standard deviation kept each generation (the
        rest is the elites'), which keeps the Gaussian from collapsing too early.
      sigma_min: the least standard deviation, which keeps the search from stalling.
    """

    task: str = "sphere"
    population_size: int = 32
    elite_fraction: float = 0.25
    sigma_init: float = 1.0
    smoothing: float = 0.7
    sigma_min: float = 1e-3

    TASK_KINDS = ("blackbox",)  # the kinds of task it takes

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        self.check_task()
        if self.population_size < 2:
            raise ConfigError(f"population_size must be at least 2, got {self.population_size}.")
        if not 0 < self.elite_fraction <= 1:
            raise ConfigError(f"elite_fraction must be in (0, 1], got {self.elite_fraction}.")
        if not 0 <= self.smoothing < 1:
            raise ConfigError(f"smoothing must be in [0, 1), got {self.smoothing}.")
        if not self.sigma_init > 0 or self.sigma_min < 0:
            raise ConfigError("sigma_init must be > 0 and sigma_min >= 0.")


@flax.struct.dataclass
class State:
    mean: jax.Array  # (num_dims,)
    std: jax.Array  # (num_dims,)
    best: jax.Array  # (): the least value so far
    generation: jax.Array  # int32


class CrossEntropy:
    """Candidates drawn from a diagonal Gaussian, which then moves to the elites' mean
    and, smoothed, towards their standard deviation."""

    def __init__(self, config: Config, mesh=None):
        config.validate()
        self.config = config
        self.task = config.make_task()
        self.elites = max(1, int(config.elite_fraction * config.population_size))

    def init(self, key: jax.Array) -> State:
        mean = self.task.init_solution(key)
        std = jnp.full_like(mean, self.config.sigma_init)
        return State(mean, std, jnp.asarray(jnp.inf, mean.dtype), jnp.int32(0))

    def step(self, state: State, key: jax.Array) -> tuple[State, dict]:
        sample_key, eval_key = jax.random.split(key)
        noise = jax.random.normal(sample_key, (self.config.population_size, state.mean.size))
        population = state.mean + state.std * noise
        keys = jax.random.split(eval_key, self.config.population_size)
        task_state = self.task.init_state()
        fitness, _ = jax.vmap(self.task.evaluate, (0, 0, None))(population, keys, task_state)
        elites = population[jnp.argsort(fitness)[: self.elites]]
        smoothing = self.config.smoothing
        std = smoothing * state.std + (1 - smoothing) * jnp.std(elites, axis=0)
        std = jnp.maximum(std, self.config.sigma_min)
        best = jnp.minimum(state.best, jnp.min(fitness))
        metrics = {
            # the run's progress line and fitness.png read these two
            "fitness_best": jnp.min(fitness),
            "fitness_mean": jnp.mean(fitness),
            "best_so_far": best,
            "sigma": jnp.mean(std),
        }
        return State(jnp.mean(elites, axis=0), std, best, state.generation + 1), metrics


registry.register_algorithm(
    "cross_entropy", Config, CrossEntropy, "the cross-entropy method on a black-box function"
)
