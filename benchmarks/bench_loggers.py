"""What logging costs a run: csv alone, + TensorBoard, + W&B (offline), side by side in one run.

    python benchmarks/bench_loggers.py [--gens 6] [--pop 1024] [--chunk 1]

The Pendulum OpenES job (population 1024, 3-16-16-1 ReLU MLP, 200-step
episodes) runs through the run shell once per logger set, chunk 1 (a flush
after every generation: logging's worst case). Each logger is wrapped so that
the time spent in its ``row`` and ``flush`` calls is measured directly, and
set against the generation's time (from the run's ``metrics.csv``); its
one-time ``start`` / ``finish`` (W&B starts a service) is shown apart.
Goal: logging <= 2 % of a generation.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import numpy as np  # noqa: E402

from evorl_pop.run import config as config_lib  # noqa: E402
from evorl_pop.run import loggers, shell, store  # noqa: E402


class Timed(store.Recorder):
    """A recorder, its calls timed: per row and flush (``per_gen``), and start / finish."""

    def __init__(self, inner):
        self.inner, self.steady, self.once = inner, 0.0, 0.0

    def _time(self, attr, name, *args):
        t0 = time.perf_counter()
        getattr(self.inner, name)(*args)
        setattr(self, attr, getattr(self, attr) + time.perf_counter() - t0)

    def start(self, run, state):
        self._time("once", "start", run, state)

    def row(self, row):
        self._time("steady", "row", row)

    def flush(self, run, state):
        self._time("steady", "flush", run, state)

    def image(self, name, path):
        self._time("once", "image", name, path)

    def finish(self, run, completed):
        self._time("once", "finish", run, completed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gens", type=int, default=6)
    parser.add_argument("--pop", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=1)
    args = parser.parse_args()
    overrides = [
        "task=Pendulum-v1", "strategy=Open_ES", f"population_size={args.pop}",
        "hidden_sizes=[16,16]", "activation=relu", f"generations={args.gens}",
        f"chunk={args.chunk}", "checkpoint_every=0", "devices=1",
    ]  # fmt: skip
    config = config_lib.resolve_config([], overrides)
    sets = {"csv": [], "csv+tensorboard": [loggers.TensorBoard()],
            "csv+wandb": [loggers.WandB()]}  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as root:
        shell.train(config, Path(root) / "warmup", progress=False, figure=False)  # compiles
        for name, extra in sets.items():
            timed = [Timed(r) for r in extra]
            run_dir = Path(root) / name
            shell.train(config, run_dir, progress=False, figure=False, recorders=timed)
            wall = store.read_metrics(run_dir)["wall_time"]
            generation = float(np.median(np.diff(np.concatenate([[0.0], wall]))[1:]))
            steady = sum(t.steady for t in timed) / args.gens
            once = sum(t.once for t in timed)
            rows.append((name, generation, steady, steady / generation, once))
    print(f"Pendulum-v1 OpenES, population {args.pop}, {args.gens} generations, "
          f"chunk {args.chunk}")  # fmt: skip
    print(f"{'loggers':18s} {'gen (s)':>9s} {'log/gen (ms)':>13s} {'share':>8s} "
          f"{'start+finish (s)':>17s}")  # fmt: skip
    for name, generation, steady, share, once in rows:
        print(f"{name:18s} {generation:9.3f} {steady * 1e3:13.3f} {share:8.3%} {once:17.2f}")
    worst = max(r[3] for r in rows)
    print(f"goal: logging <= 2% of a generation: {'met' if worst <= 0.02 else 'NOT met'} "
          f"(worst {worst:.3%})")  # fmt: skip


if __name__ == "__main__":
    main()
