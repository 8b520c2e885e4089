"""Environments: a small protocol, gymnax behind it, and fast masked rollouts.

An environment here is any object with

* ``spec``: an :class:`EnvSpec` (observation shape, action space, episode length),
* ``reset(key) -> (obs, state)``,
* ``step(key, state, action) -> (obs, state, reward, done)`` without auto-reset.

One :func:`rollout` serves every caller (ES tasks, the hybrid algorithms'
transition-collecting episodes, evaluation): one reset per episode instead of
an auto-reset computed at every step (about twice as fast on gymnax), a mask
after ``done``, and an early exit: scanned chunks of steps under a
``lax.while_loop`` that stops once every episode of the batch has ended.
A population's episodes (ES tasks) go through :func:`rollout_queue` instead:
fewer lanes than episodes, each lane taking the next pending episode as its
own ends, so a slice costs about the steps its episodes actually take rather
than its longest episode for every lane.
:class:`GymnaxEnv` adapts the gymnax environments,
:class:`~evorl_pop.envs_brax.BraxEnv` the brax ones (``brax/hopper``, ...);
another simulator plugs in by implementing the same three members.
``done`` is sticky in the sense rollouts rely on: once an episode has ended
(termination or time limit, ``spec.max_steps``), later steps add nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import flax.struct
import gymnax
import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.registry import did_you_mean


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of an environment.

    Attributes:
      name: registry name, e.g. ``'CartPole-v1'``.
      obs_shape: shape of one observation.
      discrete: ``True`` for a discrete action space.
      action_dim: number of actions (discrete) or action vector length.
      action_low: lower bounds of continuous actions (``None`` if discrete).
      action_high: upper bounds of continuous actions (``None`` if discrete).
      max_steps: episode length limit.
      terminates: whether an episode can end before ``max_steps`` (a fall, a
        goal); rollouts of environments that never do skip the work queue of
        :func:`rollout_queue`, which has nothing to gain there.
    """

    name: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None
    max_steps: int
    terminates: bool = True

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))


class Env(Protocol):
    spec: EnvSpec

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array]: ...


#: gymnax environments whose episodes only end at their time limit.
FIXED_LENGTH_GYMNAX = frozenset({"Pendulum-v1"})


class GymnaxEnv:
    """A gymnax environment with its parameters bound, stepped without auto-reset.

    Args:
      name: a gymnax environment name.
      episode_length: steps after which the episode ends (``None``: the
        environment's own limit).
      **env_kwargs: passed to ``gymnax.make``.
    """

    def __init__(self, name: str, episode_length: int | None = None, **env_kwargs):
        self.env, self.params = gymnax.make(name, **env_kwargs)
        if episode_length is not None:
            if episode_length < 1:
                raise ValueError(f"episode_length must be at least 1, got {episode_length}.")
            # gymnax environments end an episode at params.max_steps_in_episode
            # (a float in some of them: keep its type)
            limit = np.asarray(self.params.max_steps_in_episode).dtype.type(episode_length)
            self.params = self.params.replace(max_steps_in_episode=limit)
        space = self.env.action_space(self.params)
        discrete = hasattr(space, "n")
        if discrete:
            action_dim, low, high = int(space.n), None, None
        else:
            shape = tuple(space.shape) or (1,)
            action_dim = int(np.prod(shape))
            low = tuple(np.broadcast_to(np.asarray(space.low, np.float32), shape).ravel().tolist())
            high = tuple(
                np.broadcast_to(np.asarray(space.high, np.float32), shape).ravel().tolist()
            )
        self.spec = EnvSpec(
            name=name,
            obs_shape=tuple(self.env.observation_space(self.params).shape),
            discrete=discrete,
            action_dim=action_dim,
            action_low=low,
            action_high=high,
            max_steps=int(self.params.max_steps_in_episode),
            terminates=name not in FIXED_LENGTH_GYMNAX,
        )
        self._action_shape = tuple(space.shape)

    def reset(self, key):
        return self.env.reset_env(key, self.params)

    def step(self, key, state, action):
        if not self.spec.discrete:
            action = jnp.reshape(action, self._action_shape)
        obs, state, reward, done, _ = self.env.step_env(key, state, action, self.params)
        # step_env reports natural ends only; the time limit is gymnax's is_truncated
        done = done | self.env.is_truncated(state, self.params)
        return obs, state, reward.astype(jnp.float32), done


