"""CMA-ES through the sharded engine against pycma's evaluation counts.

    python benchmarks/bench_cmaes.py [--seeds 5]

Evaluations until the best fitness of a generation is below 1e-8 in 10-D,
population 10: sphere and ellipsoid (condition 1e6) from x0 = 3·1, σ0 = 1,
Rosenbrock from x0 = 0, σ0 = 0.5. pycma's medians over 5 seeds for the same
set-up: 1,511 / 4,106 / 4,778.
"""

import argparse
import time

import jax
import numpy as np

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ESConfig
from evorl_pop.algorithms.restarts import minimize

PYCMA = {"sphere": 1511, "ellipsoid": 4106, "rosenbrock": 4778}
SETUPS = {"sphere": (3.0, 1.0), "ellipsoid": (3.0, 1.0), "rosenbrock": (0.0, 0.5)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    print(
        f"{'function':>10}  {'converged':>9}  {'median evals':>12}  {'pycma':>6}  "
        f"{'ratio':>5}  {'time (s)':>8}  per-seed evaluations"
    )
    for function, (x0, sigma) in SETUPS.items():
        config = ESConfig(
            strategy="CMA_ES",
            task=function,
            num_dims=10,
            population_size=10,
            x0=x0,
            sigma_init=sigma,
        )
        t0 = time.perf_counter()
        results = [
            minimize(
                config,
                jax.random.key(s),
                target=1e-8,
                max_generations=1500,
                restarts=2,
                mesh=make_mesh(args.devices),
            )
            for s in range(args.seeds)
        ]
        median = np.median([r.evaluations for r in results])
        converged = sum(r.converged for r in results)
        restarts = sum(r.restarts for r in results)
        note = f" ({restarts} restarts)" if restarts else ""
        print(
            f"{function:>10}  {converged:>4} / {args.seeds:<2}  {median:>12,.0f}  "
            f"{PYCMA[function]:>6,}  {median / PYCMA[function]:>5.2f}  "
            f"{time.perf_counter() - t0:>8.1f}  {[r.evaluations for r in results]}{note}"
        )


if __name__ == "__main__":
    main()
