"""The learners on environments stepped on the host (``gym:ID``): their lanes step as a
plain Gymnasium loop with the same seeds and actions, PPO and SAC train on Gymnasium and
DM Control tasks, the same on 1 and 2 devices, and a resumed run equals the uninterrupted
one; SAC on discrete actions is one line."""

import _loop
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms.ppo import PPO
from evorl_pop.algorithms.ppo import Config as PPOConfig
from evorl_pop.algorithms.sac import SAC
from evorl_pop.algorithms.sac import Config as SACConfig
from evorl_pop.base import ConfigError
from evorl_pop.rl import vec_env
from evorl_pop.run import store
from evorl_pop.tasks.host_lanes import HostEnvs

TINY_SAC = dict(
    num_envs=2,
    unroll_length=10,
    episode_length=15,
    actor_hidden_sizes=(8,),
    critic_hidden_sizes=(8,),
    batch_size=8,
    learning_starts=8,
    buffer_capacity=64,
)
TINY_PPO = dict(
    num_envs=2,
    unroll_length=10,
    episode_length=15,
    policy_hidden_sizes=(8,),
    value_hidden_sizes=(8,),
    num_minibatches=2,
    num_epochs=1,
)


def test_lanes_step_as_a_plain_gymnasium_loop():
    """A fixed policy's rewards and observations, over episodes that end inside an unroll
    and restart with their pending seeds, are Gymnasium's stepped by hand."""
    envs = HostEnvs("gym:Pendulum-v1", episode_length=7)
    index = jnp.arange(3)
    batch = envs.reset_batch(vec_env.lane_keys(jax.random.key(0), index))

    def act(obs, keys):
        action = jnp.tanh(obs[:, :1] * 1.5) * 2.0
        return action, action

    unroll = jax.jit(lambda b, k: envs.unroll(b, act, k, 10, index))
    key = jax.random.key(1)
    after, (obs, actions, result) = unroll(batch, key)
    refresh_key = jax.random.split(key)[0]
    pending = np.asarray(envs.seeds(vec_env.lane_keys(refresh_key, index)))
    for lane in range(3):
        env = gym.make("Pendulum-v1", max_episode_steps=7)
        seen, _ = env.reset(seed=int(batch.seed[lane]))
        for t in range(10):
            np.testing.assert_array_equal(np.float32(seen), obs[t, lane])
            seen, reward, terminated, truncated, _ = env.step(np.asarray(actions[t, lane]))
            np.testing.assert_array_equal(np.float32(reward), result.reward[t, lane])
            np.testing.assert_array_equal(np.float32(seen), result.next_obs[t, lane])
            assert float(result.truncated[t, lane]) == float(t == 6)
            if terminated or truncated:
                seen, _ = env.reset(seed=int(pending[lane]))
        env.close()
    assert after.episodes.tolist() == [1, 1, 1]
    assert after.steps.tolist() == [3, 3, 3]
    envs.close()


@pytest.mark.slow
def test_ppo_and_sac_train_the_same_on_1_and_2_devices():
    """Each device steps its own lanes, seeded by their global index: the same episodes
    (the losses, reduced over the devices, may round differently)."""
    for cls, config in (
        (SAC, SACConfig(task="gym:Pendulum-v1", **TINY_SAC)),
        (PPO, PPOConfig(task="gym:Pendulum-v1", **TINY_PPO)),
    ):
        histories = [
            _loop.train(cls(config, mesh=make_mesh(n)), jax.random.key(3), 3, chunk=1)[1]
            for n in (1, 2)
        ]
        assert histories[0]["episodes"].tolist() == [0, 2, 2]
        assert np.isfinite(histories[0]["fitness_mean"][1:]).all()
        assert histories[1]["episodes"].tolist() == [0, 2, 2]
        for column, values in histories[0].items():
            np.testing.assert_allclose(
                histories[1][column], values, rtol=1e-5, atol=1e-6, err_msg=column
            )


