"""Environments outside brax, measured side by side: Gymnasium on the host, Playground's MJX.

    python benchmarks/bench_host_envs.py [--gym gym:CartPole-v1,gym:HalfCheetah-v5]
        [--pop 64] [--episode-length 200] [--devices 1,2] [--vector sync]
        [--playground playground/CheetahRun] [--pg-pop 64] [--pg-steps 100] [--reps 3]
        [--processes 2] [--run-gens 20] [--run-chunk 5]
        [--dmc CartpoleBalance,CheetahRun,WalkerWalk,HumanoidWalk] [--dmc-steps 100]

Prints one table of environment steps per second:

* each ``--gym`` task: the engine's sharded evaluation of a population
  (``Engine.evaluate``: every device steps its slice in its own Gymnasium
  vector env through host callbacks, the policy in JAX), on each ``--devices``
  count, against a hand-written loop that steps the same population's same
  episodes (the same reset seeds) in the same vector env and evaluates the
  policies with one jitted call per step. Both count the steps taken before
  each episode ended (the loop checks that its count equals the engine's).
  ``ratio`` is engine / hand-written (goal: >= 0.8 on one device).
* each ``--gym`` task again, as whole ``evorl-pop train`` runs: one process of
  one device against ``--processes`` launched processes of one device each
  (``evorl-pop launch``), the best chunk after the first from ``metrics.csv``
  (goal: more steps per second with every core).
* ``--playground``: whole OpenES generations of the engine on the Playground
  task (MJX physics) against brax-style full-width stepping of its MJX
  environment: a hand-written ``jit(vmap(scan(env.step)))`` of the same
  population, Playground's own ``reset`` / ``step``, no wrapper or mask
  (as ``benchmarks/bench_brax.py`` measures brax). Both count
  ``pop x steps`` steps per generation (the suite's episodes never end early).
* each ``--dmc`` task as whole ``evorl-pop train`` runs of ``--pop`` candidates: in
  Playground's MJX against MuJoCo's C simulator (``gym:dm_control/...``, the
  ``dmc`` extra), the best generation after the first. With
  ``--gym gym:dm_control/cheetah-run-v0,...`` the C path is also measured against
  a hand-written loop over the same vector environment. Beside them, EnvPool
  (``envpool:<Task>-v1``, unless ``--no-envpool``): the whole run, and its pool
  stepped alone with random actions in one compiled loop (goal: run / alone >= 0.7).

Every timing is the best of ``--reps`` calls after a warm-up call. The
benchmark sets one CPU device per core it may use (at least the largest
``--devices``) before JAX starts.
"""

import argparse
import os


def parse_args(argv=None) -> argparse.Namespace:
    """The options; parsed before JAX starts, as the device count must be."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gym", default="gym:CartPole-v1,gym:HalfCheetah-v5")
    parser.add_argument("--pop", type=int, default=64, help="population of the gym rows")
    parser.add_argument("--episodes", type=int, default=1, help="episodes per candidate")
    parser.add_argument("--episode-length", type=int, default=200)
    parser.add_argument("--devices", default="1,2", help="device counts of the gym rows")
    parser.add_argument("--vector", default="sync", help="sync or async")
    parser.add_argument("--playground", default="playground/CheetahRun", help="'' to skip")
    parser.add_argument("--pg-pop", type=int, default=64)
    parser.add_argument("--pg-steps", type=int, default=100)
    parser.add_argument("--gens", type=int, default=2, help="playground generations per call")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--processes", type=int, default=2, help="whole runs, 1 process against this many (0: skip)"
    )
    parser.add_argument(
        "--dmc",
        default="CartpoleBalance,CheetahRun,WalkerWalk,HumanoidWalk",
        help="DM Control tasks, each trained in MJX and in MuJoCo's C simulator ('' to skip)",
    )
    parser.add_argument("--dmc-steps", type=int, default=100, help="their episode length")
    parser.add_argument("--dmc-gens", type=int, default=3, help="generations of those runs")
    parser.add_argument(
        "--no-envpool", dest="envpool", action="store_false", help="--dmc without EnvPool's rows"
    )
    parser.add_argument("--run-gens", type=int, default=20, help="generations of those runs")
    parser.add_argument("--run-chunk", type=int, default=5, help="generations per chunk")
    return parser.parse_args(argv)


ARGS = parse_args()
DEVICES = [int(d) for d in ARGS.devices.split(",")]
os.environ.setdefault(
    "XLA_FLAGS", f"--xla_force_host_platform_device_count={max(*DEVICES, os.cpu_count())}"
)

import functools  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import ES, ESConfig  # noqa: E402
from evorl_pop.run import store  # noqa: E402
from evorl_pop.run.shell import chunk_fn  # noqa: E402
from evorl_pop.tasks.gym_envs import episode_seeds  # noqa: E402


def make_es(task, pop, devices, **fields):
    config = ESConfig(task=task, population_size=pop, hidden_sizes=(32,), eval_episodes=0, **fields)
    return ES(config, mesh=make_mesh(devices))


def _evaluated_steps(engine, population, key):
    """The env steps of the engine's sharded evaluation of ``population``."""
    return engine.evaluate(population, key, engine.task.init_state())[0].info.steps


