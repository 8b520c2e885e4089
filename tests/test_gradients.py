"""DP-averaged gradient updates equal the full-batch update on one device, the
learners' updates (agent_gradient_update steps) among them."""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from evorl_pop import distributed, make_mesh
from evorl_pop.base import EnvSpec
from evorl_pop.distributed.gradients import loss_and_pgrad
from evorl_pop.rl import ppo, sac
from evorl_pop.rl.td3 import TD3, ActorState, CriticState, TD3Config, TD3State, polyak
from evorl_pop.tasks.rollout import Transition

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


# --- the learners' gradient steps are agent_gradient_update's ------------------------

SPEC = EnvSpec("box", (3,), False, 2, (-1.0, -1.0), (1.0, 1.0), 100)
SAC_HP = sac.Hyperparameters.create(
    actor_lr=1e-3, critic_lr=2e-3, alpha_lr=5e-3, target_entropy_scale=0.5, discount=0.9
)
PPO_HP = ppo.Hyperparameters.create(
    learning_rate=1e-2, clip_epsilon=0.2, entropy_cost=0.05, gae_lambda=0.9, discount=0.95
)


def _transitions(key):
    k = jax.random.split(key, 5)
    obs = jax.random.normal(k[0], (BATCH, *SPEC.obs_shape))
    return Transition(
        obs=obs,
        action=jax.random.uniform(k[1], (BATCH, SPEC.action_dim), minval=-1.0, maxval=1.0),
        reward=jax.random.normal(k[2], (BATCH,)),
        next_obs=obs + 0.1 * jax.random.normal(k[3], obs.shape),
        terminal=(jax.random.uniform(k[4], (BATCH,)) < 0.2).astype(jnp.float32),
    )


def _full_batch_step(loss, optimizer, opt_state, params, *args):
    """One optimizer step on the whole batch's gradient of ``loss(params, *args)``."""
    grads = jax.grad(loss)(params, *args)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _td3():
    """TD3's first update: the critics' step, then the delayed actor's and the targets'."""
    td3 = TD3(SPEC, TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,)))

    def update(state, batch, key, axis):
        return td3.update(state, batch, key, axis)[0]

    def reference(state, batch, key):
        actor = state.actor
        critic = state.critic
        params, opt_state = _full_batch_step(
            td3.critic_loss,
            td3.critic_optimizer,
            critic.opt_state,
            critic.params,
            critic.target_params,
            actor.target_params,
            batch,
            key,
            jnp.arange(BATCH),
        )
        critic = critic.replace(params=params, opt_state=opt_state)
        params, opt_state = _full_batch_step(
            td3.actor_loss, td3.actor_optimizer, actor.opt_state, actor.params, params, batch.obs
        )
        tau = td3.config.tau
        target = polyak(actor.target_params, params, tau)
        actor = ActorState(params=params, target_params=target, opt_state=opt_state)
        critic = critic.replace(target_params=polyak(critic.target_params, critic.params, tau))
        return TD3State(actor=actor, critic=critic, updates=state.updates + 1)

    return update, reference, td3.init(jax.random.key(0)), 2


