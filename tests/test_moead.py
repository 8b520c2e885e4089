"""MOEA/D: its scalarising functions by hand, its scanned replacement step against a
sequential NumPy loop, the same run on 1, 2 and 4 devices, an exact resume."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.moead import (
    MOEAD,
    MOEADConfig,
    MOEADState,
    neighbourhoods,
    pbi,
    replace,
    tchebycheff,
)
from evorl_pop.base import ConfigError
from evorl_pop.run import store
from evorl_pop.tasks.multiobjective import das_dennis


def test_tchebycheff_and_pbi_by_hand():
    f = jnp.asarray([[3.0, 1.0], [0.5, 2.5]])
    w = jnp.asarray([[0.25, 0.75], [0.0, 1.0]])
    z = jnp.asarray([1.0, 0.5])
    # row 0: max(0.25 * 2, 0.75 * 0.5) = 0.5; row 1: max(1e-6 * 0.5, 1 * 2) = 2
    np.testing.assert_allclose(tchebycheff(f, w, z), [0.5, 2.0], rtol=1e-6)
    # row 0: t = (2, 0.5), u = (1, 3) / sqrt(10): d1 = 3.5 / sqrt(10),
    # t - d1 u = (2 - 0.35, 0.5 - 1.05) = (1.65, -0.55): d2 = 0.55 sqrt(10)
    # row 1: t = (-0.5, 2), u = (0, 1): d1 = 2, d2 = 0.5
    want = [3.5 / np.sqrt(10) + 5 * 0.55 * np.sqrt(10), 2.0 + 5 * 0.5]
    np.testing.assert_allclose(pbi(f, w, z), want, rtol=1e-6)
    np.testing.assert_allclose(pbi(f, w, z, theta=0.0), [3.5 / np.sqrt(10), 2.0], rtol=1e-6)


def test_neighbourhoods_are_the_nearest_weights_self_first():
    w = das_dennis(5, 2)  # (0, 1), (0.2, 0.8), ..., (1, 0)
    b = neighbourhoods(w, 3)
    np.testing.assert_array_equal(b[0], [0, 1, 2])
    assert b[2][0] == 2 and set(b[2][1:]) == {1, 3}  # equally near
    np.testing.assert_array_equal(b[5], [5, 4, 3])
    ring = neighbourhoods(np.ones((6, 1)), 3)  # one objective: the nearest indices
    np.testing.assert_array_equal(ring[3], [3, 2, 4])


def _replace_numpy(pop, fit, born, ideal, children, child_fit, order, w, b, limit, g):
    """Zhang and Li's update, one offspring after another, as plain loops."""
    pop, fit, born, ideal = pop.copy(), fit.copy(), born.copy(), ideal.copy()
    for i in range(len(children)):
        ideal = np.minimum(ideal, child_fit[i])
        replaced = 0
        for j in b[i][order[i]]:
            if replaced == limit:
                break
            if g(child_fit[i][None], w[j][None], ideal) <= g(fit[j][None], w[j][None], ideal):
                pop[j], fit[j], born[j] = children[i], child_fit[i], 7
                replaced += 1
    return pop, fit, born, ideal


def _numpy_tchebycheff(f, w, z):
    return np.max(np.where(w > 0, w, 1e-6) * np.abs(f - z), axis=-1)[0]


def _numpy_pbi(f, w, z):
    u = w / np.linalg.norm(w, axis=-1, keepdims=True)
    d1 = np.abs(np.sum((f - z) * u, axis=-1))
    return (d1 + 5 * np.linalg.norm(f - z - d1[:, None] * u, axis=-1))[0]


@pytest.mark.parametrize("limit", [1, 2, 4])
@pytest.mark.parametrize("name", ["tchebycheff", "pbi"])
def test_replacement_scan_equals_the_sequential_loop(name, limit):
    rng = np.random.default_rng(3)
    n, t, dims = 8, 4, 3
    w = das_dennis(n - 1, 2)
    b = neighbourhoods(w, t)
    pop, children = rng.uniform(size=(n, dims)), rng.uniform(size=(n, dims))
    fit, child_fit = rng.uniform(0.2, 1.0, (n, 2)), rng.uniform(0.1, 1.3, (n, 2))
    born = np.zeros(n, np.int32)
    ideal = fit.min(axis=0)
    order = np.stack([rng.permutation(t) for _ in range(n)])
    g_np = _numpy_tchebycheff if name == "tchebycheff" else _numpy_pbi
    want = _replace_numpy(pop, fit, born, ideal, children, child_fit, order, w, b, limit, g_np)
    state = MOEADState(
        population=jnp.asarray(pop),
        fitness=jnp.asarray(fit),
        rank=jnp.zeros(n, jnp.int32),
        crowding=jnp.zeros(n),
        born=jnp.asarray(born),
        generation=jnp.int32(6),
        ideal=jnp.asarray(ideal),
    )
    g = tchebycheff if name == "tchebycheff" else pbi
    got = replace(state, children, child_fit, order, w, b, limit, g)
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), e, rtol=1e-6)
    assert 0 < (want[2] == 7).sum() < n  # some members replaced, not all


