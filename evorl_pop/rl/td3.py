"""TD3: twin delayed deep deterministic policy gradient.

Fujimoto, van Hoof & Meger (2018), "Addressing Function Approximation Error
in Actor-Critic Methods". A deterministic actor (the same
:func:`~evorl_pop.tasks.policies.make_policy` MLP a population evolves, squashed by
tanh into ``[low, high]``), twin critics trained towards the smaller of two
target values, clipped noise on the target action, and actor / target
updates every ``policy_delay`` critic updates.

Every gradient step goes through :func:`evorl_pop.distributed.agent_gradient_update`
on the learner's :class:`TD3State`, its ``detach_fn`` / ``attach_fn`` taking the
critics' or the actor's parameters out of the state and back: with ``dp_axis_name``
set, each device of the data-parallel axis holds a contiguous slice of the global
minibatch and the gradients are averaged with ``pmean``, which gives the
full-batch step. Target-policy noise is drawn from
each sample's position in the *global* minibatch, so the update does not
depend on the device count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.serialization
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from evorl_pop import distributed as dist
from evorl_pop import registry
from evorl_pop.base import ConfigError, EnvSpec
from evorl_pop.rl import replay
from evorl_pop.rl.hybrid import HybridConfig, ReplayLearner, ReplayMember, check_continuous
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.envs import env_family
from evorl_pop.tasks.policies import Critic, Policy, make_policy
from evorl_pop.tasks.rollout import Transition


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig:
    """The settings every actor-critic learner here has (TD3's; SAC's, whose twin
    critics and their Polyak update are TD3's).

    Attributes:
      actor_hidden_sizes: hidden widths of the actor MLP.
      critic_hidden_sizes: hidden widths of each critic.
      actor_lr: Adam's step size for the actor.
      critic_lr: Adam's step size for the critics.
      discount: the discount factor gamma.
      tau: Polyak averaging rate of the target networks.
      batch_size: global minibatch size, split over the devices.
    """

    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    discount: float = 0.99
    tau: float = 0.005
    batch_size: int = 256

    #: Where a config holds these settings (``'td3.'``), for messages.
    PREFIX = ""

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run (the ones that stay Python
        values: a population's search may trace the learning rates and the discount)."""
        if self.batch_size < 1:
            raise ConfigError(f"{self.PREFIX}batch_size must be at least 1, got {self.batch_size}.")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"{self.PREFIX}tau must be in (0, 1], got {self.tau}.")
        for name in ("actor_hidden_sizes", "critic_hidden_sizes"):
            widths = getattr(self, name)
            if any(width < 1 for width in widths):
                raise ConfigError(f"{self.PREFIX}{name} must be positive widths, got {widths}.")


@dataclasses.dataclass(frozen=True)
class TD3Config(ActorCriticConfig):
    """TD3 hyper-parameters (defaults as in Fujimoto et al. 2018, smaller nets): those of
    :class:`ActorCriticConfig` and these.

    Attributes:
      actor_activation: ``'relu'``, ``'tanh'`` or ``'elu'``.
      policy_noise: std of the target-policy smoothing noise, in units of half
        the action range.
      noise_clip: clip of that noise, in the same units.
      policy_delay: critic updates per actor (and target) update.
    """

    actor_activation: str = "relu"
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2

    PREFIX = "td3."

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        super().validate()
        if self.policy_delay < 1:
            raise ConfigError(f"td3.policy_delay must be at least 1, got {self.policy_delay}.")


@flax.struct.dataclass
class ActorState:
    """An actor-critic learner's actor: its parameters, their target copy (``None``: an
    actor without one, SAC's) and its optimizer state."""

    params: Any
    target_params: Any
    opt_state: Any


def _actor_to_state_dict(actor: ActorState) -> dict:
    """An actor's checkpoint entries; without ``target_params`` where it has no target (so
    a SAC checkpoint holds what it held before the actor states were one class)."""
    out = {"params": actor.params, "opt_state": actor.opt_state}
    if actor.target_params is not None:
        out["target_params"] = actor.target_params
    return {k: flax.serialization.to_state_dict(v) for k, v in out.items()}


