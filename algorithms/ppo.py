"""PPO: proximal policy optimisation on a batch of environments split over devices.

Schulman et al. (2017), "Proximal Policy Optimization Algorithms" (the
losses: :mod:`evorl_pop.rl.ppo`). One ``step`` is one PPO iteration::

    state (networks, Adam, obs normaliser, hyperparameters: replicated;
           num_envs running episodes: split P('DP'))
      | shard_map over DP: each device its slice of the environments
      |   unroll_length steps: sample from the policy, step, restart ended episodes
      |   GAE(lambda) with the value network that acted
      |   all_gather -> every device holds the whole batch (num_envs x unroll_length)
      |   num_epochs x num_minibatches gradient steps: the same permutation
      |     everywhere, each device its contiguous slice of a minibatch, pmean
      |   observation statistics: psum of the slices' sums, merged
      v
    state, metrics (training returns, losses: global)

Lane ``i`` (its actions, steps and resets) draws from ``fold_in(key, i)``
with ``i`` its global index, so 1, 2 and 4 devices give the same iteration.
Discrete actions use a categorical policy; continuous ones a tanh-squashed
Gaussian (as brax's PPO): its actions stay in bounds without clipping, so the
log-probabilities are those of the actions taken.

The searched hyperparameters (learning rate, clip range, entropy cost, GAE
lambda, discount) live in ``State.hyperparameters`` as traced scalars: a
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
from evorl_pop.rl.ppo import Hyperparameters, Params, PPOLearner, Rollout, Samples, Segments
from evorl_pop.tasks.obs_norm import ObsMoments, ObsNorm
from evorl_pop.tasks.policies import ACTIVATIONS

DP = dist.DP_AXIS_NAME


@dataclasses.dataclass(frozen=True)
class Config(data_parallel.LearnerConfig):
    """PPO settings: the task and environments of
    :class:`~evorl_pop.rl.data_parallel.LearnerConfig` (an iteration steps each of the
    ``num_envs`` environments ``unroll_length`` times), and these.

    The defaults are the paper's MuJoCo settings (2,048 steps per iteration,
    minibatches of 64, 10 epochs, no entropy bonus) with gradient clipping and
    observation normalisation: they reach CartPole-v1's 500 within about 60k
    steps, and a deterministic return of about 850 on brax hopper after 800k
    (``examples/ppo_brax.py``).

    Attributes:
      num_minibatches: minibatches per epoch; a minibatch holds
        ``num_envs * unroll_length / num_minibatches`` samples.
      num_epochs: passes over the iteration's samples.
      learning_rate: Adam's step size.
      clip_epsilon: the clip range of the probability ratio.
      entropy_cost: the weight of the entropy bonus.
      gae_lambda: GAE's lambda.
      discount: gamma.
      vf_coefficient: the weight of the value loss.
      max_grad_norm: clip the global gradient norm to it (``null``: no clip).
      normalize_advantage: standardise each minibatch's advantages.
      advantages: ``'iteration'``: GAE once per iteration, with the value network
        that acted (the paper's); ``'minibatch'``: again before every gradient step,
        with the value network being trained, over minibatches of whole lanes
        (brax's PPO; ``num_envs`` must then split into the minibatches).
      normalize_observations: normalise observations with running statistics.
      obs_norm_update: when those statistics take in an iteration's observations:
        ``'before'`` its epochs (brax's order: the epochs fit the networks to the
        statistics they will act with next; the probability ratios then start a
        little off 1) or ``'after'`` them (the epochs see the observations as the
        policy did; learns more slowly: ``docs/guides/learners.md``).
      reward_scaling: rewards are multiplied by it for learning (not in the metrics).
      policy_init_scale: the policy's output layer starts with weights this times
        the usual, so that every state starts at nearly the same action distribution
        (1.0: flax's usual initialisation, as brax's PPO has; 0.01 returns more on brax
        hopper with brax's settings, varies less over seeds, and learns CartPole and
        Acrobot faster: ``docs/guides/learners.md``).
      policy_hidden_sizes: hidden widths of the policy network.
      value_hidden_sizes: hidden widths of the value network.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      network: ``'auto'`` (the CNN for image observations), ``'mlp'`` or ``'cnn'``.
    """

    num_minibatches: int = 32
    num_epochs: int = 10
    learning_rate: float = 3e-4
    clip_epsilon: float = 0.2
    entropy_cost: float = 0.0
    gae_lambda: float = 0.95
    discount: float = 0.99
    vf_coefficient: float = 0.5
    max_grad_norm: float | None = 0.5
    normalize_advantage: bool = True
    advantages: str = "iteration"
    normalize_observations: bool = True
    obs_norm_update: str = "before"
    reward_scaling: float = 1.0
    policy_init_scale: float = 0.01
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    value_hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    network: str = "auto"

    HYPERPARAMETERS = Hyperparameters

    def validate(self) -> None:
        """Raises :class:`~evorl_pop.base.ConfigError` naming a value that cannot run."""
        vec_env.check_task(self.task, "ppo")  # stepped in JAX or on the host
        check_config(self, least=vec_env.LEAST)
        choices = {
            "activation": tuple(ACTIVATIONS),
            "network": ("auto", "mlp", "cnn"),
            "advantages": ("iteration", "minibatch"),
            "obs_norm_update": ("before", "after"),
        }
        check_config(
            self,
            choices,
            {"num_minibatches": 1, "num_epochs": 1},
            positive=("policy_init_scale",),
            nonnegative=("learning_rate", "entropy_cost", "vf_coefficient", "reward_scaling"),
        )
        batch = self.num_envs * self.unroll_length
        if batch % self.num_minibatches:
            raise ConfigError(
                f"num_envs x unroll_length = {batch} samples do not split into "
                f"num_minibatches={self.num_minibatches} equal minibatches; change one of them."
            )
        for name, low, high in (
            ("clip_epsilon", 0.0, 1.0),
            ("gae_lambda", 0.0, 1.0),
            ("discount", 0.0, 1.0),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"{name} must be in [{low}, {high}], got {value}.")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0 or null, got {self.max_grad_norm}.")
        if self.advantages == "minibatch" and self.num_envs % self.num_minibatches:
            raise ConfigError(
                f"advantages='minibatch' takes minibatches of whole environments, but "
                f"num_envs={self.num_envs} do not split into num_minibatches="
                f"{self.num_minibatches}; change one of them."
            )
        for name in ("policy_hidden_sizes", "value_hidden_sizes"):
            if any(width < 1 for width in getattr(self, name)):
                raise ConfigError(f"{name} must be positive widths, got {getattr(self, name)}.")


@flax.struct.dataclass
class State:
    """Everything that changes between iterations."""

    params: Params  # the policy and value networks
    opt_state: Any  # Adam's state (after the clip's)
    obs_norm: ObsNorm  # running observation statistics (unused when not normalising)
    hyperparameters: Hyperparameters  # the traced searchable settings
    envs: Any  # the running episodes (vec_env's EnvBatch, or a HostBatch), split over DP
    generation: jax.Array  # int32: iterations so far


class PPO(data_parallel.DataParallel):
    """PPO with its environments and minibatches split over the devices of ``mesh``:
    ``PPO(config, mesh)`` with a :class:`Config`, as
    :class:`~evorl_pop.rl.data_parallel.DataParallel` takes them.

    A :meth:`step` is one PPO iteration: ``num_envs x unroll_length`` steps, then the
    epochs; its metrics' losses are ``loss``, ``policy_loss``, ``value_loss``,
    ``entropy`` and ``approx_kl``.
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        super().__init__(config, mesh)
        if config.network == "cnn" and len(self.env.spec.obs_shape) != 3:
            raise ConfigError(
                f"network='cnn' needs image observations (height, width, channels), but "
                f"{config.task} observes shape {self.env.spec.obs_shape}; use 'mlp' or 'auto'."
            )
        n = self.mesh.size
        if config.advantages == "minibatch":
            size = config.num_envs // config.num_minibatches
            data_parallel.check_split("num_minibatches", size, n, "A minibatch's environments")
        else:
            size = config.num_envs * config.unroll_length // config.num_minibatches
            data_parallel.check_split("num_minibatches", size, n, "A minibatch's samples")
        self.learner = PPOLearner(
            self.env.spec,
            policy_hidden_sizes=config.policy_hidden_sizes,
            value_hidden_sizes=config.value_hidden_sizes,
            activation=config.activation,
            network=config.network,
            vf_coefficient=config.vf_coefficient,
            max_grad_norm=config.max_grad_norm,
            normalize_advantage=config.normalize_advantage,
            num_minibatches=config.num_minibatches,
            num_epochs=config.num_epochs,
            reward_scaling=config.reward_scaling,
            policy_init_scale=config.policy_init_scale,
        )
        self.shard_steps(State)

    def fresh(self, key: jax.Array) -> State:
        """Fresh networks and Adam, and ``num_envs`` fresh episodes: :meth:`init`'s state where
        it was computed (one member of a population)."""
        params_key, env_key = jax.random.split(key)
        cfg = self.config
        params = self.learner.init(params_key)
        envs = self.envs.reset_batch(vec_env.lane_keys(env_key, jnp.arange(cfg.num_envs)))
        return State(
            params=params,
            opt_state=self.learner.optimizer(cfg.learning_rate).init(params),
            obs_norm=ObsNorm.create(self.env.spec.obs_shape),
            hyperparameters=cfg.hyperparameters(),
            envs=envs,
            generation=jnp.int32(0),
        )

    def _obs_norm(self, state: State) -> ObsNorm | None:
        return state.obs_norm if self.config.normalize_observations else None

    def collect(self, state: State, key: jax.Array, dp_axis_name: str | None = None):
        """:meth:`unroll` of this device's lanes with the sampling policy: ``(envs,
        rollout)``, the lanes after it and a :class:`Rollout` of what it recorded."""
        obs_norm = self._obs_norm(state)
        policy = jax.vmap(self.learner.act, in_axes=(None, None, 0, 0))

        def act(obs, keys):
            raw, action, log_prob = policy(state.params, obs_norm, obs, keys)
            return action, (raw, log_prob)

        envs, (obs, (raw, log_prob), out) = self.unroll(state.envs, act, key, dp_axis_name)
        return envs, Rollout(obs, raw, log_prob, out.reward, out.terminal, out.truncated)

    def local_step(self, state: State, key: jax.Array, axis: str | None = DP):
        """One iteration on this device's lanes: inside ``shard_map`` over ``axis``, or
        (``axis=None``) on one device, every lane there (a member of a population)."""
        collect_key, train_key = jax.random.split(key)
        obs_norm, hp = self._obs_norm(state), state.hyperparameters
        envs, rollout = self.collect(state, collect_key, axis)
        lanes = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
        if self.config.advantages == "minibatch":  # computed in every minibatch
            samples = Segments(*map(lanes, jax.tree.leaves(rollout)), envs.obs)
        else:
            advantage, target = self.learner.advantages(state.params, obs_norm, rollout,
                                                        envs.obs, hp)  # fmt: skip
            samples = Samples(rollout.obs, rollout.raw_action, rollout.log_prob, advantage, target)
            samples = jax.tree.map(lanes, samples)
        # Every device gathers the whole batch, lanes in global order, each lane's steps in turn.
        samples = dist.all_gather(samples, axis, tiled=True)
        if isinstance(samples, Samples):
            samples = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), samples)
        merged = state.obs_norm
        if self.config.normalize_observations:
            seen = rollout.obs.reshape(-1, *rollout.obs.shape[2:]).astype(jnp.float32)
            moments = ObsMoments(jnp.float32(seen.shape[0]), seen.sum(0), (seen**2).sum(0))
            merged = merged.merge(dist.psum(moments, axis))
            # "after": the epochs see the observations as the policy did.
            obs_norm = merged if self.config.obs_norm_update == "before" else obs_norm
        params, opt_state, losses = self.learner.train(
            state.params, state.opt_state, obs_norm, samples, hp, train_key, axis
        )
        obs_norm = merged
        metrics = {**vec_env.metrics(state.envs, envs, axis), **losses}
        new = state.replace(params=params, opt_state=opt_state, obs_norm=obs_norm, envs=envs)
        return new, metrics

    def acting(self, state: State) -> Acting:
        """The deterministic policy (the distribution's mode) with its observation
        statistics (``evorl-pop render``)."""
        params = (state.params.policy, self._obs_norm(state))
        return Acting(
            self.env, self.learner.deterministic_policy, params,
            episode_length=self.config.episode_length,
        )  # fmt: skip


