"""A2C against references: the loss against NumPy, the update and the step on 2 and 4
devices against one, a resumed command-line run against an uninterrupted one, and
(slow) CartPole-v1 and Pendulum-v1 to stated returns."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _learners import assert_resume_equals_whole_run, leaves_close, two_steps
from jax.sharding import PartitionSpec as P

from evorl_pop import make_mesh, registry
from evorl_pop.algorithms import pbt
from evorl_pop.algorithms.a2c import (
    A2C,
    A2CLearner,
    Config,
    Hyperparameters,
    policy_gradient_loss,
)
from evorl_pop.base import ConfigError
from evorl_pop.rl import ppo
from evorl_pop.tasks.envs import make_env

TINY = dict(num_envs=8, unroll_length=8, policy_hidden_sizes=(16,), value_hidden_sizes=(16,))
HP = Hyperparameters.create(learning_rate=1e-2, entropy_cost=0.05, gae_lambda=0.9, discount=0.95)


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    # In-process commands with --devices edit XLA_FLAGS; undo it afterwards.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _samples(spec, n, key):
    k = jax.random.split(key, 5)
    if spec.discrete:
        raw = jax.random.randint(k[0], (n,), 0, spec.action_dim)
    else:
        raw = jax.random.normal(k[0], (n, spec.action_dim))
    return ppo.Samples(
        obs=jax.random.normal(k[1], (n, *spec.obs_shape)),
        raw_action=raw,
        log_prob=-1.0 + 0.3 * jax.random.normal(k[2], (n,)),
        advantage=jax.random.normal(k[3], (n,)),
        target=jax.random.normal(k[4], (n,)),
    )


def _log_prob_and_entropy(spec, out, raw, key):
    """NumPy log-probabilities and entropies of the network outputs (Pendulum: half
    range 2, the entropy sample of sample i from fold_in(key, i))."""
    n = out.shape[0]
    if spec.discrete:
        logp_all = out - np.log(np.exp(out).sum(-1, keepdims=True))
        return logp_all[np.arange(n), raw], -(np.exp(logp_all) * logp_all).sum(-1)
    loc = out[:, :1]
    scale = np.log1p(np.exp(out[:, 1:])) + 1e-3
    log_dtanh = lambda u: np.log(2.0 * (1 - np.tanh(u) ** 2))  # noqa: E731
    gauss = -0.5 * ((raw - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)
    eps = np.stack(
        [np.asarray(jax.random.normal(jax.random.fold_in(key, i), (1,))) for i in range(n)]
    )
    entropy = 0.5 + 0.5 * np.log(2 * np.pi) + np.log(scale) + log_dtanh(loc + scale * eps)
    return (gauss - log_dtanh(raw)).sum(-1), entropy.sum(-1)


@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1"])
def test_loss_matches_numpy_from_the_network_outputs(task):
    """``-mean(log pi A) + c_v 1/2 mean((V - target)^2) - c_ent mean(H)``; the gradient
    of the policy term is ``-mean(A grad log pi)`` (the advantages are constants)."""
    spec = make_env(task).spec
    learner = A2CLearner(spec, policy_hidden_sizes=(16,), value_hidden_sizes=(16,),
                         vf_coefficient=0.7)  # fmt: skip
    params = learner.init(jax.random.key(0))
    batch = _samples(spec, 16, jax.random.key(1))
    key = jax.random.key(2)
    loss, parts = learner.loss(params, None, batch, HP, key, jnp.arange(16))
    out = np.asarray(learner.policy_net.apply(params.policy, batch.obs), np.float64)
    value = np.asarray(learner.value_net.apply(params.value, batch.obs))[:, 0]
    log_prob, entropy = _log_prob_and_entropy(spec, out, np.asarray(batch.raw_action), key)
    adv = np.asarray(batch.advantage)
    policy = -np.mean(log_prob * adv)
    v_loss = 0.5 * np.mean((value - np.asarray(batch.target)) ** 2)
    np.testing.assert_allclose(parts["policy_loss"], policy, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(parts["value_loss"], v_loss, rtol=1e-4)
    np.testing.assert_allclose(parts["entropy"], entropy.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(loss, policy + 0.7 * v_loss - 0.05 * entropy.mean(), rtol=1e-4)
    if spec.discrete:  # d/dlogits of -mean(A log softmax[a]) = -mean(A (onehot - p))
        grad = jax.grad(lambda o: _policy_term(learner, o, batch))(jnp.asarray(out, jnp.float32))
        p = np.exp(out) / np.exp(out).sum(-1, keepdims=True)
        onehot = np.eye(spec.action_dim)[np.asarray(batch.raw_action)]
        np.testing.assert_allclose(grad, -(adv[:, None] * (onehot - p)) / 16, rtol=1e-4, atol=1e-7)


def _policy_term(learner, out, batch):
    """The policy term of the loss as a function of the network outputs."""
    log_prob = learner.distribution.log_prob(out, batch.raw_action)
    return policy_gradient_loss(log_prob, batch.advantage)


@pytest.mark.parametrize(
    ("task", "n"),
    [
        pytest.param("Pendulum-v1", 1, marks=pytest.mark.slow),
        pytest.param("Pendulum-v1", 2, marks=pytest.mark.slow),
        ("Pendulum-v1", 4),
        pytest.param("CartPole-v1", 4, marks=pytest.mark.slow),
    ],
)
def test_dp_update_equals_full_batch(task, n):
    """Two gradient steps on a fixed batch: its slices on n devices, pmean'd (with the
    advantages normalised by the global batch's statistics)."""
    spec = make_env(task).spec
    learner = A2CLearner(spec, policy_hidden_sizes=(16,), value_hidden_sizes=(16,),
                         normalize_advantage=True)  # fmt: skip
    params = learner.init(jax.random.key(0))
    opt_state = learner.optimizer(HP.learning_rate).init(params)
    batch = _samples(spec, 32, jax.random.key(1))

    def two_updates(params, opt_state, batch, key, axis):
        params, opt_state, m1 = learner.train(params, opt_state, None, batch, HP, key, axis)
        key = jax.random.fold_in(key, 1)
        return learner.train(params, opt_state, None, batch, HP, key, axis), m1

    ref = jax.jit(lambda *a: two_updates(*a, None))(params, opt_state, batch, jax.random.key(2))
    sharded = jax.shard_map(
        lambda *a: two_updates(*a, "DP"),
        mesh=make_mesh(n, axis_name="DP"),
        in_specs=(P(), P(), P("DP"), P()),
        out_specs=P(),
    )
    got = jax.jit(sharded)(params, opt_state, batch, jax.random.key(2))
    leaves_close(got, ref)
    assert not np.allclose(jax.tree.leaves(ref[0][0])[0], jax.tree.leaves(params)[0])


