"""SAC: soft actor-critic on a batch of environments split over devices.

Haarnoja et al. (2018), "Soft Actor-Critic Algorithms and Applications" (the
losses: :mod:`evorl_pop.rl.sac`). One ``step``::

    state (actor, twin critics, targets, temperature, Adam states, replay
           buffer, hyperparameters: replicated; num_envs running episodes: split P('DP'))
      | shard_map over DP: each device its slice of the environments
      |   unroll_length steps: sample from the policy, step, restart ended episodes
      |   all_gather -> the same transitions, in global order, into every
      |     device's copy of the buffer
      |   once the buffer holds learning_starts transitions: num_updates
      |     updates, each minibatch drawn from one key and split over DP, pmean
      v
    state, metrics (training returns, losses, temperature: global)

Lane ``i`` draws its actions, steps and resets from ``fold_in(key, i)`` with
``i`` its global index, and minibatch sample ``j`` its actions from
``fold_in(key, j)``: 1, 2 and 4 devices give the same step. At the time limit
an episode is truncated, not terminal, so the critics bootstrap from the last
observation (the replay buffer keeps it as ``next_obs``).

The searched hyperparameters (the learning rates, the target entropy scale,
the discount) live in ``State.hyperparameters`` as traced scalars: a
population search may change them between steps without recompiling.
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
from evorl_pop.algorithms.pbt_members import algorithm_member
from evorl_pop.base import ConfigError, check_config
from evorl_pop.core.interfaces import Acting
from evorl_pop.rl import data_parallel, vec_env
from evorl_pop.rl.hybrid import example_transition
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.sac import (
    Hyperparameters,
    SACConfig,
    SACHybridLearner,
    SACSettings,
    SACState,
    actor_task,
)
from evorl_pop.tasks.rollout import Transition

DP = dist.DP_AXIS_NAME


@dataclasses.dataclass(frozen=True)
class Config(SACSettings, data_parallel.LearnerConfig):
    """SAC settings (the defaults reach -200 on Pendulum-v1 in about 10k steps): the task
    and environments of :class:`~evorl_pop.rl.data_parallel.LearnerConfig`, SAC's
    learning settings (:class:`~evorl_pop.rl.sac.SACSettings`), and these.

    Attributes:
      task: a continuous-action environment (``'Pendulum-v1'``, ``'brax/hopper'``, ...).
      unroll_length: steps of every environment per step of the algorithm
        (the default, Pendulum-v1's episode length, ends an episode in every
        environment each step, so the training returns are never empty).
      updates_per_step: gradient updates per environment step (a step runs
        ``round(updates_per_step * num_envs * unroll_length)`` of them).
      buffer_capacity: replay buffer size.
      learning_starts: transitions in the buffer before the updates begin
        (until then the untrained policy acts).
    """

    task: str = "Pendulum-v1"
    num_envs: int = 4
    unroll_length: int = 200
    updates_per_step: float = 1.0
    buffer_capacity: int = 100_000
    learning_starts: int = 1000

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        vec_env.check_task(self.task, "sac")  # stepped in JAX or on the host
        check_config(self, least=vec_env.LEAST)
        SACSettings.validate(self)
        check_config(self, least={"buffer_capacity": 1})
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
        check_config(self, nonnegative=("updates_per_step",))


@flax.struct.dataclass
class State:
    """Everything that changes between steps."""

    learner: SACState  # actor, twin critics and targets, temperature, Adam states
    buffer: ReplayBuffer  # every transition collected, the same on every device
    hyperparameters: Hyperparameters  # the traced searchable settings
    envs: Any  # the running episodes (vec_env's EnvBatch, or a HostBatch), split over DP
    generation: jax.Array  # int32: steps so far


class SAC(data_parallel.DataParallel):
    """SAC with its environments and minibatches split over the devices of ``mesh``:
    ``SAC(config, mesh)`` with a :class:`Config`, as
    :class:`~evorl_pop.rl.data_parallel.DataParallel` takes them; a discrete-action
    task is a ``ConfigError``.

    A :meth:`step` collects ``num_envs x unroll_length`` steps into the buffer, then
    the updates; its metrics' losses are ``critic_loss``, ``actor_loss`` and
    ``alpha_loss`` (NaN before learning starts), with the temperature ``alpha``.
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        super().__init__(config, mesh)
        self.learner = config.make_learner(self.env.spec)
        n = self.mesh.size
        data_parallel.check_split("batch_size", config.batch_size, n, "A minibatch's samples")
        steps = config.num_envs * config.unroll_length
        self.num_updates = round(config.updates_per_step * steps)
        self.shard_steps(State)

    def fresh(self, key: jax.Array) -> State:
        """Fresh networks, an empty buffer, and ``num_envs`` fresh episodes: :meth:`init`'s
        state where it was computed (one member of a population)."""
        learner_key, env_key = jax.random.split(key)
        cfg = self.config
        hp = cfg.hyperparameters()
        buffer = ReplayBuffer.create(example_transition(self.env.spec), cfg.buffer_capacity)
        return State(
            learner=self.learner.init(learner_key, hp),
            buffer=buffer,
            hyperparameters=hp,
            envs=self.envs.reset_batch(vec_env.lane_keys(env_key, jnp.arange(cfg.num_envs))),
            generation=jnp.int32(0),
        )

    def collect(self, state: State, key: jax.Array, dp_axis_name: str | None = None):
        """:meth:`unroll` of this device's lanes with the sampling policy: ``(envs,
        transitions)``, the lanes after it and their :class:`Transition`'s."""
        sample = jax.vmap(self.learner.sample, in_axes=(None, 0, 0))

        def act(obs, keys):
            action, _ = sample(state.learner.actor.params, obs, keys)
            return action, action

        envs, (obs, action, out) = self.unroll(state.envs, act, key, dp_axis_name)
        return envs, Transition(obs, action, out.reward, out.next_obs, out.terminal)

    def local_step(self, state: State, key: jax.Array, axis: str | None = DP):
        """One step on this device's lanes: inside ``shard_map`` over ``axis``, or
        (``axis=None``) on one device, every lane there (a member of a population)."""
        cfg = self.config
        collect_key, train_key = jax.random.split(key)
        envs, transitions = self.collect(state, collect_key, axis)
        # Every device adds the same transitions, lanes in global order, to its copy.
        buffer = state.buffer.add(dist.all_gather(transitions, axis, axis=1, tiled=True))

        def train(learner):
            return self.learner.train(learner, buffer, state.hyperparameters, train_key,
                                      self.num_updates, cfg.batch_size, axis)  # fmt: skip

        def skip(learner):
            nan = jnp.float32(jnp.nan)
            alpha = jnp.exp(learner.log_alpha)
            return learner, {"critic_loss": nan, "actor_loss": nan, "alpha_loss": nan,
                             "alpha": alpha}  # fmt: skip

        learn = buffer.size >= max(cfg.learning_starts, cfg.batch_size)
        learner, losses = jax.lax.cond(learn & (self.num_updates > 0), train, skip, state.learner)
        metrics = {**vec_env.metrics(state.envs, envs, axis), **losses}
        return state.replace(learner=learner, buffer=buffer, envs=envs), metrics

    def acting(self, state: State) -> Acting:
        """The deterministic policy (the squashed Gaussian mean) (``evorl-pop render``)."""
        return Acting(
            self.env, self.learner.deterministic_policy, state.learner.actor.params,
            episode_length=self.config.episode_length,
        )  # fmt: skip


