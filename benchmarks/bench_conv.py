"""The CNN's two ways to convolve, side by side: 3x3 patches times the kernel, or XLA's conv.

    python benchmarks/bench_conv.py [--only step,ppo,es] [--reps 3] [--pop 64]

:class:`evorl_pop.tasks.envs.Conv3x3` computes a 3x3 convolution either as a
matrix product of the image's 3x3 patches (``method='patches'``, the default
on a CPU) or with ``lax.conv_general_dilated`` (``'xla'``, the default on an
accelerator). Prints one table of seconds per row with each method, on
Breakout-MinAtar (10x10x4 images, the default CNN: 16 channels, dense 64):

* ``step``: one gradient step of the CNN on a minibatch of 1,024 images, in a
  ``scan`` of 16 steps, and alone (one jitted call per step).
* ``ppo``: whole PPO iterations of ``examples/ppo_minatar.py``'s config (32
  environments x 128 steps, 4 epochs of 4 minibatches; policy and value CNNs).
* ``es``: whole OpenES generations of ``--pop`` CNN policies (episodes of up
  to 200 steps): the population's forward passes, no gradients.

Each timing is the best of ``--reps`` calls after a warm-up call; the
``check`` column compares the two methods' results.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from ceilings import best_time  # benchmarks/ceilings.py, next to this file

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.algorithms.ppo import PPO
from evorl_pop.algorithms.ppo import Config as PPOConfig
from evorl_pop.run.shell import chunk_fn
from evorl_pop.tasks.envs import CNN

METHODS = ("patches", "xla")


def step_rows(reps):
    """Gradient steps of the CNN, in a scan and alone."""
    images = (jax.random.uniform(jax.random.key(0), (16, 1024, 10, 10, 4)) > 0.8).astype(float)
    out = {}
    for method in METHODS:
        module = CNN((64,), 6, conv=method)
        params = module.init(jax.random.key(1), images[0])

        def step(p, batch, module=module):
            grad = jax.grad(lambda p: jnp.mean(module.apply(p, batch) ** 2))(p)
            return jax.tree.map(lambda a, g: a - 1e-3 * g, p, grad)

        scanned = jax.jit(lambda p, x, step=step: jax.lax.scan(lambda c, b: (step(c, b), None),
                                                                p, x)[0])  # fmt: skip
        alone = jax.jit(step)

        def one_by_one(p, x, alone=alone):
            for batch in x:
                p = alone(p, batch)
            return p

        out[method] = [best_time(f, params, images, reps=reps) for f in (scanned, one_by_one)]
    rows = []
    for i, name in enumerate(("step, in a scan of 16", "step, alone (16 calls)")):
        (t_p, p), (t_x, x) = out["patches"][i], out["xla"][i]
        diff = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), p, x)))
        rows.append((name, t_p / 16, t_x / 16, f"parameters differ by {diff:.1e}"))
    return rows


def generation_time(algo, gens, reps):
    """``(seconds per generation, metrics)``: ``gens`` generations of ``algo`` in one chunk."""
    chunk = chunk_fn(algo, gens)
    run = lambda s: chunk(s, jax.random.key(1))  # noqa: E731
    t, (_, metrics) = best_time(run, algo.init(jax.random.key(0)), reps=reps)
    return t / gens, metrics


def ppo_row(reps, gens=2):
    config = PPOConfig(
        task="Breakout-MinAtar", num_envs=32, unroll_length=128, num_minibatches=4,
        num_epochs=4, learning_rate=5e-4, entropy_cost=0.01, normalize_observations=False,
        policy_hidden_sizes=(64,), value_hidden_sizes=(64,), activation="relu", network="cnn",
    )  # fmt: skip
    times, losses = [], []
    for method in METHODS:
        algo = PPO(config, mesh=make_mesh(1))
        algo.learner.policy_net = algo.learner.policy_net.clone(conv=method)
        algo.learner.value_net = algo.learner.value_net.clone(conv=method)
        t, metrics = generation_time(algo, gens, reps)
        times.append(t)
        losses.append(np.asarray(metrics["loss"]))
    diff = float(np.max(np.abs(losses[0] - losses[1])))
    steps = config.num_envs * config.unroll_length
    updates = config.num_epochs * config.num_minibatches
    return [(f"ppo iteration ({steps:,} steps, {updates} gradient steps)", *times,
             f"losses differ by {diff:.1e}")]  # fmt: skip


def es_row(reps, pop, gens=2):
    config = ESConfig(
        strategy="Open_ES", task="Breakout-MinAtar", population_size=pop, hidden_sizes=(64,),
        policy="cnn", episode_length=200, eval_episodes=0, learning_rate=0.05, sigma_init=0.1,
    )  # fmt: skip
    times, steps = [], []
    for method in METHODS:
        es = ES(config, mesh=make_mesh(1))
        policy = es.task.policy
        es.task.policy = type(policy)(policy.module.clone(conv=method), policy.spec)
        t, metrics = generation_time(es, gens, reps)
        times.append(t)
        steps.append(np.asarray(metrics["env_steps"]))
    same = np.array_equal(*steps)
    return [(f"es generation ({np.sum(steps[0]) / gens:,.0f} steps)", *times,
             f"same steps: {same}")]  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="step,ppo,es")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pop", type=int, default=64, help="the es row's population")
    args = parser.parse_args()
    only = args.only.split(",")
    unknown = set(only) - {"step", "ppo", "es"}
    if unknown:
        parser.error(f"--only takes step, ppo and es, not {', '.join(sorted(unknown))}")

    rows = []
    if "step" in only:
        rows += step_rows(args.reps)
    if "ppo" in only:
        rows += ppo_row(args.reps)
    if "es" in only:
        rows += es_row(args.reps, args.pop)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, one device; Breakout-MinAtar CNN")
    print("| row | patches, ms | xla, ms | xla / patches | check |")
    print("|---|---|---|---|---|")
    for name, a, b, note in rows:
        print(f"| {name} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f} | {note} |")


if __name__ == "__main__":
    main()
