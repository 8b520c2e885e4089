"""NSGA-II and NSGA-III against pymoo 0.6.2 at equal evaluations and equal operators,
and NSGA-II on mo/halfcheetah at EvoRL's settings.

    pip install pymoo==0.6.2   # for this benchmark only
    python benchmarks/bench_mo.py [--seeds 10] [--devices 1] [--skip-nsga3]
    python benchmarks/bench_mo.py --speed-only           # the generation's time only
    python benchmarks/bench_mo.py --halfcheetah --halfcheetah-generations 2 \\
        --episode-length 20                              # briefly, on a small CPU

Quality: NSGA-II on ZDT1 (30 variables, population 100, 250 generations) and
NSGA-III on DTLZ2 (3 objectives, 12 variables, 91 Das-Dennis directions,
population 92, 250 generations); the final front's IGD against the same 1,000
points of the true front, median and interquartile range over the seeds.
Operators on both sides: SBX (probability 0.9 per pair, 0.5 per variable,
index 15), polynomial mutation (1 / n per variable, index 20), binary
tournaments. pymoo also drops duplicate offspring; evorl_pop does not.

Speed: the time of one generation of NSGA-II on ZDT1 at population 1,024,
after compilation (evorl_pop: compiled chunks of generations, without and with
the per-generation hypervolume and IGD, which pymoo's loop does not compute;
pymoo: its ask / evaluate / tell loop), on the same CPU.

mo/halfcheetah (``--halfcheetah``): NSGA-II at EvoRL's settings (population 1,024,
an MLP of 16 x 16, every parameter in [-10, 10], 16 episodes per fitness); the
front's hypervolume against the task's reference point and the seconds per
generation after compilation. The measured tables are on docs/benchmarks/bench-mo.md.
"""

import argparse
import os
import time

import numpy as np


