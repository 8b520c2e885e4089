"""A learner plug-in: REINFORCE, a policy gradient on whole episodes (discrete actions).

Importing this module registers

* the learner ``reinforce``, as PBT's members: ``-a pbt --set learner=reinforce``,
  its settings under ``learner_settings`` (``--set learner_settings.episodes=4``),
  searching ``learning_rate`` and ``discount``;
* the algorithm ``reinforce``: one such learner on its own, ``-a reinforce``::

    PYTHONPATH=examples/plugins evorl-pop train --plugin reinforce -a reinforce \\
        --task CartPole-v1
    PYTHONPATH=examples/plugins evorl-pop train --plugin reinforce -a pbt \\
        --task CartPole-v1 --set learner=reinforce

Each iteration runs ``episodes`` episodes of the stochastic (softmax) policy and takes
one gradient step of ``-log pi(a|s)`` weighted by the normalised discounted return that
follows, through :func:`evorl_pop.distributed.agent_gradient_update`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from evorl_pop import distributed, registry
from evorl_pop.base import ConfigError
from evorl_pop.core.interfaces import Acting
from evorl_pop.tasks.envs import make_env
from evorl_pop.tasks.policies import MLP
from evorl_pop.tasks.rollout import rollout

#: The metric each iteration reports (PBT reports its mean over an interval).
LOSSES = ("reinforce_loss",)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The learner's settings.

    Attributes:
      hidden_sizes: the policy's hidden widths.
      learning_rate: Adam's step size.
      discount: gamma of the returns that weight each step.
      episodes: episodes per iteration (one gradient step).
    """

    hidden_sizes: tuple[int, ...] = (32,)
    learning_rate: float = 0.01
    discount: float = 0.99
    episodes: int = 8

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        if self.episodes < 1 or any(width < 1 for width in self.hidden_sizes):
            raise ConfigError("reinforce: episodes and hidden_sizes must be at least 1.")
        if not self.learning_rate > 0 or not 0 <= self.discount <= 1:
            raise ConfigError("reinforce: learning_rate must be > 0 and discount in [0, 1].")


@flax.struct.dataclass
class Learner:
    params: Any  # the policy network's
    opt_state: Any


