"""brax and MinAtar throughput of whole engine generations, measured side by side.

    python benchmarks/bench_brax.py [--pop 64] [--backend spring] [--steps 100]
        [--only hopper,halfcheetah,breakout,early,floor] [--reps 3] [--gens 2] [--devices 1]
        [--lanes N] [--cores 1]

Prints one table:

* ``hopper``, ``halfcheetah`` (brax, MLP 32) and ``breakout`` (Breakout-MinAtar,
  the default CNN): environment steps per second of whole OpenES generations
  of the engine (ask, sharded rollouts, tell) against a hand-written
  ``jit(vmap(scan(step)))`` rollout of the same population with the
  simulator's own step (brax's ``env.step``, gymnax's ``step_env``: no
  wrapper, no mask, no ES). Both count ``pop x steps`` scanned steps per
  generation; ``ratio`` is engine / hand-written (goal >= 0.9).
* ``early``: hopper with 1,000-step episodes and an untrained population,
  which falls after a few dozen steps: the engine's generation time against
  the time the population's actual steps (the engine's own ``env_steps``)
  take at the hand-written stepping rate of the ``hopper`` row (goal <= 1.2:
  a device's rollout costs the steps its episodes take). The engine runs a
  device's episodes from a work queue on ``--lanes`` lanes (default: 16 on a
  CPU, the whole slice on an accelerator; see
  :func:`evorl_pop.tasks.rollout.rollout_queue`); the hand-written rollout steps all
  candidates at once, at full width.
* ``floor`` (only when asked for): the least any lane schedule that steps
  the running episodes together costs on this machine: the hand-written
  hopper step timed at each power-of-two width up to ``--pop``, summed over
  the steps of the engine's first generation's episodes at the width of those
  still running, against their steps at the full-width cost of the same timing.

Every timing is the best of ``--reps`` calls of ``--gens`` generations (or
rollouts) after a warm-up call. On a GPU: ``--pop 4096 --cores 0``.

The benchmark runs on ``--cores`` cores (default 1; 0: every core it may
use), chosen before JAX starts: a run on a CPU has one device per core, so one
device's work gets one core. Given more, XLA spreads the wide hand-written
step's operations over them while the engine's narrower lanes gain little,
and the ratios would compare several cores with one.
"""

import argparse
import os


def parse_args(argv=None) -> argparse.Namespace:
    """The options; parsed before JAX starts, as ``--cores`` must be."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="hopper,halfcheetah,breakout,early")
    parser.add_argument("--pop", type=int, default=64, help="population size")
    parser.add_argument("--backend", default="spring", help="brax physics backend")
    parser.add_argument("--steps", type=int, default=100, help="episode length of the rate rows")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gens", type=int, default=2, help="generations per timed call")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument(
        "--lanes", type=int, default=None, help="episodes stepped at once per device"
    )
    parser.add_argument("--cores", type=int, default=1, help="cores to run on (0: all; see above)")
    return parser.parse_args(argv)


ARGS = parse_args()
if ARGS.cores > 0:  # the first --cores of the cores this process may use
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: ARGS.cores])
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ceilings import best_time  # noqa: E402  (benchmarks/ceilings.py, next to this file)

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import ES, ESConfig  # noqa: E402
from evorl_pop.run.shell import chunk_fn  # noqa: E402
from evorl_pop.tasks.brax_envs import BraxEnv  # noqa: E402

TASKS = {"hopper": "brax/hopper", "halfcheetah": "brax/halfcheetah", "breakout": "Breakout-MinAtar"}


def make_es(task, args, episode_length):
    config = ESConfig(
        task=task,
        population_size=args.pop,
        hidden_sizes=(32,),
        episode_length=episode_length,
        backend=args.backend,
        eval_episodes=0,
        rollout_lanes=args.lanes,
    )
    return ES(config, mesh=make_mesh(args.devices))


def engine_time(es, args):
    """Seconds per generation and env steps per generation of the engine."""
    state = es.init(jax.random.key(0))
    # the whole state and metrics are outputs: nothing of the rollout is dead code
    run = chunk_fn(es, args.gens)
    seconds, (_, metrics) = best_time(run, state, jax.random.key(1), reps=args.reps)
    steps = np.sum(np.asarray(metrics["env_steps"], np.float64))
    return seconds / args.gens, float(steps) / args.gens


def raw_steps(env):
    """``reset(key) -> (obs, state)`` and ``step(key, state, action) -> (obs, state,
    reward)`` of the simulator itself, without the Env wrapper."""
    if isinstance(env, BraxEnv):
        raw = env.env

        def reset(key):
            state = raw.reset(key)
            return state.obs, state

        def step(key, state, action):
            state = raw.step(state, action)
            return state.obs, state, state.reward

        return reset, step
    gym, params = env.env, env.params

    def step(key, state, action):
        obs, state, reward, *_ = gym.step_env(key, state, action, params)
        return obs, state, reward

    return (lambda key: gym.reset_env(key, params)), step


def handwritten_time(es, args, num_steps, width=None):
    """Seconds per rollout of ``width`` (default: the population's) policies, hand-written."""
    task, width = es.task, width or args.pop
    reset, step = raw_steps(task.env)
    population = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(2), width))

    def episode(flat, key):
        params = task.unravel(flat)
        obs, state = reset(key)

        def body(carry, k):
            obs, state, ret = carry
            obs, state, reward = step(k, state, task.policy(params, obs))
            return (obs, state, ret + reward), ()

        init = (obs, state, jnp.float32(0.0))
        (_, _, ret), _ = jax.lax.scan(body, init, jax.random.split(key, num_steps))
        return ret  # the return, as a fitness needs

    def generations(pop, key):
        def one(_, k):
            return jax.vmap(episode)(pop, jax.random.split(k, width)).sum()

        return jax.lax.scan(lambda c, k: (c + one(c, k), ()), 0.0, jax.random.split(key, args.gens))

    run = jax.jit(generations)
    seconds, _ = best_time(run, population, jax.random.key(3), reps=args.reps)
    return seconds / args.gens


