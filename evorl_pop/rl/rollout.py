"""Rollouts that collect transitions, one policy or a sharded population.

Episodes run through :func:`evorl_pop.envs.rollout` (the one rollout path of
the project) with ``collect=True``: the steps after the episode ended are
marked invalid and never reach the replay buffer or the return, and a
device's rollout stops once every episode in its slice has ended.

A transition's ``terminal`` flag is set only when the environment ended the
episode before its time limit: at the time limit the value of the next state
is still bootstrapped (Fujimoto et al. 2018 do the same).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop.envs import Env, Episode, Transition, rollout
from evorl_pop.mesh import pad_to_multiple
from evorl_pop.stats import summarize
from evorl_pop.tasks import EvalInfo


def example_transition(env: Env) -> Transition:
    """A zero transition with the shapes of ``env``'s (continuous) steps."""
    obs = jnp.zeros(env.spec.obs_shape, jnp.float32)
    return Transition(
        obs=obs,
        action=jnp.zeros((env.spec.action_dim,), jnp.float32),
        reward=jnp.float32(0.0),
        next_obs=obs,
        terminal=jnp.float32(0.0),
    )


def collect_episode(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    noise_std: float | jax.Array = 0.0,
    num_steps: int | None = None,
) -> Episode:
    """Runs one episode of a deterministic continuous-action policy.

    Args:
      env: an environment with continuous actions.
      policy: ``(params, obs) -> action`` in ``[low, high]``.
      params: the policy parameters.
      key: PRNG key for the reset, the environment and the action noise.
      noise_std: std of Gaussian exploration noise in units of half the
        action range (0 for a noise-free episode).
      num_steps: the episode's length limit (default: the environment's).

    Returns:
      An :class:`~evorl_pop.envs.Episode` with ``transitions`` and ``valid``
      (leading axis ``num_steps``).
    """
    return rollout(env, policy, params, key, None, num_steps, noise_std, collect=True)


@flax.struct.dataclass
class PopulationRollout:
    """What a population's episodes produced.

    ``transitions`` and ``valid`` keep the padded population axis (padded
    members are invalid everywhere); everything else is global and exact.
    """

    returns: jax.Array  # shape=(pop,): episode return of each member
    fitness: jax.Array  # shape=(pop,): returns with NaN / inf replaced by -inf
    transitions: Transition  # leaves shape=(padded_pop, num_steps, ...)
    valid: jax.Array  # bool, shape=(padded_pop, num_steps)
    metrics: dict[str, jax.Array]


def population_rollout(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    mesh: jax.sharding.Mesh,
    population: Any,
    key: jax.Array,
    noise_std: float | jax.Array = 0.0,
    num_steps: int | None = None,
) -> PopulationRollout:
    """One episode per member, the population sharded over the ``POP`` axis.

    Member ``i`` draws all its randomness from ``fold_in(key, i)``, so
    results do not depend on the number of devices. A population size the
    device count does not divide is padded; padded members are masked out of
    every statistic and every transition.

    Args:
      env: an environment with continuous actions.
      policy: ``(params, obs) -> action``.
      mesh: a mesh with the axis ``'POP'``.
      population: policy parameters with a leading population axis.
      key: PRNG key of this rollout.
      noise_std: exploration noise (scalar, or one value per member).
      num_steps: steps per episode (default: the episode limit).

    Returns:
      A :class:`PopulationRollout` whose ``metrics`` hold ``fitness_best``,
      ``fitness_worst``, ``fitness_mean``, ``fitness_std``, ``env_steps``,
      ``episodes`` and ``num_nonfinite`` (members whose return was NaN / inf).
    """
    axis = dist.POP_AXIS_NAME
    pop = jax.tree.leaves(population)[0].shape[0]
    n = mesh.shape[axis]
    noise = jnp.broadcast_to(jnp.asarray(noise_std, jnp.float32), (pop,))
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(pop))
    (population, keys, noise), member_valid = pad_to_multiple((population, keys, noise), n)

    def one(params, key, noise):
        return collect_episode(env, policy, params, key, noise, num_steps)

    # The episodes need no collectives; replication checks would only reject
    # simulators whose scan carries start from constants, so they are off here
    # and on for the statistics below.
    episodes = dist.shmap_vmap(
        one, mesh, in_specs=(P(axis), P(axis), P(axis)), out_specs=P(axis), check_vma=False
    )(population, keys, noise)

    def statistics(ret, steps, member_valid):
        info = EvalInfo(steps=steps, episodes=jnp.ones_like(steps))
        return summarize(ret, info, member_valid, maximize=True, axis_name=axis)

    summary = jax.shard_map(
        statistics, mesh=mesh, in_specs=(P(axis), P(axis), P(axis)), out_specs=P()
    )(episodes.episode_return, episodes.steps, member_valid)
    transitions = episodes.transitions
    valid = episodes.valid & member_valid[:, None]
    returns = summary.scores[:pop]
    metrics = {
        "fitness_best": summary.best,
        "fitness_worst": summary.worst,
        "fitness_mean": summary.mean,
        "fitness_std": summary.std,
        "num_nonfinite": summary.num_nonfinite,
        "env_steps": summary.info.steps,
        "episodes": summary.info.episodes,
    }
    return PopulationRollout(
        returns=returns,
        fitness=jnp.where(jnp.isfinite(returns), returns, -jnp.inf),
        transitions=transitions,
        valid=valid,
        metrics=metrics,
    )


def evaluate(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    num_episodes: int = 1,
    num_steps: int | None = None,
) -> jax.Array:
    """Mean noise-free return of one policy over ``num_episodes`` episodes."""
    keys = jax.random.split(key, num_episodes)
    episodes = jax.vmap(lambda k: rollout(env, policy, params, k, None, num_steps, 0.0))(keys)
    return jnp.mean(episodes.episode_return)
