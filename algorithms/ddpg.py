"""DDPG: deep deterministic policy gradient, on a batch of environments split over devices.

Lillicrap, Hunt, Pritzel, Heess, Erez, Tassa, Silver & Wierstra (2016),
"Continuous control with deep reinforcement learning". A deterministic actor,
one critic trained towards ``y = r + gamma (1 - term) Q'(s', mu'(s'))`` (the target
networks' value of the target actor's action), the actor following
``grad_a Q(s, a)``, and Polyak-averaged targets after every update::

    L_Q  = E[(Q(s, a) - y)^2]          L_mu = -E[Q(s, mu(s))]

It is TD3 (:mod:`evorl_pop.rl.td3`) with one critic, no target-policy smoothing and an
actor update at every critic update, so :class:`DDPGNetworks` is TD3's class with those
three changes, and its updates are TD3's: every gradient step through
:func:`evorl_pop.distributed.agent_gradient_update`, each device of ``'DP'`` on its
slice of the minibatch. The paper's L2 weight decay on the critic is left out.

``-a ddpg`` explores with Ornstein-Uhlenbeck noise (``exploration='ou'``, the paper's:
``x' = (1 - theta) x + sigma N(0, 1)`` per lane, restarted at 0 with each episode) or
independent Gaussian noise (``'gaussian'``), in half action ranges; lane ``i`` draws
its noise, steps and resets from ``fold_in(key, i)``, ``i`` its global index, so 1, 2
and 4 devices give the same step. A step runs its unroll one environment step at a
time, the noise carried between them (so each lane draws its pending start at every
step rather than once per unroll). Beside a population (CEM-RL's and ERL's
``learner='ddpg'``, the pairing of the ERL paper) and as a PBT member it is TD3's
learner with these networks, exploring with Gaussian action noise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from evorl_pop import distributed as dist
from evorl_pop import registry
from evorl_pop.base import ConfigError, EnvSpec, check_config
from evorl_pop.core.interfaces import Acting
from evorl_pop.rl import data_parallel, replay, vec_env
from evorl_pop.rl.hybrid import (
    HybridConfig,
    ReplayLearner,
    ReplayMember,
    check_continuous,
    example_transition,
)
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.td3 import (
    DEFAULT_SEARCH,
    TD3,
    ActorCriticConfig,
    CriticState,
    TD3Learner,
    TD3State,
    actor_task,
)
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.policies import ACTIVATIONS, Policy
from evorl_pop.tasks.rollout import Transition

DP = dist.DP_AXIS_NAME
#: The exploration noise of ``-a ddpg``.
EXPLORATION = ("ou", "gaussian")


@dataclasses.dataclass(frozen=True)
class DDPGSettings(ActorCriticConfig):
    """DDPG's learning settings: those of :class:`~evorl_pop.rl.td3.ActorCriticConfig`
    and this.

    Attributes:
      actor_activation: the actor's ``'relu'``, ``'tanh'`` or ``'elu'`` (the critic uses relu).
    """

    actor_activation: str = "relu"

    PREFIX = "ddpg."
    #: Critic updates per actor update: one (what TD3 delays).
    policy_delay = 1

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        super().validate()
        if self.actor_activation not in ACTIVATIONS:
            valid = ", ".join(sorted(ACTIVATIONS))
            raise ConfigError(
                f"{self.PREFIX}actor_activation: unknown value {self.actor_activation!r}. "
                f"Valid: {valid}."
            )


class DDPGNetworks(TD3):
    """DDPG's networks, losses and updates: :class:`~evorl_pop.rl.td3.TD3`'s with one
    critic (its stack of critics has length 1, so TD3's smaller of the target values is
    that critic's), no target-policy noise, and an actor and target update every update.

    Args:
      spec: the environment's spec (continuous actions).
      config: the settings.
      policy: the actor (default: an MLP of ``config``'s actor sizes).
    """

    def __init__(self, spec: EnvSpec, config: DDPGSettings, policy: Policy | None = None):
        check_continuous(spec, "DDPG")
        super().__init__(spec, config, policy)

    def init_critic(self, key: jax.Array) -> CriticState:
        """A fresh critic and its target, stacked as one of TD3's critics."""
        obs = jnp.zeros(self.spec.obs_shape)
        action = jnp.zeros((self.spec.action_dim,))
        params = jax.vmap(lambda k: self.critic.init(k, obs, action))(jax.random.split(key, 1))
        return CriticState(params, params, self.critic_optimizer.init(params))

    def target_noise(self, key: jax.Array, index: jax.Array) -> jax.Array:
        """None: DDPG's target action is the target actor's."""
        del key
        return jnp.zeros((index.shape[0], self.spec.action_dim), jnp.float32)


@dataclasses.dataclass(frozen=True)
class Config(DDPGSettings, data_parallel.LearnerConfig):
    """DDPG settings (the defaults improve Pendulum-v1 to about -200 within 20k steps, see
    the learners guide): the environments of
    :class:`~evorl_pop.rl.data_parallel.LearnerConfig`, DDPG's learning settings
    (:class:`DDPGSettings`), and these.

    Attributes:
      task: a continuous-action environment (``'Pendulum-v1'``, ``'brax/hopper'``, ...).
      exploration: ``'ou'`` (Ornstein-Uhlenbeck noise) or ``'gaussian'``.
      noise_std: the noise's scale sigma, in half action ranges.
      ou_theta: the Ornstein-Uhlenbeck noise's pull towards 0 per step.
      updates_per_step: gradient updates per environment step.
      buffer_capacity: replay buffer size.
      learning_starts: transitions in the buffer before the updates begin.
    """

    task: str = "Pendulum-v1"
    num_envs: int = 4
    unroll_length: int = 50
    exploration: str = "ou"
    noise_std: float = 0.2
    ou_theta: float = 0.15
    updates_per_step: float = 1.0
    buffer_capacity: int = 100_000
    learning_starts: int = 1000
    PREFIX = ""

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        vec_env.check_task(self.task, "ddpg")
        check_config(self, least=vec_env.LEAST, choices={"exploration": EXPLORATION})
        DDPGSettings.validate(self)
        check_config(
            self,
            least={"buffer_capacity": 1},
            nonnegative=("updates_per_step", "noise_std"),
        )
        if not 0.0 < self.ou_theta <= 1.0:
            raise ConfigError(f"ou_theta must be in (0, 1], got {self.ou_theta}.")
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

    learner: TD3State  # the actor, the critic (a stack of one), their targets, Adam states
    buffer: ReplayBuffer  # every transition collected, the same on every device
    envs: Any  # (running episodes, each lane's exploration noise), split over DP
    generation: jax.Array  # int32: steps so far


class DDPG(data_parallel.DataParallel):
    """DDPG with its environments and minibatches split over the devices of ``mesh``
    (:class:`~evorl_pop.rl.data_parallel.DataParallel`); a discrete-action task is a
    ``ConfigError``. A :meth:`step`'s metrics add ``critic_loss`` and ``actor_loss``
    (NaN before learning starts)."""

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        super().__init__(config, mesh)
        spec = self.env.spec
        self.learner = DDPGNetworks(spec, config)
        data_parallel.check_split(
            "batch_size", config.batch_size, self.mesh.size, "A minibatch's samples"
        )
        self.num_updates = round(config.updates_per_step * config.num_envs * config.unroll_length)
        self.theta = config.ou_theta if config.exploration == "ou" else 1.0
        self.half_range = 0.5 * (self.learner._high - self.learner._low)
        self.shard_steps(State)

    def fresh(self, key: jax.Array) -> State:
        """A fresh actor and critic, an empty buffer, ``num_envs`` fresh episodes."""
        learner_key, env_key = jax.random.split(key)
        cfg = self.config
        spec = self.env.spec
        lanes = self.envs.reset_batch(vec_env.lane_keys(env_key, jnp.arange(cfg.num_envs)))
        noise = jnp.zeros((cfg.num_envs, spec.action_dim), jnp.float32)
        return State(
            learner=self.learner.init(learner_key),
            buffer=ReplayBuffer.create(example_transition(spec), cfg.buffer_capacity),
            envs=(lanes, noise),
            generation=jnp.int32(0),
        )

    def collect(self, state: State, key: jax.Array, axis: str | None = None):
        """``unroll_length`` steps of this device's lanes, the actor's actions plus each
        lane's noise: ``(envs, transitions)``."""
        lanes, noise = state.envs
        index = replay.global_batch_index(lanes.steps.shape[0], axis)
        params = state.learner.actor.params
        sigma = self.config.noise_std
        low, high = self.learner._low, self.learner._high
        dim = self.env.spec.action_dim

        def one(carry, t):
            lanes, noise = carry

            def act(obs, keys):
                normal = jax.vmap(lambda k: jax.random.normal(k, (dim,)))(keys)
                x = (1.0 - self.theta) * noise + sigma * normal
                mean = jax.vmap(self.learner.policy, (None, 0))(params, obs)
                action = jnp.clip(mean + x * self.half_range, low, high)
                return action, (action, x)

            step_key = jax.random.fold_in(key, t)
            lanes, (obs, (action, x), out) = self.envs.unroll(lanes, act, step_key, 1, index)
            done = (out.terminal[0] + out.truncated[0]) > 0
            noise = jnp.where(done[:, None], 0.0, x[0])  # a new episode, new noise
            step = Transition(obs[0], action[0], out.reward[0], out.next_obs[0], out.terminal[0])
            return (lanes, noise), step

        steps = jnp.arange(self.config.unroll_length)
        return jax.lax.scan(one, (lanes, noise), steps)

    def local_step(self, state: State, key: jax.Array, axis: str | None = DP):
        """One step on this device's lanes (``axis=None``: every lane, on one device)."""
        cfg = self.config
        collect_key, train_key = jax.random.split(key)
        envs, transitions = self.collect(state, collect_key, axis)
        buffer = state.buffer.add(dist.all_gather(transitions, axis, axis=1, tiled=True))

        def train(learner):
            return self.learner.learn(learner, buffer, train_key, self.num_updates, axis)

        def skip(learner):
            nan = jnp.float32(jnp.nan)
            return learner, {"critic_loss": nan, "actor_loss": nan}

        learn = buffer.size >= max(cfg.learning_starts, cfg.batch_size)
        learner, losses = jax.lax.cond(learn & (self.num_updates > 0), train, skip, state.learner)
        metrics = {**vec_env.metrics(state.envs[0], envs[0], axis), **losses}
        return state.replace(learner=learner, buffer=buffer, envs=envs), metrics

    def acting(self, state: State) -> Acting:
        """The actor without noise (``evorl-pop render``, the evaluations)."""
        return Acting(
            self.env, self.learner.policy, state.learner.actor.params,
            episode_length=self.config.episode_length,
        )  # fmt: skip


registry.register_algorithm("ddpg", Config, DDPG, "DDPG: a deterministic actor and one critic")

# --- DDPG beside a population: CEM-RL's and ERL's RL part, a PBT member -------------------

#: DDPG's settings in CEM-RL, ERL and PBT (``learner_settings`` change them): TD3's there.
HYBRID_SETTINGS = DDPGSettings(critic_hidden_sizes=(128, 128), batch_size=128)
#: The settings a PBT member searches as traced values.
SEARCHABLE = ("actor_lr", "critic_lr", "discount")


class DDPGLearner(TD3Learner):
    """DDPG fed by a population's evaluations: CEM-RL's and ERL's RL part with
    ``learner='ddpg'``; :class:`~evorl_pop.rl.td3.TD3Learner` on :class:`DDPGNetworks`.

    Args:
      task: the control task the population is evaluated on (its policy is the actor).
      config: the algorithm's :class:`~evorl_pop.rl.hybrid.HybridConfig`.
      settings: DDPG's settings.
      mesh: the population's ``'POP'`` mesh.
      num_updates: DDPG iterations per call of :attr:`learn`.
      algorithm: the algorithm's name, for errors.
    """

    def __init__(
        self,
        task: ControlTask,
        config: HybridConfig,
        settings: DDPGSettings,
        mesh: Mesh,
        num_updates: int,
        algorithm: str,
    ):
        check_continuous(task.spec, algorithm)
        ReplayLearner.__init__(self, task, config, mesh, settings.batch_size, "DDPG")
        self.td3 = DDPGNetworks(task.spec, settings, policy=task.policy)

        def local(state, buffer, key):
            return self.td3.learn(state, buffer, key, num_updates, self.axis)

        #: ``learn(state, buffer, key) -> (state, losses)``, replicated in and out.
        self.learn = self.data_parallel(local)


def member(settings: DDPGSettings, config: Any) -> ReplayMember:
    """DDPG as a member of PBT's population: its own buffer, episodes with Gaussian
    action noise, DDPG with the member's searched values of :data:`SEARCHABLE`."""
    task = actor_task(config, settings)

    def learner(values: dict) -> DDPGNetworks:
        searched = {name: values[name] for name in SEARCHABLE if name in values}
        changed = dataclasses.replace(settings, **searched)
        return DDPGNetworks(task.spec, changed, policy=task.policy)

    def actor(state: TD3State) -> Any:
        return state.actor.params

    what = "PBT with DDPG members (try learner=ppo)"
    losses = DDPGLearner.LOSSES
    return ReplayMember(task, config, settings.batch_size, learner, actor, losses, what)


registry.register_learner(
    "ddpg",
    registry.LearnerSpec(
        hybrid=registry.HybridPart(HYBRID_SETTINGS, actor_task, DDPGLearner),
        member=registry.MemberPart(
            defaults=HYBRID_SETTINGS,
            member=member,
            searchable=(*SEARCHABLE, "exploration_noise"),
            default_search=DEFAULT_SEARCH,
            losses=DDPGLearner.LOSSES,
            replay=True,
        ),
        description="DDPG: a deterministic actor, one critic, Polyak targets",
    ),
)