def _devices(n: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def ours(algorithm: str, task: str, pop: int, generations: int, seeds: int, devices: int):
    """Each seed's final front (rank 0, minimised objectives), compiled once."""
    import jax
    import jax.numpy as jnp

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config

    cls, config_cls = (NSGA2, NSGA2Config) if algorithm == "nsga2" else (NSGA3, NSGA3Config)
    algo = cls(config_cls(task=task, population_size=pop), mesh=make_mesh(devices))

    @jax.jit
    def run(key):
        state = algo.init(key)
        body = lambda s, g: (algo.step(s, jax.random.fold_in(key, g))[0], None)  # noqa: E731
        return jax.lax.scan(body, state, jnp.arange(generations))[0]

    fronts = []
    for seed in range(seeds):
        s = jax.block_until_ready(run(jax.random.key(seed))).strategy_state
        fronts.append(np.asarray(s.fitness)[np.asarray(s.rank) == 0])
    return fronts


def ours_time(pop: int, devices: int, measures: bool, generations: int = 10) -> float:
    import jax

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config
    from evorl_pop.run.shell import chunk_fn

    config = NSGA2Config(task="mo/zdt1", population_size=pop, measures=measures)
    algo = NSGA2(config, mesh=make_mesh(devices))
    chunk = chunk_fn(algo, generations)
    key = jax.random.key(0)
    state = jax.block_until_ready(jax.jit(algo.init)(key))
    state = jax.block_until_ready(chunk(state, key)[0])  # compiled
    t0 = time.perf_counter()
    jax.block_until_ready(chunk(state, key))
    return (time.perf_counter() - t0) / generations


def _pymoo_algorithm(algorithm: str, pop: int, num_dims: int):
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.algorithms.moo.nsga3 import NSGA3
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.util.ref_dirs import get_reference_directions

    operators = {
        "crossover": SBX(prob=0.9, prob_var=0.5, eta=15),
        "mutation": PM(prob=1.0, prob_var=1.0 / num_dims, eta=20),
    }
    if algorithm == "nsga2":
        return NSGA2(pop_size=pop, **operators)
    directions = get_reference_directions("das-dennis", 3, n_partitions=12)
    return NSGA3(directions, pop_size=pop, **operators)


def theirs(algorithm: str, problem: str, pop: int, generations: int, seed: int):
    from pymoo.optimize import minimize
    from pymoo.problems import get_problem

    p = get_problem(problem) if problem == "zdt1" else get_problem(problem, n_obj=3)
    result = minimize(
        p, _pymoo_algorithm(algorithm, pop, p.n_var), ("n_gen", generations), seed=seed
    )
    return result.F


def theirs_time(pop: int, generations: int = 10) -> float:
    from pymoo.core.evaluator import Evaluator
    from pymoo.problems import get_problem

    problem = get_problem("zdt1")
    algo = _pymoo_algorithm("nsga2", pop, problem.n_var)
    algo.setup(problem, termination=("n_gen", generations + 2), seed=0)
    evaluator = Evaluator()

    def one():
        offspring = algo.ask()
        evaluator.eval(problem, offspring)
        algo.tell(infills=offspring)

    one()
    one()  # the initial population and a first generation
    t0 = time.perf_counter()
    for _ in range(generations):
        one()
    return (time.perf_counter() - t0) / generations


def _row(name: str, values: list[float]) -> str:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return f"{name:<26} {med:>10.5f} {q1:>10.5f} {q3:>10.5f}"


def halfcheetah(generations: int, episode_length: int, devices: int, pop: int = 1024):
    """NSGA-II on mo/halfcheetah at EvoRL's settings: per generation, the seconds
    (after the first, which compiles) and the front's hypervolume."""
    import jax

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config

    config = NSGA2Config(
        task="mo/halfcheetah",
        population_size=pop,
        hidden_sizes=(16, 16),
        bounds=(-10.0, 10.0),
        episodes=16,
        episode_length=episode_length,
    )
    algo = NSGA2(config, mesh=make_mesh(devices))
    key = jax.random.key(0)
    step = jax.jit(algo.step)
    t0 = time.perf_counter()
    state = jax.block_until_ready(jax.jit(algo.init)(key))
    rows = [(0, time.perf_counter() - t0, None, None)]
    for g in range(generations):
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(step(state, jax.random.fold_in(key, g)))
        seconds = time.perf_counter() - t0
        rows.append((g + 1, seconds, float(metrics["hypervolume"]), int(metrics["front_size"])))
    return algo, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--generations", type=int, default=250)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--speed-population", type=int, default=1024)
    parser.add_argument("--skip-nsga3", action="store_true")
    parser.add_argument("--speed-only", action="store_true", help="only the generation's time")
    parser.add_argument("--speed-generations", type=int, default=10)
    parser.add_argument("--halfcheetah", action="store_true", help="only the mo/halfcheetah row")
    parser.add_argument("--halfcheetah-generations", type=int, default=10)
    parser.add_argument("--episode-length", type=int, default=1000, help="mo/halfcheetah's")
    parser.add_argument("--decomposition", action="store_true", help="only MOEA/D and RVEA")
    args = parser.parse_args()
    _devices(args.devices)
    if args.decomposition:
        return decomposition(args)
    if args.halfcheetah:
        algo, rows = halfcheetah(args.halfcheetah_generations, args.episode_length, args.devices)
        print(
            f"NSGA-II on mo/halfcheetah: population 1024, MLP 16x16, bounds [-10, 10], "
            f"16 episodes of {args.episode_length} steps per fitness, {args.devices} device(s)"
        )
        print(f"hypervolume reference point: {list(algo.ref_point)} (forward, control)")
        print(f"{'generation':>10} {'seconds':>9} {'hypervolume':>12} {'front':>6}")
        for g, seconds, volume, size in rows:
            what = "(init, compiles)" if g == 0 else f"{volume:>12.4g} {size:>6d}"
            print(f"{g:>10d} {seconds:>9.2f} {what}")
        if len(rows) > 2:
            steady = np.median([seconds for _, seconds, _, _ in rows[2:]])
            print(f"seconds per generation after compilation (median): {steady:.2f}")
        return
    if not args.speed_only:
        quality(args)
    pop = args.speed_population
    gens = args.speed_generations
    mine = ours_time(pop, args.devices, False, gens)
    other = theirs_time(pop, gens)
    measured = ours_time(pop, args.devices, True, gens)
    print(f"\nNSGA-II on ZDT1, population {pop}: seconds per generation")
    print(
        f"{'evorl_pop':<28} {mine:>8.4f}  ({args.devices} device(s); speed-up {other / mine:.1f}x)"
    )
    print(f"{'  with hypervolume and IGD':<28} {measured:>8.4f}  (every generation's measures)")
    print(f"{'pymoo':<28} {other:>8.4f}")