BRAX_PREFIX = "brax/"

#: brax environments offered as tasks (``brax/<name>``).
BRAX_ENVS = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_double_pendulum",
    "inverted_pendulum",
    "pusher",
    "reacher",
    "walker2d",
)

#: gymnax environments left out of :data:`ENV_FACTORIES`, with the reason.
UNLISTED_GYMNAX = {
    "MNISTBandit-bsuite": "downloads the MNIST data set when it is built",
}


def _brax_env(name: str, **kwargs):
    from evorl_pop.envs_brax import BraxEnv  # brax is optional: imported on first use

    # None means the default, as for gymnax environments
    return BraxEnv(name, **{k: v for k, v in kwargs.items() if v is not None})


ENV_FACTORIES: dict[str, Callable[..., Env]] = {
    **{
        name: (lambda name=name, **kw: GymnaxEnv(name, **kw))
        for name in gymnax.registered_envs
        if name not in UNLISTED_GYMNAX
    },
    **{
        name: (lambda name=name, **kw: _brax_env(name.removeprefix(BRAX_PREFIX), **kw))
        for name in (BRAX_PREFIX + env for env in BRAX_ENVS)
    },
}


def make_env(name: str, **env_kwargs) -> Env:
    """Builds an environment by registry name.

    Args:
      name: a key of :data:`ENV_FACTORIES`: a gymnax environment (e.g.
        ``'CartPole-v1'``, ``'Pendulum-v1'``, ``'Breakout-MinAtar'``) or a
        brax one (``'brax/hopper'``, ``'brax/halfcheetah'``, ...).
      **env_kwargs: passed to the environment's constructor; every
        environment takes ``episode_length`` (``None``: its own limit, 1000
        for brax), brax ones also ``backend`` (``'spring'``, ``'positional'``,
        ``'generalized'``, ``'mjx'``).

    Returns:
      An :class:`Env`.

    Raises:
      ValueError: for an unknown name, listing the valid ones.
    """
    if name in UNLISTED_GYMNAX:
        raise ValueError(f"{name!r} is not offered: it {UNLISTED_GYMNAX[name]}.")
    if name not in ENV_FACTORIES:
        hint = did_you_mean(name, ENV_FACTORIES, 3)
        raise ValueError(
            f"Unknown environment {name!r}.{hint} Valid environments: "
            f"{', '.join(sorted(ENV_FACTORIES))}."
        )
    return ENV_FACTORIES[name](**env_kwargs)


# --- running observation normalisation -----------------------------------------


@flax.struct.dataclass
class ObsNorm:
    """Running mean / variance of observations (Chan et al. parallel merge)."""

    count: jax.Array  # shape=(), float32: observations seen
    mean: jax.Array  # shape=obs_shape
    var: jax.Array  # shape=obs_shape

    @classmethod
    def create(cls, obs_shape) -> ObsNorm:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.ones(obs_shape))

    def normalize(self, obs, clip: float = 5.0):
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)

    def merge(self, moments: ObsMoments) -> ObsNorm:
        """Folds in a batch's moments (sums that may come from a ``psum``)."""
        n = moments.count
        safe_n = jnp.maximum(n, 1.0)
        batch_mean = moments.total / safe_n
        batch_var = jnp.maximum(moments.total_sq / safe_n - batch_mean**2, 0.0)
        total = self.count + n
        w = n / jnp.maximum(total, 1.0)
        delta = batch_mean - self.mean
        mean = self.mean + w * delta
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * w
        var = jnp.where(total > 0, m2 / jnp.maximum(total, 1.0), self.var)
        keep = n > 0
        return ObsNorm(
            count=total,
            mean=jnp.where(keep, mean, self.mean),
            var=jnp.where(keep, var, self.var),
        )


