"""Population statistics: the sharded summary equals numpy on the real,
finite scores; a population with no finite score has NaN mean and std."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from evorl_pop import make_mesh
from evorl_pop.core.engine import summarize
from evorl_pop.distributed import POP_AXIS_NAME

SCORES = np.array([3.0, np.nan, -1.0, 7.5, np.inf, 2.0, 0.5, 9.0], np.float32)
MASK = np.array([True] * 7 + [False])  # the last slot is padding


def _summary(scores, n):
    steps = jnp.arange(1, scores.size + 1, dtype=jnp.int32)

    def local(scores, steps, mask):
        return summarize(scores, steps, mask, maximize=True)

    spec = P(POP_AXIS_NAME)
    f = jax.shard_map(local, mesh=make_mesh(n), in_specs=(spec,) * 3, out_specs=P())
    return jax.jit(f)(jnp.asarray(scores), steps, jnp.asarray(MASK))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_summary_equals_numpy(n):
    s = _summary(SCORES, n)
    real = SCORES[MASK]
    finite = real[np.isfinite(real)]
    assert float(s.best) == finite.max() and float(s.worst) == finite.min()
    np.testing.assert_allclose(float(s.mean), finite.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(s.std), finite.std(), rtol=1e-6)
    assert int(s.num_nonfinite) == 2
    assert int(s.info) == sum(range(1, 8))  # the padded slot's steps are not counted
    np.testing.assert_array_equal(np.asarray(s.scores), SCORES)


@pytest.mark.parametrize("n", [1, 2])
def test_no_finite_score_gives_nan_mean_and_std(n):
    s = _summary(np.array([np.nan, np.inf, -np.inf, np.nan] * 2, np.float32), n)
    assert np.isnan(float(s.mean)) and np.isnan(float(s.std))
    assert int(s.num_nonfinite) == 7
