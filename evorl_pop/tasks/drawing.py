"""Episodes drawn into a file, one frame per step: what ``evorl-pop render`` writes.

An environment family says how its episodes are drawn
(:class:`~evorl_pop.core.interfaces.EnvFamily`'s ``drawing`` and ``draw``);
this module holds what they share: the episodes as they were stepped
(:class:`Trajectory`) and an animated GIF with the step and the return so
far on every frame (:func:`write_gif`), each frame drawn by the family's own
picture of a state, or else from the observation. matplotlib and Pillow are
imported when a GIF is drawn.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from evorl_pop.core.interfaces import Env

#: ``draw_state(ax, state)``: draws one environment state into a matplotlib axes.
StateDrawer = Callable[[Any, Any], None]


@dataclasses.dataclass
class Trajectory:
    """One episode as the policy played it; every array leads with the steps taken."""

    states: Any  # the environment's state after each step
    observations: np.ndarray  # the observation after each step
    so_far: np.ndarray  # the return after each step


def draw_observation(ax, obs) -> None:
    """The observation: an image as such (channels folded), a vector as bars."""
    obs = np.asarray(obs, np.float32)
    if obs.ndim >= 2:
        image = obs if obs.ndim == 2 or obs.shape[-1] in (3, 4) else obs.argmax(-1) * obs.max(-1)
        ax.imshow(image, cmap="viridis")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        ax.bar(range(obs.size), obs.reshape(-1), color="tab:blue")
        ax.set_xlabel("observation")
        ax.set_ylim(-3, 3)


def write_gif(
    env: Env,
    episodes: Sequence[Trajectory],
    out: Path,
    draw_state: StateDrawer | None = None,
) -> int:
    """An animated GIF of ``episodes``, one frame per step, one episode after the other.

    Args:
      env: the environment the episodes ran in (its name titles the frames).
      episodes: the episodes.
      out: the GIF file.
      draw_state: draws a state; ``None``: the observation (:func:`draw_observation`).

    Returns:
      The frames written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    frames = []
    for e, episode in enumerate(episodes):
        for t in range(len(episode.so_far)):
            fig, ax = plt.subplots(figsize=(4, 4), dpi=60)
            if draw_state is not None:
                draw_state(ax, jax.tree.map(lambda x, t=t: x[t], episode.states))
            else:
                draw_observation(ax, episode.observations[t])
            which = f"episode {e + 1}  " if len(episodes) > 1 else ""
            title = f"{env.spec.name}  {which}step {t + 1}  return {episode.so_far[t]:.4g}"
            ax.set_title(title, fontsize=9)
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            plt.close(fig)
            frames.append(Image.open(buf).convert("RGB"))
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=50, loop=0)
    return len(frames)
