"""ES engine performance, measured side by side in one run.

    python benchmarks/bench_es.py [--only overhead,ceiling,scaling,memory] [--reps 5]

Prints four tables:

1. overhead: generation time of the engine on one device against a
   hand-written evosax + vmap + jit loop on the same CartPole task (OpenES,
   population 256, 4-32-2 MLP, 500-step episodes).
2. ceiling: the engine's environment throughput (scanned steps/s, as the
   reference counts them) against ``shared/bench/cartpole_ceiling.py``'s
   ``env.step_env`` + mask ceiling for the same policy, same run.
3. scaling: generation time at population 2048 on 1 and 2 devices.
4. memory: compiled peak memory per device of one OpenES generation at
   population 4096 and 100k parameters, low-communication against full-matrix.

Every timing is the best of ``--reps`` repetitions of a jitted ``lax.scan`` of
``--gens`` generations, after a warm-up call.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from evosax.algorithms import Open_ES  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import make_strategy  # noqa: E402
from evorl_pop.engine import ShardedES  # noqa: E402
from evorl_pop.envs import make_env  # noqa: E402
from evorl_pop.tasks import BlackBoxTask, ControlTask  # noqa: E402

STEPS = 500


def best_time(fn, *args, reps):
    jax.block_until_ready(fn(*args))  # compile and warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def engine_generations(pop, n_devices, gens, strategy_name="Open_ES", **task_kwargs):
    task = ControlTask("CartPole-v1", hidden_sizes=(32,), **task_kwargs)
    strategy, params = make_strategy(
        strategy_name, pop, task.num_dims, learning_rate=0.05, sigma_init=0.1
    )
    engine = ShardedES(strategy, task, make_mesh(n_devices), params)
    state = engine.init(jax.random.key(0))
    return jax.jit(lambda s, k: engine.run(s, k, gens)[1]["fitness_mean"]), state


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
    engine, e_state = engine_generations(256, 1, args.gens)
    hand, h_state = handwritten_generations(256, args.gens)
    # interleave to share the machine's noise
    t_engine = best_time(engine, e_state, key, reps=args.reps)
    t_hand = best_time(hand, h_state, key, reps=args.reps)
    t_engine = min(t_engine, best_time(engine, e_state, key, reps=args.reps))
    table(
        "1. overhead: OpenES on CartPole-v1, population 256, one device (s / generation)",
        ["engine", "hand-written", "ratio (goal <= 1.05)"],
        [[f"{t_engine / args.gens:.4f}", f"{t_hand / args.gens:.4f}", f"{t_engine / t_hand:.3f}"]],
    )


def bench_ceiling(args):
    sys.path.insert(0, str(args.shared / "bench"))
    from cartpole_ceiling import ceiling

    pop = 256
    engine, state = engine_generations(pop, 1, args.gens)
    t = best_time(engine, state, jax.random.key(2), reps=args.reps)
    ours = pop * STEPS * args.gens / t
    ref = ceiling(pop, autoreset=False, reps=args.reps)
    table(
        "2. throughput: CartPole-v1, 4-32-2 MLP, population 256, one device (scanned steps/s)",
        ["engine (whole generations)", "ceiling (rollouts only)", "ratio (goal >= 0.7)"],
        [[f"{ours:,.0f}", f"{ref:,.0f}", f"{ours / ref:.3f}"]],
    )


def bench_scaling(args):
    if jax.device_count() < 2:
        print("\n3. scaling: skipped, needs 2 devices")
        return
    rows, times = [], {}
    for n in (1, 2):
        run, state = engine_generations(2048, n, args.gens)
        times[n] = best_time(run, state, jax.random.key(3), reps=args.reps)
        rows.append([n, f"{times[n] / args.gens:.4f}", f"{times[1] / times[n]:.2f}x"])
    table(
        "3. scaling: OpenES on CartPole-v1, population 2048 "
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
        engine = ShardedES(strategy, task, make_mesh(n), params, low_communication=low)
        state = jax.eval_shape(engine.init, jax.random.key(0))
        compiled = jax.jit(engine.step).lower(state, jax.random.key(0)).compile()
        mem = compiled.memory_analysis()
        peak = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
        rows.append(["low-communication" if low else "full-matrix", f"{peak / 2**20:,.1f}"])
    ratio = float(rows[0][1].replace(",", "")) / float(rows[1][1].replace(",", ""))
    table(
        f"4. memory: OpenES generation, population 4096 x 100k parameters, {n} devices "
        f"(MiB per device, compiled peak)",
        ["path", "MiB"],
        rows + [["full / low", f"{ratio:.1f}x"]],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="overhead,ceiling,scaling,memory")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gens", type=int, default=5, help="generations per timed call")
    parser.add_argument(
        "--shared",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared",
        help="folder holding bench/cartpole_ceiling.py",
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
            "scaling": bench_scaling,
            "memory": bench_memory,
        }[name](args)


if __name__ == "__main__":
    main()
