"""ES engine performance, measured side by side in one run.

    python benchmarks/bench_es.py [--only overhead,ceiling,pendulum,devices,scaling,memory]

Prints six tables:

1. overhead: generation time of the engine on one device against a
   hand-written evosax + vmap + jit loop on the same CartPole task (OpenES,
   population 256, 4-32-2 MLP, 500-step episodes).
2. ceiling: engine generation time on that CartPole task against the rollout
   ceiling of :mod:`ceilings` (the populations the timed engine generations
   evaluate, each rolled out for 500 steps of ``env.step_env`` + mask, no
   ask / tell), same run, and the time of the strategy's ask + tell alone.
   One row per Open_ES noise sampler: the shared noise table (the default,
   :class:`evorl_pop.algorithms.es.NoiseTableOpen_ES`) and evosax's own normals
   (``noise='normal'``).
3. pendulum: the same on Pendulum-v1, population 1024, 3-16-16-1 ReLU MLP,
   also against the first population's rollout alone (``first``);
   ``(c+a+t)/c`` is the floor the strategy's own ask + tell sets on the ratio,
   ``engine/(c+a+t)`` what the engine adds beyond the rollout and the strategy.
4. devices: the Pendulum job through the CLI (``evorl-pop train``) with its
   default device count and with ``--devices 2``, against ``--devices 1``
   (per-generation time from the run's own ``metrics.csv``).
5. scaling: generation time at population 2048 on 1 and 2 devices.
6. memory: compiled peak memory per device of one OpenES generation at
   population 4096 and 100k parameters, low-communication against full-matrix.

In-process timings are the best (or median) of ``--reps`` calls of a jitted
``lax.scan`` of ``--gens`` generations, after a warm-up call; engine and
ceiling calls alternate so that both see the same load. On a machine other
jobs share, ``--clock cpu`` times the ceiling and pendulum tables in this
process's CPU time, which those jobs disturb far less than the wall clock.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")  # the CLI runs get the user's own
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import ceilings  # noqa: E402  (benchmarks/ceilings.py, next to this file)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from evosax.algorithms import Open_ES  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import make_strategy  # noqa: E402
from evorl_pop.algorithms.open_es import LowCommunicationEngine  # noqa: E402
from evorl_pop.core.engine import Engine  # noqa: E402
from evorl_pop.run.shell import chunk_fn  # noqa: E402
from evorl_pop.tasks import BlackBoxTask, ControlTask  # noqa: E402
from evorl_pop.tasks.envs import make_env  # noqa: E402

STEPS = 500


PENDULUM_JOB = {"hidden_sizes": (16, 16), "activation": "relu"}


def engine_generations(pop, n_devices, gens, env="CartPole-v1", noise="normal", **task_kwargs):
    task_kwargs = task_kwargs or {"hidden_sizes": (32,)}
    task = ControlTask(env, **task_kwargs)
    strategy, params = make_strategy(
        "Open_ES", pop, task.num_dims, learning_rate=0.05, sigma_init=0.1, noise=noise
    )
    engine = Engine(strategy, task, make_mesh(n_devices), params)
    state = engine.init(jax.random.key(0))
    run = chunk_fn(engine, gens)
    return lambda s, k: run(s, k)[1]["fitness_mean"], state, engine


def handwritten_generations(pop, gens):
    """evosax + vmap + jit by hand: the plainest way to run the same task."""
    env = make_env("CartPole-v1")
    gymnax_env, env_params = env.env, env.params
    template = {
        "w1": jnp.zeros((4, 32)),
        "b1": jnp.zeros(32),
        "w2": jnp.zeros((32, 2)),
        "b2": jnp.zeros(2),
    }
    flat, unravel = jax.flatten_util.ravel_pytree(template)
    es = Open_ES(
        pop,
        jnp.zeros(flat.size),
        optimizer=__import__("optax").adam(0.05),
        std_schedule=__import__("optax").constant_schedule(0.1),
    )
    params = es.default_params

    def rollout(x, key):
        p = unravel(x)
        key, k0 = jax.random.split(key)
        obs, st = gymnax_env.reset_env(k0, env_params)

        def body(carry, k):
            obs, st, ret, alive = carry
            a = jnp.argmax(jnp.tanh(obs @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
            obs, st, r, done, _ = gymnax_env.step_env(k, st, a, env_params)
            return (obs, st, ret + alive * r, alive * (1.0 - done)), None

        (_, _, ret, _), _ = jax.lax.scan(body, (obs, st, 0.0, 1.0), jax.random.split(key, STEPS))
        return ret

    def generation(state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        population, state = es.ask(k1, state, params)
        returns = jax.vmap(rollout)(population, jax.random.split(k2, pop))
        state, _ = es.tell(k3, population, -returns, state, params)
        return state, returns.mean()

    state = es.init(jax.random.key(0), flat, params)
    run = jax.jit(
        lambda s, k: jax.lax.scan(
            lambda s, g: generation(s, jax.random.fold_in(k, g)), s, jnp.arange(gens)
        )[1]
    )
    return run, state


def table(title, header, rows):
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  " + "  ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=True)))


def bench_overhead(args):
    key = jax.random.key(1)
    engine, e_state, _ = engine_generations(256, 1, args.gens)
    hand, h_state = handwritten_generations(256, args.gens)
    # interleave to share the machine's noise
    t_engine = ceilings.best_time(engine, e_state, key, reps=args.reps)[0]
    t_hand = ceilings.best_time(hand, h_state, key, reps=args.reps)[0]
    t_engine = min(t_engine, ceilings.best_time(engine, e_state, key, reps=args.reps)[0])
    table(
        "1. overhead: OpenES on CartPole-v1, population 256, one device (s / generation)",
        ["engine", "hand-written", "ratio (goal <= 1.05)"],
        [[f"{t_engine / args.gens:.4f}", f"{t_hand / args.gens:.4f}", f"{t_engine / t_hand:.3f}"]],
    )


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def alternate(fns, reps, clock=time.perf_counter):
    """Median seconds of each ``(fn, args)``, calls interleaved to share the load."""
    for fn, fn_args in fns:
        jax.block_until_ready(fn(*fn_args))  # compile and warm up
    times = [[] for _ in fns]
    for _ in range(reps):
        for (fn, fn_args), ts in zip(fns, times, strict=True):
            t0 = clock()
            jax.block_until_ready(fn(*fn_args))
            ts.append(clock() - t0)
    return [sorted(ts)[len(ts) // 2] for ts in times]


def evaluated_populations(sharded, state, key, gens):
    """The populations ``sharded.run(state, key, gens)`` evaluates, generation by generation."""
    step, populations = jax.jit(sharded.step), []
    for _ in range(gens):
        k = jax.random.fold_in(key, state.generation)  # the keys of `run` and `step`
        k_ask = jax.random.split(k, 4)[0]
        populations.append(sharded.strategy.ask(k_ask, state.strategy_state, sharded.params)[0])
        state, _ = step(state, k)
    return jnp.stack(populations)


def engine_vs_ceiling(args, env, pop, ceiling, noise="normal", **task_kwargs):
    """Seconds per engine generation, per ceiling rollout, per ask + tell alone; same run.

    The ceiling rolls out the very policies the timed engine call evaluates,
    one rollout per generation: a rollout's cost depends on the policies (on
    Pendulum, the populations of generations 1-4 cost 7-10 % more to roll out
    than the first one). ``first`` is the ceiling on the first population
    alone, for reference.
    """
    engine, state, sharded = engine_generations(pop, 1, args.gens, env, noise, **task_kwargs)
    es, es_params = sharded.strategy, sharded.params
    key = jax.random.key(2)
    populations = evaluated_populations(sharded, state, key, args.gens)
    same = ceilings.from_flax(jax.vmap(jax.vmap(sharded.task.unravel))(populations))
    run, _, ceiling_key = ceiling(pop, params=jax.tree.map(lambda x: x[0], same))

    @jax.jit
    def rollouts(params, key):  # one rollout per generation's population, as the engine
        return jax.lax.map(lambda a: run(*a), (params, jax.random.split(key, args.gens)))

    def ask_tell(state, key):  # the strategy's own work, with no evaluation
        population, s = es.ask(key, state.strategy_state, es_params)
        return es.tell(key, population, population[:, 0], s, es_params)[0].mean

    first = jax.tree.map(lambda x: x[0], same)
    t_engine, t_ceiling, t_first, t_ask_tell = alternate(
        [
            (engine, (state, key)),
            (rollouts, (same, ceiling_key)),
            (run, (first, ceiling_key)),
            (jax.jit(ask_tell), (state, jax.random.key(3))),
        ],
        args.reps * 3,
        CLOCKS[args.clock],
    )
    return t_engine / args.gens, t_ceiling / args.gens, t_first, t_ask_tell


NOISE_LABELS = {"normal": "evosax normals", "table": "noise table (default)"}


def bench_ceiling(args):
    pop, steps = 256, ceilings.CARTPOLE_STEPS
    rows = []
    for noise in ("table", "normal"):
        t_gen, t_ceil, _, t_es = engine_vs_ceiling(
            args, "CartPole-v1", pop, ceilings.cartpole_rollout, noise
        )
        rows.append(
            [
                NOISE_LABELS[noise],
                f"{t_gen:.4f}",
                f"{t_ceil:.4f}",
                f"{t_gen / t_ceil:.3f}",
                f"{t_es:.4f}",
                f"{pop * steps / t_ceil:,.0f}",
            ]
        )
    table(
        "2. ceiling: OpenES on CartPole-v1, 4-32-2 MLP, population 256, one device "
        "(engine: whole generations; the engine stops an episode's steps when it falls, "
        "the ceiling scans all 500)",
        [
            "Open_ES noise",
            "engine s/gen",
            "ceiling s/rollout",
            "ratio (goal <= 1.05)",
            "ask+tell s",
            "ceiling st/s",
        ],
        rows,
    )


def bench_pendulum(args):
    pop, rows = 1024, []
    for noise in ("table", "normal"):
        t_gen, t_ceil, t_first, t_es = engine_vs_ceiling(
            args, "Pendulum-v1", pop, ceilings.pendulum_rollout, noise, **PENDULUM_JOB
        )
        rows.append(
            [
                NOISE_LABELS[noise],
                f"{t_gen:.4f}",
                f"{t_ceil:.4f}",
                f"{t_gen / t_ceil:.3f}",
                f"{t_first:.4f}",
                f"{t_gen / t_first:.3f}",
                f"{t_es:.4f}",
                f"{(t_ceil + t_es) / t_ceil:.3f}",
                f"{t_gen / (t_ceil + t_es):.3f}",
            ]
        )
    table(
        "3. pendulum: OpenES on Pendulum-v1, 3-16-16-1 ReLU MLP, population 1024, one device "
        "(ceiling: the same policies as the engine's generations; first: the first "
        "population's alone)",
        [
            "Open_ES noise",
            "engine s/gen",
            "ceiling s/rollout",
            "ratio (goal <= 1.05)",
            "first s",
            "engine/first",
            "ask+tell s",
            "(c+a+t)/c",
            "engine/(c+a+t)",
        ],
        rows,
    )


def cli_seconds_per_generation(devices, generations=300, chunk=50):
    """The Pendulum job through ``evorl-pop train``: seconds per generation.

    Read from the run's ``metrics.csv`` between the end of the first chunk (after
    compilation) and the last generation. ``devices=None`` is the CLI default.
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if USER_XLA_FLAGS is not None:
        env["XLA_FLAGS"] = USER_XLA_FLAGS
    with tempfile.TemporaryDirectory() as out:
        train = (
            f"train --strategy Open_ES --task Pendulum-v1 --pop 1024 --generations {generations} "
            f"--chunk {chunk} --checkpoint-every 0 --set hidden_sizes=16,16 --set activation=relu "
            "--set episodes=1 --set normalize_obs=false --set eval_episodes=0 -q --no-figure "
            "--overwrite"
        )
        cmd = [sys.executable, "-m", "evorl_pop.cli", *train.split(), "--out", out]
        if devices is not None:
            cmd += ["--devices", str(devices)]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(Path(out) / "metrics.csv") as f:
            wall = {int(r["generation"]): float(r["wall_time"]) for r in csv.DictReader(f)}
    return (wall[generations] - wall[chunk]) / (generations - chunk)


