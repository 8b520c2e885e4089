"""OpenES on a Gymnasium environment stepped on the host: CartPole-v1, a 4-16-2 MLP.

    python examples/openes_gymnasium.py [--generations 20] [--task gym:CartPole-v1]
        [--vector sync|async]

Writes runs/examples/openes-gymnasium and figures/openes_gymnasium.png. The
policy is a JAX network inside the compiled generation; each device steps its
slice of the population in a Gymnasium vector environment through host
callbacks (``--vector async``: a worker process per episode). Any registered
id works as ``gym:ID`` (``gym:LunarLander-v3``, ``gym:HalfCheetah-v5`` with
``pip install -e '.[gymnasium]'``).
"""

from evorl_pop.run import script


def _arguments(parser):
    parser.add_argument("--task", default="gym:CartPole-v1", help="gym:<Gymnasium id>")
    parser.add_argument("--pop", type=int, default=32, help="population size")
    parser.add_argument("--vector", default="sync", choices=("sync", "async"))


args = script.start(__doc__, _arguments, generations=20)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task=args.task, population_size=args.pop, learning_rate=0.05,
              sigma_init=0.1, hidden_sizes=(16,), episodes=2, normalize_obs=True,
              vector=args.vector, eval_episodes=4)  # fmt: skip
results = script.train(args, {"openes-gymnasium": es}, "openes_gymnasium.png",
                       f"OpenES on {args.task} (Gymnasium, {args.vector}), population {args.pop}",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=5,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: {result.env_steps:,} env steps; mean-policy return {ret[-1]:.1f} "
          f"(best {ret.max():.1f})")  # fmt: skip
