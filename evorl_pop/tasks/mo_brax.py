"""Multi-objective brax tasks: a policy's return split into the reward's terms.

Each task evolves a policy network's flat weights (unbounded; NSGA-II searches
``[-10, 10]`` by default) on a brax locomotion environment and scores it by a
vector of objectives, each a sum over the episode of one per-step term, all
maximised. The terms are brax's own ``state.metrics`` of the step (the torso's
height: its ``z`` after the step)::

    mo/halfcheetah  reward_run (forward velocity), reward_ctrl (minus the control cost)
    mo/hopper       reward_forward, height (the torso's z)
    mo/hopper3      reward_forward, height, reward_ctrl
    mo/ant          reward_forward, reward_ctrl

brax 0.14.2's swimmer does not run under the JAX installed with it (its fluid
forces call ``jnp.clip(a_min=)``, which JAX no longer takes), so there is no
``mo/swimmer``.

With ``episodes`` above 1 each objective is its mean over the episodes (episode
``j`` with ``split(key, episodes)[j]``). An episode ends at a fall (hopper, ant)
or after ``episode_length`` steps; the step that ends it counts.

The hypervolume's reference point (``ref_point``) is per episode: 0 for the forward
and height objectives (a member counts by moving forward), and the control cost
of full actions (every action at magnitude 1) on every step of the episode for
the control objectives, which no policy pays more than (the policies' actions
lie in ``[-1, 1]``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from evorl_pop.base import EvalInfo, did_you_mean
from evorl_pop.tasks.brax_envs import DEFAULT_BACKEND, DEFAULT_EPISODE_LENGTH, BraxEnv
from evorl_pop.tasks.envs import check_episode_length
from evorl_pop.tasks.policies import make_policy

#: The task's name prefix (as the black-box problems').
PREFIX = "mo/"
#: Height: not one of brax's metrics, but the torso's z after the step.
HEIGHT = "height"
#: Each task: its brax environment and its objectives (brax's metric names, or HEIGHT).
MO_BRAX = {
    "halfcheetah": ("halfcheetah", ("reward_run", "reward_ctrl")),
    "hopper": ("hopper", ("reward_forward", HEIGHT)),
    "hopper3": ("hopper", ("reward_forward", HEIGHT, "reward_ctrl")),
    "ant": ("ant", ("reward_forward", "reward_ctrl")),
}
#: brax's default control cost weight of each environment (``ctrl_cost_weight``).
CTRL_COST_WEIGHT = {"halfcheetah": 0.1, "hopper": 1e-3, "ant": 0.5}


def mo_brax_names() -> list[str]:
    """``mo/<task>`` for every multi-objective brax task."""
    return [PREFIX + name for name in MO_BRAX]


class MOBraxTask:
    """A policy on a brax environment, scored by its reward's terms (module docstring).

    Args:
      name: a key of :data:`MO_BRAX` (``'halfcheetah'``), with or without ``mo/``.
      hidden_sizes: the policy MLP's hidden layers.
      activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
      episodes: episodes per candidate (each objective: the mean over them).
      episode_length: steps after which an episode ends (``None``: 1000).
      backend: the physics backend (``None``: spring).

    Raises:
      ValueError: an unknown name or backend, fewer than 1 episode.
    """

    def __init__(
        self,
        name: str,
        hidden_sizes: Sequence[int] = (32,),
        activation: str = "tanh",
        episodes: int = 1,
        episode_length: int | None = None,
        backend: str | None = None,
    ):
        name = name.removeprefix(PREFIX)
        if name not in MO_BRAX:
            hint = did_you_mean(name, MO_BRAX, 3)
            valid = ", ".join(mo_brax_names())
            raise ValueError(f"Unknown multi-objective brax task {name!r}.{hint} Valid: {valid}.")
        if episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {episodes}.")
        check_episode_length(episode_length)
        env_name, self.objective_names = MO_BRAX[name]
        backend = backend if backend is not None else DEFAULT_BACKEND
        self.name = PREFIX + name
        self.backend = backend
        self.episodes = episodes
        self.episode_length = episode_length or DEFAULT_EPISODE_LENGTH
        self.env = BraxEnv(env_name, backend, self.episode_length)
        self.spec = self.env.spec
        self.policy = make_policy(self.spec, hidden_sizes, activation)
        flat, self.unravel = ravel_pytree(self.policy.init(jax.random.key(0)))
        self.num_dims = int(flat.size)
        self.num_objectives = len(self.objective_names)
        self.maximize = (True,) * self.num_objectives
        cost = CTRL_COST_WEIGHT[env_name] * (self.spec.action_dim * self.episode_length)
        self.ref_point = tuple(-cost if o == "reward_ctrl" else 0.0 for o in self.objective_names)

    def init_solution(self, key):
        return ravel_pytree(self.policy.init(key))[0]

    def init_state(self):
        return ()

    def update_state(self, task_state, info_total):
        return task_state

    def params(self, solution):
        """The policy's parameters of a flat solution."""
        return self.unravel(solution)

    def terms(self, inner) -> jax.Array:
        """The objectives' per-step terms of a brax state after a step."""
        values = [
            inner.pipeline_state.x.pos[0, 2] if o == HEIGHT else inner.metrics[o]
            for o in self.objective_names
        ]
        return jnp.stack(values).astype(jnp.float32)

    def episode(self, params, key):
        """``(objectives, steps)`` of one episode: the terms summed while it runs."""
        # the key schedule of a rollout: the reset from the episode key's second half
        _, reset_key = jax.random.split(key)
        obs, state = self.env.reset(reset_key)
        sums = jnp.zeros(self.num_objectives, jnp.float32)

        def body(carry, _):
            obs, state, sums, steps, alive = carry
            obs, state, _, done = self.env.step(key, state, self.policy(params, obs))
            sums = sums + jnp.where(alive, self.terms(state.inner), 0.0)
            return (obs, state, sums, steps + alive, alive & ~done), None

        carry = (obs, state, sums, jnp.zeros((), jnp.int32), jnp.ones((), bool))
        carry, _ = jax.lax.scan(body, carry, None, length=self.episode_length)
        return carry[2], carry[3]

    def evaluate(self, solution, key, task_state):
        """The objectives (each its mean over the episodes) and the steps taken."""
        del task_state
        params = self.params(solution)
        sums, steps = jax.vmap(self.episode, (None, 0))(
            params, jax.random.split(key, self.episodes)
        )
        info = EvalInfo(steps=jnp.sum(steps), episodes=jnp.int32(self.episodes))
        return jnp.mean(sums, axis=0), info
