"""Gradient updates whose minibatch may be split over a data-parallel axis.

With ``dp_axis_name`` set, each device differentiates the loss on its own
shard of the minibatch and the gradients are averaged with ``pmean`` before
the optimizer step, so every device applies the same update: the one the
full-batch gradient would give (for a loss that is a mean over the batch and
equal shard sizes).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import optax

from evorl_pop.distributed.comm import pmean


def loss_and_pgrad(loss_fn: Callable[..., float], dp_axis_name: str | None, has_aux: bool = False):
    """Wraps ``jax.value_and_grad`` with a gradient mean over ``dp_axis_name``.

    Args:
      loss_fn: ``(params, *args, **kwargs) -> loss`` (or ``(loss, aux)``
        when ``has_aux``).
      dp_axis_name: the mesh axis the batch is split over, or ``None`` for
        the plain, unaveraged gradient.
      has_aux: whether ``loss_fn`` returns ``(loss, aux)``.

    Returns:
      A function with the arguments of ``loss_fn`` returning
        ``(value, grads)``: ``value`` is this device's loss (and aux), ``grads``
        the gradient averaged over ``dp_axis_name``.
    """
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)
    if dp_axis_name is None:
        return value_and_grad

    def fn(params, *args, **kwargs):
        _check_mapped(dp_axis_name)
        # Replicated parameters are "invariant" under shard_map's replication
        # checks, and the gradient of an invariant input is already summed
        # over the axis. Marking them as varying first yields each device's
        # own gradient, which pmean then averages (with or without check_vma).
        params = _as_varying(params, dp_axis_name)
        value, grads = value_and_grad(params, *args, **kwargs)
        return value, pmean(grads, dp_axis_name)

    return fn


def _check_mapped(axis_name: str) -> None:
    """Raises a ValueError unless ``axis_name`` is bound here (shard_map, vmap)."""
    try:
        jax.lax.axis_size(axis_name)
    except NameError:
        raise ValueError(
            f"dp_axis_name={axis_name!r} is not a mapped axis here: run the update inside "
            f"jax.shard_map over a mesh with a {axis_name!r} axis (batch sharded along "
            "it), or pass dp_axis_name=None on one device."
        ) from None


def _as_varying(tree, axis_name: str):
    def cast(x):
        if axis_name in jax.typeof(x).mat.varying:
            return x
        return jax.lax.pcast(x, axis_name, to="varying")

    return jax.tree.map(cast, tree)


def gradient_update(
    loss_fn: Callable[..., float],
    optimizer: optax.GradientTransformation,
    dp_axis_name: str | None,
    has_aux: bool = False,
):
    """Builds one optimizer step on ``loss_fn``.

    Args:
      loss_fn: ``(params, *args, **kwargs) -> loss`` (or ``(loss, aux)``).
      optimizer: an optax gradient transformation.
      dp_axis_name: the mesh axis the batch is split over, or ``None``.
      has_aux: whether ``loss_fn`` returns ``(loss, aux)``.

    Returns:
      ``update(opt_state, params, *args, **kwargs) -> (value, params, opt_state)``
        applying one step of ``optimizer`` with the (DP-averaged) gradient.
    """
    grad_fn = loss_and_pgrad(loss_fn, dp_axis_name, has_aux=has_aux)

    def update(opt_state, params, *args, **kwargs):
        value, grads = grad_fn(params, *args, **kwargs)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    return update


def _attach_params_to_agent_state(agent_state, params):
    return agent_state.replace(params=params)


def _detach_params_to_agent_state(agent_state):
    return agent_state.params


def agent_gradient_update(
    loss_fn: Callable[..., float],
    optimizer: optax.GradientTransformation,
    dp_axis_name: str | None = None,
    has_aux: bool = False,
    attach_fn: Callable[[chex.ArrayTree, chex.ArrayTree], chex.ArrayTree] = (
        _attach_params_to_agent_state
    ),
    detach_fn: Callable[[chex.ArrayTree], chex.ArrayTree] = _detach_params_to_agent_state,
):
    """Builds one optimizer step on the parameters held in an agent state.

    The parameters are taken out of the agent state with ``detach_fn``, the
    loss is differentiated with respect to them (with the agent state rebuilt
    around them by ``attach_fn``), the gradient is averaged over
    ``dp_axis_name`` when given, the optimizer step is applied and the new
    parameters are put back.

    Args:
      loss_fn: ``(agent_state, *args, **kwargs) -> loss`` (or ``(loss, aux)``),
        e.g. ``(agent_state, sample_batch, key)``.
      optimizer: an optax gradient transformation over the parameters.
      dp_axis_name: the mesh axis the batch is split over, or ``None``.
      has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
      attach_fn: ``(agent_state, params) -> agent_state``; by default
        ``agent_state.replace(params=params)`` (a flax struct dataclass or any
        object with ``replace`` and a ``params`` field).
      detach_fn: ``agent_state -> params``; by default ``agent_state.params``.
        Pass a pair that selects a sub-tree (e.g. only the actor) to update
        part of the agent.

    Returns:
      ``update(opt_state, agent_state, *args, **kwargs) -> (value, agent_state,
        opt_state)``.
    """

    def params_loss(params, agent_state, *args, **kwargs):
        return loss_fn(attach_fn(agent_state, params), *args, **kwargs)

    step = gradient_update(params_loss, optimizer, dp_axis_name, has_aux=has_aux)

    def update(opt_state, agent_state, *args, **kwargs):
        value, params, opt_state = step(
            opt_state, detach_fn(agent_state), agent_state, *args, **kwargs
        )
        return value, attach_fn(agent_state, params), opt_state

    return update
