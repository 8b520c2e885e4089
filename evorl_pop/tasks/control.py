"""Control tasks: a policy network's flat weights, scored by its return in an environment.

:class:`ControlTask` turns a flat parameter vector into a policy, runs its
episodes through :mod:`evorl_pop.tasks.rollout` and scores it by the mean
return (maximised)::

    flat weights ─► unravel ─► [virtual batch norm folded in] ─► policy
                 ─► episodes (rollout_queue under a population's vmap;
                    one rollout per episode with transitions when collecting)
                 ─► mean return, EvalInfo (steps, episodes, observation sums)

The policies are :mod:`evorl_pop.tasks.policies`'s, virtual batch normalisation
:mod:`evorl_pop.tasks.vbn`'s, the running observation statistics
:mod:`evorl_pop.tasks.obs_norm`'s.

The families of environments stepped in JAX have control tasks: each
subclasses :class:`JaxEnvFamily` (a plug-in,
:class:`~evorl_pop.core.interfaces.EnvFamily`), says which names it owns and
how it builds one, and registers itself in its own file::

    from evorl_pop import registry
    from evorl_pop.tasks.control import JaxEnvFamily

    class PointMasses(JaxEnvFamily):
        description = "point masses in JAX (toy/reach, ...)"
        pattern = "toy/<task>"

        def names(self):
            return ("toy/reach",)

        def make_env(self, name, episode_length=None):
            return PointMass(name, episode_length)  # reset / step in JAX

    registry.register_env_family("toy", PointMasses())

Its tasks are then :class:`ControlTask`'s, for ES and the hybrid algorithms;
its environments serve every learner (PPO, SAC); ``evorl-pop render`` draws
their episodes as a GIF of the observations unless the family draws its
states itself (:meth:`JaxEnvFamily.draw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from evorl_pop.base import EvalInfo
from evorl_pop.tasks.drawing import Trajectory, write_gif
from evorl_pop.tasks.envs import Env, check_episode_length, make_env, random_observations
from evorl_pop.tasks.obs_norm import ObsNorm
from evorl_pop.tasks.policies import Policy, make_policy
from evorl_pop.tasks.rollout import (
    EpisodeStats,
    episode_stats,
    evaluate_episodes,
    population_episodes,
    rollout,
)
from evorl_pop.tasks.vbn import VBN_BATCH, fold_virtual_batch_norm, vbn_reference


class ControlTask:
    """Neuroevolution of a policy network on an environment (gymnax, brax or Playground).

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
        episode_length: int | None = None,
        backend: str | None = None,
        policy: str | Policy = "auto",
        impl: str | None = None,
        lanes: int | None = None,
        virtual_batch_norm: bool = False,
        transitions: bool = False,
    ):
        """Builds the task.

        Args:
          env: an environment name (see :func:`evorl_pop.tasks.envs.make_env`) or an
            :class:`~evorl_pop.tasks.envs.Env`.
          hidden_sizes: hidden layers of the policy's MLP (after the CNN's
            convolutions for image observations).
          activation: ``'tanh'``, ``'relu'`` or ``'elu'``.
          episodes: episodes per candidate evaluation (their mean is the score).
          normalize_obs: normalise observations with running statistics
            gathered from the whole population (merged across devices).
          policy_module: a custom flax module instead of the built-in policy;
            its output must fit the action space.
          episode_length: steps after which an episode ends (``None``: the
            environment's own limit, 1000 for brax).
          backend: brax environments: the physics backend (``None``: spring).
          impl: Playground environments: the MJX implementation (``None``: ``'jax'``).
          policy: ``'auto'`` (a CNN for image observations, else an MLP), ``'mlp'``,
            ``'cnn'`` or ``'keypoints'`` (see :func:`~evorl_pop.tasks.policies.make_policy`),
            or a :class:`~evorl_pop.tasks.policies.Policy` built for the environment
            (e.g. a :func:`~evorl_pop.tasks.policies.gaussian_policy`; ``hidden_sizes``,
            ``activation`` and ``policy_module`` are then not used).
          lanes: episodes a device steps at once, taking the next pending
            episode as one ends (``None``: 16 on a CPU, the whole slice on an
            accelerator; see :func:`evorl_pop.tasks.rollout.rollout_queue`).
          virtual_batch_norm: standardise every hidden layer of the policy over
            a fixed batch of :data:`~evorl_pop.tasks.vbn.VBN_BATCH` observations of random play
            (normalised as the policy sees them), folded into each candidate's
            weights before its episodes (see :func:`~evorl_pop.tasks.vbn.fold_virtual_batch_norm`).
          transitions: the task feeds a learner: every episode it runs keeps its
            transitions (one rollout per episode), so that the evaluation
            :meth:`evaluate_return` reports runs the step the population's
            collecting evaluation traced (the same returns as without).
        """
        if episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {episodes}.")
        check_episode_length(episode_length)
        if lanes is not None and lanes < 1:
            raise ValueError(f"lanes must be at least 1 (or None for the default), got {lanes}.")
        if isinstance(env, str):
            env = make_env(env, episode_length=episode_length, backend=backend, impl=impl)
        elif backend is not None or impl is not None:
            raise ValueError(
                "backend and impl apply to environment names: use make_env(name, backend=, impl=)."
            )
        if normalize_obs and env.spec.action_mask is not None:
            raise ValueError(
                f"normalize_obs: {env.spec.name} observes its action mask, which the policy "
                "reads from the raw observation; run it without normalize_obs."
            )
        self.env = env
        self.spec = env.spec
        self.name = env.spec.name
        if isinstance(policy, Policy):
            self.policy = policy
        else:
            self.policy = make_policy(self.spec, hidden_sizes, activation, policy_module, policy)
        self.episodes = episodes
        self.normalize_obs = normalize_obs
        self.episode_length = episode_length
        self.lanes = lanes
        self.transitions = transitions
        template = self.policy.init(jax.random.key(0))
        flat, self.unravel = ravel_pytree(template)
        self.num_dims = int(flat.size)
        self.reference = None
        if virtual_batch_norm:
            # a custom module fails here, before any observation is collected
            one = jax.ShapeDtypeStruct((1, *self.spec.obs_shape), jnp.float32)
            jax.eval_shape(lambda r: fold_virtual_batch_norm(self.policy, template, r), one)
            collect = jax.jit(lambda key: random_observations(self.env, key, VBN_BATCH))
            self.reference = np.asarray(collect(jax.random.key(0)))
            # the first layer's view of it, once (raw observations are normalised each time)
            self.vbn_reference = jax.device_get(vbn_reference(self.policy, self.reference))

    def init_solution(self, key):
        return ravel_pytree(self.policy.init(key))[0]

    def init_state(self):
        return ObsNorm.create(self.spec.obs_shape) if self.normalize_obs else ()

    def policy_params(self, solution, obs_norm):
        """The policy's parameters of the flat ``solution``, as its episodes run them
        (virtual batch norm folded in against ``obs_norm``'s view of the reference batch,
        or the raw one's where ``obs_norm`` is ``None``)."""
        params = self.unravel(solution)
        if self.reference is not None:
            seen = self.vbn_reference if obs_norm is None else obs_norm.normalize(self.reference)
            params = fold_virtual_batch_norm(self.policy, params, seen)
        return params

    def _episodes(self, solution, key, task_state, episodes) -> EpisodeStats:
        obs_norm = task_state if self.normalize_obs else None
        params = self.policy_params(solution, obs_norm)
        return evaluate_episodes(
            self.env, self.policy, params, key, episodes, obs_norm, self.episode_length, self.lanes
        )

    def evaluate(self, solution, key, task_state, collect: bool = False):
        """Mean return of one candidate over ``episodes`` episodes.

        Args:
          solution: the flat policy parameters.
          key: the candidate's key; episode ``j`` uses ``split(key, episodes)[j]``.
          task_state: the observation normaliser, or ``()``.
          collect: also return the episodes' transitions (one rollout per episode).

        Returns:
          ``(return, EvalInfo)``; with ``collect``, ``(return, EvalInfo,
            Episode)``, the episode's leaves leading with the episodes.
        """
        if not collect:
            stats = self._episodes(solution, key, task_state, self.episodes)
            moments = stats.moments if self.normalize_obs else None
            return stats.episode_return, EvalInfo(stats.steps, stats.episodes, moments)
        episodes = self._collect(solution, key, task_state, self.episodes)
        moments = jax.tree.map(lambda x: x.sum(0), episodes.moments) if self.normalize_obs else None
        info = EvalInfo(episodes.steps.sum(), jnp.int32(self.episodes), moments)
        return episodes.episode_return.mean(), info, episodes

    def evaluate_batch(self, solutions, keys, task_state):
        """:meth:`evaluate` of a device's slice of candidates, ``(solutions, keys)`` leading
        with them: ``jax.vmap(evaluate)``'s result, its episodes traced once (a
        vectorised evaluation traces them twice, which for a physics simulator is
        seconds of start-up)."""
        stats = self._batch_episodes(solutions, keys, task_state, self.episodes)
        moments = stats.moments if self.normalize_obs else None
        return stats.episode_return, EvalInfo(stats.steps, stats.episodes, moments)

    def _batch_episodes(self, solutions, keys, task_state, episodes) -> EpisodeStats:
        obs_norm = task_state if self.normalize_obs else None
        params = jax.vmap(self.policy_params, (0, None))(solutions, obs_norm)
        keys = jax.vmap(lambda k: jax.random.split(k, episodes))(keys)
        runs = population_episodes(
            self.env, self.policy, params, keys, obs_norm, self.episode_length, self.lanes
        )
        return jax.vmap(episode_stats)(runs)

    def _collect(self, solution, key, task_state, episodes: int):
        obs_norm = task_state if self.normalize_obs else None
        params = self.policy_params(solution, obs_norm)

        def run(k):
            return rollout(
                self.env, self.policy, params, k, obs_norm, self.episode_length, collect=True
            )

        return jax.vmap(run)(jax.random.split(key, episodes))

    def evaluate_return(self, solution, key, task_state, episodes: int):
        """Mean return of one solution over ``episodes`` episodes (for reporting)."""
        if self.transitions:
            return self._collect(solution, key, task_state, episodes).episode_return.mean()
        return self._episodes(solution, key, task_state, episodes).episode_return

    def update_state(self, task_state, info_total: EvalInfo):
        if not self.normalize_obs:
            return task_state
        return task_state.merge(info_total.moments)


