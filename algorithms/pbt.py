"""PBT: population-based training of TD3, PPO, SAC or a plug-in's learners.

Jaderberg et al. (2017), "Population Based Training of Neural Networks". A
population of whole learners (``learner``: ``'td3'``, ``'ppo'``, ``'sac'`` or a
registered learner with a PBT member, :func:`evorl_pop.registry.register_learner`),
each with its own networks, optimiser states, experience and
hyperparameters, sharded over the ``POP`` axis. One interval (one ``step``)
of TD3 members::

    members (learners, buffers, hyperparameters)
      | the engine's evaluator (evorl_pop.core.engine.evaluate): padded to the
      | device count, each member on its own device, for `interval` steps
      |   collect an episode with its exploration noise -> its own buffer
      |   TD3 updates with its own learning rates / discount / noise
      |   then a noise-free evaluation -> its return, the population statistics
      v
    fitness (one sign boundary) -> the same ranking on every device
    truncation selection       -> the bottom fraction picks donors in the top fraction
    all_gather(learners, hps)  -> each replaced member copies its donor's
                                  weights, targets, Adam states and hyperparameters
                                  (it keeps its own replay buffer)
    explore                    -> the copied hyperparameters times 0.8 or 1.2
                                  (or resampled), clipped to their range

A PPO or SAC member (:mod:`~evorl_pop.algorithms.pbt_members`) runs the
learner's own iterations on its running episodes instead (SAC into its own
buffer), and keeps those episodes and that buffer when it copies a donor. PBT
builds each member from its learner's spec (:class:`~evorl_pop.registry.MemberPart`):
what it searches and reports come from there.

On a Gymnasium task (``gym:ID``, DM Control's too) the members' environments are
stepped on the host (:mod:`~evorl_pop.algorithms.pbt_members`): a PPO or SAC
member's lanes are its own, rebuilt from their seeds and actions after a
resume, and TD3's episodes and the evaluations run on lanes leased for the call.

Every draw of member ``i`` comes from ``fold_in(key, i)`` with its global
index, so 1, 2 or 4 devices give the same run. Padded members (a population
the device count does not divide) repeat member 0, are never ranked, never
donate and are dropped before the state leaves ``step``.

The hyperparameters are traced values: each member's TD3 is built inside
the vmapped function from its own row of ``State.hyperparameters`` (optax's
Adam takes a traced learning rate), and a PPO or SAC member's row fills the
learner's traced ``Hyperparameters``, so changing them never recompiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed as dist
from evorl_pop import registry
from evorl_pop.algorithms import ppo, sac
from evorl_pop.base import ConfigError, EvalInfo, check_config, did_you_mean
from evorl_pop.core.engine import check_pop_axis, evaluate, make_mesh
from evorl_pop.core.interfaces import Acting
from evorl_pop.rl.hybrid import HybridConfig
from evorl_pop.rl.td3 import HYBRID_SETTINGS, TD3Config


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """One searched hyperparameter: its initial range, which is also its bound.

    Attributes:
      name: one of the hyperparameters the learner's spec makes searchable
        (:class:`~evorl_pop.registry.MemberPart`).
      low: the smallest value.
      high: the largest value.
      log: draw the initial value log-uniformly (learning rates); else uniformly.
    """

    name: str
    low: float
    high: float
    log: bool = True

    def validate(self, learner: str = "td3") -> None:
        """Raises a ConfigError for a name ``learner`` does not have, or an empty range."""
        searchable = registry.LEARNERS.get(learner).member.searchable
        if self.name not in searchable:
            hint = did_you_mean(self.name, searchable)
            raise ConfigError(
                f"PBT cannot search the hyperparameter {self.name!r} of {learner}.{hint} "
                f"Use one of {', '.join(map(repr, searchable))}."
            )
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ConfigError(
                f"The range of {self.name!r} must have low < high (and low > 0 when log=True), "
                f"got low={self.low}, high={self.high}, log={self.log}."
            )


@dataclasses.dataclass(frozen=True)
class Config(HybridConfig):
    """PBT settings: the task, population (``population_size``: learners trained side
    by side), replay buffer, episodes and ``learner`` of
    :class:`~evorl_pop.rl.hybrid.HybridConfig`, and these.

    Attributes:
      td3: the TD3 members' settings (network sizes, batch size, the unsearched
        hyperparameters).
      ppo: the PPO members' settings (its ``task`` and ``episode_length``
        are PBT's); one iteration's ``num_envs * unroll_length`` must divide ``interval``.
      sac: the SAC members' settings, likewise.
      search: the searched hyperparameters with their ranges (``None``: the
        learner's default search); every other one keeps its value from
        ``td3`` / ``exploration_noise``, ``ppo``, ``sac`` or ``learner_settings``.
      truncation: the fraction of members replaced each interval, in (0, 0.5]:
        the bottom ``max(1, floor(truncation * population_size))`` copy a random
        member among as many at the top.
      perturb_factors: an explored hyperparameter is multiplied by one of these.
      resample_prob: the chance that it is drawn afresh from its range instead.
      exploit: ``False`` trains the same members with their initial
        hyperparameters and no copying (the baseline PBT is measured against).
      interval: environment steps per member between two exploits (TD3: a
        multiple of the episode length; PPO, SAC: of an iteration's steps).
      updates_per_step: TD3 iterations per environment step, done after each episode.
      exploration_noise: Gaussian action noise (half action ranges), unless searched.
    """

    population_size: int = 8
    learning_starts: int = 1000
    buffer_capacity: int = 100_000
    td3: TD3Config = HYBRID_SETTINGS
    ppo: ppo.Config = ppo.MEMBER_SETTINGS
    sac: sac.Config = sac.MEMBER_SETTINGS
    search: tuple[Hyperparameter, ...] | None = None
    truncation: float = 0.25
    perturb_factors: tuple[float, float] = (0.8, 1.2)
    resample_prob: float = 0.0
    exploit: bool = True
    interval: int = 1000
    updates_per_step: float = 1.0
    exploration_noise: float = 0.1

    ROLE = "member"
    #: Gymnasium's tasks: the members' lanes (PPO, SAC) and episodes (TD3) on the host.
    HOST_LEARNERS = ("td3", "ppo", "sac")

    def __post_init__(self):
        # A config file gives the searched hyperparameters as mappings.
        if self.search is not None:
            search = (Hyperparameter(**h) if isinstance(h, Mapping) else h for h in self.search)
            object.__setattr__(self, "search", tuple(search))

    def searched(self) -> tuple[Hyperparameter, ...]:
        """``search``, or the learner's default search when it is ``None``."""
        if self.search is not None:
            return self.search
        return tuple(Hyperparameter(*h) for h in self.learner_part().default_search)

    def set_by_algorithm(self) -> tuple[str, ...]:
        """The searched hyperparameters' fields, which PBT draws and explores itself
        (:class:`~evorl_pop.core.interfaces.SetsOwnSettings`)."""
        own = {f.name for f in dataclasses.fields(self)}
        return tuple(
            h.name if h.name in own else self.setting_name(h.name) for h in self.searched()
        )

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        super().validate()
        for h in self.searched():
            h.validate(self.learner)
        if not 0.0 < self.truncation <= 0.5:
            raise ConfigError(
                f"truncation must be in (0, 0.5] (the replaced fraction may not exceed the "
                f"donors), got {self.truncation}."
            )
        names = [h.name for h in self.searched()]
        if len(set(names)) != len(names):
            raise ConfigError(f"search names a hyperparameter twice: {names}.")
        if not 0.0 <= self.resample_prob <= 1.0:
            raise ConfigError(f"resample_prob must be in [0, 1], got {self.resample_prob}.")
        check_config(self, positive=("updates_per_step",))

    def learner_config(self):
        """The members' settings, with PBT's ``task`` and ``episode_length`` where they
        have those fields."""
        settings = super().learner_config()
        names = {f.name for f in dataclasses.fields(settings)}
        shared = {n: getattr(self, n) for n in ("task", "episode_length") if n in names}
        return dataclasses.replace(settings, **shared)


@flax.struct.dataclass
class State:
    """Everything that changes between intervals; member leaves lead with population_size."""

    learners: Any  # every member's learner part, which a replaced member copies (TD3: its
    #   actor, critics, targets and Adam states; see pbt_members)
    buffers: Any  # every member's own part, which it keeps (TD3: its replay buffer)
    hyperparameters: jax.Array  # shape=(population_size, len(search)), float32
    returns: jax.Array  # shape=(population_size,): returns of the last evaluation
    generation: jax.Array  # int32: intervals so far


class PBT:
    """Population-based training of a registered learner's members, sharded over the
    devices of ``mesh``.

    Args:
      config: a :class:`Config`.
      mesh: a mesh with the axis ``'POP'`` (``evorl_pop.make_mesh(n)``), or
        ``None`` for every device.

    Raises:
      ConfigError: a setting that cannot run (see ``Config.validate``), a
        discrete-action environment for TD3, or an interval that is not a whole
        number of episodes (TD3) or iterations (PPO, SAC).
    """

    def __init__(self, config: Config = Config(), mesh: Mesh | None = None):
        config.validate()
        self.config = config
        self.mesh = check_pop_axis(make_mesh() if mesh is None else mesh)
        #: The learner's spec part that builds the members.
        self.part = config.learner_part()
        #: One member's init, train and evaluate (pbt_members.Member).
        members = self.part.member(config.learner_config(), config)
        where = f"learner {config.learner!r} (member.member)"
        self.members = registry.check_built(where, members, "Member")
        self.env = self.members.env
        self.episode_length = self.env.spec.max_steps
        self.search = config.searched()
        self.names = tuple(h.name for h in self.search)
        self.low = jnp.asarray([h.low for h in self.search], jnp.float32)
        self.high = jnp.asarray([h.high for h in self.search], jnp.float32)
        self.num_replaced = max(1, int(config.truncation * config.population_size))
        # Members stay on their devices when they split evenly; otherwise (and
        # on one device, where jit reports P('POP') as P()) replicated.
        n = self.mesh.shape[dist.POP_AXIS_NAME]
        split = n > 1 and config.population_size % n == 0
        self._members = NamedSharding(self.mesh, P(dist.POP_AXIS_NAME) if split else P())
        self._replicated = NamedSharding(self.mesh, P())

    def acting(self, state: State) -> Acting:
        """The deterministic policy of the member whose last evaluation was best."""
        best = jnp.argmax(state.returns)
        learner, own = jax.tree.map(lambda x: x[best], (state.learners, state.buffers))
        return self.members.acting(learner, own)

    def evaluation(self, key: jax.Array, state: State) -> tuple[jax.Array, int]:
        """The key and episodes of the best member's evaluation in the generation of ``key``
        (``eval_return``: that member's return)."""
        member = jax.random.fold_in(jax.random.split(key)[0], jnp.argmax(state.returns))
        return jax.random.split(member)[1], self.config.eval_episodes

    # --- hyperparameters -----------------------------------------------------------

    def sample_hyperparameters(self, key: jax.Array) -> jax.Array:
        """One member's hyperparameters drawn from their ranges.

        Args:
          key: PRNG key.

        Returns:
          float32 array of shape ``(len(search),)``, ordered as ``config.searched()``.
        """
        u = jax.random.uniform(key, self.low.shape)
        log = jnp.asarray([h.log for h in self.search])
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

    # --- state -----------------------------------------------------------------------

    def _place(self, state: State) -> State:
        # One layout in and out of step, so the second call reuses the compilation.
        members = (state.learners, state.buffers, state.hyperparameters, state.returns)
        learners, buffers, hps, returns = jax.lax.with_sharding_constraint(members, self._members)
        generation = jax.lax.with_sharding_constraint(state.generation, self._replicated)
        return State(learners, buffers, hps, returns, generation)

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
        learners, buffers = jax.vmap(
            lambda i: self.members.init(jax.random.fold_in(learner_key, i))
        )(index)
        state = State(
            learners=learners,
            buffers=buffers,
            hyperparameters=jax.vmap(
                lambda i: self.sample_hyperparameters(jax.random.fold_in(hp_key, i))
            )(index),
            returns=jnp.full((pop,), -jnp.inf, jnp.float32),
            generation=jnp.int32(0),
        )
        return self._place(state)

    # --- one interval ----------------------------------------------------------------

    def member(self, member, key: jax.Array):
        """One member's interval, for the engine's evaluator: its training, then a
        noise-free evaluation.

        Args:
          member: ``(learner, own, hyperparameters)``: its learner part, its own
            part (TD3: its replay buffer) and its searched values (shape
            ``(len(search),)``).
          key: its own PRNG key.

        Returns:
          ``(eval_return, EvalInfo, (learner, own, hyperparameters, losses))``: the
            info counts the training steps and episodes, ``losses`` are the means over
            the interval of the learner's losses (NaN before learning starts).
        """
        learner, own, hyperparameters = member
        values = {n: hyperparameters[j] for j, n in enumerate(self.names)}
        train_key, eval_key = jax.random.split(key)
        learner, own, steps, episodes, metrics = self.members.train(learner, own, values, train_key)
        score = self.members.evaluate(learner, own, eval_key, self.config.eval_episodes)
        info = EvalInfo(steps, episodes.astype(jnp.int32))
        losses = {k: jnp.nanmean(metrics[k]) for k in self.part.losses}
        return score, info, (learner, own, hyperparameters, losses)

    def select_donors(self, fitness: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Truncation selection over the real members.

        Args:
          fitness: evosax fitness (minimised) of all ``population_size`` members.
          key: PRNG key; member ``i`` draws its donor from ``fold_in(key, i)``.

        Returns:
          ``(donor, replaced)``: ``donor[i]`` is the member ``i`` copies (itself
            when it is kept), ``replaced[i]`` whether it is in the bottom fraction.
        """
        pop = fitness.shape[0]
        k = self.num_replaced
        order = jnp.argsort(fitness, stable=True)  # best first
        top = order[:k]
        replaced = jnp.zeros(pop, bool).at[order[pop - k :]].set(True)
        pick = jax.vmap(lambda i: jax.random.randint(jax.random.fold_in(key, i), (), 0, k))(
            jnp.arange(pop)
        )
        return jnp.where(replaced, top[pick], jnp.arange(pop)), replaced

    def exploit(
        self, learners: Any, hyperparameters: jax.Array, fitness: jax.Array, key: jax.Array
    ) -> tuple[Any, jax.Array]:
        """Exploit and explore over a padded population sharded over ``POP``.

        Args:
          learners: every member's learner part, leading axis the padded population.
          hyperparameters: their values, shape ``(padded, len(search))``.
          fitness: evosax fitness (minimised) of the ``population_size`` real
            members (the padded ones are never ranked).
          key: PRNG key of this exploit.

        Returns:
          ``(learners, hyperparameters)``: the bottom fraction holds copies of
            their donors' states and explored copies of their hyperparameters.
        """
        axis = dist.POP_AXIS_NAME
        pop = self.config.population_size
        donor_key, explore_key = jax.random.split(key)
        index = jnp.arange(hyperparameters.shape[0])
        donor, replaced = self.select_donors(fitness, donor_key)

        def local(learners, hps, index, donor, replaced):
            # Every device gathers all members, so it can copy a donor that lives
            # on another device; padded members sit past `pop` and copy nobody.
            all_learners, all_hps = dist.all_gather((learners, hps), axis, tiled=True)
            own = jnp.minimum(index, pop - 1)
            copy = replaced[own] & (index < pop)
            src = donor[own]

            def take(mine, gathered):
                return jnp.where(copy.reshape(-1, *[1] * (mine.ndim - 1)), gathered[src], mine)

            keys = jax.vmap(lambda i: jax.random.fold_in(explore_key, i))(index)
            explored = jax.vmap(self.explore)(all_hps[src], keys)
            new_hps = jnp.where(copy[:, None], explored, hps)
            return jax.tree.map(take, learners, all_learners), new_hps

        members = P(axis)
        ranking = P()
        return jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(members, members, members, ranking, ranking),
            out_specs=members,
            check_vma=False,
        )(learners, hyperparameters, index, donor, replaced)

    def step(self, state: State, key: jax.Array) -> tuple[State, dict[str, jax.Array]]:
        """One interval: train and evaluate every member (the engine's evaluator),
        then exploit and explore.

        Args:
          state: the current :class:`State`.
          key: PRNG key of this interval; member ``i`` trains with ``fold_in`` of
            its first half with ``i``.

        Returns:
          ``(state, metrics)``: the members' evaluation returns (``fitness_best``,
            ``fitness_mean``, ``fitness_worst``, ``fitness_std``), training
            ``env_steps`` and ``episodes`` of this interval, ``replaced`` members,
            the learner's mean losses, and per member ``member{i}_return`` with the
            hyperparameters it trained with, ``member{i}_{name}``.
        """
        cfg = self.config
        pop = cfg.population_size
        train_key, exploit_key = jax.random.split(key)
        members = (state.learners, state.buffers, state.hyperparameters)
        summary, (learners, buffers, hps, losses) = evaluate(
            self.member, members, train_key, self.mesh, maximize=True
        )
        if cfg.exploit:
            learners, hps = self.exploit(learners, hps, summary.fitness(pop), exploit_key)
        returns = summary.scores[:pop]
        new_state = State(
            learners=jax.tree.map(lambda x: x[:pop], learners),
            buffers=jax.tree.map(lambda x: x[:pop], buffers),
            hyperparameters=hps[:pop],
            returns=returns,
            generation=state.generation + 1,
        )
        metrics = {
            **summary.metrics(),
            "replaced": jnp.int32(self.num_replaced if cfg.exploit else 0),
            **jax.tree.map(lambda x: jnp.nanmean(x[:pop]), losses),
        }
        for i in range(pop):
            metrics[f"member{i}_return"] = returns[i]
            for j, name in enumerate(self.names):
                metrics[f"member{i}_{name}"] = state.hyperparameters[i, j]
        return self._place(new_state), metrics


registry.register_algorithm("pbt", Config, PBT, "PBT: a population of TD3, PPO or SAC learners")
