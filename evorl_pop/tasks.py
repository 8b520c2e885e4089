"""Tasks: what a candidate solution (a flat parameter vector) is scored on.

A task turns one flat vector into a score and a little bookkeeping:

* ``evaluate(solution, key, task_state) -> (score, info)`` for one candidate,
* ``init_solution(key)`` the starting point, ``init_state()`` any state shared
  by all candidates (the running observation normaliser),
* ``update_state(task_state, info_total)`` folds in ``info`` summed over the
  whole population (with ``psum``: statistics merged across devices),
* ``maximize``: whether higher scores are better (returns) or lower (losses).

Scores stay in the task's own units everywhere in logs and plots; the single
conversion to the minimisation convention of evosax is
:func:`evorl_pop.fitness.to_minimization`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from evosax.problems.bbob.bbob_fns import bbob_fns
from jax.flatten_util import ravel_pytree

from evorl_pop.blackbox import BBOB_PREFIX, BBOBTask, bbob_task_names, float_dtype
from evorl_pop.envs import (
    Env,
    EpisodeStats,
    ObsMoments,
    ObsNorm,
    evaluate_episodes,
    make_env,
    random_observations,
)
from evorl_pop.networks import fold_virtual_batch_norm, make_policy, vbn_reference
from evorl_pop.registry import did_you_mean

#: Observations in the reference batch of virtual batch normalisation.
VBN_BATCH = 128


@flax.struct.dataclass
class EvalInfo:
    """Per-candidate bookkeeping; summed over the population with ``psum``."""

    steps: jax.Array  # int32: environment steps this evaluation took
    episodes: jax.Array  # int32: episodes it ran
    moments: Any = None  # ObsMoments when observations are normalised


# --- black-box functions (all minimised, optimum 0 at the origin unless noted) ---


def sphere(x):
    """BBOB's sphere (f1), unshifted: optimum 0 at the origin."""
    # f1 takes no rotation (R, Q): none is built, so any dimension fits in memory
    return bbob_fns["sphere"](x, jnp.zeros_like(x), None, None, x.shape[-1])[0]


def ellipsoid(x, condition: float = 1e6):
    """Separable ellipsoid; axis scales from 1 to ``condition``."""
    d = x.shape[-1]
    scales = condition ** (jnp.arange(d) / max(d - 1, 1))
    return jnp.sum(scales * x**2)


def rosenbrock(x):
    """Rosenbrock's valley; optimum 0 at ``x = 1``."""
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rastrigin(x):
    return 10.0 * x.shape[-1] + jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x))


BLACKBOX_FUNCTIONS: dict[str, Callable] = {
    "sphere": sphere,
    "ellipsoid": ellipsoid,
    "rosenbrock": rosenbrock,
    "rastrigin": rastrigin,
}


def _unknown(kind: str, name: str, valid) -> ValueError:
    hint = did_you_mean(name, valid, 3)
    return ValueError(f"Unknown {kind} {name!r}.{hint} Valid: {', '.join(sorted(valid))}.")


@dataclasses.dataclass(frozen=True)
class BlackBoxTask:
    """Minimise a black-box function of a ``num_dims`` vector.

    Attributes:
      function: a name in :data:`BLACKBOX_FUNCTIONS`.
      num_dims: dimension of the search space.
      x0: every coordinate of the starting point.
    """

    function: str = "sphere"
    num_dims: int = 10
    x0: float = 3.0
    maximize = False

    def __post_init__(self):
        if self.function not in BLACKBOX_FUNCTIONS:
            raise _unknown("black-box function", self.function, BLACKBOX_FUNCTIONS)
        if self.num_dims < 2:
            raise ValueError(f"num_dims must be at least 2, got {self.num_dims}.")

    @property
    def name(self) -> str:
        return f"{self.function}-{self.num_dims}d"

    def init_solution(self, key):
        del key
        return jnp.full((self.num_dims,), self.x0, float_dtype())

    def init_state(self):
        return ()

    def evaluate(self, solution, key, task_state):
        del key, task_state
        value = BLACKBOX_FUNCTIONS[self.function](solution)
        return value, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))

    def optimal_value(self, task_state):
        del task_state
        return jnp.zeros((), float_dtype())

    def update_state(self, task_state, info_total):
        return task_state


