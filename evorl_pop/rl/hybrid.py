"""What the algorithms with RL learners beside a population share (CEM-RL, ERL, PBT).

Their settings (:class:`HybridConfig`): the task, the population, the replay
buffer, and ``learner``, the name of a registered learner
(:func:`evorl_pop.registry.register_learner`). A config field named after the
learner (``td3``, ``sac``, PBT's ``ppo``) holds its settings; any other learner's
(a plug-in's) are its spec's defaults changed by ``learner_settings``::

    evorl-pop train -a cemrl --plugin my_learner --set learner=mine \\
        --set learner_settings.batch_size=64

:class:`ReplayLearner` is the half of a hybrid's RL part
(:class:`~evorl_pop.core.interfaces.ReplayLearner`) that every learner shares: the
replay buffer that takes every valid step of the population's evaluations, the
learning gate (:func:`when_ready`), the ``'DP'`` split of each minibatch over the
population's devices, and CEM-RL's training of several actors against one shared
critic. Each learner's own half sits beside it (:class:`~evorl_pop.rl.td3.TD3Learner`,
:class:`~evorl_pop.rl.sac.SACHybridLearner`). :class:`ReplayMember` makes such a learner
a PBT member with a replay buffer of its own (TD3's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.base import ConfigError, EnvSpec, check_config, did_you_mean
from evorl_pop.core.interfaces import Acting
from evorl_pop.rl import data_parallel
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.tasks.envs import check_environment, steps_on_host
from evorl_pop.tasks.rollout import Episode, Transition, evaluate_episodes, rollout

#: gymnax environments with continuous actions (those an actor-critic learner can learn).
CONTINUOUS_ENVS = (
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "Reacher-misc",
    "Swimmer-misc",
    "PointRobot-misc",
)

#: What a learner spec's part makes of a learner, for messages.
_ROLES = {"hybrid": "the RL part of CEM-RL or ERL", "member": "a PBT member"}


def check_continuous(spec: EnvSpec, algorithm: str) -> None:
    """Raises a ConfigError, in one line, when ``spec`` has discrete actions.

    Args:
      spec: the environment's spec.
      algorithm: what needs continuous actions, for the message (``'TD3'``).
    """
    if spec.discrete:
        raise ConfigError(
            f"{algorithm} needs continuous actions (an actor of actions and critics Q(s, a)), "
            f"but {spec.name!r} has {spec.action_dim} discrete actions: use a continuous task, "
            f"e.g. {', '.join(map(repr, CONTINUOUS_ENVS[:2]))} or 'brax/hopper', or PPO "
            "(-a ppo)."
        )


def _fits(default: Any, value: Any) -> bool:
    """Whether ``value`` may replace a setting whose default is ``default``."""
    if isinstance(default, bool) or isinstance(value, bool):
        return type(value) is type(default)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, int | str):
        return type(value) is type(default)
    if isinstance(default, tuple):
        return isinstance(value, list | tuple)
    return True  # an optional or structured setting: the learner's validate() decides


def changed_settings(defaults: Any, changes: Mapping[str, Any], prefix: str) -> Any:
    """``defaults`` (a frozen config dataclass) with the settings ``changes`` names.

    Args:
      defaults: the learner's default settings.
      changes: setting name to value, as a config file or ``--set`` gives them (lists for
        tuples).
      prefix: where the changes come from, for messages (``'learner_settings.'``).

    Raises:
      ConfigError: a name the settings do not have, or a value of the wrong kind.
    """
    names = [f.name for f in dataclasses.fields(defaults)]
    values = {}
    for name, value in changes.items():
        if name not in names:
            hint = did_you_mean(name, names)
            raise ConfigError(
                f"{prefix}{name}: not a setting of {type(defaults).__name__}.{hint} "
                f"Valid: {', '.join(names)}."
            )
        default = getattr(defaults, name)
        if not _fits(default, value):
            raise ConfigError(
                f"{prefix}{name}: expected a value like {default!r}, got {value!r} "
                f"({type(value).__name__})."
            )
        values[name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(defaults, **values)


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Settings every algorithm with RL learners beside a population has (CEM-RL, ERL and
    PBT add their own, among them a field for each built-in learner's settings).

    Attributes:
      task: a continuous-action environment.
      population_size: actors (or learners) evaluated per generation.
      learning_starts: replay buffer size before gradient updates begin.
      buffer_capacity: replay buffer size.
      episode_length: steps per episode (``None``: the environment's limit).
      eval_episodes: noise-free episodes that evaluate the algorithm's actor
        each generation (``eval_return``).
      learner: the RL learner, by its registered name: ``'td3'``, ``'sac'`` or ``'ddpg'``
        (CEM-RL, ERL, PBT), ``'ppo'`` or ``'dqn'`` (PBT), or a plug-in's (``--plugin MODULE``).
      learner_settings: the settings of a learner without a field of its own in this
        config (a plug-in's), as changes to its defaults, e.g. ``{batch_size: 64}``
        (``--set learner_settings.batch_size=64``); the learner checks them.
    """

    task: str = "Pendulum-v1"
    population_size: int = 10
    learning_starts: int = 2000
    buffer_capacity: int = 200_000
    episode_length: int | None = None
    eval_episodes: int = 5
    learner: str = "td3"
    learner_settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    #: The part of a learner's spec the algorithm builds
    #: (:class:`~evorl_pop.registry.LearnerSpec`): ``'hybrid'`` or ``'member'``.
    ROLE = "hybrid"
    #: The learners with which the algorithm takes tasks stepped on the host (Gymnasium's):
    #: its population's collecting evaluations run there (CEM-RL's and ERL's), or its
    #: members' lanes and episodes (PBT's).
    HOST_LEARNERS = ()

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        host = steps_on_host(self.task)
        algorithm = type(self).__module__.rpartition(".")[2]
        if host and self.HOST_LEARNERS and self.learner not in self.HOST_LEARNERS:
            *others, last = self.HOST_LEARNERS
            learners = f"{', '.join(others)} or {last}" if others else last
            raise ConfigError(
                f"task: {algorithm} with learner {self.learner!r} steps its environments in JAX, "
                f"and {self.task!r} is stepped on the host; learner "
                f"{learners} takes it, or choose an environment of "
                "evorl-pop list."
            )
        if not (host and self.learner in self.HOST_LEARNERS):
            check_environment(self.task, algorithm)
        settings = self.learner_config()
        part = self.learner_part()
        settings.validate()
        least = {"population_size": 2, "eval_episodes": 1, "learning_starts": 0}
        check_config(self, least={**least, "episode_length": 1})
        if part.replay and self.buffer_capacity < settings.batch_size:
            batch = settings.batch_size
            raise ConfigError(
                f"The replay buffer capacity {self.buffer_capacity} is smaller than one "
                f"{self.learner.upper()} batch ({batch}); make buffer_capacity at least {batch}."
            )
        if self.learning_starts > self.buffer_capacity:
            raise ConfigError(
                f"learning_starts={self.learning_starts} exceeds the buffer capacity "
                f"{self.buffer_capacity}, so gradient updates would never start; lower it or "
                "enlarge the buffer."
            )

    def learner_part(self) -> Any:
        """The part of the chosen learner's spec that this algorithm builds (:attr:`ROLE`).

        Raises:
          ConfigError: an unknown learner, or one without that part, naming the valid ones.
        """
        spec = registry.LEARNERS.find(self.learner)
        part = None if spec is None else getattr(spec, self.ROLE)
        if part is not None:
            return part
        valid = registry.learners_with(self.ROLE)
        listed = f"Valid: {', '.join(valid)}."
        if spec is not None:
            raise ConfigError(f"learner: {self.learner!r} cannot be {_ROLES[self.ROLE]}. {listed}")
        hint = did_you_mean(self.learner, valid)
        raise ConfigError(
            f"learner: unknown value {self.learner!r}.{hint} {listed} A learner of your own: "
            "--plugin MODULE."
        )

    def _has_section(self) -> bool:
        names = {f.name for f in dataclasses.fields(self)}
        return self.learner in names and dataclasses.is_dataclass(getattr(self, self.learner))

    def learner_config(self) -> Any:
        """The chosen learner's settings: this config's field of its name, else its spec's
        defaults changed by ``learner_settings``.

        Raises:
          ConfigError: ``learner_settings`` given for a learner with a field of its own,
            or naming settings the learner does not have.
        """
        if not self._has_section():
            defaults = self.learner_part().defaults
            return changed_settings(defaults, self.learner_settings, "learner_settings.")
        if self.learner_settings:
            example = next(iter(self.learner_settings))
            raise ConfigError(
                f"learner_settings: {self.learner}'s settings are under {self.learner} "
                f"(--set {self.learner}.{example}=...); leave learner_settings empty."
            )
        return getattr(self, self.learner)

    def setting_name(self, name: str) -> str:
        """Where the learner's setting ``name`` is given (``'td3.batch_size'``,
        ``'learner_settings.batch_size'``), for messages."""
        return f"{self.learner if self._has_section() else 'learner_settings'}.{name}"


