"""``evorl-pop render RUN``: the run's best policy acting in its environment.

The policy is the one the run's evaluation reports (``eval_return``) from the
last checkpoint: the mean of the search distribution for the evolution
strategies (the best so far for population-based ones, the learner's actor
where a hybrid names it), the member with the best last return for PBT.
Its episodes run with the key of the run's last evaluation (``--seed S``:
``jax.random.key(S)``), episode ``j`` with ``split(key, episodes)[j]`` as in
every evaluation, so the printed return is the evaluation's: it comes from the
evaluation path itself, and the drawn episodes, stepped with the same compiled
step and keys, add up to it.

Each environment family says how its episodes are drawn
(:class:`~evorl_pop.core.interfaces.EnvFamily`'s ``drawing`` and ``draw``),
into ``RUN/render.<drawing>``:

- brax and Playground tasks: brax's HTML viewer (``brax.io.html``),
  ``RUN/render.html``;
- gymnax tasks: an animated GIF, one frame per step with the step and the
  return so far, ``RUN/render.gif``, drawn by gymnax's own visualiser where it
  has one for the environment (classic control needs gymnasium's pygame), else
  the observation drawn with matplotlib (a plug-in family's too, unless it
  draws its own);
- Gymnasium tasks (stepped on the host): an animated GIF of the frames the
  environment draws (``render_mode='rgb_array'``), its episodes replayed by a plain
  Gymnasium loop with the evaluation's reset seeds;
- black-box tasks: nothing to render.

A run whose result is many policies renders one of them: ``member`` (``--member I``)
the front member of index ``I`` (``front.csv``'s ``index`` column) of an NSGA-II or
NSGA-III run on a multi-objective brax task (``mo/halfcheetah``, ...), printing its
objectives summed over the drawn episodes; ``cell`` (``--cell I``) the elite of
cell ``I`` of a MAP-Elites run on a brax quality-diversity task (``qd/hopper_uni``,
...), from ``archive.npz``, or ``descriptor`` (``--descriptor d1,d2``) the filled
cell whose centroid is nearest to it, printing its return and descriptor. Their
episodes run with the key ``jax.random.key(S)`` (``--seed S``, default 0), episode
``j`` with ``split(key, episodes)[j]``; the printed values, from the drawn states,
are checked against the task's own evaluation of the same episodes. A black-box
task's front or archive (``mo/zdt1``, ``qd/arm``) has nothing to render.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import CheckpointError, RunError
from evorl_pop.core.capabilities import EvaluatesReturn, OnTask, ReportsReturn, SearchesTask
from evorl_pop.core.interfaces import (
    Acts,
)
from evorl_pop.run import config as config_lib
from evorl_pop.run import restore, shell, store, sweep
from evorl_pop.run.replicas import Replicas
from evorl_pop.tasks import rollout as rollout_lib
from evorl_pop.tasks.brax_envs import BraxFamily
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.drawing import Trajectory
from evorl_pop.tasks.envs import env_family
from evorl_pop.tasks.obs_norm import ObsMoments

#: The file ``evorl-pop render`` writes in a run folder: ``render.<drawing>``.
FILENAME = "render.{}"


@dataclasses.dataclass
class Episodes:
    """What :func:`run_episodes` saw: each episode as it was stepped, its return; and
    the return the run's evaluation reports for them."""

    trajectories: list[Trajectory]  # per episode: states, observations, returns so far
    returns: list[float]  # per episode, summed as the rollout sums it
    evaluation: float | None  # the evaluation path's mean return over the episodes (None:
    # a learner on host lanes, which has none)
    reported: float | None  # metrics.csv's eval_return of the same policy and key, if any
    generation: int
    env: object
    replica: dict | None = None  # a run of replicas: the labels of the one shown (its best)


def _policy(algorithm, state):
    """``(env, policy, params, obs_norm, episode_length, evaluate)``: the best policy and
    ``evaluate(key, episodes) -> mean return`` by the run's own evaluation path."""
    if not isinstance(algorithm, Acts):
        raise CheckpointError(
            f"{type(algorithm).__name__} has no policy to render: it does not define "
            "acting (core.interfaces.Acts)."
        )
    # the engine's reported solution, a learner's policy, PBT's best member
    acting = algorithm.acting(state)
    length = rollout_lib.step_limit(acting.env, acting.episode_length)
    if isinstance(algorithm, EvaluatesReturn):  # the engine: its task's evaluation

        def evaluate(key, episodes):
            return jax.jit(algorithm.evaluate_return, static_argnums=2)(state, key, episodes)

    else:  # a learner's, PBT's: a rollout of the acting policy

        def evaluate(key, episodes):
            def run(p, n, k):
                stats = rollout_lib.evaluate_episodes(
                    acting.env, acting.policy, p, k, episodes, n, length
                )
                return stats.episode_return

            return jax.jit(run)(acting.params, acting.obs_norm, key)

    return acting.env, acting.policy, acting.params, acting.obs_norm, length, evaluate


