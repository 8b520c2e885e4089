"""NSGA-II and NSGA-III against pymoo 0.6.2 at equal evaluations, and NSGA-II on
mo/halfcheetah at EvoRL's settings.

    pip install pymoo==0.6.2   # for this benchmark only
    python benchmarks/bench_mo.py [--seeds 10] [--generations 400] [--devices 1]
    python benchmarks/bench_mo.py --seeds 3 --problems dtlz1:3,dtlz2:3,wfg4:3,zdt4
    python benchmarks/bench_mo.py --speed-only           # the generation's time only
    python benchmarks/bench_mo.py --halfcheetah --halfcheetah-generations 2 \\
        --episode-length 20                              # briefly, on a small CPU

Quality: for each problem (``name:M``, ``M`` objectives; ZDT's 2), NSGA-III on
both sides with its defaults (SBX probability 1.0 and index 30, polynomial
mutation 1 / n and index 20: Deb and Jain 2014, pymoo's ``NSGA3``), Das-Dennis
directions (2 objectives: 99 partitions; 3: 12; 5: 6) and a population of the
directions rounded up to a multiple of 4; on 2 objectives also NSGA-II (population
100; SBX 0.9 per pair, 0.5 per variable, index 15; mutation 1 / n, index 20; binary
tournaments). The same number of variables and generations, hence evaluations,
on both sides. The measure: IGD (pymoo's) of the final population's
non-dominated members against the task's true front (``MOTask.pareto_front``,
about 1,000 points), the median and interquartile range over the seeds, and the
ratio of the medians (ours / pymoo). pymoo also drops duplicate offspring;
evorl_pop does not.

Speed: the time of one generation at population 1,024, after compilation, of
NSGA-II on ZDT1 and NSGA-III on 3-objective DTLZ2 (990 directions) (evorl_pop:
compiled chunks of generations, without the per-generation hypervolume and IGD,
which pymoo's loop does not compute; pymoo: its ask / evaluate / tell loop), on
the same CPU.

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


#: The problems of the full table: name and objectives.
PROBLEMS = (
    [(f"zdt{i}", 2) for i in (1, 2, 3, 4, 6)]
    + [(f"dtlz{i}", m) for i in range(1, 8) for m in (2, 3)]
    + [(f"wfg{i}", m) for i in range(1, 10) for m in (2, 3)]
    + [("dtlz2", 5)]
    + [(f"wfg{i}", 5) for i in range(1, 10)]
)
#: Das-Dennis partitions per number of objectives (NSGA-III's directions).
PARTITIONS = {2: 99, 3: 12, 5: 6}


def setup(algorithm: str, m: int) -> tuple[int, int | None]:
    """The population and the Das-Dennis partitions (NSGA-III) for ``m`` objectives."""
    if algorithm == "nsga2":
        return 100, None
    from evorl_pop.tasks.multiobjective import das_dennis

    directions = len(das_dennis(PARTITIONS[m], m))
    return -(-directions // 4) * 4, PARTITIONS[m]


def ours(algorithm: str, problem: str, m: int, generations: int, seeds: int, devices: int):
    """Each seed's final front (rank 0, minimised objectives), compiled once."""
    import jax
    import jax.numpy as jnp

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config

    pop, partitions = setup(algorithm, m)
    common = {"task": f"mo/{problem}", "population_size": pop, "measures": False}
    if not problem.startswith("zdt"):
        common["num_objectives"] = m
    if algorithm == "nsga2":
        config = NSGA2Config(**common, crossover_prob=0.9, eta_crossover=15.0)
        algo = NSGA2(config, mesh=make_mesh(devices))
    else:
        algo = NSGA3(NSGA3Config(**common, ref_partitions=partitions), mesh=make_mesh(devices))

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


def ours_time(algorithm: str, pop: int, devices: int, generations: int = 10) -> float:
    import jax

    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config
    from evorl_pop.run.shell import chunk_fn

    if algorithm == "nsga2":
        config = NSGA2Config(task="mo/zdt1", population_size=pop, measures=False)
        algo = NSGA2(config, mesh=make_mesh(devices))
    else:
        config = NSGA3Config(task="mo/dtlz2", population_size=pop, measures=False)
        algo = NSGA3(config, mesh=make_mesh(devices))
    chunk = chunk_fn(algo, generations)
    key = jax.random.key(0)
    state = jax.block_until_ready(jax.jit(algo.init)(key))
    state = jax.block_until_ready(chunk(state, key)[0])  # compiled
    t0 = time.perf_counter()
    jax.block_until_ready(chunk(state, key))
    return (time.perf_counter() - t0) / generations


def _pymoo_algorithm(algorithm: str, pop: int, num_dims: int, m: int, partitions):
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.algorithms.moo.nsga3 import NSGA3
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.util.ref_dirs import get_reference_directions

    if algorithm == "nsga2":
        crossover = SBX(prob=0.9, prob_var=0.5, eta=15)
        mutation = PM(prob=1.0, prob_var=1.0 / num_dims, eta=20)
        return NSGA2(pop_size=pop, crossover=crossover, mutation=mutation)
    directions = get_reference_directions("das-dennis", m, n_partitions=partitions)
    return NSGA3(directions, pop_size=pop)  # its defaults: SBX(eta=30, prob=1.0), PM(eta=20)