def _sac():
    """SAC's update: temperature, critics and actor from the same state, then the target."""
    learner = sac.SACLearner(SPEC, (16,), (16,), reward_scaling=2.0, init_alpha=0.5)

    def update(state, batch, key, axis):
        return learner.update(state, batch, SAC_HP, key, axis)[0]

    def reference(state, batch, key):
        index = jnp.arange(BATCH)
        alpha_key, critic_key, actor_key = jax.random.split(key, 3)
        actor_opt, critic_opt, alpha_opt = learner.optimizers(SAC_HP)
        log_alpha, alpha_opt_state = _full_batch_step(
            learner.temperature_loss,
            alpha_opt,
            state.alpha_opt_state,
            state.log_alpha,
            state,
            batch,
            SAC_HP,
            alpha_key,
            index,
        )
        critic, critic_opt_state = _full_batch_step(
            learner.critic_loss,
            critic_opt,
            state.critic.opt_state,
            state.critic.params,
            state,
            batch,
            SAC_HP,
            critic_key,
            index,
        )
        actor, actor_opt_state = _full_batch_step(
            learner.actor_loss,
            actor_opt,
            state.actor.opt_state,
            state.actor.params,
            state,
            batch,
            actor_key,
            index,
        )
        target = polyak(state.critic.target_params, critic, learner.tau)
        return sac.SACState(
            actor=sac.ActorState(actor, None, actor_opt_state),
            critic=CriticState(critic, target, critic_opt_state),
            log_alpha=log_alpha,
            alpha_opt_state=alpha_opt_state,
        )

    return update, reference, learner.init(jax.random.key(0), SAC_HP), 3


def _ppo():
    """PPO's minibatch step on both networks, advantages standardised over the batch."""
    learner = ppo.PPOLearner(SPEC, (16,), (16,))
    params = learner.init(jax.random.key(0))
    optimizer = learner.optimizer(PPO_HP.learning_rate)

    def update(state, transitions, key, axis):
        params, opt_state = state
        batch = _ppo_samples(transitions)
        params, opt_state, _ = learner.update(params, opt_state, None, batch, PPO_HP, key, axis)
        return params, opt_state

    def reference(state, transitions, key):
        params, opt_state = state
        batch = _ppo_samples(transitions)
        advantage = batch.advantage - jnp.mean(batch.advantage)
        advantage = advantage / (jnp.sqrt(jnp.mean(advantage**2)) + 1e-8)
        batch = batch.replace(advantage=advantage)

        def loss(params, *args):
            return learner.loss(params, *args)[0]

        args = (None, batch, PPO_HP, key, jnp.arange(BATCH))
        return _full_batch_step(loss, optimizer, opt_state, params, *args)

    return update, reference, (params, optimizer.init(params)), 1


def _ppo_samples(t):
    """PPO's samples made of a batch of transitions: their actions, rewards and next
    observations' first coordinate as the samples' log-probabilities, advantages and targets."""
    return ppo.Samples(
        obs=t.obs,
        raw_action=0.5 * t.action,
        log_prob=-1.0 + 0.3 * t.next_obs[:, 0],
        advantage=t.reward,
        target=t.next_obs[:, 1],
    )


LEARNERS = {"td3": _td3, "sac": _sac, "ppo": _ppo}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_learner_update_on_dp_devices_equals_full_batch_step(monkeypatch, name, n):
    """A learner's update takes its gradient steps through agent_gradient_update (and
    never gradient_update itself); with the minibatch split over n 'DP' devices it
    equals the whole batch's optimizer steps written out with jax.grad, without a mesh."""
    update, reference, state, steps = LEARNERS[name]()
    calls = []

    def spy(fn):
        def wrapped(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(
        distributed, "agent_gradient_update", spy(distributed.agent_gradient_update)
    )
    monkeypatch.setattr(distributed, "gradient_update", spy(distributed.gradient_update))
    batch = _transitions(jax.random.key(1))
    key = jax.random.key(2)
    ref = jax.jit(reference)(state, batch, key)
    mesh = make_mesh(n, axis_name=distributed.DP_AXIS_NAME)
    sharded = jax.shard_map(
        lambda s, b, k: update(s, b, k, distributed.DP_AXIS_NAME),
        mesh=mesh,
        in_specs=(P(), P(distributed.DP_AXIS_NAME), P()),
        out_specs=P(),
    )
    got = jax.jit(sharded)(state, batch, key)
    assert calls == ["agent_gradient_update"] * steps
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the reference moved every network, target and optimizer moment
    for after, before in zip(jax.tree.leaves(ref), jax.tree.leaves(state), strict=True):
        assert after.ndim == 0 or not np.array_equal(after, before)
