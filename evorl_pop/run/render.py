"""``evorl-pop render RUN``: the run's best policy acting in its environment.

The policy is the one the run's evaluation reports (``eval_return``) from the
last checkpoint: the mean of the search distribution for the evolution
strategies (the best so far for population-based ones, the learner's actor
where a hybrid names it), the member with the best last return for PBT.
Its episodes run with the key of the run's last evaluation (``--seed S``:
``jax.random.key(S)``), episode ``j`` with ``split(key, episodes)[j]`` as in
every evaluation, so the printed return is the evaluation's: it comes from the
evaluation path itself, and the drawn episodes, stepped with the same compiled
step and keys, add up to it.

- brax tasks: brax's HTML viewer (``brax.io.html``), ``RUN/render.html``;
- gymnax tasks: an animated GIF, one frame per step with the step and the
  return so far, ``RUN/render.gif``, drawn by gymnax's own visualiser where it
  has one for the environment (classic control needs gymnasium's pygame), else
  the observation drawn with matplotlib;
- black-box tasks: nothing to render.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from evorl_pop.run import config as config_lib
from evorl_pop.run import restore, shell, store
from evorl_pop.tasks import rollout as rollout_lib

HTML_FILENAME = "render.html"
GIF_FILENAME = "render.gif"


@dataclasses.dataclass
class Episodes:
    """What :func:`run_episodes` saw: per episode, its env states (one per step taken),
    rewards and return; and the return the run's evaluation reports for them."""

    states: list  # per episode: the env state after each step taken (leaves lead with steps)
    observations: list  # per episode: the observation after each step taken
    so_far: list  # per episode: the return after each step taken
    returns: list[float]  # per episode, summed as the rollout sums it
    evaluation: float  # the evaluation path's mean return over the episodes
    reported: float | None  # metrics.csv's eval_return of the same policy and key, if any
    generation: int
    env: object


def _policy(algorithm, state):
    """``(env, policy, params, obs_norm, episode_length, evaluate)``: the best policy and
    ``evaluate(key, episodes) -> mean return`` by the run's own evaluation path."""
    task = getattr(algorithm, "task", None)
    if hasattr(algorithm, "mean_solution"):  # the engine: ES and the hybrids on it
        solution = algorithm.mean_solution(state)
        obs_norm = state.task_state if task.normalize_obs else None
        params = task._policy_params(solution, obs_norm)

        def evaluate(key, episodes):
            one = functools.partial(task.evaluate_return, episodes=episodes)
            fn = jax.shard_map(
                one, mesh=algorithm.mesh, in_specs=P(), out_specs=P(), check_vma=False
            )  # fmt: skip  (as the engine's _metrics)
            return jax.jit(fn)(solution, key, state.task_state)

        return task.env, task.policy, params, obs_norm, task.episode_length, evaluate
    # PBT: the member whose last evaluation was best
    best = int(np.argmax(np.asarray(state.returns)))
    params = jax.tree.map(lambda x: x[best], state.learners.actor.params)
    env, policy, length = algorithm.env, algorithm.policy, algorithm.episode_length

    def evaluate(key, episodes):
        def run(p, k):
            stats = rollout_lib.evaluate_episodes(env, policy, p, k, episodes, None, length)
            return stats.episode_return

        return jax.jit(run)(params, key)

    return env, policy, params, None, length, evaluate


def _evaluation_key(algorithm, run_key, generation: int, state):
    """The key, and the episode count, of the run's last reported evaluation."""
    key = jax.random.fold_in(run_key, max(generation - 1, 0))  # 0: no evaluation yet
    if hasattr(algorithm, "mean_solution"):
        return jax.random.split(key, 4)[3], algorithm.eval_episodes
    best = int(np.argmax(np.asarray(state.returns)))
    member = jax.random.fold_in(jax.random.split(key)[0], best)
    return jax.random.split(member)[1], algorithm.config.eval_episodes


def _trajectory(env, policy, params, obs_norm, episode_length, key):
    """One episode with the rollout's own compiled step and key schedule: the env states
    after each step, the return, the steps taken."""
    length = rollout_lib._length(env, episode_length)
    track = obs_norm is not None
    step, start = rollout_lib._compiled(env, policy, length, track, False, False)
    obs, env_state, keys = start(key, length)
    zero = jnp.zeros_like(obs, dtype=jnp.float32)
    scalar = zero.reshape(-1)[0]
    moments = rollout_lib.ObsMoments(scalar, zero, zero) if track else None
    carry = (obs, env_state, scalar, jnp.zeros((), jnp.int32), jnp.ones((), bool), moments)

    @jax.jit
    def scan(carry, params, obs_norm):
        def body(carry, xs):
            carry, _ = step(params, obs_norm, None, carry, xs)
            return carry, carry[:3]

        return jax.lax.scan(body, carry, (jnp.arange(length), keys))

    final, seen = scan(carry, params, obs_norm)
    steps = int(final[3])
    obs, states, returns = jax.tree.map(lambda x: np.asarray(x[:steps]), seen)
    return states, obs, returns, float(final[2])


