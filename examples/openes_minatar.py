"""OpenES on Breakout-MinAtar with the CNN policy (3x3 conv, 16 channels, dense 64).

    python examples/openes_minatar.py [--generations 1000] [--pop 128] [--vbn]
    python examples/openes_minatar.py --policy keypoints --elite 0.1 --pop 256 --generations 150

Writes runs/examples/openes-breakout and figures/openes_breakout.png. The
10x10x4 observation goes through the CNN (``policy='cnn'``, which ``'auto'``
picks too). A random policy scores about 1; episodes are capped at 500 steps.

``--policy keypoints`` (run folder openes-breakout-keypoints, figure
figures/openes_breakout_keypoints.png) reads where the paddle, ball, trail and
bricks are (each channel's spatial soft-argmax) into a linear layer, 27
parameters; ``--elite 0.1`` makes OpenES follow the best tenth of each
generation only.
"""

from _common import parse, train_and_plot


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


args = parse(__doc__.splitlines()[0], _arguments, generations=1000)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402
from evorl_pop.config import RunConfig  # noqa: E402

keypoints = args.policy == "keypoints"
config = RunConfig(
    algorithm="es",
    algorithm_config=ESConfig(
        strategy="Open_ES",
        task="Breakout-MinAtar",
        population_size=args.pop,
        learning_rate=0.05,
        sigma_init=0.1,
        hidden_sizes=() if keypoints else (64,),
        policy=args.policy,
        episode_length=500,
        eval_episodes=8,
        virtual_batch_norm=args.vbn,
        elite=args.elite,
    ),
    seed=args.seed,
    generations=args.generations,
    chunk=10,
    checkpoint_every=0,
    devices=args.devices,
)
suffix = "-keypoints" if keypoints else ""
for name, result in train_and_plot(
    [(f"openes-breakout{suffix}", config)],
    args,
    f"openes_breakout{suffix.replace('-', '_')}.png",
    f"OpenES on Breakout-MinAtar, {'keypoint' if keypoints else 'CNN'} policy, "
    f"population {args.pop}" + (f", elite {args.elite:g}" if args.elite else ""),
    metrics=("best", "mean", "worst", "eval_return"),
    x="steps",
):
    ret = result.history["eval_return"]
    above = (ret >= 10).nonzero()[0]
    when = f"generation {above[0] + 1}" if above.size else "not within the run"
    print(
        f"{name}: {result.env_steps:,} env steps; mean-policy return {ret[-1]:.1f} "
        f"(best {ret.max():.1f}); >= 10 first at {when}"
    )