class Reinforce:
    """The learner on ``config.task`` (PBT's member: ``init``, ``train``, ``evaluate``,
    ``acting``), each iteration's episodes as long as ``config.episode_length``."""

    def __init__(self, settings: Settings, config: Any):
        settings.validate()
        self.settings = settings
        self.env = make_env(config.task, episode_length=config.episode_length)
        spec = self.env.spec
        if not spec.discrete:
            raise ConfigError(f"task: reinforce takes discrete actions; {config.task} has none.")
        self.net = MLP(tuple(settings.hidden_sizes), spec.action_dim)
        per_iteration = settings.episodes * spec.max_steps
        #: Iterations per interval: PBT's ``interval`` steps (at most) of episodes.
        self.iterations = max(1, getattr(config, "interval", per_iteration) // per_iteration)

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        return jnp.argmax(self.net.apply(params, obs))

    def sample(self, params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.net.apply(params, obs))

    def optimizer(self, learning_rate) -> optax.GradientTransformation:
        return optax.adam(learning_rate)

    def init(self, key: jax.Array) -> tuple[Learner, jax.Array]:
        """``(learner part, own part)``: the policy and Adam's state; the iterations so far."""
        params = self.net.init(key, jnp.zeros(self.env.spec.obs_shape))
        opt_state = self.optimizer(self.settings.learning_rate).init(params)
        return Learner(params, opt_state), jnp.int32(0)

    def episode(self, params: Any, key: jax.Array):
        """One episode of the softmax policy, ``max_steps`` long (steps after its end
        masked out): ``(obs, actions, rewards, valid)``, leading axis the steps."""
        reset_key, key = jax.random.split(key)
        obs, env_state = self.env.reset(reset_key)

        def body(carry, key):
            obs, env_state, alive = carry
            action_key, env_key = jax.random.split(key)
            action = self.sample(params, obs, action_key)
            next_obs, env_state, reward, done = self.env.step(env_key, env_state, action)
            out = (obs, action, jnp.where(alive, reward, 0.0), alive)
            return (next_obs, env_state, alive & ~done), out

        keys = jax.random.split(key, self.env.spec.max_steps)
        _, out = jax.lax.scan(body, (obs, env_state, jnp.bool_(True)), keys)
        return out

    def loss(self, learner: Learner, obs: jax.Array, actions: jax.Array, weights: jax.Array):
        """``-log pi(a|s)`` weighted by ``weights``, averaged over the steps."""
        log_pi = jax.nn.log_softmax(self.net.apply(learner.params, obs))
        log_pi = jnp.take_along_axis(log_pi, actions[..., None], -1)[..., 0]
        return -jnp.mean(weights * log_pi)

    def iteration(self, learner: Learner, key: jax.Array, values: dict):
        """One gradient step on ``episodes`` fresh episodes: ``(learner, steps, loss)``."""
        discount = values.get("discount", self.settings.discount)
        keys = jax.random.split(key, self.settings.episodes)
        obs, actions, rewards, valid = jax.vmap(self.episode, (None, 0))(learner.params, keys)
        valid = valid.astype(jnp.float32)  # (episodes, steps)

        def back(following, step):
            reward, alive = step
            value = alive * (reward + discount * following)
            return value, value

        _, returns = jax.lax.scan(back, jnp.zeros(len(keys)), (rewards.T, valid.T), reverse=True)
        returns = returns.T  # the discounted return from each step on
        mean = jnp.sum(returns * valid) / jnp.sum(valid)
        std = jnp.sqrt(jnp.sum(valid * (returns - mean) ** 2) / jnp.sum(valid)) + 1e-6
        weights = valid * (returns - mean) / std
        update = distributed.agent_gradient_update(
            self.loss, self.optimizer(values.get("learning_rate", self.settings.learning_rate))
        )
        flat = (obs.reshape(-1, *obs.shape[2:]), actions.reshape(-1), weights.reshape(-1))
        loss, learner, opt_state = update(learner.opt_state, learner, *flat)
        return learner.replace(opt_state=opt_state), jnp.sum(valid).astype(jnp.int32), loss

    def train(self, learner: Learner, own: jax.Array, values: dict, key: jax.Array):
        """``(learner, own, steps, episodes, metrics)`` after :attr:`iterations` iterations."""

        def body(learner, key):
            learner, steps, loss = self.iteration(learner, key, values)
            return learner, (steps, loss)

        keys = jax.random.split(key, self.iterations)
        learner, (steps, losses) = jax.lax.scan(body, learner, keys)
        episodes = jnp.int32(self.iterations * self.settings.episodes)
        return learner, own + self.iterations, jnp.sum(steps), episodes, {LOSSES[0]: losses}

    def evaluate(self, learner: Learner, own: jax.Array, key: jax.Array, episodes: int):
        """The greedy policy's mean return over ``episodes`` episodes."""
        keys = jax.random.split(key, episodes)
        run = jax.vmap(lambda k: rollout(self.env, self.greedy, learner.params, k))
        return jnp.mean(run(keys).episode_return)

    def acting(self, learner: Learner, own: jax.Array) -> Acting:
        return Acting(self.env, self.greedy, learner.params)


registry.register_learner(
    "reinforce",
    registry.LearnerSpec(
        member=registry.MemberPart(
            defaults=Settings(),
            member=Reinforce,
            searchable=("learning_rate", "discount"),
            default_search=(("learning_rate", 1e-3, 3e-2, True), ("discount", 0.9, 0.999, False)),
            losses=LOSSES,
        ),
        description="REINFORCE: a policy gradient on whole episodes (a PBT member)",
    ),
)


# --- the learner as an algorithm of its own ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """The algorithm ``reinforce``: one learner, evaluated greedily every generation.

    Attributes:
      task: a discrete-action environment.
      episode_length: steps per episode (``null``: the environment's limit).
      interval: environment steps per generation, at most (whole iterations).
      eval_episodes: greedy episodes per evaluation.
      reinforce: the learner's settings.
    """

    task: str = "CartPole-v1"
    episode_length: int | None = 200
    interval: int = 3200
    eval_episodes: int = 4
    reinforce: Settings = Settings()

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        self.reinforce.validate()
        if self.eval_episodes < 1 or self.interval < 1:
            raise ConfigError("reinforce: eval_episodes and interval must be at least 1.")


@flax.struct.dataclass
class State:
    learner: Learner
    iterations: jax.Array  # int32
    generation: jax.Array  # int32


class Algorithm:
    """The learner on its own, on one device (``mesh`` is not used)."""

    def __init__(self, config: Config, mesh=None):
        config.validate()
        self.config = config
        self.member = Reinforce(config.reinforce, config)

    def init(self, key: jax.Array) -> State:
        learner, iterations = self.member.init(key)
        return State(learner, iterations, jnp.int32(0))

    def step(self, state: State, key: jax.Array) -> tuple[State, dict]:
        train_key, eval_key = jax.random.split(key)
        learner, iterations, steps, episodes, losses = self.member.train(
            state.learner, state.iterations, {}, train_key
        )
        score = self.member.evaluate(learner, iterations, eval_key, self.config.eval_episodes)
        metrics = {"fitness_best": score, "fitness_mean": score, "eval_return": score}
        metrics.update(env_steps=steps, episodes=episodes, **jax.tree.map(jnp.mean, losses))
        return State(learner, iterations, state.generation + 1), metrics

    def acting(self, state: State) -> Acting:
        """The greedy policy, for ``evorl-pop render``."""
        return self.member.acting(state.learner, state.iterations)


registry.register_algorithm("reinforce", Config, Algorithm, "REINFORCE on its own")