@flax.struct.dataclass
class ObsMoments:
    """Sums over observations; add them (``psum``) and merge into :class:`ObsNorm`."""

    count: jax.Array
    total: jax.Array
    total_sq: jax.Array

    @classmethod
    def zeros(cls, obs_shape) -> ObsMoments:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape), jnp.zeros(obs_shape))


def random_observations(env: Env, key: jax.Array, count: int, every: int = 8) -> jax.Array:
    """Observations of uniformly random play: one every ``every`` steps, ``count`` in all.

    An episode that ends is followed by a new one, so the observations span
    the states random play meets (for example the reference batch of virtual
    batch normalisation, :func:`evorl_pop.networks.fold_virtual_batch_norm`).

    Args:
      env: an :class:`Env`.
      key: PRNG key of the resets, actions and steps.
      count: observations to return.
      every: steps between two kept observations.

    Returns:
      An array of shape ``(count, *env.spec.obs_shape)``.
    """
    spec = env.spec

    def random_action(key):
        if spec.discrete:
            return jax.random.randint(key, (), 0, spec.action_dim)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        return jax.random.uniform(key, (spec.action_dim,), minval=low, maxval=high)

    def step(carry, key):
        k_action, k_step, k_reset = jax.random.split(key, 3)
        obs, state, _, done = env.step(k_step, carry[1], random_action(k_action))
        fresh = env.reset(k_reset)
        return jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, (obs, state)), obs

    key, reset_key = jax.random.split(key)
    _, seen = jax.lax.scan(step, env.reset(reset_key), jax.random.split(key, count * every))
    return seen[every - 1 :: every]


# --- rollouts ------------------------------------------------------------------

EXIT_CHECK_STEPS = 25  # steps scanned between two "has every episode ended?" checks
QUEUE_CHECK_STEPS = 4  # steps scanned between two refills of the queue's lanes
QUEUE_SHRINK = 4  # the queue's last episodes run on 1/4 of its lanes, then on one
#: Lanes of the queued rollout on a CPU. A CPU's cost per step is a fixed part
#: (about 0.1 ms for brax hopper, whatever the width) plus a part proportional
#: to the lanes stepped, so a narrow batch that stays busy beats a wide one
#: that keeps stepping ended episodes: 16 lanes cost about 1.5x per lane-step
#: what 64 cost, and far fewer lane-steps when episode lengths vary.
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
    transitions: Transition | None = None  # leaves shape=(num_steps, ...)
    valid: jax.Array | None = None  # bool, shape=(num_steps,): step taken before the end


def add_exploration_noise(env: Env, action: jax.Array, key: jax.Array, noise_std) -> jax.Array:
    """Gaussian action noise, ``noise_std`` in units of half the action range, clipped."""
    low = jnp.asarray(env.spec.action_low)
    high = jnp.asarray(env.spec.action_high)
    noise = noise_std * 0.5 * (high - low) * jax.random.normal(key, action.shape)
    return jnp.clip(action + noise, low, high)


def _step_fn(env, policy, obs_norm, num_steps, noise_std, collect):
    """``step(params, carry, (t, key)) -> (carry, out)``: one masked step of an episode.

    ``carry`` is ``(obs, state, return, steps, alive, moments)``; ``out`` is
    ``(transition, alive)`` when collecting, else ``None``.
    """
    track = obs_norm is not None

    def step(params, carry, xs):
        obs, state, ret, steps, alive, moments = carry
        t, step_key = xs
        alive = alive & (t < num_steps)
        if track:
            seen = jnp.where(alive, obs, 0.0)
            moments = ObsMoments(
                moments.count + alive, moments.total + seen, moments.total_sq + seen**2
            )
            action = policy(params, obs_norm.normalize(obs))
        else:
            action = policy(params, obs)
        env_key = step_key
        if noise_std is not None:
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

    return step


