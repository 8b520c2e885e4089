"""A2C: synchronous advantage actor-critic on a batch of environments split over devices.

Mnih et al. (2016), "Asynchronous Methods for Deep Reinforcement Learning", in its
synchronous form (every environment steps with the same parameters, one gradient
step per unroll), with the advantages of GAE(lambda) (Schulman et al. 2016)::

    A_t = GAE(lambda) of the unroll, with the value network that acted   (rl.ppo.gae)
    L   = -E[log pi(a_t|s_t) A_t] + c_v 1/2 E[(V(s_t) - (A_t + V_old(s_t)))^2]
          - c_ent E[H[pi(.|s_t)]]

One ``step``::

    state (networks, Adam, obs normaliser, hyperparameters: replicated;
           num_envs running episodes: split P('DP'))
      | shard_map over DP: each device its slice of the environments
      |   unroll_length steps: sample from the policy, step, restart ended episodes
      |   GAE(lambda) with the value network that acted, on this device's lanes
      |   one gradient step: each device differentiates its own lanes' samples, pmean
      |   observation statistics: psum of the slices' sums, merged after the step
      v
    state, metrics (training returns, losses: global)

The networks, the acting, GAE and the gradient step are PPO's
(:class:`~evorl_pop.rl.ppo.PPOLearner`): only the loss differs (no ratio, no clip)
and there is one step per unroll, on the whole batch, so nothing is gathered: each
device keeps its own lanes, which are a contiguous slice of the global batch
(lane ``i`` acts from ``fold_in(key, i)``, and a continuous policy's entropy
sample comes from each sample's global position), and 1, 2 and 4 devices take the
same step. The statistics of the observations are merged after the step, so the
gradient sees the observations as the policy did.

The searched hyperparameters (learning rate, entropy cost, GAE lambda, discount)
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
from evorl_pop.algorithms import ppo as ppo_algorithm
from evorl_pop.algorithms.pbt_members import algorithm_member
from evorl_pop.base import ConfigError, check_config
from evorl_pop.rl import data_parallel, vec_env
from evorl_pop.rl.ppo import PPOLearner, Samples, entropy_loss, value_loss
from evorl_pop.tasks.obs_norm import ObsMoments, ObsNorm
from evorl_pop.tasks.policies import ACTIVATIONS

DP = dist.DP_AXIS_NAME

# --- the math ------------------------------------------------------------------------


@flax.struct.dataclass
class Hyperparameters:
    """A2C's searchable settings, float32 scalars: changing them does not recompile."""

    learning_rate: jax.Array
    entropy_cost: jax.Array
    gae_lambda: jax.Array
    discount: jax.Array

    @classmethod
    def create(cls, **values: float) -> Hyperparameters:
        """Hyperparameters from Python numbers, e.g. ``create(learning_rate=7e-4, ...)``."""
        return cls(**{k: jnp.float32(v) for k, v in values.items()})


def policy_gradient_loss(log_prob: jax.Array, advantage: jax.Array) -> jax.Array:
    """``-E[log pi(a|s) A]``, the batch mean; the advantages carry no gradient."""
    return -jnp.mean(log_prob * jax.lax.stop_gradient(advantage))


