"""Helpers the learners' tests (test_ppo.py, test_sac.py) share."""

import csv

import jax
import numpy as np
from flax.traverse_util import flatten_dict

from evorl_pop import cli
from evorl_pop.run import restore


def leaves_close(a, b, rtol=1e-4, atol=1e-6):
    """Every leaf of ``a`` equals ``b``'s to float32 summation tolerance."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def two_steps(algo):
    """``(initial state, state after two steps, their metrics)`` of an algorithm, jitted."""
    state = algo.init(jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), 2)
    return state, *jax.jit(lambda s: jax.lax.scan(algo.step, s, keys))(state)


def _flat(tree):
    return {k: v for k, v in flatten_dict(tree, sep="/").items() if v is not None}


def _rows(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row.pop("wall_time")
    return rows


def assert_resume_equals_whole_run(run, tmp_path, generations, split):
    """``evorl-pop train RUN -g generations`` equals ``-g split`` then ``resume``: the
    checkpoints' states bit for bit, and every metrics row but the wall time."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert cli.main([*run, "-g", str(generations), "--out", str(whole)]) == 0
    assert cli.main([*run, "-g", str(split), "--out", str(part)]) == 0
    assert cli.main(["resume", str(part), "--generations", str(generations), "-q",
                     "--no-figure"]) == 0  # fmt: skip
    a, b = restore.load_checkpoint(whole), restore.load_checkpoint(part)
    assert a.generation == b.generation == generations and a.env_steps == b.env_steps
    flat_a, flat_b = _flat(a.state), _flat(b.state)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)
    assert _rows(whole / "metrics.csv") == _rows(part / "metrics.csv")
    return a
