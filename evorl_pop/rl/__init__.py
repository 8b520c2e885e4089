"""Reinforcement learning pieces the learners share.

A replay buffer whose minibatches split over a ``'DP'`` axis
(:mod:`~evorl_pop.rl.replay`), and TD3 with data-parallel gradient updates
and the learner that feeds it a population's evaluations (:mod:`~evorl_pop.rl.td3`).
"""

from evorl_pop.rl.replay import ReplayBuffer, dp_slice, global_batch_index, sample
from evorl_pop.rl.td3 import (
    CONTINUOUS_ENVS,
    TD3,
    ActorState,
    CriticState,
    HybridConfig,
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