def _episode_length(env: Env, num_steps: int | None) -> int:
    """``num_steps``, or the environment's limit; ValueError below 1."""
    num_steps = env.spec.max_steps if num_steps is None else int(num_steps)
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}.")
    return num_steps


def _start_episode(env: Env, key: jax.Array, num_keys: int):
    """``(obs, state, step_keys)``: the key schedule of every rollout, so that an
    episode is the same whichever rollout runs it."""
    key, reset_key = jax.random.split(key)
    obs, state = env.reset(reset_key)
    return obs, state, jax.random.split(key, num_keys)


def rollout(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    obs_norm: ObsNorm | None = None,
    num_steps: int | None = None,
    noise_std: float | jax.Array | None = None,
    collect: bool = False,
    check_every: int = EXIT_CHECK_STEPS,
) -> Episode:
    """Runs one episode of ``policy``, stopping once it has ended.

    The steps run in scanned chunks of about ``check_every`` steps under a
    ``lax.while_loop`` that stops after the chunk in which the episode ended
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
      num_steps: the episode is truncated after this many steps (default:
        the environment's limit).
      noise_std: when given (continuous actions), Gaussian exploration noise
        of this std in units of half the action range; each step's key is then
        split between the noise and the environment.
      collect: also return every step's :class:`Transition` and ``valid`` mask.
      check_every: steps between two checks for the end of the episode.

    Returns:
      An :class:`Episode`.
    """
    num_steps = _episode_length(env, num_steps)
    num_chunks = -(-num_steps // max(1, min(check_every, num_steps)))
    chunk = -(-num_steps // num_chunks)  # chunks of equal length covering num_steps
    # split(key, n) keys are a prefix of split(key, m) for n <= m: padding the
    # last chunk leaves the first num_steps keys as they are
    obs, state, step_keys = _start_episode(env, key, num_chunks * chunk)
    step_keys = step_keys.reshape(num_chunks, chunk)
    # zeros derived from obs keep its sharding type (varying inside shard_map)
    zero = jnp.zeros_like(obs, dtype=jnp.float32)
    scalar = zero.reshape(-1)[0]
    moments = ObsMoments(scalar, zero, zero) if obs_norm is not None else None

    step = _step_fn(env, policy, obs_norm, num_steps, noise_std, collect)

    def run_chunk(i, carry):
        return jax.lax.scan(
            functools.partial(step, params), carry, (i * chunk + jnp.arange(chunk), step_keys[i])
        )

    count = jnp.zeros_like(scalar, jnp.int32)
    init = (obs, state, scalar, count, jnp.ones_like(scalar, bool), moments)
    buffers = None
    if collect:  # each chunk's transitions go into buffers of the padded length
        _, example = jax.eval_shape(run_chunk, 0, init)
        buffers = jax.tree.map(lambda x: jnp.zeros((num_chunks, *x.shape), x.dtype), example)

    def cond(loop):
        i, carry, _ = loop
        return (i < num_chunks) & carry[4]

    def body(loop):
        i, carry, buffers = loop
        carry, out = run_chunk(i, carry)
        if collect:
            buffers = jax.tree.map(lambda b, x: b.at[i].set(x), buffers, out)
        return i + 1, carry, buffers

    _, final, buffers = jax.lax.while_loop(cond, body, (jnp.int32(0), init, buffers))
    _, _, ret, steps, _, moments = final
    transitions = valid = None
    if collect:
        flat = jax.tree.map(lambda b: b.reshape(-1, *b.shape[2:])[:num_steps], buffers)
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
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    keys: jax.Array,
    obs_norm: ObsNorm | None = None,
    num_steps: int | None = None,
    lanes: int | None = None,
    check_every: int = QUEUE_CHECK_STEPS,
) -> Episode:
    """Runs one episode per key, ``lanes`` at a time, from a work queue.

    Each lane runs one episode; every ``check_every`` steps, the lanes whose
    episode has ended take the next pending ones (reset and parameters), so
    the steps computed are about the sum of the episodes' actual lengths
    plus one last episode's tail, instead of the longest episode times their
    number. Episode ``i`` is what ``rollout(env, policy, params[i], keys[i],
    obs_norm, num_steps)`` returns (its key drives its reset and steps),
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
      num_steps: truncate each episode after this many steps (default: the
        environment's limit).
      lanes: episodes run at once (``None``: :func:`default_lanes`).
      check_every: steps between two refills.

    Returns:
      An :class:`Episode` whose leaves have a leading axis of ``len(keys)``
      (no transitions).
    """
    n = keys.shape[0]
    num_steps = _episode_length(env, num_steps)
    if lanes is not None and lanes < 1:
        raise ValueError(f"lanes must be at least 1 (or None for the default), got {lanes}.")
    if lanes is None:
        lanes = default_lanes(n) if env.spec.terminates else n
    if lanes >= n:
        return jax.vmap(lambda p, k: rollout(env, policy, p, k, obs_norm, num_steps))(params, keys)

    first_obs, first_state, step_keys = jax.vmap(lambda k: _start_episode(env, k, num_steps))(keys)
    step = _step_fn(env, policy, obs_norm, num_steps, None, False)

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
        key = step_keys[jnp.minimum(item, n - 1), jnp.minimum(t, num_steps - 1)]
        return step(p, carry, (t, key))[0]

    def scan_step(lane, _):
        items, t, p, carry = lane
        return (items, t + 1, p, jax.vmap(lane_step)(p, carry, t, items)), None

    def body(loop):
        lane, results, pending = loop
        lane, _ = jax.lax.scan(scan_step, lane, None, length=check_every)
        items, t, _, (_, _, ret, steps, alive, moments) = lane
        ended = (items < n) & (~alive | (t >= num_steps))
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
    """What one evaluation produced (summed over its episodes)."""

    episode_return: jax.Array  # mean return over the evaluation's episodes
    steps: jax.Array  # int32: env steps taken before each episode ended, summed
    episodes: jax.Array  # int32: episodes run
    moments: ObsMoments | None  # raw observation sums (when normalising), for the normaliser


def _episodes_fn(env, policy, num_steps, lanes):
    """``(params, keys, obs_norm) -> Episode``: one episode per key of one policy.

    Under ``vmap`` (a population's candidates), the episodes of every
    candidate go through one :func:`rollout_queue`.
    """

    def run(params, keys, obs_norm):
        many = jax.tree.map(lambda x: jnp.broadcast_to(x, (keys.shape[0], *x.shape)), params)
        return rollout_queue(env, policy, many, keys, obs_norm, num_steps, lanes)

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

        per = keys.shape[-1]  # episodes per candidate
        keys = batch(keys, keys_batched).reshape(axis_size * per)
        params = jax.tree.map(
            lambda x, b: jnp.repeat(batch(x, b), per, axis=0), params, params_batched
        )
        out = rollout_queue(env, policy, params, keys, obs_norm, num_steps, lanes)
        out = jax.tree.map(lambda x: x.reshape(axis_size, per, *x.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return episodes


def evaluate_episodes(
    env: Env,
    policy: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    key: jax.Array,
    num_episodes: int = 1,
    obs_norm: ObsNorm | None = None,
    num_steps: int | None = None,
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
      num_steps: truncate each episode after this many steps (default: the
        environment's limit).
      lanes: episodes stepped at once (``None``: :func:`default_lanes`).

    Returns:
      :class:`EpisodeStats` summed over the episodes.
    """
    run = _episodes_fn(env, policy, num_steps, lanes)
    episodes = run(params, jax.random.split(key, num_episodes), obs_norm)
    return EpisodeStats(
        episode_return=episodes.episode_return.mean(),
        steps=episodes.steps.sum(),
        episodes=jnp.int32(num_episodes),
        moments=jax.tree.map(lambda x: x.sum(0), episodes.moments),
    )
