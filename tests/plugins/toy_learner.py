"""A toy learner as a plug-in: one file that registers a learner and an algorithm.

Importing it (``evorl-pop --plugin toy_learner``, or an ``evorl_pop.plugins``
entry point naming it) makes ``toy``:

* the RL part of CEM-RL and ERL: ``-a cemrl --set learner=toy``, its settings
  under ``learner_settings`` (``--set learner_settings.batch_size=16``);
* a PBT member: ``-a pbt --set learner=toy``, searching ``learning_rate``,
  ``discount`` and ``exploration_noise``;
* an algorithm of its own: ``-a toy``, one learner with a replay buffer.

The learner is DDPG without target networks: a deterministic actor (the
population's policy network) and one critic ``Q(s, a)`` regressed on
``r + gamma Q(s', pi(s'))``, the actor following the critic's gradient. Both
gradient steps go through :func:`evorl_pop.distributed.agent_gradient_update`,
which averages the gradients of a minibatch split over the ``'DP'`` axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from evorl_pop import distributed, registry
from evorl_pop.base import ConfigError, EnvSpec
from evorl_pop.rl import replay
from evorl_pop.rl.hybrid import ReplayLearner, ReplayMember, check_continuous
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.policies import Critic

#: The losses every learning generation reports.
LOSSES = ("toy_critic_loss", "toy_actor_loss")


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """The toy learner's settings.

    Attributes:
      hidden_sizes: hidden widths of the actor and of the critic.
      learning_rate: Adam's step size for both.
      discount: gamma of the critic's target.
      batch_size: global minibatch size, split over the devices.
    """

    hidden_sizes: tuple[int, ...] = (16,)
    learning_rate: float = 1e-3
    discount: float = 0.9
    batch_size: int = 32

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        if self.batch_size < 1 or any(width < 1 for width in self.hidden_sizes):
            raise ConfigError("toy: batch_size and hidden_sizes must be at least 1.")
        if not self.learning_rate > 0 or not 0 <= self.discount <= 1:
            raise ConfigError("toy: learning_rate must be > 0 and discount in [0, 1].")


@flax.struct.dataclass
class ToyState:
    actor: Any
    critic: Any
    actor_opt: Any
    critic_opt: Any


class Toy:
    """The actor, the critic and their updates on one environment spec."""

    def __init__(self, spec: EnvSpec, settings: ToyConfig, policy: Any):
        self.policy = policy
        self.spec = spec
        self.settings = settings
        self.critic = Critic(tuple(settings.hidden_sizes))
        self.optimizer = optax.adam(settings.learning_rate)

    def init(self, key: jax.Array) -> ToyState:
        actor_key, critic_key = jax.random.split(key)
        actor = self.policy.init(actor_key)
        obs = jnp.zeros(self.spec.obs_shape)
        critic = self.critic.init(critic_key, obs, jnp.zeros((self.spec.action_dim,)))
        return ToyState(actor, critic, self.optimizer.init(actor), self.optimizer.init(critic))

    def critic_loss(self, state: ToyState, batch: Any) -> jax.Array:
        next_action = jax.vmap(self.policy, (None, 0))(state.actor, batch.next_obs)
        next_q = self.critic.apply(state.critic, batch.next_obs, next_action)
        target = batch.reward + self.settings.discount * (1.0 - batch.terminal) * next_q
        q = self.critic.apply(state.critic, batch.obs, batch.action)
        return jnp.mean((q - jax.lax.stop_gradient(target)) ** 2)

    def actor_loss(self, state: ToyState, batch: Any) -> jax.Array:
        action = jax.vmap(self.policy, (None, 0))(state.actor, batch.obs)
        return -jnp.mean(self.critic.apply(state.critic, batch.obs, action))

    def step(self, loss, part: str, state: ToyState, opt_state, batch, axis):
        """One gradient step of ``loss`` on the ``part`` (``'actor'``, ``'critic'``) of
        ``state``: ``(loss, state, opt_state)``."""
        update = distributed.agent_gradient_update(
            loss,
            self.optimizer,
            axis,
            attach_fn=lambda s, params: s.replace(**{part: params}),
            detach_fn=lambda s: getattr(s, part),
        )
        return update(opt_state, state, batch)

    def update(self, state: ToyState, batch: Any, axis: str | None) -> tuple[ToyState, dict]:
        """The critic's step, then the actor's against the stepped critic."""
        critic_loss, state, opt = self.step(
            self.critic_loss, "critic", state, state.critic_opt, batch, axis
        )
        state = state.replace(critic_opt=opt)
        actor_loss, state, opt = self.step(
            self.actor_loss, "actor", state, state.actor_opt, batch, axis
        )
        losses = dict(zip(LOSSES, (critic_loss, actor_loss), strict=True))
        return state.replace(actor_opt=opt), distributed.pmean(losses, axis)

    def learn(self, state: ToyState, buffer: Any, key: jax.Array, num_updates: int, axis=None):
        """``num_updates`` updates on minibatches of ``buffer``: ``(state, mean losses)``."""

        def body(state, key):
            batch, _ = replay.sample(buffer, key, self.settings.batch_size, axis)
            return self.update(state, batch, axis)

        state, losses = jax.lax.scan(body, state, jax.random.split(key, num_updates))
        return state, jax.tree.map(jnp.mean, losses)


def actor_task(config: Any, settings: ToyConfig) -> ControlTask:
    """The population's task: the toy actor (a tanh MLP) on ``config.task``."""
    return ControlTask(
        config.task,
        settings.hidden_sizes,
        "tanh",
        episode_length=config.episode_length,
        transitions=True,
    )


