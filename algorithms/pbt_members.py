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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from evorl_pop.base import ConfigError
from evorl_pop.core.interfaces import Acting


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


class AlgorithmMember:
    """An algorithm on a ``'DP'`` mesh (PPO, SAC) as a :class:`Member`.

    Args:
      algorithm_class: ``algorithm_class(settings)``, with ``env``, ``fresh(key)``,
        ``local_step(state, key, axis)`` and ``evaluate(state, key, episodes)``.
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

        def step(state, key):
            return self.algorithm.local_step(state, key, None)

        keys = jax.random.split(key, self.iterations)
        state, metrics = jax.lax.scan(step, state, keys)
        learner, own = self.split(state)
        steps = jnp.int32(self.iterations * self.steps_per_iteration)
        return learner, own, steps, jnp.sum(metrics["episodes"]), metrics

    def evaluate(self, learner: Any, own: Any, key: jax.Array, episodes: int) -> jax.Array:
        """:meth:`Member.evaluate`."""
        state = self.join(learner, own, self.settings.hyperparameters())
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
