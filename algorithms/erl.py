"""ERL: a genetic algorithm over actors plus one TD3 (or SAC) learner sharing its experience.

Khadka & Tumer (2018), "Evolution-Guided Policy Gradient in Reinforcement
Learning" (with TD3 as the learner, as in later ERL variants). The initial
population (independently initialised actors) is evaluated once; then one
generation of the engine:

1. ask: :class:`GA` breeds the population from the previous one (the elites
   kept in their slots; every other slot gets a child of two tournament
   winners: neuron-wise crossover, then Gaussian mutation of a fraction of
   its weights);
2. learner step: the learner runs exploration episodes (Gaussian action
   noise; SAC samples its own policy) into the shared replay buffer and takes
   TD3 (SAC) updates on minibatches split over the ``DP`` axis; every
   ``sync_period`` generations its actor takes the slot of the weakest member
   (a bred child there, never an elite);
3. evaluate: every member runs one episode, sharded over the ``POP`` axis;
   all steps go into the replay buffer;
4. tell: the GA keeps the evaluated population and its fitness.

``eval_return`` is the learner's actor without noise (SAC's: its squashed
mean, as every member of its population acts). Scores are returns; the GA
ranks evosax fitness (minimised), the one sign boundary being the engine's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from evosax.algorithms.population_based.base import Params as BaseParams
from evosax.algorithms.population_based.base import PopulationBasedAlgorithm
from evosax.algorithms.population_based.base import State as BaseState
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh

from evorl_pop import registry
from evorl_pop.base import ConfigError, check_config
from evorl_pop.core.engine import Engine, make_mesh
from evorl_pop.rl.hybrid import EvoRLConfig
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.sac import SACConfig
from evorl_pop.rl.td3 import HYBRID_SETTINGS, TD3Config
from evorl_pop.tasks.control import ControlTask


@dataclasses.dataclass(frozen=True)
class Config(EvoRLConfig):
    """ERL settings: the GA's and the learner's beside those of
    :class:`~evorl_pop.rl.hybrid.EvoRLConfig` (the task, the replay buffer, ``learner``).

    Attributes:
      td3: the learner's settings with ``learner='td3'``.
      sac: the learner's settings with ``learner='sac'``.
      num_elites: best actors copied unchanged into the next generation.
      tournament_size: contestants per tournament selection.
      crossover_prob: probability that a child mixes two parents (else it
        copies the first).
      mutation_prob: probability that a child is mutated.
      mutation_frac: fraction of a mutated child's weights that get noise.
      mutation_std: std of that Gaussian noise.
      sync_period: generations between copies of the learner's actor into
        the population.
      rl_episodes: exploration episodes of the learner per generation.
      exploration_noise: std of TD3's Gaussian action noise, in units of half
        the action range (SAC explores by sampling its policy).
      updates_per_generation: TD3 iterations (critic steps; SAC: updates) per generation.
    """

    td3: TD3Config = HYBRID_SETTINGS
    sac: SACConfig = SACConfig()
    num_elites: int = 2
    tournament_size: int = 3
    crossover_prob: float = 0.5
    mutation_prob: float = 0.9
    mutation_frac: float = 0.1
    mutation_std: float = 0.1
    sync_period: int = 5
    rl_episodes: int = 1
    exploration_noise: float = 0.1
    updates_per_generation: int = 1000

    HOST_LEARNERS = ("td3", "sac")

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        super().validate()
        if not 0 <= self.num_elites < self.population_size:
            raise ConfigError(
                f"num_elites={self.num_elites} leaves no slot for offspring or the RL actor "
                f"in a population of {self.population_size}; use population_size > num_elites."
            )
        names = ("tournament_size", "sync_period", "rl_episodes", "updates_per_generation")
        check_config(self, least=dict.fromkeys(names, 1))


@flax.struct.dataclass
class GAParams(BaseParams):
    crossover_prob: float
    mutation_prob: float
    mutation_frac: float
    mutation_std: float


class GA(PopulationBasedAlgorithm):
    """ERL's genetic algorithm in evosax's interface: elites stay in their slots.

    Child ``i`` draws its randomness from ``fold_in(key, i)``; crossover swaps
    whole neurons (a unit's incoming weights and bias), so parents mix units,
    not unrelated weights.
    """

    def __init__(self, population_size: int, task: ControlTask, config: Config):
        super().__init__(population_size, jnp.zeros(task.num_dims))
        self.config = config
        self.task = task
        # from the shapes alone: a NumPy constant even where the GA is built while tracing
        flat = jax.ShapeDtypeStruct((task.num_dims,), jnp.float32)
        neuron = _neuron_ids(jax.eval_shape(task.unravel, flat))
        self.neuron = jnp.asarray(neuron)
        self.num_neurons = int(neuron.max()) + 1
        c = config
        self._default_params = GAParams(
            c.crossover_prob, c.mutation_prob, c.mutation_frac, c.mutation_std
        )

    def initial_population(self, key: jax.Array) -> jax.Array:
        """Independently initialised actors: member ``i`` from ``fold_in(key, i)``."""
        index = jnp.arange(self.population_size)
        return jax.vmap(lambda i: self.task.init_solution(jax.random.fold_in(key, i)))(index)

    def _init(self, key, params: GAParams) -> BaseState:
        n = self.population_size
        d = self.num_dims
        return BaseState(
            population=jnp.zeros((n, d)),
            fitness=jnp.full(n, jnp.inf),
            best_solution=jnp.full(d, jnp.nan),
            best_fitness=jnp.inf,
            generation_counter=0,
        )

    def _ask(self, key, state: BaseState, params: GAParams):
        cfg = self.config
        pop = self.population_size
        flat = state.population
        fitness = state.fitness

        def tournament(k):
            contestants = jax.random.randint(k, (cfg.tournament_size,), 0, pop)
            return contestants[jnp.argmin(fitness[contestants])]

        def child(i):
            ks = jax.random.split(jax.random.fold_in(key, i), 7)
            a = flat[tournament(ks[0])]
            b = flat[tournament(ks[1])]
            from_b = jax.random.bernoulli(ks[2], 0.5, (self.num_neurons,))[self.neuron]
            cross = jax.random.bernoulli(ks[3], params.crossover_prob)
            x = jnp.where(cross & from_b, b, a)
            mutate = jax.random.bernoulli(ks[4], params.mutation_prob)
            where = jax.random.bernoulli(ks[5], params.mutation_frac, x.shape)
            noise = params.mutation_std * jax.random.normal(ks[6], x.shape)
            return x + jnp.where(mutate & where, noise, 0.0)

        children = jax.vmap(child)(jnp.arange(pop))
        elite = ranks(fitness) < cfg.num_elites
        return jnp.where(elite[:, None], flat, children), state

    def _tell(self, key, population, fitness, state: BaseState, params: GAParams) -> BaseState:
        return state.replace(population=population, fitness=fitness)


@flax.struct.dataclass
class LearnerState:
    """The learner, the shared replay buffer, and where its actor went."""

    learner: Any  # the learner's actor, critics, targets and optimizers
    buffer: ReplayBuffer
    slot: jax.Array  # int32: the slot the actor took (or would have) this generation
    injected: jax.Array  # bool: whether it entered the population this generation


class ERLLearner:
    """ERL's TD3 (or SAC) learner: explores, learns from the shared buffer, joins the
    population."""

    collect = True  # the engine's evaluations return transitions

    def __init__(self, task: ControlTask, config: Config, mesh: Mesh):
        self.config = config
        name = f"ERL (its learner is {config.learner.upper()})"
        self.rl = config.rl_learner(task, mesh, config.updates_per_generation, name)

    def init(self, key: jax.Array) -> LearnerState:
        rl = self.rl
        return LearnerState(rl.init(key), rl.empty_buffer(), jnp.int32(0), jnp.bool_(False))

    def eval_solution(self, state: LearnerState) -> jax.Array:
        """The learner's actor, flat: what ``eval_return`` reports."""
        return ravel_pytree(self.rl.actor(state.learner))[0]

    def step(self, key, state: LearnerState, population, strategy_state):
        cfg = self.config
        explore_key, learn_key = jax.random.split(key)
        rl = self.rl
        actor = rl.actor(state.learner)
        episodes = jax.vmap(lambda k: rl.explore(actor, k, cfg.exploration_noise))(
            jax.random.split(explore_key, cfg.rl_episodes)
        )
        buffer = state.buffer.add(episodes.transitions, episodes.valid)
        learner, losses = rl.learn_if(
            rl.ready(buffer), lambda s: rl.learn(s, buffer, learn_key), state.learner
        )
        # generation g (from 1) injects when g is a multiple of sync_period, into the slot
        # ranked last: a bred child's, whatever the ties, since num_elites < population_size
        inject = (strategy_state.generation_counter + 1) % cfg.sync_period == 0
        slot = jnp.argmax(ranks(strategy_state.fitness)).astype(jnp.int32)
        flat = ravel_pytree(rl.actor(learner))[0]
        population = population.at[slot].set(jnp.where(inject, flat, population[slot]))
        metrics = {
            **losses,
            "env_steps": jnp.sum(episodes.steps),
            "episodes": jnp.int32(cfg.rl_episodes),
            "explore_return": jnp.mean(episodes.episode_return),
            "rl_actors_injected": inject.astype(jnp.int32),
        }
        return population, LearnerState(learner, buffer, slot, inject), metrics

    def observe(self, state: LearnerState, summary, episodes):
        returned = jnp.where(state.injected, summary.scores[state.slot], jnp.nan)
        buffer = state.buffer.add(episodes.transitions, episodes.valid)
        return state.replace(buffer=buffer), {"injected_return": returned}


class ERL(Engine):
    """ERL as the engine runs it: :class:`GA` asks and tells, :class:`ERLLearner` steps
    in between. ``mesh`` (``None``: every device) shards the population over
    ``'POP'`` and the learner's minibatches over ``'DP'``, on the same devices;
    a config that cannot run is refused by ``Config.validate`` with what to change.
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        config.validate()
        self.config = config
        mesh = make_mesh() if mesh is None else mesh
        task = config.actor_task()
        learner = ERLLearner(task, config, mesh)
        strategy = GA(config.population_size, task, config)
        super().__init__(strategy, task, mesh, eval_episodes=config.eval_episodes, learner=learner)


def ranks(fitness: jax.Array) -> jax.Array:
    """Rank of each member by fitness (minimised), 0 the best; ties keep slot order."""
    return jnp.argsort(jnp.argsort(fitness, stable=True), stable=True)


def _neuron_ids(params: Any) -> np.ndarray:
    """For each flat weight, the id of the unit it feeds (one id per output unit).

    A Dense kernel ``(in, out)`` and its bias ``(out,)`` share the ids of their
    ``out`` units, so crossover can swap whole neurons.
    """
    ids = {}
    offset = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        layer = tuple(str(p) for p in path[:-1])
        width = leaf.shape[-1]
        if layer not in ids:
            ids[layer] = offset
            offset += width
        ids[path] = np.broadcast_to(ids[layer] + np.arange(width), leaf.shape)
    leaves = jax.tree_util.tree_leaves_with_path(params)  # ravel_pytree's order
    return np.concatenate([ids[path].ravel() for path, _ in leaves]).astype(np.int32)


registry.register_algorithm("erl", Config, ERL, "ERL: a GA population + a TD3 or SAC learner")
