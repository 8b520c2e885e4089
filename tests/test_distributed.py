"""The distributed API against NumPy and unsharded references on 1-8 devices."""

import inspect
import re

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed, make_mesh

DEVICE_COUNTS = [1, 2, 4, 8]


def _sharded_reduce(fn, x, n, axis_name="POP"):
    mesh = make_mesh(n)

    def local(xs):
        return fn(xs.sum(axis=0), axis_name)

    return jax.shard_map(local, mesh=mesh, in_specs=P("POP"), out_specs=P())(x)


def test_public_names_and_constants():
    assert distributed.DP_AXIS_NAME == "DP"
    assert distributed.POP_AXIS_NAME == "POP"
    expected = {
        "agent_gradient_update",
        "all_gather",
        "get_global_ranks",
        "get_process_id",
        "gradient_update",
        "is_dist_initialized",
        "pmax",
        "pmean",
        "pmin",
        "psum",
        "shmap_map",
        "shmap_vmap",
        "split_key_to_devices",
        "tree_device_put",
    }
    assert expected <= set(dir(distributed))
    # the constants name the axes: a mesh's population axis, a reduction over it
    mesh = make_mesh(4)
    assert mesh.axis_names == (distributed.POP_AXIS_NAME,)
    x = jnp.arange(8.0)
    total = jax.shard_map(
        lambda v: distributed.psum(v.sum(), distributed.POP_AXIS_NAME),
        mesh=mesh,
        in_specs=P(distributed.POP_AXIS_NAME),
        out_specs=P(),
    )(x)
    assert float(total) == 28.0
    from evorl_pop.distributed import comm, gradients, sharding

    assert callable(gradients.loss_and_pgrad)
    assert comm.pmax is distributed.pmax and sharding.shmap_map is distributed.shmap_map


