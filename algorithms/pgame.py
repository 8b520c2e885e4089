"""PGA-ME's emitter: isoline variation beside policy-gradient steps through a TD3 critic.

Policy Gradient Assisted MAP-Elites (Nilsson & Cully 2021), MAP-Elites'
``emitter: pga_me`` on the brax quality-diversity tasks (policies with environments).
A generation's batch::

    ask:      the first population_size - n_pg candidates: isoline variation of
              parents drawn over the archive (as emitter: isoline);
              then n_pg - 1 parents drawn over the archive, each moved by
              steps TD3 actor steps (TD3.actor_update:
              minus the first critic's value of its actions, on minibatches of the
              replay buffer) with Adam at policy_lr, fresh per candidate;
              last, the TD3 greedy actor
    evaluate: the one evaluator; every step of every episode into the buffer
    tell:     critic_updates TD3 iterations (critic steps; every
              policy_delay-th also a greedy-actor step and the targets' update)

with ``n_pg = round(proportion * population_size)``; the settings are
:class:`PgEmitterConfig`'s, a MAP-Elites config's ``pga_me`` (``--set pga_me.steps=5``).
The TD3 state and the replay buffer are replicated; every gradient step goes through
:func:`evorl_pop.distributed.agent_gradient_update` with its minibatch split over the
``DP`` axis of the archive's devices and the gradients averaged, so the archive is
the same on any device count.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from evorl_pop import registry
from evorl_pop.algorithms.qd_emitters import isoline_variation, prefixed_checks
from evorl_pop.base import ConfigError
from evorl_pop.rl import data_parallel, replay
from evorl_pop.rl.hybrid import example_transition
from evorl_pop.rl.replay import ReplayBuffer
from evorl_pop.rl.td3 import TD3, TD3Config, TD3State
from evorl_pop.tasks.qd import QD_TASKS, BraxQDTask


@dataclasses.dataclass(frozen=True)
class PgEmitterConfig:
    """PGA-ME's settings (``emitter: pga_me``; a MAP-Elites config's ``pga_me``).

    Attributes:
      proportion: the share of the batch from policy-gradient steps (the TD3 greedy
        actor among them), the rest from isoline variation.
      critic_hidden_sizes: each TD3 critic's hidden layers (the actor is the task's
        policy, MAP-Elites' ``hidden_sizes``).
      critic_updates: TD3 iterations per generation.
      steps: policy-gradient (Adam) steps per candidate.
      batch_size: the global minibatch, split over the devices.
      critic_lr: the critics' Adam step size.
      actor_lr: the greedy actor's Adam step size.
      policy_lr: the candidates' Adam step size.
      buffer_size: the replay buffer's capacity in steps.
    """

    proportion: float = 0.5
    critic_hidden_sizes: tuple[int, ...] = (64, 64)
    critic_updates: int = 30
    steps: int = 10
    batch_size: int = 64
    critic_lr: float = 3e-4
    actor_lr: float = 3e-4
    policy_lr: float = 1e-3
    buffer_size: int = 100_000

    def validate(self, config) -> None:
        """Raises a ConfigError naming a setting that cannot run with MAP-Elites' ``config``."""
        if config.task in QD_TASKS and not issubclass(QD_TASKS[config.task], BraxQDTask):
            raise ConfigError(
                f"emitter: pga_me needs a task with an environment (qd/hopper_uni, "
                f"qd/walker2d_uni, qd/halfcheetah_uni, qd/ant_uni, qd/ant_omni); {config.task} "
                "is black-box."
            )
        if not 0.0 <= self.proportion <= 1.0:
            raise ConfigError(f"pga_me.proportion must be in [0, 1], got {self.proportion}.")
        _, n_pg = pg_split(config.population_size, self.proportion)
        if n_pg < 1:
            raise ConfigError(
                f"pga_me.proportion={self.proportion} of population_size="
                f"{config.population_size} leaves no candidate for the greedy actor: raise either."
            )
        least = dict.fromkeys(("critic_updates", "steps", "batch_size", "buffer_size"), 1)
        positive = ("critic_lr", "actor_lr", "policy_lr")
        widths = ("critic_hidden_sizes",)
        prefixed_checks("pga_me.", self, least=least, positive=positive, widths=widths)


@flax.struct.dataclass
class PGAMEState:
    """PGA-ME's emitter state: the TD3 learner (critics, greedy actor) and its buffer."""

    td3: TD3State
    buffer: ReplayBuffer


def pg_split(population_size: int, proportion: float) -> tuple[int, int]:
    """``(isoline, policy_gradient)`` candidates of a batch; the second counts the
    greedy actor."""
    n_pg = int(round(proportion * population_size))
    return population_size - n_pg, n_pg


