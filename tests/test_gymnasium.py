"""Gymnasium environments as ES tasks, stepped on the host: returns equal a plain
Gymnasium loop's, CartPole reaches 500 with the same history on 1 and 2 devices,
after a kill and resume, and across two processes; worker processes forked while
another thread holds MuJoCo's notices lock; the errors are one line."""

import multiprocessing
import signal
import subprocess
import sys
import threading
import time

import _loop
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _env import cli_env, run_cli

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.base import ConfigError, ObjectiveError
from evorl_pop.run import restore, store
from evorl_pop.tasks import playground_envs
from evorl_pop.tasks.gym_envs import GymTask, episode_seeds

# OpenES on CartPole-v1: a population of 16 balances the pole for 500 steps
# within a few generations.
CARTPOLE = dict(
    task="gym:CartPole-v1", population_size=16, hidden_sizes=(8,), episodes=2, eval_episodes=2
)


def _train(config, n, generations, task=None):
    es = ES(config, mesh=make_mesh(n), task=task)
    state, history = _loop.train(es, jax.random.key(0), generations)
    return es, state, history


def _plain_gymnasium_episode(env_id, task, solution, seed, max_steps):
    """One episode in a plain Gymnasium loop, the policy applied by JAX (to observations
    normalised with the task's initial statistics, if it normalises): the return, and
    the sum of the observations the policy saw."""
    env = gym.make(env_id, max_episode_steps=max_steps)
    norm = task.init_state() if task.normalize_obs else None
    params = task.unravel(solution)
    policy = jax.jit(lambda obs: task.policy(params, obs if norm is None else norm.normalize(obs)))
    obs, _ = env.reset(seed=seed)
    total = 0.0
    seen = 0.0
    done = False
    while not done:
        seen = seen + np.asarray(obs, np.float32)
        action = np.asarray(policy(jnp.asarray(obs, jnp.float32)))
        obs, reward, terminated, truncated, _ = env.step(action if action.ndim else int(action))
        total += reward
        done = terminated or truncated
    return total, seen


@pytest.mark.parametrize(
    "env_id, vector, normalize",
    [
        ("LunarLander-v3", "sync", False),
        ("HalfCheetah-v5", "sync", True),
        ("LunarLanderContinuous-v3", "async", False),
    ],
)
def test_returns_equal_a_plain_gymnasium_loop(env_id, vector, normalize):
    """Discrete and continuous actions, Box2D and MuJoCo, in-process and worker processes:
    each candidate's returns (and observation sums) are those of Gymnasium stepped by hand
    from the same seeds."""
    task = GymTask(
        env_id,
        hidden_sizes=(8,),
        episodes=2,
        episode_length=40,
        vector=vector,
        normalize_obs=normalize,
    )
    population = jax.vmap(task.init_solution)(jax.random.split(jax.random.key(1), 3))
    keys = jax.random.split(jax.random.key(2), 3)
    scores, info = jax.jit(jax.vmap(task.evaluate, in_axes=(0, 0, None)))(
        population, keys, task.init_state()
    )
    for i in range(3):
        seeds = np.asarray(episode_seeds(keys[i], 2)).tolist()
        plain = [_plain_gymnasium_episode(env_id, task, population[i], s, 40) for s in seeds]
        np.testing.assert_allclose(scores[i], np.mean([r for r, _ in plain]), rtol=1e-5, atol=1e-4)
        if normalize:
            np.testing.assert_allclose(info.moments.count[i], info.steps[i])
            np.testing.assert_allclose(info.moments.total[i], sum(s for _, s in plain), rtol=1e-5)
    assert 3 * 2 <= int(info.steps.sum()) <= 3 * 2 * 40
    # the slice's six episodes went through one vector env, now idle in the pool
    assert {w: len(v) for w, v in task.pool._free.items()} == {6: 1}
    task.pool.close()


