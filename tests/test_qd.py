"""MAP-Elites and its archive sharded by cell, against NumPy references.

Insertion into a grid and a CVT archive equals a direct NumPy computation (ties, out
of bounds, non-finite values), on 1, 2 and 4 devices; the metrics by hand; the whole
archive bit for bit on 1, 2 and 4 devices; isoline variation's mean and covariance;
a run resumed equals the uninterrupted one; the arm's coverage after a fixed budget.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.mapelites import MapElites, MapElitesConfig, isoline_variation
from evorl_pop.base import ConfigError
from evorl_pop.core.archive import ShardedArchive, cvt_centroids, grid_cells
from evorl_pop.run import store
from evorl_pop.tasks.qd import ArmTask, make_qd_task

DIMS = 3


def _batch():
    """16 candidates in [0, 1]^2 with ties, descriptors outside the bounds, a NaN and an
    inf fitness and a NaN descriptor; genotypes that name the candidate."""
    rng = np.random.default_rng(0)
    desc = rng.uniform(0, 1, (16, 2)).astype(np.float32)
    fit = rng.normal(size=16).astype(np.float32)
    desc[3] = desc[1]  # same cell, same fitness: candidate 1 wins (the lower index)
    fit[3] = fit[1]
    desc[4] = (-0.3, 1.7)  # outside: clipped to the corner cell (0, last)
    desc[5] = (1.0, 0.0)  # on the upper bound: the last cell of dimension 1
    desc[6] = (2.0, -5.0)  # same cell as 5 after clipping
    fit[7], fit[8] = np.nan, np.inf  # never enter
    desc[9] = (np.nan, 0.5)
    desc[10] = (0.5, 0.5)  # equidistant from the CVT's centroids 0 and last
    genotypes = np.arange(16, dtype=np.float32)[:, None] * np.ones(DIMS, np.float32)
    return genotypes, fit, desc


def _reference(cells, genotypes, fit, desc, start=None, num_cells=None):
    """Sequential insertion: a candidate replaces its cell's elite when strictly better."""
    if start is None:
        start = (
            np.zeros((num_cells, DIMS), np.float32),
            np.full(num_cells, -np.inf, np.float32),
            np.zeros((num_cells, 2), np.float32),
        )
    g, f, d = (a.copy() for a in start)
    for i, cell in enumerate(cells):
        if np.isfinite(fit[i]) and np.all(np.isfinite(desc[i])) and fit[i] > f[cell]:
            g[cell], f[cell], d[cell] = genotypes[i], fit[i], desc[i]
    return g, f, d


def _grid_reference_cells(desc, n):
    d = np.clip(np.nan_to_num(desc, nan=0.0), 0, 1).astype(np.float32)
    index = np.clip(np.floor(d * np.float32(n)).astype(np.int32), 0, n - 1)
    return index[:, 0] * n + index[:, 1]


def _cvt_reference_cells(desc, centroids):
    d = np.clip(np.nan_to_num(desc, nan=0.0), 0, 1).astype(np.float32)
    dist = ((d[:, None, :] - centroids[None]) ** 2).sum(-1)
    return np.argmin(dist, axis=1)


def _host(archive: ShardedArchive, state):
    data = archive.to_numpy(state)
    return data["genotypes"], data["fitness"], data["descriptors"]


