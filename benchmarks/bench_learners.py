"""evorl_pop's PPO and SAC against brax's own trainers, side by side on one brax task.

    python benchmarks/bench_learners.py [--only ppo,sac] [--task hopper] [--seeds 3]
        [--first-seed 0] [--ppo-iterations 60] [--num-envs 256] [--unroll-length 20]
        [--num-minibatches 8] [--num-epochs 4] [--ppo-advantages iteration]
        [--ppo-obs-norm-update before] [--ppo-policy-init-scale 0.01]
        [--sac-steps 16000] [--sac-envs 16] [--sac-updates 8] [--eval-episodes 16]
        [--chunks 4] [--cores 1] [--devices 1] [--curves] [--restarts fresh]
        [--curve-impls evorl_pop,brax]

For each learner and seed, ``evorl_pop.algorithms.ppo.PPO`` (or ``sac.SAC``)
and ``brax.training.agents.ppo.train`` (or ``sac.train``) train on the same
brax environment (``--backend``, 1000-step episodes) with the same networks,
hyperparameters and budget:

* PPO: ``num_envs`` environments, ``unroll_length`` steps each per iteration
  (brax: ``batch_size * num_minibatches = num_envs``, so it too collects one
  unroll per iteration), ``num_minibatches`` minibatches, ``num_epochs``
  epochs, ``--ppo-iterations`` iterations;
* SAC: ``--sac-envs`` environments stepped once per step, then
  ``--sac-updates`` gradient updates of 256 samples (brax's
  ``grad_updates_per_step``), the first ``learning_starts`` steps without
  updates, ``--sac-steps`` environment steps in all.

Both run their budget in ``--chunks`` equal compiled pieces (brax: ``num_evals
= chunks + 1`` epochs, timed by brax itself, and by this process's CPU clock
in its progress callback); the speed of a run is its best chunk from the
second on (the first compiles), in environment steps per CPU second (which
other jobs on a shared machine do not distort) and per second of wall time;
the table shows medians over seeds.
**return** is the deterministic policy's mean return over ``--eval-episodes``
episodes of the same evaluator (:func:`evorl_pop.tasks.rollout.evaluate_episodes` on
``brax/<task>``) for both; the table shows the mean and std over seeds.
Goals: evorl_pop's return at least brax's, at least 0.9 of its steps/s on
one device, and more on all cores. The run is pinned to ``--cores`` cores
(default 1: one device's share of this 2-core machine; 0: all) and simulates
``--devices`` CPU devices (default 1); both implementations use all of them
(evorl_pop: a ``DP`` mesh of that size; brax: its ``pmap`` over the local
devices), so ``--cores 0 --devices 2`` measures each on every core of this
machine.

Every seed draws its own initial networks and training keys. PPO uses brax's
order of the observation statistics (``--ppo-obs-norm-update before``) with
brax's other settings, and its own initial policy (``--ppo-policy-init-scale
0.01``; brax's initialisation is 1.0). Measured on the 2-core CPU, one core
(``--only ppo --seeds 16``; return: mean +- std over seeds, the difference +-
its standard error)::

    learner  impl        steps/CPU s    steps/s             return
    ppo      evorl_pop        97,874     97,743      340.4 +-  27.9
    ppo      brax            103,123    103,287      300.9 +-  44.0
    ppo      ours/brax          0.95       0.95      +39.4 +-  13.5 (diff)

Over 48 seeds (16-47 from runs of 16 seeds side by side, one per core) the
return difference is +37.9 +- 6.8 paired by seed (evorl_pop 342.5 +- 22.9,
brax 304.7 +- 44.5). With ``--ppo-policy-init-scale 1.0`` the two tie: -4.8 +-
6.7 over 80 seeds.

On both cores with two devices (``--only ppo --seeds 3 --cores 0 --devices 2``),
evorl_pop ran 142,738 steps/s against brax's 84,452 (1.69); with one device,
97,461 against 99,552 (0.98). SAC ran at 0.94 of brax's steps per CPU second
on one core (``--only sac --seeds 2``: 662 against 700), and at 963 against 792
steps/s on both cores with two devices. Its return, from ``--curves --chunks 8``
over 48 seeds (each implementation's deterministic policy at brax's evaluation
steps; the mean of the last four): evorl_pop 254.6 +- 39.0, brax 246.0 +- 43.5
(+8.7 +- 8.5). docs/guides/learners.md has the tables.
"""

