"""Reinforcement learning pieces the learners share.

A replay buffer whose minibatches split over a ``'DP'`` axis
(:mod:`~evorl_pop.rl.replay`); what the algorithms with learners beside a
population share: their settings, the replay learner's buffer and learning gate
(:mod:`~evorl_pop.rl.hybrid`); TD3 with data-parallel gradient updates and its
learner beside a population (:mod:`~evorl_pop.rl.td3`); PPO's and SAC's losses
and updates (:mod:`~evorl_pop.rl.ppo`, :mod:`~evorl_pop.rl.sac`), their action
distributions (:mod:`~evorl_pop.rl.distributions`), batches of self-resetting
environments (:mod:`~evorl_pop.rl.vec_env`) and their data-parallel layout
(:mod:`~evorl_pop.rl.data_parallel`).
"""

from evorl_pop.rl.hybrid import (
    CONTINUOUS_ENVS,
    EvoRLConfig,
    HybridConfig,
    ReplayLearner,
    check_continuous,
    example_transition,
)
from evorl_pop.rl.replay import ReplayBuffer, dp_slice, global_batch_index, sample
from evorl_pop.rl.td3 import (
    TD3,
    ActorState,
    CriticState,
    TD3Config,
    TD3Learner,
    TD3State,
    polyak,
)

__all__ = [
    "CONTINUOUS_ENVS",
    "TD3",
    "ActorState",
    "CriticState",
    "EvoRLConfig",
    "HybridConfig",
    "ReplayBuffer",
    "ReplayLearner",
    "TD3Config",
    "TD3Learner",
    "TD3State",
    "check_continuous",
    "dp_slice",
    "example_transition",
    "global_batch_index",
    "polyak",
    "sample",
]
