"""CEM-RL: the cross-entropy method over actor weights, half the population
improved by TD3 (or SAC).

Pourchot & Sigaud (2019), "CEM-RL: Combining evolutionary and gradient-based
methods for policy search". One generation of the engine:

1. ask: :class:`CEM` samples ``population_size`` actors from a separable
   Gaussian ``N(mean, diag(std²))`` over the flat actor weights;
2. learner step: the first ``num_rl_actors`` of them each get TD3 updates
   against one shared critic (trained alongside, with that actor's target),
   once the shared replay buffer holds ``learning_starts`` steps; with
   ``learner='sac'`` the actors are SAC's tanh-Gaussian ones, each getting SAC
   updates against shared twin critics and a shared learned temperature;
3. evaluate: one episode per actor, sharded over the ``POP`` axis; every
   step goes into the replay buffer;
4. tell: the mean moves to the weighted mean of the elites *as evaluated*
   (so gradient-improved actors pull it), and the variance is the weighted
   spread of the elites around the old mean plus a decaying additive noise
   (Eq. 2 of the paper, with log-rank weights).

Scores are returns (a SAC actor's episodes act with its squashed mean); the
strategy ranks evosax fitness (minimised), the one sign boundary being the engine's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from evosax.algorithms.distribution_based.base import DistributionBasedAlgorithm
from evosax.algorithms.distribution_based.base import Params as BaseParams
from evosax.algorithms.distribution_based.base import State as BaseState
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
    """CEM-RL settings: those of :class:`~evorl_pop.rl.hybrid.EvoRLConfig` (the task,
    the replay buffer, the ``learner`` that trains the RL actors) and these.

    Attributes:
      td3: with ``learner='td3'``, the RL actors' TD3 updates and the critic they share.
      sac: with ``learner='sac'``, their SAC updates, critics and temperature.
      num_elites: the best actors the distribution is fitted to.
      num_rl_actors: actors that get TD3 (or SAC) updates before evaluation (the
        paper uses half the population).
      sigma_init: initial variance of every weight.
      noise_init: initial additive variance (keeps the search from collapsing).
      noise_end: the value the additive variance decays towards.
      noise_decay: its decay rate per generation.
      updates_per_actor: TD3 iterations (critic steps; SAC: updates) per RL actor per generation;
        the default gives one critic step per two environment steps on
        Pendulum-v1 (10 x 200 steps per generation); the paper uses one per
        step, which learned no better here at twice the cost.
    """

    td3: TD3Config = HYBRID_SETTINGS
    sac: SACConfig = SACConfig()
    num_elites: int = 5
    num_rl_actors: int = 5
    sigma_init: float = 1e-3
    noise_init: float = 1e-3
    noise_end: float = 1e-5
    noise_decay: float = 0.95
    updates_per_actor: int = 200

    HOST_LEARNERS = ("td3", "sac")

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        super().validate()
        pop = self.population_size
        for name, low in (("num_elites", 1), ("num_rl_actors", 0)):
            if not low <= getattr(self, name) <= pop:
                raise ConfigError(
                    f"{name}={getattr(self, name)} must be between {low} and population_size="
                    f"{pop}; raise population_size or lower {name}."
                )
        check_config(self, least={"updates_per_actor": 1})


@flax.struct.dataclass
class CEMState(BaseState):
    """evosax's distribution state (mean, best so far, generation) and CEM's own."""

    std: jax.Array  # shape=(num_dims,): per-weight standard deviation
    noise: jax.Array  # shape=(): additive variance of the next update


@flax.struct.dataclass
class CEMParams(BaseParams):
    sigma_init: float  # initial variance of every weight
    noise_init: float
    noise_end: float
    noise_decay: float


class CEM(DistributionBasedAlgorithm):
    """The cross-entropy method with a decaying additive noise, in evosax's interface.

    Candidate ``i`` is ``mean + std * z_i`` with ``z_i`` drawn from
    ``fold_in(key, i)``; ``tell`` fits the mean and the variance to the
    ``num_elites`` best candidates with log-rank weights.
    """

    def __init__(self, population_size: int, solution, num_elites: int, config: Config):
        super().__init__(population_size, solution)
        self.elites = num_elites
        weights = np.log((num_elites + 1) / np.arange(1, num_elites + 1))  # best first
        self.weights = jnp.asarray(weights / weights.sum(), jnp.float32)
        c = config
        self._default_params = CEMParams(c.sigma_init, c.noise_init, c.noise_end, c.noise_decay)

    def _init(self, key, params: CEMParams) -> CEMState:
        return CEMState(
            mean=jnp.zeros(self.num_dims),
            std=jnp.full(self.num_dims, jnp.sqrt(params.sigma_init)),
            noise=jnp.float32(params.noise_init),
            best_solution=jnp.full(self.num_dims, jnp.nan),
            best_fitness=jnp.inf,
            generation_counter=0,
        )

    def _ask(self, key, state: CEMState, params: CEMParams):
        eps = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), state.mean.shape))(
            jnp.arange(self.population_size)
        )
        return state.mean + state.std * eps, state

    def _tell(self, key, population, fitness, state: CEMState, params: CEMParams) -> CEMState:
        elites = population[jnp.argsort(fitness)[: self.elites]]  # fitness is minimised
        noise = params.noise_decay * state.noise + (1.0 - params.noise_decay) * params.noise_end
        var = self.weights @ (elites - state.mean) ** 2 + noise
        return state.replace(mean=self.weights @ elites, std=jnp.sqrt(var), noise=noise)


@flax.struct.dataclass
class LearnerState:
    """The shared critic and the replay buffer every actor's steps go into."""

    critic: Any  # what the actors share: TD3's twin critics; SAC's and its temperature
    buffer: ReplayBuffer