def _actor_from_state_dict(actor: ActorState, state: dict) -> ActorState:
    def field(name):
        template = getattr(actor, name)
        if name == "target_params" and template is None:
            return None
        if name not in state:
            raise ValueError(f"Missing field {name} in an actor's state dict.")
        return flax.serialization.from_state_dict(template, state[name])

    return ActorState(field("params"), field("target_params"), field("opt_state"))


flax.serialization.register_serialization_state(
    ActorState, _actor_to_state_dict, _actor_from_state_dict, override=True
)


@flax.struct.dataclass
class CriticState:
    params: Any  # the twin critics, stacked: every leaf has a leading axis of 2
    target_params: Any
    opt_state: Any


@flax.struct.dataclass
class TD3State:
    actor: ActorState
    critic: CriticState
    updates: jax.Array  # int32: critic updates so far, drives the policy delay


def polyak(target: Any, online: Any, tau: float) -> Any:
    """``(1 - tau) * target + tau * online``, leaf by leaf."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


# The parts of an actor-critic agent state (TD3's, SAC's: fields ``actor`` and ``critic``,
# each with ``params``) that agent_gradient_update takes out and puts back.


def critic_part(state: Any) -> Any:
    """The critics' parameters of an actor-critic state (a ``detach_fn``)."""
    return state.critic.params


def with_critic_part(state: Any, params: Any) -> Any:
    """``state`` with the critics' parameters ``params`` (an ``attach_fn``)."""
    return state.replace(critic=state.critic.replace(params=params))


def actor_part(state: Any) -> Any:
    """The actor's parameters of an actor-critic state (a ``detach_fn``)."""
    return state.actor.params


def with_actor_part(state: Any, params: Any) -> Any:
    """``state`` with the actor's parameters ``params`` (an ``attach_fn``)."""
    return state.replace(actor=state.actor.replace(params=params))


