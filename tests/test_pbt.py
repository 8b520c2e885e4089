"""PBT: device-count invariance, exploit and explore, resume, plots and bad input.

Tiny learners (10-step episodes, two per interval, a handful of TD3 updates)
keep every test cheap; the reference is the run on one device.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax.traverse_util import flatten_dict
from test_hybrid import stepwise

from evorl_pop import cli, make_mesh
from evorl_pop.algorithms import pbt
from evorl_pop.base import ConfigError
from evorl_pop.rl import TD3Config
from evorl_pop.run import plotting, restore, store

TINY_TD3 = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=16)
CONFIG = pbt.Config(
    population_size=6,  # padded to 8 on 4 devices
    truncation=0.34,  # two members replaced per interval
    interval=20,
    episode_length=10,
    learning_starts=10,  # TD3 from the first episode on
    updates_per_step=0.5,
    buffer_capacity=64,
    eval_episodes=1,
    td3=TINY_TD3,
)
KEYS = jax.random.split(jax.random.key(7), 2)


def _row(tree, i):
    return jax.tree.map(lambda x: np.asarray(x[i]), tree)


def _equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference():
    algo = pbt.PBT(CONFIG, make_mesh(1))
    states, metrics, _ = stepwise(algo, KEYS)  # new hyperparameters never recompile
    return algo, states, metrics


@pytest.mark.parametrize("n", [2, 4])
def test_same_members_on_any_device_count(reference, n):
    _, states, metrics = reference
    algo = pbt.PBT(CONFIG, make_mesh(n))
    run = jax.jit(lambda s, keys: jax.lax.scan(algo.step, s, keys))
    state, scanned = run(algo.init(jax.random.key(0)), KEYS)
    chex.assert_trees_all_close(state, states[-1], rtol=1e-4, atol=1e-5)
    chex.assert_trees_all_close(
        scanned, jax.tree.map(lambda *xs: jnp.stack(xs), *metrics), rtol=1e-4, atol=1e-5
    )
    assert [int(m["env_steps"]) for m in metrics] == [120, 120]  # 6 members x 20 steps
    assert [int(m["replaced"]) for m in metrics] == [2, 2]
    # the members learned (TD3 ran) and their hyperparameters moved
    assert np.isfinite(float(metrics[0]["critic_loss"]))
    assert not np.allclose(states[0].hyperparameters, states[-1].hyperparameters)


def test_every_member_trains_its_td3_learner(reference):
    """Each interval's TD3 updates ran for every member (a copied member keeps its donor's
    count: the same), and moved each member's actor and critic from where they began.
    (Ten-step episodes for two intervals are too few for the returns to rise reliably.)"""
    _, states, _ = reference
    pop, delay = CONFIG.population_size, CONFIG.td3.policy_delay
    # 0.5 updates a step: 5 an episode, from the first episode that fills learning_starts
    for g, updates in enumerate((0, 5, 15)):
        learners = states[g].learners
        np.testing.assert_array_equal(learners.updates, np.full(pop, updates))
        np.testing.assert_array_equal(learners.critic.opt_state[0].count, np.full(pop, updates))
        actor_steps = -(-updates // delay)  # the actor every `delay`-th critic update
        np.testing.assert_array_equal(learners.actor.opt_state[0].count, np.full(pop, actor_steps))
    first, last = states[0].learners, states[-1].learners
    for net in ("actor", "critic"):
        for a, b in zip(
            jax.tree.leaves(getattr(first, net).params),
            jax.tree.leaves(getattr(last, net).params),
            strict=True,
        ):
            moved = np.abs(np.asarray(b) - np.asarray(a)).reshape(pop, -1).max(axis=1)
            assert (moved > 1e-4).all(), (net, moved)


def test_metrics_hold_each_members_return_and_hyperparameters(reference):
    _, states, metrics = reference
    for g, m in enumerate(metrics):
        for i in range(CONFIG.population_size):
            assert m[f"member{i}_return"] == states[g + 1].returns[i]
            for j, h in enumerate(CONFIG.searched()):
                assert m[f"member{i}_{h.name}"] == states[g].hyperparameters[i, j]
        np.testing.assert_allclose(m["fitness_best"], np.max(states[g + 1].returns))


def _padded_population(algo, state, n):
    """The members of ``state`` padded to a multiple of n with a decoy that
    would win every ranking: all weights 1e6 and the best fitness."""
    pop = CONFIG.population_size
    total = -(-pop // n) * n
    decoy = lambda x: jnp.full((total - pop, *x.shape[1:]), 1e6, x.dtype)  # noqa: E731
    learners = jax.tree.map(lambda x: jnp.concatenate([x, decoy(x)]), state.learners)
    hps = jnp.concatenate([state.hyperparameters, decoy(state.hyperparameters)])
    returns = jnp.arange(pop, dtype=jnp.float32)  # member i returned i
    return learners, hps, returns, jnp.arange(total) < pop


@pytest.mark.parametrize("n", [1, 4])
def test_exploit_copies_donors_exactly_into_the_bottom_fraction(reference, n):
    algo, states, _ = reference
    algo = pbt.PBT(CONFIG, make_mesh(n))
    before = jax.device_get(states[1])  # uncommitted, so any mesh may take it
    learners, hps, returns, valid = _padded_population(algo, before, n)
    # evosax fitness (minimised) of the real members: the decoys are never ranked
    new_learners, new_hps = jax.jit(algo.exploit)(learners, hps, -returns, KEYS[0])
    pop = CONFIG.population_size
    k = algo.num_replaced
    ranked = np.argsort(-np.asarray(returns))
    top = set(ranked[:k].tolist())
    bottom = set(ranked[pop - k :].tolist())
    low = np.asarray(algo.low)
    high = np.asarray(algo.high)
    donors = []
    for i in range(pop):
        mine = _row(new_learners, i)
        if i not in bottom:  # kept exactly as it was
            _equal(mine, _row(before.learners, i))
            np.testing.assert_array_equal(new_hps[i], before.hyperparameters[i])
            continue
        # a replaced member holds one top member's actor, critics, targets and
        # Adam states bit for bit, never the padded decoy
        matches = []
        for d in top:
            try:
                _equal(mine, _row(before.learners, d))
                matches.append(d)
            except AssertionError:
                pass
        assert len(matches) == 1, f"member {i} copies none of the top members"
        donor = matches[0]
        donors.append(donor)
        # and the donor's hyperparameters, each times 0.8 or 1.2 within the bounds
        h = np.asarray(before.hyperparameters[donor], np.float64)
        candidates = np.clip(np.stack([h * 0.8, h * 1.2]), low, high)
        assert np.all(np.isclose(new_hps[i], candidates, rtol=1e-6).any(0)), (new_hps[i], h)
    assert len(donors) == k
    # the decoy never donates; padded slots are returned untouched
    for i in range(pop, len(valid)):
        _equal(_row(new_learners, i), _row(learners, i))


def test_explore_stays_within_bounds():
    config = dataclasses.replace(CONFIG, resample_prob=0.3)
    algo = pbt.PBT(config)
    low = np.asarray(algo.low)
    high = np.asarray(algo.high)
    keys = jax.random.split(jax.random.key(3), 256)
    at_bounds = jnp.stack([algo.low, algo.high, 0.5 * (algo.low + algo.high)])
    values = jax.vmap(lambda k: jax.vmap(algo.explore, (0, None))(at_bounds, k))(keys)
    values = np.asarray(values)
    assert np.all(values >= low) and np.all(values <= high)
    # a perturbed value is the old one times 0.8 or 1.2, clipped; the rest
    # (about resample_prob of them) were drawn afresh from the range
    start = np.asarray(at_bounds)
    perturbed = np.zeros(values.shape, bool)
    for factor in (0.8, 1.2):
        perturbed |= np.isclose(values, np.clip(start * factor, low, high), rtol=1e-6)
    assert 0.2 < 1 - perturbed.mean() < 0.4
    initial = np.asarray(
        jax.vmap(algo.sample_hyperparameters)(jax.random.split(jax.random.key(4), 256))
    )
    assert np.all(initial >= low) and np.all(initial <= high)
    # learning rates log-uniform: about as many draws below as above the geometric mean
    geo = np.sqrt(low[0] * high[0])
    assert 0.35 < np.mean(initial[:, 0] < geo) < 0.65


# --- the command line: checkpoint and resume, plots ----------------------------------


def _write_config(path, generations):
    algorithm_config = {
        "population_size": 3,
        "interval": 20,
        "episode_steps": 10,
        "learning_starts": 10,
        "updates_per_step": 0.5,
        "buffer_capacity": 64,
        "eval_episodes": 1,
        "td3": {"actor_hidden_sizes": [8], "critic_hidden_sizes": [16], "batch_size": 16},
    }
    run = {"algorithm": "pbt", "seed": 3, "generations": generations, "chunk": 1}
    path.write_text(yaml.safe_dump({**run, "algorithm_config": algorithm_config}))
    return str(path)


def _flat(tree):
    return {k: np.asarray(v) for k, v in flatten_dict(tree, sep="/").items() if v is not None}


def test_resumed_run_equals_uninterrupted_and_plots_hyperparameters(tmp_path):
    whole = tmp_path / "whole"
    part = tmp_path / "part"
    common = ["--devices", "2", "-q", "--no-figure", "--checkpoint-every", "1"]
    cfg = _write_config(tmp_path / "pbt.yaml", 3)
    assert cli.main(["train", "--config", cfg, "--out", str(whole), *common]) == 0
    short = _write_config(tmp_path / "short.yaml", 2)
    assert cli.main(["train", "--config", short, "--out", str(part), *common]) == 0
    assert cli.main(["resume", str(part), "--generations", "3", "-q", "--no-figure"]) == 0
    a = restore.load_checkpoint(part)
    b = restore.load_checkpoint(whole)
    assert a.generation == b.generation == 3
    flat_a = _flat(a.state)
    flat_b = _flat(b.state)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)
    rows_a = store.read_metrics(part / store.METRICS_FILENAME)
    rows_b = store.read_metrics(whole / store.METRICS_FILENAME)
    for column in rows_b:
        if column != "wall_time":
            np.testing.assert_array_equal(rows_a[column], rows_b[column], err_msg=column)

    trajectories = plotting.member_hyperparameters(rows_b)
    assert sorted(trajectories) == sorted(h.name for h in pbt.Config().searched())
    np.testing.assert_array_equal(trajectories["actor_lr"][:, 1], rows_b["member1_actor_lr"])
    out = tmp_path / "pbt.png"
    assert cli.main(["plot", str(whole), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- bad input --------------------------------------------------------------------------


def test_unknown_hyperparameter_rejected():
    with pytest.raises(ValueError, match=r"cannot search the hyperparameter 'tau'.*'actor_lr'"):
        pbt.PBT(pbt.Config(search=(pbt.Hyperparameter("tau", 0.001, 0.01),)))


@pytest.mark.parametrize("fraction", [0.0, 0.6, -0.1])
def test_truncation_outside_range_rejected(fraction):
    with pytest.raises(ValueError, match=r"truncation must be in \(0, 0.5\]"):
        pbt.Config(truncation=fraction).validate()


def test_population_of_one_rejected():
    with pytest.raises(ValueError, match="population_size must be at least 2"):
        pbt.PBT(pbt.Config(population_size=1))


def test_bad_ranges_and_intervals_rejected():
    with pytest.raises(ValueError, match="low < high"):
        pbt.Hyperparameter("actor_lr", 1e-2, 1e-5).validate()
    with pytest.raises(ValueError, match="low > 0 when log=True"):
        pbt.Hyperparameter("discount", 0.0, 0.99).validate()
    with pytest.raises(ValueError, match=r"interval=250 must be a whole number of 200-step"):
        pbt.PBT(pbt.Config(interval=250))
    with pytest.raises(ValueError, match="continuous actions"):
        pbt.PBT(pbt.Config(task="CartPole-v1"))
    with pytest.raises(ValueError, match="smaller than one TD3 batch"):
        pbt.PBT(pbt.Config(buffer_capacity=16))
    with pytest.raises(ValueError, match="updates_per_step must be > 0"):
        pbt.Config(updates_per_step=0.0).validate()


def test_bad_config_file_is_a_config_error(tmp_path):
    from evorl_pop.run import config

    with pytest.raises(ConfigError, match="truncation must be in"):
        config.from_dict({"algorithm": "pbt", "algorithm_config": {"truncation": 0.7}})
