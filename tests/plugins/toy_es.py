"""A plug-in in one file: an evolution strategy and an algorithm built on it.

Nothing here edits evorl_pop. Importing this module (``evorl-pop --plugin
toy_es``, or an ``evorl_pop.plugins`` entry point naming it) registers:

* the strategy ``Toy_ES``: a (mu/mu, lambda)-ES whose one step size follows
  Rechenberg's 1/5th success rule, in evosax's interface, so the built-in
  ``es`` algorithm runs it too (``--strategy Toy_ES``);
* the algorithm ``toy_es``: that strategy on a black-box task, the engine
  sharding its population over the devices of the ``POP`` axis.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from evosax.algorithms.distribution_based.base import DistributionBasedAlgorithm
from evosax.algorithms.distribution_based.base import Params as BaseParams
from evosax.algorithms.distribution_based.base import State as BaseState

from evorl_pop import registry
from evorl_pop.base import ConfigError
from evorl_pop.core.engine import Engine
from evorl_pop.tasks import make_task


@flax.struct.dataclass
class State(BaseState):
    std: jax.Array  # shape=(): the one step size


@flax.struct.dataclass
class Params(BaseParams):
    std_init: float


class ToyES(DistributionBasedAlgorithm):
    """Candidates ``mean + std * z_i``; the mean moves to the elites' mean, and ``std``
    grows when more than a fifth of the candidates beat the old best, else shrinks."""

    def __init__(self, population_size: int, solution, std_init: float = 1.0):
        super().__init__(population_size, solution)
        self.elites = max(1, population_size // 4)
        self._default_params = Params(std_init=std_init)

    def _init(self, key, params: Params) -> State:
        return State(
            mean=jnp.zeros(self.num_dims),
            std=jnp.asarray(params.std_init, jnp.float32),
            best_solution=jnp.full(self.num_dims, jnp.nan),
            best_fitness=jnp.inf,
            generation_counter=0,
        )

    def _ask(self, key, state: State, params: Params):
        z = jax.random.normal(key, (self.population_size, self.num_dims))
        return state.mean + state.std * z, state

    def _tell(self, key, population, fitness, state: State, params: Params) -> State:
        mean = jnp.mean(population[jnp.argsort(fitness)[: self.elites]], axis=0)
        success = jnp.mean(fitness < state.best_fitness)
        std = state.std * jnp.where(success > 0.2, 1.22, 0.82)
        return state.replace(mean=mean, std=std)


registry.register_strategy("Toy_ES", ToyES)


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of ``toy_es``.

    Attributes:
      task: a black-box function (``sphere``, ``rosenbrock``, ...).
      num_dims: its dimension.
      x0: every coordinate of the starting point.
      population_size: candidates per generation.
      sigma_init: the initial step size.
    """

    task: str = "sphere"
    num_dims: int = 10
    x0: float = 3.0
    population_size: int = 16
    sigma_init: float = 1.0

    def validate(self) -> None:
        if self.population_size < 4:
            raise ConfigError(f"population_size must be at least 4, got {self.population_size}.")
        if not self.sigma_init > 0:
            raise ConfigError(f"sigma_init must be > 0, got {self.sigma_init}.")


class ToyAlgorithm(Engine):
    """``Toy_ES`` on ``config.task``, its population sharded over the mesh's devices."""

    def __init__(self, config: Config, mesh=None):
        config.validate()
        self.config = config
        task = make_task(config.task, num_dims=config.num_dims, x0=config.x0)
        strategy = ToyES(config.population_size, jnp.zeros(task.num_dims), config.sigma_init)
        super().__init__(strategy, task, mesh=mesh, eval_episodes=1)


registry.register_algorithm(
    "toy_es", Config, ToyAlgorithm, "a (mu/mu, lambda)-ES with the 1/5th rule (a test plug-in)"
)