registry.register_algorithm("sac", Config, SAC, "SAC: soft actor-critic, twin critics")

# --- SAC as CEM-RL's and ERL's RL part and as a PBT member --------------------------------

#: SAC's settings as a PBT member: an iteration of whole Pendulum-v1 episodes.
MEMBER_SETTINGS = Config(num_envs=5, unroll_length=200)


def split_member(state: State) -> tuple[SACState, tuple[ReplayBuffer, vec_env.EnvBatch]]:
    """A PBT member's parts: its learner, which a replaced member copies, and its replay
    buffer and running episodes, which it keeps."""
    return state.learner, (state.buffer, state.envs)


def join_member(learner: SACState, own: tuple, hyperparameters: Hyperparameters) -> State:
    """The state of a PBT member's parts (:func:`split_member`)."""
    buffer, envs = own
    return State(learner, buffer, hyperparameters, envs, jnp.int32(0))


registry.register_learner(
    "sac",
    registry.LearnerSpec(
        hybrid=registry.HybridPart(SACConfig(), actor_task, SACHybridLearner),
        member=registry.MemberPart(
            defaults=MEMBER_SETTINGS,
            member=algorithm_member(SAC, split_member, join_member),
            searchable=tuple(f.name for f in dataclasses.fields(Hyperparameters)),
            default_search=(
                ("actor_lr", 1e-4, 1e-2, True),
                ("critic_lr", 1e-4, 1e-2, True),
                ("target_entropy_scale", 0.5, 2.0, False),
                ("discount", 0.95, 0.995, False),
            ),
            losses=SACHybridLearner.LOSSES,
        ),
        description="SAC: a tanh-Gaussian actor, twin critics, a learned temperature",
    ),
)