@pytest.mark.slow
def test_sac_trains_on_a_dm_control_task():
    config = SACConfig(task="gym:dm_control/cartpole-balance-v0", **TINY_SAC)
    _, history = _loop.train(SAC(config), jax.random.key(0), 3)
    assert history["episodes"].tolist() == [0, 2, 2]
    assert np.isfinite(history["fitness_mean"][1:]).all()
    assert np.isfinite(history["critic_loss"][1:]).all()


@pytest.mark.slow
def test_ppo_takes_discrete_actions_and_sac_refuses_them_in_one_line():
    ppo = PPO(PPOConfig(task="gym:CartPole-v1", **TINY_PPO))
    _, history = _loop.train(ppo, jax.random.key(0), 2)
    assert np.isfinite(history["loss"]).all()
    with pytest.raises(ConfigError, match="SAC needs continuous actions") as err:
        SAC(SACConfig(task="gym:CartPole-v1", **TINY_SAC))
    assert "\n" not in str(err.value)


def _rows(run) -> dict:
    return {k: v for k, v in store.read_metrics(run).items() if "time" not in k}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sac", "ppo"])
def test_a_resumed_run_equals_the_uninterrupted_one(algorithm, tmp_path):
    """A resumed run rebuilds its host environments from the checkpoint's seeds and
    actions (episodes of 15 steps cross the 10-step generations' chunks)."""
    settings = dict(TINY_SAC if algorithm == "sac" else TINY_PPO)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    config = tmp_path / "config.yaml"
    data = {
        "algorithm": algorithm,
        "seed": 1,
        "algorithm_config": {**settings, "task": "gym:Pendulum-v1"},
    }
    config.write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    whole = tmp_path / "whole"
    args = ["train", "--config", str(config), "--chunk", "1", "--devices", "1", "-q", "--no-figure"]
    assert cli.main([*args, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    assert cli.main([*args, "-g", "4", "--out", str(whole)]) == 0
    resumed = _rows(run)
    uninterrupted = _rows(whole)
    assert list(resumed) == list(uninterrupted)
    assert resumed["episodes"].tolist() == [0, 2, 2, 0]
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)


def test_collecting_evaluations_equal_the_plain_ones():
    """CEM-RL's actors on a Gymnasium task: an evaluation that keeps its transitions (each
    step's, for the replay buffer) scores a candidate as the one that does not."""
    from evorl_pop.tasks.gym_envs import GymTask

    task = GymTask("Pendulum-v1", hidden_sizes=(8,), episodes=2, episode_length=12)
    task.transitions = True
    solution = task.init_solution(jax.random.key(1))
    key = jax.random.key(2)
    plain, _ = jax.jit(task.evaluate, static_argnames="collect")(solution, key, ())
    score, info, episodes = jax.jit(task.evaluate, static_argnames="collect")(
        solution, key, (), collect=True
    )
    np.testing.assert_allclose(score, plain, rtol=1e-6)
    assert int(info.steps) == 24
    assert episodes.transitions.reward.shape == (2, 12)
    np.testing.assert_array_equal(episodes.valid, np.ones((2, 12), bool))
    np.testing.assert_allclose(episodes.transitions.reward.sum(1).mean(), plain, rtol=1e-6)
    # the lanes went back to the host's free list for the next evaluation
    assert not task._host._lanes and len(task._host._free) == 2


@pytest.mark.slow
def test_cemrl_learns_from_a_gymnasium_task_the_same_on_1_and_2_devices():
    import dataclasses

    from evorl_pop.algorithms.cemrl import CEMRL
    from evorl_pop.algorithms.cemrl import Config as CEMRLConfig

    td3 = dataclasses.replace(
        CEMRLConfig().td3, batch_size=16, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)
    )
    config = CEMRLConfig(
        task="gym:Pendulum-v1",
        td3=td3,
        population_size=4,
        episode_length=10,
        eval_episodes=1,
        learning_starts=10,
        buffer_capacity=64,
        num_elites=2,
        num_rl_actors=2,
        updates_per_actor=2,
    )
    histories = [
        _loop.train(CEMRL(config, mesh=make_mesh(n)), jax.random.key(0), 3)[1] for n in (1, 2)
    ]
    assert histories[0]["env_steps"].tolist() == [40, 40, 40]
    assert np.isfinite(histories[0]["critic_loss"][1:]).all()
    for column, values in histories[0].items():
        np.testing.assert_allclose(
            histories[1][column], values, rtol=1e-5, atol=1e-6, err_msg=column
        )