class PGAMEEmitter:
    """PGA-ME: isoline variation and TD3 policy-gradient steps, one batch."""

    #: MAP-Elites evaluates with ``task.episode(..., collect=True)`` (a
    #: :class:`~evorl_pop.tasks.qd.BraxQDTask`'s) and calls :meth:`observe`.
    collect = True

    def __init__(self, archive, task, config, settings: PgEmitterConfig):
        if not isinstance(task, BraxQDTask):
            raise ConfigError(
                f"emitter: pga_me needs a task with an environment (qd/hopper_uni, "
                f"qd/walker2d_uni, ...); {task.name} is black-box: try emitter=isoline."
            )
        self.archive = archive
        self.task = task
        self.config = config
        self.settings = settings
        self.num_iso, self.num_pg = pg_split(config.population_size, settings.proportion)
        td3_settings = TD3Config(
            actor_hidden_sizes=tuple(config.hidden_sizes),
            critic_hidden_sizes=tuple(settings.critic_hidden_sizes),
            actor_lr=settings.actor_lr,
            critic_lr=settings.critic_lr,
            batch_size=settings.batch_size,
            actor_activation=config.activation,
        )
        self.td3 = TD3(task.spec, td3_settings, policy=task.policy)
        self.policy_optimizer = optax.adam(settings.policy_lr)
        self.dp_mesh = data_parallel.dp_mesh(archive.mesh)
        self.axis = self.dp_mesh.axis_names[0]
        what = "A PGA-ME minibatch's samples"
        size = settings.batch_size
        data_parallel.check_split("pga_me.batch_size", size, self.dp_mesh.size, what)

    def _data_parallel(self, fn, num_args):
        """``fn`` on every device of the ``DP`` mesh, arguments and results replicated."""
        return jax.shard_map(fn, mesh=self.dp_mesh, in_specs=(P(),) * num_args, out_specs=P())

    # --- state ---------------------------------------------------------------------

    def init(self, archive_state, key):
        del archive_state
        buffer = ReplayBuffer.create(example_transition(self.task.spec), self.settings.buffer_size)
        return PGAMEState(self.td3.init(key), buffer)

    def observe(self, emitter_state: PGAMEState, transitions, valid) -> PGAMEState:
        """The emitter state with the valid steps of the evaluated episodes in its buffer."""
        return emitter_state.replace(buffer=emitter_state.buffer.add(transitions, valid))

    # --- ask -----------------------------------------------------------------------

    def policy_gradient(self, td3_state: TD3State, params, buffer, key, axis=None):
        """``steps`` TD3 actor steps (:meth:`~evorl_pop.rl.td3.TD3.actor_update`) of
        ``params`` through the critic of ``td3_state``, with a fresh Adam at ``policy_lr``,
        each on a fresh global minibatch of ``buffer`` (this device's slice with
        ``axis``). Returns the stepped params."""
        optimizer = self.policy_optimizer
        actor = td3_state.actor.replace(params=params, opt_state=optimizer.init(params))
        state = td3_state.replace(actor=actor)

        def body(state, k):
            batch, _ = replay.sample(buffer, k, self.settings.batch_size, axis)
            state, _ = self.td3.actor_update(state, batch, axis, optimizer)
            return state, None

        keys = jax.random.split(key, self.settings.steps)
        state, _ = jax.lax.scan(body, state, keys)
        return state.actor.params

    def _improve(self, td3_state, parents, buffer, key):
        """The parents (flat rows) each moved by :meth:`policy_gradient`."""

        def local(td3_state, parents, buffer, key):
            def one(flat, i):
                params = self.task.unravel(flat)
                k = jax.random.fold_in(key, i)
                new = self.policy_gradient(td3_state, params, buffer, k, self.axis)
                return ravel_pytree(new)[0]

            return jax.vmap(one)(parents, jnp.arange(parents.shape[0]))

        return self._data_parallel(local, 4)(td3_state, parents, buffer, key)

    def ask(self, archive_state, emitter_state: PGAMEState, key):
        k_iso_parents, k_vary, k_pg_parents, k_pg = jax.random.split(key, 4)
        c = self.config
        parts = []
        if self.num_iso:
            parents = self.archive.sample(archive_state, k_iso_parents, 2 * self.num_iso)
            x, y = jnp.split(parents, 2)
            parts.append(isoline_variation(k_vary, x, y, c.iso_sigma, c.line_sigma))
        if self.num_pg > 1:
            parents = self.archive.sample(archive_state, k_pg_parents, self.num_pg - 1)
            td3_state = emitter_state.td3
            parts.append(self._improve(td3_state, parents, emitter_state.buffer, k_pg))
        actor = ravel_pytree(emitter_state.td3.actor.params)[0]
        parts.append(actor[None].astype(parts[0].dtype if parts else actor.dtype))
        return jnp.concatenate(parts), None

    # --- tell ----------------------------------------------------------------------

    def tell(self, before, after, emitter_state: PGAMEState, asked, quality, descriptors, key):
        """``critic_updates`` TD3 iterations on the buffer (the batch's steps in it)."""
        del before, after, asked, quality, descriptors
        updates = self.settings.critic_updates

        def local(state, buffer, key):
            return self.td3.learn(state, buffer, key, updates, self.axis)

        td3_state, losses = self._data_parallel(local, 3)(
            emitter_state.td3, emitter_state.buffer, key
        )
        metrics = {"emitter_critic_loss": losses["critic_loss"]}
        metrics["emitter_actor_loss"] = losses["actor_loss"]
        return emitter_state.replace(td3=td3_state), metrics


registry.register_emitter(
    "pga_me",
    PGAMEEmitter,
    PgEmitterConfig,
    "PGA-ME: TD3 policy-gradient steps beside isoline variation (brax tasks)",
)

__all__ = ["PGAMEEmitter", "PGAMEState", "PgEmitterConfig", "pg_split"]