class TD3:
    """TD3 for an environment spec: networks, optimizers and the update.

    Args:
      spec: the environment's spec (continuous actions).
      config: the hyper-parameters.
      policy: the actor (default: an MLP of ``config``'s actor sizes).

    Raises:
      ValueError: for a discrete-action environment.
    """

    def __init__(
        self, spec: EnvSpec, config: TD3Config = TD3Config(), policy: Policy | None = None
    ):
        config.validate()
        check_continuous(spec, "TD3")
        self.spec = spec
        self.config = config
        if policy is None:
            policy = make_policy(spec, config.actor_hidden_sizes, config.actor_activation)
        self.policy = policy
        self.critic = Critic(tuple(config.critic_hidden_sizes))
        self.actor_optimizer = optax.adam(config.actor_lr)
        self.critic_optimizer = optax.adam(config.critic_lr)
        self._low = jnp.asarray(spec.action_low, jnp.float32)
        self._high = jnp.asarray(spec.action_high, jnp.float32)

    # --- state -------------------------------------------------------------------

    def init_actor(self, params: Any) -> ActorState:
        """An actor state starting from ``params``: target copy, fresh Adam."""
        return ActorState(params, params, self.actor_optimizer.init(params))

    def init_critic(self, key: jax.Array) -> CriticState:
        """Fresh twin critics and their targets."""
        obs = jnp.zeros(self.spec.obs_shape)
        action = jnp.zeros((self.spec.action_dim,))
        params = jax.vmap(lambda k: self.critic.init(k, obs, action))(jax.random.split(key))
        return CriticState(params, params, self.critic_optimizer.init(params))

    def init(self, key: jax.Array) -> TD3State:
        """A fresh TD3 learner.

        Args:
          key: PRNG key for the network initialisations.

        Returns:
          A :class:`TD3State`.
        """
        actor_key, critic_key = jax.random.split(key)
        return TD3State(
            actor=self.init_actor(self.policy.init(actor_key)),
            critic=self.init_critic(critic_key),
            updates=jnp.int32(0),
        )

    # --- losses ------------------------------------------------------------------

    def target_noise(self, key: jax.Array, index: jax.Array) -> jax.Array:
        """Target-policy smoothing noise, clipped, in action units.

        Args:
          key: the update's noise key (the same on every device).
          index: each sample's position in the global minibatch.

        Returns:
          One noise vector per sample.
        """
        cfg = self.config
        noise = jax.vmap(
            lambda i: jax.random.normal(jax.random.fold_in(key, i), (self.spec.action_dim,))
        )(index)
        half_range = 0.5 * (self._high - self._low)
        return jnp.clip(cfg.policy_noise * noise, -cfg.noise_clip, cfg.noise_clip) * half_range

    def critic_loss(
        self,
        critic_params: Any,
        critic_target_params: Any,
        actor_target_params: Any,
        batch: Transition,
        key: jax.Array,
        index: jax.Array,
    ) -> jax.Array:
        """Mean over the batch of both critics' squared TD errors (clipped double Q).

        The target actor's next action, smoothed with :meth:`target_noise`,
        is valued by the smaller of the two target critics (Eq. 10 of the paper).
        """
        noise = self.target_noise(key, index)
        q_values = jax.vmap(self.critic.apply, in_axes=(0, None, None))  # both critics
        next_action = jax.vmap(self.policy, in_axes=(None, 0))(actor_target_params, batch.next_obs)
        next_action = jnp.clip(next_action + noise, self._low, self._high)
        next_q = jnp.min(q_values(critic_target_params, batch.next_obs, next_action), 0)
        target = batch.reward + self.config.discount * (1.0 - batch.terminal) * next_q
        target = jax.lax.stop_gradient(target)
        q = q_values(critic_params, batch.obs, batch.action)
        return jnp.mean(jnp.sum((q - target) ** 2, axis=0))

    def actor_loss(self, actor_params: Any, critic_params: Any, obs: jax.Array) -> jax.Array:
        """Minus the first critic's value of the actor's actions, batch mean."""
        first = jax.tree.map(lambda p: p[0], critic_params)
        action = jax.vmap(self.policy, in_axes=(None, 0))(actor_params, obs)
        return -jnp.mean(self.critic.apply(first, obs, action))

    # --- updates -----------------------------------------------------------------

    def critic_update(
        self,
        state: TD3State,
        batch: Transition,
        key: jax.Array,
        dp_axis_name: str | None = None,
        index: jax.Array | None = None,
    ) -> tuple[TD3State, jax.Array]:
        """One gradient step of the twin critics.

        Args:
          state: the learner (replicated over ``dp_axis_name``): its critics are
            trained, its target critics and target actor give the TD target.
          batch: this device's slice of the global minibatch.
          key: noise key, the same on every device.
          dp_axis_name: the data-parallel axis the batch is split over, or ``None``.
          index: the batch's positions in the global minibatch (``None``: this
            device's contiguous slice, see :func:`~evorl_pop.rl.replay.global_batch_index`).

        Returns:
          ``(state, loss)``: the state with the critics and their optimizer state
            stepped; the loss is the global minibatch mean.
        """
        if index is None:
            index = replay.global_batch_index(batch.reward.shape[0], dp_axis_name)

        def loss_fn(state, batch, key, index):
            critic = state.critic
            actor_target = state.actor.target_params
            return self.critic_loss(
                critic.params, critic.target_params, actor_target, batch, key, index
            )

        step = dist.agent_gradient_update(
            loss_fn,
            self.critic_optimizer,
            dp_axis_name,
            attach_fn=with_critic_part,
            detach_fn=critic_part,
        )
        loss, state, opt_state = step(state.critic.opt_state, state, batch, key, index)
        state = state.replace(critic=state.critic.replace(opt_state=opt_state))
        return state, dist.pmean(loss, dp_axis_name)

    def actor_update(
        self,
        state: TD3State,
        batch: Transition,
        dp_axis_name: str | None = None,
        optimizer: optax.GradientTransformation | None = None,
    ) -> tuple[TD3State, jax.Array]:
        """One deterministic policy-gradient step of the actor, following the first critic.

        Args:
          state: the learner (replicated over ``dp_axis_name``).
          batch: this device's slice of the global minibatch.
          dp_axis_name: the data-parallel axis, or ``None``.
          optimizer: the step's optimizer, whose state ``state.actor.opt_state`` is
            (``None``: the actor's own Adam; PGA-ME steps its candidates with another).

        Returns:
          ``(state, loss)``: the state with the actor and its optimizer state
            stepped, the actor's target not yet moved.
        """

        def loss_fn(state, obs):
            return self.actor_loss(state.actor.params, state.critic.params, obs)

        step = dist.agent_gradient_update(
            loss_fn,
            self.actor_optimizer if optimizer is None else optimizer,
            dp_axis_name,
            attach_fn=with_actor_part,
            detach_fn=actor_part,
        )
        loss, state, opt_state = step(state.actor.opt_state, state, batch.obs)
        state = state.replace(actor=state.actor.replace(opt_state=opt_state))
        return state, dist.pmean(loss, dp_axis_name)

    def update(
        self,
        state: TD3State,
        batch: Transition,
        key: jax.Array,
        dp_axis_name: str | None = None,
        index: jax.Array | None = None,
    ) -> tuple[TD3State, dict[str, jax.Array]]:
        """One TD3 iteration: a critic step; every ``policy_delay``-th time also
        an actor step and the Polyak update of both targets.

        Args:
          state: the learner (replicated over ``dp_axis_name``).
          batch: this device's contiguous slice of the global minibatch.
          key: noise key, the same on every device.
          dp_axis_name: the data-parallel axis the batch is split over, or ``None``.
          index: the batch's positions in the global minibatch (see :meth:`critic_update`).

        Returns:
          ``(state, metrics)`` with ``critic_loss`` and ``actor_loss`` (NaN
            when the actor was not updated).
        """
        state, critic_loss = self.critic_update(state, batch, key, dp_axis_name, index)
        tau = self.config.tau

        def delayed(state):
            state, loss = self.actor_update(state, batch, dp_axis_name)
            actor = state.actor
            critic = state.critic
            actor = actor.replace(target_params=polyak(actor.target_params, actor.params, tau))
            critic = critic.replace(target_params=polyak(critic.target_params, critic.params, tau))
            return state.replace(actor=actor, critic=critic), loss

        def skip(state):
            return state, jnp.float32(jnp.nan)

        state, actor_loss = jax.lax.cond(
            state.updates % self.config.policy_delay == 0, delayed, skip, state
        )
        state = state.replace(updates=state.updates + 1)
        return state, {"critic_loss": critic_loss, "actor_loss": actor_loss}

    def learn(
        self,
        state: TD3State,
        buffer: ReplayBuffer,
        key: jax.Array,
        num_updates: int,
        dp_axis_name: str | None = None,
    ) -> tuple[TD3State, dict[str, jax.Array]]:
        """``num_updates`` TD3 iterations (:meth:`update`) on minibatches from
        ``buffer``, as :func:`~evorl_pop.rl.replay.updates` runs them;
        ``(state, metrics)``: the mean critic loss and the mean actor loss."""

        def update(state, batch, index, key):
            return self.update(state, batch, key, dp_axis_name, index)

        state, metrics = replay.updates(
            update, state, buffer, key, num_updates, self.config.batch_size, dp_axis_name
        )
        return state, {
            "critic_loss": jnp.mean(metrics["critic_loss"]),
            "actor_loss": jnp.nanmean(metrics["actor_loss"]),
        }


