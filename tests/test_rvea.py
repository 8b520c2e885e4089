"""RVEA: its angle-penalised selection and the vectors' adaptation against a NumPy
transcription of Cheng et al.'s equations, the same run on 1, 2 and 4 devices, an
exact resume."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.rvea import RVEA, RVEAConfig, RVEAStrategy, adapt, apd_select
from evorl_pop.base import ConfigError
from evorl_pop.run import store
from evorl_pop.tasks.multiobjective import das_dennis


def _apd_numpy(f, alive, v, penalty):
    """Cheng et al. (2016), equations (5) to (9), one vector at a time."""
    k = f.shape[1]
    z = f[alive].min(axis=0)
    t = f - z
    norms = np.linalg.norm(t, axis=1)
    cos = (t / np.maximum(norms, 1e-12)[:, None]) @ v.T
    gamma = []
    for i in range(len(v)):
        others = [v[i] @ v[j] for j in range(len(v)) if j != i]
        gamma.append(np.arccos(max(others)))
    chosen, filled = [], []
    for j in range(len(v)):
        members = [i for i in range(len(f)) if alive[i] and np.argmax(cos[i]) == j]
        filled.append(bool(members))
        if not members:
            chosen.append(None)
            continue
        apd = [
            (1 + k * penalty * np.arccos(min(cos[i, j], 1.0)) / gamma[j]) * norms[i]
            for i in members
        ]
        chosen.append(members[int(np.argmin(apd))])
    return chosen, np.asarray(filled)


@pytest.mark.parametrize("penalty", [0.0, 0.3, 1.0])
def test_apd_selection_equals_the_numpy_transcription(penalty):
    rng = np.random.default_rng(5)
    v = das_dennis(3, 3)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    f = rng.uniform(0.0, 1.0, (14, 3)) ** 2
    alive = np.ones(14, bool)
    alive[[2, 9]] = False
    want, filled = _apd_numpy(f, alive, v, penalty)
    chosen, got_filled = apd_select(jnp.asarray(f), jnp.asarray(alive), jnp.asarray(v), penalty)
    np.testing.assert_array_equal(got_filled, filled)
    assert 0 < filled.sum() < len(v)  # some vectors empty, some not
    for j, i in enumerate(want):
        if i is not None:
            assert int(chosen[j]) == i, (j, int(chosen[j]), i)


def test_vector_adaptation_equals_the_numpy_transcription():
    rng = np.random.default_rng(6)
    v0 = das_dennis(4, 3)
    v0 = v0 / np.linalg.norm(v0, axis=1, keepdims=True)
    f = rng.uniform(0.0, 1.0, (10, 3)) * np.asarray([1.0, 5.0, 20.0])
    valid = rng.uniform(size=10) < 0.7
    span = f[valid].max(axis=0) - f[valid].min(axis=0)
    want = v0 * span
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    got = adapt(jnp.asarray(v0), jnp.asarray(f), jnp.asarray(valid))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_tell_adapts_every_adapt_every_generations():
    """A tell at generation 3 with adapt_every 3 adapts to the survivors' ranges; at 2 not."""
    strategy = RVEAStrategy(6, 2, das_dennis(3, 3), adapt_every=3, max_generations=10)
    key = jax.random.key(0)
    x = jax.random.uniform(key, (6, 2))
    f = jax.random.uniform(jax.random.key(1), (6, 3)) * jnp.asarray([1.0, 4.0, 9.0])
    state = strategy.init(key, x, f)
    for generation, due in ((1, False), (2, True)):
        start = state.replace(generation=jnp.int32(generation))
        new, _ = jax.jit(strategy.tell)(key, x + 0.1, f[::-1] * 1.5, start)
        want = adapt(jnp.asarray(strategy.directions), new.fitness, new.valid)
        vectors = want if due else start.vectors
        np.testing.assert_allclose(new.vectors, vectors, rtol=1e-6)
    assert not np.allclose(want, strategy.directions)


def _run(n: int, generations: int = 2):
    settings = {"task": "mo/dtlz2", "population_size": 6, "num_dims": 4, "max_generations": 4}
    algo = RVEA(RVEAConfig(**settings, adapt_fraction=0.5), mesh=make_mesh(n))
    state = jax.jit(algo.init)(jax.random.key(0))
    step = jax.jit(algo.step)
    history = []
    for g in range(generations):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


def test_rvea_same_run_on_1_2_and_4_devices():
    """6 offspring, padded to 8 on 4 devices, 6 vectors adapted at generation 2: every
    state leaf equal, metrics too."""
    runs = {n: _run(n) for n in (1, 2, 4)}
    state1, history1 = runs[1]
    for n in (2, 4):
        state, history = runs[n]
        for a, b in zip(jax.tree.leaves(state1), jax.tree.leaves(state), strict=True):
            np.testing.assert_array_equal(a, b)
        for m1, m in zip(history1, history, strict=True):
            for name in m1:
                np.testing.assert_allclose(m[name], m1[name], rtol=1e-6, err_msg=name)
    s = state1.strategy_state
    valid, fitness = np.asarray(s.valid), np.asarray(s.fitness)
    assert history1[-1]["front_size"] == (np.asarray(s.rank) == 0).sum() <= valid.sum()
    np.testing.assert_array_equal(np.asarray(s.rank)[~valid], 2)
    span = fitness[valid].max(axis=0) - fitness[valid].min(axis=0)
    direction = das_dennis(2, 3) / np.linalg.norm(das_dennis(2, 3), axis=1, keepdims=True)
    want = direction * span
    np.testing.assert_allclose(s.vectors, want / np.linalg.norm(want, axis=1, keepdims=True))


def test_rvea_config_is_checked():
    for bad in ({"max_generations": 0}, {"adapt_fraction": 2.0}, {"alpha": -1.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RVEAConfig(**bad).validate()
    assert RVEAConfig(max_generations=25).adapt_every == 3


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _rows(run) -> dict:
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


@pytest.mark.slow  # three compiled runs of the command
def test_rvea_resume_equals_uninterrupted(tmp_path):
    common = ["-a", "rvea", "--task", "mo/dtlz2", "--pop", "8", "--set", "num_dims=5"]
    common += ["--set", "max_generations=4", "--chunk", "2", "--devices", "2", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *common, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *common, "-g", "4", "--out", str(whole)]) == 0
    resumed, uninterrupted = _rows(run), _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 4
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    assert (run / "front.csv").read_text() == (whole / "front.csv").read_text()