def run_episodes(run_dir, episodes: int = 1, seed: int | None = None) -> Episodes | None:
    """Runs the best policy of a run's last checkpoint; ``None`` for a black-box task.

    Args:
      run_dir: the run folder.
      episodes: episodes to run (``split(key, episodes)[j]`` for episode ``j``).
      seed: ``None``: the key of the run's last evaluation; else ``jax.random.key(seed)``.
    """
    run_dir = Path(run_dir)
    ckpt = restore.load_checkpoint(run_dir)
    config = config_lib.from_dict(ckpt.config, check=False)
    config = dataclasses.replace(config, devices=1)  # one episode at a time
    algorithm, _, template, _, _ = shell.build(config)
    task = getattr(algorithm, "task", None)
    if task is not None and not hasattr(task, "env"):
        return None
    state = restore.restore_state(template, ckpt)
    env, policy, params, obs_norm, length, evaluate = _policy(algorithm, state)
    generation, reported = ckpt.generation, None
    key, eval_episodes = _evaluation_key(algorithm, restore.restore_key(ckpt), generation, state)
    if seed is not None:
        key = jax.random.key(seed)
    elif generation > 0 and episodes == eval_episodes:
        metrics = store.read_metrics(run_dir)
        rows = metrics["generation"] == generation
        if "eval_return" in metrics and rows.any():
            reported = float(metrics["eval_return"][rows][-1])
        elif "member0_return" in metrics and rows.any():  # PBT: the best member's return
            returns = [metrics[c][rows][-1] for c in metrics if c.endswith("_return")
                       and c.startswith("member")]  # fmt: skip
            reported = float(np.max(returns))
    runs = [_trajectory(env, policy, params, obs_norm, length, k)
            for k in jax.random.split(key, episodes)]  # fmt: skip
    evaluation = float(evaluate(key, episodes))
    return Episodes(*map(list, zip(*runs, strict=True)), evaluation, reported, generation, env)


# --- drawing ----------------------------------------------------------------------------------


def write_html(result: Episodes, out: Path) -> int:
    """brax's viewer of the episodes, one after the other; returns the frames written."""
    from brax.io import html

    inner = [s.inner.pipeline_state for s in result.states]
    frames = [jax.tree.map(lambda x, i=i: x[i], p) for p in inner
              for i in range(len(jax.tree.leaves(p)[0]))]  # fmt: skip
    out.write_text(html.render(result.env.env.sys, frames))
    return len(frames)


def _gymnax_drawer(env):
    """``draw(ax, state)`` by gymnax's own visualiser for ``env``, or ``None``."""
    try:
        from gymnax.visualize.visualizer import Visualizer
    except ImportError:
        return None
    inner, params = env.env, env.params
    name = getattr(inner, "name", "")
    if name in ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0",
                "MountainCarContinuous-v0"):  # fmt: skip
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame: no sound card to look for
        try:
            import pygame  # noqa: F401  (gymnasium draws classic control with it)
        except ImportError:
            return None

    def draw(ax, state):
        import matplotlib.pyplot as plt

        vis = Visualizer(inner, params, [state])
        plt.close(vis.fig)  # its own figure: drawn into ours instead
        vis.fig, vis.ax = ax.figure, ax
        vis.init()

    try:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        probe = jax.tree.map(lambda x: x, env.reset(jax.random.key(0))[1])
        draw(ax, probe)
        plt.close(fig)
    except Exception:  # no visualiser for this environment
        return None
    return draw


def _draw_observation(ax, obs) -> None:
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


def write_gif(result: Episodes, out: Path) -> int:
    """An animated GIF, one frame per step; returns the frames written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    env = result.env
    drawer = _gymnax_drawer(env)
    frames = []
    for e, (states, observations, so_far) in enumerate(
        zip(result.states, result.observations, result.so_far, strict=True)
    ):
        for t in range(len(so_far)):
            fig, ax = plt.subplots(figsize=(4, 4), dpi=60)
            if drawer is not None:
                drawer(ax, jax.tree.map(lambda x, t=t: x[t], states))
            else:
                _draw_observation(ax, observations[t])
            episode = f"episode {e + 1}  " if len(result.states) > 1 else ""
            ax.set_title(f"{env.spec.name}  {episode}step {t + 1}  return {so_far[t]:.4g}",
                         fontsize=9)  # fmt: skip
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            plt.close(fig)
            frames.append(Image.open(buf).convert("RGB"))
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=50, loop=0)
    return len(frames)


def render(run_dir, episodes: int = 1, seed: int | None = None, out=None) -> str:
    """Renders a run's best policy (see the module docstring); returns what to print.

    Raises:
      CheckpointError: no checkpoint.
      ValueError: episodes below 1.
    """
    if episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {episodes}.")
    run_dir = Path(run_dir)
    result = run_episodes(run_dir, episodes, seed)
    if result is None:
        task = restore.load_checkpoint(run_dir).config.get("algorithm_config", {}).get("task")
        return f"nothing to render: {task!r} is a black-box function, not an environment."
    brax = type(result.env).__name__ == "BraxEnv"
    out = Path(out) if out is not None else run_dir / (HTML_FILENAME if brax else GIF_FILENAME)
    if brax:
        frames = write_html(result, out)
    else:
        frames = write_gif(result, out)
    lines = [f"wrote {out} ({frames} frames)"]
    for e, ret in enumerate(result.returns):
        lines.append(f"episode {e + 1}: return {ret!r}")
    line = f"return {result.evaluation!r} (mean over {episodes} episode(s), as the evaluation)"
    if result.reported is not None:
        line += f"; the run reported {result.reported!r} at generation {result.generation}"
    lines.append(line)
    return "\n".join(lines)