def _evaluation_key(algorithm, run_key, generation: int, state):
    """The key, and the episode count, of the run's last reported evaluation."""
    key = jax.random.fold_in(run_key, max(generation - 1, 0))  # 0: no evaluation yet
    if not isinstance(algorithm, ReportsReturn):  # a learner: its run reports no evaluation
        return key, None
    return algorithm.evaluation(key, state)


def _trajectory(env, policy, params, obs_norm, episode_length, key) -> tuple[Trajectory, float]:
    """One episode with the rollout's own compiled step and key schedule: the episode as
    it was stepped, and its return."""
    length = rollout_lib.step_limit(env, episode_length)
    track = obs_norm is not None
    step, start = rollout_lib.compiled_step(env, policy, length, track, False, False)
    obs, env_state, keys = start(key, length)
    zero = jnp.zeros_like(obs, dtype=jnp.float32)
    scalar = zero.reshape(-1)[0]
    moments = ObsMoments(scalar, zero, zero) if track else None
    carry = (obs, env_state, scalar, jnp.zeros((), jnp.int32), jnp.ones((), bool), moments)

    @jax.jit
    def scan(carry, params, obs_norm):
        def body(carry, xs):
            carry, _ = step(params, obs_norm, None, carry, xs)
            return carry, carry[:3]

        return jax.lax.scan(body, carry, (jnp.arange(length), keys))

    final, seen = scan(carry, params, obs_norm)
    steps = int(final[3])
    observations, states, so_far = jax.tree.map(lambda x: _on_host(x[:steps]), seen)
    return Trajectory(states, observations, so_far), float(final[2])


def _on_host(x) -> np.ndarray:
    """``x`` as a NumPy array; a PRNG key (in Playground's states) as its key data."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _best_replica(run_dir: Path) -> int:
    """The replica (seeds, a sweep's settings) whose last reported return (else mean
    fitness) is highest: its index, the order of the last generation's rows."""
    metrics = store.read_metrics(run_dir)
    last = metrics["generation"] == metrics["generation"].max()
    column = "eval_return" if "eval_return" in metrics else "fitness_mean"
    return int(np.argmax(np.nan_to_num(metrics[column][last], nan=-np.inf)))


def _reported(run_dir: Path, generation: int, replica: int | None = None) -> float | None:
    """The return ``metrics.csv`` reports for the evaluation of ``generation`` (of the
    replica of that index in a run of replicas), if any."""
    metrics = store.read_metrics(run_dir)
    rows = metrics["generation"] == generation
    if replica is not None:  # its row among the generation's
        rows &= np.cumsum(rows) == replica + 1
    if not rows.any():
        return None
    if "eval_return" in metrics:
        return float(metrics["eval_return"][rows][-1])
    if "member0_return" in metrics:  # PBT: the best member's return
        members = [c for c in metrics if c.startswith("member") and c.endswith("_return")]
        return float(np.max([metrics[c][rows][-1] for c in members]))
    return None


