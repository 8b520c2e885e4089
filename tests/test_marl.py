"""Multi-agent tasks (``marl/``): JaxMARL's environments stepped as one team, and a team
evolved as one ES candidate."""

import functools

import _loop
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.base import ConfigError, EnvSpec
from evorl_pop.run import store
from evorl_pop.tasks.marl_envs import MultiAgentEnv, _import_jaxmarl
from evorl_pop.tasks.teams import MASKED_LOGIT, team_policy

SPREAD = "MPE_simple_spread_v3"
TASK = "marl/" + SPREAD
#: A team's quick run: 3 agents, 10-step episodes, a per-agent network of 4 hidden units.
SMALL = dict(task=TASK, population_size=8, hidden_sizes=(4,), episode_length=10, eval_episodes=0)


def _reference_steps(env, keys, actions):
    """JaxMARL's own environment stepped on ``actions`` (a row per agent): each step's
    observations (agent order, zero-padded), rewards and ``dones['__all__']``."""
    width = max(env.observation_space(a).shape[0] for a in env.agents)

    def rows(obs):
        return jnp.stack([jnp.pad(obs[a], (0, width - obs[a].shape[0])) for a in env.agents])

    def step(state, xs):
        key, action = xs
        acts = {a: action[i] for i, a in enumerate(env.agents)}
        obs, state, rewards, dones, _ = env.step_env(key, state, acts)
        return state, (rows(obs), jnp.stack([rewards[a] for a in env.agents]), dones["__all__"])

    obs, state = env.reset(keys[0])
    return rows(obs), jax.lax.scan(step, state, (keys[1:], actions))[1]


def test_family_steps_as_jaxmarl_and_freezes_after_the_end():
    length, steps = 6, 8
    env = MultiAgentEnv(SPREAD, episode_length=length)
    keys = jax.random.split(jax.random.key(3), steps + 1)
    actions = jax.random.randint(jax.random.key(4), (steps, env.num_agents), 0, 5)

    @jax.jit
    def ours(keys, actions):
        def step(state, xs):
            obs, after, each, done = env.step_agents(xs[0], state, xs[1])
            _, _, team, _ = env.step(xs[0], state, xs[1])
            return after, (obs, each, done, team, env.global_state(after))

        obs, state = env.reset(keys[0])
        return obs, jax.lax.scan(step, state, (keys[1:], actions))[1]

    first, (obs, rewards, done, team, world) = ours(keys, actions)
    assert env.agents == ("agent_0", "agent_1", "agent_2") and not env.shared_reward
    reference = _import_jaxmarl().make(SPREAD, max_steps=length)
    ref_first, (ref_obs, ref_rewards, ref_done) = jax.jit(
        lambda k, a: _reference_steps(reference, k, a)
    )(keys[: length + 1], actions[:length])
    np.testing.assert_array_equal(first, ref_first)
    np.testing.assert_array_equal(obs[:length], ref_obs)
    np.testing.assert_array_equal(rewards[:length], ref_rewards)
    # JaxMARL's MPE reports its end a step after max_steps (it compares the count
    # before the step); the episode here ends after exactly episode_length steps
    np.testing.assert_array_equal(done[: length - 1], ref_done[: length - 1])
    assert done[length - 1 :].all() and not done[: length - 1].any() and not ref_done.any()
    # the team's reward: the sum of its agents' (MPE has no shared one)
    np.testing.assert_allclose(team, rewards.sum(-1), rtol=1e-6)
    # past the end: the state is frozen and the rewards are zero
    np.testing.assert_array_equal(rewards[length:], 0.0)
    np.testing.assert_array_equal(world[length:], np.stack([world[length - 1]] * (steps - length)))
    # the global state: every agent's observation, in agent order
    np.testing.assert_array_equal(world[:length], ref_obs.reshape(length, -1))


def _mlp(params, x):
    """A one-hidden-layer tanh MLP in NumPy."""
    hidden = np.tanh(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
    return hidden @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]


