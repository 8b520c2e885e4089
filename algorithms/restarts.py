"""Black-box minimisation with pycma's stop rules and IPOP / BIPOP restarts.

One run is a ``lax.while_loop`` of engine generations (an :class:`~evorl_pop.algorithms.es.ES`)
that stops at the target, the evaluation budget, ``maxiter`` or one of
pycma's termination criteria (:class:`StopRules`); :class:`Minimizer` restarts
runs as pycma's ``cma.fmin`` does::

    for each run: λ, σ from the restart regime (first, large: IPOP doubling,
                  small: BIPOP) ─► compiled run (one per λ, every instance)
               ─► evaluations, stop reason, best ─► next regime, or done

The starting point, step size, task state (e.g. a BBOB instance) and limits
are traced arguments, so every run with the same population size reuses one
compiled loop.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.algorithms.cma_es import CMA_ES_pycma
from evorl_pop.algorithms.es import ES, ESConfig, make_strategy
from evorl_pop.base import float_dtype, objective_error
from evorl_pop.core.interfaces import HasSearchWidth, KnowsOptimum
from evorl_pop.core.strategy_states import (
    CountsFlatFitness,
    HasAxisLengths,
    HasCovariance,
    HasEigenbasis,
    ScalesCoordinates,
)

#: Why a run ended; ``'running'`` never leaves :class:`Minimizer`.
STOP_REASONS = (
    "running",
    "target",
    "budget",
    "maxiter",
    "tolfun",
    "tolfunhist",
    "tolx",
    "tolconditioncov",
    "tolstagnation",
    "tolflatfitness",
    "tolfacupx",
    "noeffectcoord",
    "noeffectaxis",
    "tolxstagnation",
    "tolupsigma",
)
RESTART_STRATEGIES = ("ipop", "bipop")


@dataclasses.dataclass(frozen=True)
class StopRules:
    """pycma's termination criteria of one run, with its option names and defaults.

    Attributes:
      tolfun: the generation's fitness range and the range of the best
        fitness over the last ``10 + 30 n / λ`` generations are both below it.
      tolfunhist: that history (at least 10 generations) has a range below it.
      tolx: every ``σ·sqrt(C_ii)`` and ``σ·|p_c,i|`` is below it (CMA-ES family).
      tolconditioncov: the condition number of ``C`` exceeds it.
      tolstagnation: stop when the medians of the best and of the median
        fitness (sampled every 5 generations) stop improving over about
        ``100 + 100 n^1.5 / λ0`` generations (λ0: the first run's population)
        and the best is that old.
      tolflatfitness: generations tolerated in a row whose best fitness
        equals the one at rank ``⌊3λ/4⌋`` (strategies that count them,
        ``CMA_ES_pycma``).
      tolfacupx: some ``σ·sqrt(C_ii)`` exceeds ``σ0`` times it (CMA-ES family).
      tolupsigma: ``σ / sqrt(λ_max(C))`` exceeds ``σ0`` times it: σ has grown
        while C shrank, "creeping" (CMA-ES family).
      tolxstagnation: ``(δ, t0, f)``: stop when the mean has stayed within
        ``δ·sqrt(max(1, t / T))`` of where it was ``t`` generations ago, for
        ``t > T = t0 + f·g`` generations (``None``: off).
      noeffect: stop when adding ``0.2 σ·sqrt(C_ii)`` leaves some coordinate
        of the mean unchanged (``noeffectcoord``), or ``0.1 σ`` times the
        principal axis ``g mod n`` leaves the mean unchanged (``noeffectaxis``).

    With ``CMA_ES_pycma``, as in pycma, the rules read the genotype: its mean,
    ``σ·scaling·sqrt(C_ii)`` for ``σ·sqrt(C_ii)``, and C after pycma's
    alleviation of its conditioning (so ``tolconditioncov`` practically
    never fires, C's condition starting again at 1e12).
    """

    tolfun: float = 1e-11
    tolfunhist: float = 1e-12
    tolx: float = 1e-11
    tolconditioncov: float = 1e14
    tolstagnation: bool = True
    tolxstagnation: tuple[float, float, float] | None = (1e-9, 20.0, 0.1)
    tolflatfitness: int = 1
    tolfacupx: float = 1e3
    noeffect: bool = True
    tolupsigma: float = 1e20


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run of a restart sequence.

    Attributes:
      population_size: its population size λ.
      sigma: its initial step size.
      regime: ``'first'``, ``'large'`` (IPOP doubling) or ``'small'`` (BIPOP).
      max_generations: its generation limit (``maxiter``).
      evaluations: the evaluations it used.
      stop: why it ended, one of :data:`STOP_REASONS`.
      best: its best fitness.
    """

    population_size: int
    sigma: float
    regime: str
    max_generations: int
    evaluations: int
    stop: str
    best: float


@dataclasses.dataclass(frozen=True)
class MinimizeResult:
    """Outcome of :func:`minimize`.

    Attributes:
      converged: whether some run reached the target.
      evaluations: function evaluations spent, restarts included, up to the
        generation that reached the target (or in all, if none did).
      best: the best fitness found.
      restarts: restarts used.
      f_minus_fopt: ``best - f*`` when the task knows ``f*``, else ``None``.
      runs: every run, in order.
      x: the best solution found.
    """

    converged: bool
    evaluations: int
    best: float
    restarts: int
    f_minus_fopt: float | None = None
    runs: tuple[RunRecord, ...] = ()
    x: np.ndarray | None = None


def default_max_generations(num_dims: int, population_size: int) -> int:
    """pycma's default ``maxiter``: ``100 + ⌊150 (n + 3)^2 / sqrt(λ)⌋``."""
    return 100 + int(150 * (num_dims + 3) ** 2 // population_size**0.5)


def default_tolstagnation(num_dims: int, population_size: int) -> int:
    """pycma's default ``tolstagnation`` in generations: ``⌊100 + 100 n^1.5 / λ⌋``."""
    return int(100 + 100 * num_dims**1.5 / population_size)


def _shift_in(buffer, value):
    """Newest-first history: ``value`` at index 0, the oldest entry dropped."""
    return jnp.roll(buffer, 1).at[0].set(value)


def _window_median(buffer, start, stop):
    """Median of ``buffer[start:stop]`` for traced bounds (entries outside become +inf)."""
    idx = jnp.arange(buffer.shape[0])
    inside = (idx >= start) & (idx < stop)
    ranked = jnp.sort(jnp.where(inside, buffer, jnp.inf))
    count = stop - start
    return 0.5 * (ranked[(count - 1) // 2] + ranked[count // 2])


def _rescale_covariance(s):
    """CMA-ES state with ``C``'s eigenvalues centred on 1, the distribution unchanged.

    ``σ²C`` is all that CMA-ES samples from, so ``(σ, C, p_c) -> (σ√k, C/k,
    p_c/√k)`` leaves every generation as it was (``p_σ`` is invariant), with
    ``k = √(λ_max λ_min)`` of the last eigendecomposition. It keeps ``C`` where
    evosax's absolute constants are negligible: ``ask`` adds ``1e-8 I`` to ``C``
    and floors its eigenvalues at ``1e-8``, which once the scale of ``C`` has
    drifted to ~1e-7 caps its condition number far below the 1e6 of an
    ill-conditioned function (BBOB f12 stalled at f - f* ~ 1e-5 in 2-D).
    """
    if not (isinstance(s, HasCovariance) and isinstance(s, HasAxisLengths)) or s.C.ndim != 2:
        return s
    k = jnp.max(s.D) * jnp.min(s.D)
    return s.replace(C=s.C / k, std=s.std * jnp.sqrt(k), p_c=s.p_c / jnp.sqrt(k))


#: Compiled runs, shared by every :class:`Minimizer` of the same task and settings;
#: the least recently used are dropped beyond this many.
MAX_COMPILED_RUNS = 32
_RUNS: collections.OrderedDict[tuple, object] = collections.OrderedDict()


def _stop_checks(rules: StopRules, s, c, gen, sigma, n: int, lam: int, tolstagnation):
    """Whether each of pycma's criteria holds after generation ``gen``, in STOP_REASONS
    order from ``tolx`` on, and the new anchor of ``tolxstagnation``."""
    covariance = isinstance(s, HasCovariance)
    axes = isinstance(s, HasAxisLengths)
    scaling = s.scaling if isinstance(s, ScalesCoordinates) else 1.0  # pycma's sigma_vec
    spread = s.std * scaling * jnp.sqrt(jnp.diag(s.C)) if covariance else None
    false = jnp.bool_(False)
    checks = [
        jnp.all(spread < rules.tolx) & jnp.all(s.std * jnp.abs(scaling * s.p_c) < rules.tolx)
        if covariance
        else false,
        jnp.max(s.D) > rules.tolconditioncov**0.5 * jnp.min(s.D) if axes else false,
    ]
    if rules.tolstagnation:
        long_size = c["long_size"]
        window = jnp.maximum(tolstagnation / 10, long_size / 10).astype(jnp.int32)

        def stalled(h):  # the newer window's median no better than the older one's
            return _window_median(h, 0, window) >= _window_median(h, window, 2 * window)

        checks.append(
            (gen > n * (5 + 100 / lam))
            & (gen - c["best_gen"] > tolstagnation / 2)
            & (long_size > 100)
            & (2 * window < long_size)
            & stalled(c["hist_median"])
            & stalled(c["hist_best"])
        )
    else:
        checks.append(false)
    flat = isinstance(s, CountsFlatFitness)
    checks.append(s.flat_generations > rules.tolflatfitness if flat else false)
    checks.append(jnp.any(spread > rules.tolfacupx * sigma) if covariance else false)
    noeffect = covariance and rules.noeffect
    checks.append(jnp.any(s.mean == s.mean + 0.2 * spread) if noeffect else false)
    if rules.noeffect and isinstance(s, HasEigenbasis):
        axis = 0.1 * s.std * s.D[gen % n] * scaling * s.B[:, gen % n]
        checks.append(jnp.all(s.mean == s.mean + axis))
    else:
        checks.append(false)
    # pycma's tolxstagnation: the mean has not left a small ball for long
    anchor = c["anchor"]
    anchor_gen = c["anchor_gen"]
    if rules.tolxstagnation is not None:
        delta, offset, fraction = rules.tolxstagnation
        threshold = offset + fraction * gen
        radius = delta * jnp.sqrt(jnp.maximum(1.0, (gen - anchor_gen) / threshold))
        moved = (gen == 1) | (jnp.linalg.norm(s.mean - anchor) > radius)
        anchor = jnp.where(moved, s.mean, anchor)
        anchor_gen = jnp.where(moved, gen, anchor_gen)
        checks.append(gen - anchor_gen > threshold)
    else:
        checks.append(false)
    tolupsigma = axes and isinstance(s, HasSearchWidth)
    checks.append(s.std / jnp.max(s.D) > rules.tolupsigma * sigma if tolupsigma else false)
    return checks, anchor, anchor_gen


class Minimizer:
    """Restarted runs of one black-box task, each compiled once per population size.

    One run is a ``lax.while_loop`` of engine generations that stops at the
    target, the evaluation budget, ``maxiter`` or one of :class:`StopRules`;
    the starting point, step size, task state (e.g. a BBOB instance) and
    limits are traced arguments, so every run with the same population size
    reuses one compiled loop, on every instance.
    """

    def __init__(self, config: ESConfig, mesh=None, task=None, stop_rules: StopRules = StopRules()):
        """Builds the minimiser.

        Args:
          config: the run configuration (a task to minimise; its
            ``population_size`` is the first run's, its ``sigma_init`` the step size).
          mesh: the device mesh (``None``: every device).
          task: a ready task instead of ``config.task`` (e.g. a
            :class:`~evorl_pop.tasks.blackbox.PythonTask`).
          stop_rules: the termination criteria of each run.
        """
        self.config = config
        self.mesh = mesh
        self.task = config.make_task() if task is None else task
        if self.task.maximize:
            raise ValueError(f"minimize needs a task to minimise, not {self.task.name!r}.")
        self.stop_rules = stop_rules

    def _run_fn(self, population_size: int, history: int):
        """The compiled run for ``population_size``, its long history ``history`` long."""
        cache_key = (
            self.config,
            self.mesh,
            self.task,
            self.stop_rules,
            population_size,
            history,
            jax.config.x64_enabled,
        )
        if cache_key in _RUNS:
            _RUNS.move_to_end(cache_key)
            return _RUNS[cache_key]
        config = dataclasses.replace(self.config, population_size=population_size)
        es = ES(config, mesh=self.mesh, task=self.task)
        rules = self.stop_rules
        n = self.task.num_dims
        lam = population_size
        short = int(10 + 30 * n / lam)  # pycma keeps this many generations of the best
        optimal_value = self.task.optimal_value if isinstance(self.task, KnowsOptimum) else None
        # CMA_ES_pycma has no absolute constants to keep C away from, and keeps σ and C as
        # pycma does (tolupsigma reads them)
        rescale = not isinstance(es.strategy, CMA_ES_pycma)

        def run(
            key, x0, sigma, task_state, max_generations, budget_generations, target, tolstagnation
        ):
            init_key, run_key = jax.random.split(key)
            state = es.init(init_key, x0).replace(task_state=task_state)
            s = state.strategy_state
            if isinstance(s, HasSearchWidth):
                state = state.replace(strategy_state=s.replace(std=jnp.asarray(sigma, s.std.dtype)))
            fopt = optimal_value(task_state) if optimal_value else 0.0
            dtype = s.mean.dtype
            carry = dict(
                state=state,
                gen=jnp.int32(0),
                reason=jnp.int32(0),
                best=jnp.asarray(jnp.inf, dtype),
                best_gen=jnp.int32(0),
                hist=jnp.full((short,), jnp.inf, dtype),
                hist_size=jnp.int32(0),
                hist_best=jnp.full((history,), jnp.inf, dtype),
                hist_median=jnp.full((history,), jnp.inf, dtype),
                long_size=jnp.int32(0),
                anchor=x0,
                anchor_gen=jnp.int32(0),
            )

            def body(c):
                state, m = es.step(c["state"], jax.random.fold_in(run_key, c["gen"]))
                if rescale:
                    state = state.replace(strategy_state=_rescale_covariance(state.strategy_state))
                gen = c["gen"] + 1
                f_best = m["fitness_best"]
                f_worst = m["fitness_worst"]
                improved = f_best < c["best"]
                sample = gen % 5 == 0  # the long histories take every fifth generation
                new = dict(
                    state=state,
                    gen=gen,
                    best=jnp.where(improved, f_best, c["best"]),
                    best_gen=jnp.where(improved, gen, c["best_gen"]),
                    hist=_shift_in(c["hist"], f_best),
                    hist_size=jnp.minimum(c["hist_size"] + 1, short),
                    hist_best=jnp.where(sample, _shift_in(c["hist_best"], f_best), c["hist_best"]),
                    hist_median=jnp.where(
                        sample, _shift_in(c["hist_median"], m["fitness_median"]), c["hist_median"]
                    ),
                    long_size=jnp.minimum(c["long_size"] + sample, history),
                )
                filled = jnp.arange(short) < new["hist_size"]
                hist = new["hist"]
                hist_range = jnp.max(jnp.where(filled, hist, -jnp.inf)) - jnp.min(
                    jnp.where(filled, hist, jnp.inf)
                )
                s = state.strategy_state
                checks, anchor, anchor_gen = _stop_checks(
                    rules, s, {**c, **new}, gen, sigma, n, lam, tolstagnation
                )
                checks = [
                    f_best - fopt < target,
                    gen >= budget_generations,
                    gen >= max_generations,
                    (f_worst - f_best < rules.tolfun) & (hist_range < rules.tolfun),
                    (new["hist_size"] > 9) & (hist_range < rules.tolfunhist),
                    *checks,
                ]
                fired = jnp.stack([jnp.asarray(x) for x in checks])
                reason = jnp.where(jnp.any(fired), jnp.argmax(fired) + 1, 0).astype(jnp.int32)
                return dict(new, reason=reason, anchor=anchor, anchor_gen=anchor_gen)

            c = jax.lax.while_loop(lambda c: c["reason"] == 0, body, carry)
            best_x = c["state"].best_solution  # the engine's best so far
            return c["gen"], c["reason"], c["best"], c["best"] - fopt, best_x

        compiled = _RUNS[cache_key] = jax.jit(run)
        while len(_RUNS) > MAX_COMPILED_RUNS:
            _RUNS.popitem(last=False)
        return compiled

    def minimize(
        self,
        key: jax.Array,
        target: float = 1e-8,
        max_evaluations: int | None = None,
        restarts: int = 0,
        restart_strategy: str = "ipop",
        max_generations: int | None = None,
        x0=None,
        task_state=None,
    ) -> MinimizeResult:
        """Runs, and restarts, until the target, the budget or the last restart.

        Restarts as in pycma's ``cma.fmin``: IPOP-CMA-ES (Auger & Hansen 2005)
        doubles the population at each restart; BIPOP-CMA-ES (Hansen 2009,
        https://inria.hal.science/inria-00382093) interleaves those large runs
        with small ones, λ = ⌊λ0 (λ_large / λ0)^(U²)⌋ (λ_large: the last large
        run's population) and σ = σ0 · 0.01^U (U uniform in [0, 1]), each
        started whenever the small runs have used fewer evaluations than the
        large ones, and given at most half their total. The first run counts
        as small. Every run starts at ``x0``; like pycma's, every run keeps
        the first run's ``maxiter`` (the small ones capped as above) and
        ``tolstagnation``, the defaults for λ0.

        Args:
          key: the PRNG key.
          target: success once a generation's best ``f - f*`` is below it
            (``f`` itself when the task does not know ``f*``).
          max_evaluations: one budget for all runs together, never exceeded
            (``None``: no limit but ``max_generations`` per run).
          restarts: restarts with a larger population allowed (BIPOP's small
            runs do not count).
          restart_strategy: ``'ipop'`` or ``'bipop'``.
          max_generations: generations per run (``None``: pycma's default,
            :func:`default_max_generations`).
          x0: the starting point (``None``: the task's).
          task_state: the task's state (``None``: the task's own; e.g. another
            BBOB instance's data, without recompiling).

        Returns:
          A :class:`MinimizeResult`.
        """
        if restart_strategy not in RESTART_STRATEGIES:
            raise ValueError(
                f"restart_strategy must be one of {RESTART_STRATEGIES}, got {restart_strategy!r}."
            )
        if restarts < 0 or (max_evaluations is not None and max_evaluations < 1):
            raise ValueError(
                f"need restarts >= 0 and max_evaluations >= 1, got {restarts}, {max_evaluations}."
            )
        config = self.config
        task = self.task
        n = self.task.num_dims
        lam0 = config.population_size
        sigma0 = config.sigma_init
        if sigma0 is None:
            sigma0 = float(make_strategy(config.strategy, lam0, n)[1].std_init)
        x0_key, runs_key = jax.random.split(key)
        x0 = task.init_solution(x0_key) if x0 is None else x0
        x0 = jnp.asarray(x0, float_dtype()).reshape(n)
        task_state = task.init_state() if task_state is None else task_state
        budget = max_evaluations if max_evaluations is not None else 2**62
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
        # as in pycma, whose options are evaluated once, for the first run's population
        maxiter0 = max_generations or default_max_generations(n, lam0)
        tolstagnation = default_tolstagnation(n, lam0)

        runs: list[RunRecord] = []
        used = 0
        small = []
        large = []
        runs_with_small = 0
        best = np.inf
        best_precision = np.inf
        converged = False
        spent = None
        best_x = np.asarray(x0)
        for irun in range(2**31):
            sigma = sigma0
            regime = "first"
            lam = lam0
            maxiter = maxiter0
            if irun > 0 and restart_strategy == "bipop" and sum(small) < max(1, sum(large)):
                regime = "small"
                runs_with_small = runs_with_small + 1
                sigma = sigma0 * 0.01 ** rng.uniform()
                lam = int(lam0 * (2.0 ** (irun - runs_with_small)) ** (rng.uniform() ** 2))
                maxiter = min(maxiter0, int(np.ceil(0.5 * sum(large) / lam)))
            elif irun > 0:
                regime = "large"
                lam = lam0 * 2 ** (irun - runs_with_small)
            budget_generations = (budget - used) // lam
            if budget_generations < 1:
                break
            # static per population size and call: restarts and instances share the compiled run
            longest = min(maxiter0, budget // lam)
            history = min(20_000, longest // 5 + 1)
            run = self._run_fn(lam, history)
            args = (
                jax.random.fold_in(runs_key, irun),
                x0,
                sigma,
                task_state,
                maxiter,
                min(budget_generations, 2**31 - 1),
                target,
                tolstagnation,
            )
            try:
                gens, reason, run_best, precision, run_x = jax.device_get(
                    jax.block_until_ready(run(*args))  # every device's part (see train_loop)
                )
            except jax.errors.JaxRuntimeError as err:
                raise objective_error(err) from None
            evaluations = int(gens) * lam
            used += evaluations
            stop = STOP_REASONS[int(reason)]
            runs.append(
                RunRecord(lam, float(sigma), regime, maxiter, evaluations, stop, float(run_best))
            )
            (large if regime == "large" else small).append(evaluations)
            if float(run_best) < best:
                best = float(run_best)
                best_x = np.asarray(run_x)
            best_precision = min(best_precision, float(precision))
            if stop == "target":
                converged = True
                spent = used
                break
            if irun + 1 - runs_with_small > restarts:
                break
        has_fopt = isinstance(task, KnowsOptimum)
        return MinimizeResult(
            converged=converged,
            evaluations=used if spent is None else spent,
            best=best,
            restarts=max(len(runs) - 1, 0),
            f_minus_fopt=best_precision if has_fopt else None,
            runs=tuple(runs),
            x=best_x,
        )


def minimize(
    config: ESConfig,
    key: jax.Array,
    mesh=None,
    task=None,
    stop_rules: StopRules = StopRules(),
    **options,
) -> MinimizeResult:
    """Minimises a black-box task to a target, with IPOP or BIPOP restarts.

    Shorthand for ``Minimizer(config, mesh, task, stop_rules).minimize(key,
    **options)`` (see :meth:`Minimizer.minimize` for the options: ``target``,
    ``max_evaluations``, ``restarts``, ``restart_strategy``, ...); reuse one
    :class:`Minimizer` to run many instances or seeds without recompiling.
    """
    return Minimizer(config, mesh, task, stop_rules).minimize(key, **options)
