"""Learners as PBT members: what a member keeps, trains and is judged by.

:mod:`~evorl_pop.algorithms.pbt` runs a population of whole learners, each
built by its learner's spec (:class:`~evorl_pop.registry.MemberPart`). A
member is split in two parts::

    learner part  (TD3: actor, twin critics, targets, Adam states;
                   PPO: networks, Adam state, observation statistics;
                   SAC: actor, twin critics, targets, temperature, Adam states)
                  -> copied from a donor when the member is replaced
    own part      (TD3: its replay buffer; PPO: its running episodes;
                   SAC: its replay buffer and episodes)
                  -> always kept

:class:`Member` is what PBT calls. TD3 is one through
:class:`~evorl_pop.rl.hybrid.ReplayMember`; an algorithm on a ``'DP'`` mesh
(PPO, SAC) through :class:`AlgorithmMember`: one interval runs
``interval / (num_envs * unroll_length)`` of its own iterations on one device
(``local_step(axis=None)``: every lane and every minibatch there), with the
member's searched hyperparameters set in the algorithm's traced
``Hyperparameters`` (changing them never recompiles), then evaluates its
deterministic policy.

On a task stepped on the host (Gymnasium's), a member's lanes are host lanes
(:mod:`~evorl_pop.tasks.host_lanes`) whose running episodes its own part keeps
(each lane's seed and actions so far). The host names a lane by its stream and
index; each interval a member's lanes take a stream drawn from the member's own
key (``fold_in(key, i)``, ``i`` its global index, a padded member's too), so no
two members, nor a padded copy of member 0, step the same environments; the
first unroll rebuilds them from the seeds and actions (a resumed run's
too), and the interval gives them back at its end. TD3's episodes and every
member's evaluation run on lanes leased for the call
(:func:`~evorl_pop.tasks.host_lanes.collect_episodes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import ConfigError
from evorl_pop.core.interfaces import Acting, replica_index
from evorl_pop.tasks.envs import steps_on_host


@runtime_checkable
class Member(Protocol):
    """One learner of a PBT population, on one device (inside the engine's evaluator)."""

    #: The environment it trains on (its ``spec.max_steps`` is PBT's episode length).
    env: Any

    def init(self, key: jax.Array) -> tuple[Any, Any]:
        """A fresh member: ``(learner part, own part)``."""

    def train(
        self, learner: Any, own: Any, values: dict, key: jax.Array
    ) -> tuple[Any, Any, jax.Array, jax.Array, dict]:
        """One interval of training.

        Args:
          learner: the member's learner part.
          own: its own part.
          values: its searched hyperparameters, name to traced scalar.
          key: its PRNG key.

        Returns:
          ``(learner, own, steps, episodes, metrics)``: the environment steps and
            episodes it trained on, and the metrics of each of its iterations (leading
            axis the iterations; PBT reports the mean of the spec's ``losses``).
        """

    def evaluate(self, learner: Any, own: Any, key: jax.Array, episodes: int) -> jax.Array:
        """The mean return of the member's deterministic policy over ``episodes``."""

    def acting(self, learner: Any, own: Any) -> Acting:
        """The member's deterministic policy, as :meth:`evaluate` runs it."""


registry.PROTOCOLS["Member"] = Member  # what a learner's member part builds, checked built


class AlgorithmMember:
    """An algorithm on a ``'DP'`` mesh (PPO, SAC) as a :class:`Member`.

    Args:
      algorithm_class: ``algorithm_class(settings)``, with ``env``, ``fresh(key)``,
        ``local_step(state, key, axis)``, ``evaluate(state, key, episodes)`` and
        ``acting(state)``; on a task stepped on the host, ``envs`` too (its
        :class:`~evorl_pop.tasks.host_lanes.HostEnvs`).
      split: ``split(state) -> (learner part, own part)``.
      join: ``join(learner part, own part, hyperparameters) -> state``.
      settings: the algorithm's config (with ``num_envs``, ``unroll_length`` and
        ``hyperparameters()``); its ``task`` and ``episode_length`` are PBT's.
      config: PBT's config (``learner``, ``interval``).

    Raises:
      ConfigError: an interval that is not a whole number of the algorithm's iterations.
    """

    def __init__(
        self, algorithm_class: type, split: Callable, join: Callable, settings: Any, config: Any
    ):
        self.settings = settings
        self.split = split
        self.join = join
        self.algorithm = algorithm_class(settings)
        self.env = self.algorithm.env
        #: Whether the task steps on the host (Gymnasium's): the lanes are the host's.
        self.host = steps_on_host(settings.task)
        per = settings.num_envs * settings.unroll_length
        interval = config.interval
        if interval < per or interval % per:
            raise ConfigError(
                f"interval={interval} must be a whole number of {config.learner} iterations "
                f"of num_envs x unroll_length = {per} steps, e.g. "
                f"{max(1, interval // per) * per}."
            )
        self.steps_per_iteration = per
        self.iterations = interval // per

    def init(self, key: jax.Array) -> tuple[Any, Any]:
        """A fresh member: ``(learner part, own part)``."""
        return self.split(self.algorithm.fresh(key))

    def hyperparameters(self, values: dict) -> Any:
        """The algorithm's ``Hyperparameters``: ``values`` (name to traced scalar)
        where given, the settings' elsewhere."""
        fixed = self.settings.hyperparameters()
        return fixed.replace(**{k: jnp.asarray(v, jnp.float32) for k, v in values.items()})

    def train(self, learner: Any, own: Any, values: dict, key: jax.Array):
        """:meth:`Member.train`: the interval's iterations of the algorithm."""
        state = self.join(learner, own, self.hyperparameters(values))
        if self.host:
            # below 2**31: never a stream the host leases to a collection; a sweep's
            # settings share their keys, and their replica indices tell them apart
            stream = (jax.random.bits(key, (), jnp.uint32) >> 1) ^ jnp.uint32(replica_index())
            state = _with_stream(state, stream)

        def step(state, key):
            return self.algorithm.local_step(state, key, None)

        keys = jax.random.split(key, self.iterations)
        state, metrics = jax.lax.scan(step, state, keys)
        if self.host:
            _give_back(self.algorithm.envs, state)
        learner, own = self.split(state)
        steps = jnp.int32(self.iterations * self.steps_per_iteration)
        return learner, own, steps, jnp.sum(metrics["episodes"]), metrics

    def evaluate(self, learner: Any, own: Any, key: jax.Array, episodes: int) -> jax.Array:
        """:meth:`Member.evaluate`."""
        state = self.join(learner, own, self.settings.hyperparameters())
        if self.host:  # episodes on the host's lanes, leased for the evaluation
            from evorl_pop.tasks.host_lanes import collect_episodes

            acting = self.algorithm.acting(state)

            def act(obs):
                return jax.vmap(acting.policy, (None, 0))(acting.params, obs)

            ran = collect_episodes(self.algorithm.envs, act, key, episodes, acting.obs_norm)
            return jnp.mean(ran.episode_return)
        return self.algorithm.evaluate(state, key, episodes)

    def acting(self, learner: Any, own: Any) -> Acting:
        """:meth:`Member.acting`: the algorithm's own."""
        return self.algorithm.acting(self.join(learner, own, self.settings.hyperparameters()))


def algorithm_member(algorithm_class: type, split: Callable, join: Callable) -> Callable:
    """A :class:`~evorl_pop.registry.MemberPart`'s ``member`` for an algorithm on a
    ``'DP'`` mesh: ``member(settings, config)`` builds its :class:`AlgorithmMember`.

    Args:
      algorithm_class: the algorithm (see :class:`AlgorithmMember`).
      split: ``state -> (learner part, own part)``.
      join: ``(learner part, own part, hyperparameters) -> state``.
    """
    return functools.partial(AlgorithmMember, algorithm_class, split, join)


def _is_host_batch(x: Any) -> bool:
    from evorl_pop.tasks.host_lanes import HostBatch

    return isinstance(x, HostBatch)


def _with_stream(state: Any, stream: jax.Array) -> Any:
    """``state`` with every batch of host lanes in it under the host stream ``stream``."""

    def rename(x):
        if _is_host_batch(x):
            return x.replace(stream=jnp.full_like(x.stream, stream))
        return x

    return jax.tree.map(rename, state, is_leaf=_is_host_batch)


def _give_back(envs: Any, state: Any) -> None:
    """Gives the environments of the host lanes in ``state`` back to ``envs`` (their
    lanes are rebuilt under another stream next interval)."""
    from jax.experimental import io_callback

    batches = [x for x in jax.tree.leaves(state, is_leaf=_is_host_batch) if _is_host_batch(x)]
    for batch in batches:
        n = batch.stream.shape[0]
        # the returns so far come from the steps' results: the release follows them
        after = jax.lax.bitcast_convert_type(batch.episode_return, jnp.uint32)
        ids = jnp.stack([jnp.arange(n, dtype=jnp.uint32), batch.stream, after], axis=1)
        io_callback(envs._release, jax.ShapeDtypeStruct((), jnp.int32), ids)
