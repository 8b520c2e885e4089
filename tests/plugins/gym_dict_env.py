"""A Gymnasium plug-in environment, registered when its module is imported (as
Gymnasium's plug-in packages do): ``gym:gym_dict_env:DictReach-v0``.

A point on a line reaches a target; its observation is a ``Dict`` (the target, the
position and its distance, a phase), its action a push.
"""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictReach(gym.Env):
    """Reward: minus the distance to the target, each of 20 steps."""

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "target": spaces.Box(-1.0, 1.0, (1,), np.float32),
                "position": spaces.Box(-3.0, 3.0, (2,), np.float32),
                "phase": spaces.Discrete(3),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self):
        return {
            "target": np.array([self.target], np.float32),
            "position": np.array([self.position, self.position - self.target], np.float32),
            "phase": self.time % 3,
        }

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position = float(self.np_random.uniform(-1.0, 1.0))
        self.target = float(self.np_random.uniform(-1.0, 1.0))
        self.time = 0
        return self._obs(), {}

    def step(self, action):
        self.position = float(np.clip(self.position + 0.2 * float(action[0]), -1.5, 1.5))
        self.time += 1
        return self._obs(), -abs(self.position - self.target), False, False, {}


gym.register("DictReach-v0", entry_point=DictReach, max_episode_steps=20)
