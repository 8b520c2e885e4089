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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from evorl_pop.core.interfaces import Env

#: ``draw_state(ax, state)``: draws one environment state into a matplotlib axes.
StateDrawer = Callable[[Any, Any], None]
#: ``pictures(states) -> uint8 array (steps, height, width, 3)``: an episode's states
#: (leading axis the steps) as images, for a family that draws its states itself.
EpisodePictures = Callable[[Any], np.ndarray]
#: A GIF frame's size in pixels, and the band above the picture that holds the title.
FRAME, TITLE = 240, 18


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


def _clear(ax) -> None:
    """What the last frame drew, removed; the axes and its ticks kept (clearing the
    axes would rebuild them, the most of a frame's time)."""
    for artists in (ax.images, ax.lines, ax.patches, ax.collections, ax.texts, ax.artists):
        for artist in list(artists):
            artist.remove()


def _title(env: Env, episodes: Sequence[Trajectory], e: int, t: int) -> str:
    which = f"episode {e + 1}  " if len(episodes) > 1 else ""
    return f"{env.spec.name}  {which}step {t + 1}  return {episodes[e].so_far[t]:.4g}"


def _titled_pictures(env, episodes, pictures: EpisodePictures) -> list:
    """Each step's picture under its title, composed by Pillow (no figure per frame)."""
    from PIL import Image, ImageDraw

    frames = []
    for e, episode in enumerate(episodes):
        images = np.asarray(pictures(jax.tree.map(np.asarray, episode.states)), np.uint8)
        height, width = images.shape[1:3]
        scale = min(FRAME / width, (FRAME - TITLE) / height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        where = ((FRAME - size[0]) // 2, TITLE + (FRAME - TITLE - size[1]) // 2)
        sharp = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BILINEAR
        for t, image in enumerate(images):
            frame = Image.new("RGB", (FRAME, FRAME), "white")
            frame.paste(Image.fromarray(image).resize(size, sharp), where)
            ImageDraw.Draw(frame).text((4, 3), _title(env, episodes, e, t), fill="black")
            frames.append(frame.quantize(method=Image.Quantize.FASTOCTREE))
    return frames


def write_gif(
    env: Env,
    episodes: Sequence[Trajectory],
    out: Path,
    draw_state: StateDrawer | None = None,
    fps: int = 20,
    pictures: EpisodePictures | None = None,
) -> int:
    """An animated GIF of ``episodes``, one frame per step, one episode after the other,
    each frame titled with the step and the return so far.

    A family that draws its states as images gives ``pictures``: Pillow composes the
    frames (a 500-step episode in a few seconds). Otherwise every frame is drawn into
    one matplotlib figure, cleared between frames, and read back as pixels.

    Args:
      env: the environment the episodes ran in (its name titles the frames).
      episodes: the episodes.
      out: the GIF file.
      draw_state: draws a state into a cleared axes; ``None``: the observation
        (:func:`draw_observation`).
      fps: frames per second of the animation.
      pictures: an episode's states as images (:data:`EpisodePictures`), instead of
        ``draw_state``.

    Returns:
      The frames written.
    """
    if pictures is not None:
        frames = _titled_pictures(env, episodes, pictures)
        _save_gif(frames, out, fps)
        return len(frames)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 4), dpi=60)
    fig.subplots_adjust(left=0.12, right=0.96, bottom=0.1, top=0.9)
    frames = []
    try:
        for e, episode in enumerate(episodes):
            states = jax.tree.map(np.asarray, episode.states)
            for t in range(len(episode.so_far)):
                _clear(ax)
                if draw_state is not None:
                    draw_state(ax, jax.tree.map(lambda x, t=t: x[t], states))
                else:
                    draw_observation(ax, episode.observations[t])
                ax.set_title(_title(env, episodes, e, t), fontsize=9)
                ax.relim()
                ax.autoscale_view()
                fig.canvas.draw()
                pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
                # a palette of its own per frame, by the fast octree (the GIF's own
                # quantizer takes longer than drawing the frame)
                image = Image.fromarray(pixels.copy())
                frames.append(image.quantize(method=Image.Quantize.FASTOCTREE))
    finally:
        plt.close(fig)
    _save_gif(frames, out, fps)
    return len(frames)


def _save_gif(frames: list, out: Path, fps: int) -> None:
    """The frames as an animated GIF in ``out`` (whatever its name), its folder created."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(
        out, format="GIF", save_all=True, append_images=frames[1:], duration=1000 // fps, loop=0
    )
