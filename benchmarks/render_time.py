"""How long ``evorl-pop render`` takes to draw an episode, by environment family.

    python benchmarks/render_time.py [--gif-steps 500] [--html-steps 1000]
        [--gymnax CartPole-v1,Breakout-MinAtar] [--brax brax/hopper]

Each environment is stepped ``--gif-steps`` (``--html-steps`` for brax) times by
random actions in one ``lax.scan`` (an episode's end is not a reset here: every
step is a frame), and its family draws the steps as ``evorl-pop render`` does
(``EnvFamily.draw``). For a GIF the table also draws the same frames the plain
way (a new matplotlib figure and a PNG per frame, gymnax's ``Visualizer`` built
per frame), and gives the ratio. Drawing only is timed: stepping and compiling
are not.
"""

import argparse
import io
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.tasks.drawing import Trajectory
from evorl_pop.tasks.envs import env_family, make_env


def episode(env, steps: int) -> Trajectory:
    """``steps`` steps of random actions, every state kept."""
    spec = env.spec

    def action(key):
        if spec.discrete:
            return jax.random.randint(key, (), 0, spec.action_dim)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        return jax.random.uniform(key, (spec.action_dim,), minval=low, maxval=high)

    def body(carry, key):
        state, total = carry
        k1, k2 = jax.random.split(key)
        obs, state, reward, _ = env.step(k1, state, action(k2))
        total = total + reward
        return (state, total), (obs, state, total)

    _, state = env.reset(jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), steps)
    run = jax.jit(lambda s: jax.lax.scan(body, (s, jnp.zeros(())), keys)[1])
    observations, states, so_far = run(state)
    return Trajectory(
        jax.tree.map(np.asarray, states), np.asarray(observations), np.asarray(so_far)
    )


def per_frame_figures(env, trajectory: Trajectory, out: Path) -> int:
    """The plain way: a figure, a visualiser and a PNG per frame."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from gymnax.visualize.visualizer import Visualizer
    from PIL import Image

    frames = []
    for t in range(len(trajectory.so_far)):
        fig, ax = plt.subplots(figsize=(4, 4), dpi=60)
        vis = Visualizer(
            env.env, env.params, [jax.tree.map(lambda x, t=t: x[t], trajectory.states)]
        )
        plt.close(vis.fig)
        vis.fig, vis.ax = fig, ax
        vis.init()
        ax.set_title(f"step {t + 1}  return {trajectory.so_far[t]:.4g}", fontsize=9)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        frames.append(Image.open(buf).convert("RGB"))
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=50, loop=0)
    return len(frames)


def timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    frames = fn(*args)
    return time.perf_counter() - start, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gif-steps", type=int, default=500)
    parser.add_argument("--html-steps", type=int, default=1000)
    parser.add_argument("--gymnax", default="CartPole-v1,Breakout-MinAtar")
    parser.add_argument("--brax", default="brax/hopper")
    parser.add_argument("--no-before", action="store_true", help="skip the plain way (slow)")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in filter(None, args.gymnax.split(",")):
            env = make_env(name, episode_length=args.gif_steps)
            trajectory = episode(env, args.gif_steps)
            family = env_family(name)
            now, frames = timed(family.draw, env, [trajectory], Path(folder) / "now.gif")
            before = None
            if not args.no_before:
                before, _ = timed(per_frame_figures, env, trajectory, Path(folder) / "before.gif")
            rows.append((name, f"GIF, {frames} frames", now, before))
        for name in filter(None, args.brax.split(",")):
            env = make_env(name, episode_length=args.html_steps)
            trajectory = episode(env, args.html_steps)
            seconds, frames = timed(
                env_family(name).draw, env, [trajectory], Path(folder) / "r.html"
            )
            rows.append((name, f"HTML, {frames} frames", seconds, None))

    print(f"{'environment':20s} {'drawing':18s} {'seconds':>8s} {'plain':>8s} {'ratio':>6s}")
    for name, what, seconds, before in rows:
        old = f"{before:8.2f}" if before is not None else f"{'':8s}"
        ratio = f"{before / seconds:6.1f}" if before is not None else ""
        print(f"{name:20s} {what:18s} {seconds:8.2f} {old} {ratio}")


if __name__ == "__main__":
    main()