def run_episodes(run_dir, episodes: int = 1, seed: int | None = None) -> Episodes:
    """Runs the best policy of a run's last checkpoint (a run on an environment).

    Args:
      run_dir: the run folder.
      episodes: episodes to run (``split(key, episodes)[j]`` for episode ``j``).
      seed: ``None``: the key of the run's last evaluation; else ``jax.random.key(seed)``.
    """
    run_dir = Path(run_dir)
    ckpt = restore.load_checkpoint(run_dir)
    config = config_lib.from_dict(ckpt.config, check=False)
    config = dataclasses.replace(config, devices=1)  # one episode at a time
    algorithm, _, template, _, _ = shell.build(config)
    state = restore.restore_state(template, ckpt)
    run_key, index, label = restore.restore_key(ckpt), None, None
    if isinstance(algorithm, Replicas):  # its best replica, as a run of its own
        index = _best_replica(run_dir)
        label, run_key = algorithm.labels[index], run_key[index]
        algorithm, state = algorithm.replica(state, index)
    env, policy, params, obs_norm, length, evaluate = _policy(algorithm, state)
    generation = ckpt.generation
    reported = None
    key, eval_episodes = _evaluation_key(algorithm, run_key, generation, state)
    if seed is not None:
        key = jax.random.key(seed)
    elif generation > 0 and episodes == eval_episodes:
        reported = _reported(run_dir, generation, index)
    family = env_family(config.algorithm_config.task)
    if family.steps_in_jax:
        runs = [
            _trajectory(env, policy, params, obs_norm, length, k)
            for k in jax.random.split(key, episodes)
        ]
    elif isinstance(algorithm, SearchesTask):  # Gymnasium: the evaluation's episodes
        from evorl_pop.tasks.gym_envs import play  # replayed by a plain loop on the host

        solution = algorithm.mean_solution(state)
        runs = play(algorithm.task, solution, key, state.task_state, episodes)
    else:  # a learner's actor on Gymnasium lanes: its episodes have no evaluation path
        from evorl_pop.tasks.gym_envs import play_acting

        acting = algorithm.acting(state)
        runs = play_acting(acting, acting.env.factory, acting.env.one_hot, key, episodes)
        evaluate = None
    evaluation = None if evaluate is None else float(evaluate(key, episodes))
    trajectories = [trajectory for trajectory, _ in runs]
    returns = [ret for _, ret in runs]
    return Episodes(trajectories, returns, evaluation, reported, generation, env, label)


def render(
    run_dir,
    episodes: int = 1,
    seed: int | None = None,
    out=None,
    member: int | None = None,
    cell: int | None = None,
    descriptor: tuple[float, ...] | None = None,
) -> str:
    """Renders a run's best policy, or one of a front's members or an archive's elites
    (see the module docstring); returns what to print.

    Raises:
      CheckpointError: no checkpoint.
      ValueError: episodes below 1; a member or cell the run does not hold (naming the
        valid ones), or one asked of a run without a front or an archive; an ``out`` of
        another file type than the family draws; a sweep's top folder (naming its
        programs' run folders).
      RunError: an ``out`` whose folder cannot be created or written.
    """
    if episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {episodes}.")
    run_dir = Path(run_dir)
    if told := sweep.top_folder(run_dir, "render"):
        raise ValueError(told)
    config = config_lib.from_dict(restore.load_checkpoint(run_dir).config, check=False)
    task = config.algorithm_config.task if isinstance(config.algorithm_config, OnTask) else None
    family = env_family(task) if isinstance(task, str) else None
    many = isinstance(task, str) and task.startswith(("qd/", "mo/"))
    chosen = member is not None or cell is not None or descriptor is not None
    if chosen and not many:
        which = "--member" if member is not None else "--cell and --descriptor"
        raise ValueError(
            f"{which} choose a front member (nsga2, nsga3, moead, rvea on mo/ tasks) or an "
            "archive's elite "
            f"(mapelites on qd/ tasks); {task!r} has neither, render shows its best policy."
        )
    if family is None:
        if many:
            result = "archive.npz" if task.startswith("qd/") else "front.csv"
            if _renders_one(task) and chosen:
                return _render_one(run_dir, config, episodes, seed, out, member, cell, descriptor)
            hint = ""
            if _renders_one(task):
                option = "--cell I (or --descriptor)" if task.startswith("qd/") else "--member I"
                hint = f" (render one with {option})"
            where = f"its {result} in the run folder holds them"
            if config.seeds > 1 or config.sweep:  # a file per replica, in a folder of its own
                found = sorted(run_dir.glob(f"*/{result}"), key=lambda p: p.parent.name)
                named = ", ".join(str(p) for p in found[:3]) + ", ..." * (len(found) > 3)
                named = named or str(run_dir / "seed=S,..." / result)
                where = f"its replicas' {result} files, each in its own folder, hold them ({named})"
            return (
                f"nothing to render: render shows one policy, and a {task!r} run's result is "
                f"many; {where}{hint}."
            )
        return f"nothing to render: {task!r} is a black-box function, not an environment."
    if family.drawing is None:
        host = "" if family.steps_in_jax else ", its environments stepped on the host"
        return f"nothing to render: the family of {task!r} ({family.pattern}{host}) draws none."
    out = _out_file(run_dir, out, family.drawing, f"the family of {task!r}")
    result = run_episodes(run_dir, episodes, seed)
    frames = _draw(family.draw, result.env, result.trajectories, out)
    lines = [f"wrote {out} ({frames} frames)"]
    if result.replica is not None:
        which = ", ".join(f"{k} {v}" for k, v in result.replica.items())
        lines[0] += f" of {which}, the best of the run's last generation"
    for e, ret in enumerate(result.returns):
        lines.append(f"episode {e + 1}: return {ret!r}")
    if result.evaluation is None:
        line = f"return {float(np.mean(result.returns))!r} (mean over {episodes} episode(s))"
    else:
        line = f"return {result.evaluation!r} (mean over {episodes} episode(s), as the evaluation)"
    if result.reported is not None:
        line += f"; the run reported {result.reported!r} at generation {result.generation}"
    lines.append(line)
    return "\n".join(lines)


