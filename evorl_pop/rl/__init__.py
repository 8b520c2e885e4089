"""Reinforcement learning pieces the hybrid algorithms share.

A replay buffer (:mod:`~evorl_pop.rl.replay`), transition-collecting
rollouts of single policies and sharded populations
(:mod:`~evorl_pop.rl.rollout`), and TD3 with data-parallel gradient updates
(:mod:`~evorl_pop.rl.td3`).
"""

from evorl_pop.rl.replay import ReplayBuffer, dp_slice, global_batch_index, sample
from evorl_pop.rl.rollout import (
    Episode,
    PopulationRollout,
    Transition,
    collect_episode,
    evaluate,
    example_transition,
    population_rollout,
)
from evorl_pop.rl.td3 import (
    CONTINUOUS_ENVS,
    TD3,
    ActorState,
    CriticState,
    TD3Config,
    TD3State,
    check_continuous,
    polyak,
)

__all__ = [
    "CONTINUOUS_ENVS",
    "TD3",
    "ActorState",
    "CriticState",
    "Episode",
    "PopulationRollout",
    "ReplayBuffer",
    "TD3Config",
    "TD3State",
    "Transition",
    "check_continuous",
    "collect_episode",
    "dp_slice",
    "evaluate",
    "example_transition",
    "global_batch_index",
    "polyak",
    "population_rollout",
    "sample",
]
