"""A strategy plug-in: a (1+lambda)-ES whose step size follows the 1/5th success rule.

Importing this module registers the strategy ``OnePlusLambda``, so every ES run takes
it by name::

    PYTHONPATH=examples/plugins evorl-pop train --plugin one_plus_lambda \\
        --strategy OnePlusLambda --task sphere --set num_dims=5 --pop 8

It meets evosax's interface (``evorl_pop.core.interfaces.Strategy``): built as
``OnePlusLambda(population_size, solution)``, with ``default_params``, ``init``,
``ask``, ``tell`` and ``get_mean``. Fitness is minimised, as in evosax.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop import registry

#: The success rate the step size aims at (Rechenberg's 1/5th rule).
TARGET_SUCCESS = 0.2


@flax.struct.dataclass
class Params:
    std_init: float = 1.0  # the initial step size (``--set sigma_init=...``)
    damping: float = 3.0  # larger: the step size changes more slowly


@flax.struct.dataclass
class State:
    mean: jax.Array  # (num_dims,): the parent
    fitness: jax.Array  # (): the parent's fitness (inf before the first tell)
    std: jax.Array  # (): the step size, reported as the ``sigma`` metric


class OnePlusLambda:
    """``population_size`` children ``parent + std * z``; the best child replaces the
    parent where it is no worse, and ``std`` grows when more than a fifth of the
    children beat the parent, else shrinks."""

    def __init__(self, population_size: int, solution: jax.Array):
        self.population_size = population_size
        self.num_dims = solution.size

    @property
    def default_params(self) -> Params:
        return Params()

    def init(self, key: jax.Array, solution: jax.Array, params: Params) -> State:
        del key  # deterministic
        return State(
            mean=jnp.asarray(solution, jnp.float32),
            fitness=jnp.asarray(jnp.inf, jnp.float32),
            std=jnp.asarray(params.std_init, jnp.float32),
        )

    def ask(self, key: jax.Array, state: State, params: Params) -> tuple[jax.Array, State]:
        z = jax.random.normal(key, (self.population_size, self.num_dims))
        return state.mean + state.std * z, state

    def tell(self, key, population, fitness, state: State, params: Params):
        best = jnp.argmin(fitness)
        better = fitness[best] <= state.fitness
        mean = jnp.where(better, population[best], state.mean)
        parent_fitness = jnp.where(better, fitness[best], state.fitness)
        success = jnp.mean(fitness < state.fitness)
        step = jnp.exp((success - TARGET_SUCCESS) / (params.damping * (1 - TARGET_SUCCESS)))
        state = State(mean=mean, fitness=parent_fitness, std=state.std * step)
        return state, {"success_rate": success}

    def get_mean(self, state: State) -> jax.Array:
        return state.mean


registry.register_strategy("OnePlusLambda", OnePlusLambda)