import argparse
import functools
import gc
import os
import time
from unittest import mock


def parse_args(argv=None) -> argparse.Namespace:
    """The options; parsed before JAX starts, as ``--cores`` must be."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="ppo,sac", help="ppo, sac or both")
    p.add_argument("--task", default="hopper", help="a brax environment")
    p.add_argument("--backend", default="spring", help="brax physics backend")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds from this one on")
    p.add_argument("--chunks", type=int, default=4, help="compiled pieces of each run")
    p.add_argument("--eval-episodes", type=int, default=16)
    p.add_argument("--ppo-iterations", type=int, default=60)
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--unroll-length", type=int, default=20)
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--num-epochs", type=int, default=4)
    p.add_argument("--ppo-advantages", default="iteration", help="iteration or minibatch")
    p.add_argument("--ppo-obs-norm-update", default="before", help="before (brax's) or after")
    p.add_argument(
        "--ppo-policy-init-scale",
        type=float,
        default=0.01,
        help="the policy's initial output weights (evorl_pop's default 0.01; brax's: 1.0)",
    )
    p.add_argument("--sac-steps", type=int, default=16_000)
    p.add_argument("--sac-envs", type=int, default=16)
    p.add_argument("--sac-updates", type=int, default=8, help="updates per step of the envs")
    p.add_argument("--cores", type=int, default=1, help="cores to run on (0: all)")
    p.add_argument("--devices", type=int, default=1, help="CPU devices both implementations use")
    p.add_argument("--curves", action="store_true", help="SAC's return at brax's evaluations")
    p.add_argument(
        "--restarts",
        default="fresh",
        choices=("fresh", "first"),
        help="where evorl_pop's ended episodes restart: a fresh start drawn every "
        "unroll (evorl_pop's), or the lane's own first start (brax's)",
    )
    p.add_argument(
        "--curve-impls",
        default="evorl_pop,brax",
        help="with --curves: the implementations to train",
    )
    args = p.parse_args(argv)
    impls = args.curve_impls.split(",")
    if not set(impls) <= {"evorl_pop", "brax"}:
        p.error(f"--curve-impls: {args.curve_impls!r} is not evorl_pop, brax or both")
    return args


ARGS = parse_args()
if ARGS.cores > 0:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: ARGS.cores])
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms import ppo, sac  # noqa: E402
from evorl_pop.rl import vec_env  # noqa: E402
from evorl_pop.run import processes  # noqa: E402
from evorl_pop.tasks.brax_envs import BraxEnv  # noqa: E402
from evorl_pop.tasks.envs import make_env  # noqa: E402
from evorl_pop.tasks.rollout import evaluate_episodes  # noqa: E402

# brax 0.14.2's trainers call jax.device_put_replicated, which JAX 0.10 removed from its
# namespace; JAX's own implementation is still there.
if "device_put_replicated" not in vars(jax):
    from jax._src.api import device_put_replicated

    jax.device_put_replicated = device_put_replicated

EPISODE_LENGTH = 1000
#: Settings both implementations share (brax's hopper settings, smaller networks for a CPU).
PPO_SETTINGS = dict(
    learning_rate=3e-4,
    entropy_cost=1e-2,
    discount=0.97,
    gae_lambda=0.95,
    clip_epsilon=0.3,
    reward_scaling=10.0,
    policy_hidden_sizes=(32, 32, 32, 32),
    value_hidden_sizes=(64, 64, 64),
)
SAC_SETTINGS = dict(
    lr=1e-3,
    discount=0.99,
    tau=0.005,
    reward_scaling=1.0,
    hidden_sizes=(256, 256),
    batch_size=256,
    learning_starts=2048,
)


@functools.cache  # one per policy until free_programs() after each seed
def _evaluator(policy):
    """``(params, key) -> Episode``, jitted once per policy function."""
    env = make_env(f"brax/{ARGS.task}", backend=ARGS.backend, episode_length=EPISODE_LENGTH)
    return jax.jit(lambda p, k: evaluate_episodes(env, policy, p, k, ARGS.eval_episodes))


def evaluate(policy, params, seed):
    """The deterministic policy's mean return, the same evaluator for both implementations."""
    return float(_evaluator(policy)(params, jax.random.key(10_000 + seed)).episode_return)


