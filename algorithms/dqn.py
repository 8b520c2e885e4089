"""DQN: deep Q-learning from replay, on a batch of environments split over devices.

Mnih et al. (2015), "Human-level control through deep reinforcement learning",
with van Hasselt, Guez & Silver (2016)'s Double DQN as a switch and n-step
returns. For discrete actions only. One ``step``::

    state (Q-network, its target, Adam state, replay buffer, hyperparameters:
           replicated; num_envs running episodes: split P('DP'))
      | shard_map over DP: each device its slice of the environments
      |   unroll_length epsilon-greedy steps, epsilon linear in the env steps before them
      |   n-step transitions of the unroll (n_step_transitions)
      |   all_gather -> the same transitions, in global order, into every
      |     device's copy of the buffer
      |   once the buffer holds learning_starts transitions: num_updates
      |     updates, each minibatch drawn from one key and split over DP, pmean
      v
    state, metrics (training returns, loss, epsilon: global)

The TD error of a stored transition ``(s, a, R, s', d)``, ``R`` the discounted sum of
up to ``n`` rewards and ``d`` the discount of the bootstrap (``gamma^k``, zero after a
termination), is rlax's ``q_learning`` (``R + d max_a' Q'(s', a') - Q(s, a)``) or
``double_q_learning`` (``R + d Q'(s', argmax_a' Q(s', a')) - Q(s, a)``), under a Huber
loss. An episode's termination cuts the sum and the bootstrap; its truncation at the
time limit cuts the sum and bootstraps from the last observation. The sum is also cut at
the end of an unroll (its last ``n - 1`` steps store shorter returns), so a transition
never waits for the next step. The sums are written here, not taken from rlax: rlax's
n-step returns need the bootstrap values when the returns are computed, and a replayed
transition is valued by the target network when it is drawn.

Lane ``i`` draws its actions, steps and resets from ``fold_in(key, i)`` with ``i``
its global index, and each minibatch's indices from one key: 1, 2 and 4 devices
give the same step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
import rlax
from jax.sharding import Mesh

from evorl_pop import distributed as dist
from evorl_pop import registry
from evorl_pop.algorithms.pbt_members import algorithm_member
from evorl_pop.base import ConfigError, EnvSpec, check_config
from evorl_pop.core.interfaces import Acting
from evorl_pop.rl import data_parallel, replay, vec_env
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.td3 import polyak
from evorl_pop.tasks.policies import ACTIVATIONS, Policy, make_policy

DP = dist.DP_AXIS_NAME


@flax.struct.dataclass
class Hyperparameters:
    """DQN's searchable settings, float32 scalars: changing them does not recompile."""

    learning_rate: jax.Array
    discount: jax.Array

    @classmethod
    def create(cls, **values: float) -> Hyperparameters:
        """Hyperparameters from Python numbers."""
        return cls(**{k: jnp.float32(v) for k, v in values.items()})


@flax.struct.dataclass
class NStepTransition:
    """A stored n-step transition: ``obs``, ``action``, the discounted reward sum
    ``reward``, the observation ``next_obs`` it bootstraps from and that bootstrap's
    discount ``discount`` (``gamma^k``; 0 after a termination)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    discount: jax.Array


@flax.struct.dataclass
class QState:
    """The Q-network, its target copy, Adam's state and the updates so far."""

    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # int32