@dataclasses.dataclass(frozen=True)
class EvoRLConfig(HybridConfig):
    """Settings of a hybrid that evolves its learner's actors (CEM-RL, ERL): those of
    :class:`HybridConfig`, whose ``learner`` is the RL part (its spec's ``hybrid``)."""

    def actor_task(self) -> Any:
        """The control task of the actors: the learner's actor network on ``task``; its
        episodes keep their transitions for the learner."""
        settings = self.learner_config()
        return self.learner_part().actor_task(self, settings)

    def rl_learner(self, task: Any, mesh: Mesh, num_updates: int, algorithm: str) -> Any:
        """The learner beside the population.

        Args:
          task: the actors' task (:meth:`actor_task`).
          mesh: the population's ``'POP'`` mesh; minibatches split over its devices.
          num_updates: gradient updates per call of the learner's ``learn``.
          algorithm: the algorithm's name, for errors.

        Returns:
          A :class:`~evorl_pop.core.interfaces.ReplayLearner`.
        """
        settings = self.learner_config()
        part = self.learner_part()
        learner = part.learner(task, self, settings, mesh, num_updates, algorithm)
        where = f"learner {self.learner!r} (hybrid.learner)"
        return registry.check_built(where, learner, "ReplayLearner")


def example_transition(spec: EnvSpec) -> Transition:
    """A zero transition with the shapes of a continuous-action environment's steps."""
    obs = jnp.zeros(spec.obs_shape, jnp.float32)
    action = jnp.zeros((spec.action_dim,), jnp.float32)
    zero = jnp.float32(0.0)
    return Transition(obs=obs, action=action, reward=zero, next_obs=obs, terminal=zero)