def bench_devices(args):
    rows, times = [], {}
    for _ in range(max(1, args.reps // 2)):  # alternate, keep each setting's best
        for devices in (1, None, 2):
            t = cli_seconds_per_generation(devices)
            times[devices] = min(times.get(devices, float("inf")), t)
    for devices, name in ((1, "--devices 1"), (None, "default"), (2, "--devices 2")):
        rows.append([name, f"{times[devices]:.4f}", f"{times[devices] / times[1]:.2f}"])
    table(
        f"4. devices: the Pendulum job through evorl-pop train, {os.cpu_count()} cores "
        "(s / generation; goal default / 1 device <= 0.6 on 2 cores)",
        ["devices", "s/gen", "ratio to 1 device"],
        rows,
    )


def bench_scaling(args):
    if jax.device_count() < 2:
        print("\n5. scaling: skipped, needs 2 devices")
        return
    rows, times = [], {}
    for n in (1, 2):
        run, state, _ = engine_generations(2048, n, args.gens)
        times[n] = ceilings.best_time(run, state, jax.random.key(3), reps=args.reps)[0]
        rows.append([n, f"{times[n] / args.gens:.4f}", f"{times[1] / times[n]:.2f}x"])
    table(
        "5. scaling: OpenES on CartPole-v1, population 2048 "
        "(s / generation; goal 2 devices >= 1.7x)",
        ["devices", "s/gen", "speed-up"],
        rows,
    )


def bench_memory(args):
    task = BlackBoxTask("sphere", num_dims=100_000, x0=0.1)
    n = min(2, jax.device_count())
    rows = []
    for low in (False, True):
        strategy, params = make_strategy("Open_ES", 4096, task.num_dims, learning_rate=0.01)
        engine_class = LowCommunicationEngine if low else Engine
        engine = engine_class(strategy, task, make_mesh(n), params)
        state = jax.eval_shape(engine.init, jax.random.key(0))
        compiled = jax.jit(engine.step).lower(state, jax.random.key(0)).compile()
        mem = compiled.memory_analysis()
        peak = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
        rows.append(["low-communication" if low else "full-matrix", f"{peak / 2**20:,.1f}"])
    ratio = float(rows[0][1].replace(",", "")) / float(rows[1][1].replace(",", ""))
    table(
        f"6. memory: OpenES generation, population 4096 x 100k parameters, {n} devices "
        f"(MiB per device, compiled peak)",
        ["path", "MiB"],
        rows + [["full / low", f"{ratio:.1f}x"]],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="overhead,ceiling,pendulum,devices,scaling,memory")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gens", type=int, default=5, help="generations per timed call")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="clock of the ceiling and pendulum tables; 'cpu' (this process's CPU time) "
        "is steadier while other jobs share the cores",
    )
    args = parser.parse_args()
    print(
        f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, "
        f"{os.cpu_count()} cores"
    )
    for name in args.only.split(","):
        {
            "overhead": bench_overhead,
            "ceiling": bench_ceiling,
            "pendulum": bench_pendulum,
            "devices": bench_devices,
            "scaling": bench_scaling,
            "memory": bench_memory,
        }[name](args)


if __name__ == "__main__":
    main()