# --- TD3 beside a population: CEM-RL's and ERL's RL part, a PBT member ------------

#: TD3's settings in CEM-RL, ERL and PBT: smaller critics and batches than TD3Config's.
HYBRID_SETTINGS = TD3Config(critic_hidden_sizes=(128, 128), batch_size=128)
#: The settings a PBT member searches as traced values; ``policy_delay`` and ``tau``
#: stay fixed (they are checked, or drive control flow, as Python values).
SEARCHABLE = ("actor_lr", "critic_lr", "discount", "policy_noise", "noise_clip")


def actor_task(config: HybridConfig, settings: TD3Config) -> ControlTask:
    """The control task of a population of TD3 actors on ``config.task``: TD3's actor
    network; its episodes keep their transitions for the learner (a Gymnasium task's
    stepped on the host)."""
    family = env_family(config.task)
    if family is not None and not family.steps_in_jax:
        return family.make_task(
            config.task,
            hidden_sizes=settings.actor_hidden_sizes,
            activation=settings.actor_activation,
            episode_length=config.episode_length,
            transitions=True,
        )
    return ControlTask(
        config.task,
        settings.actor_hidden_sizes,
        settings.actor_activation,
        episode_length=config.episode_length,
        transitions=True,
    )


class TD3Learner(ReplayLearner):
    """TD3 fed by a population's evaluations: CEM-RL's and ERL's RL part with
    ``learner='td3'`` (:class:`~evorl_pop.rl.hybrid.ReplayLearner`).

    Args:
      task: the control task the population is evaluated on (its policy is the actor).
      config: the algorithm's :class:`~evorl_pop.rl.hybrid.HybridConfig`.
      settings: TD3's settings.
      mesh: the population's ``'POP'`` mesh.
      num_updates: TD3 iterations per call of :attr:`learn`.
      algorithm: the algorithm's name, for errors.
    """

    def __init__(
        self,
        task: ControlTask,
        config: HybridConfig,
        settings: TD3Config,
        mesh: Mesh,
        num_updates: int,
        algorithm: str,
    ):
        check_continuous(task.spec, algorithm)
        super().__init__(task, config, mesh, settings.batch_size, "TD3")
        self.td3 = TD3(task.spec, settings, policy=task.policy)

        def local(state, buffer, key):
            return self.td3.learn(state, buffer, key, num_updates, self.axis)

        #: ``learn(td3_state, buffer, key) -> (td3_state, losses)``, replicated in and out.
        self.learn = self.data_parallel(local)

    def init(self, key: jax.Array) -> TD3State:
        """A fresh TD3 learner (ERL's)."""
        return self.td3.init(key)

    def init_shared(self, key: jax.Array) -> CriticState:
        """Fresh twin critics and their targets (CEM-RL's)."""
        return self.td3.init_critic(key)

    def actor(self, state: TD3State) -> Any:
        return state.actor.params

    def shared(self, state: TD3State) -> CriticState:
        return state.critic

    def with_actor(self, shared: CriticState, params: Any) -> TD3State:
        """TD3 on ``params`` (its target a copy, a fresh Adam) beside the critic ``shared``."""
        return TD3State(self.td3.init_actor(params), shared, jnp.int32(0))