def interleaved_best(fns, reps):
    """The fastest of ``reps`` calls of each function, the calls taking turns (so load
    from elsewhere on a shared machine falls on all of them alike), after a warm-up call.

    Returns:
      ``(seconds, output of the warm-up call)`` per function.
    """
    outs = [jax.block_until_ready(fn()) for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[i] = min(best[i], time.perf_counter() - t0)
    return list(zip(best, outs, strict=True))


def handwritten_steps(task, vec, params, seeds, discrete):
    """Steps one vector env's episodes to their ends, one jitted policy call per step.

    Returns:
      The steps taken before each episode ended, summed.
    """
    act = _policy_fn(task)
    obs, _ = vec.reset(seed=seeds)
    ended = np.zeros(len(seeds), bool)
    steps = t = 0
    while not ended.all():
        actions = np.asarray(act(params, obs))
        obs, _, terminated, truncated, _ = vec.step(
            actions.astype(np.int64) if discrete else actions
        )
        steps, t = steps + int((~ended).sum()), t + 1
        ended |= terminated | truncated | (t >= task.spec.max_steps)
    return steps


_POLICIES = {}


def _policy_fn(task):
    """``jit(vmap(policy))`` of a task's parameters (one row per episode) and observations."""
    if id(task) not in _POLICIES:
        _POLICIES[id(task)] = jax.jit(
            jax.vmap(lambda p, o: task.policy(task.unravel(p), jnp.asarray(o, jnp.float32)))
        )
    return _POLICIES[id(task)]


def population_seeds(key, pop, episodes):
    """Every episode's reset seed, candidate by candidate: candidate ``i`` is evaluated with
    ``fold_in(key, i)``, as ``Engine.evaluate`` draws it."""
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(pop))
    seeds = jax.vmap(lambda k: episode_seeds(k, episodes))(keys)
    return [int(s) for s in np.asarray(seeds).ravel()]


