"""IMPALA: an actor-critic corrected off-policy with V-trace, its actors a few updates behind.

Espeholt et al. (2018), "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures". The actors follow a behaviour policy ``mu``
(the learner's parameters of ``actor_lag`` updates ago); the learner trains
``pi`` on their trajectories with the V-trace targets (Eq. 1)::

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)),  c_t = min(c_bar, pi / mu)
    gamma_t = gamma (1 - terminal_t)                         # episode ends truncate
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
            = V(x_s) + delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))
    A_s     = rho_s (r_s + gamma_s v_{s+1} - V(x_s))             # the policy gradient's
    L       = -E[A_s log pi(a_s|x_s)] + c_v 1/2 E[(v_s - V(x_s))^2] - c_ent E[H[pi]]

with ``v_T = V(x_T)`` after the unroll. A step that ends its episode at the time
limit has no successor in the unroll (the lane restarted): it carries no target
and no advantage (``v_t = V(x_t)``, ``A_t = 0``), and the steps before it
bootstrap from ``V(x_t)`` (as :func:`evorl_pop.rl.ppo.gae` does).

The V-trace recursion is written here, not taken from rlax: rlax's
``vtrace_td_error_and_advantage`` fixes ``c_bar`` at 1 (its ``c_t`` is
``lambda min(1, rho_t)``), and its ``sample_mask`` carries the correction past a
masked step rather than cutting it at a time limit. With ``c_bar = 1`` and no
time limit in the unroll the two agree (``tests/test_impala.py``).

One ``step``::

    state (learner's networks, Adam, obs normaliser, hyperparameters, the actors'
           ring of the last actor_lag policies: replicated; num_envs episodes: P('DP'))
      | shard_map over DP: each device its slice of the environments
      |   unroll_length steps with the policy of actor_lag updates ago (mu)
      |   V-trace on this device's lanes with the learner's networks (pi, V)
      |   one gradient step: each device differentiates its own lanes, pmean
      |   the ring takes the learner's policy before the step; statistics merged
      v
    state, metrics (training returns, losses, the mean |log pi/mu|: global)

The networks and the acting are PPO's (:class:`~evorl_pop.rl.ppo.PPOLearner`),
the environments and settings A2C's (:mod:`evorl_pop.algorithms.a2c`). The
searched hyperparameters (learning rate, entropy cost, discount, rho_bar, c_bar)
live in ``State.hyperparameters`` as traced scalars.
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
from evorl_pop.algorithms.a2c import A2C, ActorCriticSettings
from evorl_pop.algorithms.pbt_members import algorithm_member
from evorl_pop.base import ConfigError
from evorl_pop.rl import replay, vec_env
from evorl_pop.rl.ppo import AgentState, Params, PPOLearner, Segments, entropy_loss, value_loss
from evorl_pop.tasks.obs_norm import ObsNorm

DP = dist.DP_AXIS_NAME

# --- the math ------------------------------------------------------------------------


@flax.struct.dataclass
class Hyperparameters:
    """IMPALA's searchable settings, float32 scalars: changing them does not recompile."""

    learning_rate: jax.Array
    entropy_cost: jax.Array
    discount: jax.Array
    rho_bar: jax.Array
    c_bar: jax.Array

    @classmethod
    def create(cls, **values: float) -> Hyperparameters:
        """Hyperparameters from Python numbers, e.g. ``create(learning_rate=1e-3, ...)``."""
        return cls(**{k: jnp.float32(v) for k, v in values.items()})


