"""Rollouts: every episode of every task and learner runs through this module.

One :func:`rollout` serves every caller (ES tasks, the hybrid algorithms'
transition-collecting episodes, evaluation): one reset per episode instead of
an auto-reset computed at every step (about twice as fast on gymnax), a mask
after ``done``, and an early exit: scanned segments of steps under a
``lax.while_loop`` that stops once every episode of the batch has ended.
A population's episodes (ES tasks) go through :func:`rollout_queue` instead:
fewer lanes than episodes, each lane taking the next pending episode as its
own ends, so a slice costs about the steps its episodes actually take rather
than its longest episode for every lane. Running observation normalisation
(:class:`~evorl_pop.tasks.obs_norm.ObsNorm`) sums its statistics over every episode of a population.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from evorl_pop.core.interfaces import Env
from evorl_pop.tasks.obs_norm import ObsMoments, ObsNorm

#: A policy: ``(params, observation) -> action``.
PolicyFn = Callable[[Any, jax.Array], jax.Array]

# --- rollouts ------------------------------------------------------------------

EXIT_CHECK_STEPS = 25  # steps scanned between two "has every episode ended?" checks
QUEUE_CHECK_STEPS = 4  # steps scanned between two refills of the queue's lanes
QUEUE_SHRINK = 4  # the queue's last episodes run on 1/4 of its lanes, then on one
#: Lanes of the queued rollout on a CPU. A CPU's cost per step is a fixed part
#: plus a part proportional to the lanes stepped, so a narrow batch that stays
#: busy beats a wide one that keeps stepping ended episodes: a lane-step costs a
#: little more, and far fewer lane-steps are taken when episode lengths vary
#: (docs/benchmarks/bench-brax.md).
CPU_LANES = 16


@flax.struct.dataclass
class Transition:
    """One environment step (leaves may carry leading batch axes)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array  # float32
    next_obs: jax.Array
    terminal: jax.Array  # float32: 1.0 when the next state ends the episode for good


@flax.struct.dataclass
class Episode:
    """One episode: its return, the steps it took, and what was asked for besides.

    ``moments`` is ``None`` unless observations were normalised;
    ``transitions`` and ``valid`` are ``None`` unless transitions were collected.
    """

    episode_return: jax.Array  # float32
    steps: jax.Array  # int32: steps taken before the episode ended
    moments: ObsMoments | None = None  # raw observation sums of those steps
    transitions: Transition | None = None  # leaves shape=(episode_length, ...)
    valid: jax.Array | None = None  # bool, shape=(episode_length,): step taken before the end


def add_exploration_noise(env: Env, action: jax.Array, key: jax.Array, noise_std) -> jax.Array:
    """Gaussian action noise, ``noise_std`` in units of half the action range, clipped."""
    low = jnp.asarray(env.spec.action_low)
    high = jnp.asarray(env.spec.action_high)
    noise = noise_std * 0.5 * (high - low) * jax.random.normal(key, action.shape)
    return jnp.clip(action + noise, low, high)


#: Jitted steps and resets, by environment and policy (see :func:`compiled_step`).
_COMPILED: dict[tuple, tuple] = {}


