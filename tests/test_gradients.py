"""DP-averaged gradient updates equal the full-batch update on one device."""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed, make_mesh
from evorl_pop.distributed.gradients import loss_and_pgrad

BATCH = 32


@flax.struct.dataclass
class Agent:
    params: dict
    scale: jax.Array  # not trained


def _data():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, (BATCH, 4))
    y = jnp.sin(x @ jax.random.normal(k2, (4, 2)))
    params = {"w": jax.random.normal(k3, (4, 2)) * 0.1, "b": jnp.zeros(2)}
    return params, (x, y)


def _loss(params, batch, has_aux):
    x, y = batch
    pred = jnp.tanh(x @ params["w"] + params["b"])
    loss = jnp.mean((pred - y) ** 2)
    return (loss, {"pred_mean": pred.mean()}) if has_aux else loss


def _agent_loss(agent, batch, key, has_aux):
    noise = 0.0 * jax.random.normal(key)  # the key reaches the loss; zero keeps it exact
    return _loss(jax.tree.map(lambda p: p * agent.scale + noise, agent.params), batch, has_aux)


OPTIMIZERS = {"sgd": lambda: optax.sgd(0.3), "adam": lambda: optax.adam(0.05)}


def _run_params(n, opt_name, has_aux, steps=3):
    params, batch = _data()
    opt = OPTIMIZERS[opt_name]()
    axis = None if n is None else "DP"
    update = distributed.gradient_update(
        lambda p, b: _loss(p, b, has_aux), opt, axis, has_aux=has_aux
    )

    def run(params, batch):
        opt_state = opt.init(params)
        for _ in range(steps):
            value, params, opt_state = update(opt_state, params, batch)
        return params, value

    if n is None:
        return jax.jit(run)(params, batch)
    mesh = make_mesh(n, axis_name="DP")

    def run_local(params, batch):  # per-device loss values gain a device axis
        params, value = run(params, batch)
        return params, jax.tree.map(lambda v: v[None], value)

    # params replicated, batch split over DP; the averaged gradient makes the
    # new params identical on every device, so they leave as P()
    f = jax.shard_map(run_local, mesh=mesh, in_specs=(P(), P("DP")), out_specs=(P(), P("DP")))
    params, value = jax.jit(f)(params, batch)
    return params, jax.tree.map(lambda v: v.mean(), value)  # equal shards: mean of means


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("has_aux", [False, True])
def test_gradient_update_dp_equals_full_batch(n, opt_name, has_aux):
    ref, ref_value = _run_params(None, opt_name, has_aux)
    got, value = _run_params(n, opt_name, has_aux)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), value, ref_value)
    init, _ = _data()
    for a, b, c in zip(
        jax.tree.leaves(got), jax.tree.leaves(ref), jax.tree.leaves(init), strict=True
    ):
        assert not np.allclose(b, c)  # the update moved the parameters
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    if has_aux:
        loss, aux = value
        assert aux["pred_mean"].shape == loss.shape


def _run_agent(n, opt_name, has_aux, steps=3):
    params, batch = _data()
    agent = Agent(params=params, scale=jnp.float32(1.5))
    opt = OPTIMIZERS[opt_name]()
    axis = None if n is None else distributed.DP_AXIS_NAME
    update = distributed.agent_gradient_update(
        lambda a, b, k: _agent_loss(a, b, k, has_aux), opt, dp_axis_name=axis, has_aux=has_aux
    )

    def run(agent, batch, key):
        opt_state = opt.init(agent.params)
        for i in range(steps):
            _, agent, opt_state = update(opt_state, agent, batch, jax.random.fold_in(key, i))
        return agent

    if n is None:
        return jax.jit(run)(agent, batch, jax.random.key(3))
    mesh = make_mesh(n, axis_name="DP")
    f = jax.shard_map(run, mesh=mesh, in_specs=(P(), P("DP"), P()), out_specs=P())
    return jax.jit(f)(agent, batch, jax.random.key(3))


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("has_aux", [False, True])
def test_agent_gradient_update_dp_equals_full_batch(n, opt_name, has_aux):
    ref = _run_agent(None, opt_name, has_aux)
    got = _run_agent(n, opt_name, has_aux)
    assert float(got.scale) == 1.5  # untouched fields stay as they were
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    before, _ = _data()
    assert not np.allclose(ref.params["w"], before["w"])


def test_agent_gradient_update_custom_attach_detach():
    """attach/detach select a sub-tree: only that part is trained."""
    params, batch = _data()
    agent = Agent(params=params, scale=jnp.float32(1.0))
    opt = optax.sgd(0.5)

    def attach(a, w):
        return a.replace(params={**a.params, "w": w})

    update = distributed.agent_gradient_update(
        lambda a, b, k: _agent_loss(a, b, k, False),
        opt,
        attach_fn=attach,
        detach_fn=lambda a: a.params["w"],
    )
    _, new, _ = update(opt.init(params["w"]), agent, batch, jax.random.key(0))
    np.testing.assert_array_equal(new.params["b"], params["b"])
    grad_w = jax.grad(lambda w: _loss({"w": w, "b": params["b"]}, batch, False))(params["w"])
    np.testing.assert_allclose(new.params["w"], params["w"] - 0.5 * grad_w, rtol=1e-5, atol=1e-7)


def test_loss_and_pgrad_without_axis_is_value_and_grad():
    params, batch = _data()
    value, grads = loss_and_pgrad(lambda p: _loss(p, batch, False), None)(params)
    ref_value, ref_grads = jax.value_and_grad(lambda p: _loss(p, batch, False))(params)
    assert float(value) == float(ref_value)
    jax.tree.map(np.testing.assert_array_equal, grads, ref_grads)


def test_dp_axis_outside_mapped_context_error():
    params, batch = _data()
    update = distributed.gradient_update(lambda p, b: _loss(p, b, False), optax.sgd(0.1), "DP")
    with pytest.raises(ValueError, match=r"dp_axis_name='DP' is not a mapped axis.*shard_map"):
        jax.jit(update)(optax.sgd(0.1).init(params), params, batch)


def test_dp_axis_missing_from_the_mesh_error():
    params, batch = _data()
    update = distributed.gradient_update(lambda p, b: _loss(p, b, False), optax.sgd(0.1), "DP")
    opt_state = optax.sgd(0.1).init(params)
    f = jax.shard_map(
        lambda o, p, b: update(o, p, b)[1], mesh=make_mesh(2), in_specs=P(), out_specs=P()
    )  # the mesh's axis is 'POP', not 'DP'
    with pytest.raises(ValueError, match=r"dp_axis_name='DP' is not a mapped axis"):
        jax.jit(f)(opt_state, params, batch)


@pytest.mark.parametrize("error", [ValueError, NameError])
def test_errors_of_the_loss_propagate_unchanged(error):
    """An error raised by the user's loss is not relabelled as a mapping problem."""
    params, batch = _data()

    def loss(p, b):
        raise error("mine")

    update = distributed.gradient_update(loss, optax.sgd(0.1), "DP")
    f = jax.shard_map(
        lambda o, p, b: update(o, p, b)[1],
        mesh=make_mesh(2, axis_name="DP"),
        in_specs=(P(), P(), P("DP")),
        out_specs=P(),
    )
    with pytest.raises(error) as info:
        jax.jit(f)(optax.sgd(0.1).init(params), params, batch)
    # the user's own exception: same type and arguments, not chained to another
    assert info.type is error and info.value.args[0] == "mine"
    assert info.value.__cause__ is None
