"""The hybrids that evolve their learner's actors (CEM-RL, ERL): TD3 or SAC beside the population.

``learner`` picks the RL part:

* ``'td3'`` (the default): :class:`~evorl_pop.rl.td3.TD3Learner`; the members
  are deterministic actors, TD3's actor network.
* ``'sac'``: :class:`~evorl_pop.rl.sac.SACHybridLearner`; the members are
  SAC's tanh-Gaussian actors (a location and a scale per action dimension),
  evaluated with their deterministic action, the squashed location
  (:class:`~evorl_pop.tasks.policies.GaussianPolicy`), and trained against twin
  critics and a learned temperature.

Either learner shares :class:`~evorl_pop.rl.td3.ReplayLearner`'s replay
buffer, learning gate and ``'DP'`` split; SAC's module is imported only by a
config that chooses it.
"""

from __future__ import annotations

import dataclasses

from jax.sharding import Mesh

from evorl_pop.base import ConfigError, did_you_mean
from evorl_pop.rl.td3 import HybridConfig, ReplayLearner, TD3Config, TD3Learner
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.envs import make_env
from evorl_pop.tasks.policies import gaussian_policy

#: The RL parts a hybrid can have.
LEARNERS = ("td3", "sac")


@dataclasses.dataclass(frozen=True)
class SACConfig:
    """SAC hyper-parameters of a hybrid's learner (the SAC algorithm's defaults, smaller nets).

    Attributes:
      actor_hidden_sizes: hidden widths of the actor (the population's network).
      activation: the actor's ``'relu'``, ``'tanh'`` or ``'elu'`` (the critics use relu).
      critic_hidden_sizes: hidden widths of each critic.
      actor_lr: Adam's step size for the actors.
      critic_lr: for the critics.
      alpha_lr: for the log-temperature.
      target_entropy_scale: the target entropy is ``-scale * action_dim``.
      discount: the discount factor gamma.
      tau: Polyak averaging rate of the target critics.
      init_alpha: the initial temperature.
      reward_scaling: rewards are multiplied by it in the critics' target.
      batch_size: global minibatch size, split over the devices.
    """

    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    critic_hidden_sizes: tuple[int, ...] = (128, 128)
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    target_entropy_scale: float = 1.0
    discount: float = 0.99
    tau: float = 0.005
    init_alpha: float = 1.0
    reward_scaling: float = 1.0
    batch_size: int = 128

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        if self.batch_size < 1:
            raise ConfigError(f"sac.batch_size must be at least 1, got {self.batch_size}.")
        from evorl_pop.rl import sac  # only a config that chooses SAC imports it

        sac.check_settings(self, "sac.")


@dataclasses.dataclass(frozen=True)
class EvoRLConfig(HybridConfig):
    """Settings of a hybrid that evolves its learner's actors (CEM-RL, ERL): the shared
    ones of :class:`~evorl_pop.rl.td3.HybridConfig` and these.

    Attributes:
      learner: the RL part: ``'td3'`` (deterministic actors) or ``'sac'``
        (tanh-Gaussian actors, evaluated with their squashed mean).
      sac: SAC's hyper-parameters when ``learner='sac'`` (``td3`` holds TD3's).
    """

    learner: str = "td3"
    sac: SACConfig = SACConfig()

    def validate(self) -> None:
        """Raises a ConfigError naming a setting that cannot run."""
        if self.learner not in LEARNERS:
            raise ConfigError(
                f"learner: unknown value {self.learner!r}.{did_you_mean(self.learner, LEARNERS)}"
                f" Valid: {', '.join(LEARNERS)}."
            )
        if self.learner == "sac":
            self.sac.validate()
        super().validate()

    def learner_config(self) -> TD3Config | SACConfig:
        """The chosen learner's settings: ``td3`` or ``sac``."""
        return getattr(self, self.learner)

    def minibatch(self) -> tuple[str, int]:
        """The learner's name and its global minibatch size, which the buffer must hold."""
        return self.learner.upper(), self.learner_config().batch_size

    def actor_task(self) -> ControlTask:
        """The control task of the actors: the learner's actor network on ``task``
        (SAC's acts with its squashed mean); its episodes keep their transitions."""
        if self.learner == "td3":
            return super().actor_task()
        env = make_env(self.task, episode_length=self.episode_length)
        policy = gaussian_policy(env.spec, self.sac.actor_hidden_sizes, self.sac.activation)
        return ControlTask(env, policy=policy, episode_length=self.episode_length,
                           transitions=True)  # fmt: skip

    def rl_learner(
        self, task: ControlTask, mesh: Mesh, num_updates: int, algorithm: str
    ) -> ReplayLearner:
        """The learner beside the population.

        Args:
          task: the actors' task (:meth:`actor_task`).
          mesh: the population's ``'POP'`` mesh; minibatches split over its devices.
          num_updates: gradient updates per call of the learner's ``learn``.
          algorithm: the algorithm's name, for errors.

        Returns:
          A :class:`~evorl_pop.rl.td3.TD3Learner` or :class:`~evorl_pop.rl.sac.SACHybridLearner`.
        """
        if self.learner == "td3":
            return TD3Learner(task, self, mesh, num_updates, algorithm)
        from evorl_pop.rl.sac import SACHybridLearner  # TD3 runs never load SAC

        return SACHybridLearner(task, self, mesh, num_updates, algorithm)
