"""OpenES on Breakout-MinAtar with the CNN policy (3x3 conv, 16 channels, dense 64).

    python examples/openes_minatar.py [--generations 1000] [--pop 128] [--vbn]
    python examples/openes_minatar.py --policy keypoints --elite 0.1 --pop 256 \
        --restarts 48 --restart-generations 100 --generations 300

Writes runs/examples/openes-breakout and figures/openes_breakout.png. The
10x10x4 observation goes through the CNN (``policy='cnn'``, which ``'auto'``
picks too). A random policy scores about 1; episodes are capped at 500 steps.

``--policy keypoints`` (run folder openes-breakout-keypoints, figure
figures/openes_breakout_keypoints.png) reads where the paddle, ball, trail and
bricks are (each channel's spatial soft-argmax) into a linear layer, 27
parameters; ``--elite 0.1`` makes OpenES follow the best tenth of each
generation only. Where a run ends depends much on where it starts, so
``--restarts K`` first trains K runs (seeds seed, seed+1, ...) for
``--restart-generations`` each, then continues the one whose mean policy did
best over its last 10 generations to ``--generations`` in all, plays that
mean policy for 64 fresh episodes, and draws every run in one figure.
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--pop", type=int, default=128, help="population size")
    parser.add_argument(
        "--vbn", action="store_true", help="virtual batch normalisation of the CNN policy"
    )
    parser.add_argument(
        "--policy",
        choices=("cnn", "keypoints"),
        default="cnn",
        help="the CNN with a dense 64 layer, or the keypoints with a linear layer",
    )
    parser.add_argument(
        "--elite",
        type=float,
        default=0.0,
        help="follow only this fraction of the population, the best (default: all, by rank)",
    )
    parser.add_argument("--restarts", type=int, default=0, help="runs to choose from (0: one run)")
    parser.add_argument(
        "--restart-generations", type=int, default=100, help="generations of each restart"
    )


args = script.start(__doc__, _arguments, generations=1000)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

keypoints = args.policy == "keypoints"
es = ESConfig(strategy="Open_ES", task="Breakout-MinAtar", population_size=args.pop,
              learning_rate=0.05, sigma_init=0.1, hidden_sizes=() if keypoints else (64,),
              policy=args.policy, episode_length=500, eval_episodes=8,
              virtual_batch_norm=args.vbn, elite=args.elite)  # fmt: skip
suffix = "-keypoints" if keypoints else ""


def restart_and_continue(es, args, name, figure):
    """The ``--restarts`` procedure (see the module's docstring); returns nothing."""
    import time

    import jax
    import matplotlib.pyplot as plt
    import numpy as np

    import evorl_pop
    from evorl_pop.algorithms.es import ES
    from evorl_pop.run.config import RunConfig

    if args.restarts < 1 or not 0 < args.restart_generations < args.generations:
        raise SystemExit(
            "openes_minatar.py: --restarts must be at least 1 (0: one run), and "
            "--restart-generations between 0 and --generations."
        )
    start, runs = time.perf_counter(), []
    for seed in range(args.seed, args.seed + args.restarts):
        run_dir = args.runs / f"{name}-restart{seed}"
        first = RunConfig("es", seed, args.restart_generations, chunk=10, checkpoint_every=0,
                          devices=args.devices, algorithm_config=es)  # fmt: skip
        result = evorl_pop.train(first, run_dir, progress=False, overwrite=True, figure=False)
        runs.append((float(np.mean(result.history["eval_return"][-10:])), seed, run_dir, result))
        print(f"seed {seed}: mean policy {runs[-1][0]:.2f} over its last 10 generations, "
              f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    score, seed, run_dir, chosen = max(runs, key=lambda run: run[0])  # the first of ties
    more = args.generations - args.restart_generations
    final = evorl_pop.resume(run_dir, more=more, progress=not args.quiet, figure=False)
    seconds = time.perf_counter() - start
    steps = sum(run[3].env_steps for run in runs) + final.env_steps - chosen.env_steps
    task = ES(es).task
    play = jax.jit(lambda mean, key: task.evaluate_return(mean, key, final.state.task_state, 64))
    fresh = float(play(final.state.strategy_state.mean, jax.random.key(2**31 - 1)))
    curve = np.concatenate([chosen.history["eval_return"], final.history["eval_return"]])
    print(f"{name}: continued seed {seed} ({score:.2f}); {args.restarts} restarts and "
          f"{args.generations} generations of it: {steps:,} env steps, {seconds:.0f} s; mean "
          f"policy {curve[-1]:.1f} at the end, {fresh:.2f} over 64 fresh episodes")  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4))
    for _, s, _, result in runs:
        if s != seed:
            ax.plot(np.arange(1, len(result.history["eval_return"]) + 1),
                    result.history["eval_return"], color="0.7", lw=0.8)  # fmt: skip
    ax.plot(np.arange(1, len(curve) + 1), curve, color="C0", lw=1.5,
            label=f"seed {seed}, continued: {fresh:.1f} over 64 fresh episodes")  # fmt: skip
    ax.plot([], [], color="0.7", lw=0.8, label=f"the other {args.restarts - 1} restarts")
    ax.axhline(10, color="k", ls=":", lw=0.8)
    ax.set(xlabel="generation", ylabel="mean-policy return (8 episodes)",
           title=f"OpenES on Breakout-MinAtar, keypoint policy, {steps / 1e6:.1f} M steps, "
           f"{seconds / 60:.1f} min")  # fmt: skip
    ax.legend(loc="upper left", fontsize=8)
    args.figures.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figures / figure, dpi=120, bbox_inches="tight")
    print(f"figure: {args.figures / figure}")


run_name, figure = f"openes-breakout{suffix}", f"openes_breakout{suffix.replace('-', '_')}.png"
if args.restarts:
    restart_and_continue(es, args, run_name, figure)
else:
    title = (
        f"OpenES on Breakout-MinAtar, {'keypoint' if keypoints else 'CNN'} policy, "
        f"population {args.pop}" + (f", elite {args.elite:g}" if args.elite else "")
    )
    results = script.train(
        args,
        {run_name: es},
        figure,
        title,
        chunk=10,
        checkpoint_every=0,
        metrics=("best", "mean", "worst", "eval_return"),
        x="steps",
    )
    for name, result in results.items():
        ret = result.history["eval_return"]
        above = (ret >= 10).nonzero()[0]
        when = f"generation {above[0] + 1}" if above.size else "not within the run"
        print(
            f"{name}: {result.env_steps:,} env steps; mean-policy return {ret[-1]:.1f} "
            f"(best {ret.max():.1f}); >= 10 first at {when}"
        )
