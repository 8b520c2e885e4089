"""NSGA-III's survival against a NumPy transcription of Deb and Jain (2014) with the
normalisation's memory across generations (as pymoo 0.6 keeps it): the hyperplane's
intercepts and their degenerate cases, association and niching; its run resumed
exactly."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli
from evorl_pop.algorithms.nsga3 import associate, niching, normalize, update_normalization
from evorl_pop.run import store
from evorl_pop.tasks.multiobjective import das_dennis

# --- the reference ------------------------------------------------------------------------


def _normalization_reference(f, front, ideal, worst, extremes):
    """Ideal and worst over every generation; each axis's extreme point minimising
    max_j t_j / w_j (w: 1 on the axis, 1e-6 elsewhere; t below 1e-3 read as 0) among the
    earlier extremes and the first front; the nadir from the hyperplane's intercepts,
    else the front's worst, and the population's worst where a range is too small."""
    k = f.shape[1]
    ideal = np.minimum(ideal, f.min(axis=0))
    worst = np.maximum(worst, f.max(axis=0))
    candidates = np.concatenate([extremes, f[front]])
    new = np.empty((k, k))
    for axis in range(k):
        best, where = np.inf, 0
        for row, point in enumerate(candidates):
            t = point - ideal
            t = np.where(t < 1e-3, 0.0, t)
            value = max(t[j] / (1.0 if j == axis else 1e-6) for j in range(k))
            if value < best:
                best, where = value, row
        new[axis] = candidates[where]
    try:
        plane = np.linalg.solve(new - ideal, np.ones(k))
        intercepts = 1.0 / plane
        if not np.allclose((new - ideal) @ plane, 1.0) or (intercepts <= 1e-6).any():
            raise np.linalg.LinAlgError
        nadir = np.minimum(ideal + intercepts, worst)
    except np.linalg.LinAlgError:
        nadir = f[front].max(axis=0)
    small = nadir - ideal <= 1e-6
    nadir[small] = f.max(axis=0)[small]
    return ideal, worst, new, nadir


def _fresh(k):
    return np.full(k, np.inf), np.full(k, -np.inf), np.full((k, k), np.inf)


def _front(f):
    return np.asarray([not any((g <= p).all() and (g < p).any() for g in f) for p in f])


_rng = np.random.default_rng(0)
_simplex = das_dennis(4, 3)
CASES = {
    # a linear front (DTLZ1's) above its ideal point, and dominated rows
    "plane": np.concatenate([0.5 * _simplex + 0.01, 0.6 + _rng.random((6, 3))]),
    # a concave front (DTLZ2's) with noise
    "sphere": _simplex / np.linalg.norm(_simplex, axis=1, keepdims=True)
    + _rng.random((15, 3)) * 1e-2,
    # one point extreme on two axes: the same extreme twice, a singular system
    "duplicate_extreme": np.asarray(
        [[0.0, 0.0, 1.0], [0.5, 0.5, 0.2], [0.2, 0.3, 0.6], [1.0, 0.0, 0.9]]
    )[[0, 1, 2]],
    # extremes whose plane crosses an axis below the ideal point: a negative intercept
    "negative_intercept": np.asarray(
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.9, 0.9, 0.1], [1.2, 1.2, 0.5]]
    ),
    # every row equal in one objective: a range of 0, the population's worst
    "flat_axis": np.stack([np.linspace(0, 1, 8), np.linspace(1, 0, 8), np.full(8, 0.3)], axis=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_normalization_equals_the_reference_over_two_generations(name):
    f = np.asarray(CASES[name], np.float64)
    front = _front(f)
    memory = _fresh(3)
    got_memory = tuple(jnp.asarray(m, jnp.float32) for m in memory)
    # the second generation: the same rows, moved; the memory from the first
    for f_now in (f, f * np.asarray([1.1, 0.9, 1.0]) + 0.02):
        front = _front(f_now)
        want = _normalization_reference(f_now, front, *memory)
        got = update_normalization(jnp.asarray(f_now, jnp.float32), jnp.asarray(front), *got_memory)
        for a, b, what in zip(got, want, ("ideal", "worst", "extremes", "nadir"), strict=True):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6, err_msg=what)
        memory, got_memory = want[:3], got[:3]


def test_degenerate_cases_take_their_fallbacks():
    """The cases are what they say, and ours takes the fallback: the first front's worst."""
    for name in ("duplicate_extreme", "negative_intercept"):
        f = CASES[name]
        front = _front(f)
        ideal, _, extremes, nadir = _normalization_reference(f, front, *_fresh(3))
        if name == "duplicate_extreme":
            assert len(np.unique(extremes, axis=0)) < 3
        else:
            assert (1.0 / np.linalg.solve(extremes - ideal, np.ones(3)) < 0).any()
        np.testing.assert_allclose(nadir, f[front].max(axis=0))
        memory = tuple(jnp.asarray(m, jnp.float32) for m in _fresh(3))
        got = update_normalization(jnp.asarray(f, jnp.float32), jnp.asarray(front), *memory)
        np.testing.assert_allclose(np.asarray(got[3]), f[front].max(axis=0), rtol=1e-6)
    f = CASES["plane"]  # the regular case: the intercepts of DTLZ1's plane, 0.5 each
    ideal, _, _, nadir = _normalization_reference(f, _front(f), *_fresh(3))
    np.testing.assert_allclose(nadir - ideal, 0.5, atol=1e-9)