def n_step_transitions(
    obs: jax.Array,
    action: jax.Array,
    reward: jax.Array,
    next_obs: jax.Array,
    terminal: jax.Array,
    truncated: jax.Array,
    discount: jax.Array | float,
    n: int,
) -> NStepTransition:
    """The n-step transitions of an unroll, one per step.

    Step ``t``'s sums the rewards of steps ``t .. t+k-1``, ``k <= n`` the steps until its
    episode ends (that step included) or the unroll does; it bootstraps from the
    ``next_obs`` of step ``t+k-1`` with discount ``gamma^k``, or not at all (0) where
    that step terminated the episode. A truncation (the time limit) ends the sum but
    keeps the bootstrap.

    Args:
      obs, action, reward, next_obs: the unroll's steps, leaves ``(T, lanes, ...)``
        (``next_obs`` before any reset).
      terminal, truncated: 1.0 where the step ended the episode, shape ``(T, lanes)``.
      discount: gamma.
      n: the most rewards summed (static).

    Returns:
      A :class:`NStepTransition` with leaves ``(T, lanes, ...)``.
    """
    length = reward.shape[0]
    time = jnp.arange(length).reshape((length,) + (1,) * (reward.ndim - 1))

    def ahead(x, i):  # step t + i's value at t (the last step's past the end)
        return jnp.concatenate([x[i:], jnp.repeat(x[-1:], i, axis=0)]) if i else x

    total = jnp.zeros_like(reward)
    scale = jnp.ones_like(reward)  # gamma^k: the discount of the next reward, or bootstrap
    cont = jnp.ones_like(reward)  # 0 once the last summed step terminated
    alive = jnp.ones(reward.shape, bool)
    boot = next_obs
    for i in range(n):
        valid = alive & (time + i < length)
        total = total + jnp.where(valid, scale * ahead(reward, i), 0.0)
        wide = valid.reshape(valid.shape + (1,) * (next_obs.ndim - valid.ndim))
        boot = jnp.where(wide, ahead(next_obs, i), boot)
        cont = jnp.where(valid, 1.0 - ahead(terminal, i), cont)
        scale = jnp.where(valid, scale * discount, scale)
        alive = valid & (ahead(terminal, i) + ahead(truncated, i) == 0)
    return NStepTransition(obs, action, total, boot, scale * cont)


def epsilon(settings: Any, env_steps: jax.Array) -> jax.Array:
    """The exploration rate after ``env_steps`` steps: linear from ``epsilon_start`` to
    ``epsilon_end`` over ``epsilon_decay_steps``, then constant."""
    schedule = optax.linear_schedule(
        settings.epsilon_start, settings.epsilon_end, max(settings.epsilon_decay_steps, 1)
    )
    return schedule(env_steps)


@dataclasses.dataclass(frozen=True)
class DQNSettings:
    """DQN's learning settings.

    Attributes:
      hidden_sizes: hidden widths of the Q-network.
      activation: ``'relu'``, ``'tanh'`` or ``'elu'``.
      learning_rate: Adam's step size.
      discount: gamma.
      batch_size: global minibatch size, split over the devices.
      double_q: Double DQN's target (the online network picks the next action).
      n_step: rewards summed per transition (1: one-step Q-learning).
      target_update_period: updates between hard copies into the target network;
        0: a Polyak update with ``tau`` after every update instead.
      tau: the Polyak rate where ``target_update_period`` is 0.
      huber_delta: the Huber loss's quadratic range (the paper's error clipping).
      epsilon_start: the exploration rate at the start.
      epsilon_end: the rate it decays to, linearly.
      epsilon_decay_steps: environment steps the decay takes.
    """

    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    learning_rate: float = 1e-3
    discount: float = 0.99
    batch_size: int = 64
    double_q: bool = True
    n_step: int = 1
    target_update_period: int = 500
    tau: float = 0.005
    huber_delta: float = 1.0
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 10_000

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        check_config(
            self,
            choices={"activation": tuple(ACTIVATIONS)},
            least={"batch_size": 1, "n_step": 1, "target_update_period": 0},
            positive=("huber_delta",),
            nonnegative=("learning_rate", "epsilon_decay_steps"),
            widths=("hidden_sizes",),
        )
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"tau must be in (0, 1], got {self.tau}.")
        for name in ("discount", "epsilon_start", "epsilon_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}.")