def vtrace(
    value: jax.Array,
    bootstrap_value: jax.Array,
    reward: jax.Array,
    discount: jax.Array,
    log_rho: jax.Array,
    truncated: jax.Array,
    rho_bar: jax.Array | float,
    c_bar: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """V-trace targets and policy-gradient advantages of an unroll.

    Args:
      value: ``V(x_t)``, shape ``(T, ...)``.
      bootstrap_value: ``V(x_T)`` of the state after the unroll, shape ``(...)``.
      reward: ``r_t``, shape ``(T, ...)``.
      discount: ``gamma_t``: gamma, 0 where the step ended the episode (terminal).
      log_rho: ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
      truncated: 1.0 where the step ended the episode at the time limit.
      rho_bar: the clipping threshold of the ratios in the TD errors and advantages.
      c_bar: the clipping threshold of the traces.

    Returns:
      ``(vs, advantage)``, shape ``(T, ...)``: the targets ``v_s`` and
        ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))``; both carry no gradient.
    """
    value, bootstrap_value, log_rho = jax.lax.stop_gradient((value, bootstrap_value, log_rho))
    ratio = jnp.exp(log_rho)
    rho = jnp.minimum(rho_bar, ratio)
    live = 1.0 - truncated
    next_value = jnp.concatenate([value[1:], bootstrap_value[None]], axis=0)
    delta = rho * (reward + discount * next_value - value) * live
    trace = discount * jnp.minimum(c_bar, ratio) * live

    def back(acc, xs):
        delta, trace = xs
        acc = delta + trace * acc  # v_s - V(x_s), backwards in time
        return acc, acc

    _, correction = jax.lax.scan(
        back, jnp.zeros_like(bootstrap_value), (delta, trace), reverse=True
    )
    vs = value + correction
    next_vs = jnp.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    advantage = rho * (reward + discount * next_vs - value) * live
    return vs, advantage


class ImpalaLearner(PPOLearner):
    """PPO's networks and acting with IMPALA's loss on whole lanes (its arguments are
    :class:`~evorl_pop.rl.ppo.PPOLearner`'s but the epochs, minibatches and advantage
    normalisation)."""

    def __init__(self, spec, **settings: Any):
        super().__init__(
            spec, num_minibatches=1, num_epochs=1, normalize_advantage=False, **settings
        )

    def loss(
        self,
        params: Params,
        obs_norm: ObsNorm | None,
        batch: Segments,
        hp: Hyperparameters,
        key: jax.Array,
        index: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The IMPALA loss of lanes' trajectories.

        Args:
          params: the learner's networks (``pi`` and ``V``).
          obs_norm: the learner's normaliser.
          batch: whole lanes, leaves ``(lanes, T, ...)``; ``log_prob`` is the
            behaviour policy's.
          hp: the hyperparameters (``discount``, ``rho_bar``, ``c_bar``, ``entropy_cost``).
          key: the batch's key (the same on every device).
          index: each sample's position in the global batch, lane by lane: its
            entropy sample uses ``fold_in(key, index)``.

        Returns:
          ``(loss, parts)`` with ``policy_loss``, ``value_loss``, ``entropy`` and
            ``abs_log_ratio``, the mean ``|log pi - log mu|`` (0 on-policy: how far the
            actors' policy lies behind).
        """
        lanes, length = batch.reward.shape
        flat = lambda x: x.reshape(lanes * length, *x.shape[2:])  # noqa: E731
        obs = self._normalize(obs_norm, flat(batch.obs))
        out = self.policy_net.apply(params.policy, obs)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
        log_prob, entropy = jax.vmap(self.distribution.log_prob_and_entropy)(
            out, flat(batch.raw_action), keys
        )
        value = self.value_net.apply(params.value, obs)[..., 0]
        bootstrap = self.values(params, obs_norm, batch.bootstrap_obs)
        log_rho = log_prob.reshape(lanes, length) - batch.log_prob
        discount = hp.discount * (1.0 - batch.terminal)
        lane_vtrace = jax.vmap(vtrace, in_axes=(0, 0, 0, 0, 0, 0, None, None))
        vs, advantage = lane_vtrace(
            value.reshape(lanes, length),
            bootstrap,
            batch.reward * self.reward_scaling,
            discount,
            log_rho,
            batch.truncated,
            hp.rho_bar,
            hp.c_bar,
        )
        policy = -jnp.mean(log_prob * flat(advantage))
        v_loss = value_loss(value, flat(vs))
        total = policy + self.vf_coefficient * v_loss + entropy_loss(entropy, hp.entropy_cost)
        return total, {
            "policy_loss": policy,
            "value_loss": v_loss,
            "entropy": jnp.mean(entropy),
            "abs_log_ratio": jnp.mean(jnp.abs(log_rho)),
        }

    def update(
        self,
        params: Params,
        opt_state: Any,
        obs_norm: ObsNorm | None,
        batch: Segments,
        hp: Hyperparameters,
        key: jax.Array,
        dp_axis_name: str | None = None,
    ) -> tuple[Params, Any, dict[str, jax.Array]]:
        """One gradient step on lanes split over ``dp_axis_name``.

        Args:
          params: the networks (replicated).
          opt_state: the optimizer state (replicated).
          obs_norm: the learner's normaliser.
          batch: this device's contiguous slice of the lanes.
          hp: the hyperparameters.
          key: the step's key, the same on every device.
          dp_axis_name: the data-parallel axis, or ``None``.

        Returns:
          ``(params, opt_state, metrics)``, the metrics global means.
        """
        index = replay.global_batch_index(batch.reward.size, dp_axis_name)

        def loss_fn(agent, batch, hp, key, index):
            return self.loss(agent.params, agent.obs_norm, batch, hp, key, index)

        step = dist.agent_gradient_update(
            loss_fn, self.optimizer(hp.learning_rate), dp_axis_name, has_aux=True
        )
        agent = AgentState(params=params, obs_norm=obs_norm)
        (loss, parts), agent, opt_state = step(opt_state, agent, batch, hp, key, index)
        return agent.params, opt_state, dist.pmean({"loss": loss, **parts}, dp_axis_name)

    def train(self, *args, **kwargs) -> tuple[Params, Any, dict[str, jax.Array]]:
        """:meth:`update`: IMPALA takes one gradient step on a batch of lanes."""
        return self.update(*args, **kwargs)


# --- the algorithm -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config(ActorCriticSettings):
    """IMPALA settings (A2C's :class:`~evorl_pop.algorithms.a2c.ActorCriticSettings`,
    and these).

    Attributes:
      num_envs: environments stepped together (the batch of a gradient step is
        ``num_envs x unroll_length`` samples).
      unroll_length: steps of every environment per gradient step.
      rho_bar: the clipping threshold of the ratios ``pi / mu`` in the TD errors and
        the policy gradient (the paper's 1.0).
      c_bar: the clipping threshold of the traces (the paper's 1.0).
      actor_lag: the actors act with the learner's policy (and observation
        statistics) of this many updates ago (0: the current one; until that many
        updates have passed, the first one).
    """

    num_envs: int = 16
    unroll_length: int = 16
    rho_bar: float = 1.0
    c_bar: float = 1.0
    actor_lag: int = 1

    HYPERPARAMETERS = Hyperparameters

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        super().validate()
        if not (self.rho_bar > 0 and self.c_bar > 0):
            raise ConfigError(
                f"rho_bar and c_bar must be > 0, got rho_bar={self.rho_bar}, c_bar={self.c_bar}."
            )
        if not isinstance(self.actor_lag, int) or self.actor_lag < 0:
            raise ConfigError(f"actor_lag must be an integer >= 0, got {self.actor_lag!r}.")


@flax.struct.dataclass
class Actors:
    """The policies the actors may act with: the learner's of the last ``actor_lag``
    updates, a ring whose leaves lead with ``actor_lag``."""

    policy: Any  # policy network parameters
    obs_norm: ObsNorm  # the observation statistics they acted with
    slot: jax.Array  # int32: the oldest entry, which acts next


@flax.struct.dataclass
class State:
    """Everything that changes between iterations."""

    params: Params  # the learner's policy and value networks
    opt_state: Any  # Adam's state (after the clip's)
    obs_norm: ObsNorm  # running observation statistics (unused when not normalising)
    actors: Actors | None  # the ring of past policies (None: actor_lag 0)
    hyperparameters: Hyperparameters  # the traced searchable settings
    envs: Any  # the running episodes (vec_env's EnvBatch, or a HostBatch), split over DP
    generation: jax.Array  # int32: iterations so far


class IMPALA(A2C):
    """IMPALA with its environments split over the devices of ``mesh``: ``IMPALA(config,
    mesh)`` with a :class:`Config`, as :class:`~evorl_pop.rl.data_parallel.DataParallel`
    takes them.

    A :meth:`step` is ``num_envs x unroll_length`` environment steps with the policy
    of ``actor_lag`` updates ago, and one gradient step; its metrics' losses are
    ``loss``, ``policy_loss``, ``value_loss``, ``entropy`` and ``abs_log_ratio``.
    """

    STATE = State

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        super().__init__(config, mesh)

    def make_learner(self, config: Config) -> ImpalaLearner:
        """The learner of ``config``."""
        return ImpalaLearner(self.env.spec, **config.learner_settings())

    def fresh(self, key: jax.Array) -> State:
        """A2C's fresh state, and a ring of its first policy: :meth:`init`'s state where
        it was computed (one member of a population)."""
        s = super().fresh(key)
        lag = self.config.actor_lag
        ring = lambda x: jnp.repeat(x[None], lag, axis=0)  # noqa: E731
        actors = None
        if lag:
            actors = Actors(jax.tree.map(ring, s.params.policy), jax.tree.map(ring, s.obs_norm),
                            jnp.int32(0))  # fmt: skip
        return State(s.params, s.opt_state, s.obs_norm, actors, s.hyperparameters, s.envs,
                     s.generation)  # fmt: skip

    def behaviour(self, state: State) -> State:
        """``state`` with the actors' policy and statistics in place of the learner's."""
        if state.actors is None:
            return state
        oldest = lambda x: x[state.actors.slot]  # noqa: E731
        policy = jax.tree.map(oldest, state.actors.policy)
        obs_norm = jax.tree.map(oldest, state.actors.obs_norm)
        return state.replace(params=state.params.replace(policy=policy), obs_norm=obs_norm)

    def pushed(self, state: State) -> Actors | None:
        """The ring with the learner's policy of ``state`` in place of the oldest entry."""
        actors = state.actors
        if actors is None:
            return None
        put = lambda ring, x: ring.at[actors.slot].set(x)  # noqa: E731
        return Actors(
            jax.tree.map(put, actors.policy, state.params.policy),
            jax.tree.map(put, actors.obs_norm, state.obs_norm),
            (actors.slot + 1) % self.config.actor_lag,
        )

    def local_step(self, state: State, key: jax.Array, axis: str | None = DP):
        """One iteration on this device's lanes: inside ``shard_map`` over ``axis``, or
        (``axis=None``) on one device, every lane there (a member of a population)."""
        collect_key, train_key = jax.random.split(key)
        envs, rollout = self.collect(self.behaviour(state), collect_key, axis)
        lanes = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
        segments = Segments(*map(lanes, jax.tree.leaves(rollout)), envs.obs)
        params, opt_state, losses = self.learner.update(
            state.params, state.opt_state, self._obs_norm(state), segments,
            state.hyperparameters, train_key, axis,
        )  # fmt: skip
        metrics = {**vec_env.metrics(state.envs, envs, axis), **losses}
        new = state.replace(
            params=params,
            opt_state=opt_state,
            obs_norm=self.merged_obs_norm(state, rollout.obs, axis),
            actors=self.pushed(state),
            envs=envs,
        )
        return new, metrics


registry.register_algorithm("impala", Config, IMPALA, "IMPALA: V-trace, lagged actors")

# --- IMPALA as a PBT member ----------------------------------------------------------------

#: IMPALA's settings as a PBT member: 5 gradient steps in PBT's default interval.
MEMBER_SETTINGS = Config(num_envs=8, unroll_length=25)


def split_member(state: State) -> tuple[Any, Any]:
    """A PBT member's parts: ``(networks, Adam state, observation statistics, actors'
    ring)``, which a replaced member copies, and its running episodes, which it keeps."""
    return (state.params, state.opt_state, state.obs_norm, state.actors), state.envs


def join_member(learner: Any, envs: Any, hyperparameters: Hyperparameters) -> State:
    """The state of a PBT member's parts (:func:`split_member`)."""
    params, opt_state, obs_norm, actors = learner
    return State(params, opt_state, obs_norm, actors, hyperparameters, envs, jnp.int32(0))


registry.register_learner(
    "impala",
    registry.LearnerSpec(
        member=registry.MemberPart(
            defaults=MEMBER_SETTINGS,
            member=algorithm_member(IMPALA, split_member, join_member),
            searchable=tuple(f.name for f in dataclasses.fields(Hyperparameters)),
            default_search=(
                ("learning_rate", 1e-4, 3e-3, True),
                ("entropy_cost", 1e-4, 3e-2, True),
                ("discount", 0.95, 0.999, False),
            ),
            losses=("loss", "policy_loss", "value_loss", "entropy", "abs_log_ratio"),
        ),
        description="IMPALA: V-trace, lagged actors, its own running episodes (a PBT member)",
    ),
)
