"""PBT: population-based training of TD3 learners.

Jaderberg et al. (2017), "Population Based Training of Neural Networks". A
population of whole TD3 learners, each with its own networks, optimiser
states, replay buffer and hyperparameters, sharded over the ``POP`` axis.
One interval (one ``step``)::

    members (learners, buffers, hyperparameters), padded to the device count
      | shmap_vmap over POP: each member, on its own device, for `interval` steps
      |   collect an episode with its exploration noise -> its own buffer
      |   TD3 updates with its own learning rates / discount / noise
      |   then a noise-free evaluation -> its return
      v
    all_gather(returns)        -> the same ranking on every device
    truncation selection       -> the bottom fraction picks donors in the top fraction
    all_gather(learners, hps)  -> each replaced member copies its donor's
                                  weights, targets, Adam states and hyperparameters
                                  (it keeps its own replay buffer)
    explore                    -> the copied hyperparameters times 0.8 or 1.2
                                  (or resampled), clipped to their range

Every draw of member ``i`` comes from ``fold_in(key, i)`` with its global
index, so 1, 2 or 4 devices give the same run. Padded members (a population
the device count does not divide) repeat member 0, are never ranked, never
donate and are dropped before the state leaves ``step``.

The hyperparameters are traced values: each member's TD3 is built inside
the vmapped function from its own row of ``State.hyperparameters`` (optax's
Adam takes a traced learning rate), so changing them never recompiles.
Returns are maximised throughout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop.envs import make_env
from evorl_pop.mesh import make_mesh, pad_to_multiple
from evorl_pop.rl import hybrid
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.rollout import collect_episode, evaluate, example_transition
from evorl_pop.rl.td3 import TD3, TD3Config, TD3State, check_continuous

#: TD3Config fields PBT can search; policy_delay and tau stay fixed (they are
#: checked, or drive control flow, as Python values).
TD3_HYPERPARAMETERS = ("actor_lr", "critic_lr", "discount", "policy_noise", "noise_clip")
#: Every name a :class:`Hyperparameter` may take.
SEARCHABLE = (*TD3_HYPERPARAMETERS, "exploration_noise")


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """One searched hyperparameter: its initial range, which is also its bound.

    Attributes:
      name: one of :data:`SEARCHABLE`.
      low: the smallest value.
      high: the largest value.
      log: draw the initial value log-uniformly (learning rates); else uniformly.
    """

    name: str
    low: float
    high: float
    log: bool = True

    def __post_init__(self):
        if self.name not in SEARCHABLE:
            raise ValueError(
                f"PBT cannot search the hyperparameter {self.name!r}; "
                f"use one of {', '.join(map(repr, SEARCHABLE))}."
            )
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(
                f"The range of {self.name!r} must have low < high (and low > 0 when log=True), "
                f"got low={self.low}, high={self.high}, log={self.log}."
            )


@dataclasses.dataclass(frozen=True)
class Config:
    """PBT settings.

    Attributes:
      task: a continuous-action environment.
      population_size: learners trained side by side (at least 2).
      search: the searched hyperparameters with their ranges; every other
        one keeps its value from ``td3`` / ``exploration_noise``.
      truncation: the fraction of members replaced each interval, in (0, 0.5]:
        the bottom ``max(1, floor(truncation * population_size))`` copy a random
        member among as many at the top.
      perturb_factors: an explored hyperparameter is multiplied by one of these.
      resample_prob: the chance that it is drawn afresh from its range instead.
      exploit: ``False`` trains the same members with their initial
        hyperparameters and no copying (the baseline PBT is measured against).
      interval: environment steps per member between two exploits (a
        multiple of the episode length).
      updates_per_step: TD3 iterations per environment step, done after each episode.
      learning_starts: buffer size before a member's TD3 updates begin.
      buffer_capacity: each member's replay buffer size.
      exploration_noise: Gaussian action noise (half action ranges), unless searched.
      episode_steps: steps per episode (``None``: the environment's limit).
      eval_episodes: noise-free episodes that give a member's return.
      td3: TD3 settings (network sizes, batch size, the unsearched hyperparameters).
    """

    task: str = "Pendulum-v1"
    population_size: int = 8
    search: tuple[Hyperparameter, ...] = (
        Hyperparameter("actor_lr", 1e-5, 1e-2),
        Hyperparameter("critic_lr", 1e-5, 1e-2),
        Hyperparameter("exploration_noise", 0.05, 0.5, log=False),
        Hyperparameter("discount", 0.9, 0.995, log=False),
    )
    truncation: float = 0.25
    perturb_factors: tuple[float, float] = (0.8, 1.2)
    resample_prob: float = 0.0
    exploit: bool = True
    interval: int = 1000
    updates_per_step: float = 1.0
    learning_starts: int = 1000
    buffer_capacity: int = 100_000
    exploration_noise: float = 0.1
    episode_steps: int | None = None
    eval_episodes: int = 5
    td3: TD3Config = TD3Config(critic_hidden_sizes=(128, 128), batch_size=128)

    def __post_init__(self):
        # A config file gives the searched hyperparameters as mappings.
        search = tuple(Hyperparameter(**h) if isinstance(h, Mapping) else h for h in self.search)
        object.__setattr__(self, "search", search)
        if self.population_size < 2:
            raise ValueError(
                "PBT needs population_size >= 2 (a member to copy from), got "
                f"{self.population_size}."
            )
        if not 0.0 < self.truncation <= 0.5:
            raise ValueError(
                f"truncation must be in (0, 0.5] (the replaced fraction may not exceed the "
                f"donors), got {self.truncation}."
            )
        names = [h.name for h in self.search]
        if len(set(names)) != len(names):
            raise ValueError(f"search names a hyperparameter twice: {names}.")
        if not 0.0 <= self.resample_prob <= 1.0:
            raise ValueError(f"resample_prob must be in [0, 1], got {self.resample_prob}.")
        if self.updates_per_step <= 0 or self.eval_episodes < 1:
            raise ValueError(
                f"PBT needs updates_per_step > 0 and eval_episodes >= 1, got "
                f"{self.updates_per_step} and {self.eval_episodes}."
            )


@flax.struct.dataclass
class State:
    """Everything that changes between intervals; member leaves lead with population_size."""

    learners: TD3State  # every member's actor, critics, targets and Adam states
    buffers: ReplayBuffer  # every member's own replay buffer
    hyperparameters: jax.Array  # shape=(population_size, len(search)), float32
    returns: jax.Array  # shape=(population_size,): returns of the last evaluation
    generation: jax.Array  # int32: intervals so far
    env_steps: jax.Array  # int32: this interval's training steps (the runner sums totals)


class PBT:
    """Population-based training of TD3 learners sharded over the devices of ``mesh``.

    Args:
      config: a :class:`Config`.
      mesh: a mesh with the axis ``'POP'`` (``evorl_pop.make_mesh(n)``), or
        ``None`` for one device.

    Raises:
      ValueError: for a discrete-action environment, a mesh without ``'POP'``,
        an interval that is not a whole number of episodes, or a buffer
        smaller than a batch (or than ``learning_starts``).
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        self.config = config
        self.mesh = make_mesh(1) if mesh is None else mesh
        axis = dist.POP_AXIS_NAME
        if axis not in self.mesh.axis_names:
            raise ValueError(
                f"The mesh has axes {tuple(self.mesh.axis_names)}, but PBT shards its "
                f"population over {axis!r}: build it with evorl_pop.make_mesh(num_devices)."
            )
        self.env = make_env(config.task)
        check_continuous(self.env.spec, "PBT (its members are TD3 learners)")
        self.episode_steps = config.episode_steps or self.env.spec.max_steps
        if config.interval < self.episode_steps or config.interval % self.episode_steps:
            t = self.episode_steps
            raise ValueError(
                f"interval={config.interval} must be a whole number of {t}-step episodes, "
                f"e.g. {max(1, config.interval // t) * t}."
            )
        hybrid.check_buffer(config.buffer_capacity, config.td3.batch_size, config.learning_starts)
        self.td3 = TD3(self.env.spec, config.td3)
        self.policy = self.td3.policy
        self.names = tuple(h.name for h in config.search)
        self.low = jnp.asarray([h.low for h in config.search], jnp.float32)
        self.high = jnp.asarray([h.high for h in config.search], jnp.float32)
        self.num_replaced = max(1, int(config.truncation * config.population_size))
        self.num_updates = max(1, round(config.updates_per_step * self.episode_steps))
        # Members stay on their devices when they split evenly; otherwise (and
        # on one device, where jit reports P('POP') as P()) replicated.
        n = self.mesh.shape[axis]
        split = n > 1 and config.population_size % n == 0
        self._members = NamedSharding(self.mesh, P(axis) if split else P())
        self._replicated = NamedSharding(self.mesh, P())

    # --- hyperparameters -----------------------------------------------------------

    def sample_hyperparameters(self, key: jax.Array) -> jax.Array:
        """One member's hyperparameters drawn from their ranges.

        Args:
          key: PRNG key.

        Returns:
          float32 array of shape ``(len(search),)``, ordered as ``config.search``.
        """
        u = jax.random.uniform(key, self.low.shape)
        log = jnp.asarray([h.log for h in self.config.search])
        lin = self.low + u * (self.high - self.low)
        logs = jnp.exp(jnp.log(self.low) + u * (jnp.log(self.high) - jnp.log(self.low)))
        return jnp.where(log, logs, lin)

    def explore(self, hyperparameters: jax.Array, key: jax.Array) -> jax.Array:
        """Perturbs copied hyperparameters: times a factor, or resampled; then clipped.

        Args:
          hyperparameters: one member's values, shape ``(len(search),)``.
          key: PRNG key.

        Returns:
          The new values, within their ranges.
        """
        factor_key, resample_key, choice_key = jax.random.split(key, 3)
        lo, hi = self.config.perturb_factors
        factor = jnp.where(jax.random.bernoulli(factor_key, 0.5, self.low.shape), hi, lo)
        resample = jax.random.bernoulli(choice_key, self.config.resample_prob, self.low.shape)
        new = jnp.where(
            resample, self.sample_hyperparameters(resample_key), hyperparameters * factor
        )
        return jnp.clip(new, self.low, self.high)

    def hyperparameter(self, hyperparameters: jax.Array, name: str):
        """The value of ``name``: the member's searched one, or the fixed setting."""
        if name in self.names:
            return hyperparameters[self.names.index(name)]
        if name == "exploration_noise":
            return self.config.exploration_noise
        return getattr(self.config.td3, name)

    def learner(self, hyperparameters: jax.Array) -> TD3:
        """TD3 with one member's (traced) learning rates, discount and target noise."""
        searched = {n: self.hyperparameter(hyperparameters, n) for n in TD3_HYPERPARAMETERS}
        return TD3(self.env.spec, dataclasses.replace(self.config.td3, **searched))

    # --- state -----------------------------------------------------------------------

    def _place(self, state: State) -> State:
        # One layout in and out of step, so the second call reuses the compilation.
        members = (state.learners, state.buffers, state.hyperparameters, state.returns)
        learners, buffers, hps, returns = jax.lax.with_sharding_constraint(members, self._members)
        counters = jax.lax.with_sharding_constraint(
            (state.generation, state.env_steps), self._replicated
        )
        return State(learners, buffers, hps, returns, *counters)

    def init(self, key: jax.Array) -> State:
        """Fresh learners, empty buffers and hyperparameters drawn from their ranges.

        Args:
          key: PRNG key; member ``i`` uses ``fold_in`` of it with ``i``.

        Returns:
          A :class:`State`.
        """
        learner_key, hp_key = jax.random.split(key)
        pop = self.config.population_size
        index = jnp.arange(pop)
        buffer = ReplayBuffer.create(example_transition(self.env), self.config.buffer_capacity)
        state = State(
            learners=jax.vmap(lambda i: self.td3.init(jax.random.fold_in(learner_key, i)))(index),
            buffers=jax.tree.map(lambda x: jnp.broadcast_to(x, (pop, *x.shape)), buffer),
            hyperparameters=jax.vmap(
                lambda i: self.sample_hyperparameters(jax.random.fold_in(hp_key, i))
            )(index),
            returns=jnp.full((pop,), -jnp.inf, jnp.float32),
            generation=jnp.int32(0),
            env_steps=jnp.int32(0),
        )
        return self._place(state)

    # --- one interval ----------------------------------------------------------------

    def train_member(
        self, learner: TD3State, buffer: ReplayBuffer, hyperparameters: jax.Array, key: jax.Array
    ):
        """One member's interval: episodes into its buffer, TD3 after each, then evaluation.

        Args:
          learner: the member's TD3 state.
          buffer: its replay buffer.
          hyperparameters: its searched values, shape ``(len(search),)``.
          key: its own PRNG key.

        Returns:
          ``(learner, buffer, eval_return, steps, losses)``: ``steps`` counts
          the training steps taken, ``losses`` the interval's mean TD3 losses
          (NaN before learning starts).
        """
        cfg = self.config
        td3 = self.learner(hyperparameters)
        noise = self.hyperparameter(hyperparameters, "exploration_noise")
        start = max(cfg.learning_starts, cfg.td3.batch_size)
        nan = {"critic_loss": jnp.float32(jnp.nan), "actor_loss": jnp.float32(jnp.nan)}

        def episode(carry, key):
            learner, buffer = carry
            collect_key, train_key = jax.random.split(key)
            ep = collect_episode(
                self.env, self.policy, learner.actor.params, collect_key, noise, self.episode_steps
            )
            buffer = buffer.add(ep.transitions, ep.valid)
            learner, losses = jax.lax.cond(
                buffer.size >= start,
                lambda s: td3.train(s, buffer, train_key, self.num_updates),
                lambda s: (s, nan),
                learner,
            )
            return (learner, buffer), (ep.steps, losses)

        train_key, eval_key = jax.random.split(key)
        num_episodes = cfg.interval // self.episode_steps
        (learner, buffer), (steps, losses) = jax.lax.scan(
            episode, (learner, buffer), jax.random.split(train_key, num_episodes)
        )
        eval_return = evaluate(
            self.env,
            self.policy,
            learner.actor.params,
            eval_key,
            cfg.eval_episodes,
            self.episode_steps,
        )
        return learner, buffer, eval_return, jnp.sum(steps), jax.tree.map(jnp.nanmean, losses)

    def select_donors(self, fitness: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Truncation selection over the real members.

        Args:
          fitness: returns of all ``population_size`` members (NaN / inf as -inf).
          key: PRNG key; member ``i`` draws its donor from ``fold_in(key, i)``.

        Returns:
          ``(donor, replaced)``: ``donor[i]`` is the member ``i`` copies (itself
          when it is kept), ``replaced[i]`` whether it is in the bottom fraction.
        """
        pop, k = fitness.shape[0], self.num_replaced
        order = jnp.argsort(-fitness, stable=True)  # best first
        top = order[:k]
        replaced = jnp.zeros(pop, bool).at[order[pop - k :]].set(True)
        pick = jax.vmap(lambda i: jax.random.randint(jax.random.fold_in(key, i), (), 0, k))(
            jnp.arange(pop)
        )
        return jnp.where(replaced, top[pick], jnp.arange(pop)), replaced

    def exploit(
        self,
        learners: TD3State,
        hyperparameters: jax.Array,
        fitness: jax.Array,
        valid: jax.Array,
        key: jax.Array,
    ) -> tuple[TD3State, jax.Array]:
        """Exploit and explore over a padded population sharded over ``POP``.

        Args:
          learners: every member's TD3 state, leading axis the padded population.
          hyperparameters: their values, shape ``(padded, len(search))``.
          fitness: their returns (NaN / inf as -inf), shape ``(padded,)``.
          valid: ``True`` for the ``population_size`` real members (a prefix).
          key: PRNG key of this exploit.

        Returns:
          ``(learners, hyperparameters)``: the bottom fraction holds copies of
          their donors' states and explored copies of their hyperparameters.
        """
        axis = dist.POP_AXIS_NAME
        pop = self.config.population_size
        donor_key, explore_key = jax.random.split(key)
        index = jnp.arange(valid.shape[0])

        def local(learners, hps, fitness, index, valid):
            # Every device gathers the same ranking and all members, so it can copy
            # a donor that lives on another device; padded members sit past `pop`
            # and are left out of the ranking.
            everyone = dist.all_gather((learners, hps, fitness), axis, tiled=True)
            all_learners, all_hps, all_fitness = everyone
            donor, replaced = self.select_donors(all_fitness[:pop], donor_key)
            own = jnp.minimum(index, pop - 1)
            copy, src = replaced[own] & valid, donor[own]

            def take(mine, gathered):
                return jnp.where(copy.reshape(-1, *[1] * (mine.ndim - 1)), gathered[src], mine)

            keys = jax.vmap(lambda i: jax.random.fold_in(explore_key, i))(index)
            explored = jax.vmap(self.explore)(all_hps[src], keys)
            return (
                jax.tree.map(take, learners, all_learners),
                jnp.where(copy[:, None], explored, hps),
            )

        return jax.shard_map(
            local, mesh=self.mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False
        )(learners, hyperparameters, fitness, index, valid)

    def step(self, state: State, key: jax.Array) -> tuple[State, dict[str, jax.Array]]:
        """One interval: train and evaluate every member, then exploit and explore.

        Args:
          state: the current :class:`State`.
          key: PRNG key of this interval.

        Returns:
          ``(state, metrics)``: the members' evaluation returns (``fitness_best``,
          ``fitness_mean``, ``fitness_worst``, ``fitness_std``), training
          ``env_steps`` and ``episodes`` of this interval, ``replaced`` members,
          mean TD3 losses, and per member ``member{i}_return`` with the
          hyperparameters it trained with, ``member{i}_{name}``.
        """
        cfg = self.config
        axis = dist.POP_AXIS_NAME
        pop = cfg.population_size
        train_key, exploit_key = jax.random.split(key)
        keys = jax.vmap(lambda i: jax.random.fold_in(train_key, i))(jnp.arange(pop))
        members = (state.learners, state.buffers, state.hyperparameters, keys)
        (learners, buffers, hps, keys), valid = pad_to_multiple(members, self.mesh.shape[axis])
        # Episodes start from constants, which the replication checks would reject.
        learners, buffers, returns, steps, losses = dist.shmap_vmap(
            self.train_member, self.mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False
        )(learners, buffers, hps, keys)
        fitness = jnp.where(jnp.isfinite(returns), returns, -jnp.inf)
        if cfg.exploit:
            new_learners, new_hps = self.exploit(learners, hps, fitness, valid, exploit_key)
        else:
            new_learners, new_hps = learners, hps
        returns, hps_used = returns[:pop], state.hyperparameters
        env_steps = jnp.sum(steps[:pop]).astype(jnp.int32)
        new_state = State(
            learners=jax.tree.map(lambda x: x[:pop], new_learners),
            buffers=jax.tree.map(lambda x: x[:pop], buffers),
            hyperparameters=new_hps[:pop],
            returns=returns,
            generation=state.generation + 1,
            env_steps=env_steps,
        )
        metrics = {
            "fitness_best": jnp.max(returns),
            "fitness_mean": jnp.mean(returns),
            "fitness_worst": jnp.min(returns),
            "fitness_std": jnp.std(returns),
            "env_steps": env_steps,
            "episodes": jnp.int32(pop * (cfg.interval // self.episode_steps)),
            "replaced": jnp.int32(self.num_replaced if cfg.exploit else 0),
            **jax.tree.map(lambda x: jnp.nanmean(x[:pop]), losses),
        }
        for i in range(pop):
            metrics[f"member{i}_return"] = returns[i]
            for j, name in enumerate(self.names):
                metrics[f"member{i}_{name}"] = hps_used[i, j]
        return self._place(new_state), metrics