@pytest.mark.slow
def test_cartpole_reaches_500_with_the_same_history_on_1_and_2_devices():
    config = ESConfig(**CARTPOLE)
    histories = [_train(config, n, 6)[2] for n in (1, 2)]
    for name in ("fitness_best", "fitness_mean", "fitness_worst", "env_steps", "eval_return"):
        np.testing.assert_allclose(histories[1][name], histories[0][name], rtol=1e-6, err_msg=name)
    assert histories[0]["fitness_best"].max() == 500.0
    assert histories[0]["eval_return"][-1] == 500.0, histories[0]["eval_return"]


def test_worker_processes_on_2_devices_give_the_sync_history():
    """Each device forks its worker processes from its own callback thread, beside the
    other device's; the episodes are the same as in this process."""
    config = dict(CARTPOLE, population_size=8, eval_episodes=1, episode_length=50)
    sync = _train(ESConfig(**config), 2, 2)[2]
    _, _, workers = _train(ESConfig(**config, vector="async"), 2, 2)
    for name in ("fitness_best", "fitness_mean", "env_steps", "eval_return"):
        np.testing.assert_array_equal(workers[name], sync[name], err_msg=name)


def _make_quietly_in_a_forked_child(queue):
    from evorl_pop.tasks.vector_pool import made_quietly

    made_quietly(lambda: gym.make("CartPole-v1")).close()
    queue.put("made")


