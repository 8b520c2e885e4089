"""Quality-diversity tasks: a score and a behaviour descriptor per candidate.

Each task here is a :class:`~evorl_pop.core.interfaces.Task` and a
:class:`~evorl_pop.core.interfaces.Describes`: ``evaluate_descriptor`` returns
``(score, info, descriptor)``, and the task states its descriptor's size and
bounds, the bounds of its genotype and the offset of its QD-score. Both are
maximised black-box problems, fast enough for tests:

* ``qd/arm``: a planar arm of ``num_dims`` joints (links of length ``1 / num_dims``);
  genotype ``x`` in ``[0, 1]^n``, the joint angles ``2 pi x - pi``; fitness
  ``-Var(x)`` (the variance of the normalised angles: straight arms are best),
  descriptor the end effector's ``(x, y)`` in ``[0, 1]^2``; QD offset ``0.25``
  (the variance of numbers in ``[0, 1]`` is at most ``1/4``).
* ``qd/rastrigin_proj``: ``-rastrigin(x)`` on ``[-5.12, 5.12]^n``, descriptor the
  means of the first and second half of ``x`` (a projection), in
  ``[-5.12, 5.12]^2``; QD offset ``40.36 * n`` (Rastrigin's largest value per
  coordinate on the box is about 40.35).

* ``qd/hopper_uni``, ``qd/walker2d_uni``, ``qd/halfcheetah_uni``, ``qd/ant_uni`` (brax,
  :class:`BraxFeetTask`): a policy network's flat weights (unbounded), fitness the
  episode's return, descriptor the proportion of the episode's steps on which each
  foot touches the ground (hopper one foot, walker2d and halfcheetah two, ant four),
  in ``[0, 1]``; QD offset QDax's reward offset per step (0.9, 1.413, 9.231 and 3.24)
  times the episode length.
* ``qd/ant_omni`` (brax, :class:`BraxOmniTask`): fitness the episode's return without
  its forward term (survival and control cost: the ant is not asked to go anywhere in
  particular), descriptor the torso's final ``(x, y)`` clipped to ``[-30, 30]^2``; QD
  offset 3.0 per step times the episode length.

A user's own task becomes a quality-diversity task by adding these attributes and
``evaluate_descriptor``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from evorl_pop.base import EvalInfo, did_you_mean, float_dtype
from evorl_pop.tasks.blackbox import rastrigin
from evorl_pop.tasks.brax_envs import (
    DEFAULT_BACKEND,
    DEFAULT_EPISODE_LENGTH,
    BraxEnv,
    BraxState,
)
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.rollout import Transition

#: The prefix of the quality-diversity tasks' names.
QD_PREFIX = "qd/"


def _no_info() -> EvalInfo:
    return EvalInfo(steps=jnp.int32(0), episodes=jnp.int32(0))


@dataclasses.dataclass(frozen=True)
class _QDTask:
    """What the black-box QD tasks share: a genotype box, no task state."""

    num_dims: int = 8
    maximize = True
    descriptor_size = 2

    def __post_init__(self):
        if self.num_dims < 2:
            raise ValueError(f"num_dims must be at least 2, got {self.num_dims}.")

    def init_solution(self, key):
        del key
        low, high = self.genotype_bounds
        return jnp.full((self.num_dims,), (low + high) / 2, float_dtype())

    def init_state(self):
        return ()

    def update_state(self, task_state, info_total):
        return task_state

    def evaluate(self, solution, key, task_state):
        score, info, _ = self.evaluate_descriptor(solution, key, task_state)
        return score, info


@dataclasses.dataclass(frozen=True)
class ArmTask(_QDTask):
    """A planar arm: reach every point with the straightest arm (see the module docstring)."""

    genotype_bounds = (0.0, 1.0)
    descriptor_bounds = ((0.0, 0.0), (1.0, 1.0))
    qd_offset = 0.25

    @property
    def name(self) -> str:
        return f"{QD_PREFIX}arm-{self.num_dims}d"

    def evaluate_descriptor(self, solution, key, task_state):
        del key, task_state
        x = jnp.clip(solution, 0.0, 1.0)
        angles = jnp.cumsum(2 * jnp.pi * x - jnp.pi)
        n = self.num_dims
        end = jnp.stack([jnp.sum(jnp.cos(angles)), jnp.sum(jnp.sin(angles))]) / (2 * n) + 0.5
        return -jnp.var(x), _no_info(), end


@dataclasses.dataclass(frozen=True)
class RastriginProjTask(_QDTask):
    """Rastrigin with the means of the two halves of the genotype as its descriptor."""

    genotype_bounds = (-5.12, 5.12)
    descriptor_bounds = ((-5.12, -5.12), (5.12, 5.12))

    @property
    def name(self) -> str:
        return f"{QD_PREFIX}rastrigin_proj-{self.num_dims}d"

    @property
    def qd_offset(self) -> float:
        return 40.36 * self.num_dims

    def evaluate_descriptor(self, solution, key, task_state):
        del key, task_state
        x = jnp.clip(solution, -5.12, 5.12)
        half = self.num_dims // 2
        descriptor = jnp.stack([jnp.mean(x[:half]), jnp.mean(x[half:])])
        return -rastrigin(x), _no_info(), descriptor


#: brax feet-contact tasks: the environment, its feet (link names; a name repeated
#: takes the links of that name in order: the ant's four lower legs are unnamed),
#: QDax's reward offset per step.
BRAX_FEET = {
    "hopper_uni": ("hopper", ("foot",), 0.9),
    "walker2d_uni": ("walker2d", ("foot", "foot_left"), 1.413),
    "halfcheetah_uni": ("halfcheetah", ("bfoot", "ffoot"), 9.231),
    "ant_uni": ("ant", ("", "", "", ""), 3.24),
}
#: brax final-position tasks: the environment, the box of its descriptor, QDax's
#: reward offset per step.
BRAX_OMNI = {
    "ant_omni": ("ant", ((-30.0, -30.0), (30.0, 30.0)), 3.0),
}


def link_indices(links: list[str], names) -> np.ndarray:
    """The index in ``links`` of each of ``names``; a repeated name takes its next link."""
    found = []
    for name in names:
        start = found[-1] + 1 if found and links[found[-1]] == name else 0
        found.append(links.index(name, start))
    return np.asarray(found, np.int32)


#: MuJoCo's geometry types that feet and ground are made of here.
PLANE, SPHERE, CAPSULE = 0, 2, 3


@dataclasses.dataclass(frozen=True, eq=False)
class FootGeoms:
    """The geometries of a brax system's feet that collide with a ground plane, and
    whether each foot touches the ground for given body positions.

    MuJoCo's plane-sphere and plane-capsule contacts (what ``brax.contact.get`` computes
    through MJX's collision of every pair) have the distance from the plane of the
    sphere's centre, or of each end of the capsule's segment, less the radius: this
    computes those distances for the feet's geometries alone, a few dot products per
    step instead of the whole system's collision.
    """

    feet: int
    foot: np.ndarray  # (G,) the foot each colliding geometry belongs to
    link: np.ndarray  # (G,) its link
    pos: np.ndarray  # (G, 3) its centre in its link's frame
    axis: np.ndarray  # (G, 3) its capsule's axis in its link's frame
    half: np.ndarray  # (G,) the half-length of its capsule's segment (0: a sphere)
    radius: np.ndarray  # (G,)
    normal: np.ndarray  # (P, 3) the ground planes' normals
    offset: np.ndarray  # (P,) their distances from the origin along the normal

    @classmethod
    def of(cls, sys, feet: np.ndarray) -> FootGeoms:
        """The colliding geometries of the links ``feet`` (indices into
        ``sys.link_names``) and the world's planes.

        Raises:
          ValueError: a foot with a colliding geometry other than a sphere or a capsule.
        """
        from brax import math

        kind = np.asarray(sys.geom_type)
        link = np.asarray(sys.geom_bodyid) - 1  # -1: the world
        contype, conaffinity = np.asarray(sys.geom_contype), np.asarray(sys.geom_conaffinity)
        planes = np.flatnonzero((kind == PLANE) & (link == -1))
        geoms, foot = [], []
        for i, f in enumerate(feet):
            for g in np.flatnonzero(link == f):
                if not any(
                    contype[g] & conaffinity[p] or contype[p] & conaffinity[g] for p in planes
                ):
                    continue
                if kind[g] not in (SPHERE, CAPSULE):
                    raise ValueError(
                        f"foot {sys.link_names[f]!r} has a geometry of MuJoCo type {kind[g]}: "
                        "feet contacts are computed for spheres and capsules on a plane."
                    )
                geoms.append(g)
                foot.append(i)
        geoms = np.asarray(geoms, np.int32)
        up = jnp.array([0.0, 0.0, 1.0])
        quat = jnp.asarray(sys.geom_quat)
        normal = np.asarray(jax.vmap(math.rotate, (None, 0))(up, quat[planes]))
        size = np.asarray(sys.geom_size)
        return cls(
            feet=len(feet),
            foot=np.asarray(foot, np.int32),
            link=link[geoms],
            pos=np.asarray(sys.geom_pos)[geoms],
            axis=np.asarray(jax.vmap(math.rotate, (None, 0))(up, quat[geoms])),
            half=np.where(kind[geoms] == CAPSULE, size[geoms, 1], 0.0),
            radius=size[geoms, 0],
            normal=normal,
            offset=np.einsum("pi,pi->p", np.asarray(sys.geom_pos)[planes], normal),
        )

    def touching(self, x) -> jax.Array:
        """``(feet,)`` float32: 1 where a foot touches a plane, for the links' transforms
        ``x`` (a brax pipeline state's ``x``)."""
        from brax import math

        rot = x.rot[self.link]
        centre = x.pos[self.link] + jax.vmap(math.rotate)(jnp.asarray(self.pos), rot)
        segment = jax.vmap(math.rotate)(jnp.asarray(self.axis), rot) * self.half[:, None]
        ends = jnp.stack([centre + segment, centre - segment], axis=1)  # (G, 2, 3)
        height = ends @ self.normal.T - self.offset  # (G, 2, P)
        dist = jnp.min(height, axis=(1, 2)) - self.radius
        on = jnp.zeros(self.feet, bool).at[self.foot].max(dist <= 0)
        return on.astype(jnp.float32)


class BraxQDTask(ControlTask):
    """A brax locomotion task with a behaviour descriptor, one episode per candidate.

    A subclass gives ``_feature(pipeline_state)``, a vector per step after it, and
    ``_describe(total, last, steps)``: the descriptor from the feature's sum over the
    episode's steps, its value after the last step and the step count.
    """

    genotype_bounds = None

    def evaluate_descriptor(self, solution, key, task_state):
        del task_state
        return self.episode(solution, key)

    def episode(self, solution, key, collect: bool = False):
        """The candidate's episode (the key schedule of ``ControlTask.evaluate``'s single
        episode): ``(return, EvalInfo, descriptor)``; with ``collect``, ``(return,
        EvalInfo, (descriptor, transitions, valid))``, each step's
        :class:`~evorl_pop.tasks.rollout.Transition` and whether it was taken before
        the episode ended (a learner's data, PGA-ME's)."""
        params = self.policy_params(solution, None)
        _, reset_key = jax.random.split(jax.random.split(key, 1)[0])
        obs, state = self.env.reset(reset_key)
        zero = jnp.zeros((), jnp.float32)
        total = jnp.zeros(self.descriptor_size, jnp.float32)
        last = self._feature(state.inner.pipeline_state)
        max_steps = self.spec.max_steps

        def body(carry, t):
            obs, state, ret, steps, total, last, alive = carry
            action = self.policy(params, obs)
            next_obs, state, reward, done = self.env.step(key, state, action)
            ret = ret + jnp.where(alive, reward, 0.0)
            feature = self._feature(state.inner.pipeline_state)
            total = total + jnp.where(alive, feature, 0.0)
            last = jnp.where(alive, feature, last)
            carry = (next_obs, state, ret, steps + alive, total, last, alive & ~done)
            if not collect:
                return carry, None
            # reaching the time limit is a truncation: the next state still has a value
            terminal = done & (t + 1 < max_steps)
            transition = Transition(
                obs=obs,
                action=jnp.reshape(action, (self.spec.action_dim,)).astype(jnp.float32),
                reward=jnp.asarray(reward, jnp.float32),
                next_obs=next_obs,
                terminal=terminal.astype(jnp.float32),
            )
            return carry, (transition, alive)

        alive = jnp.ones((), bool)
        carry = (obs, state, zero, jnp.zeros((), jnp.int32), total, last, alive)
        carry, out = jax.lax.scan(body, carry, jnp.arange(max_steps))
        _, _, ret, steps, total, last, _ = carry
        descriptor = self._describe(total, last, steps)
        info = EvalInfo(steps=steps, episodes=jnp.int32(1))
        return ret, info, (descriptor, *out) if collect else descriptor


class BraxFeetTask(BraxQDTask):
    """A brax locomotion task whose descriptor is each foot's contact proportion.

    Args:
      name: a key of :data:`BRAX_FEET` (``'walker2d_uni'``).
      **kwargs: :class:`~evorl_pop.tasks.control.ControlTask`'s (``hidden_sizes``,
        ``activation``, ``episode_length``, ``backend``); one episode per candidate.

    A foot touches the ground on a step when one of its geometries is at a distance of at
    most 0 from a ground plane after the step (:class:`FootGeoms`: the contacts
    ``brax.contact.get`` finds, computed for the feet alone); the descriptor is the mean
    over the episode's steps.
    """

    def __init__(self, name: str, **kwargs):
        env, feet, offset = BRAX_FEET[name]
        super().__init__(f"brax/{env}", episodes=1, **kwargs)
        sys = self.env.env.sys
        self.feet = link_indices(list(sys.link_names), feet)
        self.descriptor_size = len(feet)
        self.descriptor_bounds = ((0.0,) * len(feet), (1.0,) * len(feet))
        self.qd_offset = offset * self.spec.max_steps
        self.name = f"{QD_PREFIX}{name}"
        self._contacts = FootGeoms.of(sys, self.feet)

    def _feature(self, pipeline_state):
        """Whether each foot touches the ground (see :class:`FootGeoms`)."""
        return self._contacts.touching(pipeline_state.x)

    def _describe(self, total, last, steps):
        return total / jnp.maximum(steps, 1).astype(jnp.float32)


class NoForwardBraxEnv(BraxEnv):
    """A brax environment whose reward leaves out its forward term (brax's
    ``reward_forward`` metric of the step): survival and control cost only."""

    def step(self, key, state: BraxState, action):
        obs, new, reward, done = super().step(key, state, action)
        forward = jnp.where(state.done, 0.0, new.inner.metrics["reward_forward"])
        return obs, new, (reward - forward).astype(jnp.float32), done


class BraxOmniTask(BraxQDTask):
    """A brax locomotion task whose descriptor is the torso's final ``(x, y)`` position,
    clipped to a box, and whose reward has no forward term (:class:`NoForwardBraxEnv`).

    Args:
      name: a key of :data:`BRAX_OMNI` (``'ant_omni'``).
      hidden_sizes, activation: the policy MLP's.
      episode_length: steps per episode (``None``: 1000).
      backend: the physics backend (``None``: spring).
    """

    def __init__(
        self, name: str, hidden_sizes=(64, 64), activation="tanh", episode_length=None, backend=None
    ):
        env_name, (low, high), offset = BRAX_OMNI[name]
        env = NoForwardBraxEnv(
            env_name,
            backend=DEFAULT_BACKEND if backend is None else backend,
            episode_length=DEFAULT_EPISODE_LENGTH if episode_length is None else episode_length,
        )
        super().__init__(env, hidden_sizes, activation, episodes=1, episode_length=episode_length)
        self.low = np.asarray(low, np.float32)
        self.high = np.asarray(high, np.float32)
        self.descriptor_size = len(low)
        self.descriptor_bounds = (tuple(low), tuple(high))
        self.qd_offset = offset * self.spec.max_steps
        self.name = f"{QD_PREFIX}{name}"

    def _feature(self, pipeline_state):
        return pipeline_state.x.pos[0, :2].astype(jnp.float32)  # the torso, link 0

    def _describe(self, total, last, steps):
        return jnp.clip(last, self.low, self.high)


#: Every quality-diversity task by name.
QD_TASKS = {
    f"{QD_PREFIX}arm": ArmTask,
    f"{QD_PREFIX}rastrigin_proj": RastriginProjTask,
    **{f"{QD_PREFIX}{name}": BraxFeetTask for name in BRAX_FEET},
    **{f"{QD_PREFIX}{name}": BraxOmniTask for name in BRAX_OMNI},
}


def make_qd_task(name: str, num_dims: int = 8, **control):
    """The quality-diversity task ``name`` (one of :data:`QD_TASKS`).

    Args:
      name: ``'qd/arm'``, ``'qd/rastrigin_proj'``, ``'qd/hopper_uni'``, ``'qd/walker2d_uni'``,
        ``'qd/halfcheetah_uni'``, ``'qd/ant_uni'``, ``'qd/ant_omni'``.
      num_dims: the black-box tasks' genotype dimension.
      **control: the brax tasks' arguments (``hidden_sizes``,
        ``activation``, ``episode_length``, ``backend``); the others take none.

    Raises:
      ValueError: an unknown name (naming the valid ones), or fewer than 2 dimensions.
    """
    if name not in QD_TASKS:
        hint = did_you_mean(name, QD_TASKS)
        raise ValueError(f"Unknown QD task {name!r}.{hint} Valid: {', '.join(QD_TASKS)}.")
    if issubclass(QD_TASKS[name], BraxQDTask):
        return QD_TASKS[name](name[len(QD_PREFIX) :], **control)
    return QD_TASKS[name](num_dims=num_dims)
