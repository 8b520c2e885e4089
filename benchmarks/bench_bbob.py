"""CMA-ES through the engine (float64) on the 24 BBOB functions, side by side with pycma.

    python benchmarks/bench_bbob.py [--dims 2,5,10] [--functions 1-24] [--instances 1,2,3]
                                    [--seeds 1]

Every problem (function × instance × dimension d) starts at the same x0,
uniform in [-4, 4]^d, with σ0 = 2, pycma's default population 4 + ⌊3 ln d⌋ and
a budget of 1000·d evaluations; solved means a generation's best f − f* below
1e-8, counted at the end of that generation, within the budget. Four solvers:
the engine's single run and its BIPOP restarts (``minimize`` with
``CMA_ES_pycma``: evosax's CMA-ES with pycma's default constants and rules),
pycma's single run (``CMAEvolutionStrategy``) and ``cma.fmin(..., restarts=9,
bipop=True)``. One run per problem and solver leaves the totals to chance
(a multimodal problem is solved or not by the run's random draws), so
``--seeds S`` repeats every problem with S seeds of both (the same x0) and
adds a table over all of them; seed 0 is the one-seed table.
The last table runs the engine's single run on the ellipsoids (f2, f10) at the
largest dimension in float32 too, where f* ≠ 0 hides differences below its
spacing.

The function is a traced index into the 24 (``lax.switch``) and the instance
data (shift, rotations, f*) a traced argument, so one compiled run per
population size serves every problem of a dimension.
"""

import argparse
import dataclasses
import itertools
import time

import jax

jax.config.update("jax_enable_x64", True)  # before any array exists

import cma  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from evosax.problems.bbob.bbob_fns import bbob_fns  # noqa: E402

from evorl_pop import make_mesh  # noqa: E402
from evorl_pop.algorithms.es import ESConfig  # noqa: E402
from evorl_pop.algorithms.restarts import Minimizer  # noqa: E402
from evorl_pop.base import EvalInfo  # noqa: E402
from evorl_pop.tasks.blackbox import BBOB_FUNCTIONS, BBOBTask, bbob_instance  # noqa: E402

TARGET = 1e-8
SOLVERS = ("engine", "pycma", "engine BIPOP", "pycma BIPOP")


@dataclasses.dataclass(frozen=True)
class AnyBBOB(BBOBTask):
    """A BBOB task whose function, like its instance, is part of the task state."""

    def init_state(self):
        return jnp.int32(0), bbob_instance("sphere", self.num_dims, self.instance)

    def evaluate(self, solution, key, task_state):
        index, s = task_state
        branches = [
            lambda x, f=bbob_fns[name]: jnp.stack(f(x, s.x_opt, s.R, s.Q, self.num_dims)).astype(
                x.dtype
            )
            for name in BBOB_FUNCTIONS
        ]
        value, penalty = jax.lax.switch(index, branches, solution)
        return value + penalty + s.f_opt, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))

    def optimal_value(self, task_state):
        return task_state[1].f_opt


def problem_state(function: int, num_dims: int, instance: int):
    return jnp.int32(function), bbob_instance("sphere", num_dims, instance)


def start(num_dims: int, function: int, instance: int) -> np.ndarray:
    return np.random.default_rng([num_dims, function, instance]).uniform(-4.0, 4.0, num_dims)


def pycma_run(evaluate, x0, fopt, budget, popsize, bipop, seed):
    """pycma on one problem: (solved, evaluations to the target or spent)."""
    count = {"evals": 0, "hit": None}

    def batch(xs):
        values = evaluate(np.asarray(xs))
        count["evals"] += len(values)
        if count["hit"] is None and np.min(values) - fopt < TARGET:
            count["hit"] = count["evals"]
        return list(values)

    opts = {
        "maxfevals": budget,
        "ftarget": fopt + TARGET,
        "popsize": popsize,
        "verbose": -9,
        "seed": seed,
    }
    if bipop:
        cma.fmin(None, x0, 2.0, opts, restarts=9, bipop=True, parallel_objective=batch)
    else:
        es = cma.CMAEvolutionStrategy(x0, 2.0, opts)
        while not es.stop():
            xs = es.ask()
            es.tell(xs, batch(xs))
    solved = count["hit"] is not None and count["hit"] <= budget
    return solved, count["hit"] if solved else min(count["evals"], budget)


def run_dimension(num_dims, functions, instances, seeds, devices, log):
    popsize = 4 + int(3 * np.log(num_dims))
    budget = 1000 * num_dims
    config = ESConfig(
        strategy="CMA_ES_pycma",
        task="bbob/sphere",
        num_dims=num_dims,
        population_size=popsize,
        sigma_init=2.0,
        eval_episodes=0,
    )
    task = AnyBBOB("sphere", num_dims)
    minimizer = Minimizer(config, mesh=make_mesh(devices), task=task)

    @jax.jit
    def batch_values(xs, state):
        return jax.vmap(lambda x: task.evaluate(x, None, state)[0])(xs)

    results = {}  # (function, instance, seed) -> {solver: (solved, evaluations)}
    for function, instance, seed in itertools.product(functions, instances, range(seeds)):
        state = problem_state(function, num_dims, instance)
        fopt = float(state[1].f_opt)
        x0 = start(num_dims, function, instance)
        key = jax.random.key(1000 * function + instance + 100_000 * seed)
        row = {}
        for name, restarts in (("engine", 0), ("engine BIPOP", 9)):
            r = minimizer.minimize(
                key,
                target=TARGET,
                max_evaluations=budget,
                restarts=restarts,
                restart_strategy="bipop",
                x0=x0,
                task_state=state,
            )
            assert r.evaluations <= budget, r
            row[name] = (r.converged, r.evaluations)

        def evaluate(xs, state=state):
            size = 1 << (len(xs) - 1).bit_length()  # few shapes, few compilations
            padded = np.zeros((size, num_dims))
            padded[: len(xs)] = xs
            return np.asarray(batch_values(padded, state))[: len(xs)]

        for name, bipop in (("pycma", False), ("pycma BIPOP", True)):
            row[name] = pycma_run(
                evaluate, x0, fopt, budget, popsize, bipop, seed=instance + 1000 * seed
            )
        results[function, instance, seed] = row
        log(
            f"  d={num_dims:<2} f{function + 1:<2} {BBOB_FUNCTIONS[function]:<22} i{instance} "
            f"s{seed}  " + "  ".join(f"{n}: {'+' if s else '-'}{e:>6}" for n, (s, e) in row.items())
        )
    return results