def quality(args):
    """The IGD table: each side's final fronts over the seeds."""
    import moocore

    from evorl_pop.tasks.multiobjective import make_mo_task

    setups = [("nsga2", "zdt1", 100)] + ([] if args.skip_nsga3 else [("nsga3", "dtlz2", 92)])
    print(f"IGD of the final front, {args.seeds} seeds, {args.generations} generations")
    print(f"{'':<26} {'median':>10} {'q25':>10} {'q75':>10}")
    for algorithm, problem, pop in setups:
        front = make_mo_task(f"mo/{problem}").pareto_front()
        for who in ("evorl_pop", "pymoo"):
            t0 = time.perf_counter()
            if who == "evorl_pop":
                task = f"mo/{problem}"
                found = ours(algorithm, task, pop, args.generations, args.seeds, args.devices)
            else:
                found = [
                    theirs(algorithm, problem, pop, args.generations, seed)
                    for seed in range(args.seeds)
                ]
            values = [moocore.igd(f, ref=front) for f in found]
            seconds = time.perf_counter() - t0
            print(_row(f"{algorithm} {problem} {who}", values) + f"   ({seconds:.0f} s in all)")


# --- MOEA/D and RVEA against pymoo's (python benchmarks/bench_mo.py --decomposition) -------
#: The problems of the MOEA/D and RVEA table: (task, pymoo's name, objectives, the
#: Das-Dennis partitions of the quality runs: 100 and 91 weights / vectors).
DECOMPOSITION_PROBLEMS = (("mo/zdt1", "zdt1", 2, 99), ("mo/dtlz2", "dtlz2", 3, 12))


def decomposition_config(algorithm: str, task: str, partitions: int, generations: int):
    """The evorl_pop config with pymoo's defaults: MOEA/D with 20 neighbours, parents
    from them with probability 0.9, Tchebycheff on 2 objectives and PBI on 3, SBX
    (index 20) and polynomial mutation (index 20); RVEA with alpha 2, the vectors
    adapted every tenth of the run, SBX (index 30) and polynomial mutation (index 20)."""
    from math import comb

    from evorl_pop.algorithms.moead import MOEADConfig
    from evorl_pop.algorithms.rvea import RVEAConfig

    k = 2 if task == "mo/zdt1" else 3
    pop = comb(partitions + k - 1, k - 1)
    common = {"task": task, "population_size": pop, "ref_partitions": partitions}
    common["measures"] = False
    if algorithm == "moead":
        decomposition = "tchebycheff" if k == 2 else "pbi"
        return MOEADConfig(**common, neighbour_prob=0.9, decomposition=decomposition)
    return RVEAConfig(**common, max_generations=generations)


def decomposition_ours(algorithm, task, partitions, generations, seeds, devices):
    """Each seed's final front (non-dominated members), compiled once; and the seconds
    per generation (the last seed's run, after compilation)."""
    import jax
    import jax.numpy as jnp

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.moead import MOEAD
    from evorl_pop.algorithms.rvea import RVEA

    config = decomposition_config(algorithm, task, partitions, generations)
    algo = (MOEAD if algorithm == "moead" else RVEA)(config, mesh=make_mesh(devices))

    @jax.jit
    def run(key):
        state = algo.init(key)
        body = lambda s, g: (algo.step(s, jax.random.fold_in(key, g))[0], None)  # noqa: E731
        return jax.lax.scan(body, state, jnp.arange(generations))[0]

    fronts = []
    for seed in range(seeds):
        s = jax.block_until_ready(run(jax.random.key(seed))).strategy_state
        fronts.append(np.asarray(s.fitness)[np.asarray(s.rank) == 0])
    return fronts