def gym_rows(args):
    for name in args.gym.split(","):
        common = dict(
            episode_length=args.episode_length, episodes=args.episodes, vector=args.vector
        )
        engines = [make_es(name, args.pop, devices, **common) for devices in DEVICES]
        task, es = engines[0].task, engines[0]
        state = es.init(jax.random.key(0))
        population = np.asarray(
            es.strategy.ask(jax.random.key(1), state.strategy_state, es.params)[0]
        )
        key = jax.random.key(2)
        seeds = population_seeds(key, args.pop, args.episodes)
        params = jnp.repeat(population, args.episodes, axis=0)
        vec = task.pool.make_vector_env(len(seeds))
        fns = [functools.partial(handwritten_steps, task, vec, params, seeds, task.spec.discrete)]
        for engine in engines:
            evaluate = jax.jit(functools.partial(_evaluated_steps, engine))
            fns.append(functools.partial(evaluate, population, key))
        (hand_time, hand_steps), *timed = interleaved_best(fns, args.reps)
        hand = hand_steps / hand_time
        print(f"{name:28s} {'hand-written':>14s} {hand:12,.0f}   (1 process, {args.vector})")
        for devices, (seconds, steps) in zip(DEVICES, timed, strict=True):
            assert int(steps) == hand_steps, (int(steps), hand_steps)  # the same episodes
            rate = hand_steps / seconds
            goal = ">= 0.8" if devices == 1 else "> the 1-device ratio"
            print(
                f"{'':28s} {f'engine, {devices} dev':>14s} {rate:12,.0f}   ratio "
                f"{rate / hand:5.2f}  (goal {goal})"
            )
        vec.close()
        for engine in engines:
            engine.task.pool.close()


def run_rate(args, name, processes, out, gens=None, chunk=None, steps=None):
    """Environment steps per second of a whole ``evorl-pop train`` of ``name`` (no evaluation
    of the mean) in ``processes`` processes of one CPU device each (``evorl-pop launch``
    beyond one): the best chunk after the first (which compiles), from ``metrics.csv``'s
    steps and times. ``gens``, ``chunk``, ``steps``: other than ``--run-gens``,
    ``--run-chunk``, ``--episode-length``."""
    gens, chunk = gens or args.run_gens, chunk or args.run_chunk
    train = (
        f"train --task {name} --pop {args.pop} --generations {gens} --chunk {chunk} "
        f"--set episode_length={steps or args.episode_length} --set episodes={args.episodes} "
        "--set eval_episodes=0 --no-figure -q"
    ).split()
    if name.startswith("gym:"):
        train += ["--set", f"vector={args.vector}"]
    train += ["--out", str(out)]  # a path may hold spaces
    if processes == 1:
        command = [*train, "--devices", "1"]
    else:
        command = ["launch", "-n", str(processes), "--devices-per-process", "1", "--", *train]
    env = dict(os.environ, XLA_FLAGS="")  # each process sets its own device count
    done = subprocess.run(
        [sys.executable, "-m", "evorl_pop.cli", *command], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    rows, n = store.read_metrics(out), chunk
    steps = rows["env_steps_gen"].reshape(-1, n).sum(1)[1:]
    wall = np.diff(rows["wall_time"][n - 1 :: n])
    return float(np.max(steps / wall))


def run_rows(args):
    """Whole runs: one process of one device against ``--processes`` of one device each."""
    for name in args.gym.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            one = run_rate(args, name, 1, os.path.join(tmp, "one"))
            many = run_rate(args, name, args.processes, os.path.join(tmp, "many"))
        print(f"{name:28s} {'train, 1 proc':>14s} {one:12,.0f}   (whole runs: best chunk)")
        label = f"train, {args.processes} proc"
        print(f"{'':28s} {label:>14s} {many:12,.0f}   x{many / one:5.2f}  (goal > 1)")


def dmc_rows(args):
    """DM Control tasks in whole runs: Playground's MJX (``playground/<Task>``) against
    MuJoCo's C simulator through shimmy (``gym:dm_control/<domain>-<task>-v0``) and
    EnvPool (``envpool:<Task>-v1``), the same population, episodes and generations, one
    process of one device; and EnvPool stepping alone (random actions, no policy)."""
    from evorl_pop.tasks.playground_envs import c_simulator_id

    for task in args.dmc.split(","):
        names = [f"playground/{task}", f"gym:{c_simulator_id(task)}"]
        if args.envpool:
            names.append(f"envpool:{task}-v1")
        rates = []
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "run")
                rates.append(run_rate(args, name, 1, out, args.dmc_gens, 1, args.dmc_steps))
        mjx, c = rates[:2]
        print(f"{names[0]:28s} {'train, MJX':>14s} {mjx:12,.0f}")
        print(f"{names[1]:28s} {'train, C':>14s} {c:12,.0f}   x{c / mjx:6.1f} MJX")
        if args.envpool:
            pool = rates[2]
            alone = envpool_stepping(f"{task}-v1", args.pop * args.episodes, args.dmc_steps)
            print(f"{names[2]:28s} {'train, EnvPool':>14s} {pool:12,.0f}   x{pool / mjx:6.1f} MJX")
            print(
                f"{'':28s} {'stepping alone':>14s} {alone:12,.0f}   "
                f"train / alone {pool / alone:4.2f} (goal >= 0.7)"
            )


