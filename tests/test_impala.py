"""IMPALA against references: V-trace and its policy-gradient advantages against a
NumPy transcription of the paper's sums (and rlax where it applies), the loss against
NumPy, the actors' lag, the update and the step on 2 and 4 devices against one, a
resumed command-line run against an uninterrupted one, and (slow) CartPole-v1 and
Pendulum-v1 to stated returns."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from _learners import assert_resume_equals_whole_run, leaves_close, two_steps
from jax.sharding import PartitionSpec as P
from test_a2c import _log_prob_and_entropy, learn

from evorl_pop import make_mesh, registry
from evorl_pop.algorithms.impala import (
    IMPALA,
    Config,
    Hyperparameters,
    ImpalaLearner,
    vtrace,
)
from evorl_pop.base import ConfigError
from evorl_pop.rl import ppo
from evorl_pop.tasks.envs import make_env

TINY = dict(num_envs=8, unroll_length=8, policy_hidden_sizes=(16,), value_hidden_sizes=(16,))
HP = Hyperparameters.create(
    learning_rate=1e-2, entropy_cost=0.05, discount=0.95, rho_bar=1.3, c_bar=0.8
)


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


# --- V-trace against the paper's sums -------------------------------------------------


def _vtrace_numpy(value, bootstrap, reward, terminal, truncated, ratio, gamma, rho_bar, c_bar):
    """Espeholt et al. (2018) Eq. (1) written out for one lane:
    ``v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t`` with
    ``delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``, ``gamma_t = gamma`` but 0
    at a terminal step; the sum stops before a step at the time limit, whose own
    target is ``V(x_t)``. The advantage is ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))``
    (0 at the time limit), ``v_T = V(x_T)``."""
    T = len(value)
    rho = np.minimum(rho_bar, ratio)
    c = np.minimum(c_bar, ratio)
    g = gamma * (1.0 - terminal)
    next_v = np.append(value[1:], bootstrap)
    vs = np.array(value, np.float64)
    for s in range(T):
        for t in range(s, T):
            if truncated[t]:
                break
            weight = np.prod([g[i] * c[i] for i in range(s, t)])  # 1 for t == s
            vs[s] += weight * rho[t] * (reward[t] + g[t] * next_v[t] - value[t])
    next_vs = np.append(vs[1:], bootstrap)
    advantage = rho * (reward + g * next_vs - value) * (1.0 - truncated)
    return vs, advantage


def _batch(T=9, lanes=3, seed=0):
    rng = np.random.default_rng(seed)
    value, reward = rng.normal(size=(2, T, lanes))
    bootstrap = rng.normal(size=lanes)
    ratio = np.exp(rng.normal(0.0, 0.6, size=(T, lanes)))  # many above 1.3 and 0.8
    terminal, truncated = np.zeros((2, T, lanes))
    terminal[3, 0] = terminal[T - 1, 2] = 1.0  # an episode end inside the trajectory
    truncated[5, 1] = 1.0  # and a time limit inside another
    return value, bootstrap, reward, terminal, truncated, ratio


def _jax_vtrace(value, bootstrap, reward, terminal, truncated, ratio, gamma, rho_bar, c_bar):
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return vtrace(
        f32(value), f32(bootstrap), f32(reward), gamma * (1.0 - f32(terminal)),
        jnp.log(f32(ratio)), f32(truncated), rho_bar, c_bar,
    )  # fmt: skip


def test_vtrace_matches_the_papers_sums():
    value, bootstrap, reward, terminal, truncated, ratio = batch = _batch()
    assert (ratio > 1.3).sum() >= 3 and (ratio < 0.8).sum() >= 3  # both clips bind
    vs, advantage = _jax_vtrace(*batch, 0.9, 1.3, 0.8)
    for lane in range(3):
        ref_vs, ref_adv = _vtrace_numpy(*(x[..., lane] for x in batch), 0.9, 1.3, 0.8)
        np.testing.assert_allclose(vs[:, lane], ref_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(advantage[:, lane], ref_adv, rtol=1e-5, atol=1e-5)
    # the episode end: the step's target is its own reward, and nothing after it counts
    rho = min(1.3, ratio[3, 0])
    np.testing.assert_allclose(vs[3, 0], value[3, 0] + rho * (reward[3, 0] - value[3, 0]), 1e-5)
    # the time limit: no target, no advantage; the step before bootstraps from V(x_5)
    assert vs[5, 1] == pytest.approx(value[5, 1]) and advantage[5, 1] == 0.0


def test_vtrace_on_policy_is_the_n_step_return():
    """With pi = mu and no clipping, ``v_s`` is the discounted return to the unroll's
    end, bootstrapped (Remark 1 of the paper)."""
    value, bootstrap, reward, *_ = _batch(T=6, lanes=3, seed=1)
    zeros = np.zeros_like(value)
    vs, _ = _jax_vtrace(value, bootstrap, reward, zeros, zeros, np.ones_like(value), 0.9, 1, 1)
    T = len(value)
    returns = [
        sum(0.9**j * reward[s + j] for j in range(T - s)) + 0.9 ** (T - s) * bootstrap
        for s in range(T)
    ]
    np.testing.assert_allclose(vs, np.stack(returns), rtol=1e-5, atol=1e-5)


def test_vtrace_equals_rlax_with_its_fixed_c_bar():
    """rlax's ``vtrace_td_error_and_advantage`` (c_bar fixed at 1, no time limits)."""
    value, bootstrap, reward, terminal, _, ratio = _batch(seed=2)
    none = np.zeros_like(value)
    vs, advantage = _jax_vtrace(value, bootstrap, reward, terminal, none, ratio, 0.9, 1.3, 1.0)
    for lane in range(3):
        v = value[:, lane]
        out = rlax.vtrace_td_error_and_advantage(
            jnp.asarray(v, jnp.float32),
            jnp.asarray(np.append(v[1:], bootstrap[lane]), jnp.float32),
            jnp.asarray(reward[:, lane], jnp.float32),
            jnp.asarray(0.9 * (1.0 - terminal[:, lane]), jnp.float32),
            jnp.asarray(ratio[:, lane], jnp.float32),
            clip_rho_threshold=1.3,
            clip_pg_rho_threshold=1.3,
        )
        np.testing.assert_allclose(vs[:, lane], out.errors + v, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(advantage[:, lane], out.pg_advantage, rtol=1e-5, atol=1e-5)


# --- the loss and the update ----------------------------------------------------------


def _segments(spec, lanes, T, key):
    k = jax.random.split(key, 6)
    if spec.discrete:
        raw = jax.random.randint(k[0], (lanes, T), 0, spec.action_dim)
    else:
        raw = jax.random.normal(k[0], (lanes, T, spec.action_dim))
    terminal = jnp.zeros((lanes, T)).at[0, 2].set(1.0)
    return ppo.Segments(
        obs=jax.random.normal(k[1], (lanes, T, *spec.obs_shape)),
        raw_action=raw,
        log_prob=-1.0 + 0.5 * jax.random.normal(k[2], (lanes, T)),
        reward=jax.random.normal(k[3], (lanes, T)),
        terminal=terminal,
        truncated=jnp.zeros((lanes, T)).at[1, 4].set(1.0),
        bootstrap_obs=jax.random.normal(k[4], (lanes, *spec.obs_shape)),
    )


@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1"])
def test_loss_matches_numpy_from_the_network_outputs(task):
    spec = make_env(task).spec
    learner = ImpalaLearner(spec, policy_hidden_sizes=(16,), value_hidden_sizes=(16,),
                            vf_coefficient=0.7)  # fmt: skip
    params = learner.init(jax.random.key(0))
    lanes, T = 2, 6
    batch = _segments(spec, lanes, T, jax.random.key(1))
    key = jax.random.key(2)
    loss, parts = learner.loss(params, None, batch, HP, key, jnp.arange(lanes * T))
    flat = lambda x: np.asarray(x).reshape(lanes * T, *x.shape[2:])  # noqa: E731
    out = np.asarray(learner.policy_net.apply(params.policy, flat(batch.obs)), np.float64)
    value = np.asarray(learner.value_net.apply(params.value, flat(batch.obs)))[:, 0]
    bootstrap = np.asarray(learner.value_net.apply(params.value, batch.bootstrap_obs))[:, 0]
    log_prob, entropy = _log_prob_and_entropy(spec, out, flat(batch.raw_action), key)
    ratio = np.exp(log_prob.reshape(lanes, T) - np.asarray(batch.log_prob))
    vs, adv = zip(
        *(
            _vtrace_numpy(
                value.reshape(lanes, T)[i],
                bootstrap[i],
                np.asarray(batch.reward)[i],
                np.asarray(batch.terminal)[i],
                np.asarray(batch.truncated)[i],
                ratio[i],
                0.95,
                1.3,
                0.8,
            )  # fmt: skip
            for i in range(lanes)
        ),
        strict=True,
    )
    policy = -np.mean(log_prob * np.concatenate(adv))
    v_loss = 0.5 * np.mean((value - np.concatenate(vs)) ** 2)
    np.testing.assert_allclose(parts["policy_loss"], policy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(parts["value_loss"], v_loss, rtol=1e-4)
    np.testing.assert_allclose(parts["abs_log_ratio"], np.abs(np.log(ratio)).mean(), rtol=1e-4)
    np.testing.assert_allclose(loss, policy + 0.7 * v_loss - 0.05 * entropy.mean(), rtol=1e-4)


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
    """Two gradient steps on fixed lanes: each device V-trace on its lanes, pmean'd."""
    spec = make_env(task).spec
    learner = ImpalaLearner(spec, policy_hidden_sizes=(16,), value_hidden_sizes=(16,))
    params = learner.init(jax.random.key(0))
    opt_state = learner.optimizer(HP.learning_rate).init(params)
    batch = _segments(spec, 8, 5, jax.random.key(1))

    def two_updates(params, opt_state, batch, key, axis):
        params, opt_state, m1 = learner.update(params, opt_state, None, batch, HP, key, axis)
        key = jax.random.fold_in(key, 1)
        return learner.update(params, opt_state, None, batch, HP, key, axis), m1

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


# --- the actors' lag --------------------------------------------------------------------


def test_actors_act_with_the_policy_of_actor_lag_updates_ago_and_the_ratios_count():
    algo = IMPALA(Config(task="CartPole-v1", actor_lag=2, learning_rate=1e-2, **TINY))
    state = algo.fresh(jax.random.key(0))
    step = jax.jit(lambda s, k: algo.local_step(s, k, None))
    history = [state.params.policy]
    ratios = []
    for i in range(4):
        behaviour = algo.behaviour(state)
        # generation k acts with the learner's policy of generation max(k - 2, 0)
        leaves_close(behaviour.params.policy, history[max(i - 2, 0)], rtol=0, atol=0)
        state, metrics = step(state, jax.random.key(i))
        history.append(state.params.policy)
        ratios.append(float(metrics["abs_log_ratio"]))
    assert ratios[0] < 1e-5  # the first policy acts and learns
    assert ratios[3] > 1e-3  # two updates behind: pi / mu is not 1
    pairs = zip(jax.tree.leaves(history[2]), jax.tree.leaves(history[4]), strict=True)
    assert any(not np.allclose(a, b) for a, b in pairs)
    # The update uses the ratios: the same lanes taken as on-policy step elsewhere.
    _, rollout = jax.jit(algo.collect)(algo.behaviour(state), jax.random.key(7))
    lanes = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    segments = ppo.Segments(*map(lanes, jax.tree.leaves(rollout)), state.envs.obs)
    obs = segments.obs.reshape(-1, *segments.obs.shape[2:])
    out = algo.learner.policy_net.apply(state.params.policy, algo._obs_norm(state).normalize(
        obs, ppo.OBS_CLIP))  # fmt: skip
    own = algo.learner.distribution.log_prob(out, segments.raw_action.reshape(-1))
    on_policy = segments.replace(log_prob=own.reshape(segments.log_prob.shape))
    hp, key = state.hyperparameters, jax.random.key(8)
    args = (state.params, state.opt_state, algo._obs_norm(state))
    update = jax.jit(algo.learner.update)
    off, _, off_metrics = update(*args, segments, hp, key)
    on, _, on_metrics = update(*args, on_policy, hp, key)
    assert float(off_metrics["abs_log_ratio"]) > 1e-3
    assert float(on_metrics["abs_log_ratio"]) < 1e-5
    pairs = zip(jax.tree.leaves(off), jax.tree.leaves(on), strict=True)
    assert any(not np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)


def test_no_lag_acts_with_the_learner():
    algo = IMPALA(Config(task="CartPole-v1", actor_lag=0, **TINY))
    _, state, metrics = two_steps(algo)
    assert state.actors is None
    np.testing.assert_array_less(metrics["abs_log_ratio"], 1e-5)


def test_step_is_the_same_on_1_and_4_devices():
    config = Config(task="Pendulum-v1", actor_lag=1, **TINY)
    start, ref, ref_metrics = two_steps(IMPALA(config, make_mesh(1, axis_name="DP")))
    _, got, metrics = two_steps(IMPALA(config, make_mesh(4)))
    leaves_close(got, ref)
    leaves_close(metrics, ref_metrics)
    assert not np.allclose(jax.tree.leaves(ref.params)[0], jax.tree.leaves(start.params)[0])


def test_registered_as_algorithm_and_learner_and_config_errors():
    assert registry.ALGORITHMS.find("impala").algorithm_class is IMPALA
    assert "rho_bar" in registry.LEARNERS.find("impala").member.searchable
    with pytest.raises(ConfigError, match="rho_bar and c_bar must be > 0"):
        Config(c_bar=0.0).validate()
    with pytest.raises(ConfigError, match="actor_lag must be an integer >= 0"):
        Config(actor_lag=-1).validate()
    with pytest.raises(ConfigError, match="impala learns a policy in an environment"):
        Config(task="sphere").validate()


RUN = [
    *"train -a impala --task Pendulum-v1 --devices 2 --chunk 1 --checkpoint-every 1".split(),
    *"--quiet --no-figure --seed 3 --set num_envs=8 --set unroll_length=8".split(),
    *"--set actor_lag=2 --set policy_hidden_sizes=[16] --set value_hidden_sizes=[16]".split(),
]


def test_resume_equals_uninterrupted_run(tmp_path):
    ckpt = assert_resume_equals_whole_run(RUN, tmp_path, generations=4, split=2)
    assert ckpt.env_steps == 4 * 64


# --- learning ------------------------------------------------------------------------


@pytest.mark.slow
def test_impala_solves_cartpole_with_lagged_actors():
    """``learning_rate=3e-3`` and actors two updates behind (16 x 16 steps a gradient
    step): the mean training return reaches 450 within 600k environment steps."""
    algo = IMPALA(Config(task="CartPole-v1", learning_rate=3e-3, actor_lag=2))
    best, state, seconds = learn(algo, 0, 600_000)
    assert best >= 450, f"best mean return {best} after {int(state.generation) * 256} steps"
    assert seconds < 150, f"{seconds:.0f} s"


@pytest.mark.slow
def test_impala_learns_pendulum():
    """``learning_rate=5e-4``, ``reward_scaling=0.1``, actors one update behind: the mean
    training return passes -400 within 1.5M environment steps (random: about -1200)."""
    algo = IMPALA(Config(task="Pendulum-v1", learning_rate=5e-4, reward_scaling=0.1))
    best, state, seconds = learn(algo, 0, 1_500_000)
    assert best >= -400, f"best mean return {best} after {int(state.generation) * 256} steps"
    assert seconds < 150, f"{seconds:.0f} s"