registry.register_algorithm("ppo", Config, PPO, "PPO: clipped surrogate, GAE(lambda)")

# --- PPO as a PBT member -----------------------------------------------------------------

#: PPO's settings as a PBT member: fewer epochs and minibatches of iterations that divide
#: PBT's interval.
MEMBER_SETTINGS = Config(num_envs=8, unroll_length=125, num_minibatches=4, num_epochs=4)


def split_member(state: State) -> tuple[Any, Any]:
    """A PBT member's parts: ``(networks, Adam state, observation statistics)``, which
    a replaced member copies, and its running episodes, which it keeps."""
    return (state.params, state.opt_state, state.obs_norm), state.envs


def join_member(learner: Any, envs: Any, hyperparameters: Hyperparameters) -> State:
    """The state of a PBT member's parts (:func:`split_member`)."""
    params, opt_state, obs_norm = learner
    return State(params, opt_state, obs_norm, hyperparameters, envs, jnp.int32(0))


registry.register_learner(
    "ppo",
    registry.LearnerSpec(
        member=registry.MemberPart(
            defaults=MEMBER_SETTINGS,
            member=algorithm_member(PPO, split_member, join_member),
            searchable=tuple(f.name for f in dataclasses.fields(Hyperparameters)),
            default_search=(
                ("learning_rate", 1e-4, 3e-3, True),
                ("clip_epsilon", 0.1, 0.3, False),
                ("entropy_cost", 1e-4, 3e-2, True),
                ("gae_lambda", 0.9, 1.0, False),
                ("discount", 0.95, 0.999, False),
            ),
            losses=("loss", "policy_loss", "value_loss", "entropy", "approx_kl"),
        ),
        description="PPO: on-policy, its own running episodes (a PBT member)",
    ),
)
