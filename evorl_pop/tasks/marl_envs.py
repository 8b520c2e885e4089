"""JaxMARL's multi-agent environments behind the :class:`~evorl_pop.core.interfaces.Env`
protocol: a team stepped as one environment.

The tasks are ``marl/<JaxMARL id>``: the particle worlds of MPE
(``marl/MPE_simple_spread_v3``, ...) and the multi-agent brax bodies of MABrax
(``marl/ant_4x2``, ...; ``marl/humanoid_9_8`` is JaxMARL's ``humanoid_9|8``).
JaxMARL keys everything by agent; here the agents keep JaxMARL's order
(``env.agents``) and every per-agent quantity is an array with a row per agent::

    reset(key)                 -> obs (num_agents, obs_dim), TeamState
    step(key, state, action)   -> obs, state, team reward, done
    step_agents(...)           -> obs, state, rewards (num_agents,), done
    global_state(state)        -> the world's state, for a centralised critic

Observations narrower than the widest agent's are zero-padded; an action is
``(num_agents,)`` action indices (discrete) or ``(num_agents, action_dim)``
(continuous, each agent reading its first dimensions). The team's reward is
JaxMARL's shared reward (``rewards['__all__']``, MABrax) where the task has
one, else the sum of the agents' rewards (MPE). An episode ends at
``dones['__all__']`` or after exactly ``episode_length`` steps (JaxMARL's MPE
reports its own time limit one step later: it compares the step count before the
step); it is then frozen (no auto-reset: later steps return the same state and
zero reward).

A candidate of an ES population is a whole team (:mod:`evorl_pop.tasks.teams`:
``team='shared'`` or ``'per_agent'``), scored by the team's return.

JaxMARL is an optional dependency (``pip install -e '.[marl]'``); it is imported
when the first environment is built. MABrax needs brax as well.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop import registry
from evorl_pop.base import ConfigError, EnvSpec
from evorl_pop.tasks.control import ControlTask, JaxEnvFamily
from evorl_pop.tasks.envs import check_episode_length
from evorl_pop.tasks.teams import TEAMS, team_policy

MARL_PREFIX = "marl/"
#: MPE's particle worlds, JaxMARL's ids: cooperative, or teams against each other
#: (the docs' table says which).
MPE_TASKS = (
    "MPE_simple_v3",
    "MPE_simple_spread_v3",
    "MPE_simple_reference_v3",
    "MPE_simple_speaker_listener_v4",
    "MPE_simple_crypto_v3",
    "MPE_simple_push_v3",
    "MPE_simple_adversary_v3",
    "MPE_simple_tag_v3",
    "MPE_simple_world_comm_v3",
    "MPE_simple_facmac_v1",
    "MPE_simple_facmac_3a_v1",
    "MPE_simple_facmac_6a_v1",
    "MPE_simple_facmac_9a_v1",
)
#: MABrax's bodies: a task's name to JaxMARL's id (names stay file- and shell-safe).
MABRAX_TASKS = {
    "ant_4x2": "ant_4x2",
    "halfcheetah_6x1": "halfcheetah_6x1",
    "hopper_3x1": "hopper_3x1",
    "humanoid_9_8": "humanoid_9|8",
    "walker2d_2x3": "walker2d_2x3",
}
#: MABrax bodies whose episodes only end at the time limit.
MABRAX_FIXED_LENGTH = frozenset({"halfcheetah_6x1"})
#: MPE's own episode length (JaxMARL's ``max_steps``), MABrax's.
MPE_EPISODE_LENGTH = 25
MABRAX_EPISODE_LENGTH = 1000


@contextlib.contextmanager
def _quiet():
    """Hides JaxMARL's notices: it prints which optional environments it found, and
    MABrax warns that brax is no longer maintained. MABrax's module hides brax's own
    output by swapping ``sys.stdout`` and then sets it back to ``sys.__stdout__``: that
    one is swapped too, and everything restored after."""
    saved = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    sink = io.StringIO()
    sys.stdout = sys.__stdout__ = sink
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved


def _import_jaxmarl():
    """JaxMARL, imported quietly (:func:`_quiet`)."""
    try:
        with _quiet():
            import jaxmarl
    except ImportError as err:
        raise ConfigError(
            f"marl/ tasks need JaxMARL, which is not installed ({err}); "
            "install it with: pip install -e '.[marl]'"
        ) from err
    return jaxmarl


@flax.struct.dataclass
class TeamState:
    """JaxMARL's state with the episode's clock and its sticky end flag."""

    inner: Any  # the JaxMARL environment's state
    time: jax.Array  # int32: steps taken
    done: jax.Array  # bool: the episode has ended


class MultiAgentEnv:
    """A JaxMARL environment stepped as one team, without auto-reset (module docstring).

    Args:
      name: an id of :data:`MPE_TASKS` or a key of :data:`MABRAX_TASKS` (no prefix).
      episode_length: steps after which the episode ends (``None``: 25 for MPE, 1000
        for MABrax).

    Attributes:
      agents: JaxMARL's agent names, in the order of the rows.
      obs_dims: each agent's observation width (before padding).
      actions: each agent's action count (discrete) or action dimension (continuous).
      shared_reward: the task rewards the team as one (MABrax); else the team's reward
        is the sum of its agents'.
    """

    def __init__(self, name: str, episode_length: int | None = None):
        if name not in MPE_TASKS and name not in MABRAX_TASKS:
            valid = (*MPE_TASKS, *MABRAX_TASKS)
            raise ValueError(f"Unknown multi-agent task {name!r}; choose from {valid}.")
        check_episode_length(episode_length)
        jaxmarl = _import_jaxmarl()
        self.mabrax = name in MABRAX_TASKS
        if self.mabrax:
            length = episode_length or MABRAX_EPISODE_LENGTH
            with _quiet():
                env = jaxmarl.make(MABRAX_TASKS[name], episode_length=length, auto_reset=False)
            terminates = name not in MABRAX_FIXED_LENGTH
        else:
            length = episode_length or MPE_EPISODE_LENGTH
            try:
                env = jaxmarl.make(name, max_steps=length)
            except TypeError:  # FACMAC's variants fix their arguments: the limit set after
                env = jaxmarl.make(name)
                env.max_steps = length
            terminates = False  # MPE's episodes run to the time limit
        self.env = env
        self.agents = tuple(env.agents)
        # the observations' widths as reset makes them (FACMAC's 6a and 9a declare spaces
        # narrower than the observations they return)
        first_obs = jax.eval_shape(env.reset, jax.random.key(0))[0]
        self.obs_dims = tuple(int(np.prod(first_obs[a].shape)) for a in self.agents)
        spaces = [env.action_space(a) for a in self.agents]
        discrete = hasattr(spaces[0], "n")
        if discrete:
            self.actions = tuple(int(s.n) for s in spaces)
            low = high = None
        else:
            self.actions = tuple(int(np.prod(s.shape)) for s in spaces)
            width = max(self.actions)
            low = _bound(spaces, "low", width)
            high = _bound(spaces, "high", width)
        self.spec = EnvSpec(
            name=MARL_PREFIX + name,
            obs_shape=(len(self.agents), max(self.obs_dims)),
            discrete=discrete,
            action_dim=max(self.actions),
            action_low=low,
            action_high=high,
            max_steps=int(length),
            terminates=terminates,
        )
        self._reset = jax.jit(env.reset)
        self._step = jax.jit(env.step_env)
        rewards = jax.eval_shape(lambda k: self._step(k, *self._first(k)), jax.random.key(0))[2]
        self.shared_reward = "__all__" in rewards

    def _first(self, key):
        obs, state = self._reset(key)
        return state, self.agent_actions(jnp.zeros(self._action_shape(), self._action_dtype()))

    def _action_shape(self) -> tuple[int, ...]:
        n = len(self.agents)
        return (n,) if self.spec.discrete else (n, self.spec.action_dim)

    def _action_dtype(self):
        return jnp.int32 if self.spec.discrete else jnp.float32

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def stack(self, per_agent: dict) -> jax.Array:
        """A dict of per-agent observations as rows, each zero-padded to the widest."""
        width = self.spec.obs_shape[1]
        rows = []
        for agent in self.agents:
            row = jnp.ravel(per_agent[agent]).astype(jnp.float32)
            rows.append(jnp.pad(row, (0, width - row.shape[0])))
        return jnp.stack(rows)

    def agent_actions(self, action: jax.Array) -> dict:
        """The team's action (a row per agent) as JaxMARL's dict, each agent's own part
        (an index below its action count; its first action dimensions)."""
        action = jnp.reshape(action, self._action_shape())
        if self.spec.discrete:
            action = action.astype(jnp.int32)
            last = {a: n - 1 for a, n in zip(self.agents, self.actions, strict=True)}
            return {a: jnp.minimum(action[i], last[a]) for i, a in enumerate(self.agents)}
        width = dict(zip(self.agents, self.actions, strict=True))
        return {a: action[i, : width[a]] for i, a in enumerate(self.agents)}

    def reset(self, key):
        obs, inner = self._reset(key)
        zero = jnp.zeros((), jnp.int32)
        return self.stack(obs), TeamState(inner, zero, zero.astype(bool))

    def _advance(self, key, state: TeamState, action):
        """``(obs, state, each agent's reward, the team's, done)`` of one step."""
        obs, new, rewards, dones, _ = self._step(key, state.inner, self.agent_actions(action))
        inner = jax.tree.map(lambda old, x: jnp.where(state.done, old, x), state.inner, new)
        time = state.time + 1
        done = state.done | dones["__all__"] | (time >= self.spec.max_steps)
        each = jnp.stack([rewards[a] for a in self.agents]).astype(jnp.float32)
        team = rewards["__all__"].astype(jnp.float32) if self.shared_reward else jnp.sum(each)
        each = jnp.where(state.done, 0.0, each)
        team = jnp.where(state.done, 0.0, team)
        return self.stack(obs), TeamState(inner, time, done), each, team, done

    def step_agents(self, key, state: TeamState, action):
        """:meth:`step`, with every agent's own reward: ``(num_agents,)``, in agent order."""
        obs, state, each, _, done = self._advance(key, state, action)
        return obs, state, each, done

    def step(self, key, state: TeamState, action):
        obs, state, _, team, done = self._advance(key, state, action)
        return obs, state, team, done

    def global_state(self, state: TeamState) -> jax.Array:
        """The world's state for a centralised critic: JaxMARL's ``world_state`` where the
        environment has one, else every agent's observation, concatenated in agent order."""
        if hasattr(self.env, "world_state"):
            return jnp.ravel(self.env.world_state(state.inner)).astype(jnp.float32)
        obs = self.env.get_obs(state.inner)
        return jnp.concatenate([jnp.ravel(obs[a]).astype(jnp.float32) for a in self.agents])


