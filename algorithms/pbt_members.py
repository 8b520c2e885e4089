"""PPO and SAC learners as PBT members: what a member keeps, trains and is judged by.

:mod:`~evorl_pop.algorithms.pbt` runs a population of whole learners. A
member here is split in two parts::

    learner part  (PPO: networks, Adam state, observation statistics;
                   SAC: actor, twin critics, targets, temperature, Adam states)
                  -> copied from a donor when the member is replaced
    own part      (PPO: its running episodes; SAC: its replay buffer and episodes)
                  -> always kept, as a TD3 member keeps its buffer

One interval runs ``interval / (num_envs * unroll_length)`` of the learner's
own iterations on one device (``local_step(axis=None)``: every lane and
every minibatch there), with the member's searched hyperparameters set in
the learner's traced :class:`Hyperparameters` (changing them never
recompiles), then evaluates its deterministic policy.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from evorl_pop.algorithms import ppo, sac
from evorl_pop.base import ConfigError

#: The learners a PBT member can be besides TD3, by ``Config.learner`` name.
LEARNERS = {"ppo": (ppo.PPO, ppo.Config), "sac": (sac.SAC, sac.Config)}
#: What each can search: its traced hyperparameters.
SEARCHABLE = {
    "ppo": tuple(f.name for f in dataclasses.fields(ppo.Hyperparameters)),
    "sac": tuple(f.name for f in dataclasses.fields(sac.Hyperparameters)),
}
#: Losses each reports (means over the interval), in its metrics.
LOSSES = {
    "ppo": ("loss", "policy_loss", "value_loss", "entropy", "approx_kl"),
    "sac": ("critic_loss", "actor_loss", "alpha_loss", "alpha"),
}


class Member:
    """One learner of a PBT population on one device.

    Args:
      name: ``'ppo'`` or ``'sac'``.
      config: the learner's config; its ``task`` and ``episode_length`` are PBT's.
      interval: environment steps of each member between two exploits.

    Raises:
      ConfigError: an interval that is not a whole number of the learner's iterations.
    """

    def __init__(self, name: str, config, interval: int):
        algorithm_class, _ = LEARNERS[name]
        self.name, self.config = name, config
        self.algorithm = algorithm_class(config)
        self.env = self.algorithm.env
        per = config.num_envs * config.unroll_length
        if interval < per or interval % per:
            raise ConfigError(
                f"interval={interval} must be a whole number of {name} iterations of "
                f"num_envs x unroll_length = {per} steps, e.g. {max(1, interval // per) * per}."
            )
        self.steps_per_iteration = per
        self.iterations = interval // per

    def split(self, state):
        """``(learner part, own part)`` of the learner's state."""
        if self.name == "ppo":
            return (state.params, state.opt_state, state.obs_norm), state.envs
        return state.learner, (state.buffer, state.envs)

    def join(self, learner, own, hyperparameters):
        """The learner's state from its parts and its traced hyperparameters."""
        zero = jnp.int32(0)  # the iterations do not read it
        if self.name == "ppo":
            params, opt_state, obs_norm = learner
            return ppo.State(params, opt_state, obs_norm, hyperparameters, own, zero)
        buffer, envs = own
        return sac.State(learner, buffer, hyperparameters, envs, zero)

    def init(self, key: jax.Array):
        """A fresh member: ``(learner part, own part)``."""
        return self.split(self.algorithm.fresh(key))

    def hyperparameters(self, values: dict):
        """The learner's :class:`Hyperparameters`: ``values`` (name to traced scalar)
        where given, the config's elsewhere."""
        fixed = self.config.hyperparameters()
        return fixed.replace(**{k: jnp.asarray(v, jnp.float32) for k, v in values.items()})

    def train(self, learner, own, values: dict, key: jax.Array):
        """One interval of the learner's iterations.

        Args:
          learner, own: the member's parts.
          values: its searched hyperparameters, name to traced scalar.
          key: its PRNG key.

        Returns:
          ``(learner, own, steps, episodes, losses)``: the losses are the
          interval's means (NaN before SAC's learning starts).
        """
        state = self.join(learner, own, self.hyperparameters(values))
        step = lambda s, k: self.algorithm.local_step(s, k, None)  # noqa: E731
        keys = jax.random.split(key, self.iterations)
        state, metrics = jax.lax.scan(step, state, keys)
        learner, own = self.split(state)
        losses = {k: jnp.nanmean(metrics[k]) for k in LOSSES[self.name]}
        steps = jnp.int32(self.iterations * self.steps_per_iteration)
        return learner, own, steps, jnp.sum(metrics["episodes"]), losses

    def evaluate(self, learner, own, key: jax.Array, episodes: int) -> jax.Array:
        """The mean return of the member's deterministic policy."""
        state = self.join(learner, own, self.config.hyperparameters())
        return self.algorithm.evaluate(state, key, episodes)
