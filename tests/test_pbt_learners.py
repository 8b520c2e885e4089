"""PBT over PPO and SAC members: device-count invariance, traced hyperparameters, bad input.

The reference is the run on one device; tiny networks and intervals keep every test cheap.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms import pbt, ppo, sac
from evorl_pop.base import ConfigError
from evorl_pop.run import restore, store


def _members(learner: str, task: str, interval: int, episode_length: int, settings):
    """Three tiny members of ``learner`` (padded to 4 on 2 devices), one evaluation episode."""
    return pbt.Config(
        task=task,
        learner=learner,
        population_size=3,
        interval=interval,
        eval_episodes=1,
        episode_length=episode_length,
        **{learner: settings},
    )


PPO_MEMBERS = _members(
    "ppo",
    "CartPole-v1",
    64,
    50,
    ppo.Config(
        num_envs=4,
        unroll_length=16,
        num_minibatches=2,
        num_epochs=1,
        policy_hidden_sizes=(8,),
        value_hidden_sizes=(8,),
    ),
)
SAC_MEMBERS = _members(
    "sac",
    "Pendulum-v1",
    100,
    25,
    sac.Config(
        num_envs=2,
        unroll_length=25,
        batch_size=16,
        learning_starts=50,
        updates_per_step=0.1,
        actor_hidden_sizes=(8,),
        critic_hidden_sizes=(8,),
    ),
)


def _run(config, n, generations=2):
    algo = pbt.PBT(config, make_mesh(n))
    state = algo.init(jax.random.key(0))
    step = jax.jit(algo.step)
    history = []
    for g in range(generations):
        state, metrics = step(state, jax.random.key(g))
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


@pytest.mark.parametrize(
    "config",
    # SAC's members: the exhaustive tier (PBT's split is the same code for every learner)
    [
        pytest.param(PPO_MEMBERS, id="ppo", marks=pytest.mark.slow),
        pytest.param(SAC_MEMBERS, id="sac", marks=pytest.mark.exhaustive),
    ],
)
def test_same_members_and_history_on_1_and_2_devices(config):
    one, history_one = _run(config, 1)
    two, history_two = _run(config, 2)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(history_one, history_two, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # the run did something: members trained, episodes ended, one member was replaced
    last = history_one[-1]
    assert last["env_steps"] == config.population_size * config.interval
    assert last["episodes"] > 0 and last["replaced"] == 1
    assert np.isfinite(last["fitness_mean"])
    # each member's searched values are in the metrics, within their ranges
    for h in config.searched():
        values = [last[f"member{i}_{h.name}"] for i in range(config.population_size)]
        assert all(h.low <= v <= h.high for v in values), (h, values)


def test_a_members_searched_learning_rate_is_the_one_it_trains_with():
    """The traced value reaches PPO's Adam: 0 leaves the networks as they were."""
    member = pbt.PBT(PPO_MEMBERS, make_mesh(1)).members
    learner, own = member.init(jax.random.key(0))
    train = jax.jit(member.train)
    still, *_ = train(learner, own, {"learning_rate": jnp.float32(0.0)}, jax.random.key(1))
    moved, *_ = train(learner, own, {"learning_rate": jnp.float32(1e-2)}, jax.random.key(1))
    before, after_zero, after = (jax.tree.leaves(x[0])[0] for x in (learner, still, moved))
    np.testing.assert_array_equal(after_zero, before)
    assert not np.allclose(after, before)


def test_default_search_is_the_learners_own():
    assert [h.name for h in pbt.Config(learner="ppo").searched()] == [
        "learning_rate",
        "clip_epsilon",
        "entropy_cost",
        "gae_lambda",
        "discount",
    ]
    assert [h.name for h in pbt.Config(learner="sac").searched()] == [
        "actor_lr",
        "critic_lr",
        "target_entropy_scale",
        "discount",
    ]
    assert pbt.Config().learner == "td3" and pbt.Config().searched()[0].name == "actor_lr"


def test_bad_learner_settings_say_what_to_change():
    with pytest.raises(ConfigError, match="'actor_lr' of ppo.*'learning_rate'"):
        pbt.Config(learner="ppo", search=(pbt.Hyperparameter("actor_lr", 1e-4, 1e-3),)).validate()
    with pytest.raises(ConfigError, match="learner: unknown value 'ppo2'"):
        pbt.Config(learner="ppo2").validate()
    with pytest.raises(ConfigError, match="interval=100 must be a whole number of ppo"):
        pbt.PBT(pbt.Config(task="CartPole-v1", learner="ppo", interval=100, ppo=PPO_MEMBERS.ppo))


@pytest.mark.slow
def test_cli_trains_pbt_over_ppo_and_resumes_exactly(tmp_path):
    """``-a pbt --set learner=ppo`` runs from the command line; a resumed run equals
    the uninterrupted one."""
    settings = [
        "task=CartPole-v1",
        "learner=ppo",
        "population_size=2",
        "interval=64",
        "eval_episodes=1",
        "episode_length=50",
        "ppo.num_envs=4",
        "ppo.unroll_length=16",
        "ppo.num_minibatches=2",
        "ppo.num_epochs=1",
        "ppo.policy_hidden_sizes=[8]",
        "ppo.value_hidden_sizes=[8]",
    ]
    common = ["train", "-a", "pbt", "-q", "--no-figure", "--devices", "1"]
    common += [x for s in settings for x in ("--set", s)]
    whole = tmp_path / "whole"
    part = tmp_path / "part"
    assert cli.main([*common, "-g", "2", "--out", str(whole)]) == 0
    assert cli.main([*common, "-g", "1", "--out", str(part)]) == 0
    assert cli.main(["resume", str(part), "--generations", "2", "-q", "--no-figure"]) == 0
    a = restore.load_checkpoint(whole)
    b = restore.load_checkpoint(part)
    assert a.generation == b.generation == 2 and a.env_steps == b.env_steps == 2 * 2 * 64
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(x, y)
    rows_a = store.read_metrics(whole / store.METRICS_FILENAME)
    rows_b = store.read_metrics(part / store.METRICS_FILENAME)
    for column in rows_a:
        if column != "wall_time":
            np.testing.assert_array_equal(rows_a[column], rows_b[column], err_msg=column)