def _insert_twice(archive: ShardedArchive):
    genotypes, fit, desc = _batch()
    state = archive.empty(DIMS)
    state, added1 = archive.insert(state, genotypes, fit, desc)
    first = _host(archive, state)
    # a second batch: every candidate moved a little; some beat the elites, some tie
    fit2 = fit + np.where(np.arange(16) % 2 == 0, 0.5, 0.0).astype(np.float32)
    state, added2 = archive.insert(state, genotypes + 100, fit2, desc)
    return (genotypes, fit, desc, fit2), first, _host(archive, state), (int(added1), int(added2))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_grid_insertion_equals_numpy(n):
    cells_per_dim = 5  # 25 cells: padded to 28 on 4 devices
    archive = ShardedArchive(make_mesh(n), (0, 0), (1, 1), cells_per_dim=(5, 5))
    (genotypes, fit, desc, fit2), first, second, added = _insert_twice(archive)
    cells = _grid_reference_cells(desc, cells_per_dim)
    np.testing.assert_array_equal(
        np.asarray(archive.cells(archive.empty(DIMS), jnp.nan_to_num(desc))), cells
    )
    assert cells[4] == 4 and cells[5] == cells[6] == 20
    want = _reference(cells, genotypes, fit, desc, num_cells=25)
    for got, ref in zip(first, want, strict=True):
        np.testing.assert_array_equal(got, ref)
    assert first[0][cells[1], 0] == 1  # the tie went to the lower index
    want2 = _reference(cells, genotypes + 100, fit2, desc, start=want)
    for got, ref in zip(second, want2, strict=True):
        np.testing.assert_array_equal(got, ref)
    assert added == (np.isfinite(want[1]).sum(), (want2[1] != want[1]).sum())


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cvt_insertion_equals_numpy(n):
    # centroids 0 and 9 are as near (0.5, 0.5), on different devices; none is nearer
    centroids = np.asarray(
        [(0.25, 0.5), (0.1, 0.1), (0.1, 0.9), (0.9, 0.1), (0.9, 0.9), (0.5, 0.1), (0.5, 0.9)]
        + [(0.3, 0.2), (0.7, 0.8), (0.75, 0.5)],
        np.float32,
    )
    archive = ShardedArchive(make_mesh(n), (0, 0), (1, 1), centroids=centroids)
    (genotypes, fit, desc, fit2), first, second, _ = _insert_twice(archive)
    cells = _cvt_reference_cells(desc, centroids)
    assert cells[10] == 0
    want = _reference(cells, genotypes, fit, desc, num_cells=10)
    for got, ref in zip(first, want, strict=True):
        np.testing.assert_array_equal(got, ref)
    want2 = _reference(cells, genotypes + 100, fit2, desc, start=want)
    for got, ref in zip(second, want2, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_grid_cells_row_major():
    d = jnp.asarray([[0.0, 0.0], [0.0, 0.99], [0.5, 0.0], [0.99, 0.99]])
    np.testing.assert_array_equal(grid_cells(d, (0, 0), (1, 1), (2, 3)), [0, 2, 3, 5])


def test_metrics_by_hand():
    # 4 cells on 3 devices (padded to 6); 3 elites
    archive = ShardedArchive(make_mesh(3), (0, 0), (1, 1), cells_per_dim=(2, 2))
    fit = np.asarray([-0.1, -0.2, -0.05, -0.3], np.float32)
    desc = np.asarray([[0.1, 0.1], [0.9, 0.1], [0.9, 0.1], [0.1, 0.9]], np.float32)
    state, _ = archive.insert(archive.empty(2), np.zeros((4, 2), np.float32), fit, desc)
    m = jax.device_get(archive.metrics(state, qd_offset=0.25))
    # cells 0 (-0.1), 2 (-0.05 beats -0.2), 1 (-0.3)
    np.testing.assert_allclose(m["qd_score"], 0.15 + 0.20 + (-0.05), rtol=1e-6)
    np.testing.assert_allclose(m["qd_score"], (0.25 - 0.1) + (0.25 - 0.05) + (0.25 - 0.3))
    assert m["archive_size"] == 3 and m["coverage"] == pytest.approx(0.75)
    assert m["archive_fitness_max"] == pytest.approx(-0.05)
    assert m["archive_fitness_mean"] == pytest.approx((-0.1 - 0.05 - 0.3) / 3)
    empty = jax.device_get(archive.metrics(archive.empty(2), 0.25))
    assert (
        empty["qd_score"] == 0 and empty["coverage"] == 0 and np.isnan(empty["archive_fitness_max"])
    )


def test_sample_is_uniform_over_filled_cells():
    desc = np.asarray([[0.1, 0.1], [0.5, 0.9], [0.9, 0.5]], np.float32)  # cells 0, 5, 7
    genotypes = np.asarray([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], np.float32)
    drawn = []
    for n in (1, 2, 4):  # 9 cells: padded to 10 and 12
        archive = ShardedArchive(make_mesh(n), (0, 0), (1, 1), cells_per_dim=(3, 3))
        state, _ = archive.insert(archive.empty(2), genotypes, np.zeros(3, np.float32), desc)
        drawn.append(np.asarray(archive.sample(state, jax.random.key(0), 6000)))
    values, counts = np.unique(drawn[0][:, 0], return_counts=True)
    np.testing.assert_array_equal(values, [1, 2, 3])
    np.testing.assert_allclose(counts / 6000, 1 / 3, atol=0.02)
    for parents in drawn[1:]:  # the same draw whatever the device count
        np.testing.assert_array_equal(parents, drawn[0])
    empty = ShardedArchive(make_mesh(2), (0, 0), (1, 1), cells_per_dim=(3, 3))
    assert not np.asarray(empty.sample(empty.empty(2), jax.random.key(0), 6000)).any()


def test_isoline_variation_mean_and_covariance():
    x = jnp.asarray([0.2, -1.0, 3.0])
    y = jnp.asarray([1.2, -3.0, 3.5])
    n, iso, line = 200_000, 0.1, 0.5
    children = isoline_variation(
        jax.random.key(0), jnp.tile(x, (n, 1)), jnp.tile(y, (n, 1)), iso, line
    )
    children = np.asarray(children, np.float64)
    direction = np.asarray(y - x, np.float64)
    cov = iso**2 * np.eye(3) + line**2 * np.outer(direction, direction)
    np.testing.assert_allclose(children.mean(0), x, atol=0.01)  # standard error < 0.0025
    np.testing.assert_allclose(np.cov(children.T), cov, atol=0.015)  # standard error < 0.004
    clipped = isoline_variation(jax.random.key(1), x[None], y[None], 1.0, 1.0, (0.0, 1.0))
    assert float(clipped.min()) >= 0 and float(clipped.max()) <= 1


def test_arm_task_end_effector():
    task = ArmTask(num_dims=4)
    # all angles pi (x = 1) after the first: 2 pi x - pi = pi at each joint, the arm folds
    straight = jnp.full(4, 0.5)  # angles 0: the arm lies along x, its end at (1, 0.5)
    score, _, d = task.evaluate_descriptor(straight, None, ())
    np.testing.assert_allclose(d, [1.0, 0.5], atol=1e-6)
    assert float(score) == 0.0
    score, _, d = task.evaluate_descriptor(jnp.asarray([0.75, 0.5, 0.5, 0.5]), None, ())
    np.testing.assert_allclose(d, [0.5, 1.0], atol=1e-6)  # pointing up
    assert float(score) == pytest.approx(-np.var([0.75, 0.5, 0.5, 0.5]))


def test_cvt_centroids_are_lloyds_kmeans_of_uniform_samples():
    low, high = np.asarray([-1.0, 0.0], np.float32), np.asarray([1.0, 3.0], np.float32)
    key = jax.random.key(3)
    got = cvt_centroids(key, 12, 600, low, high, iterations=4)
    samples = np.asarray(jax.random.uniform(key, (600, 2), jnp.float32, low, high))
    centroids = samples[:12].copy()
    for _ in range(4):
        nearest = ((samples[:, None] - centroids[None]) ** 2).sum(-1).argmin(1)
        for c in range(12):
            if (nearest == c).any():
                centroids[c] = samples[nearest == c].mean(0)
    np.testing.assert_allclose(got, centroids, rtol=1e-5, atol=1e-6)
    assert np.all((got >= low) & (got <= high))


def test_rastrigin_projection_task():
    task = make_qd_task("qd/rastrigin_proj", num_dims=4)
    x = jnp.asarray([1.0, 3.0, -2.0, 9.0])  # the last coordinate is clipped to 5.12
    score, _, d = task.evaluate_descriptor(x, None, ())
    np.testing.assert_allclose(d, [2.0, 1.56], rtol=1e-6)
    clipped = np.asarray([1.0, 3.0, -2.0, 5.12])
    want = 10 * 4 + np.sum(clipped**2 - 10 * np.cos(2 * np.pi * clipped))
    assert float(score) == pytest.approx(-want, rel=1e-5)
    assert -want + task.qd_offset >= 0
    with pytest.raises(ValueError, match="Unknown QD task 'qd/ram'. Did you mean 'qd/arm'"):
        make_qd_task("qd/ram")


def _run(config, n, generations):
    me = MapElites(config, mesh=make_mesh(n))
    state = jax.jit(me.init)(jax.random.key(0))
    step = jax.jit(me.step)
    for g in range(generations):
        state, metrics = step(state, jax.random.fold_in(jax.random.key(1), g))
    return me.archive.to_numpy(state.archive), jax.device_get(metrics)


@pytest.mark.parametrize("kind", ["grid", "cvt"])
def test_same_archive_on_1_2_and_4_devices(kind):
    # 6 candidates: padded on 4 devices; 50 cells padded to 52
    config = MapElitesConfig(
        population_size=6,
        num_dims=4,
        archive=kind,
        cells_per_dim=7,
        num_cells=50,
        cvt_samples=2000,
        cvt_iterations=5,
        iso_sigma=0.05,
        line_sigma=0.2,
    )
    (ref, ref_metrics), *others = [_run(config, n, 4) for n in (1, 2, 4)]
    assert ref["filled"].sum() > 6
    for data, metrics in others:
        for name, values in ref.items():
            np.testing.assert_array_equal(data[name], values, err_msg=name)  # bit for bit
        for name, value in ref_metrics.items():  # sums across devices: float rounding
            np.testing.assert_allclose(metrics[name], value, rtol=1e-6, err_msg=name)


def test_tasks_without_descriptors_are_refused():
    for task in ("CartPole-v1", "sphere", "brax/hopper"):
        with pytest.raises(ConfigError, match=r"^task: mapelites needs .* -a es"):
            MapElitesConfig(task=task).validate()
    with pytest.raises(ConfigError, match="task: MAP-Elites needs"):
        from evorl_pop.tasks import make_task

        MapElites(MapElitesConfig(), mesh=make_mesh(1), task=make_task("sphere", num_dims=2))


def _rows(run):
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


def test_resume_equals_uninterrupted_run_and_exports(tmp_path):
    args = ["-a", "mapelites", "--task", "qd/arm", "--devices", "2", "--chunk", "2", "-q"]
    args += ["--set", "population_size=16", "--set", "cells_per_dim=8"]
    whole, part, other = tmp_path / "whole", tmp_path / "part", tmp_path / "other"
    assert cli.main(["train", *args, "-g", "4", "--out", str(whole), "--no-figure"]) == 0
    assert cli.main(["train", *args, "-g", "2", "--out", str(part), "--no-figure"]) == 0
    shutil.copytree(part, other)
    assert cli.main(["resume", str(part), "--more", "2", "-q", "--no-figure"]) == 0
    resumed, uninterrupted = _rows(part), _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 4
    for column in ("qd_score", "coverage", "archive_size", "archive_fitness_max"):
        assert column in resumed
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    a, b = np.load(whole / "archive.npz"), np.load(part / "archive.npz")
    assert sorted(a.files) == ["centroids", "descriptors", "filled", "fitness", "genotypes"]
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert a["fitness"].shape == (64,) and a["filled"].sum() == resumed["archive_size"][-1]
    assert (whole / "archive.png").stat().st_size > 0 and (part / "qd.png").stat().st_size > 0
    # on another device count: the same archive, bit for bit (cells padded to a multiple
    # of 8 on 2 and 4 devices alike); the metrics' sums across devices to float rounding
    resume = ["resume", str(other), "--more", "2", "--devices", "4", "-q", "--no-figure"]
    assert cli.main(resume) == 0
    c = np.load(other / "archive.npz")
    for name in a.files:
        np.testing.assert_array_equal(a[name], c[name], err_msg=name)
    for column, values in _rows(other).items():
        np.testing.assert_allclose(values, uninterrupted[column], rtol=1e-6, err_msg=column)


@pytest.mark.slow
def test_mapelites_covers_the_arm():
    # 1,024 cells, 128 candidates x 100 generations (12,928 evaluations): at least 60% of
    # the cells (the arm reaches a disc: about 79% of the square)
    config = MapElitesConfig(population_size=128, num_dims=8, cells_per_dim=32)
    me = MapElites(config, mesh=make_mesh(2))
    from evorl_pop.run.shell import train_loop

    state = me.init(jax.random.key(0))
    state, history = train_loop(me, state, jax.random.key(1), 100, chunk=50, progress=False)
    assert history["coverage"][-1] >= 0.6, history["coverage"][-1]
    assert np.all(np.diff(history["qd_score"]) >= -1e-4)  # elites only ever improve


@pytest.mark.slow
def test_brax_feet_task_scores_as_the_control_task_and_describes_feet():
    pytest.importorskip("brax")
    task = make_qd_task("qd/walker2d_uni", hidden_sizes=(8,), episode_length=30)
    assert task.descriptor_size == 2 and task.qd_offset == pytest.approx(1.413 * 30)
    keys = jax.random.split(jax.random.key(0), 3)
    solutions = jax.vmap(task.init_solution)(keys)
    score, info, descriptor = jax.jit(jax.vmap(task.evaluate_descriptor, (0, 0, None)))(
        solutions, keys, ()
    )
    # the return of ControlTask's own evaluation of the same candidate and key
    ref_score, ref_info = task.evaluate_batch(solutions, keys, ())
    np.testing.assert_allclose(score, ref_score, rtol=1e-5)
    np.testing.assert_array_equal(info.steps, ref_info.steps)
    descriptor = np.asarray(descriptor)
    assert np.all((descriptor >= 0) & (descriptor <= 1)) and descriptor.max() > 0
    steps = np.asarray(info.steps)[:, None]
    np.testing.assert_allclose(descriptor * steps, np.round(descriptor * steps), atol=1e-4)


@pytest.mark.parametrize(
    "name", ["qd/hopper_uni", "qd/walker2d_uni", "qd/halfcheetah_uni", "qd/ant_uni"]
)
def test_feet_contacts_equal_brax_contacts(name):
    """Each foot's contact for 256 poses around the initial one (shifted up and down,
    turned at random) equals brax's own: ``brax.contact.get``, MJX's collision of every
    pair, a contact of the foot at a distance of at most 0."""
    pytest.importorskip("brax")
    from brax import contact

    task = make_qd_task(name, hidden_sizes=(8,), episode_length=5)
    system = task.env.env.sys
    x0 = task.env.env.reset(jax.random.key(0)).pipeline_state.x
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    n = 256
    height = jax.random.uniform(k2, (n, 1, 1), minval=-0.4, maxval=0.2) * jnp.array([0, 0, 1.0])
    pos = x0.pos + 0.05 * jax.random.normal(k1, (n, *x0.pos.shape)) + height
    rot = x0.rot + 0.3 * jax.random.normal(k3, (n, *x0.rot.shape))
    poses = x0.replace(pos=pos, rot=rot / jnp.linalg.norm(rot, axis=-1, keepdims=True))

    def reference(x):
        c = contact.get(system, x)
        feet = jnp.asarray(task.feet)[:, None]
        on = (c.link_idx[0][None] == feet) | (c.link_idx[1][None] == feet)
        return jnp.any(on & (c.dist <= 0)[None], axis=-1).astype(jnp.float32)

    feature = jax.vmap(lambda x: task._feature(SimpleNamespace(x=x)))  # a pipeline state's x
    ours = np.asarray(jax.jit(feature)(poses))
    expected = np.asarray(jax.jit(jax.vmap(reference))(poses))
    np.testing.assert_array_equal(ours, expected)
    assert np.all((expected.mean(0) > 0.1) & (expected.mean(0) < 0.9))  # both cases, each foot


def test_render_of_a_run_says_its_archive_holds_the_result(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "-a", "mapelites", "--task", "qd/arm", "--pop", "8", "-g", "1",
            "--devices", "1", "-q", "--no-figure", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(["render", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        "nothing to render: render shows one policy, and a 'qd/arm' run's result is many; "
        "its archive.npz in the run folder holds them."
    )
    assert (out / "archive.npz").exists()


def _brax_reference(task, solution, key, forward: bool):
    """A candidate's episode stepped with brax's own environment, op by op: the return
    (without the forward term unless ``forward``), each unnamed lower leg's contact
    proportion and the torso's final (x, y)."""
    import brax.envs
    from brax import contact

    env = brax.envs.get_environment("ant", backend="spring")
    step = jax.jit(env.step)
    contacts = jax.jit(lambda x: contact.get(env.sys, x))
    feet = [i for i, name in enumerate(env.sys.link_names) if name == ""]  # the lower legs
    params = task.policy_params(solution, None)
    _, reset_key = jax.random.split(jax.random.split(key, 1)[0])
    state = jax.jit(env.reset)(reset_key)
    ret, touching, steps = 0.0, np.zeros(len(feet)), 0
    for _ in range(task.spec.max_steps):
        state = step(state, task.policy(params, state.obs))
        ret += float(state.reward) - (0.0 if forward else float(state.metrics["reward_forward"]))
        c = contacts(state.pipeline_state.x)
        for j, foot in enumerate(feet):
            on = (np.asarray(c.link_idx[0]) == foot) | (np.asarray(c.link_idx[1]) == foot)
            touching[j] += np.any(on & (np.asarray(c.dist) <= 0))
        steps += 1
        if float(state.done):
            break
    xy = np.asarray(state.pipeline_state.x.pos[0, :2])
    return ret, touching / steps, np.clip(xy, -30, 30), steps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qd/ant_uni", "qd/ant_omni"])
def test_ant_tasks_equal_brax_stepped_directly(name):
    pytest.importorskip("brax")
    task = make_qd_task(name, hidden_sizes=(8,), episode_length=6)
    offset = {"qd/ant_uni": 3.24, "qd/ant_omni": 3.0}[name]
    assert task.qd_offset == pytest.approx(offset * 6)
    key = jax.random.key(3)
    # weights scaled up: the actions reach the actuators' range, the feet touch down
    solution = task.init_solution(key) * 3.0
    score, info, descriptor = jax.jit(task.evaluate_descriptor)(solution, key, ())
    ret, feet, xy, steps = _brax_reference(task, solution, key, forward=name == "qd/ant_uni")
    assert int(info.steps) == steps
    np.testing.assert_allclose(float(score), ret, rtol=1e-4, atol=1e-4)
    if name == "qd/ant_uni":
        assert task.descriptor_size == 4 and np.asarray(task.feet).tolist() == [2, 4, 6, 8]
        np.testing.assert_allclose(descriptor, feet, atol=1e-6)
        assert feet.max() > 0
    else:
        assert task.descriptor_bounds == ((-30.0, -30.0), (30.0, 30.0))
        np.testing.assert_allclose(descriptor, xy, rtol=1e-5, atol=1e-6)
        # the forward term is left out: the return differs from brax's own
        with_forward = _brax_reference(task, solution, key, forward=True)[0]
        assert abs(with_forward - ret) > 1e-3