@pytest.mark.parametrize("team", ["shared", "per_agent"])
def test_team_policy_is_one_mlp_per_agent_row(team):
    spec = EnvSpec("team", (3, 4), True, 5, None, None, 10)
    policy = team_policy(spec, (5, 3, 5), (6,), "tanh", team)
    params = policy.init(jax.random.key(0))
    obs = np.asarray(jax.random.normal(jax.random.key(1), (3, 4)))
    logits = np.asarray(policy.module.apply(params, obs))
    inner = jax.tree.map(np.asarray, params["params"])
    if team == "shared":
        expected = _mlp(inner["MLP_0"], np.concatenate([obs, np.eye(3)], -1))
    else:
        each = inner["agents"]
        expected = np.stack(
            [_mlp(jax.tree.map(lambda x, i=i: x[i], each), obs[i]) for i in range(3)]
        )
    expected[1, 3:] = MASKED_LOGIT  # agent 1 has 3 actions
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    actions = np.asarray(policy(params, obs))
    np.testing.assert_array_equal(actions, np.argmax(expected, -1))
    assert actions[1] < 3


@functools.cache
def _history(n: int):
    """Two generations of OpenES over per-agent teams on ``n`` devices: the metrics."""
    config = ESConfig(strategy="Open_ES", team="per_agent", **SMALL)
    engine = ES(config, mesh=make_mesh(n))
    _, metrics = _loop.train(engine, jax.random.key(5), 2)
    return metrics


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_team_es_is_the_same_on_1_2_and_4_devices(n):
    one, many = _history(1), _history(n)
    assert np.all(np.isfinite(one["fitness_best"]))
    np.testing.assert_array_equal(one["env_steps"], 80)  # 8 teams x 10 steps a generation
    for key in ("fitness_best", "fitness_mean", "fitness_worst", "env_steps"):
        np.testing.assert_allclose(many[key], one[key], rtol=1e-6, err_msg=f"{n}: {key}")


@pytest.mark.slow
def test_team_es_resumes_to_the_uninterrupted_run(tmp_path):
    settings = {**SMALL, "hidden_sizes": [4], "strategy": "CMA_ES", "team": "shared"}
    path = tmp_path / "config.yaml"
    data = {"algorithm": "es", "seed": 1, "algorithm_config": settings}
    path.write_text(yaml.safe_dump(data))
    common = ["--chunk", "1", "--devices", "2", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", "--config", str(path), "-g", "2", *common, "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "1", "-q", "--no-figure"]) == 0
    assert cli.main(["train", "--config", str(path), "-g", "3", *common, "--out", str(whole)]) == 0
    resumed, uninterrupted = store.read_metrics(run), store.read_metrics(whole)
    assert len(resumed["generation"]) == 3
    for column, values in uninterrupted.items():
        if "time" not in column:
            np.testing.assert_array_equal(resumed[column], values, err_msg=column)


def test_learners_of_one_agent_refuse_a_team_in_one_line():
    from evorl_pop.algorithms.ppo import Config

    with pytest.raises(ConfigError, match="ppo learns one agent's policy.*-a es evolves"):
        Config(task=TASK).validate()


def test_unknown_team_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="team"):
        ESConfig(task=TASK, team="everyone").validate()


@pytest.mark.slow
def test_openes_team_learns_to_spread():
    """OpenES over per-agent teams on simple_spread: the population's mean return rises by
    at least 20 within 20 generations (examples/openes_team.py's run, the same settings:
    -117 at generation 1, about -84 at generation 20)."""
    config = ESConfig(
        strategy="Open_ES",
        task=TASK,
        team="per_agent",
        population_size=64,
        learning_rate=0.05,
        sigma_init=0.1,
        hidden_sizes=(16,),
        episodes=2,
        eval_episodes=0,
    )
    _, metrics = _loop.train(ES(config, mesh=make_mesh(2)), jax.random.key(0), 20, chunk=10)
    first, last = metrics["fitness_mean"][0], np.mean(metrics["fitness_mean"][-3:])
    assert last >= first + 20, metrics["fitness_mean"]
