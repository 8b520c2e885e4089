"""SAC: soft actor-critic with twin critics and a learned temperature.

Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel &
Levine (2018), "Soft Actor-Critic Algorithms and Applications"
(arXiv:1812.05905). A tanh-squashed Gaussian actor
(:class:`~evorl_pop.rl.distributions.TanhNormal`), two critics trained
towards the smaller of their Polyak-averaged targets, and a temperature
``alpha`` tuned so that the policy's entropy stays near ``H_target = -scale *
action_dim``. With ``a' ~ pi(.|s')`` and ``a~ ~ pi(.|s)`` reparameterised::

    y      = r + gamma (1 - term) (min_j Q'_j(s', a') - alpha log pi(a'|s'))   # Eq. (3), (5)
    L_Q    = E[1/2 sum_j (Q_j(s, a) - y)^2]                                     # Eq. (5)
    L_pi   = E[alpha log pi(a~|s) - min_j Q_j(s, a~)]                           # Eq. (7)
    L_alpha = E[alpha (-log pi(a~|s) - H_target)],  alpha = exp(log_alpha)      # Eq. (18)

One update takes the three gradient steps from the same state (the critic
with the current actor and temperature, the actor with the critics before
their step, as brax's SAC does), then moves the targets.

Every gradient step goes through :func:`evorl_pop.distributed.agent_gradient_update`
on the learner's :class:`SACState`, its ``detach_fn`` / ``attach_fn`` taking the
temperature, the critics' or the actor's parameters out of the state and back:
with ``dp_axis_name`` set, each device holds a contiguous slice of the global
minibatch and the gradients are averaged with ``pmean``. The actions sampled
for sample ``i`` use ``fold_in(key, i)`` with ``i`` its position in the
*global* minibatch, so the update does not depend on the device count.
The searchable settings (:class:`Hyperparameters`) are traced arguments.

:class:`SACHybridLearner` is SAC beside a population (CEM-RL's and ERL's
``learner='sac'``, with the settings :class:`SACConfig`): its actors are the
population's members.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from evorl_pop import distributed as dist
from evorl_pop.base import ConfigError, EnvSpec, did_you_mean
from evorl_pop.rl import data_parallel, replay
from evorl_pop.rl.distributions import TanhNormal
from evorl_pop.rl.hybrid import HybridConfig, ReplayLearner, check_continuous
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.td3 import (
    ActorCriticConfig,
    ActorState,
    CriticState,
    actor_part,
    critic_part,
    polyak,
    with_actor_part,
    with_critic_part,
)
from evorl_pop.rl.vec_env import make_envs
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.envs import env_family, make_env
from evorl_pop.tasks.policies import ACTIVATIONS, MLP, Critic, gaussian_policy
from evorl_pop.tasks.rollout import Episode, Transition, rollout


@flax.struct.dataclass
class Hyperparameters:
    """SAC's searchable settings, float32 scalars: changing them does not recompile."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    alpha_lr: jax.Array
    target_entropy_scale: jax.Array  # H_target = -target_entropy_scale * action_dim
    discount: jax.Array

    @classmethod
    def create(cls, **values: float) -> Hyperparameters:
        """Hyperparameters from Python numbers, e.g. ``create(actor_lr=3e-4, ...)``."""
        return cls(**{k: jnp.float32(v) for k, v in values.items()})


@flax.struct.dataclass
class SACState:
    actor: ActorState  # without a target copy (target_params None)
    critic: CriticState  # the twin critics, stacked: every leaf has a leading axis of 2
    log_alpha: jax.Array  # float32 scalar
    alpha_opt_state: Any


# The parts of a SACState that a gradient step trains: agent_gradient_update's
# detach_fn and attach_fn.


def _log_alpha(state: SACState) -> jax.Array:
    return state.log_alpha


def _with_log_alpha(state: SACState, log_alpha: jax.Array) -> SACState:
    return state.replace(log_alpha=log_alpha)


def _agent_loss(
    loss: Callable[..., jax.Array], detach_fn: Callable[[SACState], Any]
) -> Callable[..., jax.Array]:
    """A loss ``loss(part, state, *args)`` as ``agent_gradient_update``'s
    ``loss_fn(state, *args)``, ``part`` taken out of ``state`` by ``detach_fn``."""

    def loss_fn(state, *args):
        return loss(detach_fn(state), state, *args)

    return loss_fn


def alpha_loss(
    log_alpha: jax.Array, log_prob: jax.Array, target_entropy: jax.Array | float
) -> jax.Array:
    """``E[alpha (-log pi - H_target)]`` (Eq. 18), its gradient only through ``alpha``."""
    return jnp.mean(jnp.exp(log_alpha) * jax.lax.stop_gradient(-log_prob - target_entropy))


