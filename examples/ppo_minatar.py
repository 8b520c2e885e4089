"""PPO on Breakout-MinAtar with the CNN policy (3x3 conv, 16 channels, dense 64).

    python examples/ppo_minatar.py [--generations 250] [--devices 2]

One generation is one PPO iteration: 32 environments x 128 steps, then 4
epochs of 4 minibatches split over ``--devices`` CPU devices. The 10x10x4
observations go straight into the project's CNN (no normalisation; they are
0/1 object masks); actions are categorical. The default budget, 1M steps,
takes under a minute on a 2-core CPU (the CNN convolves as a matrix product
of 3x3 patches there: docs/benchmarks/bench-conv.md). Writes
runs/examples/ppo-breakout and figures/ppo_breakout.png: the best, mean and
worst return of the environments' last episodes (a random policy scores about
1; this policy 5-6 by 400k steps, where it settles).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=250)

from evorl_pop.algorithms.ppo import Config  # noqa: E402

config = Config(
    task="Breakout-MinAtar",
    num_envs=32,
    unroll_length=128,
    num_minibatches=4,
    num_epochs=4,
    learning_rate=5e-4,
    entropy_cost=0.01,
    normalize_observations=False,
    policy_hidden_sizes=(64,),
    value_hidden_sizes=(64,),
    activation="relu",
    network="cnn",
)
results = script.train(args, {"ppo-breakout": config}, "ppo_breakout.png",
                       "PPO, Breakout-MinAtar, CNN", x="steps", chunk=10,
                       checkpoint_every=20)  # fmt: skip
for name, result in results.items():
    mean = result.history["fitness_mean"]
    print(f"{name}: {result.env_steps:,} env steps; mean return {mean[-1]:.1f}, best {mean.max()}")