class A2CLearner(PPOLearner):
    """PPO's networks, acting and GAE with the advantage actor-critic loss, one gradient
    step on the whole batch (its arguments are :class:`~evorl_pop.rl.ppo.PPOLearner`'s
    but the epochs and minibatches)."""

    def __init__(self, spec, **settings: Any):
        super().__init__(spec, num_minibatches=1, num_epochs=1, **settings)

    def loss(
        self,
        params: Any,
        obs_norm: ObsNorm | None,
        batch: Samples,
        hp: Any,
        key: jax.Array,
        index: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The A2C loss of a (slice of a) batch, its advantages ready.

        Args:
          params: the networks being trained.
          obs_norm: the normaliser the samples were collected with.
          batch: the samples (``log_prob`` is not used: the policy is the one that acted).
          hp: the hyperparameters (``entropy_cost``).
          key: the batch's key (the same on every device).
          index: each sample's position in the global batch: its entropy sample
            uses ``fold_in(key, index)``.

        Returns:
          ``(loss, parts)`` with ``policy_loss``, ``value_loss`` and ``entropy``.
        """
        obs = self._normalize(obs_norm, batch.obs)
        out = self.policy_net.apply(params.policy, obs)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
        log_prob, entropy = jax.vmap(self.distribution.log_prob_and_entropy)(
            out, batch.raw_action, keys
        )
        value = self.value_net.apply(params.value, obs)[..., 0]
        policy = policy_gradient_loss(log_prob, batch.advantage)
        v_loss = value_loss(value, batch.target)
        total = policy + self.vf_coefficient * v_loss + entropy_loss(entropy, hp.entropy_cost)
        return total, {"policy_loss": policy, "value_loss": v_loss, "entropy": jnp.mean(entropy)}

    def train(
        self,
        params: Any,
        opt_state: Any,
        obs_norm: ObsNorm | None,
        samples: Samples,
        hp: Any,
        key: jax.Array,
        dp_axis_name: str | None = None,
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One gradient step on the batch: ``samples`` is this device's contiguous slice
        of it (:meth:`~evorl_pop.rl.ppo.PPOLearner.update`, whose metrics are global)."""
        return self.update(params, opt_state, obs_norm, samples, hp, key, dp_axis_name)


# --- the algorithm -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ActorCriticSettings(data_parallel.LearnerConfig):
    """The settings A2C and IMPALA share: the task and environments of
    :class:`~evorl_pop.rl.data_parallel.LearnerConfig`, and these.

    Attributes:
      learning_rate: Adam's step size.
      entropy_cost: the weight of the entropy bonus.
      discount: gamma.
      vf_coefficient: the weight of the value loss.
      max_grad_norm: clip the global gradient norm to it (``null``: no clip).
      normalize_observations: normalise observations with running statistics
        (merged after each gradient step).
      reward_scaling: rewards are multiplied by it for learning (not in the metrics).
      policy_init_scale: the policy's output layer starts with weights this times the
        usual (PPO's setting).
      policy_hidden_sizes: hidden widths of the policy network.
      value_hidden_sizes: hidden widths of the value network.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      network: ``'auto'`` (the CNN for image observations), ``'mlp'`` or ``'cnn'``.
    """

    learning_rate: float = 1e-3
    entropy_cost: float = 0.01
    discount: float = 0.99
    vf_coefficient: float = 0.5
    max_grad_norm: float | None = 0.5
    normalize_observations: bool = True
    reward_scaling: float = 1.0
    policy_init_scale: float = 0.01
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    value_hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    network: str = "auto"

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        vec_env.check_task(self.task, type(self).__module__.rpartition(".")[2])
        check_config(self, least=vec_env.LEAST)
        check_config(
            self,
            {"activation": tuple(ACTIVATIONS), "network": ("auto", "mlp", "cnn")},
            positive=("policy_init_scale",),
            nonnegative=("learning_rate", "entropy_cost", "vf_coefficient", "reward_scaling"),
            widths=("policy_hidden_sizes", "value_hidden_sizes"),
        )
        if not 0.0 <= self.discount <= 1.0:
            raise ConfigError(f"discount must be in [0.0, 1.0], got {self.discount}.")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0 or null, got {self.max_grad_norm}.")

    def learner_settings(self) -> dict[str, Any]:
        """The :class:`~evorl_pop.rl.ppo.PPOLearner` arguments these settings give."""
        names = (
            "policy_hidden_sizes",
            "value_hidden_sizes",
            "activation",
            "network",
            "vf_coefficient",
            "max_grad_norm",
            "reward_scaling",
            "policy_init_scale",
        )
        return {name: getattr(self, name) for name in names}


@dataclasses.dataclass(frozen=True)
class Config(ActorCriticSettings):
    """A2C settings (:class:`ActorCriticSettings`, and these); with
    ``learning_rate=3e-3`` they reach a mean return of 450 on CartPole-v1 in about
    120k steps (``docs/guides/learners.md``).

    Attributes:
      num_envs: environments stepped together (the batch of a gradient step is
        ``num_envs x unroll_length`` samples).
      unroll_length: steps of every environment per gradient step.
      gae_lambda: GAE's lambda (1.0: the n-step returns of the unroll).
      normalize_advantage: standardise the batch's advantages.
    """

    num_envs: int = 16
    unroll_length: int = 16
    gae_lambda: float = 0.95
    normalize_advantage: bool = True

    HYPERPARAMETERS = Hyperparameters

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        super().validate()
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ConfigError(f"gae_lambda must be in [0.0, 1.0], got {self.gae_lambda}.")


class A2C(ppo_algorithm.PPO):
    """A2C with its environments split over the devices of ``mesh``: ``A2C(config,
    mesh)`` with a :class:`Config`, as :class:`~evorl_pop.rl.data_parallel.DataParallel`
    takes them. Its state is PPO's (:class:`evorl_pop.algorithms.ppo.State`), and so
    are its acting and evaluation.

    A :meth:`step` is ``num_envs x unroll_length`` environment steps and one gradient
    step; its metrics' losses are ``loss``, ``policy_loss``, ``value_loss`` and
    ``entropy``.
    """

    #: The state class (its ``envs`` split over ``'DP'``, the rest replicated).
    STATE = ppo_algorithm.State

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        data_parallel.DataParallel.__init__(self, config, mesh)
        self.check_network(config)
        self.learner = self.make_learner(config)
        self.shard_steps(self.STATE)

    def check_network(self, config: ActorCriticSettings) -> None:
        """ConfigError where ``network='cnn'`` meets observations that are no images."""
        if config.network == "cnn" and len(self.env.spec.obs_shape) != 3:
            raise ConfigError(
                f"network='cnn' needs image observations (height, width, channels), but "
                f"{config.task} observes shape {self.env.spec.obs_shape}; use 'mlp' or 'auto'."
            )

    def make_learner(self, config: Config) -> A2CLearner:
        """The learner of ``config``."""
        return A2CLearner(
            self.env.spec,
            normalize_advantage=config.normalize_advantage,
            **config.learner_settings(),
        )

    def merged_obs_norm(self, state: Any, obs: jax.Array, axis: str | None) -> ObsNorm:
        """The observation statistics with an unroll's observations (every device's) in."""
        if not self.config.normalize_observations:
            return state.obs_norm
        seen = obs.reshape(-1, *obs.shape[2:]).astype(jnp.float32)
        moments = ObsMoments(jnp.float32(seen.shape[0]), seen.sum(0), (seen**2).sum(0))
        return state.obs_norm.merge(dist.psum(moments, axis))

    def local_step(self, state: Any, key: jax.Array, axis: str | None = DP):
        """One iteration on this device's lanes: inside ``shard_map`` over ``axis``, or
        (``axis=None``) on one device, every lane there (a member of a population)."""
        collect_key, train_key = jax.random.split(key)
        obs_norm, hp = self._obs_norm(state), state.hyperparameters
        envs, rollout = self.collect(state, collect_key, axis)
        advantage, target = self.learner.advantages(state.params, obs_norm, rollout, envs.obs, hp)
        samples = Samples(rollout.obs, rollout.raw_action, rollout.log_prob, advantage, target)
        # This device's lanes, each lane's steps in turn: a contiguous slice of the batch.
        samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), samples)
        params, opt_state, losses = self.learner.train(
            state.params, state.opt_state, obs_norm, samples, hp, train_key, axis
        )
        metrics = {**vec_env.metrics(state.envs, envs, axis), **losses}
        new = state.replace(
            params=params,
            opt_state=opt_state,
            obs_norm=self.merged_obs_norm(state, rollout.obs, axis),
            envs=envs,
        )
        return new, metrics


registry.register_algorithm("a2c", Config, A2C, "A2C: advantage actor-critic, GAE(lambda)")

#: A2C's settings as a PBT member: 25 gradient steps in PBT's default interval.
MEMBER_SETTINGS = Config(num_envs=8, unroll_length=5)

registry.register_learner(
    "a2c",
    registry.LearnerSpec(
        member=registry.MemberPart(
            defaults=MEMBER_SETTINGS,
            member=algorithm_member(A2C, ppo_algorithm.split_member, ppo_algorithm.join_member),
            searchable=tuple(f.name for f in dataclasses.fields(Hyperparameters)),
            default_search=(
                ("learning_rate", 1e-4, 3e-3, True),
                ("entropy_cost", 1e-4, 3e-2, True),
                ("gae_lambda", 0.9, 1.0, False),
                ("discount", 0.95, 0.999, False),
            ),
            losses=("loss", "policy_loss", "value_loss", "entropy"),
        ),
        description="A2C: on-policy, its own running episodes (a PBT member)",
    ),
)
