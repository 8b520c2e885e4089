"""Multi-objective search: vector fitness through the engine, Pareto ranks and crowding
against a direct NumPy computation, hypervolume and IGD against hand values and moocore,
the ZDT / DTLZ problems on their fronts, NSGA-II device-count invariant, resumed exactly,
and learning ZDT1's front."""

import csv
import os

import jax
import jax.numpy as jnp
import moocore
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.algorithms.nsga2 import NSGA2, NSGA2Config, polynomial_mutation, sbx
from evorl_pop.base import ConfigError, EvalInfo
from evorl_pop.core import engine
from evorl_pop.core.pareto import crowding_distance, hypervolume, igd, nondominated_ranks
from evorl_pop.run import store
from evorl_pop.tasks import make_task
from evorl_pop.tasks.multiobjective import das_dennis, make_mo_task

# --- references: Deb et al. 2002, written directly -----------------------------------------


def _ranks_reference(f):
    """Deb's fast non-dominated sort: dominated sets and domination counts."""
    n = len(f)
    dominated = [[] for _ in range(n)]
    count = np.zeros(n, int)
    for p in range(n):
        for q in range(n):
            if np.all(f[p] <= f[q]) and np.any(f[p] < f[q]):
                dominated[p].append(q)
            elif np.all(f[q] <= f[p]) and np.any(f[q] < f[p]):
                count[p] += 1
    rank = np.full(n, -1)
    front, i = [p for p in range(n) if count[p] == 0], 0
    while front:
        nxt = []
        for p in front:
            rank[p] = i
            for q in dominated[p]:
                count[q] -= 1
                if count[q] == 0:
                    nxt.append(q)
        front, i = nxt, i + 1
    return rank


def _crowding_reference(f, rank):
    """Crowding distance front by front; rows of a front sorted stably by each objective."""
    dist = np.zeros(len(f))
    for r in np.unique(rank):
        members = np.flatnonzero(rank == r)
        for m in range(f.shape[1]):
            order = members[np.argsort(f[members, m], kind="stable")]
            values = f[order, m]
            span = values[-1] - values[0]
            dist[order[0]] = dist[order[-1]] = np.inf
            for j in range(1, len(order) - 1):
                if span > 0:
                    dist[order[j]] += (values[j + 1] - values[j - 1]) / span
    return dist


_rng = np.random.default_rng(0)
SETS = {
    "random": _rng.random((40, 2)),
    "random_3d": _rng.random((30, 3)),
    "ties": np.round(_rng.random((40, 2)) * 4) / 4,  # many equal values, equal points
    "duplicates": np.repeat(_rng.random((8, 2)), 3, axis=0),
    "single_front": np.stack([np.linspace(0, 1, 12), 1 - np.linspace(0, 1, 12) ** 2], 1),
    "all_dominated": np.stack([np.arange(10.0), np.arange(10.0)], 1)[::-1],  # a chain
    # two objectives' sorted sweep: many fronts, equal rows, equal values in one objective
    "grid": np.round(_rng.random((150, 2)) * 6) / 6,
}


@pytest.mark.parametrize("name", list(SETS))
def test_ranks_and_crowding_equal_direct_numpy(name):
    f = SETS[name].astype(np.float32)
    rank = np.asarray(jax.jit(nondominated_ranks)(jnp.asarray(f)))
    np.testing.assert_array_equal(rank, _ranks_reference(f))
    crowd = np.asarray(jax.jit(crowding_distance)(jnp.asarray(f), jnp.asarray(rank)))
    np.testing.assert_allclose(crowd, _crowding_reference(f, rank), rtol=1e-6)
    if name == "single_front":
        assert (rank == 0).all()
    if name == "all_dominated":
        np.testing.assert_array_equal(rank, np.arange(10)[::-1])
        assert np.isinf(crowd).all()  # every front is one point: its own extreme


def test_ranks_stop_peeling_once_enough_are_ranked():
    f = jnp.asarray(SETS["all_dominated"], jnp.float32)
    rank = np.asarray(nondominated_ranks(f, needed=3))
    np.testing.assert_array_equal(np.sort(rank)[:3], [0, 1, 2])
    assert (np.sort(rank)[3:] == 10).all()  # unranked rows get n


# --- hypervolume and IGD -------------------------------------------------------------------


