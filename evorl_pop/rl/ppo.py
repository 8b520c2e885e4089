"""PPO: the clipped surrogate objective, GAE and the minibatch epochs of a learner.

Schulman, Wolski, Dhariwal, Radford & Klimov (2017), "Proximal Policy
Optimization Algorithms"; the advantages are GAE(lambda) of Schulman, Moritz,
Levine, Jordan & Abbeel (2016), "High-Dimensional Continuous Control Using
Generalized Advantage Estimation". With ``rho_t = pi(a_t|s_t) / pi_old(a_t|s_t)``::

    delta_t = r_t + gamma (1 - term_t) V(s_{t+1}) - V(s_t)            # PPO Eq. (12)
    A_t     = delta_t + gamma lambda (1 - done_t) A_{t+1}             # PPO Eq. (11)
    L_clip  = -E[min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)]  # PPO Eq. (7)
    L_v     = 1/2 E[(V(s_t) - (A_t + V_old(s_t)))^2]
    L       = L_clip + c_v L_v - c_ent E[H[pi(.|s_t)]]                # PPO Eq. (9)

An unroll of a batch of environments gives the advantages once, with the
value function that acted (as the paper's and CleanRL's PPO do); given
:class:`Segments`, :meth:`PPOLearner.train` recomputes them before every
gradient step with the value function being trained, over minibatches of
whole environments (as brax's PPO does). A step at the time limit has no successor in
the unroll (the environment restarted), so it carries no advantage and no
value target (brax's default); a terminal step bootstraps from zero.

The gradient steps go through :func:`evorl_pop.distributed.agent_gradient_update`
on an :class:`AgentState` (the networks it trains, as its ``params``, beside the
observation normaliser): with ``dp_axis_name`` set, every device holds the whole
batch of samples, draws the same permutation, and differentiates its contiguous
slice of each minibatch; the gradients are averaged with ``pmean``, the step's one
collective (the losses :meth:`PPOLearner.train` reports are averaged over the
devices once, after the epochs). Advantages are normalised with the minibatch's global mean and
std, which each device computes from the whole minibatch it holds (of lanes'
segments, whose advantages each device computes for its own, the statistics
take a ``pmean``), and the entropy sample
of a continuous policy comes from each sample's global position, so 1, 2 and
4 devices take the same step.

The hyperparameters a search may change (:class:`Hyperparameters`) are traced
arguments of every function here, never Python constants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from evorl_pop import distributed as dist
from evorl_pop.base import EnvSpec
from evorl_pop.rl import distributions, replay
from evorl_pop.tasks.obs_norm import ObsNorm
from evorl_pop.tasks.policies import CNN, MLP, mask_logits

#: Normalised observations are clipped to +-this (brax does not clip; 5, ObsNorm's
#: default, hid how far CartPole's cart had drifted once episodes grew long).
OBS_CLIP = 10.0

# --- the math ------------------------------------------------------------------------


@flax.struct.dataclass
class Hyperparameters:
    """PPO's searchable settings, float32 scalars: changing them does not recompile."""

    learning_rate: jax.Array
    clip_epsilon: jax.Array
    entropy_cost: jax.Array
    gae_lambda: jax.Array
    discount: jax.Array

    @classmethod
    def create(cls, **values: float) -> Hyperparameters:
        """Hyperparameters from Python numbers, e.g. ``create(learning_rate=3e-4, ...)``."""
        return cls(**{k: jnp.float32(v) for k, v in values.items()})