class ControlTask:
    """Neuroevolution of a policy network on an environment (gymnax or brax).

    The score of a candidate is its mean return over ``episodes`` episodes.
    """

    maximize = True

    def __init__(
        self,
        env: str | Env = "CartPole-v1",
        hidden_sizes: Sequence[int] = (32,),
        activation: str = "tanh",
        episodes: int = 1,
        normalize_obs: bool = False,
        policy_module=None,
        num_steps: int | None = None,
        episode_length: int | None = None,
        backend: str | None = None,
        policy: str = "auto",
        lanes: int | None = None,
        virtual_batch_norm: bool = False,
    ):
        """Builds the task.

        Args:
          env: an environment name (see :func:`evorl_pop.envs.make_env`) or an
            :class:`~evorl_pop.envs.Env`.
          hidden_sizes: hidden layers of the policy's MLP (after the CNN's
            convolutions for image observations).
          activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
          episodes: episodes per candidate evaluation (their mean is the score).
          normalize_obs: normalise observations with running statistics
            gathered from the whole population (merged across devices).
          policy_module: a custom flax module instead of the MLP; its output
            must fit the action space.
          num_steps: episodes are truncated after this many steps (default:
            the environment's limit).
          episode_length: steps after which an episode ends (``None``: the
            environment's own limit, 1000 for brax); ``env`` must be a name.
          backend: brax environments: the physics backend (``None``: spring).
          policy: ``'auto'`` (a CNN for image observations, else an MLP),
            ``'mlp'`` or ``'cnn'``.
          lanes: episodes a device steps at once, taking the next pending
            episode as one ends (``None``: 16 on a CPU, the whole slice on an
            accelerator; see :func:`evorl_pop.envs.rollout_queue`).
          virtual_batch_norm: standardise every hidden layer of the policy over
            a fixed batch of :data:`VBN_BATCH` observations of random play
            (normalised as the policy sees them), folded into each candidate's
            weights before its episodes (see
            :func:`~evorl_pop.networks.fold_virtual_batch_norm`).
        """
        if episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {episodes}.")
        if num_steps is not None and num_steps < 1:
            raise ValueError(f"num_steps (the episode length) must be at least 1, got {num_steps}.")
        if isinstance(env, str):
            kwargs = {"episode_length": episode_length}
            if backend is not None:
                kwargs["backend"] = backend
            env = make_env(env, **kwargs)
        elif episode_length is not None or backend is not None:
            raise ValueError(
                "episode_length and backend apply to environment names; build the Env "
                "with make_env(name, episode_length=..., backend=...) instead."
            )
        self.env = env
        self.spec = self.env.spec
        self.policy = make_policy(self.spec, hidden_sizes, activation, policy_module, policy)
        self.episodes = episodes
        self.normalize_obs = normalize_obs
        self.num_steps = num_steps
        if lanes is not None and lanes < 1:
            raise ValueError(f"lanes must be at least 1 (or None for the default), got {lanes}.")
        self.lanes = lanes
        template = self.policy.init(jax.random.key(0))
        flat, self.unravel = ravel_pytree(template)
        self.reference = None
        if virtual_batch_norm:
            # a custom module fails here, before any observation is collected
            one = jax.ShapeDtypeStruct((1, *self.spec.obs_shape), jnp.float32)
            jax.eval_shape(lambda r: fold_virtual_batch_norm(self.policy, template, r), one)
            collect = jax.jit(lambda key: random_observations(self.env, key, VBN_BATCH))
            self.reference = np.asarray(collect(jax.random.key(0)))
            # the first layer's view of it, once (raw observations are normalised each time)
            self.vbn_reference = jax.device_get(vbn_reference(self.policy, self.reference))
        self.num_dims = int(flat.size)
        self.name = self.spec.name

    def init_solution(self, key):
        return ravel_pytree(self.policy.init(key))[0]

    def init_state(self):
        return ObsNorm.create(self.spec.obs_shape) if self.normalize_obs else ()

    def _episodes(self, solution, key, task_state, episodes) -> EpisodeStats:
        obs_norm = task_state if self.normalize_obs else None
        params = self.unravel(solution)
        if self.reference is not None:
            seen = self.vbn_reference if obs_norm is None else obs_norm.normalize(self.reference)
            params = fold_virtual_batch_norm(self.policy, params, seen)
        return evaluate_episodes(
            self.env,
            self.policy,
            params,
            key,
            episodes,
            obs_norm,
            self.num_steps,
            self.lanes,
        )

    def evaluate(self, solution, key, task_state):
        stats = self._episodes(solution, key, task_state, self.episodes)
        moments = stats.moments if self.normalize_obs else None
        return stats.episode_return, EvalInfo(stats.steps, stats.episodes, moments)

    def evaluate_return(self, solution, key, task_state, episodes: int):
        """Mean return of one solution over ``episodes`` episodes (for reporting)."""
        return self._episodes(solution, key, task_state, episodes).episode_return

    def update_state(self, task_state, info_total: EvalInfo):
        if not self.normalize_obs:
            return task_state
        return task_state.merge(info_total.moments)


def task_names() -> list[str]:
    """Every task name :func:`make_task` accepts: black-box functions, BBOB, environments."""
    from evorl_pop.envs import ENV_FACTORIES

    return [*BLACKBOX_FUNCTIONS, *bbob_task_names(), *ENV_FACTORIES]


def make_task(name: str, **kwargs):
    """A task by name: a black-box function, a BBOB function or an environment.

    Args:
      name: ``'sphere'``, ``'ellipsoid'``, ``'rosenbrock'``, ``'rastrigin'``, a
        BBOB function ``'bbob/<name>'`` (``'bbob/ellipsoidal_rotated'``, see
        :data:`evorl_pop.blackbox.BBOB_FUNCTIONS`), or an environment such as
        ``'CartPole-v1'`` or ``'Pendulum-v1'``.
      **kwargs: passed to :class:`BlackBoxTask`, :class:`~evorl_pop.blackbox.BBOBTask`
        (``num_dims``, ``instance``, ``x0``) or :class:`ControlTask`.

    Returns:
      The task.
    """
    if name in BLACKBOX_FUNCTIONS:
        return BlackBoxTask(function=name, **kwargs)
    if name.startswith(BBOB_PREFIX):
        return BBOBTask(function=name[len(BBOB_PREFIX) :], **kwargs)
    from evorl_pop.envs import ENV_FACTORIES

    if name in ENV_FACTORIES:
        return ControlTask(env=name, **kwargs)
    raise _unknown("task", name, task_names())


__all__ = [
    "BLACKBOX_FUNCTIONS",
    "BBOBTask",
    "BlackBoxTask",
    "ControlTask",
    "EvalInfo",
    "ObsMoments",
    "make_task",
    "task_names",
]
