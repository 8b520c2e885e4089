"""Team policies: one network per agent of a multi-agent environment, or one for all.

A multi-agent environment of :mod:`evorl_pop.tasks.marl_envs` observes its team as
one array, a row per agent (``(num_agents, obs_dim)``, every agent's observation
zero-padded to the widest), and takes one action per agent (``(num_agents,)``
action indices, or ``(num_agents, action_dim)`` continuous actions). A team
policy maps the one to the other, so that a whole team is one candidate of a
population, its weights one flat vector::

    team="shared"      one MLP, applied to every agent's row with the agent's
                       one-hot id appended: the same weights, told apart by the id
    team="per_agent"   one MLP per agent (its own block of weights), each on its row

Discrete agents with fewer actions than the widest see their missing actions'
logits pushed far below the others, so that the argmax never picks one.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import EnvSpec
from evorl_pop.tasks.policies import MLP, Policy

#: How a team's weights are split (the ``team`` setting).
TEAMS = ("shared", "per_agent")
#: What a missing action's logit becomes: below any logit an MLP gives.
MASKED_LOGIT = -1e9


class TeamMLP(nn.Module):
    """An MLP per agent (or one for all) over a team's observations.

    Takes ``(..., num_agents, obs_dim)``; leading axes are batch axes. Returns
    ``(..., num_agents, out_dim)``.

    Attributes:
      hidden_sizes: each MLP's hidden layers.
      out_dim: outputs per agent (the widest agent's logits or action dimensions).
      num_agents: the agents of the team.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      team: ``'shared'`` (one MLP, the agent's one-hot id appended to its row) or
        ``'per_agent'`` (an MLP each).
      actions: discrete teams: how many actions each agent has (its logits past
        that are masked); ``None``: every output is valid.
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    num_agents: int
    activation: str = "tanh"
    team: str = "shared"
    actions: tuple[int, ...] | None = None

    @nn.compact
    def __call__(self, obs):
        obs = obs.astype(jnp.float32)
        n = self.num_agents
        if self.team == "shared":
            x = obs
            if n > 1:
                ids = jnp.broadcast_to(jnp.eye(n, dtype=obs.dtype), (*obs.shape[:-1], n))
                x = jnp.concatenate([obs, ids], -1)
            out = MLP(tuple(self.hidden_sizes), self.out_dim, self.activation)(x)
        elif self.team == "per_agent":
            agents = nn.vmap(
                MLP,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=obs.ndim - 2,
                out_axes=obs.ndim - 2,
                axis_size=n,
            )
            out = agents(tuple(self.hidden_sizes), self.out_dim, self.activation, name="agents")(
                obs
            )
        else:
            raise ValueError(f"Unknown team {self.team!r}; choose from {TEAMS}.")
        if self.actions is not None and min(self.actions) < self.out_dim:
            valid = np.arange(self.out_dim)[None, :] < np.asarray(self.actions)[:, None]
            out = jnp.where(valid, out, MASKED_LOGIT)
        return out


def team_policy(
    spec: EnvSpec,
    actions: tuple[int, ...],
    hidden_sizes: Sequence[int] = (32,),
    activation: str = "tanh",
    team: str = "shared",
) -> Policy:
    """The :class:`~evorl_pop.tasks.policies.Policy` of a team (module docstring).

    Args:
      spec: the multi-agent environment's spec (observations ``(num_agents, obs_dim)``).
      actions: each agent's action count (discrete) or action dimension (continuous).
      hidden_sizes: each MLP's hidden layers.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      team: one of :data:`TEAMS`.

    Returns:
      A policy whose action is ``(num_agents,)`` indices or ``(num_agents, action_dim)``.

    Raises:
      ValueError: an unknown team.
    """
    if team not in TEAMS:
        raise ValueError(f"Unknown team {team!r}; choose from {TEAMS}.")
    module = TeamMLP(
        tuple(hidden_sizes),
        spec.action_dim,
        spec.obs_shape[0],
        activation,
        team,
        tuple(actions) if spec.discrete else None,
    )
    return Policy(module, spec)


__all__ = ["MASKED_LOGIT", "TEAMS", "TeamMLP", "team_policy"]