def gae(
    reward: jax.Array,
    value: jax.Array,
    bootstrap_value: jax.Array,
    terminal: jax.Array,
    truncated: jax.Array,
    discount: jax.Array | float,
    gae_lambda: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimates of an unroll, and the value targets.

    Args:
      reward: shape ``(T, ...)``: the reward of each step.
      value: ``V(s_t)``, shape ``(T, ...)``.
      bootstrap_value: ``V(s_T)`` of the state after the unroll, shape ``(...)``.
      terminal: 1.0 where the step ended the episode before its time limit.
      truncated: 1.0 where it ended at the time limit: no advantage, no target.
      discount: gamma.
      gae_lambda: lambda.

    Returns:
      ``(advantage, target)``, shape ``(T, ...)``; ``target = advantage + value``.
    """
    next_value = jnp.concatenate([value[1:], bootstrap_value[None]], axis=0)
    live = 1.0 - truncated
    delta = (reward + discount * (1.0 - terminal) * next_value - value) * live  # Eq. (12)
    carry = (1.0 - terminal) * live * discount * gae_lambda

    def back(advantage, xs):
        delta, carry = xs
        advantage = delta + carry * advantage  # Eq. (11), backwards in time
        return advantage, advantage

    _, advantage = jax.lax.scan(back, jnp.zeros_like(bootstrap_value), (delta, carry), reverse=True)
    return advantage, advantage + value  # the target is V itself where truncated


def clipped_surrogate_loss(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantage: jax.Array,
    clip_epsilon: jax.Array | float,
) -> jax.Array:
    """``-E[min(rho A, clip(rho, 1 - eps, 1 + eps) A)]`` (Eq. 7), the batch mean."""
    ratio = jnp.exp(log_prob - old_log_prob)
    clipped = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    return -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))


def value_loss(value: jax.Array, target: jax.Array) -> jax.Array:
    """``1/2 E[(V - target)^2]``, the batch mean."""
    return 0.5 * jnp.mean((value - target) ** 2)


def entropy_loss(entropy: jax.Array, entropy_cost: jax.Array | float) -> jax.Array:
    """The entropy bonus as a loss term: ``-c_ent E[H]``."""
    return -entropy_cost * jnp.mean(entropy)


def normalize_advantages(
    advantage: jax.Array, dp_axis_name: str | None = None, whole: jax.Array | None = None
) -> jax.Array:
    """Advantages standardised with the mean and std of the *global* minibatch.

    Args:
      advantage: this device's slice (equal slices on every device).
      dp_axis_name: the data-parallel axis, or ``None``.
      whole: the global minibatch's advantages, where every device holds them
        all: the statistics come from them, with no collective (two fewer
        rounds between devices per gradient step).

    Returns:
      ``(A - mean) / (std + 1e-8)``.
    """
    if whole is not None:
        mean = jnp.mean(whole)
        var = jnp.mean((whole - mean) ** 2)
    else:
        mean = dist.pmean(jnp.mean(advantage), dp_axis_name)
        var = dist.pmean(jnp.mean((advantage - mean) ** 2), dp_axis_name)
    return (advantage - mean) / (jnp.sqrt(var) + 1e-8)


# --- the learner ---------------------------------------------------------------------


@flax.struct.dataclass
class Params:
    policy: Any  # the policy network: distribution parameters of one observation
    value: Any  # the value network: V(s)


@flax.struct.dataclass
class AgentState:
    """The agent state a gradient step takes (:func:`evorl_pop.distributed.agent_gradient_update`
    trains its ``params``, the seed's default ``detach_fn`` / ``attach_fn``)."""

    params: Params  # both networks, trained together on the one PPO loss
    obs_norm: ObsNorm | None  # the normaliser the samples were collected with, or None


@flax.struct.dataclass
class Rollout:
    """What an unroll recorded; leaves shape=(unroll_length, num_envs, ...)."""

    obs: jax.Array  # raw observations, before normalisation
    raw_action: jax.Array  # the distribution's samples (see rl.distributions)
    log_prob: jax.Array  # their log-probabilities under the acting policy
    reward: jax.Array
    terminal: jax.Array  # float32
    truncated: jax.Array  # float32


@flax.struct.dataclass
class Samples:
    """Training samples; leaves lead with the sample axis."""

    obs: jax.Array
    raw_action: jax.Array
    log_prob: jax.Array
    advantage: jax.Array
    target: jax.Array


@flax.struct.dataclass
class Segments:
    """Whole lanes of an unroll, for advantages recomputed in every minibatch; leaves
    lead with the lane axis, then time (``bootstrap_obs``: the lane axis alone)."""

    obs: jax.Array
    raw_action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    terminal: jax.Array
    truncated: jax.Array
    bootstrap_obs: jax.Array  # the observations after the unroll


def torso(
    spec: EnvSpec,
    hidden_sizes: Sequence[int],
    out_dim: int,
    activation: str,
    kind: str,
    out_scale: float = 1.0,
):
    """The project's CNN for images (``kind='cnn'``, or ``'auto'`` and rank-3 observations),
    else its MLP on the flattened observation; ``out_scale`` scales the output layer's
    initial weights."""
    if kind == "cnn" or (kind == "auto" and len(spec.obs_shape) == 3):
        return CNN(tuple(hidden_sizes), out_dim, activation, out_scale=out_scale)
    return MLP(tuple(hidden_sizes), out_dim, activation, len(spec.obs_shape), out_scale)


class PPOLearner:
    """PPO's networks, losses and minibatch epochs for one environment spec.

    Args:
      spec: the environment's spec (discrete or continuous actions).
      policy_hidden_sizes: hidden widths of the policy network.
      value_hidden_sizes: hidden widths of the value network.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      network: ``'auto'`` (a CNN for image observations), ``'mlp'`` or ``'cnn'``.
      vf_coefficient: ``c_v``, the weight of the value loss.
      max_grad_norm: clip the global gradient norm to this (``None``: no clip).
      normalize_advantage: standardise each minibatch's advantages.
      num_minibatches: minibatches per epoch.
      num_epochs: passes over the batch per update.
      reward_scaling: rewards are multiplied by it before the advantages.
      policy_init_scale: the policy's output layer starts with weights this times
        the usual: a small one starts every state at nearly the same action
        distribution (uniform logits; a tanh-Gaussian centred in the action box, its
        scale ``softplus(0)``), which the first gradients then shape (Andrychowicz
        et al. 2021, "What Matters for On-Policy Deep Actor-Critic Methods").
    """

    def __init__(
        self,
        spec: EnvSpec,
        policy_hidden_sizes: Sequence[int] = (64, 64),
        value_hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        network: str = "auto",
        vf_coefficient: float = 0.5,
        max_grad_norm: float | None = 0.5,
        normalize_advantage: bool = True,
        num_minibatches: int = 4,
        num_epochs: int = 4,
        reward_scaling: float = 1.0,
        policy_init_scale: float = 0.01,
    ):
        self.spec = spec
        self.distribution = distributions.for_spec(spec)
        size = self.distribution.param_size
        self.policy_net = torso(
            spec, policy_hidden_sizes, size, activation, network, policy_init_scale
        )
        self.value_net = torso(spec, value_hidden_sizes, 1, activation, network)
        self.vf_coefficient = vf_coefficient
        self.max_grad_norm = max_grad_norm
        self.normalize_advantage = normalize_advantage
        self.num_minibatches = num_minibatches
        self.num_epochs = num_epochs
        self.reward_scaling = reward_scaling

    def init(self, key: jax.Array) -> Params:
        """Fresh policy and value networks."""
        policy_key, value_key = jax.random.split(key)
        obs = jnp.zeros(self.spec.obs_shape)
        return Params(self.policy_net.init(policy_key, obs), self.value_net.init(value_key, obs))

    def optimizer(self, learning_rate: jax.Array | float) -> optax.GradientTransformation:
        """Adam (after global-norm clipping); a traced rate leaves its state's structure as is."""
        adam = optax.adam(learning_rate)
        if self.max_grad_norm is None:
            return adam
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), adam)

    # --- acting ----------------------------------------------------------------------

    @staticmethod
    def _normalize(obs_norm: ObsNorm | None, obs: jax.Array) -> jax.Array:
        return obs if obs_norm is None else obs_norm.normalize(obs, OBS_CLIP)

    def act(
        self, params: Params, obs_norm: ObsNorm | None, obs: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One observation's sampled action.

        Args:
          params: the networks.
          obs_norm: the observation normaliser, or ``None``.
          obs: one raw observation.
          key: this observation's key.

        Returns:
          ``(raw, action, log_prob)``: the distribution's sample, the action
            the environment takes, and its log-probability.
        """
        out = self.policy_net.apply(params.policy, self._normalize(obs_norm, obs))
        out = mask_logits(out, obs, self.spec)  # the raw observation's action mask
        raw, log_prob = self.distribution.sample_and_log_prob(out, key)
        return raw, self.distribution.to_action(raw), log_prob

    def deterministic_policy(self, params: tuple[Any, ObsNorm | None], obs: jax.Array):
        """The mode's action: ``params`` is ``(policy params, obs_norm)``, as
        :func:`evorl_pop.tasks.rollout.evaluate_episodes` passes one object to the policy."""
        policy, obs_norm = params
        out = self.policy_net.apply(policy, self._normalize(obs_norm, obs))
        out = mask_logits(out, obs, self.spec)
        return self.distribution.to_action(self.distribution.mode(out))

    def values(self, params: Params, obs_norm: ObsNorm | None, obs: jax.Array) -> jax.Array:
        """``V(s)`` of observations with any leading axes."""
        return self.value_net.apply(params.value, self._normalize(obs_norm, obs))[..., 0]

    def segment_samples(
        self, params: Params, obs_norm: ObsNorm | None, segments: Segments, hp: Hyperparameters
    ) -> Samples:
        """Lanes' samples, their advantages from the value network ``params`` holds now
        (brax's PPO); flattened lane by lane, each lane's steps in turn."""
        time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
        fields = dataclasses.fields(Rollout)
        rollout = Rollout(*(time_major(getattr(segments, f.name)) for f in fields))
        advantage, target = self.advantages(params, obs_norm, rollout, segments.bootstrap_obs, hp)
        lanes = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        return Samples(
            obs=lanes(segments.obs),
            raw_action=lanes(segments.raw_action),
            log_prob=lanes(segments.log_prob),
            advantage=lanes(time_major(advantage)),
            target=lanes(time_major(target)),
        )

    def advantages(
        self,
        params: Params,
        obs_norm: ObsNorm | None,
        rollout: Rollout,
        bootstrap_obs: jax.Array,
        hp: Hyperparameters,
    ) -> tuple[jax.Array, jax.Array]:
        """GAE of an unroll with the value network that acted.

        Args:
          params: the networks that acted.
          obs_norm: the normaliser they acted with.
          rollout: the unroll, leaves ``(T, num_envs, ...)``.
          bootstrap_obs: the observations after it, ``(num_envs, ...)``.
          hp: the hyperparameters (``discount``, ``gae_lambda``).

        Returns:
          ``(advantage, target)``, each ``(T, num_envs)``.
        """
        value = self.values(params, obs_norm, rollout.obs)
        bootstrap = self.values(params, obs_norm, bootstrap_obs)
        reward = rollout.reward * self.reward_scaling
        return gae(
            reward,
            value,
            bootstrap,
            rollout.terminal,
            rollout.truncated,
            hp.discount,
            hp.gae_lambda,
        )

    # --- learning --------------------------------------------------------------------

    def loss(
        self,
        params: Params,
        obs_norm: ObsNorm | None,
        batch: Samples,
        hp: Hyperparameters,
        key: jax.Array,
        index: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The PPO loss (Eq. 9) of a (slice of a) minibatch, its advantages ready.

        Args:
          params: the networks being trained.
          obs_norm: the normaliser the samples were collected with.
          batch: the samples.
          hp: the hyperparameters (``clip_epsilon``, ``entropy_cost``).
          key: the minibatch's key (the same on every device).
          index: each sample's position in the global minibatch: its entropy
            sample uses ``fold_in(key, index)``.

        Returns:
          ``(loss, parts)`` with ``policy_loss``, ``value_loss``,
            ``entropy`` and ``approx_kl``.
        """
        obs = self._normalize(obs_norm, batch.obs)
        out = mask_logits(self.policy_net.apply(params.policy, obs), batch.obs, self.spec)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
        log_prob, entropy = jax.vmap(self.distribution.log_prob_and_entropy)(
            out, batch.raw_action, keys
        )
        value = self.value_net.apply(params.value, obs)[..., 0]
        policy = clipped_surrogate_loss(log_prob, batch.log_prob, batch.advantage, hp.clip_epsilon)
        v_loss = value_loss(value, batch.target)
        total = policy + self.vf_coefficient * v_loss + entropy_loss(entropy, hp.entropy_cost)
        log_ratio = log_prob - batch.log_prob
        return total, {
            "policy_loss": policy,
            "value_loss": v_loss,
            "entropy": jnp.mean(entropy),
            "approx_kl": jnp.mean(jnp.exp(log_ratio) - 1.0 - log_ratio),  # Schulman's k3
        }

    def update(
        self,
        params: Params,
        opt_state: Any,
        obs_norm: ObsNorm | None,
        batch: Samples,
        hp: Hyperparameters,
        key: jax.Array,
        dp_axis_name: str | None = None,
        whole_advantage: jax.Array | None = None,
        local_metrics: bool = False,
    ) -> tuple[Params, Any, dict[str, jax.Array]]:
        """One gradient step on a minibatch split over ``dp_axis_name``.

        Args:
          params: the networks (replicated).
          opt_state: the optimizer state (replicated).
          obs_norm: the normaliser the samples were collected with.
          batch: this device's contiguous slice of the global minibatch.
          hp: the hyperparameters (the learning rate among them).
          key: the minibatch's key, the same on every device.
          dp_axis_name: the data-parallel axis, or ``None``.
          whole_advantage: the whole minibatch's advantages, where every device
            holds them: their statistics normalise the slice's without a collective.
          local_metrics: return the metrics of this device's slice, for a caller that
            averages them over the devices itself (one collective for many steps).

        Returns:
          ``(params, opt_state, metrics)``: the metrics are global minibatch means
            (``local_metrics``: the slice's).
        """
        metrics_axis = None if local_metrics else dp_axis_name
        if self.normalize_advantage:
            advantage = normalize_advantages(batch.advantage, dp_axis_name, whole_advantage)
            batch = batch.replace(advantage=advantage)
        index = replay.global_batch_index(batch.advantage.shape[0], dp_axis_name)

        def loss_fn(agent, batch, hp, key, index):
            return self.loss(agent.params, agent.obs_norm, batch, hp, key, index)

        step = dist.agent_gradient_update(
            loss_fn, self.optimizer(hp.learning_rate), dp_axis_name, has_aux=True
        )
        agent = AgentState(params=params, obs_norm=obs_norm)
        (loss, parts), agent, opt_state = step(opt_state, agent, batch, hp, key, index)
        return agent.params, opt_state, dist.pmean({"loss": loss, **parts}, metrics_axis)

    def train(
        self,
        params: Params,
        opt_state: Any,
        obs_norm: ObsNorm | None,
        samples: Samples | Segments,
        hp: Hyperparameters,
        key: jax.Array,
        dp_axis_name: str | None = None,
    ) -> tuple[Params, Any, dict[str, jax.Array]]:
        """``num_epochs`` passes over ``samples`` in ``num_minibatches`` shuffled minibatches.

        Args:
          params: the networks (replicated).
          opt_state: the optimizer state (replicated).
          obs_norm: the normaliser the samples were collected with.
          samples: the *whole* batch, the same on every device; its length
            must split into minibatches, and those over the devices. Given as
            :class:`Segments`, the minibatches are of whole lanes, whose
            advantages are computed again before each step.
          hp: the hyperparameters.
          key: PRNG key of the permutations and the entropy samples, replicated.
          dp_axis_name: the data-parallel axis, or ``None``.

        Returns:
          ``(params, opt_state, metrics)``: the metrics averaged over the minibatches.
        """
        size = jax.tree.leaves(samples)[0].shape[0] // self.num_minibatches

        def minibatch(carry, xs):
            indices, key = xs
            local = jax.tree.map(lambda x: x[replay.dp_slice(indices, dp_axis_name)], samples)
            if isinstance(local, Segments):  # advantages computed on each device's lanes
                local = self.segment_samples(carry[0], obs_norm, local, hp)
                whole = None
            else:  # every device holds the whole minibatch's advantages
                whole = samples.advantage[indices]
            params, opt_state, metrics = self.update(
                *carry, obs_norm, local, hp, key, dp_axis_name, whole, local_metrics=True
            )
            return (params, opt_state), metrics

        def epoch(carry, key):
            perm_key, minibatch_key = jax.random.split(key)
            order = jax.random.permutation(perm_key, self.num_minibatches * size)
            xs = (
                order.reshape(self.num_minibatches, size),
                jax.random.split(minibatch_key, self.num_minibatches),
            )
            return jax.lax.scan(minibatch, carry, xs)

        keys = jax.random.split(key, self.num_epochs)
        (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), keys)
        # Equal slices: the mean of the devices' means is the global mean.
        return params, opt_state, dist.pmean(jax.tree.map(jnp.mean, metrics), dp_axis_name)