def seed_keys(seed):
    """A run's keys: ``(init_key, chunk_key)``, ``chunk_key(i)`` the key of chunk ``i``.
    Both come from the seed, so that two seeds differ in their training's randomness
    (actions, minibatches), not only in their initial networks."""
    init_key, run_key = jax.random.split(jax.random.key(seed))
    return init_key, lambda i: jax.random.fold_in(run_key, i)


def compiled_steps(algo):
    """``run(state, key, n=...)``: ``n`` steps of ``algo`` in one compiled scan (compiled
    once per ``n``)."""

    @functools.partial(jax.jit, static_argnames="n")
    def run(state, key, n):
        return jax.lax.scan(algo.step, state, jax.random.split(key, n))[0]

    return run


def timed_chunks(run, state, chunks, steps_per_chunk, chunk_key):
    """Runs ``chunks`` calls of ``run``; ``(state, (cpu, wall))``: the best steps per
    CPU second and per second of all but the first (which compiles)."""
    cpu, wall = [], []
    for i in range(chunks):
        start, start_cpu = time.perf_counter(), time.process_time()
        state = jax.block_until_ready(run(state, chunk_key(i)))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return state, (steps_per_chunk / min(cpu[1:]), steps_per_chunk / min(wall[1:]))


class BraxProgress:
    """brax's ``progress_fn``: the step count, brax's own wall time and this process's
    CPU time at the end of each epoch (brax calls it right after the epoch)."""

    def __init__(self):
        self.steps, self.wall, self.cpu = [], [], []

    def __call__(self, step, metrics):
        if "training/walltime" in metrics:
            self.steps.append(step)
            self.wall.append(metrics["training/walltime"])
            self.cpu.append(time.process_time())

    def rates(self):
        """The best steps per CPU second and per second of the epochs after the first."""
        steps = np.diff(self.steps)
        return max(steps / np.diff(self.cpu)), max(steps / np.diff(self.wall))


# --- PPO ---------------------------------------------------------------------------


def ours_ppo(seed):
    s = PPO_SETTINGS
    config = ppo.Config(
        task=f"brax/{ARGS.task}",
        backend=ARGS.backend,
        episode_length=EPISODE_LENGTH,
        num_envs=ARGS.num_envs,
        unroll_length=ARGS.unroll_length,
        num_minibatches=ARGS.num_minibatches,
        num_epochs=ARGS.num_epochs,
        max_grad_norm=None,
        normalize_observations=True,
        advantages=ARGS.ppo_advantages,
        obs_norm_update=ARGS.ppo_obs_norm_update,
        policy_init_scale=ARGS.ppo_policy_init_scale,
        **s,
    )
    algo = ppo.PPO(config, make_mesh(ARGS.devices))
    per_chunk = ARGS.ppo_iterations // ARGS.chunks
    run = functools.partial(compiled_steps(algo), n=per_chunk)

    init_key, chunk_key = seed_keys(seed)
    steps = per_chunk * ARGS.num_envs * ARGS.unroll_length
    state, rate = timed_chunks(run, algo.init(init_key), ARGS.chunks, steps, chunk_key)
    params = (state.params.policy, state.obs_norm)
    return rate, evaluate(algo.learner.deterministic_policy, params, seed)


