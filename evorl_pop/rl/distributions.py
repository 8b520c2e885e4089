"""Action distributions of the stochastic policies (PPO, SAC).

A policy network outputs a distribution's parameters; a distribution here
turns them into samples, log-probabilities and entropies of *one* observation
(callers ``vmap`` over a batch, each sample with its own key, so that the draw
of sample ``i`` depends on ``i`` and never on how a batch is split)::

    params ─► sample(params, key) ─► raw ─► to_action(raw) ─► the environment
                                      └──► log_prob(params, raw)

A loss that needs two of these of the same ``params`` takes them together
(``sample_and_log_prob``, ``log_prob_and_entropy``): the parameters are read
once, so the gradient flows back through one path into the network's output.
This matters on XLA:CPU for a :class:`TanhNormal`, whose location and scale
are two halves of one output array: each separate read adds a concatenation
to the gradient, and the fusion that sums them is computed element by element,
branching at every element (docs/guides/learners.md times PPO's minibatch step).

A raw sample is what the log-probability is taken of: the action index of a
:class:`Categorical`, the pre-tanh value of a :class:`TanhNormal`. PPO stores
raw samples, so its ratio ``pi / pi_old`` is evaluated at exactly the sampled
values (no ``arctanh`` of a saturated action).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Categorical:
    """A categorical distribution over ``num_actions`` actions, from logits."""

    num_actions: int

    @property
    def param_size(self) -> int:
        """The number of network outputs the distribution takes."""
        return self.num_actions

    def sample(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """An action index drawn from the softmax of ``params``."""
        return jax.random.categorical(key, params)

    def mode(self, params: jax.Array) -> jax.Array:
        """The most probable action."""
        return jnp.argmax(params, axis=-1)

    def log_prob(self, params: jax.Array, raw: jax.Array) -> jax.Array:
        """``log pi(raw)``; broadcasts over leading axes."""
        logp = jax.nn.log_softmax(params, axis=-1)
        return jnp.take_along_axis(logp, raw[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self, params: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """The exact entropy ``-sum p log p`` (``key`` is unused)."""
        del key
        logp = jax.nn.log_softmax(params, axis=-1)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    def sample_and_log_prob(self, params: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(raw, log_prob(params, raw))`` of one draw."""
        raw = self.sample(params, key)
        return raw, self.log_prob(params, raw)

    def log_prob_and_entropy(
        self, params: jax.Array, raw: jax.Array, key: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """``(log_prob(params, raw), entropy(params))``; the logits are one array, read
        whole by both (XLA computes their shared softmax once)."""
        return self.log_prob(params, raw), self.entropy(params, key)

    def to_action(self, raw: jax.Array) -> jax.Array:
        """The action the environment takes: the index itself."""
        return raw


@dataclasses.dataclass(frozen=True)
class MultiCategorical:
    """Independent categorical distributions, one per dimension of a multi-discrete action.

    The parameters are the heads' logits concatenated; a raw sample is one action
    index per head (the last axis), its log-probability and entropy the heads' sums.
    """

    heads: tuple[int, ...]

    @property
    def param_size(self) -> int:
        """The number of network outputs: every head's logits."""
        return sum(self.heads)

    def _split(self, params: jax.Array) -> list[jax.Array]:
        return jnp.split(params, np.cumsum(self.heads)[:-1].tolist(), axis=-1)

    def sample(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """One index per head, each drawn with its own key."""
        keys = jax.random.split(key, len(self.heads))
        draws = [jax.random.categorical(keys[i], p) for i, p in enumerate(self._split(params))]
        return jnp.stack(draws, -1)

    def mode(self, params: jax.Array) -> jax.Array:
        """Each head's most probable index."""
        return jnp.stack([jnp.argmax(p, -1) for p in self._split(params)], -1)

    def log_prob(self, params: jax.Array, raw: jax.Array) -> jax.Array:
        """``sum_i log pi_i(raw_i)``; broadcasts over leading axes."""
        head = Categorical(0)  # its log-probability and entropy do not read its size
        return sum(head.log_prob(p, raw[..., i]) for i, p in enumerate(self._split(params)))

    def entropy(self, params: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """The heads' exact entropies summed (``key`` is unused)."""
        return sum(Categorical(0).entropy(p) for p in self._split(params))

    def sample_and_log_prob(self, params: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(raw, log_prob(params, raw))`` of one draw."""
        raw = self.sample(params, key)
        return raw, self.log_prob(params, raw)

    def log_prob_and_entropy(
        self, params: jax.Array, raw: jax.Array, key: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """``(log_prob(params, raw), entropy(params))``."""
        return self.log_prob(params, raw), self.entropy(params, key)

    def to_action(self, raw: jax.Array) -> jax.Array:
        """The action the environment takes: the indices themselves."""
        return raw


@dataclasses.dataclass(frozen=True)
class TanhNormal:
    """A diagonal Gaussian squashed by tanh into ``[low, high]``.

    Haarnoja, Zhou, Abbeel & Levine (2018), "Soft Actor-Critic: Off-Policy
    Maximum Entropy Deep Reinforcement Learning with a Stochastic Actor", App. C.

    The network outputs ``(loc, s)``; the scale is ``softplus(s) + min_std``
    (as brax's ``NormalTanhDistribution``). With ``u ~ N(loc, scale)`` and the
    action ``a = centre + half_range * tanh(u)``::

        log pi(a) = log N(u; loc, scale) - sum_i log(half_range_i (1 - tanh(u_i)^2))  # Eq. (21)

    Attributes:
      low: lower action bounds, one per dimension.
      high: upper action bounds.
      min_std: the smallest scale, which keeps log-probabilities finite.
    """

    low: tuple[float, ...]
    high: tuple[float, ...]
    min_std: float = 1e-3

    @property
    def action_dim(self) -> int:
        return len(self.low)

    @property
    def param_size(self) -> int:
        """The number of network outputs: a location and a scale per dimension."""
        return 2 * self.action_dim

    def _half_range(self) -> np.ndarray:
        return (np.asarray(self.high, np.float32) - np.asarray(self.low, np.float32)) / 2

    def loc_scale(self, params: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The Gaussian's location and scale from the network's outputs."""
        loc, s = jnp.split(params, 2, axis=-1)
        return loc, jax.nn.softplus(s) + self.min_std

    def sample(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """A reparameterised pre-tanh sample ``loc + scale * eps``."""
        return self._sample(*self.loc_scale(params), key)

    @staticmethod
    def _sample(loc: jax.Array, scale: jax.Array, key: jax.Array) -> jax.Array:
        return loc + scale * jax.random.normal(key, loc.shape)

    def mode(self, params: jax.Array) -> jax.Array:
        """The pre-tanh location (its action is the deterministic policy's)."""
        return self.loc_scale(params)[0]

    def log_det_jacobian(self, raw: jax.Array) -> jax.Array:
        """``sum_i log |d a_i / d u_i|``, with ``log(1 - tanh(u)^2)`` in a stable form."""
        log_dtanh = 2.0 * (math.log(2.0) - raw - jax.nn.softplus(-2.0 * raw))
        return jnp.sum(log_dtanh + np.log(self._half_range()), axis=-1)

    def log_prob(self, params: jax.Array, raw: jax.Array) -> jax.Array:
        """``log pi(a)`` of the action ``to_action(raw)``; broadcasts over leading axes."""
        return self._log_prob(*self.loc_scale(params), raw)

    def _log_prob(self, loc: jax.Array, scale: jax.Array, raw: jax.Array) -> jax.Array:
        z = (raw - loc) / scale
        gaussian = -0.5 * z**2 - jnp.log(scale) - 0.5 * math.log(2 * math.pi)
        return jnp.sum(gaussian, axis=-1) - self.log_det_jacobian(raw)

    def entropy(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """The squashed distribution's entropy, estimated from one sample.

        ``H[a] = H[u] + E_u[log |da/du|]``: the Gaussian's entropy is exact, the
        expectation is the value at one sample drawn with ``key`` (as brax does).
        """
        return self._entropy(*self.loc_scale(params), key)

    def _entropy(self, loc: jax.Array, scale: jax.Array, key: jax.Array) -> jax.Array:
        gaussian = jnp.sum(0.5 + 0.5 * math.log(2 * math.pi) + jnp.log(scale), axis=-1)
        return gaussian + self.log_det_jacobian(self._sample(loc, scale, key))

    def sample_and_log_prob(self, params: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(raw, log_prob(params, raw))`` of one draw, from one read of ``params``."""
        loc, scale = self.loc_scale(params)
        raw = self._sample(loc, scale, key)
        return raw, self._log_prob(loc, scale, raw)

    def log_prob_and_entropy(
        self, params: jax.Array, raw: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``(log_prob(params, raw), entropy(params, key))`` from one read of ``params``."""
        loc, scale = self.loc_scale(params)
        return self._log_prob(loc, scale, raw), self._entropy(loc, scale, key)

    def to_action(self, raw: jax.Array) -> jax.Array:
        """The action in ``[low, high]``."""
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        return (high + low) / 2 + (high - low) / 2 * jnp.tanh(raw)


def for_spec(spec) -> Categorical | MultiCategorical | TanhNormal:
    """The distribution of an environment's action space.

    Args:
      spec: an :class:`~evorl_pop.base.EnvSpec`.

    Returns:
      A :class:`MultiCategorical` for discrete actions of several heads, a
        :class:`Categorical` for one, else a :class:`TanhNormal`.
    """
    if spec.discrete and spec.action_heads:
        return MultiCategorical(tuple(spec.action_heads))
    if spec.discrete:
        return Categorical(spec.action_dim)
    return TanhNormal(tuple(spec.action_low), tuple(spec.action_high))
