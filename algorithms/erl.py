"""ERL: a genetic algorithm over actors plus one TD3 learner sharing its experience.

Khadka & Tumer (2018), "Evolution-Guided Policy Gradient in Reinforcement
Learning" (with TD3 as the learner, as in later ERL variants). One generation:

1. the population is bred from the previous one (the elites kept in their
   slots; every other slot gets a child of two tournament winners: neuron-wise
   crossover, then Gaussian mutation of a fraction of its weights); every
   ``sync_period`` generations the learner's actor takes the slot of the
   weakest member (a bred child there, never an elite);
2. every member runs one episode, sharded over the ``POP`` axis; all steps go
   into one shared replay buffer;
3. the learner runs exploration episodes (Gaussian action noise), adds them to
   the buffer, and takes TD3 updates on minibatches split over the ``DP`` axis;
4. the learner's actor is evaluated without noise (``eval_return``).

Returns are maximised throughout: selection ranks by return directly, so no
sign flip is needed anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh

from evorl_pop.rl.hybrid import Hybrid, HybridConfig, HybridState
from evorl_pop.rl.rollout import collect_episode
from evorl_pop.rl.td3 import TD3State


@dataclasses.dataclass(frozen=True)
class Config(HybridConfig):
    """ERL settings: the shared ones of :class:`~evorl_pop.rl.hybrid.HybridConfig`
    (``task``, ``population_size``, buffer, episodes, ``td3``) and these.

    Attributes:
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
      exploration_noise: std of the learner's Gaussian action noise, in units
        of half the action range.
      updates_per_generation: TD3 iterations (critic steps) per generation.
    """

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


@flax.struct.dataclass
class State(HybridState):
    """The shared fields of :class:`~evorl_pop.rl.hybrid.HybridState` and the learner."""

    learner: TD3State  # the TD3 learner (actor, twin critics, targets, optimizers)


class ERL(Hybrid):
    """ERL on a population sharded over the devices of ``mesh``.

    Args:
      config: a :class:`Config`.
      mesh: see :class:`~evorl_pop.rl.hybrid.Hybrid`.

    Raises:
      ValueError: for a population without room for offspring next to its
        elites, a tournament size, sync period or episode count below 1, and
        where :class:`~evorl_pop.rl.hybrid.Hybrid` does.
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        if not 0 <= config.num_elites < config.population_size:
            raise ValueError(
                f"num_elites={config.num_elites} leaves no slot for offspring or the RL "
                f"actor in a population of {config.population_size}; use population_size "
                "> num_elites."
            )
        if config.tournament_size < 1 or config.sync_period < 1 or config.rl_episodes < 1:
            raise ValueError(
                "tournament_size, sync_period and rl_episodes must be at least 1, got "
                f"{config.tournament_size}, {config.sync_period}, {config.rl_episodes}."
            )
        super().__init__(config, mesh, "ERL (its learner is TD3)", config.updates_per_generation)
        self._neuron = jnp.asarray(_neuron_ids(self.unravel(jnp.zeros(self.num_params))))
        self._num_neurons = int(self._neuron.max()) + 1

    def init(self, key: jax.Array) -> State:
        """A random population, a fresh learner and an empty buffer.

        Args:
          key: PRNG key of the population and of the learner.

        Returns:
          A :class:`State`.
        """
        pop_key, learner_key = jax.random.split(key)
        population = jax.vmap(lambda i: self.policy.init(jax.random.fold_in(pop_key, i)))(
            jnp.arange(self.config.population_size)
        )
        return self.initial_state(State, population, learner=self.td3.init(learner_key))

    def breed(self, flat: jax.Array, fitness: jax.Array, key: jax.Array) -> jax.Array:
        """One GA generation on flat actors: elitism, tournaments, crossover, mutation.

        Child ``i`` draws its randomness from ``fold_in(key, i)``.

        Args:
          flat: the evaluated population, shape ``(population_size, num_params)``.
          fitness: its returns (higher is better, NaN / inf as -inf).
          key: PRNG key.

        Returns:
          The next population; the ``num_elites`` best stay in their slots.
        """
        cfg = self.config
        pop = cfg.population_size

        def tournament(k):
            contestants = jax.random.randint(k, (cfg.tournament_size,), 0, pop)
            return contestants[jnp.argmax(fitness[contestants])]

        def child(i):
            ks = jax.random.split(jax.random.fold_in(key, i), 7)
            a, b = flat[tournament(ks[0])], flat[tournament(ks[1])]
            # Crossover swaps whole neurons (a unit's incoming weights and bias).
            from_b = jax.random.bernoulli(ks[2], 0.5, (self._num_neurons,))[self._neuron]
            cross = jax.random.bernoulli(ks[3], cfg.crossover_prob)
            x = jnp.where(cross & from_b, b, a)
            mutate = jax.random.bernoulli(ks[4], cfg.mutation_prob)
            where = jax.random.bernoulli(ks[5], cfg.mutation_frac, x.shape)
            noise = cfg.mutation_std * jax.random.normal(ks[6], x.shape)
            return x + jnp.where(mutate & where, noise, 0.0)

        children = jax.vmap(child)(jnp.arange(pop))
        elite = _ranks(fitness) < cfg.num_elites
        return jnp.where(elite[:, None], flat, children)

    def inject(
        self, flat: jax.Array, fitness: jax.Array, actor: jax.Array, when: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Copies the learner's actor over a bred child, never over an elite.

        After :meth:`breed` the elites hold the slots ranked best by ``fitness``
        and every other slot holds a new child; the actor takes the slot ranked
        last, which is a child's whatever the ties (all -inf included), since
        ranks are a permutation and ``num_elites < population_size``.

        Args:
          flat: the bred population, shape ``(population_size, num_params)``.
          fitness: the returns it was bred from (the same as :meth:`breed`'s).
          actor: the learner's flat actor, shape ``(num_params,)``.
          when: whether to inject at all (a boolean scalar).

        Returns:
          ``(flat, slot)``: the population, and the slot the actor took (or
          would have taken).
        """
        slot = jnp.argmax(_ranks(fitness))
        return flat.at[slot].set(jnp.where(when, actor, flat[slot])), slot

    def step(self, state: State, key: jax.Array) -> tuple[State, dict[str, jax.Array]]:
        """One generation: breed, inject, rollout, explore, train the learner, evaluate it.

        Args:
          state: the current :class:`State`.
          key: PRNG key of this generation.

        Returns:
          ``(state, metrics)``: the population statistics of
          :meth:`~evorl_pop.rl.hybrid.Hybrid.advance` with ``env_steps`` and
          ``episodes`` counting the learner's too, ``eval_return`` of the
          learner's actor, ``explore_return``, ``rl_actors_injected`` (1 when
          the learner's actor entered the population this generation) and
          ``injected_return`` (its return as a member, NaN otherwise), and
          the TD3 losses.
        """
        cfg = self.config
        breed_key, rollout_key, explore_key, train_key, eval_key = jax.random.split(key, 5)

        # 1. Next population from the last evaluated one (generation 0 keeps its own).
        flat = jax.vmap(lambda p: ravel_pytree(p)[0])(state.population)
        first = state.generation == 0
        flat = jnp.where(first, flat, self.breed(flat, state.fitness, breed_key))
        inject = ~first & (state.generation % cfg.sync_period == 0)
        actor = ravel_pytree(state.learner.actor.params)[0]
        flat, slot = self.inject(flat, state.fitness, actor, inject)

        # 2. Evaluate the population; its steps feed the shared buffer.
        population, rollout, buffer = self.rollout(flat, state.buffer, rollout_key)

        # 3. The learner explores, then trains on the shared buffer.
        episodes = jax.vmap(
            lambda k: collect_episode(
                self.env,
                self.policy,
                state.learner.actor.params,
                k,
                cfg.exploration_noise,
                cfg.episode_steps,
            )
        )(jax.random.split(explore_key, cfg.rl_episodes))
        buffer = buffer.add(episodes.transitions, episodes.valid)
        learner, losses = self.train_if(
            self.learning(buffer), lambda s: self.train(s, buffer, train_key), state.learner
        )

        # 4. The learner's actor without noise.
        metrics = {
            **losses,
            "env_steps": rollout.metrics["env_steps"] + jnp.sum(episodes.steps),
            "episodes": rollout.metrics["episodes"] + cfg.rl_episodes,
            "eval_return": self.evaluate(learner.actor.params, eval_key),
            "explore_return": jnp.mean(episodes.episode_return),
            "rl_actors_injected": inject.astype(jnp.int32),
            "injected_return": jnp.where(inject, rollout.returns[slot], jnp.nan),
        }
        return self.advance(state, population, rollout, buffer, metrics, learner=learner)


def _ranks(fitness: jax.Array) -> jax.Array:
    """Rank of each member, 0 the best; ties keep slot order."""
    return jnp.argsort(jnp.argsort(-fitness))


def _neuron_ids(params: Any) -> np.ndarray:
    """For each flat weight, the id of the unit it feeds (one id per output unit).

    A Dense kernel ``(in, out)`` and its bias ``(out,)`` share the ids of their
    ``out`` units, so crossover can swap whole neurons.
    """
    ids, offset = {}, 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        layer = tuple(str(p) for p in path[:-1])
        width = leaf.shape[-1]
        if layer not in ids:
            ids[layer] = offset
            offset += width
        ids[path] = np.broadcast_to(ids[layer] + np.arange(width), leaf.shape)
    tree = jax.tree_util.tree_map_with_path(lambda path, _: ids[path], params)
    return np.asarray(ravel_pytree(tree)[0]).astype(np.int32)