def float32_stall(num_dims, instances, devices):
    """Engine single runs on f2 and f10 in float32 and float64.

    Returns rows of (function, instance, then per precision: f - f* as the run
    saw it, f - f* of its best solution evaluated in float64, why it stopped,
    evaluations).
    """
    rows = []
    for function in ("ellipsoidal", "ellipsoidal_rotated"):
        for instance in instances:
            x0 = start(num_dims, BBOB_FUNCTIONS.index(function), instance)
            row = [function, instance]
            for x64 in (False, True):
                with jax.enable_x64(x64):
                    config = ESConfig(
                        strategy="CMA_ES_pycma",
                        task=f"bbob/{function}",
                        num_dims=num_dims,
                        population_size=4 + int(3 * np.log(num_dims)),
                        sigma_init=2.0,
                        instance=instance,
                        eval_episodes=0,
                    )
                    r = Minimizer(config, mesh=make_mesh(devices)).minimize(
                        jax.random.key(instance), TARGET, 1000 * num_dims, x0=x0
                    )
                task = BBOBTask(function, num_dims, instance)
                state = task.init_state()
                true_f = float(task.evaluate(jnp.asarray(r.x, jnp.float64), None, state)[0])
                fopt = float(state.f_opt)
                row += [r.best - fopt, true_f - fopt, r.runs[0].stop, r.evaluations]
            rows.append(row)
    return rows


def parse_functions(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += range(int(lo) - 1, int(hi))
        elif part.isdigit():
            out.append(int(part) - 1)
        else:
            out.append(BBOB_FUNCTIONS.index(part))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="2,5,10")
    parser.add_argument("--functions", default="1-24", help="numbers (1-24) or evosax names")
    parser.add_argument("--instances", default="1,2,3")
    parser.add_argument("--seeds", type=int, default=1, help="runs per problem and solver")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--quiet", action="store_true", help="no line per problem")
    parser.add_argument("--no-table", action="store_true", help="only the float32 rows")
    parser.add_argument("--no-float32", action="store_true", help="only the table")
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    functions = parse_functions(args.functions)
    instances = [int(i) for i in args.instances.split(",")]
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))

    t0 = time.perf_counter()
    tables = (
        {}
        if args.no_table
        else {
            d: run_dimension(d, functions, instances, args.seeds, args.devices, log) for d in dims
        }
    )
    problems = len(functions) * len(instances)
    for seeds in sorted({1, args.seeds}):
        print(
            f"\nsolved to f - f* < 1e-8 of {problems} problems x {seeds} seed(s) per dimension "
            "(median evaluations of the solved ones)"
        )
        print(f"{'d':>3}  " + "  ".join(f"{n:>22}" for n in SOLVERS))
        for d, results in tables.items():
            cells = []
            for name in SOLVERS:
                runs = [row[name] for (_, _, seed), row in results.items() if seed < seeds]
                solved = [e for s, e in runs if s]
                median = f"{np.median(solved):,.0f}" if solved else "-"
                cells.append(f"{len(solved):>4} / {problems * seeds:<4} ({median:>7})")
            print(f"{d:>3}  " + "  ".join(f"{c:>22}" for c in cells))
    print(
        f"\nsolved per function of {len(instances)} instances x {args.seeds} seed(s) "
        "(engine / pycma / engine BIPOP / pycma BIPOP), per dimension"
    )
    for function in functions if tables else ():
        cells = []
        for d in dims:
            counts = [
                sum(row[name][0] for (f, _, _), row in tables[d].items() if f == function)
                for name in SOLVERS
            ]
            cells.append("/".join(map(str, counts)))
        print(f"  f{function + 1:<2} {BBOB_FUNCTIONS[function]:<22} " + "   ".join(cells))

    d = max(dims)
    if args.no_float32:
        return
    print(
        f"\nfloat32 against float64, engine single run, d={d}: best f - f* as the run "
        "saw it / of its best x evaluated in float64 (stop, evaluations)"
    )
    for name, instance, *rest in float32_stall(d, instances, args.devices):
        f32, f64 = rest[:4], rest[4:]
        print(
            f"  {name:<20} i{instance}  float32 {f32[0]:9.2e} / {f32[1]:9.2e} ({f32[2]}, "
            f"{f32[3]:,})   float64 {f64[0]:9.2e} / {f64[1]:9.2e} ({f64[2]}, {f64[3]:,})"
        )
    print(f"\ntotal time {time.perf_counter() - t0:,.0f} s")


if __name__ == "__main__":
    main()
