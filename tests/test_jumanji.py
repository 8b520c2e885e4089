"""Jumanji's family: its episodes are Jumanji's own stepped with the same actions (one head
with a mask, a joint head over a multi-discrete space, one head per dimension), the
policies never pick a masked action, ES has the same history on 1 and 2 devices, PPO
runs on it and resumes exactly, and the listing is Jumanji's registry less what is
left out, with the reason."""

import _loop
import jax
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.rl.distributions import MultiCategorical
from evorl_pop.run import store
from evorl_pop.tasks.envs import env_names, make_env
from evorl_pop.tasks.policies import make_policy
from evorl_pop.tasks.rollout import rollout

jumanji = pytest.importorskip("jumanji")

from evorl_pop.tasks.jumanji_envs import JUMANJI_IDS, UNLISTED_JUMANJI  # noqa: E402

LENGTH = 30


def _flat(obs) -> np.ndarray:
    """The observation's fields in order, each raveled, as float32 (NumPy's own reading)."""
    parts = [np.asarray(v, np.float32).ravel() for v in jax.tree.leaves(obs)]
    return np.concatenate(parts)


def _policy_action(env, module, params, obs) -> tuple[np.ndarray, object]:
    """The policy's action for Jumanji's ``obs``, masked in NumPy: ``(Jumanji's action,
    the policy's own)``."""
    logits = np.asarray(module.apply(params, _flat(obs)), np.float64)
    spec = env.spec
    mask = getattr(obs, "action_mask", None)
    if mask is not None:
        logits = np.where(np.asarray(mask).ravel(), logits, -np.inf)
    if spec.action_heads:
        own = np.array([h.argmax() for h in np.split(logits, np.cumsum(spec.action_heads)[:-1])])
        return own, own
    own = int(logits.argmax())
    if env._unravel is not None:
        return np.array(np.unravel_index(own, env._unravel)), own
    return np.int32(own), own


@pytest.mark.parametrize("name", ["Game2048-v1", "Minesweeper-v0", "Cleaner-v0"])
def test_episodes_are_jumanjis_own_stepped_with_the_same_actions(name):
    env = make_env(f"jumanji:{name}", episode_length=LENGTH)
    policy = make_policy(env.spec, (8,))
    params = policy.init(jax.random.key(3))
    key = jax.random.key(5)
    episode = jax.jit(lambda p: rollout(env, policy, p, key))(params)

    # Jumanji by hand, with rollout's key schedule (the split's second half resets)
    own = jumanji.make(name)
    state, timestep = jax.jit(own.reset)(jax.random.split(key)[1])
    jumanji_step = jax.jit(own.step)
    obs, env_state = env.reset(jax.random.split(key)[1])
    ours_step = jax.jit(env.step)
    total, length, dones = 0.0, 0, []
    for t in range(LENGTH):
        np.testing.assert_array_equal(np.asarray(obs), _flat(timestep.observation))
        action, chosen = _policy_action(env, policy.module, params, timestep.observation)
        np.testing.assert_array_equal(np.asarray(policy(params, obs)), chosen)
        mask = getattr(timestep.observation, "action_mask", None)
        if mask is not None and env.spec.action_heads:  # one row of the mask per head
            assert np.asarray(mask)[np.arange(len(action)), action].all()
        elif mask is not None:
            assert np.asarray(mask)[tuple(np.atleast_1d(action))]
        state, timestep = jumanji_step(state, action.astype(own.action_spec.dtype))
        obs, env_state, reward, done = ours_step(None, env_state, chosen)
        np.testing.assert_allclose(reward, np.sum(timestep.reward), rtol=1e-6)
        total += float(np.sum(timestep.reward))
        length += 1
        dones.append(bool(done))
        assert bool(done) == (bool(timestep.last()) or t + 1 == LENGTH)
        if done:
            break
    np.testing.assert_allclose(episode.episode_return, total, rtol=1e-5)
    assert int(episode.steps) == length
    assert dones == [False] * (length - 1) + [True]


def test_the_listing_is_jumanjis_registry_less_what_is_left_out():
    assert set(JUMANJI_IDS) | set(UNLISTED_JUMANJI) == set(jumanji.registered_environments())
    listed = [n for n in env_names() if n.startswith("jumanji:")]
    assert listed == [f"jumanji:{n}" for n in JUMANJI_IDS]
    with pytest.raises(ValueError, match="Hugging Face"):
        make_env("jumanji:Sokoban-v0")


def test_a_multi_discrete_distribution_sums_its_heads():
    heads = MultiCategorical((3, 2))
    logits = np.log(np.array([0.2, 0.3, 0.5, 0.6, 0.4], np.float32))
    raw = np.array([2, 1])
    np.testing.assert_allclose(heads.log_prob(logits, raw), np.log(0.5 * 0.4), rtol=1e-5)
    entropy = -(0.2 * np.log(0.2) + 0.3 * np.log(0.3) + 0.5 * np.log(0.5))
    entropy -= 0.6 * np.log(0.6) + 0.4 * np.log(0.4)
    np.testing.assert_allclose(heads.entropy(logits), entropy, rtol=1e-5)
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = jax.jit(jax.vmap(lambda k: heads.sample(logits, k)))(keys)
    np.testing.assert_allclose(np.mean(draws[:, 0] == 2), 0.5, atol=0.03)
    np.testing.assert_allclose(np.mean(draws[:, 1] == 0), 0.6, atol=0.03)


@pytest.mark.slow
def test_es_has_the_same_history_on_1_and_2_devices():
    config = ESConfig(
        task="jumanji:Game2048-v1",
        population_size=4,
        hidden_sizes=(4,),
        episode_length=10,
        eval_episodes=1,
        noise="normal",
    )
    histories = []
    for n in (1, 2):
        es = ES(config, mesh=make_mesh(n))
        histories.append(_loop.train(es, jax.random.key(0), 2)[1])
    one, two = ({k: np.asarray(v) for k, v in h.items()} for h in histories)
    for name in ("fitness_best", "fitness_mean", "fitness_worst", "env_steps", "eval_return"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, err_msg=name)
    assert one["fitness_best"].max() > 0


@pytest.mark.slow
def test_ppo_trains_and_resumes_exactly(tmp_path):
    run, whole = tmp_path / "run", tmp_path / "whole"
    args = ["-a", "ppo", "-t", "jumanji:Minesweeper-v0", "--chunk", "1", "--devices", "1"]
    args += ["-q", "--no-figure", "--set", "num_envs=4", "--set", "unroll_length=8"]
    args += ["--set", "num_minibatches=2", "--set", "num_epochs=1", "--set", "episode_length=20"]
    args += ["--set", "policy_hidden_sizes=[8]", "--set", "value_hidden_sizes=[8]"]
    assert cli.main(["train", *args, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "1", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *args, "-g", "3", "--out", str(whole)]) == 0
    resumed, uninterrupted = store.read_metrics(run), store.read_metrics(whole)
    assert len(resumed["generation"]) == 3
    for column, values in uninterrupted.items():
        if "time" not in column:
            np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    assert np.all(uninterrupted["episodes"] > 0)  # Minesweeper's episodes end within 20 steps
