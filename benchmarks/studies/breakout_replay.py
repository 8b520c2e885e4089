"""Replays the mean policy of an ES run on Breakout-MinAtar from each ball start.

    python benchmarks/studies/breakout_replay.py RUN [--steps 500] [--last 12]

Reads ``RUN/checkpoint.msgpack`` (an ``es`` run on ``Breakout-MinAtar``),
rebuilds the policy from the run's config (network, activation, observation
normalisation) and plays the strategy's mean greedily from both starts (the
ball from the left or the right; the game is otherwise deterministic). Prints
per start the return, the steps, the actions taken (no-op, left, right), the
paddle's columns at each return of the ball, and the last steps before the
ball was lost; beside the policy's action, the action of the hand-written
tracker that moves the paddle towards the ball.
"""

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from evorl_pop.run import restore, store
from evorl_pop.tasks.envs import make_env
from evorl_pop.tasks.obs_norm import ObsNorm
from evorl_pop.tasks.policies import make_policy

ACTIONS = ("no-op", "left", "right")


def replay(run: Path, steps: int, last: int) -> None:
    ckpt = restore.load_checkpoint(run / store.CHECKPOINT_FILENAME)
    cfg = ckpt.config["algorithm_config"]
    if ckpt.config["algorithm"] != "es" or cfg["task"] != "Breakout-MinAtar":
        raise SystemExit(f"{run} is not an es run on Breakout-MinAtar.")
    game = make_env(cfg["task"])  # its gymnax env and params are stepped below
    spec = game.spec
    policy = make_policy(spec, cfg["hidden_sizes"], cfg["activation"], kind=cfg["policy"])
    _, unravel = ravel_pytree(policy.init(jax.random.key(0)))
    params = unravel(jnp.asarray(ckpt.state["strategy_state"]["mean"]))
    saved = ckpt.state.get("task_state") if cfg["normalize_obs"] else None
    norm = ObsNorm(**{k: jnp.asarray(v) for k, v in saved.items()}) if saved else None

    @jax.jit
    def act(obs):
        return policy(params, obs if norm is None else norm.normalize(obs))

    env, env_params = game.env, game.params
    print(f"{run}: generation {ckpt.generation}, {ckpt.env_steps:,} environment steps")
    for start in (0, 9):
        seed = 0
        obs, state = env.reset_env(jax.random.key(seed), env_params)
        while int(state.ball_x) != start:
            seed += 1
            obs, state = env.reset_env(jax.random.key(seed), env_params)
        total, log, returns = 0.0, [], []
        for t in range(steps):
            a = int(act(obs))
            ball, pos = int(state.ball_x), int(state.pos)
            tracker = 1 if ball < pos else 2 if ball > pos else 0
            log.append((t, ball, int(state.ball_y), pos, a, tracker))
            if int(state.ball_y) == 8 and int(state.ball_dir) in (2, 3):  # coming down
                returns.append(pos)
            obs, state, r, done, _ = env.step_env(jax.random.key(0), state, a, env_params)
            total += float(r)
            if done:
                break
        counts = np.bincount([row[4] for row in log], minlength=3)
        print(
            f"ball from column {start}: return {total:g} in {len(log)} steps; actions "
            + ", ".join(f"{n} {c}" for n, c in zip(ACTIONS, counts, strict=True))
            + f"; paddle column as the ball comes down: {returns}"
        )
        for t, ball, row, pos, a, tracker in log[-last:]:
            print(
                f"  t={t:<3} ball column {ball} row {row}  paddle {pos}  "
                f"policy {ACTIONS[a]:<5}  tracker {ACTIONS[tracker]}"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run folder")
    parser.add_argument("--steps", type=int, default=500, help="episode cap")
    parser.add_argument("--last", type=int, default=12, help="steps shown before the end")
    args = parser.parse_args()
    replay(args.run, args.steps, args.last)


if __name__ == "__main__":
    main()