def soft_target(
    reward: jax.Array,
    terminal: jax.Array,
    next_q: jax.Array,
    next_log_prob: jax.Array,
    alpha: jax.Array | float,
    discount: jax.Array | float,
) -> jax.Array:
    """The critics' target ``r + gamma (1 - term) (min_j Q'_j - alpha log pi)`` (Eq. 3, 5).

    Args:
      reward: shape ``(batch,)``.
      terminal: 1.0 where the episode ended before its time limit.
      next_q: the target critics' values of the next state, shape ``(2, batch)``.
      next_log_prob: ``log pi(a'|s')`` of the sampled next actions.
      alpha: the temperature.
      discount: gamma.

    Returns:
      The target, shape ``(batch,)``.
    """
    soft_value = jnp.min(next_q, axis=0) - alpha * next_log_prob
    return reward + discount * (1.0 - terminal) * soft_value


@dataclasses.dataclass(frozen=True)
class SACSettings(ActorCriticConfig):
    """SAC's learning settings, wherever a config holds them: those of
    :class:`~evorl_pop.rl.td3.ActorCriticConfig` and these.

    Attributes:
      activation: the actor's ``'relu'``, ``'tanh'`` or ``'elu'`` (the critics use relu).
      alpha_lr: Adam's step size for the log-temperature.
      target_entropy_scale: the target entropy is ``-scale * action_dim``.
      init_alpha: the initial temperature.
      reward_scaling: rewards are multiplied by it for learning (not in the metrics).
    """

    actor_hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    alpha_lr: float = 1e-3
    target_entropy_scale: float = 1.0
    init_alpha: float = 1.0
    reward_scaling: float = 1.0

    def validate(self) -> None:
        """Raises a ConfigError naming the first setting that cannot run."""
        super().validate()
        prefix = self.PREFIX
        for name in ("actor_lr", "critic_lr", "alpha_lr", "reward_scaling"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{prefix}{name} must be >= 0, got {getattr(self, name)}.")
        if not 0.0 <= self.discount <= 1.0:
            raise ConfigError(f"{prefix}discount must be in [0, 1], got {self.discount}.")
        if self.init_alpha <= 0:
            raise ConfigError(f"{prefix}init_alpha must be > 0, got {self.init_alpha}.")
        if self.activation not in ACTIVATIONS:
            hint = did_you_mean(self.activation, ACTIVATIONS)
            valid = ", ".join(sorted(ACTIVATIONS))
            raise ConfigError(
                f"{prefix}activation: unknown value {self.activation!r}.{hint} Valid: {valid}."
            )

    def hyperparameters(self) -> Hyperparameters:
        """The searchable settings as traced scalars."""
        return data_parallel.traced_settings(Hyperparameters, self)

    def make_learner(self, spec: EnvSpec) -> SACLearner:
        """SAC's networks, losses and updates on ``spec`` with these settings."""
        return SACLearner(
            spec,
            self.actor_hidden_sizes,
            self.critic_hidden_sizes,
            self.activation,
            self.tau,
            self.reward_scaling,
            self.init_alpha,
        )


class SACLearner:
    """SAC's networks, losses and updates for a continuous-action environment.

    Args:
      spec: the environment's spec.
      actor_hidden_sizes: hidden widths of the actor.
      critic_hidden_sizes: hidden widths of each critic.
      activation: the actor's activation (the critics use relu).
      tau: Polyak averaging rate of the target critics.
      reward_scaling: rewards are multiplied by it in the critics' target.
      init_alpha: the initial temperature.

    Raises:
      ConfigError: for a discrete-action environment.
    """

    def __init__(
        self,
        spec: EnvSpec,
        actor_hidden_sizes: Sequence[int] = (256, 256),
        critic_hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
        tau: float = 0.005,
        reward_scaling: float = 1.0,
        init_alpha: float = 1.0,
    ):
        check_continuous(spec, "SAC")
        self.spec = spec
        self.distribution = TanhNormal(tuple(spec.action_low), tuple(spec.action_high))
        size = self.distribution.param_size
        self.actor = MLP(tuple(actor_hidden_sizes), size, activation, len(spec.obs_shape))
        self.critic = Critic(tuple(critic_hidden_sizes))
        self.tau = tau
        self.reward_scaling = reward_scaling
        self.init_alpha = init_alpha

    def init(self, key: jax.Array, hp: Hyperparameters) -> SACState:
        """A fresh actor, twin critics with their targets, and Adam states.

        Args:
          key: PRNG key of the networks.
          hp: the hyperparameters (the optimizers' states do not depend on them).

        Returns:
          A :class:`SACState`.
        """
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros(self.spec.obs_shape)
        action = jnp.zeros((self.spec.action_dim,))
        actor = self.actor.init(actor_key, obs)
        critic = jax.vmap(lambda k: self.critic.init(k, obs, action))(jax.random.split(critic_key))
        log_alpha = jnp.log(jnp.float32(self.init_alpha))
        actor_opt, critic_opt, alpha_opt = self.optimizers(hp)
        return SACState(
            actor=ActorState(actor, None, actor_opt.init(actor)),
            critic=CriticState(critic, critic, critic_opt.init(critic)),
            log_alpha=log_alpha,
            alpha_opt_state=alpha_opt.init(log_alpha),
        )

    @staticmethod
    def optimizers(hp: Hyperparameters) -> tuple[optax.GradientTransformation, ...]:
        """Adam for the actor, the critics and the temperature, at the (traced) rates of ``hp``."""
        return optax.adam(hp.actor_lr), optax.adam(hp.critic_lr), optax.adam(hp.alpha_lr)

    # --- acting ----------------------------------------------------------------------

    def sample(self, actor_params: Any, obs: jax.Array, key: jax.Array):
        """One observation's reparameterised sample: ``(action, log_prob)``."""
        out = self.actor.apply(actor_params, obs)
        raw, log_prob = self.distribution.sample_and_log_prob(out, key)
        return self.distribution.to_action(raw), log_prob

    def sample_batch(self, actor_params: Any, obs: jax.Array, key: jax.Array, index: jax.Array):
        """Samples for a batch, sample ``i`` from ``fold_in(key, index[i])``."""
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
        return jax.vmap(self.sample, in_axes=(None, 0, 0))(actor_params, obs, keys)

    def deterministic_policy(self, actor_params: Any, obs: jax.Array) -> jax.Array:
        """The action of the Gaussian's mean, squashed (for evaluation)."""
        out = self.actor.apply(actor_params, obs)
        return self.distribution.to_action(self.distribution.mode(out))

    def q_values(self, critic_params: Any, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Both critics' values, shape ``(2, batch)``."""
        return jax.vmap(self.critic.apply, in_axes=(0, None, None))(critic_params, obs, action)

    # --- losses ------------------------------------------------------------------------

    def critic_loss(
        self,
        critic_params: Any,
        state: SACState,
        batch: Transition,
        hp: Hyperparameters,
        key: jax.Array,
        index: jax.Array,
    ) -> jax.Array:
        """``L_Q`` (Eq. 5) on a (slice of a) minibatch."""
        next_action, next_log_prob = self.sample_batch(
            state.actor.params, batch.next_obs, key, index
        )
        next_q = self.q_values(state.critic.target_params, batch.next_obs, next_action)
        alpha = jnp.exp(state.log_alpha)
        reward = batch.reward * self.reward_scaling
        target = soft_target(reward, batch.terminal, next_q, next_log_prob, alpha, hp.discount)
        q = self.q_values(critic_params, batch.obs, batch.action)
        return 0.5 * jnp.mean(jnp.sum((q - jax.lax.stop_gradient(target)) ** 2, axis=0))

    def actor_loss(
        self, actor_params: Any, state: SACState, batch: Transition, key: jax.Array, index
    ) -> jax.Array:
        """``L_pi`` (Eq. 7) on a (slice of a) minibatch."""
        action, log_prob = self.sample_batch(actor_params, batch.obs, key, index)
        q = jnp.min(self.q_values(state.critic.params, batch.obs, action), axis=0)
        return jnp.mean(jnp.exp(state.log_alpha) * log_prob - q)

    def temperature_loss(
        self,
        log_alpha: jax.Array,
        state: SACState,
        batch: Transition,
        hp: Hyperparameters,
        key: jax.Array,
        index: jax.Array,
    ) -> jax.Array:
        """``L_alpha`` (Eq. 18) with the actor's samples on a (slice of a) minibatch."""
        _, log_prob = self.sample_batch(state.actor.params, batch.obs, key, index)
        target_entropy = -hp.target_entropy_scale * self.spec.action_dim
        return alpha_loss(log_alpha, log_prob, target_entropy)

    # --- updates -----------------------------------------------------------------------

    def update(
        self,
        state: SACState,
        batch: Transition,
        hp: Hyperparameters,
        key: jax.Array,
        dp_axis_name: str | None = None,
    ) -> tuple[SACState, dict[str, jax.Array]]:
        """One SAC update: temperature, critics and actor steps, then the targets.

        Args:
          state: the learner (replicated over ``dp_axis_name``).
          batch: this device's contiguous slice of the global minibatch.
          hp: the hyperparameters.
          key: the update's key, the same on every device.
          dp_axis_name: the data-parallel axis the batch is split over, or ``None``.

        Returns:
          ``(state, metrics)``: ``critic_loss``, ``actor_loss``, ``alpha_loss``
            (global minibatch means) and the temperature ``alpha`` used.
        """
        index = replay.global_batch_index(batch.reward.shape[0], dp_axis_name)
        alpha_key, critic_key, actor_key = jax.random.split(key, 3)
        actor_opt, critic_opt, alpha_opt = self.optimizers(hp)
        # Each step starts from ``state``: the critics' target takes the temperature
        # before its step, the actor the critics before theirs.
        step = dist.agent_gradient_update(
            _agent_loss(self.temperature_loss, _log_alpha),
            alpha_opt,
            dp_axis_name,
            attach_fn=_with_log_alpha,
            detach_fn=_log_alpha,
        )
        a_loss, stepped, alpha_opt_state = step(
            state.alpha_opt_state, state, batch, hp, alpha_key, index
        )
        log_alpha = _log_alpha(stepped)
        step = dist.agent_gradient_update(
            _agent_loss(self.critic_loss, critic_part),
            critic_opt,
            dp_axis_name,
            attach_fn=with_critic_part,
            detach_fn=critic_part,
        )
        c_loss, stepped, critic_opt_state = step(
            state.critic.opt_state, state, batch, hp, critic_key, index
        )
        critic_params = critic_part(stepped)
        step = dist.agent_gradient_update(
            _agent_loss(self.actor_loss, actor_part),
            actor_opt,
            dp_axis_name,
            attach_fn=with_actor_part,
            detach_fn=actor_part,
        )
        p_loss, stepped, actor_opt_state = step(
            state.actor.opt_state, state, batch, actor_key, index
        )
        actor_params = actor_part(stepped)
        target = polyak(state.critic.target_params, critic_params, self.tau)
        new = SACState(
            actor=ActorState(actor_params, None, actor_opt_state),
            critic=CriticState(critic_params, target, critic_opt_state),
            log_alpha=log_alpha,
            alpha_opt_state=alpha_opt_state,
        )
        losses = {"critic_loss": c_loss, "actor_loss": p_loss, "alpha_loss": a_loss}
        return new, {**dist.pmean(losses, dp_axis_name), "alpha": jnp.exp(state.log_alpha)}

    def train(
        self,
        state: SACState,
        buffer: ReplayBuffer,
        hp: Hyperparameters,
        key: jax.Array,
        num_updates: int,
        batch_size: int,
        dp_axis_name: str | None = None,
    ) -> tuple[SACState, dict[str, jax.Array]]:
        """``num_updates`` updates (:meth:`update`, with the hyperparameters ``hp``) on
        minibatches of ``batch_size`` from ``buffer``, as
        :func:`~evorl_pop.rl.replay.updates` runs them; ``(state, metrics)``, the
        metrics averaged."""

        def update(state, batch, index, key):
            return self.update(state, batch, hp, key, dp_axis_name)

        state, metrics = replay.updates(
            update, state, buffer, key, num_updates, batch_size, dp_axis_name
        )
        return state, jax.tree.map(jnp.mean, metrics)


# --- SAC beside a population: CEM-RL's and ERL's RL part ------------------------------


@dataclasses.dataclass(frozen=True)
class SACConfig(SACSettings):
    """SAC's settings as CEM-RL's and ERL's learner (:class:`SACSettings`, smaller nets)."""

    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    critic_hidden_sizes: tuple[int, ...] = (128, 128)
    batch_size: int = 128

    PREFIX = "sac."


def actor_task(config: HybridConfig, settings: SACConfig) -> ControlTask:
    """The control task of a population of SAC actors on ``config.task``: SAC's
    tanh-Gaussian actor, acting with its squashed mean
    (:class:`~evorl_pop.tasks.policies.GaussianPolicy`); its episodes keep their
    transitions for the learner (a Gymnasium task's stepped on the host)."""
    family = env_family(config.task)
    if family is not None and not family.steps_in_jax:
        spec = make_envs(config.task, config.episode_length).spec
        policy = gaussian_policy(spec, settings.actor_hidden_sizes, settings.activation)
        length = config.episode_length
        return family.make_task(config.task, policy=policy, episode_length=length, transitions=True)
    env = make_env(config.task, episode_length=config.episode_length)
    policy = gaussian_policy(env.spec, settings.actor_hidden_sizes, settings.activation)
    return ControlTask(env, policy=policy, episode_length=config.episode_length, transitions=True)


@flax.struct.dataclass
class SoftCritic:
    """What CEM-RL's SAC actors share: the twin critics and the temperature."""

    critic: CriticState
    log_alpha: jax.Array  # float32 scalar
    alpha_opt_state: Any


class SACHybridLearner(ReplayLearner):
    """SAC fed by a population's evaluations: CEM-RL's and ERL's RL part with
    ``learner='sac'`` (:class:`~evorl_pop.rl.hybrid.ReplayLearner`).

    Its actor is the population's network (the task's
    :class:`~evorl_pop.tasks.policies.GaussianPolicy` module), so a member's flat
    weights are an actor; :attr:`learn` takes :meth:`SACLearner.train`'s
    updates with minibatches split over the ``'DP'`` mesh.

    Args:
      task: the control task the population is evaluated on.
      config: the algorithm's :class:`~evorl_pop.rl.hybrid.HybridConfig`.
      settings: SAC's settings.
      mesh: the population's ``'POP'`` mesh.
      num_updates: SAC updates per call of :attr:`learn`.
      algorithm: the algorithm's name, for errors.

    Raises:
      ConfigError: a discrete-action task, or a batch the devices do not split.
    """

    LOSSES = ("critic_loss", "actor_loss", "alpha_loss", "alpha")

    def __init__(
        self,
        task: ControlTask,
        config: HybridConfig,
        settings: SACConfig,
        mesh: Any,
        num_updates: int,
        algorithm: str,
    ):
        check_continuous(task.spec, algorithm)
        c = settings
        super().__init__(task, config, mesh, c.batch_size, "SAC")
        self.sac = c.make_learner(task.spec)
        self.hyperparameters = c.hyperparameters()

        def local(state, buffer, key):
            hp = self.hyperparameters
            return self.sac.train(state, buffer, hp, key, num_updates, c.batch_size, self.axis)

        #: ``learn(sac_state, buffer, key) -> (sac_state, losses)``, replicated in and out.
        self.learn = self.data_parallel(local)

        def sample(params, obs, key):
            return self.sac.sample(params, obs, key)[0]

        #: ``(params, obs, key) -> action``: the stochastic policy that explores.
        self.sampling_policy: Callable = sample

    def init(self, key: jax.Array) -> SACState:
        """A fresh SAC learner (ERL's)."""
        return self.sac.init(key, self.hyperparameters)

    def actor(self, state: SACState) -> Any:
        return state.actor.params

    def with_actor(self, shared: SoftCritic, params: Any) -> SACState:
        """SAC on ``params`` (a fresh Adam) beside the critics and temperature ``shared``."""
        actor_optimizer = self.sac.optimizers(self.hyperparameters)[0]
        actor = ActorState(params, None, actor_optimizer.init(params))
        return SACState(actor, shared.critic, shared.log_alpha, shared.alpha_opt_state)

    def shared(self, state: SACState) -> SoftCritic:
        return SoftCritic(state.critic, state.log_alpha, state.alpha_opt_state)

    def explore(self, params: Any, key: jax.Array, noise_std: float | None = None) -> Episode:
        """An episode of actions drawn from the actor's tanh-Gaussian policy, its
        transitions collected (``noise_std``, TD3's action noise, is not used)."""
        del noise_std
        if self.host:  # a Gymnasium task's episode, stepped on the host
            return self._explore_on_host(params, key)
        length = self.config.episode_length
        return rollout(
            self.task.env,
            self.sampling_policy,
            params,
            key,
            None,
            length,
            collect=True,
            sample=True,
        )

    def _explore_on_host(self, params: Any, key: jax.Array) -> Episode:
        """:meth:`explore` on a Gymnasium task: one episode on the task's host lanes, step
        ``t``'s action drawn from ``fold_in(act_key, t)``."""
        from evorl_pop.tasks.host_lanes import collect_episodes

        def act(obs, key):
            keys = jax.random.split(key, obs.shape[0])
            return jax.vmap(self.sampling_policy, (None, 0, 0))(params, obs, keys)

        reset_key, act_key = jax.random.split(key)
        envs = self.task.host_envs()
        episodes = collect_episodes(envs, act, reset_key, 1, act_key=act_key)
        return jax.tree.map(lambda x: x[0], episodes)
