"""PGA-ME (MAP-Elites' ``pga_me`` emitter) on a brax QD task, with tiny settings.

The batch's halves as configured; the isoline half equal to isoline variation of the
same parents; a policy-gradient candidate equal to Adam steps, computed here by hand,
of the actor loss's gradient through the critic on the same minibatches; the greedy
actor injected; the episodes' descriptors those of the task's own evaluation; exact
resume; the same archive and TD3 state on 1 and 2 devices (to float rounding: the
gradients averaged over the devices sum in another order).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.mapelites import MapElites, MapElitesConfig
from evorl_pop.algorithms.pgame import PgEmitterConfig
from evorl_pop.algorithms.qd_emitters import isoline_variation
from evorl_pop.base import ConfigError
from evorl_pop.rl import replay
from evorl_pop.run import store

pytest.importorskip("brax")

TINY = dict(
    task="qd/hopper_uni",
    emitter="pga_me",
    population_size=8,
    hidden_sizes=(8,),
    episode_length=10,
    cells_per_dim=5,
    pga_me=PgEmitterConfig(
        critic_hidden_sizes=(8,), batch_size=16, steps=2, critic_updates=2, buffer_size=1000
    ),
)


def _adam(params, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """Adam's steps from a fresh state (optax's defaults), in float64."""
    x = np.asarray(params, np.float64)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        x = x - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return x


# brax compilation: a minute or two each on 2 cores, in the long tier
@pytest.mark.slow
def test_pgame_batch_policy_gradient_and_episodes():
    config = MapElitesConfig(**TINY)
    me = MapElites(config, mesh=make_mesh(1))
    emitter = me.emitter
    assert (emitter.num_iso, emitter.num_pg) == (4, 4)
    state = jax.jit(me.init)(jax.random.key(0))
    # the initial batch's steps are in the buffer
    assert 8 <= int(state.emitter.buffer.size) <= 80

    key = jax.random.key(5)
    population, _ = jax.jit(emitter.ask)(state.archive, state.emitter, key)
    assert population.shape == (8, me.task.num_dims)
    k_iso_parents, k_vary, k_pg_parents, k_pg = jax.random.split(key, 4)
    parents = me.archive.sample(state.archive, k_iso_parents, 8)
    x, y = jnp.split(parents, 2)
    iso = isoline_variation(k_vary, x, y, config.iso_sigma, config.line_sigma)
    # compiled inside the emitter, eager here: the same to float rounding
    np.testing.assert_allclose(population[:4], iso, rtol=1e-6, atol=1e-7)
    # the last candidate: the TD3 greedy actor
    actor = jax.flatten_util.ravel_pytree(state.emitter.td3.actor.params)[0]
    np.testing.assert_array_equal(population[-1], actor)

    # candidate 4: its parent moved by pga_me.steps Adam steps of the actor loss through the
    # first critic, on the minibatches its key draws, computed directly
    pg_parents = me.archive.sample(state.archive, k_pg_parents, 3)
    td3 = emitter.td3
    critic = state.emitter.td3.critic.params
    buffer = state.emitter.buffer

    def loss(flat, obs):
        return td3.actor_loss(me.task.unravel(flat), critic, obs)

    grad = jax.jit(jax.grad(loss))
    keys = jax.random.split(jax.random.fold_in(k_pg, 0), config.pga_me.steps)
    flat = np.asarray(pg_parents[0], np.float64)
    grads = []
    for t in range(config.pga_me.steps):
        batch, _ = replay.sample(buffer, keys[t], config.pga_me.batch_size)
        # Adam's state carries over, so each gradient is taken at the stepped params
        g = grad(jnp.asarray(flat, jnp.float32), batch.obs)
        grads.append(g)
        flat = _adam(pg_parents[0], grads, config.pga_me.policy_lr)
    assert np.abs(np.asarray(population[4]) - np.asarray(pg_parents[0])).max() > 1e-4
    np.testing.assert_allclose(population[4], flat, rtol=1e-5, atol=1e-6)

    # the collected episodes: the task's own returns and descriptors, their steps
    solutions = population[:3]
    ev_keys = jax.random.split(jax.random.key(1), 3)
    ref = jax.jit(jax.vmap(me.task.evaluate_descriptor, (0, 0, None)))(solutions, ev_keys, ())

    def collect(x, k):
        return me.task.episode(x, k, collect=True)

    ret, info, (desc, transitions, valid) = jax.jit(jax.vmap(collect))(solutions, ev_keys)
    np.testing.assert_allclose(ret, ref[0], rtol=1e-5)
    np.testing.assert_array_equal(info.steps, ref[1].steps)
    np.testing.assert_allclose(desc, ref[2], atol=1e-6)
    np.testing.assert_array_equal(valid.sum(1), info.steps)
    summed = np.where(valid, transitions.reward, 0.0).sum(1)
    np.testing.assert_allclose(summed, ret, rtol=1e-5)

    # two generations: the buffer takes every step, the critic learns
    step = jax.jit(me.step)
    size = int(state.emitter.buffer.size)
    for g in range(2):
        state, metrics = step(state, jax.random.key(10 + g))
        size += int(metrics["env_steps"])
        assert int(state.emitter.buffer.size) == size
        assert np.isfinite(float(metrics["emitter_critic_loss"]))
    assert int(state.generation) == 2 and int(state.emitter.td3.updates) == 4


def test_pgame_refuses_black_box_tasks():
    with pytest.raises(ConfigError, match="pga_me needs a task with an environment"):
        MapElitesConfig(task="qd/arm", emitter="pga_me").validate()
    with pytest.raises(ConfigError, match=r"pga_me\.proportion must be in \[0, 1\]"):
        MapElitesConfig(**{**TINY, "pga_me": PgEmitterConfig(proportion=1.5)}).validate()


def _rows(run):
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


@pytest.mark.exhaustive
def test_pgame_resume_equals_uninterrupted_run(tmp_path):
    args = ["-a", "mapelites", "--task", "qd/hopper_uni", "--chunk", "1", "-q", "--no-figure"]
    settings = {k: v for k, v in TINY.items() if k not in ("task", "pga_me")}
    settings.update({f"pga_me.{k}": v for k, v in dataclasses.asdict(TINY["pga_me"]).items()})
    for name, value in settings.items():
        text = f"[{','.join(map(str, value))}]" if isinstance(value, tuple) else value
        args += ["--set", f"{name}={text}"]
    whole = tmp_path / "whole"
    part = tmp_path / "part"
    assert cli.main(["train", *args, "--devices", "1", "-g", "2", "--out", str(whole)]) == 0
    assert cli.main(["train", *args, "--devices", "1", "-g", "1", "--out", str(part)]) == 0
    assert cli.main(["resume", str(part), "--more", "1", "-q", "--no-figure"]) == 0
    resumed = _rows(part)
    uninterrupted = _rows(whole)
    assert list(resumed) == list(uninterrupted) and len(resumed["generation"]) == 2
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    a = np.load(whole / "archive.npz")
    b = np.load(part / "archive.npz")
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.exhaustive
def test_pgame_same_archive_on_1_and_2_devices():
    config = MapElitesConfig(**TINY)
    results = []
    for n in (1, 2):
        me = MapElites(config, mesh=make_mesh(n))
        state = jax.jit(me.init)(jax.random.key(3))
        step = jax.jit(me.step)
        for g in range(2):
            state, _ = step(state, jax.random.key(20 + g))
        results.append((me.archive.to_numpy(state.archive), jax.device_get(state.emitter)))
    (a1, e1), (a2, e2) = results
    # the same cells filled; the policy-gradient elites' weights, their fitness and
    # descriptors to float rounding (a gradient averaged over two half-batches sums
    # in another order than the full batch's)
    np.testing.assert_array_equal(a1["filled"], a2["filled"])
    np.testing.assert_array_equal(a1["centroids"], a2["centroids"])
    for name in ("genotypes", "fitness", "descriptors"):
        np.testing.assert_allclose(a1[name], a2[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for x, y in zip(jax.tree.leaves(e1), jax.tree.leaves(e2), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