def test_signatures_match_documentation():
    sig = lambda f: [(p.name, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    empty = inspect.Parameter.empty
    for f in (distributed.pmean, distributed.psum, distributed.pmin, distributed.pmax):
        assert sig(f) == [("x", empty), ("axis_name", None)]
    assert sig(distributed.all_gather) == [("x", empty), ("axis_name", None), ("kwargs", empty)]
    for f in (distributed.shmap_map, distributed.shmap_vmap):
        assert sig(f) == [
            ("fn", empty),
            ("mesh", empty),
            ("in_specs", empty),
            ("out_specs", empty),
            ("kwargs", empty),
        ]
    assert sig(distributed.split_key_to_devices) == [("key", empty), ("devices", empty)]
    assert sig(distributed.tree_device_put) == [("tree", empty), ("device_or_sharding", empty)]
    assert sig(distributed.gradient_update) == [
        ("loss_fn", empty),
        ("optimizer", empty),
        ("dp_axis_name", empty),
        ("has_aux", False),
    ]
    from evorl_pop.distributed.gradients import loss_and_pgrad

    assert sig(loss_and_pgrad) == [("loss_fn", empty), ("dp_axis_name", empty), ("has_aux", False)]
    names = [n for n, _ in sig(distributed.agent_gradient_update)]
    assert names == ["loss_fn", "optimizer", "dp_axis_name", "has_aux", "attach_fn", "detach_fn"]
    params = inspect.signature(distributed.agent_gradient_update).parameters
    assert params["dp_axis_name"].default is None and params["has_aux"].default is False


@pytest.mark.parametrize(
    "fn",
    [
        distributed.pmean,
        distributed.psum,
        distributed.pmin,
        distributed.pmax,
        distributed.all_gather,
    ],
)
def test_axis_none_is_identity(fn):
    x = {"a": jnp.arange(5.0), "b": jnp.ones((2, 3))}
    out = fn(x, None)
    assert out is x


@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_reductions_against_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    # each device first reduces its local rows with sum, then the collective
    # combines the per-device partial sums: compare with NumPy over the same blocks
    blocks = x.reshape(n, 16 // n, 3).sum(axis=1)
    np.testing.assert_allclose(_sharded_reduce(distributed.psum, x, n), blocks.sum(0), rtol=1e-5)
    np.testing.assert_allclose(
        _sharded_reduce(distributed.pmean, x, n), blocks.mean(0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(_sharded_reduce(distributed.pmin, x, n), blocks.min(0), rtol=1e-6)
    np.testing.assert_allclose(_sharded_reduce(distributed.pmax, x, n), blocks.max(0), rtol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(
    "fn", [distributed.pmean, distributed.psum, distributed.pmin, distributed.pmax]
)
def test_pytree_reductions_leaf_by_leaf_in_one_collective_per_dtype(fn, n):
    """A pytree's leaves (shapes, dtypes, a Python number, an invariant leaf) reduce
    as each alone would, keep their types, and take one all-reduce per dtype."""
    rng = np.random.default_rng(n)
    kernel = rng.normal(size=(n, 3, 2)).astype(np.float32)
    bias = rng.normal(size=(n, 2)).astype(np.float32)
    count = rng.integers(0, 9, size=(n,)).astype(np.int32)
    steps = rng.integers(0, 9, size=(n, 4)).astype(np.int32)
    mesh = make_mesh(n)

    def local(kernel, bias, count, steps):
        tree = {"kernel": kernel[0], "bias": bias[0], "scalar": 2.5,
                "counts": (count[0], steps[0]), "shared": jnp.arange(3.0),
                "big": jnp.full(distributed.comm.BUCKET_LEAF_SIZE + 1, bias[0, 0])}  # fmt: skip
        alone = jax.tree.map(lambda leaf: getattr(jax.lax, fn.__name__)(leaf, "POP"), tree)
        return fn(tree, "POP"), alone

    run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("POP"), out_specs=P()))
    got, alone = run(kernel, bias, count, steps)
    assert jax.tree.structure(got) == jax.tree.structure(alone)
    for g, a in zip(jax.tree.leaves(got), jax.tree.leaves(alone), strict=True):
        assert g.dtype == a.dtype and g.shape == a.shape and g.weak_type == a.weak_type
        np.testing.assert_allclose(g, a, rtol=1e-6)
    reference = {"pmean": np.mean, "psum": np.sum, "pmin": np.min, "pmax": np.max}[fn.__name__]
    np.testing.assert_allclose(got["kernel"], reference(kernel, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["counts"][1], reference(steps, axis=0), rtol=1e-6)
    # One operand for the small float32 leaves (the invariant one among them), one
    # for the int32 ones, the weakly typed number and the big leaf alone: 4 of 8.
    bucketed = jax.jit(jax.shard_map(lambda *a: local(*a)[0], mesh=mesh, in_specs=P("POP"),
                                     out_specs=P()))  # fmt: skip
    hlo = bucketed.lower(kernel, bias, count, steps).compile().as_text()
    operands = [
        len(re.findall(r"%[\w.-]+", line.split(" all-reduce(", 1)[1].split(")", 1)[0]))
        for line in hlo.splitlines()
        if " all-reduce(" in line
    ]
    assert sum(operands) == 4, operands


@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_extremes_and_all_gather_of_sharded_fitness(n):
    fitness = jnp.asarray(np.random.default_rng(0).permutation(24).astype(np.float32))
    mesh = make_mesh(n)

    def local(f):
        gathered = distributed.all_gather(f, "POP", tiled=True, to="invarying")
        return distributed.pmin(f.min(), "POP"), distributed.pmax(f.max(), "POP"), gathered

    lo, hi, gathered = jax.shard_map(
        local, mesh=mesh, in_specs=P("POP"), out_specs=(P(), P(), P())
    )(fitness)
    assert float(lo) == 0.0 and float(hi) == 23.0
    np.testing.assert_array_equal(gathered, fitness)

    stacked = jax.shard_map(
        lambda f: distributed.all_gather(f, "POP"), mesh=mesh, in_specs=P("POP"), out_specs=P("POP")
    )(fitness)
    # untiled gather stacks one row per device, on every device
    np.testing.assert_array_equal(stacked.reshape(n, n, -1)[0].reshape(-1), fitness)


def _per_candidate(x, w):
    return jnp.tanh(x @ w).sum() + jnp.sin(x).prod()


@pytest.mark.parametrize("n", DEVICE_COUNTS)
@pytest.mark.parametrize("wrapper", [distributed.shmap_vmap, distributed.shmap_map])
def test_shmap_equals_unsharded(n, wrapper):
    key = jax.random.key(1)
    xs = jax.random.normal(key, (16, 5))
    ws = jax.random.normal(jax.random.fold_in(key, 1), (16, 5, 3))
    mesh = make_mesh(n)
    f = wrapper(_per_candidate, mesh, in_specs=(P("POP"), P("POP")), out_specs=P("POP"))
    expected = jax.vmap(_per_candidate)(xs, ws)
    np.testing.assert_allclose(jax.jit(f)(xs, ws), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        jax.lax.map(lambda a: _per_candidate(*a), (xs, ws)), expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("n", [2, 4])
def test_shmap_vmap_pytree_args_and_closed_over_values(n):
    mesh = make_mesh(n)
    params = {"w": jnp.arange(8.0 * 3).reshape(8, 3), "b": jnp.arange(8.0)}
    scale = jnp.float32(2.0)  # shared by every candidate: closed over, replicated

    def f(p):
        return {"out": scale * (p["w"].sum() + p["b"])}

    g = distributed.shmap_vmap(
        f, mesh, in_specs=({"w": P("POP"), "b": P("POP")},), out_specs={"out": P("POP")}
    )
    out = jax.jit(g)(params)
    np.testing.assert_allclose(out["out"], jax.vmap(f)(params)["out"])


def test_population_not_divisible_error():
    mesh = make_mesh(4)
    f = distributed.shmap_vmap(lambda x: x.sum(), mesh, in_specs=P("POP"), out_specs=P("POP"))
    with pytest.raises(ValueError, match=r"30 is not divisible by 4.*28 or 32.*pad_to_multiple"):
        f(jnp.ones((30, 2)))
    g = distributed.shmap_map(lambda x: x.sum(), mesh, in_specs=P("POP"), out_specs=P("POP"))
    with pytest.raises(ValueError, match="not divisible"):
        g(jnp.ones((6, 2)))


def test_unknown_axis_error():
    mesh = make_mesh(2)
    with pytest.raises(ValueError, match=r"names the mesh axis 'PPO'.*\('POP',\)"):
        distributed.shmap_vmap(lambda x: x, mesh, in_specs=P("PPO"), out_specs=P("POP"))
    with pytest.raises(ValueError, match="out_specs names the mesh axis 'DP'"):
        distributed.shmap_map(lambda x: x, mesh, in_specs=P("POP"), out_specs=P("DP"))


def test_collective_outside_mapped_context_error():
    with pytest.raises(ValueError, match=r"no mesh axis named 'POP' is mapped.*axis_name=None"):
        jax.jit(lambda x: distributed.pmax(x, "POP"))(jnp.ones(3))


def test_padding_helper_masks_extra_rows():
    from evorl_pop import pad_to_multiple

    tree = {"x": jnp.arange(10.0).reshape(5, 2), "y": jnp.arange(5)}
    padded, mask = pad_to_multiple(tree, 4)
    assert padded["x"].shape == (8, 2) and padded["y"].shape == (8,)
    np.testing.assert_array_equal(mask, [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(padded["x"][5:], np.tile([[0.0, 1.0]], (3, 1)))


@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_global_ranks_unique_per_device(n):
    ranks = distributed.get_global_ranks()
    assert ranks.shape == (jax.local_device_count(),)
    np.testing.assert_array_equal(np.asarray(ranks), np.arange(jax.local_device_count()))
    # each rank lives on its own device
    for shard in ranks.addressable_shards:
        assert int(shard.data[0]) == jax.local_devices().index(shard.device)
    assert distributed.get_process_id() == 0 and not distributed.is_dist_initialized()


@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_split_key_to_devices(n):
    devices = jax.devices()[:n]
    keys = distributed.split_key_to_devices(jax.random.key(0), devices)
    assert keys.shape == (n,)
    data = {tuple(np.asarray(jax.random.key_data(s.data)).ravel()) for s in keys.addressable_shards}
    assert len(data) == n  # distinct keys
    assert [
        s.device for s in sorted(keys.addressable_shards, key=lambda s: s.index[0].start or 0)
    ] == devices
    np.testing.assert_array_equal(
        jax.random.key_data(keys), jax.random.key_data(jax.random.split(jax.random.key(0), n))
    )


@pytest.mark.parametrize("n", [2, 4, 8])
def test_tree_device_put_places_pytree(n):
    mesh = make_mesh(n)
    tree = {"a": jnp.arange(16.0), "b": (jnp.ones((8, 2)), jnp.zeros(n * 3))}
    sharding = NamedSharding(mesh, P("POP"))
    placed = distributed.tree_device_put(tree, sharding)
    for leaf, ref in zip(jax.tree.leaves(placed), jax.tree.leaves(tree), strict=True):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
        assert len(leaf.addressable_shards) == n
        np.testing.assert_array_equal(leaf, ref)
    one = distributed.tree_device_put(tree, jax.devices()[1])
    assert all(leaf.devices() == {jax.devices()[1]} for leaf in jax.tree.leaves(one))


# --- the gradient updates against a least-squares gradient written in NumPy ------------


@flax.struct.dataclass
class _Agent:
    params: dict
    tag: jax.Array  # carried through, never trained


def _least_squares():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = rng.normal(size=16).astype(np.float32)
    w = rng.normal(size=3).astype(np.float32)
    return x, y, w


def _loss(params, x, y):
    r = x @ params["w"] - y
    return jnp.mean(r**2), {"residual_sum": jnp.sum(r)}


def _numpy_step(x, y, w, lr):
    """The loss at ``w`` and one SGD step on the full batch's gradient, in NumPy."""
    r = x.astype(np.float64) @ w - y
    return np.mean(r**2), w - lr * (2 / len(y)) * x.T @ r


@pytest.mark.parametrize("n", [None, 1, 2, 4])
def test_gradient_update_is_one_sgd_step_on_the_full_batch_gradient(n):
    x, y, w = _least_squares()
    opt = optax.sgd(0.1)
    axis = None if n is None else distributed.DP_AXIS_NAME
    update = distributed.gradient_update(lambda p, x, y: _loss(p, x, y)[0], opt, axis)

    def run(p, x, y):
        value, p, _ = update(opt.init(p), p, x, y)
        return value[None], p  # the value: each device's loss on its part of the batch

    if n is not None:  # the batch split over a real 'DP' mesh axis
        mesh = make_mesh(n, axis_name=distributed.DP_AXIS_NAME)
        specs = dict(in_specs=(P(), P("DP"), P("DP")), out_specs=(P("DP"), P()))
        run = jax.shard_map(run, mesh=mesh, **specs)
    values, params = jax.jit(run)({"w": jnp.asarray(w)}, x, y)
    _, want_w = _numpy_step(x, y, w, 0.1)
    parts = zip(np.split(x, len(values)), np.split(y, len(values)), strict=True)
    want_values = [_numpy_step(xs, ys, w, 0.1)[0] for xs, ys in parts]
    np.testing.assert_allclose(values, want_values, rtol=1e-5)
    np.testing.assert_allclose(params["w"], want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [None, 4])
def test_agent_gradient_update_steps_the_agents_params_and_keeps_the_rest(n):
    x, y, w = _least_squares()
    opt = optax.sgd(0.05)
    axis = None if n is None else distributed.DP_AXIS_NAME
    update = distributed.agent_gradient_update(
        lambda agent, x, y: _loss(agent.params, x, y), opt, dp_axis_name=axis, has_aux=True
    )

    def run(agent, x, y):
        (value, aux), agent, _ = update(opt.init(agent.params), agent, x, y)
        # each device's loss and aux, on its part of the batch: their mean and sum
        return distributed.pmean(value, axis), distributed.psum(aux["residual_sum"], axis), agent

    if n is not None:
        mesh = make_mesh(n, axis_name=distributed.DP_AXIS_NAME)
        run = jax.shard_map(run, mesh=mesh, in_specs=(P(), P("DP"), P("DP")), out_specs=P())
    agent = _Agent(params={"w": jnp.asarray(w)}, tag=jnp.float32(7.0))
    value, residual_sum, stepped = jax.jit(run)(agent, x, y)
    want_value, want_w = _numpy_step(x, y, w, 0.05)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    np.testing.assert_allclose(residual_sum, np.sum(x @ w - y), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stepped.params["w"], want_w, rtol=1e-5, atol=1e-6)
    assert float(stepped.tag) == 7.0