def _pymoo_problem(problem: str, m: int):
    from pymoo.problems import get_problem

    from evorl_pop.tasks.multiobjective import make_mo_task

    task = make_mo_task(f"mo/{problem}", num_objectives=None if problem.startswith("zdt") else m)
    if problem.startswith("zdt"):
        return task, get_problem(problem, n_var=task.num_dims)
    return task, get_problem(problem, n_var=task.num_dims, n_obj=m)


def theirs(algorithm: str, problem: str, m: int, generations: int, seed: int):
    """pymoo's final population's non-dominated objective vectors."""
    from pymoo.optimize import minimize
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

    _, p = _pymoo_problem(problem, m)
    pop, partitions = setup(algorithm, m)
    algo = _pymoo_algorithm(algorithm, pop, p.n_var, m, partitions)
    result = minimize(p, algo, ("n_gen", generations), seed=seed)
    f = result.algorithm.pop.get("F")
    return f[NonDominatedSorting().do(f, only_non_dominated_front=True)]


def theirs_time(algorithm: str, pop: int, generations: int = 10) -> float:
    from pymoo.core.evaluator import Evaluator
    from pymoo.problems import get_problem

    from evorl_pop.algorithms.nsga3 import default_partitions

    if algorithm == "nsga2":
        problem = get_problem("zdt1")
        algo = _pymoo_algorithm("nsga2", pop, problem.n_var, 2, None)
    else:
        problem = get_problem("dtlz2", n_var=12, n_obj=3)
        algo = _pymoo_algorithm("nsga3", pop, 12, 3, default_partitions(pop, 3))
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
    """``name``, then the median, first and third quartiles of ``values``."""
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return f"{name:<26} {med:>10.5f} {q1:>10.5f} {q3:>10.5f}"


def _summary(values: list[float]) -> tuple[float, str]:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return med, f"{med:>9.5f} [{q1:.5f}, {q3:.5f}]"


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
    parser.add_argument("--generations", type=int, default=400)
    parser.add_argument(
        "--problems",
        default=None,
        help="comma-separated name[:objectives], e.g. dtlz1:3,wfg4:5,zdt4 (default: all)",
    )
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--speed-population", type=int, default=1024)
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
    print(f"\nSeconds per generation at population {pop} ({args.devices} device(s))")
    print(f"{'':<24} {'evorl_pop':>10} {'pymoo':>10} {'speed-up':>9}")
    for algorithm, what in (("nsga2", "NSGA-II ZDT1"), ("nsga3", "NSGA-III DTLZ2 (3)")):
        mine = ours_time(algorithm, pop, args.devices, gens)
        other = theirs_time(algorithm, pop, gens)
        print(f"{what:<24} {mine:>10.4f} {other:>10.4f} {other / mine:>8.1f}x")


def _problems(text: str | None) -> list[tuple[str, int]]:
    if text is None:
        return PROBLEMS
    out = []
    for item in text.split(","):
        name, _, m = item.strip().partition(":")
        out.append((name, int(m) if m else (2 if name.startswith("zdt") else 3)))
    return out


def targets(problem: str, m: int) -> np.ndarray | None:
    """The true front's points on NSGA-III's reference directions, where the front has a
    closed form (Deb and Jain's IGD: 91 points for 3 objectives), else ``None``."""
    from evorl_pop.tasks.multiobjective import das_dennis

    if m not in PARTITIONS or problem.startswith("zdt"):
        return None
    directions = das_dennis(PARTITIONS[m], m)
    sphere = directions / np.linalg.norm(directions, axis=1, keepdims=True)
    if problem == "dtlz1":
        return 0.5 * directions
    if problem in ("dtlz2", "dtlz3", "dtlz4"):
        return sphere
    if problem in tuple(f"wfg{i}" for i in range(4, 10)):
        return sphere * 2.0 * np.arange(1, m + 1)
    return None


def quality(args):
    """The IGD table: each side's final fronts over the seeds, and the ratio of medians."""
    from pymoo.indicators.igd import IGD

    print(f"IGD of the final front: {args.seeds} seeds, {args.generations} generations")
    print("front: against the task's true front (about 1,000 points); targets: against")
    print("its points on the reference directions (Deb and Jain's IGD), where known")
    print(
        f"{'problem':<9} {'M':>2} {'algorithm':<9} {'pop':>4} {'IGD vs':<8}"
        f"{'evorl_pop median [q25, q75]':>30} {'pymoo median [q25, q75]':>30} {'ratio':>6}"
    )
    for problem, m in _problems(args.problems):
        task, _ = _pymoo_problem(problem, m)
        measures = {"front": IGD(task.pareto_front())}
        if (points := targets(problem, m)) is not None:
            measures["targets"] = IGD(points)
        for algorithm in ("nsga3", "nsga2") if m == 2 else ("nsga3",):
            mine = ours(algorithm, problem, m, args.generations, args.seeds, args.devices)
            other = [theirs(algorithm, problem, m, args.generations, s) for s in range(args.seeds)]
            pop = setup(algorithm, m)[0]
            for what, measure in measures.items():
                med_a, text_a = _summary([measure(f) for f in mine])
                med_b, text_b = _summary([measure(f) for f in other])
                print(
                    f"{problem:<9} {m:>2} {algorithm:<9} {pop:>4} {what:<8}{text_a:>30} "
                    f"{text_b:>30} {med_a / med_b:>6.2f}",
                    flush=True,
                )


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
