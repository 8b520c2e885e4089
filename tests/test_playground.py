"""MuJoCo Playground's DM Control Suite: every listed task trains, one of each kind scores
its policies as Playground's own stepping does, OpenES learns CartpoleBalance, the same history on 1
and 2 devices, CEM-RL reports the return Playground's stepping gives its solution, and a
missing Playground is one line.

Each task compiles its MJX physics (on a CPU 10-60 s a task); the programs go to
the persistent compilation cache (``$EVORL_POP_COMPILATION_CACHE``), so a rerun
against a kept cache costs only their tracing.
"""

import subprocess
import sys

import _loop
import jax
import numpy as np
import pytest
from _env import cli_env

from evorl_pop import make_mesh, use_compilation_cache
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.base import ConfigError
from evorl_pop.tasks.envs import env_names, make_env
from evorl_pop.tasks.playground_envs import PLAYGROUND_ENVS
from evorl_pop.tasks.policies import make_policy
from evorl_pop.tasks.rollout import rollout

pytest.importorskip("mujoco_playground")
use_compilation_cache()

PLAYGROUND = sorted(name for name in env_names() if name.startswith("playground/"))
# 2 generations of 8 candidates, 2-step episodes (compiling the physics is the cost,
# not stepping it); evosax's own noise (the noise table is a 16 MB constant per program)
TINY = {
    "population_size": 8,
    "hidden_sizes": (4,),
    "episode_length": 2,
    "eval_episodes": 0,
    "noise": "normal",
}


def _train(config, n=1, generations=2):
    es = ES(config, mesh=make_mesh(n))
    state, history = _loop.train(es, jax.random.key(0), generations)
    return es, state, {k: np.asarray(v) for k, v in history.items()}


def _playground_return(env, policy, params, key, length):
    """Playground's own reset and steps under ``policy``, its rewards summed, with the
    rollout's key schedule: the second half of the episode key's split resets."""
    state = env.env.reset(jax.random.split(key)[1])

    def body(state, _):
        state = env.env.step(state, policy(params, state.obs))
        return state, state.reward

    return jax.lax.scan(body, state, None, length=length)[1].sum()


def _scored_as_playground_steps(task, solution, task_state, key, length):
    """The task's return of ``solution`` over one episode equals Playground's own stepping."""
    got = jax.jit(lambda x: task.evaluate_return(x, key, task_state, 1))(solution)
    episode_key = jax.random.split(key, 1)[0]  # evaluate_return's first episode

    def by_hand(x):
        return _playground_return(task.env, task.policy, task.unravel(x), episode_key, length)

    np.testing.assert_allclose(got, jax.jit(by_hand)(solution), rtol=1e-5)


def test_the_whole_suite_is_listed_and_ships_its_files():
    from mujoco_playground import dm_control_suite
    from mujoco_playground._src import mjx_env

    assert set(PLAYGROUND_ENVS) == set(dm_control_suite.ALL_ENVS)
    assert PLAYGROUND == sorted("playground/" + name for name in PLAYGROUND_ENVS)
    # every listed task builds from the files Playground ships: nothing is fetched
    for name in PLAYGROUND_ENVS:
        dm_control_suite.load(name, config_overrides={"impl": "jax"})
    assert not mjx_env.MENAGERIE_PATH.exists()


#: Tasks whose trained policy is also stepped by hand with Playground's own reset and
#: step (compiling that episode twice more costs more than the training): one of each
#: kind of observation and reward (a ball on a string, fingers on a spinner, a swimming
#: fish, a hopper's contacts), besides CartpoleSwingup and CheetahRun tested below.
SCORED = ("playground/BallInCup", "playground/FingerSpin", "playground/FishSwim",
          "playground/HopperHop")  # fmt: skip


# A minute each to compile MJX on a CPU: the exhaustive tier. Playground's quick task
# trains with ES and CEM-RL and on 2 devices in the long tier (below).
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", PLAYGROUND)
def test_every_listed_playground_task_trains(name):
    es, state, history = _train(ESConfig(task=name, **TINY))
    # fixed-length episodes: every candidate ran its 2 steps
    np.testing.assert_array_equal(history["episodes"], [8, 8])
    np.testing.assert_array_equal(history["env_steps"], [16, 16])
    assert int(state.generation) == 2
    assert np.isfinite(history["fitness_mean"]).all(), history["fitness_mean"]
    if name in SCORED:
        # the trained mean policy scores as Playground's own stepping of it (sparse
        # tasks, such as CartpoleBalanceSparse, can give every candidate the same 2-step
        # return, so learning is shown on CartpoleBalance below)
        _scored_as_playground_steps(
            es.task, es.mean_solution(state), state.task_state, jax.random.key(7), length=2
        )


def test_scored_tasks_are_listed():
    assert set(SCORED) <= set(PLAYGROUND)