@pytest.mark.slow
def test_erl_explores_a_dm_control_task_on_the_host():
    import dataclasses

    from evorl_pop.algorithms.erl import ERL
    from evorl_pop.algorithms.erl import Config as ERLConfig

    td3 = dataclasses.replace(
        ERLConfig().td3, batch_size=16, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)
    )
    config = ERLConfig(
        task="gym:dm_control/cartpole-balance-v0",
        td3=td3,
        population_size=4,
        num_elites=1,
        episode_length=10,
        eval_episodes=1,
        learning_starts=10,
        buffer_capacity=64,
        updates_per_generation=2,
    )
    _, history = _loop.train(ERL(config, mesh=make_mesh(1)), jax.random.key(0), 2)
    assert np.isfinite(history["explore_return"]).all()
    assert np.isfinite(history["critic_loss"]).all()


def _resumed_equals_whole_and_2_devices_as_1(tmp_path, config: dict) -> dict:
    """Trains ``config`` 2 generations and resumes 2 more, then 4 uninterrupted on 1 and
    on 2 devices: the resumed run equals the uninterrupted one, and 2 devices run as 1.

    Returns:
      The uninterrupted run's metrics on 1 device.
    """
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["train", "--config", str(path), "--chunk", "1", "-q", "--no-figure"]
    run = tmp_path / "run"
    assert cli.main([*args, "--devices", "1", "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "2", "-q", "--no-figure"]) == 0
    runs = {}
    for devices in (1, 2):
        runs[devices] = tmp_path / f"whole{devices}"
        out = ["--devices", str(devices), "-g", "4", "--out", str(runs[devices])]
        assert cli.main([*args, *out]) == 0
    resumed = _rows(run)
    whole = _rows(runs[1])
    assert list(resumed) == list(whole)
    for column, values in whole.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    split = _rows(runs[2])
    for column, values in whole.items():
        np.testing.assert_allclose(split[column], values, rtol=1e-5, atol=1e-6, err_msg=column)
    return whole


#: CEM-RL's and ERL's own tiny settings, for their runs with SAC actors.
TINY_HYBRID_SAC = {
    "cemrl": dict(num_elites=2, num_rl_actors=2, updates_per_actor=2),
    "erl": dict(num_elites=1, updates_per_generation=2),
}


def _hybrid_sac_config(algorithm) -> dict:
    sac = dict(batch_size=8, actor_hidden_sizes=[8], critic_hidden_sizes=[8])
    settings = dict(
        task="gym:Pendulum-v1",
        learner="sac",
        sac=sac,
        population_size=4,
        episode_length=10,
        eval_episodes=1,
        learning_starts=10,
        buffer_capacity=64,
        **TINY_HYBRID_SAC[algorithm],
    )
    return {"algorithm": algorithm, "seed": 2, "algorithm_config": settings}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["cemrl", "erl"])
def test_cemrl_and_erl_with_sac_train_resume_and_split_on_a_gymnasium_task(algorithm, tmp_path):
    """SAC's actors, evaluated (and ERL's explored with sampled actions) on the host: a
    resumed run equals the uninterrupted one, and 2 devices run as 1."""
    whole = _resumed_equals_whole_and_2_devices_as_1(tmp_path, _hybrid_sac_config(algorithm))
    assert np.isfinite(whole["critic_loss"][1:]).all()
    assert np.isfinite(whole["alpha_loss"][1:]).all()


#: PBT's tiny members on the host: SAC's episodes (15 steps) cross its 20-step intervals.
TINY_PBT = {
    "td3": dict(episode_length=10, td3=dict(batch_size=8)),
    "sac": dict(
        episode_length=15,
        sac=dict(batch_size=8, num_envs=2, unroll_length=10, learning_starts=10),
    ),
}


# SAC members' in the exhaustive tier: TD3's cover the host lanes PBT leases and the
# matrix trains PBT's default members on gym and dm_control
@pytest.mark.parametrize(
    "learner",
    [
        pytest.param("td3", marks=pytest.mark.slow),
        pytest.param("sac", marks=pytest.mark.exhaustive),
    ],
)
def test_pbt_trains_resumes_and_splits_on_a_gymnasium_task(learner, tmp_path):
    """Two PBT members on the host: each member's lanes are its own, rebuilt from their
    seeds and actions where a resumed run starts; 2 devices run as 1."""
    settings = dict(
        task="gym:Pendulum-v1",
        learner=learner,
        population_size=2,
        eval_episodes=1,
        learning_starts=10,
        buffer_capacity=64,
        interval=20,
        **TINY_PBT[learner],
    )
    sizes = dict(actor_hidden_sizes=[8], critic_hidden_sizes=[8])
    settings[learner] = {**settings[learner], **sizes}
    config = {"algorithm": "pbt", "seed": 3, "algorithm_config": settings}
    whole = _resumed_equals_whole_and_2_devices_as_1(tmp_path, config)
    assert whole["env_steps"].tolist() == [40, 80, 120, 160]
    assert np.isfinite(whole["critic_loss"][1:]).all()
    assert np.isfinite(whole["fitness_mean"]).all()


def test_a_learner_without_host_lanes_is_refused_in_one_line_naming_those_with():
    """A plug-in learner steps in JAX: PBT and CEM-RL refuse it on a host task and name
    the built-in learners that take one."""
    from _plugins import run_cli

    for algorithm, learners in (("pbt", "td3, ppo or sac"), ("cemrl", "td3 or sac")):
        args = ["train", "-a", algorithm, "--plugin", "toy_learner", "--task", "gym:Pendulum-v1"]
        out = run_cli(*args, "--set", "learner=toy", "-g", "1", "-q")
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
        assert "config error: task:" in lines[0] and f"learner {learners} takes it" in lines[0]


def test_a_sweeps_settings_on_host_lanes_each_equal_their_single_run(tmp_path):
    # the settings share their seed's keys; each steps host environments of its own
    sac = ["-a", "sac", "-t", "gym:Pendulum-v1", "-g", "3", "--chunk", "1", "--devices", "2"]
    sac += ["-q", "--no-figure"]
    small = "num_envs=2 unroll_length=10 episode_length=20 batch_size=16 buffer_capacity=128"
    small += " learning_starts=10 actor_hidden_sizes=[8] critic_hidden_sizes=[8]"
    for setting in small.split():
        sac += ["--set", setting]
    sweep = tmp_path / "sweep"
    assert cli.main(["train", *sac, "--sweep", "actor_lr=0.001,0.01", "--out", str(sweep)]) == 0
    many = store.read_metrics(sweep)
    for lr in (0.001, 0.01):
        one = tmp_path / f"lr{lr}"
        assert cli.main(["train", *sac, "--set", f"actor_lr={lr}", "--out", str(one)]) == 0
        single, rows = store.read_metrics(one), many["actor_lr"] == lr
        assert np.isfinite(single["fitness_mean"][-1])  # episodes of 20 steps ended
        for column in ("fitness_mean", "actor_loss", "critic_loss"):
            np.testing.assert_allclose(
                many[column][rows], single[column], rtol=1e-5, err_msg=column
            )