def _run(n: int, generations: int = 2, **overrides):
    settings = {"task": "mo/zdt1", "population_size": 6, "num_dims": 4, "neighbours": 3}
    algo = MOEAD(MOEADConfig(**{**settings, **overrides}), mesh=make_mesh(n))
    state = jax.jit(algo.init)(jax.random.key(0))
    step = jax.jit(algo.step)
    history = []
    for g in range(generations):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


def test_moead_same_run_on_1_2_and_4_devices():
    """6 subproblems, padded to 8 on 4 devices: every state leaf equal, metrics too."""
    settings = {"neighbour_prob": 0.7, "max_replacements": 2}
    runs = {n: _run(n, **settings) for n in (1, 2, 4)}
    state1, history1 = runs[1]
    for n in (2, 4):
        state, history = runs[n]
        for a, b in zip(jax.tree.leaves(state1), jax.tree.leaves(state), strict=True):
            np.testing.assert_array_equal(a, b)
        for m1, m in zip(history1, history, strict=True):
            for name in m1:
                np.testing.assert_allclose(m[name], m1[name], rtol=1e-6, err_msg=name)
    s = state1.strategy_state
    fitness = np.asarray(s.fitness)
    np.testing.assert_array_equal(s.ideal <= fitness.min(axis=0), True)
    dominated = [any((g <= f).all() and (g < f).any() for g in fitness) for f in fitness]
    np.testing.assert_array_equal(s.rank, np.asarray(dominated, np.int32))
    assert history1[-1]["front_size"] == 6 - sum(dominated)
    assert history1[-1]["evaluations"] == 6


def test_moead_config_is_checked():
    for bad in (
        {"decomposition": "weighted"},
        {"neighbours": 1},
        {"neighbour_prob": 1.5},
        {"max_replacements": 0},
        {"pbi_theta": -1.0},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            MOEADConfig(**bad).validate()


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _rows(run) -> dict:
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


@pytest.mark.slow  # three compiled runs of the command
def test_moead_resume_equals_uninterrupted(tmp_path):
    common = ["-a", "moead", "--task", "mo/zdt1", "--pop", "8", "--set", "num_dims=5"]
    common += ["--set", "neighbours=3", "--set", "decomposition=pbi"]
    common += ["--chunk", "2", "--devices", "2", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *common, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *common, "-g", "4", "--out", str(whole)]) == 0
    resumed, uninterrupted = _rows(run), _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 4
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    assert (run / "front.csv").read_text() == (whole / "front.csv").read_text()


@pytest.mark.exhaustive  # brax's physics compiles for minutes on a CPU
@pytest.mark.parametrize("algorithm", ["moead", "rvea"])
def test_hypervolume_rises_on_mo_halfcheetah(algorithm):
    """mo/halfcheetah at the example's settings, briefly (population 32, 8 generations of
    100-step episodes): the front's hypervolume ends above where it started. MOEA/D
    with 8 neighbours and at most 2 replacements: the objectives' scales differ by
    orders of magnitude, and a child replacing its whole neighbourhood floods a small
    population (one generation of the defaults leaves a single member's copies)."""
    from evorl_pop.algorithms.rvea import RVEA, RVEAConfig

    settings = {
        "task": "mo/halfcheetah",
        "population_size": 32,
        "hidden_sizes": (16, 16),
        "bounds": (-10.0, 10.0),
        "episode_length": 100,
    }
    if algorithm == "moead":
        config = MOEADConfig(**settings, neighbours=8, max_replacements=2)
        algo = MOEAD(config, mesh=make_mesh(1))
    else:
        algo = RVEA(RVEAConfig(**settings, max_generations=8), mesh=make_mesh(1))

    def run(key):
        state = algo.init(key)
        body = lambda s, g: algo.step(s, jax.random.fold_in(key, g))  # noqa: E731
        return jax.lax.scan(body, state, jnp.arange(8))[1]

    hv = np.asarray(jax.device_get(jax.jit(run)(jax.random.key(0)))["hypervolume"])
    assert hv[-1] > hv[0] > 0, hv