class DQNLearner:
    """DQN's Q-network, loss and updates for a discrete-action environment.

    Args:
      spec: the environment's spec.
      settings: the learning settings.

    Raises:
      ConfigError: a continuous-action environment, in one line.
    """

    def __init__(self, spec: EnvSpec, settings: DQNSettings):
        check_discrete(spec)
        self.spec = spec
        self.settings = settings
        #: The greedy policy: argmax of the Q-network's values (one output per action).
        self.policy: Policy = make_policy(
            spec, settings.hidden_sizes, settings.activation, kind="mlp"
        )

    def q_values(self, params: Any, obs: jax.Array) -> jax.Array:
        """The Q-values of a batch of observations, shape ``(batch, actions)``."""
        return self.policy.module.apply(params, obs)

    def init(self, key: jax.Array, hp: Hyperparameters) -> QState:
        """A fresh Q-network, its target copy and Adam's state."""
        params = self.policy.init(key)
        return QState(params, params, optax.adam(hp.learning_rate).init(params), jnp.int32(0))

    def loss(
        self, params: Any, target_params: Any, batch: NStepTransition
    ) -> tuple[jax.Array, jax.Array]:
        """``(loss, td_error)``: the batch mean of the Huber loss of the TD errors."""
        q = self.q_values(params, batch.obs)
        next_target = self.q_values(target_params, batch.next_obs)
        action = batch.action.astype(jnp.int32)
        if self.settings.double_q:
            selector = self.q_values(params, batch.next_obs)
            td = jax.vmap(rlax.double_q_learning)(
                q, action, batch.reward, batch.discount, next_target, selector
            )
        else:
            td = jax.vmap(rlax.q_learning)(q, action, batch.reward, batch.discount, next_target)
        return jnp.mean(rlax.huber_loss(td, self.settings.huber_delta)), td

    def update(
        self,
        state: QState,
        batch: NStepTransition,
        hp: Hyperparameters,
        dp_axis_name: str | None = None,
    ) -> tuple[QState, dict[str, jax.Array]]:
        """One gradient step on this device's slice of a minibatch (gradients averaged
        over ``dp_axis_name``), then the target network's update.

        Returns:
          ``(state, metrics)``: ``loss`` and ``q`` (the mean ``Q(s, a)``), global means.
        """

        def loss_fn(state, batch):
            loss, _ = self.loss(state.params, state.target_params, batch)
            return loss

        step = dist.agent_gradient_update(loss_fn, optax.adam(hp.learning_rate), dp_axis_name)
        loss, new, opt_state = step(state.opt_state, state, batch)
        updates = state.updates + 1
        period = self.settings.target_update_period
        if period:
            copy = updates % period == 0
            target = jax.tree.map(
                lambda t, p: jnp.where(copy, p, t), state.target_params, new.params
            )
        else:
            target = polyak(state.target_params, new.params, self.settings.tau)
        q = jnp.take_along_axis(
            self.q_values(state.params, batch.obs), batch.action[:, None].astype(jnp.int32), 1
        )
        new = QState(new.params, target, opt_state, updates)
        return new, dist.pmean({"loss": loss, "q": jnp.mean(q)}, dp_axis_name)

    def train(
        self,
        state: QState,
        buffer: ReplayBuffer,
        hp: Hyperparameters,
        key: jax.Array,
        num_updates: int,
        dp_axis_name: str | None = None,
    ) -> tuple[QState, dict[str, jax.Array]]:
        """``num_updates`` updates on minibatches from ``buffer``, as
        :func:`~evorl_pop.rl.replay.updates` draws them; the metrics averaged."""

        def update(state, batch, index, key):
            return self.update(state, batch, hp, dp_axis_name)

        state, metrics = replay.updates(
            update, state, buffer, key, num_updates, self.settings.batch_size, dp_axis_name
        )
        return state, jax.tree.map(jnp.mean, metrics)