@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
def test_a_worker_forked_while_another_thread_holds_the_notices_lock_makes_its_env():
    """Gymnasium's worker processes are forked (from a device's callback thread) and make
    their environment under MuJoCo's notices lock: a fork while another thread of the
    parent holds it must not leave the child waiting for a lock no thread will release."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with playground_envs._NOTICES:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_make_quietly_in_a_forked_child, args=(queue,))
        child.start()
        child.join(60)
        alive = child.is_alive()
        if alive:
            child.kill()
        assert not alive, "the forked child waited for the parent's lock"
        assert child.exitcode == 0 and queue.get(timeout=5) == "made"
    finally:
        release.set()
        holder.join()


def test_discrete_observations_are_seen_one_hot():
    task = GymTask("FrozenLake-v1", hidden_sizes=())
    assert task.spec.obs_shape == (16,) and task.spec.discrete and task.spec.action_dim == 4
    words = task.pool.reset(np.array([3, 4], np.uint32))  # the observations' bits lead
    obs = words[: 2 * 16].view(np.float32).reshape(2, 16)
    np.testing.assert_array_equal(obs, np.eye(16, dtype=np.float32)[[0, 0]])  # the start cell
    task.pool.close()


class _Snaps(gym.Wrapper):
    """CartPole whose third step raises."""

    def reset(self, **kwargs):
        self.steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the pole snapped")
        return super().step(action)


def snapping_cartpole():
    return _Snaps(gym.make("CartPole-v1"))


def test_an_environment_error_ends_the_run_in_one_line():
    config = ESConfig(**CARTPOLE)
    with pytest.raises(ObjectiveError) as err:
        _train(config, 2, 1, task=GymTask(snapping_cartpole, hidden_sizes=(8,), episodes=2))
    assert str(err.value) == (
        "The environment 'gym:snapping_cartpole' raised RuntimeError in step: the pole snapped"
    )
    # the next run is not disturbed by the failed callbacks
    assert _train(ESConfig(**CARTPOLE), 2, 1)[2]["fitness_best"][0] > 0


@pytest.mark.parametrize(
    "task, message",
    [
        (
            "gym:CartPoel-v1",
            r"Unknown Gymnasium environment 'CartPoel-v1'\. Did you mean "
            r"'CartPole-v1'",
        ),
        (
            "gym:no_such_module:CartPole-v1",
            r"the module 'no_such_module' that registers it does not import",
        ),
        (
            "gym:gymnasium.envs.classic_control:CartPoel-v1",
            r"Unknown Gymnasium environment 'CartPoel-v1' after importing "
            r"'gymnasium.envs.classic_control'\. Did you mean 'CartPole-v1'",
        ),
    ],
)
def test_what_a_policy_cannot_use_is_one_line(task, message):
    with pytest.raises(ValueError, match=message):
        ES(ESConfig(task=task))


def test_an_unknown_vector_mode_is_one_line():
    message = r"^vector must be one of \('sync', 'async'\), got 'bad'\.$"
    with pytest.raises(ValueError, match=message):
        GymTask("CartPole-v1", vector="bad")


def test_settings_of_jax_stepping_are_refused_for_a_gymnasium_task():
    with pytest.raises(
        ConfigError,
        match=r"^virtual_batch_norm does not apply to the environment 'gym:CartPole-v1', "
        r"stepped on the host",
    ):
        ESConfig(task="gym:CartPole-v1", virtual_batch_norm=True).validate()
    with pytest.raises(ConfigError, match=r"^vector: unknown value 'asyn'\. Did you mean"):
        ESConfig(task="gym:CartPole-v1", vector="asyn").validate()


def test_unbounded_actions_and_no_time_limit_are_refused():
    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,))

    with pytest.raises(ValueError, match=r"its action space Box\(-inf, inf.*not supported"):
        GymTask(Unbounded)
    with pytest.raises(ValueError, match=r"has no time limit.*episode_length"):
        GymTask(lambda: gym.make("CartPole-v1").unwrapped)
    assert GymTask(lambda: gym.make("CartPole-v1").unwrapped, episode_length=5).spec.max_steps == 5


def _env():
    return cli_env()


def _cli(*args, **env):
    return run_cli(*args, env={**_env(), **env})


JOB = (
    "--task gym:CartPole-v1 --pop 16 --seed 0 --chunk 1 --checkpoint-every 1 --devices 2 "
    "--set hidden_sizes=[8] --set episodes=2 --set eval_episodes=2 --quiet --no-figure"
).split()
GENERATIONS = 6


def _rows(run):
    rows = store.read_metrics(run)
    return {k: v for k, v in rows.items() if k != "wall_time"}


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    cli = [sys.executable, "-m", "evorl_pop.cli"]
    command = [*cli, "train", *JOB, "--generations", str(GENERATIONS)]
    proc = subprocess.Popen(
        [*command, "--out", str(killed)], env=_env(), stderr=subprocess.PIPE, text=True
    )
    started = time.time()
    while not (killed / store.CHECKPOINT_FILENAME).exists():  # killed at its first checkpoint
        if proc.poll() is not None or time.time() - started > 300:
            pytest.fail(f"no checkpoint before the end or 300 s: {proc.communicate()[1][-3000:]}")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    at_kill = restore.load_checkpoint(killed)
    assert 0 < at_kill.generation < GENERATIONS, "the run ended before it was killed"
    resumed = _cli("resume", str(killed), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = subprocess.run(
        [*command, "--out", str(whole)], env=_env(), capture_output=True, text=True, timeout=600
    )
    assert reference.returncode == 0, reference.stderr[-3000:]

    a, b = _rows(killed), _rows(whole)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert b["fitness_best"].max() == 500.0
    np.testing.assert_array_equal(
        restore.load_checkpoint(killed).key, restore.load_checkpoint(whole).key
    )


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    """Under jax.distributed, each process steps the environments of its own device."""
    common = [a for a in JOB if a not in ("--devices", "2")]
    launch = ["launch", "-n", "2", "--devices-per-process", "1", "--"]
    out = ["--generations", "3", "--out", str(tmp_path / "2x1")]
    multi = _cli(*launch, "train", *common, *out)
    assert multi.returncode == 0, multi.stderr[-3000:]
    single = _cli("train", *JOB, "--generations", "3", "--out", str(tmp_path / "1x2"))
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = _rows(tmp_path / "2x1"), _rows(tmp_path / "1x2")
    for name in ("fitness_best", "fitness_mean", "env_steps", "eval_return"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_missing_simulator_names_the_install_in_one_line(tmp_path):
    (tmp_path / "Box2D").mkdir()  # a Box2D that cannot be imported, first on the path
    (tmp_path / "Box2D" / "__init__.py").write_text("raise ImportError('no Box2D here')\n")
    args = ["--task", "gym:LunarLander-v3", "--generations", "1", "--out", str(tmp_path / "run")]
    out = _cli("train", *args, PYTHONPATH=str(tmp_path))
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "evorl-pop train: config error: gym:LunarLander-v3 needs a simulator "
        "that is not installed (Box2D is not installed"
    ), line
    assert line.endswith(
        "install Gymnasium's Box2D and MuJoCo environments with: pip install -e '.[gymnasium]'"
    ), line


# --- Gymnasium plug-in environments and structured observations ----------------------

DICT_REACH = "gym:gym_dict_env:DictReach-v0"


@pytest.fixture
def plugin_envs(monkeypatch):
    from _plugins import PLUGINS_DIR

    monkeypatch.syspath_prepend(str(PLUGINS_DIR))


def test_dict_observations_are_flattened_in_key_order(plugin_envs):
    from evorl_pop.tasks.gym_envs import registered_factory

    task = GymTask(DICT_REACH.removeprefix("gym:"))
    assert task.spec.obs_shape == (6,)  # phase one-hot (3), position (2), target (1)
    env = registered_factory("gym_dict_env:DictReach-v0")()
    obs, _ = env.reset(seed=0)
    inner = env.unwrapped
    inner.position, inner.target, inner.time = 0.5, 0.75, 1
    obs, *_ = env.step(np.zeros(1, np.float32))  # position 0.5, phase 2
    np.testing.assert_allclose(obs, [0, 0, 1, 0.5, 0.5 - 0.75, 0.75], rtol=1e-6)
    # a Tuple of Discrete spaces is one-hot, entry after entry (Blackjack: 32 + 11 + 2)
    assert GymTask("Blackjack-v1", episode_length=10).spec.obs_shape == (45,)


def test_a_module_id_environment_trains_the_same_on_1_and_2_devices(plugin_envs):
    config = ESConfig(task=DICT_REACH, population_size=8, hidden_sizes=(4,), eval_episodes=1)
    histories = [_train(config, n, 3)[2] for n in (1, 2)]
    for key, values in histories[0].items():
        # continuous actions of a device's slice of 8 or 4 may round differently
        np.testing.assert_allclose(values, histories[1][key], rtol=1e-5, err_msg=key)
    returns = np.asarray(histories[0]["fitness_mean"])
    assert np.isfinite(returns).all() and (returns < 0).all()  # minus distances
    assert np.asarray(histories[0]["env_steps"]).tolist() == [8 * 20] * 3  # no early ends


# --- the DM Control suite in MuJoCo's C simulator (shimmy's dm_control/ namespace) ------

DMC = "gym:dm_control/cartpole-balance-v0"


def test_a_dm_control_task_trains_the_same_on_1_and_2_devices():
    pytest.importorskip("shimmy")
    # its Dict observation (position 3, velocity 2) is flattened; its 1,000-step limit is
    # the suite's own (no TimeLimit wrapper), shortened here
    task = GymTask(DMC.removeprefix("gym:"))
    assert task.spec.obs_shape == (5,) and task.spec.max_steps == 1000
    config = ESConfig(task=DMC, population_size=4, hidden_sizes=(4,), episode_length=30)
    histories = [_train(config, n, 2)[2] for n in (1, 2)]
    for key, values in histories[0].items():
        np.testing.assert_allclose(values, histories[1][key], rtol=1e-5, err_msg=key)
    returns = np.asarray(histories[0]["fitness_mean"])
    assert np.isfinite(returns).all() and (returns > 0).all()  # balancing earns every step
    assert np.asarray(histories[0]["env_steps"]).tolist() == [4 * 30] * 2


def test_a_namespace_whose_package_is_missing_names_the_extra(monkeypatch):
    from evorl_pop.tasks import gym_envs, gym_make

    # as dm_control/ without shimmy installed
    monkeypatch.setitem(gym_make.NAMESPACES, "elsewhere", ("no_such_package_here", "dmc"))
    with pytest.raises(ConfigError) as err:
        gym_envs.registered_factory("elsewhere/task-v0")
    assert str(err.value) == (
        "gym:elsewhere/task-v0: the elsewhere/ environments are registered by the package "
        "'no_such_package_here', which is not installed: pip install 'evorl_pop[dmc]'."
    )
