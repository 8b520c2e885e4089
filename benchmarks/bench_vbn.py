"""Virtual batch normalisation on Breakout-MinAtar: the fold and whole generations, side by side.

    python benchmarks/bench_vbn.py [--pop 256] [--hidden 64] [--reps 5] [--gens 2]
        [--episode-length 500]

Prints one table, each row timed against the same work done the direct way:

* ``fold``: folding VBN into a population's weights (the default CNN, the
  reference batch of ``evorl_pop.tasks.control.VBN_BATCH`` observations), as the
  engine does, under ``vmap`` over the candidates:
  :func:`evorl_pop.tasks.control.fold_virtual_batch_norm` (the first layer's
  statistics from the reference batch's moments, the candidates folded a few
  at a time) against the direct fold of the same population, vmapped (every
  layer applied to the whole reference batch, its statistics reduced from
  the outputs). Their results agree to float tolerance (printed).
* ``generation``: whole OpenES generations of the engine (ask, VBN, rollouts
  of up to ``--episode-length`` steps, tell) on one device, untrained
  policies, with either fold.
* ``generation, RUN`` (with ``--run RUN``): the same from the state of a VBN
  run's checkpoint, in that run's config (e.g. the plateau that
  ``examples/openes_minatar.py --vbn --pop 256 --generations 600`` reaches).

Every timing is the best of ``--reps`` calls after a warm-up call.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from ceilings import best_time  # benchmarks/ceilings.py, next to this file
from jax.flatten_util import ravel_pytree

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.run import config as config_lib
from evorl_pop.run import restore
from evorl_pop.run.shell import chunk_fn
from evorl_pop.tasks import control
from evorl_pop.tasks.control import fold_virtual_batch_norm
from evorl_pop.tasks.envs import ACTIVATIONS, CNN


def fold_direct(policy, params, reference, eps=1e-5):
    """The fold as defined: every hidden layer applied to the reference batch."""
    import flax.linen as nn

    module = policy.module
    act = ACTIVATIONS[module.activation]
    folded = jax.tree.map(lambda x: x, params)
    layers, x = folded["params"], jnp.asarray(reference, jnp.float32)

    def standardise(layer, pre, axes):
        mu, sd = pre.mean(axes), jnp.sqrt(pre.var(axes) + eps)
        layer["kernel"], layer["bias"] = layer["kernel"] / sd, (layer["bias"] - mu) / sd
        return act((pre - mu) / sd)

    if isinstance(module, CNN):
        for i, width in enumerate(module.channels):
            layer = layers[f"Conv_{i}"]
            pre = nn.Conv(width, (3, 3), padding="VALID").apply({"params": layer}, x)
            x = standardise(layer, pre, (0, 1, 2))
        layers = layers["MLP_0"]
    x = jnp.reshape(x, (x.shape[0], -1))
    for j, size in enumerate(module.hidden_sizes):
        layer = layers[f"Dense_{j}"]
        x = standardise(layer, nn.Dense(size).apply({"params": layer}, x), 0)
    return folded


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pop", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64, help="the CNN's dense layer")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gens", type=int, default=2, help="generations per timed call")
    parser.add_argument("--episode-length", type=int, default=500)
    parser.add_argument("--run", help="also time generations from this VBN run's checkpoint")
    args = parser.parse_args()

    config = ESConfig(
        strategy="Open_ES", task="Breakout-MinAtar", population_size=args.pop,
        hidden_sizes=(args.hidden,), policy="cnn", episode_length=args.episode_length,
        virtual_batch_norm=True, eval_episodes=0, learning_rate=0.05, sigma_init=0.1,
    )  # fmt: skip
    algo = ES(config, mesh=make_mesh(1))
    task = algo.task
    population = jax.vmap(lambda k: task.init_solution(k))(
        jax.random.split(jax.random.key(0), args.pop)
    )

    def fold_all(fold, reference):
        return jax.jit(jax.vmap(lambda x: ravel_pytree(fold(task.policy, task.unravel(x),
                                                            reference))[0]))  # fmt: skip

    rows = []
    t_new, new = best_time(
        fold_all(fold_virtual_batch_norm, task.vbn_reference), population, reps=args.reps
    )
    t_old, old = best_time(fold_all(fold_direct, task.reference), population, reps=args.reps)
    diff = float(jnp.max(jnp.abs(new - old)) / jnp.max(jnp.abs(old)))
    rows.append((f"fold, population {args.pop}", t_new, t_old, f"max difference {diff:.1e}"))

    def time_generations(config, start):
        """Generations of ``config`` from ``start(es)``, with this fold and the direct one."""
        out = []
        for fold in (fold_virtual_batch_norm, fold_direct):
            es = ES(config, mesh=make_mesh(1))
            if fold is fold_direct:  # the same engine, its task folding the direct way
                es.task.vbn_reference = es.task.reference
            saved, control.fold_virtual_batch_norm = control.fold_virtual_batch_norm, fold
            try:
                chunk = chunk_fn(es, args.gens)
                run = lambda s, c=chunk: c(s, jax.random.key(1))  # noqa: E731
                t, (_, metrics) = best_time(run, start(es), reps=args.reps)
            finally:
                control.fold_virtual_batch_norm = saved
            out.append((t / args.gens, metrics["env_steps"]))
        (t_new, steps), (t_old, steps_old) = out
        same = np.array_equal(steps, steps_old)
        return f"{np.sum(steps) / args.gens:,.0f} steps", t_new, t_old, f"same steps: {same}"

    steps, *times = time_generations(config, lambda es: es.init(jax.random.key(0)))
    rows.append((f"generation ({steps})", *times))
    if args.run:
        ckpt = restore.load_checkpoint(args.run)
        run_config = config_lib.from_dict(ckpt.config).algorithm_config
        if not getattr(run_config, "virtual_batch_norm", False):
            raise SystemExit(f"--run {args.run}: not a run with virtual_batch_norm.")
        steps, *times = time_generations(
            run_config,
            lambda es: restore.restore_state(es.init(jax.random.key(0)), ckpt),
        )
        rows.append((f"generation, {args.run} at {ckpt.generation} ({steps})", *times))

    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, one device; "
          f"Breakout-MinAtar CNN, dense {args.hidden}, {task.num_dims:,} parameters")  # fmt: skip
    print("| row | this fold, ms | direct fold, ms | speed-up | check |")
    print("|---|---|---|---|---|")
    for name, a, b, note in rows:
        print(f"| {name} | {a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.2f}x | {note} |")


if __name__ == "__main__":
    main()