def when_ready(ready: jax.Array, fn: Callable, losses: tuple[str, ...], *operands: Any) -> Any:
    """The learning gate: ``fn(*operands)`` when ``ready``, else the operands unchanged
    and NaN ``losses`` (``fn`` returns ``(*operands, losses)``)."""
    nan = jnp.float32(jnp.nan)

    def skip(*operands):
        return (*operands, dict.fromkeys(losses, nan))

    return jax.lax.cond(ready, fn, skip, *operands)


class ReplayLearner:
    """The shared half of a learner fed by a population's evaluations
    (:class:`~evorl_pop.core.interfaces.ReplayLearner`).

    The replay buffer takes every valid step the population's evaluation
    collects; gradient updates start once it holds ``learning_starts`` steps
    (and a batch), and split each minibatch over a ``'DP'`` mesh on the
    population's devices. A subclass sets :attr:`learn` (``(state, buffer, key)
    -> (state, losses)``, made by :meth:`data_parallel`) and defines ``init``,
    ``actor``, ``shared`` and ``with_actor``; it explores with Gaussian action noise
    unless it defines ``explore`` too.

    Args:
      task: the control task the population is evaluated on (its policy is the actor).
      config: the algorithm's :class:`HybridConfig`.
      mesh: the population's ``'POP'`` mesh.
      batch_size: the learner's global minibatch size.
      learner: its name, for errors.

    Raises:
      ConfigError: a batch the devices do not split.
    """

    collect = True  # the engine's evaluations return transitions
    #: The losses a generation that does not learn reports as NaN.
    LOSSES = ("critic_loss", "actor_loss")
    #: ``(state, buffer, key) -> (state, losses)``, set by a subclass's ``__init__``.
    learn: Callable

    def __init__(self, task, config: HybridConfig, mesh: Mesh, batch_size: int, learner: str):
        self.task = task
        self.config = config
        self.batch_size = batch_size
        name = config.setting_name("batch_size")
        # A program with host callbacks (a task stepped on the host) takes one mesh: the
        # population's, whose axis then splits the minibatches too.
        self.host = steps_on_host(config.task)
        self.dp_mesh = mesh if self.host else data_parallel.dp_mesh(mesh)
        #: The axis the minibatches split over (``'DP'``, or the population's).
        self.axis = self.dp_mesh.axis_names[0]
        what = f"A {learner} minibatch's samples"
        data_parallel.check_split(name, batch_size, self.dp_mesh.size, what)

    def data_parallel(self, local: Callable) -> Callable:
        """``local(state, buffer, key)`` on every device of the ``'DP'`` mesh, its
        arguments and results replicated (its gradients averaged over ``'DP'``)."""
        return jax.shard_map(local, mesh=self.dp_mesh, in_specs=(P(), P(), P()), out_specs=P())

    def empty_buffer(self) -> ReplayBuffer:
        """An empty replay buffer of the config's capacity."""
        example = example_transition(self.task.spec)
        return ReplayBuffer.create(example, self.config.buffer_capacity)

    def ready(self, buffer: ReplayBuffer) -> jax.Array:
        """Whether ``buffer`` holds enough steps to learn from (the learning gate)."""
        return buffer.size >= max(self.config.learning_starts, self.batch_size)

    def learn_if(self, ready: jax.Array, fn: Callable, *operands: Any) -> Any:
        """:func:`when_ready` with this learner's :attr:`LOSSES`."""
        return when_ready(ready, fn, self.LOSSES, *operands)

    def init_shared(self, key: jax.Array) -> Any:
        """A fresh shared part (CEM-RL's): that of a fresh learner state."""
        return self.shared(self.init(key))

    def explore(self, params: Any, key: jax.Array, noise_std: float) -> Episode:
        """An episode of the actor ``params`` with Gaussian action noise of
        ``noise_std`` (half action ranges), its transitions collected."""
        if self.host:  # a Gymnasium task's episode, stepped on the host
            return self.task.explore(params, key, noise_std)
        length = self.config.episode_length
        return rollout(
            self.task.env, self.task.policy, params, key, None, length, noise_std, collect=True
        )

    def train_actors(self, shared: Any, flat: jax.Array, buffer: ReplayBuffer, key: jax.Array):
        """The learner's updates of each actor in turn, all against (and training)
        one shared critic (CEM-RL's actors).

        Each actor starts a fresh optimizer state (``with_actor``); its
        :attr:`learn` updates train the critic too, which the next actor takes.

        Args:
          shared: the shared critic (``shared`` of a learner state).
          flat: the actors to train, flat, shape ``(actors, num_params)``.
          buffer: the shared replay buffer.
          key: PRNG key.

        Returns:
          ``(shared, flat, losses)`` with the trained actors, flat.
        """

        def body(shared, xs):
            actor_flat, key = xs
            state = self.with_actor(shared, self.task.unravel(actor_flat))
            state, losses = self.learn(state, buffer, key)
            return self.shared(state), (ravel_pytree(self.actor(state))[0], losses)

        keys = jax.random.split(key, flat.shape[0])
        shared, (flat, losses) = jax.lax.scan(body, shared, (flat, keys))
        return shared, flat, jax.tree.map(jnp.mean, losses)


