"""Virtual batch normalisation (Salimans et al. 2017), folded into a candidate's weights.

Every hidden layer of a built-in policy is standardised over a fixed
reference batch of observations, computed with the candidate's own weights,
and the standardisation folded into its kernel and bias::

    observations of random play ─► vbn_reference (once: the first layer's rows,
                                   their mean and covariance)
    candidate's weights ─► fold_virtual_batch_norm ─► weights of the normalised network
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop.tasks.policies import ACTIVATIONS, CNN, MLP, Conv3x3, Policy, patches3x3

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
        patches = patches3x3(x)  # 3x3, VALID, as CNN's first convolution
        shape = patches.shape[:3]
        rows = patches.reshape(-1, patches.shape[-1])
    else:
        shape = x.shape[:1]
        rows = jnp.reshape(x, (x.shape[0], -1))
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
        :func:`evorl_pop.tasks.envs.random_observations`), as the policy sees them,
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
            out = jax.lax.map(
                lambda a: _fold(module, *a, eps), (params, reference), batch_size=size
            )
        else:
            out = jax.lax.map(lambda p: _fold(module, p, reference, eps), params, batch_size=size)
        return out, jax.tree.map(lambda _: True, out)

    return fold(params, reference)


def _has_conv(module) -> bool:
    return isinstance(module, CNN) and len(module.channels) > 0


def _fold(module, params, reference: VBNReference, eps):
    act = ACTIVATIONS[module.activation]
    folded = jax.tree.map(lambda x: x, params)  # new dicts, the same arrays
    layers = folded["params"]
    dense = layers["MLP_0"] if isinstance(module, CNN) else layers
    rows = reference.rows
    conv = _has_conv(module)
    n = len(module.hidden_sizes)
    if not (conv or n):
        return folded  # no hidden layer: only the output layer, which stays as it is

    def scale(layer, mu, sd):
        layer["bias"] = (layer["bias"] - mu) / sd
        layer["kernel"] = layer["kernel"] / sd

    def standardise(layer, pre, axes):
        mu = pre.mean(axes)
        sd = jnp.sqrt(pre.var(axes) + eps)
        scale(layer, mu, sd)
        return act((pre - mu) / sd)

    # The first layer, W x + b over the rows: mean W m + b, variance diag(W C W^T).
    first = layers["Conv_0"] if conv else dense["Dense_0"]
    kernel = first["kernel"].reshape(rows.shape[1], -1)
    mu = reference.mean @ kernel + first["bias"]
    scale(first, mu, jnp.sqrt(jnp.einsum("io,ij,jo->o", kernel, reference.cov, kernel) + eps))
    x = act(rows @ first["kernel"].reshape(kernel.shape) + first["bias"])
    x = x.reshape(*reference.out_shape, -1)
    for i, width in enumerate(module.channels[1:] if conv else (), 1):
        layer = layers[f"Conv_{i}"]
        pre = Conv3x3(width, "VALID", module.conv).apply({"params": layer}, x)
        x = standardise(layer, pre, (0, 1, 2))
    x = jnp.reshape(x, (x.shape[0], -1))
    for j in range(0 if conv else 1, n):
        layer = dense[f"Dense_{j}"]
        x = standardise(layer, x @ layer["kernel"] + layer["bias"], 0)
    return folded


#: Observations in the reference batch of virtual batch normalisation.
VBN_BATCH = 128