def check_discrete(spec: EnvSpec) -> None:
    """Raises a ConfigError, in one line, when ``spec`` has continuous actions, or
    discrete ones that one Q-value per action cannot cover: several action dimensions
    (``action_heads``) or a mask of the valid actions in the observation."""
    if not spec.discrete:
        raise ConfigError(
            f"task: DQN needs discrete actions (one Q-value per action), but {spec.name!r} has "
            f"{spec.action_dim} continuous action dimension(s): use a discrete task, e.g. "
            "'CartPole-v1', or DDPG or SAC (-a ddpg, -a sac)."
        )
    if spec.action_heads or spec.action_mask is not None:
        what = "several action dimensions" if spec.action_heads else "a mask of valid actions"
        raise ConfigError(
            f"task: DQN takes one discrete action without a mask, and {spec.name!r} has {what}: "
            "use PPO (-a ppo), which masks and splits actions, or ES (-a es)."
        )


@dataclasses.dataclass(frozen=True)
class Config(DQNSettings, data_parallel.LearnerConfig):
    """DQN settings (the defaults solve CartPole-v1, see the learners guide): the task and
    environments of :class:`~evorl_pop.rl.data_parallel.LearnerConfig`, DQN's learning
    settings (:class:`DQNSettings`), and these.

    Attributes:
      task: a discrete-action environment (``'CartPole-v1'``, ``'Acrobot-v1'``, ...).
      updates_per_step: gradient updates per environment step (a step runs
        ``round(updates_per_step * num_envs * unroll_length)`` of them).
      buffer_capacity: replay buffer size.
      learning_starts: transitions in the buffer before the updates begin.
    """

    task: str = "CartPole-v1"
    num_envs: int = 8
    unroll_length: int = 16
    updates_per_step: float = 0.25
    buffer_capacity: int = 50_000
    learning_starts: int = 1000

    HYPERPARAMETERS = Hyperparameters

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        vec_env.check_task(self.task, "dqn")
        check_config(self, least=vec_env.LEAST)
        DQNSettings.validate(self)
        check_config(self, least={"buffer_capacity": 1}, nonnegative=("updates_per_step",))
        if self.buffer_capacity < self.batch_size:
            raise ConfigError(
                f"buffer_capacity={self.buffer_capacity} is smaller than one minibatch "
                f"(batch_size={self.batch_size}); make it at least {self.batch_size}."
            )
        if not 0 <= self.learning_starts <= self.buffer_capacity:
            raise ConfigError(
                f"learning_starts={self.learning_starts} must be in [0, buffer_capacity="
                f"{self.buffer_capacity}], or the updates never begin."
            )


@flax.struct.dataclass
class State:
    """Everything that changes between steps."""

    learner: QState
    buffer: ReplayBuffer  # n-step transitions, the same on every device
    hyperparameters: Hyperparameters
    envs: Any  # the running episodes, split over DP
    env_steps: jax.Array  # int32: environment steps so far (the exploration rate's clock)
    generation: jax.Array  # int32: steps so far