class ToyHybrid(ReplayLearner):
    """The toy learner beside CEM-RL's or ERL's population."""

    LOSSES = LOSSES

    def __init__(self, task, config, settings: ToyConfig, mesh, num_updates: int, algorithm: str):
        check_continuous(task.spec, algorithm)
        super().__init__(task, config, mesh, settings.batch_size, "toy")
        self.toy = Toy(task.spec, settings, task.policy)

        def local(state, buffer, key):
            return self.toy.learn(state, buffer, key, num_updates, distributed.DP_AXIS_NAME)

        self.learn = self.data_parallel(local)

    def init(self, key: jax.Array) -> ToyState:
        return self.toy.init(key)

    def actor(self, state: ToyState) -> Any:
        return state.actor

    def shared(self, state: ToyState) -> tuple[Any, Any]:
        return state.critic, state.critic_opt

    def with_actor(self, shared: tuple[Any, Any], params: Any) -> ToyState:
        critic, critic_opt = shared
        return ToyState(params, critic, self.toy.optimizer.init(params), critic_opt)


def member(settings: ToyConfig, config: Any) -> ReplayMember:
    """The toy learner as a PBT member, or as the algorithm ``toy`` (one member)."""
    task = actor_task(config, settings)

    def learner(values: dict) -> Toy:
        searched = {k: values[k] for k in ("learning_rate", "discount") if k in values}
        return Toy(task.spec, dataclasses.replace(settings, **searched), task.policy)

    def actor(state: ToyState) -> Any:
        return state.actor

    return ReplayMember(task, config, settings.batch_size, learner, actor, LOSSES, "toy")


registry.register_learner(
    "toy",
    registry.LearnerSpec(
        hybrid=registry.HybridPart(ToyConfig(), actor_task, ToyHybrid),
        member=registry.MemberPart(
            defaults=ToyConfig(),
            member=member,
            searchable=("learning_rate", "discount", "exploration_noise"),
            default_search=(("learning_rate", 1e-4, 1e-2, True), ("discount", 0.8, 0.99, False)),
            losses=LOSSES,
            replay=True,
        ),
        description="toy: DDPG without target networks (a test plug-in)",
    ),
)


# --- the toy learner as an algorithm of its own ------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The algorithm ``toy``: one toy learner, its replay buffer filled by its own
    noisy episodes, evaluated without noise every generation.

    Attributes:
      task: a continuous-action environment.
      episode_length: steps per episode (``null``: the environment's limit).
      interval: environment steps per generation, a whole number of episodes.
      exploration_noise: Gaussian action noise, in half action ranges.
      updates_per_step: gradient updates per environment step, after each episode.
      learning_starts: buffer size before the updates begin.
      buffer_capacity: replay buffer size.
      eval_episodes: noise-free episodes per evaluation.
      toy: the learner's settings.
    """

    task: str = "Pendulum-v1"
    episode_length: int | None = 50
    interval: int = 100
    exploration_noise: float = 0.2
    updates_per_step: float = 0.5
    learning_starts: int = 64
    buffer_capacity: int = 10_000
    eval_episodes: int = 1
    toy: ToyConfig = ToyConfig()

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        self.toy.validate()
        if self.buffer_capacity < self.toy.batch_size or self.learning_starts < 0:
            raise ConfigError("toy: buffer_capacity must hold a batch; learning_starts >= 0.")


@flax.struct.dataclass
class RunState:
    learner: ToyState
    buffer: Any
    generation: jax.Array  # int32


class ToyAlgorithm:
    """The toy learner on its own, on one device (``mesh`` is not used)."""

    def __init__(self, config: RunConfig = RunConfig(), mesh=None):
        config.validate()
        self.config = config
        self.member = member(config.toy, config)

    def init(self, key: jax.Array) -> RunState:
        learner, buffer = self.member.init(key)
        return RunState(learner, buffer, jnp.int32(0))

    def step(self, state: RunState, key: jax.Array) -> tuple[RunState, dict]:
        train_key, eval_key = jax.random.split(key)
        trained = self.member.train(state.learner, state.buffer, {}, train_key)
        learner, buffer, steps, episodes, metrics = trained
        score = self.member.evaluate(learner, buffer, eval_key, self.config.eval_episodes)
        out = {"fitness_best": score, "fitness_mean": score, "env_steps": steps}
        out["episodes"] = episodes
        out.update({k: jnp.nanmean(metrics[k]) for k in LOSSES})
        return RunState(learner, buffer, state.generation + 1), out


registry.register_algorithm("toy", RunConfig, ToyAlgorithm, "the toy learner on its own")
