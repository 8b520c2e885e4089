"""Flax networks: MLP, CNN and keypoint policies for discrete and continuous actions, critics.

The policy's torso follows the observation: images (rank 3, height x width x
channels, e.g. MinAtar's 10x10xC) get a small CNN, everything else an MLP on
the flattened observation (vectors, grids, scalar indices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.envs import EnvSpec

ACTIVATIONS: dict[str, Callable] = {"tanh": jnp.tanh, "relu": nn.relu, "elu": nn.elu}


class MLP(nn.Module):
    """A plain MLP: hidden layers with an activation, a linear output.

    Attributes:
      obs_rank: rank of one input; its axes are flattened (leading axes are
        batch axes), so a 10x5 grid or a scalar index is a vector here.
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    obs_rank: int = 1

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = jnp.reshape(x, (*x.shape[: x.ndim - self.obs_rank], -1)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = act(nn.Dense(size)(x))
        return nn.Dense(self.out_dim)(x)


class CNN(nn.Module):
    """The MinAtar torso (Young & Tian 2019): 3x3 convolutions, then an MLP.

    Takes ``(..., height, width, channels)`` images; leading axes are batch axes.
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "relu"
    channels: Sequence[int] = (16,)

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        batch = x.shape[:-3]
        x = jnp.reshape(x, (-1, *x.shape[-3:])).astype(jnp.float32)
        for width in self.channels:
            x = act(nn.Conv(width, (3, 3), padding="VALID")(x))
        x = MLP(self.hidden_sizes, self.out_dim, self.activation, obs_rank=3)(x)
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
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    channels: Sequence[int] = ()

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        batch = x.shape[:-3]
        x = jnp.reshape(x, (-1, *x.shape[-3:])).astype(jnp.float32)
        image = x
        for i, width in enumerate(self.channels):
            x = nn.Conv(width, (3, 3), padding="SAME")(x if i == 0 else act(x))
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
        return output_to_action(out, self.spec)


def output_to_action(out: jax.Array, spec: EnvSpec) -> jax.Array:
    """Discrete: argmax of the logits. Continuous: tanh squashed into [low, high]."""
    if spec.discrete:
        return jnp.argmax(out, axis=-1)
    low = np.asarray(spec.action_low, np.float32)
    high = np.asarray(spec.action_high, np.float32)
    # centre + half-range * tanh: this form fuses into the environment step; the
    # (tanh + 1) form cost 18-30 % more per Pendulum rollout on a CPU
    return (high + low) / 2 + (high - low) / 2 * jnp.tanh(out)


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
      spec: the environment's :class:`~evorl_pop.envs.EnvSpec`.
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


#: Candidates folded at a time on a CPU when :func:`fold_virtual_batch_norm` runs under ``vmap``.
VBN_FOLD_BATCH = 4


@flax.struct.dataclass
class VBNReference:
    """A reference batch as the first layer sees it (see :func:`vbn_reference`)."""

    rows: jax.Array  # the first layer's inputs, one per row (3x3 patches for a CNN)
    mean: jax.Array  # their mean
    cov: jax.Array  # and covariance
    out_shape: tuple = flax.struct.field(pytree_node=False)  # the first layer's outputs' axes


def vbn_reference(policy: Policy, observations: jax.Array) -> VBNReference:
    """The reference batch of :func:`fold_virtual_batch_norm`, prepared once for many folds.

    Args:
      policy: a :class:`Policy` with the built-in :class:`MLP` or :class:`CNN`.
      observations: shape ``(n, *obs_shape)``, as the policy sees them.
    """
    x = jnp.asarray(observations, jnp.float32)
    if _has_conv(policy.module):
        shape = (x.shape[0], x.shape[1] - 2, x.shape[2] - 2)  # 3x3, VALID, as CNN's
        patches = [x[:, i : i + shape[1], j : j + shape[2]] for i in range(3) for j in range(3)]
        rows = jnp.stack(patches, 3).reshape(-1, 9 * x.shape[-1])  # (kernel row, col, channel)
    else:
        shape, rows = x.shape[:1], jnp.reshape(x, (x.shape[0], -1))
    mean = rows.mean(0)
    centred = rows - mean
    return VBNReference(rows, mean, centred.T @ centred / rows.shape[0], shape)


def fold_virtual_batch_norm(
    policy: Policy, params: Any, reference: jax.Array | VBNReference, eps: float = 1e-5
):
    """Virtual batch normalisation (Salimans et al. 2017), folded into the weights.

    Every hidden layer's pre-activations are standardised, unit by unit, with
    their mean and standard deviation over a fixed ``reference`` batch of
    observations, computed with these weights; the output layer is left as it
    is. A standardised layer is ``act((W x + b - mu) / sd)``, the layer with
    kernel ``W / sd`` and bias ``(b - mu) / sd``: folded once per candidate, it
    costs one forward pass of the reference batch, not one per step. Every
    hidden unit then varies over the states the batch holds, whatever the
    scale of the weights, so a small perturbation changes what the policy does
    (without it, ES on Atari games finds policies that ignore their input).

    The first layer is linear in the reference batch, so its statistics come
    from the batch's own mean and covariance (of the 3x3 patches for a CNN;
    :func:`vbn_reference` computes them once for many folds). Under ``vmap``
    over candidates, as the engine evaluates a population, a CPU folds them
    :data:`VBN_FOLD_BATCH` at a time, whose intermediates stay in its cache,
    and an accelerator all at once.

    Args:
      policy: a :class:`Policy` with the built-in :class:`MLP` or :class:`CNN`.
      params: its parameters.
      reference: observations, shape ``(n, *obs_shape)`` (e.g.
        :func:`evorl_pop.envs.random_observations`), as the policy sees them,
        or their :func:`vbn_reference`.
      eps: added to the variance.

    Returns:
      Parameters of the same structure whose network computes the normalised one.
    """
    module = policy.module
    if not isinstance(module, MLP | CNN):
        raise ValueError(
            f"virtual batch normalisation folds into the built-in mlp and cnn policies, not a "
            f"{type(module).__name__}; leave virtual_batch_norm off for this policy."
        )
    if not isinstance(reference, VBNReference):
        reference = vbn_reference(policy, reference)

    @jax.custom_batching.custom_vmap
    def fold(params, reference):
        return _fold(module, params, reference, eps)

    @fold.def_vmap
    def fold_in_batches(axis_size, in_batched, params, reference):
        def batched(tree, flags):  # every leaf with the leading axis
            return jax.tree.map(
                lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
                tree,
                flags,
            )

        params = batched(params, in_batched[0])
        size = VBN_FOLD_BATCH if jax.default_backend() == "cpu" else axis_size
        if any(jax.tree.leaves(in_batched[1])):  # one reference per candidate
            reference = batched(reference, in_batched[1])
            out = jax.lax.map(lambda a: _fold(module, *a, eps), (params, reference),
                              batch_size=size)  # fmt: skip
        else:
            out = jax.lax.map(lambda p: _fold(module, p, reference, eps), params,
                              batch_size=size)  # fmt: skip
        return out, jax.tree.map(lambda _: True, out)

    return fold(params, reference)


def _has_conv(module) -> bool:
    return isinstance(module, CNN) and len(module.channels) > 0


def _fold(module, params, reference: VBNReference, eps):
    act = ACTIVATIONS[module.activation]
    folded = jax.tree.map(lambda x: x, params)  # new dicts, the same arrays
    layers = folded["params"]
    dense = layers["MLP_0"] if isinstance(module, CNN) else layers
    rows, mean, cov, shape = reference.rows, reference.mean, reference.cov, reference.out_shape
    conv, n = _has_conv(module), len(module.hidden_sizes)
    if not (conv or n):
        return folded  # no hidden layer: only the output layer, which stays as it is

    def scale(layer, mu, sd):
        layer["kernel"], layer["bias"] = layer["kernel"] / sd, (layer["bias"] - mu) / sd

    def standardise(layer, pre, axes):
        mu, sd = pre.mean(axes), jnp.sqrt(pre.var(axes) + eps)
        scale(layer, mu, sd)
        return act((pre - mu) / sd)

    # The first layer, W x + b over the rows: mean W m + b, variance diag(W C W^T).
    first = layers["Conv_0"] if conv else dense["Dense_0"]
    kernel = first["kernel"].reshape(rows.shape[1], -1)
    mu = mean @ kernel + first["bias"]
    scale(first, mu, jnp.sqrt(jnp.einsum("io,ij,jo->o", kernel, cov, kernel) + eps))
    x = act(rows @ first["kernel"].reshape(kernel.shape) + first["bias"]).reshape(*shape, -1)
    for i, width in enumerate(module.channels[1:] if conv else (), 1):
        layer = layers[f"Conv_{i}"]
        pre = nn.Conv(width, (3, 3), padding="VALID").apply({"params": layer}, x)
        x = standardise(layer, pre, (0, 1, 2))
    x = jnp.reshape(x, (x.shape[0], -1))
    for j in range(0 if conv else 1, n):
        layer = dense[f"Dense_{j}"]
        x = standardise(layer, x @ layer["kernel"] + layer["bias"], 0)
    return folded