def brax_ppo(seed):
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo_train

    s = PPO_SETTINGS
    env = _make_brax_env()
    network = functools.partial(
        ppo_networks.make_ppo_networks,
        policy_hidden_layer_sizes=s["policy_hidden_sizes"],
        value_hidden_layer_sizes=s["value_hidden_sizes"],
        activation=jnp.tanh,
    )
    progress = BraxProgress()
    per_iteration = ARGS.num_envs * ARGS.unroll_length
    make_policy, params, _ = ppo_train.train(
        environment=env,
        num_timesteps=ARGS.ppo_iterations * per_iteration,
        episode_length=EPISODE_LENGTH,
        num_envs=ARGS.num_envs,
        batch_size=ARGS.num_envs // ARGS.num_minibatches,
        num_minibatches=ARGS.num_minibatches,
        unroll_length=ARGS.unroll_length,
        num_updates_per_batch=ARGS.num_epochs,
        learning_rate=s["learning_rate"],
        entropy_cost=s["entropy_cost"],
        discounting=s["discount"],
        gae_lambda=s["gae_lambda"],
        clipping_epsilon=s["clip_epsilon"],
        reward_scaling=s["reward_scaling"],
        normalize_observations=True,
        network_factory=network,
        num_evals=ARGS.chunks + 1,
        run_evals=False,
        seed=seed,
        progress_fn=progress,
    )
    policy = make_policy(params, deterministic=True)
    return progress.rates(), evaluate(
        lambda p, obs: policy(obs, jax.random.key(0))[0], params, seed
    )


# --- SAC ---------------------------------------------------------------------------


def _our_sac():
    s = SAC_SETTINGS
    config = sac.Config(
        task=f"brax/{ARGS.task}",
        backend=ARGS.backend,
        episode_length=EPISODE_LENGTH,
        num_envs=ARGS.sac_envs,
        unroll_length=1,
        updates_per_step=ARGS.sac_updates / ARGS.sac_envs,
        batch_size=s["batch_size"],
        buffer_capacity=ARGS.sac_steps,
        learning_starts=s["learning_starts"],
        actor_lr=s["lr"],
        critic_lr=s["lr"],
        alpha_lr=3e-4,
        target_entropy_scale=0.5,
        discount=s["discount"],
        tau=s["tau"],
        reward_scaling=s["reward_scaling"],
        actor_hidden_sizes=s["hidden_sizes"],
        critic_hidden_sizes=s["hidden_sizes"],
    )
    return sac.SAC(config, make_mesh(ARGS.devices))


def ours_sac(seed):
    algo = _our_sac()
    per_chunk = ARGS.sac_steps // ARGS.sac_envs // ARGS.chunks
    run = functools.partial(compiled_steps(algo), n=per_chunk)
    init_key, chunk_key = seed_keys(seed)
    steps = per_chunk * ARGS.sac_envs
    state, rate = timed_chunks(run, algo.init(init_key), ARGS.chunks, steps, chunk_key)
    return rate, evaluate(algo.learner.deterministic_policy, state.learner.actor.params, seed)


def _brax_sac_train(seed, **kwargs):
    """``brax.training.agents.sac.train`` with the benchmark's settings (``kwargs``: its
    evaluation and progress options)."""
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.agents.sac import train as sac_train

    s = SAC_SETTINGS
    return sac_train.train(
        environment=_make_brax_env(),
        num_timesteps=ARGS.sac_steps,
        episode_length=EPISODE_LENGTH,
        num_envs=ARGS.sac_envs,
        learning_rate=s["lr"],
        discounting=s["discount"],
        batch_size=s["batch_size"],
        min_replay_size=s["learning_starts"],
        max_replay_size=ARGS.sac_steps,
        grad_updates_per_step=ARGS.sac_updates,
        reward_scaling=s["reward_scaling"],
        tau=s["tau"],
        num_evals=ARGS.chunks + 1,
        seed=seed,
        network_factory=functools.partial(
            sac_networks.make_sac_networks, hidden_layer_sizes=s["hidden_sizes"]
        ),
        **kwargs,
    )


def brax_policy(make_policy):
    """brax's deterministic policy as ``(params, obs) -> action``, for :func:`evaluate`."""
    return lambda params, obs: make_policy(params, deterministic=True)(obs, jax.random.key(0))[0]


def brax_sac(seed):
    progress = BraxProgress()
    make_policy, params, _ = _brax_sac_train(seed, num_eval_envs=1, progress_fn=progress)
    return progress.rates(), evaluate(brax_policy(make_policy), params, seed)