def test_hypervolume_of_small_fronts_by_hand():
    f = jnp.asarray([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    # staircase under (4, 4): 3x1 + 2x1 + 1x1
    assert float(hypervolume(f, jnp.asarray([4.0, 4.0]))) == pytest.approx(6.0)
    # a dominated point and one beyond the reference add nothing
    more = jnp.asarray([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [3.0, 3.0], [5.0, 0.0]])
    assert float(hypervolume(more, jnp.asarray([4.0, 4.0]))) == pytest.approx(6.0)
    # masked rows count for nothing
    mask = jnp.asarray([True, False, False, False, False])
    assert float(hypervolume(more, jnp.asarray([4.0, 4.0]), mask)) == pytest.approx(3.0)
    # 3 objectives (moocore): two unit-offset boxes under (2, 2, 2), overlapping in 1 unit
    f3 = jnp.asarray([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    assert float(jax.jit(hypervolume)(f3, jnp.asarray([2.0, 2.0, 2.0]))) == pytest.approx(3.0)
    # one objective: the distance from the best to the reference
    assert float(hypervolume(jnp.asarray([[3.0], [1.0]]), jnp.asarray([4.0]))) == 3.0


def test_hypervolume_2d_equals_moocore():
    rng = np.random.default_rng(1)
    for _ in range(5):
        f = rng.random((50, 2)).astype(np.float32)
        ref = np.array([0.9, 0.95])
        ours = float(jax.jit(hypervolume)(jnp.asarray(f), jnp.asarray(ref, jnp.float32)))
        inside = f[np.all(f < ref, axis=1)]
        assert ours == pytest.approx(moocore.hypervolume(inside, ref=ref), rel=1e-5)


def test_igd_and_igd_plus_by_hand_and_against_moocore():
    front = np.array([[0.0, 1.0], [1.0, 0.0]])
    points = np.array([[0.0, 2.0], [2.0, 0.0]])
    assert float(igd(jnp.asarray(points), front)) == pytest.approx(1.0)
    assert float(igd(jnp.asarray(points), front, plus=True)) == pytest.approx(1.0)
    # (0, 0.5) is better than (0, 1): IGD+ counts no distance there, 0.5 from (1, 0)
    better = np.array([[0.0, 0.5]])
    assert float(igd(jnp.asarray(better), front, plus=True)) == pytest.approx(0.25)
    assert float(igd(jnp.asarray(better), front)) == pytest.approx((0.5 + 1.25**0.5) / 2)
    rng = np.random.default_rng(2)
    a, z = rng.random((20, 3)), rng.random((30, 3))
    assert float(igd(jnp.asarray(a), z)) == pytest.approx(moocore.igd(a, ref=z), rel=1e-5)
    got = float(igd(jnp.asarray(a), z, plus=True))
    assert got == pytest.approx(moocore.igd_plus(a, ref=z), rel=1e-5)


# --- the problems -----------------------------------------------------------------------------


def test_problems_lie_on_their_fronts():
    t = make_mo_task("mo/zdt1", num_dims=5)
    for f1 in (0.0, 0.25, 1.0):
        f = np.asarray(t.objectives(jnp.asarray([f1, 0, 0, 0, 0.0])))
        np.testing.assert_allclose(f, [f1, 1 - np.sqrt(f1)], atol=1e-6)
    f = np.asarray(make_mo_task("mo/zdt2", num_dims=3).objectives(jnp.asarray([0.5, 0, 0.0])))
    np.testing.assert_allclose(f, [0.5, 0.75], atol=1e-6)
    t = make_mo_task("mo/dtlz2", num_objectives=3)
    x = jnp.concatenate([jnp.asarray([0.3, 0.8]), jnp.full(t.num_dims - 2, 0.5)])
    assert float(jnp.sum(t.objectives(x) ** 2)) == pytest.approx(1.0, rel=1e-5)
    t = make_mo_task("mo/dtlz1", num_objectives=4)
    x = jnp.concatenate([jnp.asarray([0.3, 0.8, 0.1]), jnp.full(t.num_dims - 3, 0.5)])
    assert float(jnp.sum(t.objectives(x))) == pytest.approx(0.5, rel=1e-5)
    for name in ("mo/zdt1", "mo/zdt3", "mo/dtlz1", "mo/dtlz2"):
        front = make_mo_task(name).pareto_front()
        assert front.shape[0] >= 100 and np.isfinite(front).all(), name
    assert das_dennis(12, 3).shape == (91, 3)
    np.testing.assert_allclose(das_dennis(4, 3).sum(axis=1), 1.0)


def test_variation_stays_in_bounds():
    key = jax.random.key(0)
    a = jax.random.uniform(jax.random.key(1), (64, 5))
    b = jax.random.uniform(jax.random.key(2), (64, 5))
    c1, c2 = sbx(key, a, b, 0.0, 1.0, 15.0, 1.0)
    m = polynomial_mutation(key, c1, 0.0, 1.0, 20.0, 0.5)
    for x in (c1, c2, m):
        assert bool(jnp.all((x >= 0) & (x <= 1)))
    # per variable, SBX keeps the parents' mean (before clipping at the bounds)
    assert not np.allclose(c1, a) and not np.allclose(m, c1)


# --- vector fitness through the engine ---------------------------------------------------------


def test_worst_for_nonfinite_fails_a_whole_candidate():
    fit = np.asarray([[1.0, 5.0], [np.nan, 0.0], [3.0, 2.0]], np.float32)
    clean, n = jax.device_get(engine.worst_for_nonfinite(jnp.asarray(fit)))
    assert int(n) == 1
    np.testing.assert_array_equal(clean[[0, 2]], fit[[0, 2]])
    assert (clean[1] > fit[[0, 2]].max(axis=0)).all()  # every finite candidate dominates it
    np.testing.assert_array_equal(
        engine.to_minimization(jnp.asarray([[1.0, 2.0]]), (True, False)), [[-1.0, 2.0]]
    )


@pytest.mark.parametrize("n", [1, 4])
def test_vector_scores_through_the_one_evaluator(n):
    """Per-objective statistics over the real, finite candidates, whatever the padding."""
    scores = np.asarray(
        [[1.0, 10.0], [2.0, np.inf], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0], [np.nan, 1.0]],
        np.float32,
    )

    def fn(x, key):
        del key
        return x, EvalInfo(steps=jnp.int32(1), episodes=jnp.int32(1)), None

    summary, _ = jax.jit(lambda c, k: engine.evaluate(fn, c, k, make_mesh(n), (True, False)))(
        jnp.asarray(scores), jax.random.key(0)
    )
    assert summary.scores.shape == (8 if n == 4 else 6, 2)
    assert int(summary.num_nonfinite) == 2
    np.testing.assert_allclose(summary.best, [5.0, 1.0])  # objective 0 maximised, 1 minimised
    np.testing.assert_allclose(summary.worst, [1.0, 50.0])
    np.testing.assert_allclose(summary.mean, [3.0, 131 / 5])
    assert int(summary.info.steps) == 6
    metrics = summary.metrics()
    assert metrics["fitness_best"] == 5.0 and metrics["fitness_best_1"] == 1.0
    fitness = summary.fitness(6)
    assert fitness.shape == (6, 2) and bool(jnp.all(jnp.isfinite(fitness)))


def test_a_scalar_strategy_refuses_several_objectives():
    with pytest.raises(ConfigError, match="task: 'mo/zdt1' has several objectives.*nsga2"):
        ES(ESConfig(task="mo/zdt1"))
    with pytest.raises(ValueError, match="2 objectives"):
        engine.Engine(ES(ESConfig(task="sphere")).strategy, make_task("mo/zdt1", num_dims=10))
    with pytest.raises(ConfigError, match="ref_point"):
        NSGA2Config(task="mo/zdt1", ref_point=(1.0,)).validate()
    with pytest.raises(ConfigError, match="num_objectives"):
        NSGA2Config(task="sphere", num_objectives=2).validate()
    with pytest.raises(ConfigError, match="task"):
        NSGA2Config(task="mo/zdt9").validate()


# --- NSGA-II ---------------------------------------------------------------------------------


def _run(n: int, generations: int = 3, **overrides):
    config = NSGA2Config(**{"task": "mo/zdt1", "population_size": 6, "num_dims": 4, **overrides})
    algo = NSGA2(config, mesh=make_mesh(n))
    state = jax.jit(algo.init)(jax.random.key(0))
    step = jax.jit(algo.step)
    history = []
    for g in range(generations):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


def test_nsga2_same_run_on_1_2_and_4_devices():
    """6 members: padded to 8 on 4 devices; every state leaf equal, metrics too."""
    runs = {n: _run(n, generations=2) for n in (1, 2, 4)}
    state1, history1 = runs[1]
    for n in (2, 4):
        state, history = runs[n]
        for a, b in zip(jax.tree.leaves(state1), jax.tree.leaves(state), strict=True):
            np.testing.assert_array_equal(a, b)
        for m1, m in zip(history1, history, strict=True):
            for name in m1:
                np.testing.assert_allclose(m[name], m1[name], rtol=1e-6, err_msg=name)
    last = history1[-1]
    assert 1 <= last["front_size"] <= 6
    assert last["igd_plus"] <= last["igd"] + 1e-6
    # the hypervolume metric is moocore's of the survivors' front (ZDT1's reference 1.1)
    s = state1.strategy_state
    front = np.asarray(s.fitness)[np.asarray(s.rank) == 0]
    assert last["front_size"] == len(front)
    inside = front[np.all(front < 1.1, axis=1)]
    want = moocore.hypervolume(inside, ref=np.full(2, 1.1)) if len(inside) else 0.0
    assert float(last["hypervolume"]) == pytest.approx(want, rel=1e-5)
    # survivors: sorted by front, each front's rows by decreasing crowding
    rank, crowd = np.asarray(state1.strategy_state.rank), np.asarray(state1.strategy_state.crowding)
    assert (np.diff(rank) >= 0).all()
    same = rank[1:] == rank[:-1]
    assert (crowd[:-1][same] >= crowd[1:][same]).all()


def test_nsga2_hypervolume_rises_over_a_run():
    """From a random start on ZDT1, the front's hypervolume grows, and it is never above the
    true front's (2/3 + 1.1**2 - 1 = 0.8767 for the reference point 1.1)."""
    _, history = _run(1, generations=12, population_size=8)
    hv = np.asarray([float(m["hypervolume"]) for m in history])
    assert hv[-1] > hv[0] + 0.05, hv
    assert (hv <= 1.21 - 1 / 3 + 1e-6).all(), hv


class _FailsOnHalf:
    """ZDT1 whose candidates with x0 > 0.5 score NaN in one objective: a user's own task."""

    name, num_dims, num_objectives, maximize = "half-nan", 4, 2, (False, False)
    bounds = (0.0, 1.0)
    ref_point = (1.1, 1.1)

    def init_solution(self, key):
        return jnp.full(4, 0.5)

    def init_state(self):
        return ()

    def update_state(self, task_state, info):
        return task_state

    def evaluate(self, x, key, task_state):
        f = make_mo_task("mo/zdt1", num_dims=4).objectives(x)
        f = f.at[1].set(jnp.where(x[0] > 0.5, jnp.nan, f[1]))
        return f, EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))


def test_nsga2_on_a_task_of_its_own_with_failed_candidates():
    """Candidates with a NaN objective are counted and never survive ahead of finite ones."""
    algo = NSGA2(NSGA2Config(population_size=8), mesh=make_mesh(2), task=_FailsOnHalf())
    state = jax.jit(algo.init)(jax.random.key(0))
    state, metrics = jax.jit(algo.step)(state, jax.random.key(1))
    s = jax.device_get(state.strategy_state)
    failed = np.asarray(s.population)[:, 0] > 0.5
    assert metrics["num_nonfinite"] > 0 and np.isfinite(s.fitness).all()
    assert not failed[s.rank == 0].any() and "hypervolume" in metrics and "igd" not in metrics


@pytest.mark.slow
def test_nsga2_same_run_on_8_devices():
    """6 members on 8 devices: two padded slots; the same state as on one device."""
    one, eight = _run(1, generations=2), _run(8, generations=2)
    for a, b in zip(jax.tree.leaves(one[0]), jax.tree.leaves(eight[0]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _rows(run) -> dict:
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


def test_nsga2_resume_equals_uninterrupted_and_exports_the_front(tmp_path):
    common = ["-a", "nsga2", "--task", "mo/zdt1", "--pop", "12", "--set", "num_dims=5"]
    common += ["--chunk", "2", "--devices", "2", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *common, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *common, "-g", "4", "--out", str(whole)]) == 0
    resumed, uninterrupted = _rows(run), _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 4
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    for folder in (run, whole):
        assert (folder / "front.png").stat().st_size > 0
        assert (folder / "hypervolume.png").stat().st_size > 0
    with open(whole / "front.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:4] == ["index", "f0", "f1", "born"] and "x4" in rows[0]
    assert len(rows) == uninterrupted["front_size"][-1]
    with open(run / "front.csv") as f:
        assert list(csv.DictReader(f)) == rows


@pytest.mark.slow
def test_nsga2_learns_zdt1_front():
    """ZDT1 (30 variables), population 100: IGD below 0.02 within 200 generations
    (20,000 evaluations); pymoo's NSGA-II reaches about 0.01 there."""
    config = NSGA2Config(task="mo/zdt1", population_size=100)
    algo = NSGA2(config, mesh=make_mesh(2))

    def run(key):
        state = algo.init(key)

        def body(state, g):
            return algo.step(state, jax.random.fold_in(key, g))

        state, metrics = jax.lax.scan(body, state, jnp.arange(200))
        return metrics

    metrics = jax.device_get(jax.jit(run)(jax.random.key(0)))
    assert metrics["igd"][-1] < 0.02, metrics["igd"][::20]
    assert metrics["hypervolume"][-1] > 0.85  # the front's: 1.21 - 1/3 = 0.8767
    assert metrics["front_size"][-1] == 100


# --- NSGA-III --------------------------------------------------------------------------------


def test_nsga3_association_and_partitions_by_hand():
    from evorl_pop.algorithms.nsga3 import associate, default_partitions

    directions = jnp.asarray(das_dennis(2, 2))  # (0, 1), (0.5, 0.5), (1, 0)
    points = jnp.asarray([[0.1, 2.0], [1.0, 1.2], [3.0, 0.0]])
    niche, distance = associate(points, directions)
    np.testing.assert_array_equal(niche, [0, 1, 2])
    np.testing.assert_allclose(distance, [0.1, 0.2 / np.sqrt(2), 0.0], atol=1e-5)
    assert default_partitions(92, 3) == 12 and default_partitions(91, 3) == 12
    assert default_partitions(90, 3) == 11 and default_partitions(4, 1) == 1


def test_nsga3_same_run_on_1_and_4_devices_and_moocore_hypervolume():
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config

    states = []
    for n in (1, 4):
        config = NSGA3Config(task="mo/dtlz2", population_size=6, num_dims=4)
        algo = NSGA3(config, mesh=make_mesh(n))
        state, step = jax.jit(algo.init)(jax.random.key(0)), jax.jit(algo.step)
        for g in range(2):
            state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        states.append(jax.device_get(state))
    for a, b in zip(*map(jax.tree.leaves, states), strict=True):
        np.testing.assert_array_equal(a, b)
    s = states[0].strategy_state
    rank = np.asarray(s.rank)
    assert (np.diff(rank) >= 0).all()
    # 3 objectives: the hypervolume metric is moocore's of the front
    front = np.asarray(s.fitness)[rank == 0]
    inside = front[np.all(front < 1.1, axis=1)]
    want = moocore.hypervolume(inside, ref=np.full(3, 1.1)) if len(inside) else 0.0
    assert float(metrics["hypervolume"]) == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
def test_nsga3_learns_dtlz2_front():
    """DTLZ2 with 3 objectives (12 variables), population 92 (91 directions): IGD below
    0.06 within 100 generations, better than NSGA-II's there (about 0.08)."""
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config

    algo = NSGA3(NSGA3Config(), mesh=make_mesh(2))

    def run(key):
        state = algo.init(key)
        body = lambda s, g: algo.step(s, jax.random.fold_in(key, g))  # noqa: E731
        return jax.lax.scan(body, state, jnp.arange(100))[1]

    metrics = jax.device_get(jax.jit(run)(jax.random.key(0)))
    assert metrics["igd"][-1] < 0.06, metrics["igd"][::10]
    assert metrics["front_size"][-1] == 92


# --- multi-objective brax tasks: the reward's terms, against brax's own metrics -----------


def _brax_reference(task, solution, key):
    """Each objective by hand: brax's environment stepped in a Python loop, its metrics
    (the torso's z for the height) summed until it falls or the episode's length."""
    import brax.envs

    env = brax.envs.get_environment(task.spec.name.removeprefix("brax/"), backend=task.backend)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    act = jax.jit(task.policy)
    params = task.params(solution)
    sums = np.zeros(task.num_objectives)
    state = reset(jax.random.split(jax.random.split(key, 1)[0])[1])
    for _ in range(task.episode_length):
        state = step(state, act(params, state.obs))
        for i, name in enumerate(task.objective_names):
            term = state.pipeline_state.x.pos[0, 2] if name == "height" else state.metrics[name]
            sums[i] += float(term)
        if float(state.done) > 0:
            break
    return sums


@pytest.mark.parametrize(
    "name",
    # the same summing for every task: one in the long tier, the others exhaustive
    [pytest.param("mo/halfcheetah", marks=pytest.mark.slow)]
    + [pytest.param(n, marks=pytest.mark.exhaustive) for n in ("mo/hopper3", "mo/ant")],
)
def test_mo_brax_objectives_equal_brax_metrics_summed_by_hand(name):
    task = make_task(name, episode_length=15, hidden_sizes=(4,))
    solution = task.init_solution(jax.random.key(3)) * 3.0  # large weights: falls, big actions
    key = jax.random.key(4)
    objectives, info = jax.jit(task.evaluate)(solution, key, ())
    # the same float32 physics compiled in one scan against step by step: contacts round
    # differently (a relative 1e-4 over 15 of ant's steps; one step's term is over 1e-2)
    np.testing.assert_allclose(objectives, _brax_reference(task, solution, key), rtol=1e-3)
    assert task.maximize == (True,) * task.num_objectives
    assert 1 <= int(info.steps) <= 15 and int(info.episodes) == 1
    # the reference point: no policy does worse (zero forward and height; full actions' cost)
    assert len(task.ref_point) == task.num_objectives


def test_mo_brax_names_and_settings_are_checked():
    with pytest.raises(ValueError, match="mo/halfcheetah"):
        make_task("mo/halfcheeta")
    with pytest.raises(ValueError, match="num_dims"):
        make_task("mo/hopper", num_dims=3)
    with pytest.raises(ConfigError, match="ref_point"):
        NSGA2Config(task="mo/zdt1", ref_point=(1.0, 1.0, 1.0)).validate()


def _brax_nsga2(n):
    config = NSGA2Config(
        task="mo/halfcheetah", population_size=8, hidden_sizes=(4,), episode_length=10
    )
    algo = NSGA2(config, mesh=make_mesh(n))
    state = jax.jit(algo.init)(jax.random.key(0))
    step = jax.jit(algo.step)
    history = []
    for g in range(2):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


@pytest.mark.exhaustive
def test_nsga2_on_mo_halfcheetah_same_run_on_1_and_2_devices():
    (state1, history1), (state2, history2) = _brax_nsga2(1), _brax_nsga2(2)
    s1, s2 = state1.strategy_state, state2.strategy_state
    # the same members, fronts and order on either device count; the returns themselves
    # differ in the last bits (a batch of 8 or 4 episodes vectorises the physics
    # differently), which halfcheetah's contacts amplify to about 1e-5 of a return
    for name in ("population", "rank", "born"):
        np.testing.assert_array_equal(getattr(s2, name), getattr(s1, name), err_msg=name)
    np.testing.assert_allclose(s2.fitness, s1.fitness, rtol=1e-3, atol=1e-4)
    for m1, m2 in zip(history1, history2, strict=True):
        for name in m1:
            np.testing.assert_allclose(m2[name], m1[name], rtol=1e-3, err_msg=name)
    last = history1[-1]
    assert last["env_steps"] == 8 * 10 and last["hypervolume"] >= 0
    # the front's hypervolume against the task's reference point, by moocore
    s = state1.strategy_state
    front = -np.asarray(s.fitness)[np.asarray(s.rank) == 0]  # maximised objectives
    ref = np.asarray(make_task("mo/halfcheetah", episode_length=10).ref_point)
    expected = moocore.hypervolume(-front, ref=-ref)
    np.testing.assert_allclose(last["hypervolume"], expected, rtol=1e-4)


def test_list_shows_every_multi_objective_and_qd_task(capsys):
    from evorl_pop.tasks.multiobjective import mo_task_names
    from evorl_pop.tasks.qd import QD_TASKS

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "multi-objective tasks" in out and "quality-diversity tasks" in out
    names = [*mo_task_names(), *QD_TASKS]
    assert {"mo/halfcheetah", "mo/hopper3", "mo/ant", "mo/zdt1"} <= set(names)
    missing = [name for name in names if name not in out.replace(",", " ").split()]
    assert not missing