def compiled_step(
    env: Env,
    policy,
    episode_length: int,
    track: bool,
    noisy: bool,
    collect: bool,
    sample: bool = False,
):
    """``(step, start)``: an episode's masked step and its start, jitted and kept.

    A rollout runs its step in several loops (a work queue's widths, the
    evaluation of the mean), each traced afresh; jitted and kept per
    environment and policy, the step's Python (the policy, the simulator) is
    traced once per signature and its jaxpr reused, whatever the width.

    ``step(params, obs_norm, noise_std, carry, (t, key)) -> (carry, out)``:
    ``carry`` is ``(obs, state, return, steps, alive, moments)``; ``out`` is
    ``(transition, alive)`` when collecting, else ``None``.
    ``start(key, num_keys) -> (obs, state, step_keys)``: the key schedule of
    every rollout, so that an episode is the same whichever rollout runs it.
    """
    cache_key = (id(env), id(policy), episode_length, track, noisy, collect, sample)
    if cache_key in _COMPILED:
        return _COMPILED[cache_key][2:]

    def step(params, obs_norm, noise_std, carry, xs):
        obs, state, ret, steps, alive, moments = carry
        t, step_key = xs
        alive = alive & (t < episode_length)
        if track:
            seen = jnp.where(alive, obs, 0.0)
            moments = ObsMoments(
                moments.count + alive, moments.total + seen, moments.total_sq + seen**2
            )
            obs_in = obs_norm.normalize(obs)
        else:
            obs_in = obs
        env_key = step_key
        if sample:
            env_key, action_key = jax.random.split(step_key)
            action = policy(params, obs_in, action_key)
        else:
            action = policy(params, obs_in)
        if noisy:
            env_key, noise_key = jax.random.split(step_key)
            action = add_exploration_noise(env, action, noise_key, noise_std)
        next_obs, state, reward, done = env.step(env_key, state, action)
        ret = ret + jnp.where(alive, reward, 0.0)
        out = None
        if collect:
            # Reaching the time limit is a truncation: the next state still has a value.
            terminal = done & (t + 1 < env.spec.max_steps)
            transition = Transition(
                obs=obs,
                action=jnp.reshape(action, (env.spec.action_dim,)).astype(jnp.float32),
                reward=reward,
                next_obs=next_obs,
                terminal=terminal.astype(jnp.float32),
            )
            out = (transition, alive)
        return (next_obs, state, ret, steps + alive, alive & ~done, moments), out

    def start(key, num_keys):
        key, reset_key = jax.random.split(key)
        obs, state = env.reset(reset_key)
        return obs, state, jax.random.split(key, num_keys)

    if len(_COMPILED) > 256:  # tasks built and dropped, e.g. in a long test session
        _COMPILED.clear()
    entry = (env, policy, jax.jit(step), jax.jit(start, static_argnums=1))
    _COMPILED[cache_key] = entry
    return entry[2:]


def step_limit(env: Env, episode_length: int | None) -> int:
    """``episode_length``, or the environment's limit; ValueError below 1."""
    length = env.spec.max_steps if episode_length is None else int(episode_length)
    if length < 1:
        raise ValueError(f"episode_length must be at least 1, got {length}.")
    return length