def _niching_reference(rng, chosen, pool, niche, distance, num_niches, needed):
    count = np.bincount(niche[chosen], minlength=num_niches)
    pool, picked = pool.copy(), []
    while len(picked) < needed:
        open_ = np.unique(niche[pool])
        j = rng.choice(open_[count[open_] == count[open_].min()])
        members = np.flatnonzero(pool & (niche == j))
        pick = members[np.argmin(distance[members])] if count[j] == 0 else rng.choice(members)
        picked.append(pick)
        pool[pick] = False
        count[j] += 1
    return np.asarray(picked)


def test_niching_fills_the_least_crowded_directions_as_the_reference():
    """Directions (0, 1), (1/2, 1/2), (1, 0); two survivors in niche 0, one in niche 2:
    three to choose fill niche 1 (its nearest first), then niches 1 and 2 once more;
    never niche 0. The same per-niche counts and first pick as the reference, whatever
    the random ties."""
    directions = jnp.asarray(das_dennis(2, 2))
    points = np.asarray(
        [[0.0, 1.0], [0.02, 1.0], [1.0, 0.01], [0.5, 0.55], [0.5, 0.48], [0.6, 0.5]]
        + [[1.0, 0.05], [1.0, 0.1], [0.03, 1.0], [0.04, 1.0]]
    )
    chosen = np.asarray([1, 1, 1, 0, 0, 0, 0, 0, 0, 0], bool)
    niche, distance = associate(jnp.asarray(points), directions)
    niche, distance = np.asarray(niche), np.asarray(distance)
    np.testing.assert_array_equal(niche, [0, 0, 2, 1, 1, 1, 2, 2, 0, 0])
    for seed in range(4):
        want = _niching_reference(
            np.random.default_rng(seed), chosen, ~chosen, niche, distance, 3, 3
        )
        order = np.asarray(
            niching(
                jax.random.key(seed),
                jnp.asarray(chosen),
                jnp.asarray(~chosen),
                jnp.asarray(niche),
                jnp.asarray(distance),
                3,
                3,
            )
        )
        got = np.argsort(order)[:3]
        assert got[0] == want[0] == 4  # niche 1's nearest (0.5, 0.48)
        np.testing.assert_array_equal(
            np.bincount(niche[got], minlength=3), np.bincount(niche[want], minlength=3)
        )
        np.testing.assert_array_equal(np.bincount(niche[got], minlength=3), [0, 2, 1])


def test_normalize_and_associate_by_hand():
    ideal, nadir = jnp.asarray([1.0, 2.0]), jnp.asarray([3.0, 2.0])  # a range of 0: 1e-12
    got = normalize(jnp.asarray([[2.0, 2.0]]), ideal, nadir)
    np.testing.assert_allclose(got, [[0.5, 0.0]])
    niche, distance = associate(jnp.asarray([[3.0, 4.0]]), jnp.asarray([[1.0, 0.0], [0.5, 0.5]]))
    assert int(niche[0]) == 1 and float(distance[0]) == pytest.approx(np.sqrt(0.5), rel=1e-5)


# --- the run -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


@pytest.mark.slow
def test_nsga3_resume_equals_uninterrupted(tmp_path):
    """Train 2 generations and resume 2 more: every metric equal to 4 uninterrupted
    (the normalisation's memory travels in the checkpoint)."""
    common = ["-a", "nsga3", "--task", "mo/dtlz1", "--pop", "10", "--set", "ref_partitions=3"]
    common += ["--chunk", "2", "--devices", "2", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *common, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *common, "-g", "4", "--out", str(whole)]) == 0
    rows = [
        {k: v for k, v in store.read_metrics(r).items() if "time" not in k} for r in (run, whole)
    ]
    assert list(rows[0]) == list(rows[1]) and len(rows[1]["generation"]) == 4
    for column, values in rows[1].items():
        np.testing.assert_array_equal(rows[0][column], values, err_msg=column)


@pytest.mark.slow
def test_nsga3_same_run_on_1_2_and_4_devices():
    """10 members (padded to 12 on 4 devices), DTLZ1: every state leaf equal, the
    normalisation's memory among them (tests/test_mo.py checks 1 and 4 on DTLZ2)."""
    from evorl_pop import make_mesh
    from evorl_pop.algorithms.nsga3 import NSGA3, NSGA3Config

    states = []
    for n in (1, 2, 4):
        config = NSGA3Config(task="mo/dtlz1", population_size=10, ref_partitions=3)
        algo = NSGA3(config, mesh=make_mesh(n))
        state, step = jax.jit(algo.init)(jax.random.key(0)), jax.jit(algo.step)
        for g in range(3):
            state, _ = step(state, jax.random.fold_in(jax.random.key(1), g))
        states.append(jax.device_get(state))
    assert np.isfinite(np.asarray(states[0].strategy_state.extremes)).all()
    for other in states[1:]:
        for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(a, b)