@pytest.mark.exhaustive
def test_returns_equal_playgrounds_own_stepping():
    """The rollout of a PlaygroundEnv is Playground's reset and step, its rewards summed."""
    env = make_env("playground/CartpoleSwingup", episode_length=30)
    policy = make_policy(env.spec, (8,))
    params = policy.init(jax.random.key(1))
    keys = jax.random.split(jax.random.key(2), 3)
    got = jax.jit(jax.vmap(lambda k: rollout(env, policy, params, k)))(keys)
    want = jax.jit(jax.vmap(lambda k: _playground_return(env, policy, params, k, 30)))(keys)
    np.testing.assert_allclose(got.episode_return, want, rtol=1e-5)
    np.testing.assert_array_equal(got.steps, [30, 30, 30])


@pytest.mark.slow
def test_openes_learns_cartpole_balance():
    """A random policy earns well under 75 of 100 steps' reward; OpenES's mean policy
    reaches at least 95 of the 100 within 8 generations of 8 (on a CPU: 40 at the
    first generation, 99 at the fourth)."""
    config = ESConfig(
        task="playground/CartpoleBalance",
        population_size=8,
        hidden_sizes=(8,),
        episode_length=100,
        eval_episodes=2,
        noise="normal",
        learning_rate=0.05,
        sigma_init=0.1,
    )
    _, _, history = _train(config, generations=8)
    assert history["eval_return"][0] < 75, history["eval_return"]
    assert history["eval_return"].max() >= 95, history["eval_return"]


@pytest.mark.slow
def test_the_same_history_on_1_and_2_devices():
    config = ESConfig(task="playground/CartpoleBalance", **TINY)
    one, two = (_train(config, n)[2] for n in (1, 2))
    for name in ("fitness_best", "fitness_mean", "fitness_worst", "env_steps"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.exhaustive
def test_cemrl_reports_the_return_playgrounds_stepping_gives_its_solution():
    from evorl_pop.algorithms import cemrl
    from evorl_pop.rl.td3 import TD3Config

    config = cemrl.Config(
        task="playground/CartpoleBalance",
        population_size=4,
        num_elites=2,
        learning_starts=20,
        episode_length=10,
        eval_episodes=1,
        num_rl_actors=2,
        updates_per_actor=2,
        td3=TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=8),
    )
    algo = cemrl.CEMRL(config, make_mesh(1))
    state, history = _loop.train(algo, jax.random.key(0), 2)
    # fixed-length episodes, cut at episode_length
    np.testing.assert_array_equal(history["env_steps"], 10 * history["episodes"])
    # TD3 learns from the second generation, once the first one's transitions are in
    assert np.isnan(history["critic_loss"][0]) and np.isfinite(history["critic_loss"][1])
    # the second generation's eval_return: its solution's episode, with the key the run
    # evaluated it with (generation 1's key, its fourth part), stepped by Playground itself
    run_key = jax.random.split(jax.random.key(0))[1]
    eval_key = jax.random.split(jax.random.fold_in(run_key, 1), 4)[3]
    task = algo.task
    solution = algo.mean_solution(state)
    want = jax.jit(
        lambda x: _playground_return(
            task.env, task.policy, task.unravel(x), jax.random.split(eval_key, 1)[0], 10
        )
    )(solution)
    np.testing.assert_allclose(history["eval_return"][-1], want, rtol=1e-5)


def test_a_playground_task_without_playground_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco_playground", None)
    with pytest.raises(
        ConfigError,
        match=r"^playground tasks need MuJoCo Playground.*"
        r"pip install -e '\.\[playground\]'$",
    ):
        ESConfig(task="playground/CheetahRun").make_task()


def test_the_cli_without_playground_ends_in_one_line(tmp_path):
    (tmp_path / "mujoco_playground").mkdir()  # unimportable, first on the path
    (tmp_path / "mujoco_playground" / "__init__.py").write_text("raise ImportError('none here')\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "evorl_pop.cli",
            "train",
            "--task",
            "playground/CheetahRun",
            "--generations",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        env=cli_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "evorl-pop train: config error: playground tasks need MuJoCo Playground, which is not "
        "installed (none here); install it with: pip install -e '.[playground]'"
    )


def test_unknown_playground_impl():
    with pytest.raises(ConfigError, match=r"impl: unknown value 'wrap'.*Did you mean 'warp'"):
        ES(ESConfig(task="playground/CheetahRun", impl="wrap"))


def test_every_task_names_its_dm_control_id_and_a_cpu_run_says_so_once(monkeypatch, capsys):
    pytest.importorskip("shimmy")
    import gymnasium as gym

    from evorl_pop.tasks import gym_envs, playground_envs

    gym_envs.registered_factory("dm_control/cartpole-balance-v0")  # imports shimmy
    for name in PLAYGROUND_ENVS:
        assert playground_envs.c_simulator_id(name) in gym.registry, name
    assert playground_envs.c_simulator_id("BallInCup") == "dm_control/ball_in_cup-catch-v0"
    assert playground_envs.c_simulator_id("SwimmerSwimmer6") == "dm_control/swimmer-swimmer6-v0"
    monkeypatch.setattr(playground_envs, "_noticed", False)
    playground_envs._cpu_notice("CheetahRun")
    playground_envs._cpu_notice("WalkerWalk")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--task gym:dm_control/cheetah-run-v0" in lines[0], lines
