"""An environment family plug-in: a mass on a spring, stepped in JAX.

Importing this module registers the family ``spring``, whose one environment
``spring/mass`` every algorithm then takes by name::

    PYTHONPATH=examples/plugins evorl-pop train --plugin spring_env --task spring/mass \\
        --set hidden_sizes=[] --set episode_length=50
    PYTHONPATH=examples/plugins evorl-pop render RUN_FOLDER

The mass starts at rest at a random position in ``[-1, 1]``; the spring pulls it
back to 0, and the action (a force in ``[-1, 1]``) must damp the oscillation.
The reward is minus the squared position and speed. ``render`` draws the
observations as a GIF (the family keeps ``JaxEnvFamily``'s drawing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from evorl_pop import registry
from evorl_pop.base import EnvSpec
from evorl_pop.tasks.control import JaxEnvFamily

#: Seconds per step, spring stiffness (per unit mass), and the force's scale.
DT, STIFFNESS, FORCE = 0.1, 4.0, 2.0


class SpringMass:
    """reset / step in JAX without auto-reset (an ``evorl_pop.core.interfaces.Env``)."""

    def __init__(self, episode_length: int = 100):
        self.spec = EnvSpec(
            "spring/mass", (2,), False, 1, (-1.0,), (1.0,), episode_length, terminates=False
        )

    def reset(self, key):
        position = jax.random.uniform(key, (), minval=-1.0, maxval=1.0)
        state = (position, jnp.zeros(()), jnp.zeros((), jnp.int32))
        return jnp.stack(state[:2]), state

    def step(self, key, state, action):
        position, speed, t = state
        force = FORCE * jnp.clip(action[0], -1.0, 1.0)
        speed = speed + DT * (force - STIFFNESS * position)
        position = position + DT * speed
        reward = -(position**2 + 0.1 * speed**2)
        done = t + 1 >= self.spec.max_steps
        return jnp.stack([position, speed]), (position, speed, t + 1), reward, done


class Spring(JaxEnvFamily):
    description = "a mass on a spring to bring to rest (spring/mass)"
    pattern = "spring/<task>"

    def names(self):
        return ("spring/mass",)

    def make_env(self, name, episode_length=100):
        return SpringMass(episode_length)


registry.register_env_family("spring", Spring())