def decomposition_ours_time(algorithm, task, partitions, devices, generations=5) -> float:
    """Seconds per generation after compilation, without the front's measures."""
    import jax

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.moead import MOEAD
    from evorl_pop.algorithms.rvea import RVEA
    from evorl_pop.run.shell import chunk_fn

    config = decomposition_config(algorithm, task, partitions, 100)
    algo = (MOEAD if algorithm == "moead" else RVEA)(config, mesh=make_mesh(devices))
    chunk = chunk_fn(algo, generations)
    key = jax.random.key(0)
    state = jax.block_until_ready(jax.jit(algo.init)(key))
    state = jax.block_until_ready(chunk(state, key)[0])  # compiled
    t0 = time.perf_counter()
    jax.block_until_ready(chunk(state, key))
    return (time.perf_counter() - t0) / generations


def decomposition_theirs(algorithm, problem, k, partitions, generations, seed):
    """pymoo's MOEAD or RVEA at its defaults on the same directions: the final front."""
    from pymoo.algorithms.moo.moead import MOEAD
    from pymoo.algorithms.moo.rvea import RVEA
    from pymoo.optimize import minimize
    from pymoo.problems import get_problem
    from pymoo.util.ref_dirs import get_reference_directions

    p = get_problem(problem) if k == 2 else get_problem(problem, n_obj=3)
    directions = get_reference_directions("das-dennis", k, n_partitions=partitions)
    algo = MOEAD(directions) if algorithm == "moead" else RVEA(directions)
    return minimize(p, algo, ("n_gen", generations), seed=seed).F


def decomposition_theirs_time(algorithm, problem, k, partitions, generations=3) -> float:
    """pymoo's seconds per generation: a run of ``1 + generations`` less a run of 1."""
    times = []
    for n in (1, 1 + generations):
        t0 = time.perf_counter()
        decomposition_theirs(algorithm, problem, k, partitions, n, 0)
        times.append(time.perf_counter() - t0)
    return (times[1] - times[0]) / generations


def decomposition(args):
    """The MOEA/D and RVEA table: IGD at equal evaluations, then the generation's time."""
    import moocore

    from evorl_pop.tasks.multiobjective import make_mo_task

    gens, seeds = args.generations, args.seeds
    print(f"IGD of the final front (non-dominated members), {seeds} seeds, {gens} generations")
    print(f"{'':<26} {'median':>10} {'q25':>10} {'q75':>10}")
    for algorithm in ("moead", "rvea"):
        for task, problem, k, partitions in DECOMPOSITION_PROBLEMS:
            front = make_mo_task(task).pareto_front()
            for who in ("evorl_pop", "pymoo"):
                t0 = time.perf_counter()
                if who == "evorl_pop":
                    found = decomposition_ours(
                        algorithm, task, partitions, gens, seeds, args.devices
                    )
                else:
                    found = [
                        decomposition_theirs(algorithm, problem, k, partitions, gens, seed)
                        for seed in range(seeds)
                    ]
                values = [moocore.igd(f, ref=front) for f in found]
                seconds = time.perf_counter() - t0
                name = f"{algorithm} {problem} {who}"
                print(_row(name, values) + f"   ({seconds:.0f} s in all)")
    pop = args.speed_population
    print(f"\nseconds per generation, population about {pop} (Das-Dennis), after compilation")
    for task, problem, k, _ in DECOMPOSITION_PROBLEMS:
        partitions = pop - 1 if k == 2 else 43  # 1,024 weights; 990 for 3 objectives
        for algorithm in ("moead", "rvea"):
            mine = decomposition_ours_time(algorithm, task, partitions, args.devices)
            other = decomposition_theirs_time(algorithm, problem, k, partitions)
            print(
                f"{algorithm} {problem:<8} evorl_pop {mine:>8.4f}  pymoo {other:>8.4f}  "
                f"(speed-up {other / mine:.0f}x, {args.devices} device(s))"
            )


if __name__ == "__main__":
    main()