def test_step_is_gae_then_one_update():
    """A step is the unroll, GAE with the networks that acted, one update on the whole
    batch and then the observation statistics."""
    config = Config(task="Pendulum-v1", **TINY)
    algo = A2C(config)
    state = algo.fresh(jax.random.key(0))
    key = jax.random.key(1)
    got, _ = jax.jit(lambda s: algo.local_step(s, key, None))(state)
    params = jax.jit(_by_hand, static_argnums=0)(algo, state, key)
    leaves_close(got.params, params)
    assert float(got.obs_norm.count) == 64 and float(state.obs_norm.count) == 0


def _by_hand(algo, state, key):
    """The networks after a step, from the unroll, ``ppo.gae`` and ``update``."""
    collect_key, train_key = jax.random.split(key)
    envs, rollout = algo.collect(state, collect_key)
    hp = state.hyperparameters
    advantage, target = ppo.gae(
        rollout.reward,
        algo.learner.values(state.params, state.obs_norm, rollout.obs),
        algo.learner.values(state.params, state.obs_norm, envs.obs),
        rollout.terminal,
        rollout.truncated,
        hp.discount,
        hp.gae_lambda,
    )
    samples = ppo.Samples(rollout.obs, rollout.raw_action, rollout.log_prob, advantage, target)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), samples)
    params, _, _ = algo.learner.update(
        state.params, state.opt_state, state.obs_norm, samples, hp, train_key
    )
    return params