def rollout(
    env: Env,
    policy: PolicyFn,
    params: Any,
    key: jax.Array,
    obs_norm: ObsNorm | None = None,
    episode_length: int | None = None,
    noise_std: float | jax.Array | None = None,
    collect: bool = False,
    check_every: int = EXIT_CHECK_STEPS,
    sample: bool = False,
) -> Episode:
    """Runs one episode of ``policy``, stopping once it has ended.

    The steps run in scanned segments of about ``check_every`` steps under a
    ``lax.while_loop`` that stops after the segment in which the episode ended
    (under ``vmap``: in which every episode of the batch had ended). Steps after
    the end add nothing to the return, the step count or the observation
    moments, even if the environment returns NaN there.

    Args:
      env: an :class:`Env`.
      policy: ``(params, obs) -> action``.
      params: the policy parameters.
      key: PRNG key for the reset, the environment and the action noise.
      obs_norm: when given, observations are normalised before the policy
        sees them, and raw observation moments are returned.
      episode_length: the episode is truncated after this many steps (default:
        the environment's limit).
      noise_std: when given (continuous actions), Gaussian exploration noise
        of this std in units of half the action range; each step's key is then
        split between the noise and the environment.
      collect: also return every step's :class:`Transition` and ``valid`` mask.
      check_every: steps between two checks for the end of the episode.
      sample: ``policy`` draws its actions, ``policy(params, obs, key) -> action``
        (a learner's stochastic policy); each step's key is then split between
        the draw and the environment. Not with ``noise_std``.

    Returns:
      An :class:`Episode`.
    """
    if sample and noise_std is not None:
        raise ValueError("rollout samples the policy or adds noise_std, not both: drop one.")
    episode_length = step_limit(env, episode_length)
    num_segments = -(-episode_length // max(1, min(check_every, episode_length)))
    segment = -(-episode_length // num_segments)  # segments of equal length covering episode_length
    # split(key, n) keys are a prefix of split(key, m) for n <= m: padding the
    # last segment leaves the first episode_length keys as they are
    track = obs_norm is not None
    noisy = noise_std is not None
    step, begin = compiled_step(env, policy, episode_length, track, noisy, collect, sample)
    obs, state, step_keys = begin(key, num_segments * segment)
    # Re-made here: a jitted function's constant outputs carry no mesh inside
    # shard_map, and the step traced with them would not be the work queue's.
    obs, state = jax.tree.map(lambda x: jnp.where(True, x, x), (obs, state))
    step_keys = step_keys.reshape(num_segments, segment)
    # zeros derived from obs keep its sharding type (varying inside shard_map)
    zero = jnp.zeros_like(obs, dtype=jnp.float32)
    scalar = zero.reshape(-1)[0]
    moments = ObsMoments(scalar, zero, zero) if track else None

    def run_segment(i, carry):
        xs = (i * segment + jnp.arange(segment), step_keys[i])
        return jax.lax.scan(functools.partial(step, params, obs_norm, noise_std), carry, xs)

    count = jnp.zeros_like(scalar, jnp.int32)
    init = (obs, state, scalar, count, jnp.ones_like(scalar, bool), moments)
    buffers = None
    if collect:  # each segment's transitions go into buffers of the padded length
        _, example = jax.eval_shape(run_segment, 0, init)
        buffers = jax.tree.map(lambda x: jnp.zeros((num_segments, *x.shape), x.dtype), example)

    def cond(loop):
        i, carry, _ = loop
        return (i < num_segments) & carry[4]

    def body(loop):
        i, carry, buffers = loop
        carry, out = run_segment(i, carry)
        if collect:
            buffers = jax.tree.map(lambda b, x: b.at[i].set(x), buffers, out)
        return i + 1, carry, buffers

    loop = (jnp.int32(0), init, buffers)
    # A loop of one segment (short episodes) is no loop: around the step's own
    # loops (MJX's), XLA takes about twice as long to compile it.
    _, final, buffers = body(loop) if num_segments == 1 else jax.lax.while_loop(cond, body, loop)
    _, _, ret, steps, _, moments = final
    transitions = valid = None
    if collect:
        flat = jax.tree.map(lambda b: b.reshape(-1, *b.shape[2:])[:episode_length], buffers)
        transitions, valid = flat
    return Episode(ret, steps, moments, transitions, valid)


def default_lanes(num_episodes: int) -> int:
    """Lanes of :func:`rollout_queue` for ``num_episodes`` episodes.

    On a CPU, :data:`CPU_LANES` (at most ``num_episodes``); on an accelerator,
    whose cost per step hardly depends on the batch width, one lane per episode.

    Args:
      num_episodes: episodes to run.

    Returns:
      The number of lanes.
    """
    if jax.default_backend() == "cpu":
        return min(num_episodes, CPU_LANES)
    return num_episodes


def _select(mask, new, old):
    """``new`` where ``mask`` (one flag per lane), else ``old``, leaf by leaf."""
    return jax.tree.map(
        lambda a, b: jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b), new, old
    )


def rollout_queue(
    env: Env,
    policy: PolicyFn,
    params: Any,
    keys: jax.Array,
    obs_norm: ObsNorm | None = None,
    episode_length: int | None = None,
    lanes: int | None = None,
    check_every: int = QUEUE_CHECK_STEPS,
) -> Episode:
    """Runs one episode per key, ``lanes`` at a time, from a work queue.

    Each lane runs one episode; every ``check_every`` steps, the lanes whose
    episode has ended take the next pending ones (reset and parameters), so
    the steps computed are about the sum of the episodes' actual lengths
    plus one last episode's tail, instead of the longest episode times their
    number. Episode ``i`` is what ``rollout(env, policy, params[i], keys[i],
    obs_norm, episode_length)`` returns (its key drives its reset and steps),
    whichever lane runs it: the same steps and return, observation sums up to
    rounding (XLA may fuse them differently at another width). With
    ``lanes >= len(keys)``, or for an environment that never ends early
    (``env.spec.terminates`` false) unless ``lanes`` is given, it is that
    ``rollout`` vectorised over the episodes.

    Args:
      env: an :class:`Env`.
      policy: ``(params, obs) -> action``.
      params: policy parameters with a leading axis: one per episode.
      keys: PRNG keys, one per episode.
      obs_norm: normalise observations with it and return raw moments.
      episode_length: truncate each episode after this many steps (default: the
        environment's limit).
      lanes: episodes run at once (``None``: :func:`default_lanes`).
      check_every: steps between two refills.

    Returns:
      An :class:`Episode` whose leaves have a leading axis of ``len(keys)``
        (no transitions).
    """
    n = keys.shape[0]
    episode_length = step_limit(env, episode_length)
    if lanes is not None and lanes < 1:
        raise ValueError(f"lanes must be at least 1 (or None for the default), got {lanes}.")
    if lanes is None:
        lanes = default_lanes(n) if env.spec.terminates else n
    if lanes >= n:
        return jax.vmap(lambda p, k: rollout(env, policy, p, k, obs_norm, episode_length))(
            params, keys
        )

    step, begin = compiled_step(env, policy, episode_length, obs_norm is not None, False, False)
    first_obs, first_state, step_keys = jax.vmap(lambda k: begin(k, episode_length))(keys)

    def start(items):
        """Lanes at the start of episodes ``items`` (``n``: no episode left)."""
        i = jnp.minimum(items, n - 1)
        # zeros derived from obs keep its sharding type (varying inside shard_map)
        zero = jnp.zeros_like(first_obs[i], jnp.float32)
        scalar = zero.reshape(len(items), -1)[:, 0]
        moments = ObsMoments(scalar, zero, zero) if obs_norm is not None else None
        state = jax.tree.map(lambda x: x[i], first_state)
        carry = (first_obs[i], state, scalar, jnp.zeros_like(items), items < n, moments)
        return items, jnp.zeros_like(items), jax.tree.map(lambda x: x[i], params), carry

    def lane_step(p, carry, t, item):
        key = step_keys[jnp.minimum(item, n - 1), jnp.minimum(t, episode_length - 1)]
        return step(p, obs_norm, None, carry, (t, key))[0]

    def scan_step(lane, _):
        items, t, p, carry = lane
        return (items, t + 1, p, jax.vmap(lane_step)(p, carry, t, items)), None

    def body(loop):
        lane, results, pending = loop
        lane, _ = jax.lax.scan(scan_step, lane, None, length=check_every)
        items, t, _, (_, _, ret, steps, alive, moments) = lane
        ended = (items < n) & (~alive | (t >= episode_length))
        into = jnp.where(ended, items, n)  # n: dropped
        results = jax.tree.map(
            lambda r, x: r.at[into].set(x, mode="drop"), results, (ret, steps, moments)
        )
        following = jnp.minimum(pending + jnp.cumsum(ended) - 1, n)
        lane = jax.lax.cond(
            jnp.any(ended), lambda: _select(ended, start(following), lane), lambda: lane
        )
        return lane, results, pending + jnp.sum(ended)

    lane = start(jnp.arange(lanes))
    _, _, _, (_, _, ret, steps, _, moments) = lane
    results = jax.tree.map(lambda x: jnp.zeros((n, *x.shape[1:]), x.dtype), (ret, steps, moments))
    loop = (lane, results, jnp.int32(lanes))
    # Once the queue is empty, the last episodes move to fewer lanes (a
    # separate loop each, so the step compiles once per width): a long last
    # episode is not stepped alongside many ended ones.
    widths = sorted({lanes, max(1, lanes // QUEUE_SHRINK), 1}, reverse=True)
    for width, below in zip(widths, [*widths[1:], 0], strict=True):
        lane, results, pending = loop
        if width < len(lane[0]):  # the running lanes first, then idle ones
            keep = jnp.argsort(lane[0] >= n, stable=True)[:width]
            lane = jax.tree.map(lambda x, keep=keep: x[keep], lane)

        def cond(loop, below=below):
            lane, _, pending = loop
            running = lane[0] < n
            return jnp.any(running) & ((pending < n) | (jnp.sum(running) > below))

        loop = jax.lax.while_loop(cond, body, (lane, results, pending))
    return Episode(*loop[1])


@flax.struct.dataclass
class EpisodeStats:
    """What one evaluation produced: its episodes' mean return, their summed steps."""

    episode_return: jax.Array  # mean return over the evaluation's episodes
    steps: jax.Array  # int32: env steps taken before each episode ended, summed
    episodes: jax.Array  # int32: episodes run
    moments: ObsMoments | None  # raw observation sums (when normalising), for the normaliser


def population_episodes(
    env: Env,
    policy: PolicyFn,
    params: Any,
    keys: jax.Array,
    obs_norm: ObsNorm | None = None,
    episode_length: int | None = None,
    lanes: int | None = None,
) -> Episode:
    """The episodes of a population's candidates, all from one :func:`rollout_queue`.

    What ``jax.vmap`` of :func:`evaluate_episodes` over the candidates runs,
    traced once: the engine evaluates a device's slice with it directly.

    Args:
      env: an :class:`Env`.
      policy: ``(params, obs) -> action``.
      params: the candidates' policy parameters, leading with the candidates.
      keys: PRNG keys, shape ``(candidates, episodes)``: candidate ``c``'s episode
        ``j`` uses ``keys[c, j]``.
      obs_norm: one normaliser shared by every candidate (or ``None``).
      episode_length: truncate each episode after this many steps.
      lanes: episodes stepped at once (``None``: :func:`default_lanes`).

    Returns:
      An :class:`Episode` whose leaves lead with ``(candidates, episodes)``.
    """
    candidates, per = keys.shape[:2]
    params = jax.tree.map(lambda x: jnp.repeat(x, per, axis=0), params)
    out = rollout_queue(
        env,
        policy,
        params,
        keys.reshape(candidates * per, *keys.shape[2:]),
        obs_norm,
        episode_length,
        lanes,
    )
    return jax.tree.map(lambda x: x.reshape(candidates, per, *x.shape[1:]), out)


def _episodes_fn(env, policy, episode_length, lanes):
    """``(params, keys, obs_norm) -> Episode``: one episode per key of one policy.

    Under ``vmap`` (a population's candidates), the episodes of every
    candidate go through one :func:`rollout_queue` (:func:`population_episodes`).
    """

    def run(params, keys, obs_norm):
        many = jax.tree.map(lambda x: jnp.broadcast_to(x, (keys.shape[0], *x.shape)), params)
        return rollout_queue(env, policy, many, keys, obs_norm, episode_length, lanes)

    episodes = jax.custom_batching.custom_vmap(run)

    @episodes.def_vmap
    def _batched(axis_size, in_batched, params, keys, obs_norm):
        params_batched, keys_batched, norm_batched = in_batched
        if any(jax.tree.leaves(norm_batched)):  # a normaliser per candidate: no shared queue
            axes = jax.tree.map(lambda b: 0 if b else None, in_batched)
            out = jax.vmap(run, in_axes=tuple(axes))(params, keys, obs_norm)
            return out, jax.tree.map(lambda _: True, out)

        def batch(x, batched):
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        params = jax.tree.map(batch, params, params_batched)
        out = population_episodes(
            env, policy, params, batch(keys, keys_batched), obs_norm, episode_length, lanes
        )
        return out, jax.tree.map(lambda _: True, out)

    return episodes


def evaluate_episodes(
    env: Env,
    policy: PolicyFn,
    params: Any,
    key: jax.Array,
    num_episodes: int = 1,
    obs_norm: ObsNorm | None = None,
    episode_length: int | None = None,
    lanes: int | None = None,
) -> EpisodeStats:
    """Mean return of ``policy`` over ``num_episodes`` independent episodes.

    Under ``vmap`` over a population (as the engine evaluates a device's
    slice), the episodes of every candidate share one work queue
    (:func:`rollout_queue`): the slice's steps cost about the sum of the
    episodes' actual lengths. The results do not depend on it.

    Args:
      env: an :class:`Env`.
      policy: ``(params, obs) -> action``.
      params: the policy parameters.
      key: PRNG key; episode ``j`` uses ``split(key, num_episodes)[j]``.
      num_episodes: episodes to run.
      obs_norm: normalise observations with it and return raw moments.
      episode_length: truncate each episode after this many steps (default: the
        environment's limit).
      lanes: episodes stepped at once (``None``: :func:`default_lanes`).

    Returns:
      :class:`EpisodeStats`: the mean return, the steps and observation sums summed.
    """
    run = _episodes_fn(env, policy, episode_length, lanes)
    return episode_stats(run(params, jax.random.split(key, num_episodes), obs_norm))


def episode_stats(episodes: Episode) -> EpisodeStats:
    """The :class:`EpisodeStats` of episodes leading with one axis (``vmap`` it for more)."""
    return EpisodeStats(
        episode_return=episodes.episode_return.mean(),
        steps=episodes.steps.sum(),
        episodes=jnp.int32(episodes.steps.shape[0]),
        moments=jax.tree.map(lambda x: x.sum(0), episodes.moments),
    )


@flax.struct.dataclass
class StepResult:
    """What one step of a batch produced (leaves lead with the batch axis)."""

    next_obs: jax.Array  # the observation after the step, before any reset
    reward: jax.Array  # float32
    terminal: jax.Array  # float32: 1 when the episode ended before its time limit
    truncated: jax.Array  # float32: 1 when it ended at its time limit


def lane_keys(key: jax.Array, index: jax.Array) -> jax.Array:
    """One key per lane: ``fold_in(key, i)`` for each global lane index ``i``."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
