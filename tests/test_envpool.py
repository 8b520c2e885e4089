"""EnvPool's family: its episodes are EnvPool's stepped directly with the same actions
(returns, lengths, truncation and termination), a run is the same on 1 and 2 devices,
and a resumed run continues the uninterrupted one exactly."""

from __future__ import annotations

import _loop
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

pytest.importorskip("envpool")

from evorl_pop import cli, make_mesh  # noqa: E402
from evorl_pop.algorithms.es import ES, ESConfig  # noqa: E402
from evorl_pop.run import store  # noqa: E402
from evorl_pop.tasks.envpool_envs import EnvPoolTask, gymnasium_id  # noqa: E402


def _direct(task: EnvPoolTask, solutions, episodes: int, evaluations: int):
    """Each slot's return and length in a pool of the task's width stepped directly
    (EnvPool's Python API, seed 0), at evaluation count ``evaluations``."""
    import envpool

    width = solutions.shape[0] * episodes
    kind = "dm" if task.env_id.endswith("-v1") else "gymnasium"
    pool = envpool.make(
        task.env_id,
        env_type=kind,
        num_envs=width,
        batch_size=width,
        seed=0,
        max_episode_steps=task.spec.max_steps,
    )
    for _ in range(2 * evaluations):  # the starts of the pool's evaluation count
        pool.reset()
    params = jax.vmap(task.unravel)(jnp.repeat(solutions, episodes, axis=0))
    act = jax.jit(jax.vmap(task.policy))

    def flat(out):
        if kind == "dm":
            obs = out.observation
            fields = [getattr(obs, f).reshape(width, -1) for f in obs._fields if f not in _INFO]
            return np.concatenate(fields, -1).astype(np.float32)
        return np.asarray(out[0], np.float64).reshape(width, -1).astype(np.float32)

    out = pool.reset()
    obs = flat(out)
    returns = np.zeros(width, np.float32)
    lengths = np.zeros(width, np.int32)
    alive = np.ones(width, bool)
    truncated = np.zeros(width, bool)
    while alive.any():
        action = np.asarray(act(params, jnp.asarray(obs)), np.float64)
        out = pool.step(action, np.arange(width))
        if kind == "dm":
            reward, done = np.asarray(out.reward, np.float32), out.step_type == 2
            trunc = done & (np.asarray(out.discount) == 1.0)
        else:
            reward, done = np.asarray(out[1], np.float32), out[2] | out[3]
            trunc = np.asarray(out[3])
        returns += np.where(alive, reward, np.float32(0))
        lengths += alive
        truncated |= alive & trunc
        alive &= ~done
        obs = flat(out)
    pool.close()
    return returns.reshape(-1, episodes), lengths.reshape(-1, episodes), truncated


_INFO = ("env_id", "players")


@pytest.mark.parametrize(
    ("env_id", "length", "ends"),
    [
        pytest.param(
            "CheetahRun-v1", 30, "truncated", marks=pytest.mark.slow
        ),  # DM Control: every episode at the time limit
        ("Hopper-v4", 200, "terminated"),  # MuJoCo: falls end episodes of different lengths
    ],
)
def test_episodes_equal_envpool_stepped_directly(env_id, length, ends):
    task = EnvPoolTask(env_id, episode_length=length, hidden_sizes=(8,), episodes=2)
    solutions = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(3), 3)) * 3.0
    evaluate = jax.jit(lambda s, state: task._batch_episodes(s, None, state, 2))
    state = task.init_state()
    # DM Control's second evaluation runs each environment's third start; where
    # episodes fall, a pool's later starts depend on the lengths (the first only)
    for evaluation in range(2 if ends == "truncated" else 1):
        stats = evaluate(solutions, state)
        returns, lengths, truncated = _direct(task, solutions, 2, evaluation)
        np.testing.assert_allclose(stats.episode_return, returns.mean(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(stats.steps, lengths.sum(1))
        state = task.update_state(state, None)
    if ends == "truncated":
        assert truncated.all() and (lengths == length).all()
    else:  # some episodes fell before the limit: masked after their first done
        assert (lengths < length).any() and len(set(lengths.ravel().tolist())) > 1


@pytest.mark.slow  # DM Control's pools take seconds each to make on a CPU
def test_a_run_is_the_same_on_1_and_2_devices():
    config = ESConfig(
        task="envpool:CheetahRun-v1", population_size=4, hidden_sizes=(4,), episode_length=20
    )
    histories = []
    for n in (1, 2):
        es = ES(config, mesh=make_mesh(n))
        histories.append(_loop.train(es, jax.random.key(0), 2)[1])
    for key, values in histories[0].items():
        np.testing.assert_array_equal(values, histories[1][key], err_msg=key)
    assert np.asarray(histories[0]["env_steps"]).tolist() == [4 * 20] * 2


@pytest.mark.slow
def test_a_resumed_run_continues_the_uninterrupted_one(tmp_path):
    path = tmp_path / "config.yaml"
    settings = {"task": "envpool:CheetahRun-v1", "population_size": 4, "hidden_sizes": [4]}
    data = {"algorithm": "es", "seed": 1, "algorithm_config": {**settings, "episode_length": 10}}
    path.write_text(yaml.safe_dump(data))
    common = ["--config", str(path), "--chunk", "1", "--devices", "1", "-q", "--no-figure"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert cli.main(["train", *common, "-g", "2", "--out", str(run)]) == 0
    assert cli.main(["resume", str(run), "--more", "1", "-q", "--no-figure"]) == 0
    assert cli.main(["train", *common, "-g", "3", "--out", str(whole)]) == 0
    resumed, uninterrupted = store.read_metrics(run), store.read_metrics(whole)
    for column, values in uninterrupted.items():
        if "time" not in column:
            np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    assert len(resumed["generation"]) == 3


def test_gymnasium_ids_of_the_same_tasks():
    assert gymnasium_id("CheetahRun-v1") == "dm_control/cheetah-run-v0"
    assert gymnasium_id("BallInCupCatch-v1") == "dm_control/ball_in_cup-catch-v0"
    assert gymnasium_id("HalfCheetah-v4") == "HalfCheetah-v4"
    assert gymnasium_id("Pong-v5") == "ALE/Pong-v5"


def test_the_learners_refuse_its_tasks_in_one_line():
    from evorl_pop.base import ConfigError
    from evorl_pop.rl import vec_env

    with pytest.raises(ConfigError, match=r"^task: ppo steps its environments in JAX") as err:
        vec_env.check_task("envpool:CheetahRun-v1", "ppo")
    assert "\n" not in str(err.value) and "-a es runs it" in str(err.value)
    with pytest.raises(ConfigError, match="is not an EnvPool id"):
        EnvPoolTask("envpool:NoSuchTask-v1")


def test_seeds_in_one_program_are_refused_in_one_line(tmp_path, capsys):
    """Replicas of a run would share the program's one pool and step each other's episodes:
    ``--seeds`` and ``--sweep`` are refused before anything is built, the run folder empty."""
    out = tmp_path / "run"
    job = ["train", "--task", "envpool:CheetahRun-v1", "--pop", "4", "-g", "1", "-q"]
    for extra in (["--seeds", "2"], ["--sweep", "sigma_init=0.1,0.2"]):
        assert cli.main([*job, *extra, "--out", str(out), "--no-figure"]) == 2
        err = capsys.readouterr().err
        assert "one simulator pool per program" in err and "--seed S" in err, err
        assert not (out / "checkpoint.msgpack").exists()