def _out_file(run_dir: Path, out, drawing: str, who: str) -> Path:
    """The file to draw into (``None``: ``RUN/render.<drawing>``), its folder created,
    checked before any episode runs: a ``ValueError`` for another extension, a
    :class:`RunError` for a folder that cannot be created or written."""
    if out is None:
        return run_dir / FILENAME.format(drawing)
    out = Path(out)
    if out.suffix.lower() != f".{drawing}":
        raise ValueError(
            f"--out {str(out)!r}: {who} draws a .{drawing} file; give a path ending in .{drawing}."
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"Cannot create the folder of --out {str(out)!r}: {_why(err)}.") from None
    if out.is_dir() or not os.access(out.parent, os.W_OK | os.X_OK):
        why = "it is a folder" if out.is_dir() else f"{str(out.parent)!r} is not writable"
        raise RunError(f"Cannot write --out {str(out)!r}: {why}; choose another path.")
    return out


def _why(err: OSError) -> str:
    return f"{err.strerror or err}" + (f" ({err.filename!r})" if err.filename else "")


def _draw(draw, env, trajectories, out: Path) -> int:
    """``draw(env, trajectories, out)``, a failed write a one-line :class:`RunError`."""
    try:
        return draw(env, trajectories, out)
    except OSError as err:
        raise RunError(f"Cannot write {str(out)!r}: {_why(err)}; choose another --out.") from None


# --- one of many: a front's member, an archive's elite ------------------------------------


def _renders_one(task: str) -> bool:
    """Whether ``task``'s front members or elites are policies: a brax task's."""
    from evorl_pop.tasks.mo_brax import MO_BRAX, PREFIX
    from evorl_pop.tasks.qd import QD_TASKS

    if task.startswith(PREFIX):
        return task[len(PREFIX) :] in MO_BRAX
    return task in QD_TASKS and issubclass(QD_TASKS[task], ControlTask)


def _front_indices(run_dir: Path) -> np.ndarray:
    """``front.csv``'s ``index`` column."""
    path = run_dir / "front.csv"
    if not path.exists():
        raise CheckpointError(f"{path} is missing: the run wrote no front yet.")
    with open(path, newline="") as f:
        return np.asarray([int(row["index"]) for row in csv.DictReader(f)], np.int64)


def _valid(what: str, values: np.ndarray) -> str:
    """``values`` (sorted integers) as ranges: ``0..11`` or ``0..3, 7, 9..12``."""
    if values.size == 0:
        return f"the run has no {what}"
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    parts = [
        f"{run[0]}..{run[-1]}" if run.size > 1 else f"{run[0]}" for run in np.split(values, breaks)
    ]
    return f"valid: {', '.join(parts)}"


def _choose(run_dir: Path, task: str, member, cell, descriptor) -> tuple[str, int, dict]:
    """``(label, index, archive)``: the member or cell asked for, checked against the
    run's ``front.csv`` or ``archive.npz`` (``archive``: its arrays, for a cell)."""
    if task.startswith("mo/"):
        if member is None:
            raise ValueError(f"a {task!r} run's result is a front: choose one with --member I.")
        indices = _front_indices(run_dir)
        if member not in indices:
            raise ValueError(
                f"--member {member}: front.csv has no such member ({_valid('front', indices)})."
            )
        return f"front member {member}", member, {}
    if member is not None or (cell is not None and descriptor is not None):
        raise ValueError(
            f"a {task!r} run's result is an archive: choose --cell I or --descriptor d1,d2."
        )
    path = run_dir / "archive.npz"
    if not path.exists():
        raise CheckpointError(f"{path} is missing: the run wrote no archive yet.")
    with np.load(path) as data:
        archive = {name: data[name] for name in data.files}
    filled = np.flatnonzero(archive["filled"])
    if descriptor is not None:
        size = archive["centroids"].shape[1]
        if len(descriptor) != size:
            raise ValueError(
                f"--descriptor: {task!r} has {size} descriptor values, got {len(descriptor)}."
            )
        if filled.size == 0:
            raise ValueError("--descriptor: the archive has no elite.")
        distance = np.linalg.norm(archive["centroids"][filled] - np.asarray(descriptor), axis=1)
        cell = int(filled[np.argmin(distance)])
    elif cell not in filled:
        cells = archive["filled"].size
        state = "empty" if 0 <= cell < cells else f"not a cell of 0..{cells - 1}"
        raise ValueError(
            f"--cell {cell} is {state}: archive.npz's filled cells, {_valid('elite', filled)}."
        )
    return f"cell {cell}", cell, archive