class DQN(data_parallel.DataParallel):
    """DQN with its environments and minibatches split over the devices of ``mesh``
    (:class:`~evorl_pop.rl.data_parallel.DataParallel`); a continuous-action task is a
    ``ConfigError``. A :meth:`step`'s metrics add ``loss`` and ``q`` (NaN before learning
    starts) and ``epsilon``."""

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        super().__init__(config, mesh)
        self.learner = DQNLearner(self.env.spec, config)
        data_parallel.check_split(
            "batch_size", config.batch_size, self.mesh.size, "A minibatch's samples"
        )
        self.steps_per_step = config.num_envs * config.unroll_length
        self.num_updates = round(config.updates_per_step * self.steps_per_step)
        self.shard_steps(State)

    def example(self) -> NStepTransition:
        """A zero transition of the task's shapes."""
        obs = jnp.zeros(self.env.spec.obs_shape, jnp.float32)
        zero = jnp.float32(0.0)
        return NStepTransition(obs, jnp.int32(0), zero, obs, zero)

    def fresh(self, key: jax.Array) -> State:
        """A fresh Q-network, an empty buffer and ``num_envs`` fresh episodes."""
        learner_key, env_key = jax.random.split(key)
        cfg = self.config
        hp = cfg.hyperparameters()
        return State(
            learner=self.learner.init(learner_key, hp),
            buffer=ReplayBuffer.create(self.example(), cfg.buffer_capacity),
            hyperparameters=hp,
            envs=self.envs.reset_batch(vec_env.lane_keys(env_key, jnp.arange(cfg.num_envs))),
            env_steps=jnp.int32(0),
            generation=jnp.int32(0),
        )

    def collect(self, state: State, key: jax.Array, rate: jax.Array, axis: str | None):
        """An epsilon-greedy unroll of this device's lanes: ``(envs, transitions)``."""
        params = state.learner.params
        num_actions = self.env.spec.action_dim

        def act(obs, keys):
            greedy = jnp.argmax(self.learner.q_values(params, obs), axis=-1)

            def explore(key, greedy):
                coin, pick = jax.random.split(key)
                random = jax.random.randint(pick, (), 0, num_actions)
                return jnp.where(jax.random.uniform(coin) < rate, random, greedy)

            action = jax.vmap(explore)(keys, greedy).astype(jnp.int32)
            return action, action

        envs, (obs, action, out) = self.unroll(state.envs, act, key, axis)
        transitions = n_step_transitions(
            obs, action, out.reward, out.next_obs, out.terminal, out.truncated,
            state.hyperparameters.discount, self.config.n_step,
        )  # fmt: skip
        return envs, transitions

    def local_step(self, state: State, key: jax.Array, axis: str | None = DP):
        """One step on this device's lanes (``axis=None``: every lane, on one device)."""
        cfg = self.config
        collect_key, train_key = jax.random.split(key)
        rate = epsilon(cfg, state.env_steps)
        envs, transitions = self.collect(state, collect_key, rate, axis)
        buffer = state.buffer.add(dist.all_gather(transitions, axis, axis=1, tiled=True))
        hp = state.hyperparameters

        def train(learner):
            return self.learner.train(learner, buffer, hp, train_key, self.num_updates, axis)

        def skip(learner):
            return learner, {"loss": jnp.float32(jnp.nan), "q": jnp.float32(jnp.nan)}

        learn = buffer.size >= max(cfg.learning_starts, cfg.batch_size)
        learner, losses = jax.lax.cond(learn & (self.num_updates > 0), train, skip, state.learner)
        metrics = {**vec_env.metrics(state.envs, envs, axis), **losses, "epsilon": rate}
        env_steps = state.env_steps + self.steps_per_step
        state = state.replace(learner=learner, buffer=buffer, envs=envs, env_steps=env_steps)
        return state, metrics

    def acting(self, state: State) -> Acting:
        """The greedy policy (``evorl-pop render``, the evaluations)."""
        return Acting(
            self.env, self.learner.policy, state.learner.params,
            episode_length=self.config.episode_length,
        )  # fmt: skip


registry.register_algorithm("dqn", Config, DQN, "DQN: Q-learning from replay, discrete actions")

# --- DQN as a PBT member -----------------------------------------------------------------


def split_member(state: State) -> tuple[QState, tuple[ReplayBuffer, Any, jax.Array]]:
    """A PBT member's parts: its Q-networks, which a replaced member copies, and its
    buffer, running episodes and steps so far (its exploration rate), which it keeps."""
    return state.learner, (state.buffer, state.envs, state.env_steps)


def join_member(learner: QState, own: tuple, hyperparameters: Hyperparameters) -> State:
    """The state of a PBT member's parts (:func:`split_member`)."""
    buffer, envs, env_steps = own
    return State(learner, buffer, hyperparameters, envs, env_steps, jnp.int32(0))


registry.register_learner(
    "dqn",
    registry.LearnerSpec(
        member=registry.MemberPart(
            defaults=Config(num_envs=8, unroll_length=25),
            member=algorithm_member(DQN, split_member, join_member),
            searchable=("learning_rate", "discount"),
            default_search=(("learning_rate", 1e-4, 1e-2, True), ("discount", 0.9, 0.995, False)),
            losses=("loss", "q"),
        ),
        description="DQN: Q-learning from replay (double Q, n-step), discrete actions",
    ),
)
