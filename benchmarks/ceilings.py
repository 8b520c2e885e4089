"""Rollout ceilings: the plainest jitted rollout of a population, for engine ratios.

Each ceiling is a hand-written ``jit(vmap(scan(step_env)))`` over a population of
MLP policies on one gymnax task, with no engine around it: no ask / tell, no
sharding, no padding. The benchmarks divide the engine's generation time by a
ceiling measured in the same run.

* CartPole-v1: 4-32-2 tanh MLP, 500 steps; ``env.step`` (auto-reset every step)
  or ``env.step_env`` with a done-mask (one reset per episode).
* Pendulum-v1: 3-16-16-1 ReLU MLP, tanh output scaled to the torque bound 2,
  200 steps of ``env.step_env`` (Pendulum never ends early).

    python benchmarks/ceilings.py [--pop 256 1024 ...] [--reps 30]
"""

import argparse
import time

import gymnax
import jax
import jax.numpy as jnp

CARTPOLE_STEPS = 500
PENDULUM_STEPS = 200


def _dense(key, sizes, scale):
    keys = jax.random.split(key, len(sizes))
    pairs = zip(keys, sizes, strict=True)
    return [(scale * jax.random.normal(k, s), jnp.zeros(s[1])) for k, s in pairs]


def _time(run, *args, reps: int, key_arg: int):
    """Median and best seconds of ``run(*args)`` over ``reps`` calls, after compiling.

    Argument ``key_arg`` is a PRNG key, replaced at every call.
    """
    jax.block_until_ready(run(*args))
    times = []
    for i in range(reps):
        args = list(args)
        args[key_arg] = jax.random.key(i + 1)
        t0 = time.perf_counter()
        jax.block_until_ready(run(*args))
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], times[0]


def best_time(fn, *args, reps: int):
    """``(seconds, output)``: the fastest of ``reps`` calls of ``fn(*args)`` after a warm-up
    call that compiles it, and the warm-up call's output."""
    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


def from_flax(params):
    """``[(kernel, bias), ...]`` of a flax MLP's parameters (any leading axes)."""
    layers = params["params"]
    dense = [layers[f"Dense_{i}"] for i in range(len(layers))]
    return [(d["kernel"], d["bias"]) for d in dense]


def cartpole_rollout(pop: int, autoreset: bool = False, params=None):
    """``(run, params, key)``: ``run(params, key)`` returns ``pop`` CartPole returns.

    ``params`` (``[(w1, b1), (w2, b2)]`` with a leading population axis)
    defaults to random policies.
    """
    env, env_params = gymnax.make("CartPole-v1")
    if params is None:
        params = jax.vmap(lambda k: _dense(k, [(4, 32), (32, 2)], 0.5))(
            jax.random.split(jax.random.key(0), pop)
        )

    def episode(p, key):
        key, k_reset = jax.random.split(key)
        obs, state = env.reset(k_reset, env_params)

        def body(carry, _):
            obs, state, key, ret, alive = carry
            key, k_step = jax.random.split(key)
            action = jnp.argmax(jnp.tanh(obs @ p[0][0] + p[0][1]) @ p[1][0] + p[1][1])
            if autoreset:
                obs, state, r, term, trunc, _ = env.step(k_step, state, action, env_params)
                done = term | trunc
            else:
                obs, state, r, done, _ = env.step_env(k_step, state, action, env_params)
            ret = ret + alive * r
            return (obs, state, key, ret, alive * (1.0 - done.astype(jnp.float32))), None

        init = (obs, state, key, 0.0, 1.0)
        carry, _ = jax.lax.scan(body, init, None, length=CARTPOLE_STEPS)
        return carry[3]

    run = jax.jit(lambda ps, key: jax.vmap(episode)(ps, jax.random.split(key, pop)))
    return run, params, jax.random.key(0)


def cartpole_steps_per_second(pop: int = 256, autoreset: bool = False, reps: int = 5) -> float:
    """Best-of-``reps`` scanned CartPole steps per second (``pop * 500`` per call)."""
    run, params, key = cartpole_rollout(pop, autoreset)
    _, best = _time(run, params, key, reps=reps, key_arg=1)
    return pop * CARTPOLE_STEPS / best


def pendulum_policy(p, obs):
    h = jax.nn.relu(obs @ p[0][0] + p[0][1])
    h = jax.nn.relu(h @ p[1][0] + p[1][1])
    return 2.0 * jnp.tanh(h @ p[2][0] + p[2][1])


def pendulum_rollout(pop: int, params=None):
    """``(run, params, key)``: ``run(params, key)`` returns ``pop`` Pendulum returns.

    ``params`` (three ``(w, b)`` layers with a leading population axis)
    defaults to random policies.
    """
    env, env_params = gymnax.make("Pendulum-v1")
    if params is None:
        params = jax.vmap(lambda k: _dense(k, [(3, 16), (16, 16), (16, 1)], 0.3))(
            jax.random.split(jax.random.key(0), pop)
        )

    def episode(p, key):
        k_reset, k_steps = jax.random.split(key)
        obs, state = env.reset(k_reset, env_params)

        def body(carry, k):
            obs, state, ret = carry
            obs, state, r, _, _ = env.step_env(k, state, pendulum_policy(p, obs), env_params)
            return (obs, state, ret + r), None

        keys = jax.random.split(k_steps, PENDULUM_STEPS)
        (_, _, ret), _ = jax.lax.scan(body, (obs, state, 0.0), keys)
        return ret

    run = jax.jit(lambda ps, key: jax.vmap(episode)(ps, jax.random.split(key, pop)))
    return run, params, jax.random.key(0)


def pendulum_seconds(pop: int = 1024, reps: int = 30) -> float:
    """Median seconds of one Pendulum evaluation of ``pop`` policies."""
    run, params, key = pendulum_rollout(pop)
    return _time(run, params, key, reps=reps, key_arg=1)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pop", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}", flush=True)
    for pop in args.pop:
        for autoreset in (True, False):
            name = "env.step (auto-reset)" if autoreset else "env.step_env + mask"
            rate = cartpole_steps_per_second(pop, autoreset, args.reps)
            print(f"CartPole-v1  pop {pop:6d}  {name:22s}  {rate:,.0f} steps/s", flush=True)
        s = pendulum_seconds(pop, args.reps)
        print(
            f"Pendulum-v1  pop {pop:6d}  {PENDULUM_STEPS} steps: {1e3 * s:.2f} ms "
            f"({pop * PENDULUM_STEPS / s / 1e6:.1f} M steps/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