def member(settings: TD3Config, config: Any) -> ReplayMember:
    """TD3 as a member of PBT's population: its own buffer, episodes with action noise,
    TD3 with the member's searched values of :data:`SEARCHABLE`.

    Args:
      settings: TD3's settings.
      config: PBT's config.
    """
    task = actor_task(config, settings)

    def learner(values: dict) -> TD3:
        searched = {name: values[name] for name in SEARCHABLE if name in values}
        return TD3(task.spec, dataclasses.replace(settings, **searched), policy=task.policy)

    def actor(state: TD3State) -> Any:
        return state.actor.params

    what = "PBT with TD3 members (try learner=ppo)"
    return ReplayMember(task, config, settings.batch_size, learner, actor, TD3Learner.LOSSES, what)


#: PBT's default search over a deterministic actor-critic's members (TD3's, DDPG's).
DEFAULT_SEARCH = (
    ("actor_lr", 1e-5, 1e-2, True),
    ("critic_lr", 1e-5, 1e-2, True),
    ("exploration_noise", 0.05, 0.5, False),
    ("discount", 0.9, 0.995, False),
)

registry.register_learner(
    "td3",
    registry.LearnerSpec(
        hybrid=registry.HybridPart(HYBRID_SETTINGS, actor_task, TD3Learner),
        member=registry.MemberPart(
            defaults=HYBRID_SETTINGS,
            member=member,
            searchable=(*SEARCHABLE, "exploration_noise"),
            default_search=DEFAULT_SEARCH,
            losses=TD3Learner.LOSSES,
            replay=True,
        ),
        description="TD3: a deterministic actor, twin critics, delayed updates",
    ),
)