def episode_lengths(es, num_steps):
    """Steps the episode of each candidate of the engine's first generation lasts
    (at most ``num_steps``; other episode keys than the engine's)."""
    task, state = es.task, es.init(jax.random.key(0))
    population = es.strategy.ask(jax.random.key(2), state.strategy_state, es.params)[0]

    def length(flat, key):
        params = task.unravel(flat)
        obs, state = task.env.reset(key)

        def body(carry, k):
            obs, state, alive, n = carry
            obs, state, _, done = task.env.step(k, state, task.policy(params, obs))
            return (obs, state, alive & ~done, n + alive), ()

        init = (obs, state, jnp.bool_(True), jnp.int32(0))
        return jax.lax.scan(body, init, jax.random.split(key, num_steps))[0][3]

    keys = jax.random.split(jax.random.key(4), len(population))
    return np.asarray(jax.jit(jax.vmap(length))(population, keys))


def schedule_floor(es, args, lengths):
    """Seconds the steps of episodes of ``lengths`` take at least when the episodes
    still running are stepped together, at the hand-written cost per step of
    their number (measured at powers of two, interpolated between)."""
    widths = [1 << i for i in range(int(np.log2(args.pop)) + 1)]
    cost = [handwritten_time(es, args, args.steps, w) / args.steps for w in widths]
    running = [(lengths > t).sum() for t in range(int(lengths.max()))]
    return float(np.sum(np.interp(running, widths, cost))), dict(zip(widths, cost, strict=True))


def main(args):
    only = args.only.split(",")
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, {args.devices} device(s), "
        f"population {args.pop}, brax backend {args.backend}, best of {args.reps}, "
        f"lanes {args.lanes or 'default'}, cores {sorted(os.sched_getaffinity(0))}"
    )
    print(f"{'row':12s} {'engine steps/s':>15s} {'hand-written':>13s} {'ratio':>7s}  (goal)")
    raw_rate = {}
    for row in ("hopper", "halfcheetah", "breakout"):
        if row not in only and not (row == "hopper" and {"early", "floor"} & set(only)):
            continue
        es = make_es(TASKS[row], args, args.steps)
        scanned = args.pop * args.steps
        hand = handwritten_time(es, args, args.steps)
        raw_rate[row] = scanned / hand
        if row in only:
            engine, _ = engine_time(es, args)
            rate = scanned / engine
            print(
                f"{row:12s} {rate:15,.0f} {raw_rate[row]:13,.0f} "
                f"{rate / raw_rate[row]:7.2f}  (>= 0.9)"
            )
    if "early" in only:
        es = make_es(TASKS["hopper"], args, 1000)
        seconds, steps = engine_time(es, args)
        expected = steps / raw_rate["hopper"]
        print(
            f"early exit: hopper, 1000-step episodes: {steps / args.pop:.0f} steps per "
            f"episode on average; generation {seconds * 1e3:.1f} ms against "
            f"{expected * 1e3:.1f} ms for its actual steps at the hand-written rate: "
            f"{seconds / expected:.2f}x  (goal <= 1.2)"
        )
    if "floor" in only:
        es = make_es(TASKS["hopper"], args, 1000)
        lengths = episode_lengths(es, 1000)
        floor, cost = schedule_floor(es, args, lengths)
        actual = lengths.sum() * cost[args.pop] / args.pop  # all at full width
        per_step = ", ".join(f"{w}: {c * 1e6:.0f}" for w, c in cost.items())
        print(
            f"floor: hand-written hopper step, us per step at each width: {per_step}\n"
            f"  the engine's first {args.pop} candidates, 1000-step episodes: "
            f"{lengths.mean():.0f} steps on "
            f"average, the longest {lengths.max()}; stepping the running episodes together "
            f"costs at least {floor * 1e3:.1f} ms against {actual * 1e3:.1f} ms for their "
            f"steps at the full-width rate: {floor / actual:.2f}x"
        )


if __name__ == "__main__":
    main(ARGS)