def envpool_stepping(env_id, width, steps):
    """Steps per second of a pool of ``width`` environments stepped alone by its XLA
    calls in one compiled loop of ``steps`` steps with random actions (best of ``--reps``)."""
    from evorl_pop.tasks.envpool_pool import Pool, pool_spec

    dims = pool_spec(env_id, env_id, steps)[0].action_dim
    pool = Pool(env_id, width, steps)

    @jax.jit
    def loop(handle, key):
        handle = pool.recv(handle)[0]

        def body(t, handle):
            action = jax.random.uniform(jax.random.fold_in(key, t), (width, dims), minval=-1.0)
            return pool.recv(pool.send(handle, action, False))[0]

        return body(0, jax.lax.fori_loop(0, steps - 1, body, handle))

    times = []
    handle = jnp.asarray(pool.handle)
    for rep in range(ARGS.reps + 1):
        start = time.perf_counter()
        handle = loop(handle, jax.random.key(rep))
        handle.block_until_ready()
        pool.pool.async_reset()  # the pool's recv takes fresh starts again
        times.append(time.perf_counter() - start)
    pool.close()
    return width * steps / min(times[1:])


def playground_row(args):
    es = make_es(args.playground, args.pg_pop, 1, episode_length=args.pg_steps)
    env = es.task.env.env  # Playground's own environment
    state = es.init(jax.random.key(0))
    run = chunk_fn(es, args.gens)
    engine = jax.jit(lambda s, k: run(s, k)[1]["env_steps"].sum())
    population = jax.vmap(es.task.init_solution)(jax.random.split(jax.random.key(2), args.pg_pop))

    def episode(flat, key):  # full width, no mask, no early exit: brax-style stepping
        params = es.task.unravel(flat)

        def body(s, _):
            s = env.step(s, es.task.policy(params, s.obs))
            return s, s.reward

        return jax.lax.scan(body, env.reset(key), None, length=args.pg_steps)[1].sum()

    def generations(pop, key):
        keys = jax.random.split(key, (args.gens, args.pg_pop))
        return jax.lax.map(lambda k: jax.vmap(episode)(pop, k).sum(), keys)

    hand = jax.jit(generations)
    (seconds, steps), (hand_seconds, _) = interleaved_best(
        [
            functools.partial(engine, state, jax.random.key(1)),
            functools.partial(hand, population, jax.random.key(3)),
        ],
        args.reps,
    )
    rate = float(steps) / seconds
    hand_rate = args.gens * args.pg_pop * args.pg_steps / hand_seconds
    print(
        f"{args.playground:28s} {'hand-written':>14s} {hand_rate:12,.0f}   (jit(vmap(scan(step))))"
    )
    print(f"{'':28s} {'engine, 1 dev':>14s} {rate:12,.0f}   ratio {rate / hand_rate:5.2f}")


def main(args):
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, {os.cpu_count()} cores, best of "
        f"{args.reps}; gym: population {args.pop} x {args.episodes} episode(s), episodes of at "
        f"most {args.episode_length} steps; playground: population {args.pg_pop}, "
        f"{args.pg_steps}-step episodes"
    )
    print(f"{'task':28s} {'':>14s} {'env steps/s':>12s}")
    start = time.perf_counter()
    if args.gym:
        gym_rows(args)
    if args.gym and args.processes:
        run_rows(args)
    if args.playground:
        playground_row(args)
    if args.dmc:
        dmc_rows(args)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main(ARGS)
