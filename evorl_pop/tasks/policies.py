"""The policies that act in environments, and the critics beside them.

A policy is a flax module plus the map from its output to an action
(:class:`Policy`): discrete actions are the argmax of the logits, continuous
ones tanh squashed into the action bounds (a tanh-Gaussian one, SAC's actor,
acts with its mean: :class:`GaussianPolicy`). Its torso follows the observation:
images (rank 3, height x width x channels, e.g. MinAtar's 10x10xC) get a small
CNN (or :class:`Keypoints`), everything else an MLP on the flattened
observation; critics ``Q(s, a)`` are MLPs too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import EnvSpec

ACTIVATIONS: dict[str, Callable] = {"tanh": jnp.tanh, "relu": nn.relu, "elu": nn.elu}


class MLP(nn.Module):
    """A plain MLP: hidden layers with an activation, a linear output.

    Attributes:
      obs_rank: rank of one input; its axes are flattened (leading axes are
        batch axes), so a 10x5 grid or a scalar index is a vector here.
      out_scale: the output layer's initial weights are this times LeCun-normal's
        (every layer's default); a small one starts every input near the same output.
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    obs_rank: int = 1
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = jnp.reshape(x, (*x.shape[: x.ndim - self.obs_rank], -1)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = act(nn.Dense(size)(x))
        init = nn.initializers.variance_scaling(self.out_scale**2, "fan_in", "truncated_normal")
        return nn.Dense(self.out_dim, kernel_init=init)(x)


#: How :class:`Conv3x3` computes: ``'patches'`` (a matrix product of the image's 3x3
#: patches), ``'xla'`` (``lax.conv_general_dilated``), or ``'auto'``: patches on a
#: CPU, where XLA's convolution gradient inside a ``scan`` is much slower
#: (docs/benchmarks/bench-conv.md), XLA's convolution on an accelerator.
CONV_METHODS = ("auto", "patches", "xla")


def patches3x3(x: jax.Array, padding: str = "VALID") -> jax.Array:
    """The 3x3 patches of ``(n, height, width, channels)`` images, one per output pixel.

    Returns ``(n, height', width', 9 * channels)``, ordered (kernel row, kernel
    column, channel) as a flax ``(3, 3, in, out)`` kernel reshaped to
    ``(9 * in, out)``; ``'SAME'`` pads one zero pixel on every side first.
    """
    if padding == "SAME":
        x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    elif padding != "VALID":
        raise ValueError(f"padding must be 'VALID' or 'SAME', not {padding!r}")
    h, w = x.shape[1] - 2, x.shape[2] - 2
    return jnp.concatenate([x[:, i : i + h, j : j + w] for i in range(3) for j in range(3)], -1)


class Conv3x3(nn.Module):
    """A 3x3 convolution, stride 1, with ``nn.Conv``'s parameters and initialisation.

    Its parameters (``kernel`` of shape ``(3, 3, in, features)``, ``bias``) and
    their initial values are those of ``nn.Conv(features, (3, 3), padding)`` at
    the same place in a module, so checkpoints and :mod:`evorl_pop.tasks.vbn`
    read either. ``method`` is one of :data:`CONV_METHODS`.
    """

    features: int
    padding: str = "VALID"
    method: str = "auto"

    @nn.compact
    def __call__(self, x):
        kernel = self.param(
            "kernel", nn.linear.default_kernel_init, (3, 3, x.shape[-1], self.features)
        )
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        method = self.method
        if method not in CONV_METHODS:
            raise ValueError(f"Unknown conv method {method!r}; use one of {CONV_METHODS}.")
        if method == "auto":
            method = "patches" if jax.default_backend() == "cpu" else "xla"
        if method == "patches":
            return patches3x3(x, self.padding) @ kernel.reshape(-1, self.features) + bias
        out = jax.lax.conv_general_dilated(
            x, kernel, (1, 1), self.padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return out + bias


class CNN(nn.Module):
    """The MinAtar torso (Young & Tian 2019): 3x3 convolutions, then an MLP.

    Takes ``(..., height, width, channels)`` images; leading axes are batch axes.
    ``conv`` is how the convolutions compute (:data:`CONV_METHODS`); ``out_scale``
    scales the output layer's initial weights (:class:`MLP`).
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "relu"
    channels: Sequence[int] = (16,)
    conv: str = "auto"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        batch = x.shape[:-3]
        x = jnp.reshape(x, (-1, *x.shape[-3:])).astype(jnp.float32)
        for i, width in enumerate(self.channels):
            x = act(Conv3x3(width, "VALID", self.conv, name=f"Conv_{i}")(x))
        x = MLP(self.hidden_sizes, self.out_dim, self.activation, 3, self.out_scale)(x)
        return jnp.reshape(x, (*batch, self.out_dim))


class Keypoints(nn.Module):
    """Where things are in the image, then an MLP: a spatial soft-argmax per channel.

    Each channel (of the image, and of the optional 3x3 convolutions' feature
    maps) is standardised over the image and passed through a spatial
    softmax; its expected row and column, in [-1, 1], are the channel's
    keypoint (Levine et al. 2016). Where the channels are object masks, as
    MinAtar's are, a keypoint is where that object is (the centroid of several),
    so "move the paddle towards the ball" is linear in the MLP's inputs. A
    lone pixel stands about sqrt(height * width) deviations above the rest of
    its channel, whatever the weights' scale; an empty channel sits at the centre.

    Takes ``(..., height, width, channels)`` images; leading axes are batch axes.
    ``conv`` is how the convolutions compute (:data:`CONV_METHODS`).
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    channels: Sequence[int] = ()
    conv: str = "auto"

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        batch = x.shape[:-3]
        x = jnp.reshape(x, (-1, *x.shape[-3:])).astype(jnp.float32)
        image = x
        for i, width in enumerate(self.channels):
            x = Conv3x3(width, "SAME", self.conv, name=f"Conv_{i}")(x if i == 0 else act(x))
        x = jnp.concatenate([image, x], -1) if self.channels else image
        z = (x - x.mean((1, 2), keepdims=True)) / (x.std((1, 2), keepdims=True) + 1e-6)
        p = jax.nn.softmax(z.reshape(z.shape[0], -1, z.shape[-1]), axis=1).reshape(z.shape)
        rows, cols = (jnp.linspace(-1.0, 1.0, n) for n in x.shape[1:3])
        points = [jnp.einsum("nhwc,h->nc", p, rows), jnp.einsum("nhwc,w->nc", p, cols)]
        x = MLP(self.hidden_sizes, self.out_dim, self.activation)(jnp.concatenate(points, -1))
        return jnp.reshape(x, (*batch, self.out_dim))


class Critic(nn.Module):
    """Q(s, a): an MLP on the concatenated observation and action."""

    hidden_sizes: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(self, obs, action):
        return MLP(self.hidden_sizes, 1, "relu")(jnp.concatenate([obs, action], -1))[..., 0]


@dataclasses.dataclass(frozen=True)
class Policy:
    """A deterministic policy: a flax module plus the map from its output to an action.

    Attributes:
      module: the flax module, ``module.apply(params, obs) -> output``.
      spec: the environment spec the policy acts in.
    """

    module: nn.Module
    spec: EnvSpec

    def init(self, key: jax.Array) -> Any:
        return self.module.init(key, jnp.zeros(self.spec.obs_shape))

    def __call__(self, params: Any, obs: jax.Array) -> jax.Array:
        out = self.module.apply(params, obs)
        return output_to_action(out, self.spec, obs)


#: The logit of an action an observation's mask rules out (``EnvSpec.action_mask``):
#: below every other logit as ``-inf`` would be, yet finite, so that softmaxes,
#: log-probabilities and entropies stay finite (a mask of nothing leaves them uniform).
MASKED_LOGIT = -1e30


def mask_logits(out: jax.Array, obs: jax.Array, spec: EnvSpec) -> jax.Array:
    """``out`` with the logits of the actions ``obs``'s mask rules out at :data:`MASKED_LOGIT`
    (``out`` itself when ``spec`` has no mask); ``obs`` is raw (not normalised), its leading
    axes those of ``out``."""
    if spec.action_mask is None:
        return out
    start, stop = spec.action_mask
    flat = jnp.reshape(obs, (*obs.shape[: obs.ndim - len(spec.obs_shape)], -1))
    return jnp.where(flat[..., start:stop] > 0.5, out, MASKED_LOGIT)


def head_logits(out: jax.Array, heads: tuple[int, ...]) -> list[jax.Array]:
    """The logits of each head of a multi-discrete action (``EnvSpec.action_heads``)."""
    return jnp.split(out, np.cumsum(heads)[:-1].tolist(), axis=-1)


def output_to_action(out: jax.Array, spec: EnvSpec, obs: jax.Array | None = None) -> jax.Array:
    """Discrete: argmax of the logits (of each head), those ``obs``'s action mask rules out
    never picked. Continuous: tanh squashed into [low, high]."""
    if spec.discrete:
        if obs is not None:
            out = mask_logits(out, obs, spec)
        if spec.action_heads:
            return jnp.stack([jnp.argmax(x, -1) for x in head_logits(out, spec.action_heads)], -1)
        return jnp.argmax(out, axis=-1)
    low = np.asarray(spec.action_low, np.float32)
    high = np.asarray(spec.action_high, np.float32)
    # centre + half-range * tanh: this form fuses into the environment step, where
    # the (tanh + 1) form costs more per rollout on a CPU
    return (high + low) / 2 + (high - low) / 2 * jnp.tanh(out)


@dataclasses.dataclass(frozen=True)
class GaussianPolicy(Policy):
    """A tanh-Gaussian policy (SAC's actor) acting deterministically, as a population's member.

    The module outputs a location and a scale parameter per action dimension,
    ``(loc, s)``; the action is the location's, squashed as :class:`Policy`'s
    into ``[low, high]``: the action of the Gaussian's mode, the one
    :class:`~evorl_pop.rl.distributions.TanhNormal` gives it.
    """

    def __call__(self, params: Any, obs: jax.Array) -> jax.Array:
        loc = self.module.apply(params, obs)[..., : self.spec.action_dim]
        return output_to_action(loc, self.spec)


def gaussian_policy(
    spec: EnvSpec, hidden_sizes: Sequence[int] = (64, 64), activation: str = "relu"
) -> GaussianPolicy:
    """A :class:`GaussianPolicy` whose MLP has ``2 * action_dim`` outputs (continuous actions).

    Args:
      spec: the environment's :class:`~evorl_pop.base.EnvSpec`.
      hidden_sizes: hidden layer widths.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.

    Returns:
      A :class:`GaussianPolicy`.
    """
    module = MLP(tuple(hidden_sizes), 2 * spec.action_dim, activation, len(spec.obs_shape))
    return GaussianPolicy(module, spec)


POLICIES = ("auto", "mlp", "cnn", "keypoints")


def make_policy(
    spec: EnvSpec,
    hidden_sizes: Sequence[int] = (32,),
    activation: str = "tanh",
    module: nn.Module | None = None,
    kind: str = "auto",
) -> Policy:
    """An MLP or CNN policy for ``spec`` (or a custom module, checked against it).

    Args:
      spec: the environment's :class:`~evorl_pop.base.EnvSpec`.
      hidden_sizes: hidden layer widths of the MLP (after the convolutions
        for the CNN, after the keypoints for ``'keypoints'``; empty: linear).
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      module: a custom flax module mapping one observation to
        ``spec.action_dim`` outputs (logits, or pre-tanh actions).
      kind: ``'cnn'`` or ``'keypoints'`` (:class:`Keypoints`; image
        observations only), ``'mlp'`` (any observation, flattened) or
        ``'auto'`` (``'cnn'`` for rank-3 observations).

    Returns:
      A :class:`Policy`.

    Raises:
      ValueError: an unknown activation or kind, a CNN for observations that
        are not images, or a module whose output does not fit the action space.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}.")
    if kind not in POLICIES:
        raise ValueError(f"Unknown policy {kind!r}; choose from {POLICIES}.")
    image = len(spec.obs_shape) == 3
    if kind in ("cnn", "keypoints") and not image:
        raise ValueError(
            f"policy={kind!r} needs image observations (height, width, channels), but "
            f"{spec.name} observes shape {spec.obs_shape}; use policy='mlp' or 'auto'."
        )
    if module is None:
        if kind == "keypoints":
            module = Keypoints(tuple(hidden_sizes), spec.action_dim, activation)
        elif kind == "cnn" or (kind == "auto" and image):
            module = CNN(tuple(hidden_sizes), spec.action_dim, activation)
        else:
            module = MLP(tuple(hidden_sizes), spec.action_dim, activation, len(spec.obs_shape))
    policy = Policy(module, spec)
    out = jax.eval_shape(
        lambda k: module.apply(
            module.init(k, jnp.zeros(spec.obs_shape)), jnp.zeros(spec.obs_shape)
        ),
        jax.random.key(0),
    )
    if tuple(out.shape) != (spec.action_dim,):
        kind = "logits, one per action" if spec.discrete else "one value per action dimension"
        raise ValueError(
            f"The policy outputs shape {tuple(out.shape)} for one observation of {spec.name}, "
            f"but its action space needs ({spec.action_dim},) ({kind}). Make the policy's last "
            f"layer output {spec.action_dim} value(s)."
        )
    return policy