@pytest.mark.slow
def test_step_is_the_same_on_1_and_4_devices():
    config = Config(task="Pendulum-v1", **TINY)
    start, ref, ref_metrics = two_steps(A2C(config, make_mesh(1, axis_name="DP")))
    _, other, metrics = two_steps(A2C(config, make_mesh(4)))  # a POP mesh is reused as DP
    leaves_close(other, ref)
    leaves_close(metrics, ref_metrics)
    assert not np.allclose(jax.tree.leaves(ref.params)[0], jax.tree.leaves(start.params)[0])
    assert int(ref.generation) == 2


def test_registered_as_algorithm_and_learner_and_config_errors():
    assert registry.ALGORITHMS.find("a2c").algorithm_class is A2C
    assert registry.LEARNERS.find("a2c").member.searchable == (
        "learning_rate", "entropy_cost", "gae_lambda", "discount",
    )  # fmt: skip
    # a PBT member: learner=a2c takes its settings from learner_settings
    members = pbt.Config(task="CartPole-v1", learner="a2c", learner_settings={"num_envs": 4})
    members.validate()
    assert members.learner_config() == Config(task="CartPole-v1", num_envs=4, unroll_length=5)
    assert [h.name for h in members.searched()] == [
        "learning_rate", "entropy_cost", "gae_lambda", "discount",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="gae_lambda must be in"):
        Config(gae_lambda=1.5).validate()
    with pytest.raises(ConfigError, match=r"multiple of 4 \(e.g. 4 or 8\): change num_envs"):
        A2C(Config(**{**TINY, "num_envs": 6}), make_mesh(4))
    with pytest.raises(ConfigError, match="a2c learns a policy in an environment, and 'sphere'"):
        Config(task="sphere").validate()
    with pytest.raises(ConfigError, match="network='cnn' needs image observations"):
        A2C(Config(network="cnn"))


RUN = [
    *"train -a a2c --task CartPole-v1 --devices 2 --chunk 1 --checkpoint-every 1".split(),
    *"--quiet --no-figure --seed 3 --set num_envs=8 --set unroll_length=8".split(),
    *"--set policy_hidden_sizes=[16] --set value_hidden_sizes=[16]".split(),
]


def test_resume_equals_uninterrupted_run(tmp_path):
    ckpt = assert_resume_equals_whole_run(RUN, tmp_path, generations=4, split=2)
    assert ckpt.env_steps == 4 * 64


# --- learning ------------------------------------------------------------------------


def learn(algo, seed, steps, chunk_steps=20_480):
    """Trains ``algo`` for up to ``steps`` environment steps in jitted chunks; returns
    ``(best mean training return, state, seconds)``."""
    per = algo.config.num_envs * algo.config.unroll_length
    n = max(1, chunk_steps // per)
    state = algo.init(jax.random.key(seed))
    chunk = jax.jit(lambda s, k: jax.lax.scan(algo.step, s, jax.random.split(k, n)))
    start, best = time.perf_counter(), -np.inf
    for i in range(-(-steps // (n * per))):
        state, metrics = chunk(state, jax.random.fold_in(jax.random.key(seed + 1), i))
        best = max(best, float(np.nanmax(metrics["fitness_mean"])))
    return best, state, time.perf_counter() - start


@pytest.mark.slow
def test_a2c_solves_cartpole():
    """``learning_rate=3e-3``, the other settings the defaults (16 x 16 steps a gradient
    step): the mean training return reaches 450 within 600k environment steps.

    Measured on the shared 2-core CPU (one device): 500 after 160k-240k steps (seeds 0-2).
    """
    algo = A2C(Config(task="CartPole-v1", learning_rate=3e-3))
    best, state, seconds = learn(algo, 0, 600_000)
    assert best >= 450, f"best mean return {best} after {int(state.generation) * 256} steps"
    assert seconds < 150, f"{seconds:.0f} s"


@pytest.mark.slow
def test_a2c_learns_pendulum():
    """``reward_scaling=0.1``, the defaults otherwise: the mean training return passes
    -400 within 1M environment steps (a random policy: about -1200)."""
    algo = A2C(Config(task="Pendulum-v1", reward_scaling=0.1))
    best, state, seconds = learn(algo, 0, 1_000_000)
    assert best >= -400, f"best mean return {best} after {int(state.generation) * 256} steps"
    assert seconds < 150, f"{seconds:.0f} s"
