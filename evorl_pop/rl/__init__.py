"""Reinforcement learning pieces the learners share.

A replay buffer whose minibatches split over a ``'DP'`` axis
(:mod:`~evorl_pop.rl.replay`), and TD3 with data-parallel gradient updates
and the learner that feeds it a population's evaluations (:mod:`~evorl_pop.rl.td3`);
the hybrids' choice of TD3 or SAC (:mod:`~evorl_pop.rl.hybrid`);
PPO's and SAC's losses and updates (:mod:`~evorl_pop.rl.ppo`, :mod:`~evorl_pop.rl.sac`),
their action distributions (:mod:`~evorl_pop.rl.distributions`), batches of
self-resetting environments (:mod:`~evorl_pop.rl.vec_env`) and their data-parallel
layout (:mod:`~evorl_pop.rl.data_parallel`).
"""

from evorl_pop.rl.replay import ReplayBuffer, dp_slice, global_batch_index, sample
from evorl_pop.rl.td3 import (
    CONTINUOUS_ENVS,
    TD3,
    ActorState,
    CriticState,
    HybridConfig,
    ReplayLearner,
    TD3Config,
    TD3Learner,
    TD3State,
    check_continuous,
    dp_mesh,
    example_transition,
    polyak,
)

__all__ = [
    "CONTINUOUS_ENVS",
    "TD3",
    "ActorState",
    "CriticState",
    "HybridConfig",
    "ReplayBuffer",
    "ReplayLearner",
    "TD3Config",
    "TD3Learner",
    "TD3State",
    "check_continuous",
    "dp_mesh",
    "dp_slice",
    "example_transition",
    "global_batch_index",
    "polyak",
    "sample",
]