def _bound(spaces, which: str, width: int) -> tuple[float, ...]:
    """One bound of continuous action spaces, per action dimension; ValueError unless every
    agent's dimensions share it."""
    values = {float(v) for s in spaces for v in np.ravel(np.asarray(getattr(s, which)))}
    if len(values) != 1:
        raise ValueError(f"agents' action bounds differ ({which}: {sorted(values)})")
    return (values.pop(),) * width


class MultiAgentFamily(JaxEnvFamily):
    """JaxMARL's MPE and MABrax tasks (:class:`MultiAgentEnv`), named ``marl/<id>``; a
    task's candidate is a whole team (``team``: :data:`~evorl_pop.tasks.teams.TEAMS`)."""

    description = "JaxMARL's multi-agent tasks in JAX, a team per candidate: MPE, MABrax"
    pattern = MARL_PREFIX + "<task>"
    example = MARL_PREFIX + "MPE_simple_spread_v3"
    settings = {"team": TEAMS}
    #: Its environments step a team: a learner of one agent's policy refuses them.
    multi_agent = True
    prefix, ids, env_class = MARL_PREFIX, (*MPE_TASKS, *MABRAX_TASKS), MultiAgentEnv

    def make_task(self, name: str, **kwargs) -> ControlTask:
        """A :class:`~evorl_pop.tasks.control.ControlTask` whose candidate is a team:
        ``team`` (``'shared'``, the default, or ``'per_agent'``), ``hidden_sizes`` and
        ``activation`` build its :func:`~evorl_pop.tasks.teams.team_policy`; the other
        ``kwargs`` are the control task's."""
        team = kwargs.pop("team", None) or "shared"
        kind = kwargs.pop("policy", "auto")
        if kind not in ("auto", "mlp") or kwargs.get("policy_module") is not None:
            raise ConfigError(f"policy: {name} takes a team of MLPs; leave policy at 'auto'.")
        if kwargs.get("virtual_batch_norm"):
            raise ConfigError(f"virtual_batch_norm: {name}'s team policies do not fold it.")
        env = self.make_env(name, episode_length=kwargs.get("episode_length"))
        hidden = kwargs.pop("hidden_sizes", (32,))
        activation = kwargs.pop("activation", "tanh")
        policy = team_policy(env.spec, env.actions, hidden, activation, team)
        return ControlTask(env, policy=policy, **kwargs)


registry.register_env_family("marl", MultiAgentFamily())
