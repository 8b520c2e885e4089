"""MAP-Elites' ME-ES and CMA-ME emitters, against hand computations and references.

CMA-ME's ranking by archive improvement on a small batch by hand, and the incumbents
it reads from the sharded archive against NumPy; ME-ES's novelty against NumPy; the
restart rule and ME-ES's period; the same archive and emitter state on 1, 2 and 4
devices; exact resume; each emitter's coverage of the arm within a fixed budget.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.mapelites import MapElites, MapElitesConfig
from evorl_pop.algorithms.qd_emitters import CmaEmitterConfig, EsEmitterConfig, improvement_ranks
from evorl_pop.base import ConfigError
from evorl_pop.run import store

INF = np.inf


def test_improvement_ranks_by_hand():
    quality = jnp.asarray([1.0, 5.0, 2.0, 3.0, 0.5, 4.0, 9.0, 2.5, 1.5])
    incumbent = jnp.asarray([-INF, -INF, 1.0, 2.75, 1.0, 6.0, -INF, 2.5, 1.0])
    valid = jnp.asarray([True, True, True, True, True, True, False, True, True])
    ranks, improving = improvement_ranks(quality, incumbent, valid)
    # new cells by fitness: 1 (5.0), 0 (1.0); improved cells by the gain: 2 (+1.0),
    # 8 (+0.5), 3 (+0.25); the rest by the gain: 7 (0, a tie is no improvement),
    # 4 (-0.5), 5 (-2.0); the invalid candidate 6 last, whatever its fitness
    order = [1, 0, 2, 8, 3, 7, 4, 5, 6]
    expected = np.empty(9, np.int32)
    expected[order] = np.arange(9)
    np.testing.assert_array_equal(ranks, expected)
    assert int(improving) == 5
    # ties keep the batch order
    ranks, improving = improvement_ranks(jnp.ones(3), jnp.full(3, -INF), jnp.ones(3, bool))
    np.testing.assert_array_equal(ranks, [0, 1, 2])
    assert int(improving) == 3


def _config(emitter, **kw):
    base = dict(population_size=6, num_dims=4, cells_per_dim=7, emitter=emitter)
    return MapElitesConfig(**{**base, **kw})


@pytest.mark.parametrize("n", [1, 2])
def test_incumbents_read_from_the_sharded_archive_equal_numpy(n):
    me = MapElites(_config("cma_me", population_size=40), mesh=make_mesh(n))
    state = me.init(jax.random.key(0))
    rng = np.random.default_rng(1)
    desc = rng.uniform(-0.2, 1.2, (30, 2)).astype(np.float32)
    cells = me.archive.cells(state.archive, desc)
    incumbent = me.archive.fitness_at(state.archive, cells)
    fitness = me.archive.to_numpy(state.archive)["fitness"]
    np.testing.assert_array_equal(incumbent, fitness[np.asarray(cells)])
    assert np.isinf(np.asarray(incumbent)).any() and np.isfinite(np.asarray(incumbent)).any()


@pytest.mark.parametrize("n", [1, 2])
def test_novelty_equals_numpy(n):
    me = MapElites(
        _config("es", es=EsEmitterConfig(reward="novelty"), population_size=40), mesh=make_mesh(n)
    )
    state = me.init(jax.random.key(0))
    data = me.archive.to_numpy(state.archive)
    elites = data["descriptors"][data["filled"]].astype(np.float64)
    desc = np.random.default_rng(2).uniform(0, 1, (12, 2)).astype(np.float32)
    for k in (3, 1000):  # 1000: more than the filled cells, the mean over all of them
        dist = np.sqrt(((desc[:, None, :] - elites[None]) ** 2).sum(-1))
        expected = np.sort(dist, axis=1)[:, :k].mean(axis=1)
        got = me.archive.novelty(state.archive, desc, k)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    empty = me.archive.empty(4)
    np.testing.assert_array_equal(me.archive.novelty(empty, desc, 3), np.zeros(12))


def _tell(me, state, quality, descriptors, key):
    population, asked = me.emitter.ask(state.archive, state.emitter, jax.random.key(5))
    after, _ = me.archive.insert(state.archive, population, quality, descriptors)
    new, metrics = me.emitter.tell(
        state.archive, after, state.emitter, asked, quality, descriptors, key
    )
    return population, asked, after, new, metrics


@pytest.mark.slow  # CMA-ME's resume and the emitters' other tests stay in the default tier
def test_cma_me_restarts_from_an_elite_when_nothing_improves():
    me = MapElites(_config("cma_me", population_size=8), mesh=make_mesh(1))
    state = me.init(jax.random.key(0))
    data = me.archive.to_numpy(state.archive)
    elites = np.resize(np.flatnonzero(data["filled"]), 8)  # cells repeat if fewer
    descriptors = jnp.asarray(data["descriptors"][elites])
    key = jax.random.key(9)
    # every candidate lands on an elite's cell and is worse than it: a restart
    worse = jnp.asarray(data["fitness"][elites] - 1.0)
    _, asked, after, new, metrics = _tell(me, state, worse, descriptors, key)
    assert int(metrics["emitter_improving"]) == 0 and int(new.restarts) == 1
    expected = me.emitter._start(after, jax.random.split(key)[1])
    for a, b in zip(jax.tree.leaves(new.strategy), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)
    mean = np.asarray(new.strategy.mean)
    assert np.any(np.all(data["genotypes"][data["filled"]] == mean, axis=1))  # an elite
    # one candidate improves its cell: no restart, the CMA-ES's own update
    better = worse.at[3].add(2.0)
    _, asked, _, new, metrics = _tell(me, state, better, descriptors, key)
    assert int(metrics["emitter_improving"]) == 1 and int(new.restarts) == 0
    # 3 first, then the others by their (negative) gain over their cell's elite
    gain = np.asarray(better) - data["fitness"][elites]
    rest = [i for i in np.argsort(-gain, kind="stable") if i != 3]
    expected = np.empty(8, np.int32)
    expected[[3, *rest]] = np.arange(8)
    told, _ = me.emitter.strategy.tell(
        jax.random.split(key)[0],
        asked[1],
        jnp.asarray(expected, jnp.float32),
        asked[0],
        me.emitter.params,
    )
    np.testing.assert_array_equal(new.strategy.mean, told.mean)
    np.testing.assert_array_equal(new.strategy.C, told.C)


def test_es_draws_a_new_centre_every_period():
    me = MapElites(_config("es", es=EsEmitterConfig(period=3)), mesh=make_mesh(1))
    state = jax.jit(me.init)(jax.random.key(0))
    step = jax.jit(me.step)
    for g in range(7):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
        if g in (2, 5):  # the centres drawn after generations 3 and 6 are elites
            data = me.archive.to_numpy(state.archive)
            mean = np.asarray(state.emitter.strategy.mean)
            assert np.any(np.all(data["genotypes"][data["filled"]] == mean, axis=1))
            assert int(state.emitter.age) == 0
    assert int(state.emitter.restarts) == 2 and int(state.emitter.age) == 1
    assert int(metrics["emitter_restarts"]) == 2


def test_emitter_settings_are_checked():
    with pytest.raises(ConfigError, match="even and at least 2 with emitter=es"):
        _config("es", population_size=7).validate()
    with pytest.raises(ConfigError, match="emitter"):
        _config("pga").validate()
    with pytest.raises(ConfigError, match=r"es\.reward: unknown value 'curiosity'"):
        _config("es", es=EsEmitterConfig(reward="curiosity")).validate()
    with pytest.raises(ConfigError, match=r"cma_me\.sigma must be > 0"):
        _config("cma_me", cma_me=CmaEmitterConfig(sigma=0.0)).validate()


def _run(config, n, generations):
    me = MapElites(config, mesh=make_mesh(n))
    state = jax.jit(me.init)(jax.random.key(0))
    step = jax.jit(me.step)
    for g in range(generations):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
    return me.archive.to_numpy(state.archive), jax.device_get(state.emitter), metrics


# Each device count compiles the run anew (4 devices for all three made the test about half as
# long again on 2 cores), so 4 devices only for the novelty reward, whose nearest elites are read
# across every device's cells.
@pytest.mark.parametrize(
    "emitter, extra, devices",
    [
        ("es", {"es": EsEmitterConfig(period=2)}, (2,)),
        ("es", {"es": EsEmitterConfig(reward="novelty")}, (2, 4)),
        ("cma_me", {}, (2,)),
    ],
)
def test_same_archive_and_emitter_on_1_2_and_4_devices(emitter, extra, devices):
    # 6 candidates, 49 cells: padded on 2 and 4 devices
    config = _config(emitter, **extra)
    ref, ref_emitter, ref_metrics = _run(config, 1, 4)
    assert ref["filled"].sum() > 6
    for n in devices:
        data, other_emitter, metrics = _run(config, n, 4)
        for name, values in ref.items():
            np.testing.assert_array_equal(data[name], values, err_msg=f"{n} devices: {name}")
        emitters = zip(jax.tree.leaves(ref_emitter), jax.tree.leaves(other_emitter), strict=True)
        for a, b in emitters:  # bit for bit
            np.testing.assert_array_equal(a, b, err_msg=f"{n} devices")
        for name, value in ref_metrics.items():  # sums across devices: float rounding
            np.testing.assert_allclose(
                metrics[name], value, rtol=1e-6, err_msg=f"{n} devices: {name}"
            )


def _rows(run):
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


@pytest.mark.parametrize("emitter", ["es", "cma_me"])
def test_resume_equals_uninterrupted_run(tmp_path, emitter):
    args = ["-a", "mapelites", "--task", "qd/arm", "--devices", "2", "--chunk", "2", "-q"]
    args += ["--set", "population_size=16", "--set", "cells_per_dim=8"]
    args += ["--set", f"emitter={emitter}", "--set", "es.period=3", "--no-figure"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert cli.main(["train", *args, "-g", "5", "--out", str(whole)]) == 0
    assert cli.main(["train", *args, "-g", "2", "--out", str(part)]) == 0
    assert cli.main(["resume", str(part), "--more", "3", "-q", "--no-figure"]) == 0
    resumed, uninterrupted = _rows(part), _rows(whole)
    assert list(resumed) == list(uninterrupted) and "emitter_restarts" in resumed
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    a, b = np.load(whole / "archive.npz"), np.load(part / "archive.npz")
    assert sorted(a.files) == ["centroids", "descriptors", "filled", "fitness", "genotypes"]
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("emitter, coverage", [("es", 0.6), ("cma_me", 0.7)])
def test_emitter_covers_the_arm(emitter, coverage):
    # 1,024 cells, 128 candidates x 100 generations (12,928 evaluations), as the
    # isoline test; CMA-ME covers more than isoline variation's 60% (Fontaine et al.)
    from evorl_pop.run.shell import train_loop

    config = MapElitesConfig(population_size=128, num_dims=8, cells_per_dim=32, emitter=emitter)
    me = MapElites(config, mesh=make_mesh(2))
    state = me.init(jax.random.key(0))
    state, history = train_loop(me, state, jax.random.key(1), 100, chunk=50, progress=False)
    assert history["coverage"][-1] >= coverage, history["coverage"][-1]
    assert np.all(np.diff(history["qd_score"]) >= -1e-4)  # elites only ever improve