def brax_sac_epochs():
    """The environment steps (per lane) at which brax's SAC evaluates: ``(first, then)``,
    the steps to its first evaluation after its prefill and between the later ones
    (``num_evals = chunks + 1``; sac/train.py's ``num_training_steps_per_epoch``)."""
    prefill = -(-SAC_SETTINGS["learning_starts"] // ARGS.sac_envs)
    per_epoch = -(-(ARGS.sac_steps - prefill * ARGS.sac_envs) // (ARGS.chunks * ARGS.sac_envs))
    return prefill + per_epoch, per_epoch


def our_sac_curve(seed):
    """evorl_pop's SAC: its deterministic policy's return (:func:`evaluate`) at the same
    environment steps as brax's evaluations (:func:`brax_sac_epochs`);
    ``{"evorl_pop": (steps, returns)}``."""
    algo = _our_sac()
    run = compiled_steps(algo)
    init_key, chunk_key = seed_keys(seed)
    first, then = brax_sac_epochs()
    state, steps, returns = algo.init(init_key), [], []
    for i in range(ARGS.chunks):
        state = run(state, chunk_key(i), n=first if i == 0 else then)
        steps.append(ARGS.sac_envs * (first + i * then))
        returns.append(
            evaluate(algo.learner.deterministic_policy, state.learner.actor.params, seed)
        )
    return {"evorl_pop": (steps, returns)}


def brax_sac_curve(seed):
    """brax's SAC: its deterministic policy's return after each of its ``--chunks``
    epochs, from the benchmark's evaluator (:func:`evaluate`, as for evorl_pop: ``brax``)
    and from brax's own (as many episodes: ``brax-own-eval``);
    ``{label: (steps, returns)}``."""
    from brax.training import acting

    own, params = [], []
    run_evaluation = acting.Evaluator.run_evaluation

    def keep_params(evaluator, policy_params, *args, **kwargs):
        params.append(policy_params)
        return run_evaluation(evaluator, policy_params, *args, **kwargs)

    with mock.patch.object(acting.Evaluator, "run_evaluation", keep_params):
        make_policy, _, _ = _brax_sac_train(
            seed,
            num_eval_envs=ARGS.eval_episodes,
            deterministic_eval=True,
            progress_fn=lambda step, m: own.append((step, float(m["eval/episode_reward"]))),
        )
    steps = [step for step, _ in own[1:]]  # after the initial evaluation
    policy = brax_policy(make_policy)
    ours = [evaluate(policy, p, seed) for p in params[1:]]
    return {"brax": (steps, ours), "brax-own-eval": (steps, [r for _, r in own[1:]])}


def curve_summary(curves):
    """The mean curve of every label over seeds, and each label's mean over the last
    half of its points, against evorl_pop's (paired by seed: difference +- its
    standard error)."""
    labels = list(curves)
    late = ARGS.chunks - ARGS.chunks // 2
    print(
        f"\nSAC on brax/{ARGS.task} ({ARGS.backend}), seeds {ARGS.first_seed}-"
        f"{ARGS.first_seed + ARGS.seeds - 1}: mean return over seeds at each evaluation; "
        f"'late': the mean of the last {ARGS.chunks // 2} points"
    )
    for label in labels:
        r = np.asarray(curves[label])
        points = " ".join(f"{m:6.1f}" for m in r.mean(0))
        tail = r[:, late:].mean(1)
        line = f"{label:14s} {points}   late {tail.mean():6.1f} +- {tail.std():5.1f}"
        if label != "evorl_pop" and "evorl_pop" in curves:
            diff = np.asarray(curves["evorl_pop"])[:, late:].mean(1) - tail
            error = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
            line += f"   evorl_pop - {label}: {diff.mean():+6.1f} +- {error:5.1f}"
        print(line)


def _make_brax_env():
    """brax's own environment, for brax's trainers (they add their own wrappers)."""
    return BraxEnv(ARGS.task, backend=ARGS.backend, episode_length=EPISODE_LENGTH).env


RUNS = {"ppo": (ours_ppo, brax_ppo), "sac": (ours_sac, brax_sac)}


def keep_first_starts():
    """``--restarts first``: every lane of evorl_pop's environment batches starts each
    episode from the lane's own first state, as brax's ``AutoResetWrapper`` does, instead
    of from a fresh start drawn every unroll (:func:`evorl_pop.rl.vec_env.refresh`)."""
    vec_env.refresh = lambda env, batch, keys: batch


def free_programs():
    """Frees the programs of runs that have ended. Every run compiles (or loads from the
    compilation cache) its own programs, whose machine code takes memory mappings: kept,
    a PPO seed adds about 2,500 of them, and a process of many seeds reaches the kernel's
    limit (65,530), where LLVM fails with "Cannot allocate memory"."""
    _evaluator.cache_clear()
    jax.clear_caches()
    gc.collect()


def main():
    processes.use_compilation_cache()
    if ARGS.restarts == "first":
        keep_first_starts()
    if ARGS.curves:
        train = {"evorl_pop": our_sac_curve, "brax": brax_sac_curve}
        curves = {}
        for seed in range(ARGS.first_seed, ARGS.first_seed + ARGS.seeds):
            for impl in ARGS.curve_impls.split(","):
                for label, (steps, returns) in train[impl](seed).items():
                    curves.setdefault(label, []).append(returns)
                    pairs = zip(steps, returns, strict=True)
                    points = "  ".join(f"{n // 1000:>2d}k {r:6.1f}" for n, r in pairs)
                    print(f"sac seed {seed:2d} {label:13s}  {points}", flush=True)
            free_programs()
        curve_summary(curves)
        return
    rows = []
    for name in ARGS.only.split(","):
        results = {"evorl_pop": [], "brax": []}
        # interleaved, so that other jobs' load hits both alike
        for seed in range(ARGS.first_seed, ARGS.first_seed + ARGS.seeds):
            for impl, fn in zip(results, RUNS[name], strict=True):
                (cpu, wall), ret = fn(seed)
                results[impl].append((cpu, wall, ret))
                print(
                    f"{name} {impl} seed {seed}: {cpu:,.0f} steps per CPU second, {wall:,.0f} "
                    f"steps/s, return {ret:.1f}",
                    flush=True,
                )
            free_programs()
        ours, theirs = (np.asarray(results[k]) for k in ("evorl_pop", "brax"))
        for impl, r in (("evorl_pop", ours), ("brax", theirs)):
            rows.append((name, impl, *np.median(r[:, :2], 0), r[:, 2].mean(), r[:, 2].std()))
        ratio = np.median(ours[:, :2], 0) / np.median(theirs[:, :2], 0)
        diff = ours[:, 2].mean() - theirs[:, 2].mean()
        error = np.sqrt((ours[:, 2].var(ddof=1) + theirs[:, 2].var(ddof=1)) / ARGS.seeds)
        rows.append((name, "ours/brax", *ratio, diff, error))
    budget = (
        f"PPO {ARGS.ppo_iterations} x {ARGS.num_envs} x {ARGS.unroll_length} steps, "
        f"SAC {ARGS.sac_steps} steps"
    )
    where = (
        f"brax/{ARGS.task} ({ARGS.backend}), {ARGS.seeds} seeds, {ARGS.cores} core(s), "
        f"{ARGS.devices} device(s)"
    )
    if "ppo" in ARGS.only:
        where += (
            f", PPO advantages={ARGS.ppo_advantages!r}, "
            f"obs_norm_update={ARGS.ppo_obs_norm_update!r}, "
            f"policy_init_scale={ARGS.ppo_policy_init_scale}"
        )
    print(f"\n{where}, {budget}; medians over seeds")
    print(f"{'learner':8s} {'impl':10s} {'steps/CPU s':>12s} {'steps/s':>10s} {'return':>18s}")
    for name, impl, cpu, wall, mean, std in rows:
        if impl == "ours/brax":  # speed ratios; the return difference and its standard error
            print(
                f"{name:8s} {impl:10s} {cpu:12.2f} {wall:10.2f} {mean:+10.1f} +- {std:5.1f} (diff)"
            )
        else:
            print(f"{name:8s} {impl:10s} {cpu:12,.0f} {wall:10,.0f} {mean:10.1f} +- {std:5.1f}")


if __name__ == "__main__":
    main()