class JaxEnvFamily:
    """An :class:`~evorl_pop.core.interfaces.EnvFamily` of environments stepped in JAX.

    A subclass sets :attr:`description` and :attr:`pattern` and defines :meth:`names`
    and :meth:`make_env` (and :attr:`settings`, :meth:`owns`, :meth:`draw` where it
    differs); the protocol documents each member.
    """

    description: str = ""
    pattern: str = ""
    settings: dict[str, tuple[str, ...]] = {}
    steps_in_jax: bool = True
    drawing: str | None = "gif"
    example: str | None = None
    #: A family whose names are ``prefix + <id>`` may set these instead of defining
    #: :meth:`names` and :meth:`make_env`: the prefix (``'brax/'``), the ids it lists,
    #: and the class built as ``env_class(<id>, **settings)``.
    prefix: str = ""
    ids: tuple[str, ...] = ()
    env_class: type | None = None

    def names(self) -> tuple[str, ...]:
        return tuple(self.prefix + name for name in self.ids)

    def owns(self, name: str) -> bool:
        return name in self.names()

    def make_env(self, name: str, **settings) -> Env:
        if self.env_class is None:
            raise NotImplementedError(f"{type(self).__name__} defines no make_env")
        return self.env_class(name.removeprefix(self.prefix), **settings)

    def make_task(self, name: str, **kwargs) -> ControlTask:
        """A :class:`ControlTask` on environment ``name``: ``kwargs`` are its arguments
        and the family's own :attr:`settings`."""
        settings = {key: kwargs.pop(key) for key in self.settings if key in kwargs}
        settings["episode_length"] = kwargs.get("episode_length")
        # this family owns the name: it builds the environment itself (None: the default)
        env = self.make_env(name, **{k: v for k, v in settings.items() if v is not None})
        return ControlTask(env, **kwargs)

    def draw(self, env: Env, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF of the observations (:func:`~evorl_pop.tasks.drawing.write_gif`)."""
        return write_gif(env, episodes, out)