class CEMRLLearner:
    """TD3 (or SAC) on the first ``num_rl_actors`` sampled actors, one shared critic."""

    collect = True  # the engine's evaluations return transitions

    def __init__(self, task: ControlTask, config: Config, mesh: Mesh):
        name = f"CEM-RL (its actors are trained with {config.learner.upper()})"
        self.rl = config.rl_learner(task, mesh, config.updates_per_actor, name)
        self.num_rl = config.num_rl_actors
        #: ``train_actors(critic, flat, buffer, key) -> (critic, flat, losses)``: the
        #: learner's updates of each actor in turn against the shared critic.
        self.train_actors = self.rl.train_actors

    def init(self, key: jax.Array) -> LearnerState:
        return LearnerState(self.rl.init_shared(key), self.rl.empty_buffer())

    def step(self, key, state: LearnerState, population, strategy_state):
        n = self.num_rl
        ready = self.rl.ready(state.buffer)
        critic, trained, losses = self.rl.learn_if(
            ready & (n > 0),
            functools.partial(self.train_actors, buffer=state.buffer, key=key),
            state.critic,
            population[:n],
        )
        metrics = {**losses, "rl_actors_injected": jnp.where(ready, n, 0).astype(jnp.int32)}
        return population.at[:n].set(trained), state.replace(critic=critic), metrics

    def observe(self, state: LearnerState, summary, episodes):
        return state.replace(buffer=state.buffer.add(episodes.transitions, episodes.valid)), {}


class CEMRL(Engine):
    """CEM-RL: the engine with :class:`CEM` as its strategy and :class:`CEMRLLearner`
    between ask and evaluate, its population sharded over the devices of ``mesh``
    (``None``: every device), the learner's minibatches over the same devices along ``'DP'``.
    ``Config.validate`` says what to change in a config that cannot run.
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        config.validate()
        self.config = config
        mesh = make_mesh() if mesh is None else mesh
        task = config.actor_task()
        strategy = CEM(config.population_size, jnp.zeros(task.num_dims), config.num_elites, config)
        learner = CEMRLLearner(task, config, mesh)
        super().__init__(strategy, task, mesh, eval_episodes=config.eval_episodes, learner=learner)


registry.register_algorithm("cemrl", Config, CEMRL, "CEM-RL: CEM + TD3 or SAC")
