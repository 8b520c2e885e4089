"""The multi-objective problems beyond ZDT1-3 and DTLZ1-2 against pymoo 0.6's
implementations: objective values at random points, and the true fronts against
pymoo's ``pareto_front`` where pymoo computes one offline."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evorl_pop.tasks import wfg
from evorl_pop.tasks.multiobjective import make_mo_task, nondominated, thin

pymoo_problems = pytest.importorskip("pymoo.problems")

NEW = ["zdt4", "zdt6"] + [f"dtlz{i}" for i in range(3, 8)] + list(wfg.WFG)
SCALABLE = [p for p in NEW if not p.startswith("zdt")]
# each problem once in the default tier; 2 and 5 objectives in the long one
CASES = [(p, 2) for p in NEW if p.startswith("zdt")] + [(p, 3) for p in SCALABLE]
CASES += [pytest.param(p, m, marks=pytest.mark.slow) for p in SCALABLE for m in (2, 5)]


def _pymoo(task):
    kwargs = {} if task.problem.startswith("zdt") else {"n_obj": task.num_objectives}
    return pymoo_problems.get_problem(task.problem, n_var=task.num_dims, **kwargs)


def _distance(a, b, plus=False):
    """The largest distance from a row of ``a`` to its nearest row of ``b`` (``plus``:
    counting only where the row of ``b`` is worse, as IGD+)."""
    d = b[None, :, :] - a[:, None, :]
    d = np.maximum(d, 0.0) if plus else d
    return np.sqrt((d**2).sum(-1)).min(axis=1).max()


@pytest.mark.parametrize(("problem", "m"), CASES)
def test_objectives_equal_pymoo_at_random_points(problem, m):
    task = make_mo_task(f"mo/{problem}", num_objectives=m)
    reference = _pymoo(task)
    x = np.random.default_rng(len(problem) + m).random((64, task.num_dims))
    want = reference.evaluate(reference.xl + x * (reference.xu - reference.xl))
    got = np.asarray(jax.jit(jax.vmap(task.objectives))(jnp.asarray(x, jnp.float32)))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


FRONTS = [("zdt4", 2), ("zdt6", 2), ("dtlz3", 3), ("dtlz4", 3), ("wfg4", 3), ("wfg9", 3)]
# sampled fronts take seconds each: the long tier
FRONTS += [
    pytest.param(p, m, marks=pytest.mark.slow)
    for p, m in [("dtlz5", 2), ("dtlz7", 2), ("dtlz5", 5), ("wfg1", 2), ("wfg2", 2), ("wfg3", 2)]
]


@pytest.mark.parametrize(("problem", "m"), FRONTS)
def test_fronts_against_pymoo(problem, m):
    """Ours no worse than any point of pymoo's front, within our front's spacing (an
    IGD+ distance: pymoo's DTLZ7 and WFG2 sets keep dominated points), and ours
    non-dominated."""
    task = make_mo_task(f"mo/{problem}", num_objectives=m)
    ours = task.pareto_front()
    theirs = nondominated(_pymoo(task).pareto_front())
    scale = np.ptp(ours, axis=0).max()
    assert _distance(theirs, ours, plus=True) < 0.05 * scale
    assert len(nondominated(ours)) == len(ours)
    if problem.startswith("zdt") or problem in ("dtlz3", "dtlz4"):
        # a front known in closed form: ours and pymoo's both lie on it
        assert _distance(ours, theirs) < 0.15 * scale  # pymoo's sets are sparser


def test_front_helpers_by_hand():
    points = np.asarray([[0.0, 1.0, 2.0], [1.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(nondominated(points), points[[0, 2, 3]])
    line = np.linspace(0, 1, 11)[:, None] * np.ones(2)
    np.testing.assert_allclose(thin(line, 3), line[[0, 5, 10]])


def test_wfg_settings_are_checked():
    with pytest.raises(ValueError, match="must be even"):
        make_mo_task("mo/wfg2", num_dims=9, num_objectives=3)
    with pytest.raises(ValueError, match="more than k"):
        make_mo_task("mo/wfg4", num_dims=4, num_objectives=3)
    assert make_mo_task("mo/wfg4", num_objectives=5).num_dims == 8 + 20
