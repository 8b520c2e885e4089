"""A replay buffer in JAX, shared by a population and its RL learners.

A circular buffer: one pytree whose leaves carry a leading ``capacity`` axis,
an insert position and a fill count. Two things make it fit the rest of the
framework, and are why it is written here rather than taken from flashbax:

* :meth:`ReplayBuffer.add` takes a validity mask, so fixed-length rollouts
  that ended early (or padded population slots) insert only their real steps,
  with static shapes under ``jit``;
* :func:`sample` draws the indices of the *global* minibatch from one
  replicated key and each device of a data-parallel axis takes its
  contiguous slice, so the sampled data does not depend on the device count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class ReplayBuffer:
    """A circular buffer of transitions.

    Attributes:
      data: a pytree; every leaf has shape ``(capacity, ...)``.
      position: int32, the slot the next item goes to.
      size: int32, how many slots hold data (at most ``capacity``).
    """

    data: Any
    position: jax.Array
    size: jax.Array

    @classmethod
    def create(cls, example: Any, capacity: int) -> ReplayBuffer:
        """An empty buffer for items shaped like ``example``.

        Args:
          example: one item (a pytree of arrays without a batch axis).
          capacity: number of items the buffer holds before overwriting.

        Returns:
          An empty :class:`ReplayBuffer`.
        """
        if capacity < 1:
            raise ValueError(f"The replay buffer capacity must be positive, got {capacity}.")
        data = jax.tree.map(
            lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
        )
        return cls(data=data, position=jnp.int32(0), size=jnp.int32(0))

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    def add(self, items: Any, valid: jax.Array | None = None) -> ReplayBuffer:
        """Inserts the valid items of a batch, in order, overwriting the oldest.

        Args:
          items: a pytree whose leaves share leading batch axes (any number of
            them, e.g. ``(population, time)``), matching ``valid``'s shape.
          valid: boolean mask over the batch axes; ``None`` inserts everything.

        Returns:
          The updated buffer.
        """
        if valid is None:
            first = jax.tree.leaves(items)[0]
            item_ndim = jax.tree.leaves(self.data)[0].ndim - 1
            valid = jnp.ones(first.shape[: first.ndim - item_ndim], bool)
        batch_ndim = valid.ndim
        flat = jax.tree.map(lambda x: jnp.reshape(x, (-1, *x.shape[batch_ndim:])), items)
        valid = jnp.reshape(valid, (-1,)).astype(jnp.int32)
        capacity = self.capacity
        count = jnp.sum(valid)
        offset = jnp.cumsum(valid) - valid  # rank of each valid item in this batch
        # Items that a later item of the same batch would overwrite are dropped,
        # so no slot is written twice (the order of duplicate scatters is undefined).
        keep = (valid > 0) & (offset >= count - capacity)
        slot = jnp.where(keep, (self.position + offset) % capacity, capacity)

        def write(buf, x):
            return buf.at[slot].set(x.astype(buf.dtype), mode="drop")

        return ReplayBuffer(
            data=jax.tree.map(write, self.data, flat),
            position=((self.position + count) % capacity).astype(jnp.int32),
            size=jnp.minimum(self.size + count, capacity).astype(jnp.int32),
        )

    def take(self, indices: jax.Array) -> Any:
        """The items stored at ``indices``."""
        return jax.tree.map(lambda d: d[indices], self.data)


def dp_slice(x: Any, dp_axis_name: str | None) -> Any:
    """This device's contiguous slice of a global batch along its leading axis.

    Args:
      x: a pytree of arrays with the same leading (global batch) length, the
        same on every device.
      dp_axis_name: the data-parallel mesh axis; ``None`` returns ``x``.

    Returns:
      Device ``i`` of ``n`` gets rows ``i * B / n`` to ``(i + 1) * B / n``.
    """
    if dp_axis_name is None:
        return x
    n = jax.lax.axis_size(dp_axis_name)
    i = jax.lax.axis_index(dp_axis_name)

    def cut(a):
        local = a.shape[0] // n
        return jax.lax.dynamic_slice_in_dim(a, i * local, local)

    return jax.tree.map(cut, x)


def global_batch_index(local_batch_size: int, dp_axis_name: str | None) -> jax.Array:
    """Positions in the global minibatch of this device's samples.

    Per-sample randomness is drawn from these positions
    (``jax.random.fold_in(key, index)``), so it does not depend on how the
    batch is split over devices.

    Args:
      local_batch_size: samples on this device.
      dp_axis_name: the data-parallel mesh axis, or ``None``.

    Returns:
      int32 array ``offset + arange(local_batch_size)``.
    """
    index = jnp.arange(local_batch_size, dtype=jnp.int32)
    if dp_axis_name is None:
        return index
    return index + jax.lax.axis_index(dp_axis_name) * local_batch_size


def sample(
    buffer: ReplayBuffer, key: jax.Array, batch_size: int, dp_axis_name: str | None = None
) -> Any:
    """Samples a minibatch uniformly (with replacement) from the filled slots.

    Args:
      buffer: the buffer (the same on every device).
      key: a key that is the same on every device.
      batch_size: the *global* minibatch size; with ``dp_axis_name`` each of
        the ``n`` devices gets ``batch_size // n`` items.
      dp_axis_name: the data-parallel mesh axis, or ``None``.

    Returns:
      ``(items, index)``: the items of this device's slice of the global
        minibatch, and their positions in it (:func:`global_batch_index`), which
        per-sample randomness is drawn from.
    """
    indices = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    local = dp_slice(indices, dp_axis_name)
    return buffer.take(local), global_batch_index(local.shape[0], dp_axis_name)


def updates(
    update: Callable[[Any, Any, jax.Array, jax.Array], tuple[Any, dict]],
    state: Any,
    buffer: ReplayBuffer,
    key: jax.Array,
    num_updates: int,
    batch_size: int,
    dp_axis_name: str | None = None,
) -> tuple[Any, dict]:
    """``num_updates`` steps of a learner on minibatches drawn from ``buffer``, in a scan.

    Each step's global minibatch indices come from one key; with ``dp_axis_name``
    each device takes its contiguous slice of them (:func:`sample`).

    Args:
      update: ``update(state, batch, index, key) -> (state, metrics)``, one step on
        this device's slice ``batch`` of the minibatch; ``index`` holds its positions
        in the global minibatch and ``key`` is the step's own key.
      state: the learner (replicated).
      buffer: the replay buffer (replicated).
      key: PRNG key, the same on every device.
      num_updates: steps to run (static).
      batch_size: the global minibatch size (static).
      dp_axis_name: the data-parallel axis, or ``None``.

    Returns:
      ``(state, metrics)``: the state after the last step and every step's metrics,
        stacked along a leading axis.
    """

    def body(state, key):
        sample_key, update_key = jax.random.split(key)
        batch, index = sample(buffer, sample_key, batch_size, dp_axis_name)
        return update(state, batch, index, update_key)

    return jax.lax.scan(body, state, jax.random.split(key, num_updates))