def _render_one(run_dir: Path, config, episodes, seed, out, member, cell, descriptor) -> str:
    """Draws the episodes of a front's member or an archive's elite; returns what to print."""
    task_name = config.algorithm_config.task
    out = _out_file(run_dir, out, "html", f"a {task_name!r} run's render")
    label, index, archive = _choose(run_dir, task_name, member, cell, descriptor)
    ckpt = restore.load_checkpoint(run_dir)
    config = dataclasses.replace(config, devices=1)
    algorithm, _, template, _, _ = shell.build(config)
    if isinstance(algorithm, Replicas):
        raise ValueError(
            "a run of replicas holds a front or archive per replica (seed=S/): "
            "render one of a single run."
        )
    task = algorithm.task
    if archive:
        solution = jnp.asarray(archive["genotypes"][index])
        params = task.policy_params(solution, None)
    else:
        state = restore.restore_state(template, ckpt)
        s = state.strategy_state
        if int(np.asarray(s.rank)[index]) != 0:
            raise CheckpointError(f"{label} is not on the checkpoint's front: front.csv is stale.")
        solution = jnp.asarray(s.population)[index]
        params = task.params(solution)
    seed = 0 if seed is None else seed
    keys = jax.random.split(jax.random.key(seed), episodes)
    if archive:  # a QD task scores a candidate key by its single episode's: split(key, 1)[0]
        episode_keys = [jax.random.split(k, 1)[0] for k in keys]
    else:
        episode_keys = list(keys)
    length = rollout_lib.step_limit(task.env, task.episode_length)
    runs = [_trajectory(task.env, task.policy, params, None, length, k) for k in episode_keys]
    trajectories = [trajectory for trajectory, _ in runs]
    frames = _draw(BraxFamily().draw, task.env, trajectories, out)
    lines = [f"wrote {out} ({frames} frames): {label} of {task_name}, key {seed}"]
    if archive:
        evaluate = jax.jit(task.evaluate_descriptor)
        for e, (_, ret) in enumerate(runs):
            score, _, desc = evaluate(solution, keys[e], ())
            lines.append(
                f"episode {e + 1}: return {ret!r} (the task's evaluation: {float(score)!r}), "
                f"descriptor {np.asarray(desc).tolist()}"
            )
        lines.append(
            f"archive.npz: fitness {float(archive['fitness'][index])!r}, descriptor "
            f"{np.asarray(archive['descriptors'][index]).tolist()} (the run's own episode)"
        )
        return "\n".join(lines)
    names = ", ".join(task.objective_names)
    drawn = np.stack([_objectives(task, trajectory) for trajectory in trajectories])
    for e, values in enumerate(drawn):
        lines.append(f"episode {e + 1}: ({names}) = {values.tolist()}")
    evaluation = jax.jit(lambda x, k: jax.vmap(task.episode, (None, 0))(task.params(x), k)[0])
    expected = np.asarray(evaluation(solution, keys)).mean(0)
    lines.append(
        f"mean over {episodes} episode(s): {drawn.mean(0).tolist()} (the task's evaluation: "
        f"{expected.tolist()}); front.csv: {_front_row(run_dir, index)} (the run's own episodes)"
    )
    return "\n".join(lines)


def _objectives(task, trajectory: Trajectory) -> np.ndarray:
    """A multi-objective brax task's objectives of a drawn episode: its terms of each
    step's state, summed in float32 as the task sums them."""
    terms = jax.vmap(task.terms)(trajectory.states.inner)
    return np.asarray(jnp.sum(terms, axis=0, dtype=jnp.float32))


def _front_row(run_dir: Path, index: int) -> list[float]:
    """The objectives ``front.csv`` holds for the member ``index``."""
    with open(run_dir / "front.csv", newline="") as f:
        for row in csv.DictReader(f):
            if int(row["index"]) == index:
                return [float(v) for k, v in row.items() if k[0] == "f" and k[1:].isdigit()]
    raise CheckpointError(f"front.csv has no member {index}.")