class ReplayMember:
    """A PBT member that learns off-policy from a replay buffer of its own (TD3's):
    its learner part is the learner's state, its own part the buffer
    (:class:`~evorl_pop.algorithms.pbt_members.Member`).

    An interval is ``interval / episode`` episodes, each collected with Gaussian
    action noise (``exploration_noise``, or the member's searched value) into the
    buffer, then ``updates_per_step`` gradient updates per step of the episode
    once the buffer holds ``learning_starts`` steps and a batch.

    Args:
      task: the members' control task (its policy is the actor).
      config: PBT's config (``interval``, ``exploration_noise``, ``updates_per_step``,
        ``learning_starts``, ``buffer_capacity``).
      batch_size: the learner's minibatch size.
      make_learner: ``make_learner(values)``: the learner with a member's searched
        values (name to traced scalar): ``init(key)`` and ``learn(state, buffer, key,
        num_updates) -> (state, losses)``, on one device.
      actor: ``actor(state)``: the actor's parameters in a learner state.
      losses: the names of the losses ``learn`` returns.
      algorithm: what the members are, for errors.

    Raises:
      ConfigError: a discrete-action task, or an interval that is not a whole number
        of episodes.
    """

    def __init__(
        self,
        task: Any,
        config: Any,
        batch_size: int,
        make_learner: Callable[[dict], Any],
        actor: Callable[[Any], Any],
        losses: tuple[str, ...],
        algorithm: str,
    ):
        self.config = config
        self.task = task
        self.env = task.env
        self.policy = task.policy
        #: Whether the task steps on the host (Gymnasium's): its episodes run there.
        self.host = steps_on_host(config.task)
        self.make_learner = make_learner
        self.actor = actor
        self.losses = losses
        check_continuous(self.env.spec, algorithm)
        self.episode_length = self.env.spec.max_steps
        length = self.episode_length
        if config.interval < length or config.interval % length:
            raise ConfigError(
                f"interval={config.interval} must be a whole number of {length}-step episodes, "
                f"e.g. {max(1, config.interval // length) * length}."
            )
        self.episodes = config.interval // length
        self.num_updates = max(1, round(config.updates_per_step * length))
        self.start = max(config.learning_starts, batch_size)

    def init(self, key: jax.Array) -> tuple[Any, ReplayBuffer]:
        """A fresh member: ``(learner part, own part)``."""
        example = example_transition(self.env.spec)
        buffer = ReplayBuffer.create(example, self.config.buffer_capacity)
        return self.make_learner({}).init(key), buffer

    def train(self, learner: Any, buffer: ReplayBuffer, values: dict, key: jax.Array):
        """One interval (:meth:`~evorl_pop.algorithms.pbt_members.Member.train`): episodes
        into the buffer, each followed by updates; the metrics are each episode's losses
        (NaN before learning starts)."""
        rl = self.make_learner(values)
        noise = values.get("exploration_noise", self.config.exploration_noise)

        def episode(carry, key):
            learner, buffer = carry
            collect_key, train_key = jax.random.split(key)
            params = self.actor(learner)
            ep = self._episode(params, collect_key, noise)
            buffer = buffer.add(ep.transitions, ep.valid)
            learner, losses = when_ready(
                buffer.size >= self.start,
                lambda s: rl.learn(s, buffer, train_key, self.num_updates),
                self.losses,
                learner,
            )
            return (learner, buffer), (ep.steps, losses)

        keys = jax.random.split(key, self.episodes)
        (learner, buffer), (steps, losses) = jax.lax.scan(episode, (learner, buffer), keys)
        return learner, buffer, jnp.sum(steps), jnp.int32(self.episodes), losses

    def _episode(self, params: Any, key: jax.Array, noise: Any) -> Episode:
        """An episode of the actor ``params`` with Gaussian action noise, collected (on the
        host's lanes, leased for the episode, for a Gymnasium task)."""
        if self.host:
            return self.task.explore(params, key, noise)
        length = self.episode_length
        return rollout(self.env, self.policy, params, key, None, length, noise, collect=True)

    def evaluate(self, learner: Any, buffer: ReplayBuffer, key: jax.Array, episodes: int):
        """The mean return of the member's actor without noise."""
        acting = self.acting(learner, buffer)
        if self.host:  # episodes on the host's lanes, leased for the evaluation
            from evorl_pop.tasks.host_lanes import collect_episodes

            def act(obs):
                return jax.vmap(self.policy, (None, 0))(acting.params, obs)

            ran = collect_episodes(self.task.host_envs(), act, key, episodes)
            return jnp.mean(ran.episode_return)
        stats = evaluate_episodes(
            acting.env, acting.policy, acting.params, key, episodes, None, self.episode_length
        )
        return stats.episode_return

    def acting(self, learner: Any, buffer: ReplayBuffer) -> Acting:
        """The member's actor without noise."""
        del buffer
        return Acting(self.env, self.policy, self.actor(learner), None, self.episode_length)
