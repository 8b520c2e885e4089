"""MuJoCo Playground's DM Control Suite behind the :class:`~evorl_pop.core.interfaces.Env`
protocol.

Every task of Playground's ``dm_control_suite`` registry that ships its model
files is a task named ``playground/<Task>`` (``playground/CartpoleSwingup``,
``playground/CheetahRun``, ``playground/WalkerWalk``, ...)::

    reset(key)                 -> obs, BraxState(playground state, time=0, done=False)
    step(key, state, action)   -> obs, state, reward, done
                                  done = the physics went NaN (the suite's only end)
                                         or time == episode_length

The stepping is :class:`~evorl_pop.tasks.brax_envs.BraxEnv`'s: Playground's
``State`` has brax's ``obs`` / ``reward`` / ``done`` fields, so an ended
episode is frozen the same way (same state, zero reward, ``done=True``) and
the rollouts, their early exit and every algorithm that takes a
continuous-action environment (ES, CEM-RL, ERL, PBT) use these tasks as they
use brax's. Actions live in ``[-1, 1]``, every suite actuator's control range.
``evorl-pop render`` shows their episodes in brax's HTML viewer.

Physics runs in MJX, MuJoCo's JAX implementation (``impl='jax'``, on a CPU
or an accelerator), or in MuJoCo Warp (``impl='warp'``, NVIDIA GPUs;
Playground's own default, much slower than ``'jax'`` on a CPU).

Playground is an optional dependency (``pip install -e '.[playground]'``);
it is imported when the first Playground environment is built.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Sequence
from pathlib import Path

from evorl_pop import registry
from evorl_pop.base import ConfigError
from evorl_pop.tasks.brax_envs import BraxEnv, check_choice, quiet_brax, write_html
from evorl_pop.tasks.control import JaxEnvFamily
from evorl_pop.tasks.drawing import Trajectory
from evorl_pop.tasks.envs import check_episode_length

PLAYGROUND_PREFIX = "playground/"
#: MuJoCo Playground's DM Control Suite tasks offered (``playground/<name>``):
#: its whole ``dm_control_suite`` registry, whose model files ship with the
#: package (none is fetched at run time).
PLAYGROUND_ENVS = tuple(
    """AcrobotSwingup AcrobotSwingupSparse BallInCup CartpoleBalance CartpoleBalanceSparse
    CartpoleSwingup CartpoleSwingupSparse CheetahRun FingerSpin FingerTurnEasy FingerTurnHard
    FishSwim HopperHop HopperStand HumanoidRun HumanoidStand HumanoidWalk PendulumSwingup
    PointMass ReacherEasy ReacherHard SwimmerSwimmer6 WalkerRun WalkerStand WalkerWalk""".split()
)

#: MJX implementations: MuJoCo's physics in JAX, or MuJoCo Warp (NVIDIA GPUs).
IMPLS = ("jax", "warp")
DEFAULT_IMPL = "jax"
#: The suite's episodes: 1,000 control steps.
DEFAULT_EPISODE_LENGTH = 1000

# MuJoCo's warning handler is global: threads (devices' host callbacks) take turns.
_NOTICES = threading.Lock()


def _new_notices_lock():
    """A forked child (Gymnasium's worker processes) starts with one thread: a lock another
    thread of the parent held at the fork would stay held in it forever."""
    global _NOTICES
    _NOTICES = threading.Lock()


os.register_at_fork(after_in_child=_new_notices_lock)


def _import_suite():
    try:
        from mujoco_playground import dm_control_suite
    except ImportError as err:
        raise ConfigError(
            f"playground tasks need MuJoCo Playground, which is not installed ({err}); "
            "install it with: pip install -e '.[playground]'"
        ) from err
    return dm_control_suite


@contextlib.contextmanager
def mujoco_notices():
    """MuJoCo's warnings while a model compiles, as Python warnings, less the deprecation
    notices of older model files (MuJoCo 4 on ``settotalmass``) that no user can act on.

    MuJoCo's default handler prints them and appends them to ``MUJOCO_LOG.TXT``
    in the working directory. Without MuJoCo, it does nothing.
    """
    try:
        import mujoco
    except ImportError:
        yield
        return
    seen: list[str] = []
    with _NOTICES:
        previous = mujoco.get_mju_user_warning()
        mujoco.set_mju_user_warning(seen.append)
        try:
            yield
        finally:
            mujoco.set_mju_user_warning(previous)
    for message in seen:
        if "is deprecated" not in message:
            warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=3)


class PlaygroundEnv(BraxEnv):
    """A DM Control Suite task of MuJoCo Playground, stepped without auto-reset.

    Args:
      name: a task in :data:`PLAYGROUND_ENVS` (without the prefix).
      episode_length: control steps after which the episode is truncated.
      impl: the MJX implementation, one of :data:`IMPLS`.

    Raises:
      ConfigError: MuJoCo Playground is not installed.
      ValueError: an unknown name or implementation, or a non-positive episode length.
    """

    def __init__(
        self,
        name: str,
        episode_length: int = DEFAULT_EPISODE_LENGTH,
        impl: str = DEFAULT_IMPL,
    ):
        check_choice("playground task", name, PLAYGROUND_ENVS)
        check_choice("playground impl", impl, IMPLS)
        check_episode_length(episode_length)
        suite = _import_suite()
        overrides = {"impl": impl, "episode_length": int(episode_length)}
        with mujoco_notices():
            env = suite.load(name, config_overrides=overrides)
        # the suite ends an episode only at its time limit
        self._bind(env, PLAYGROUND_PREFIX + name, episode_length, terminates=False)
        _cpu_notice(name)


#: Playground's tasks whose DM Control id is not their name's words (``ball_in_cup-catch``).
_C_IDS = {"BallInCup": "ball_in_cup-catch", "PointMass": "point_mass-easy"}
_noticed = False


def c_simulator_id(name: str) -> str:
    """The Gymnasium id of Playground's task ``name`` (``'CheetahRun'``) in MuJoCo's C
    simulator, through shimmy: ``'dm_control/cheetah-run-v0'``."""
    if name not in _C_IDS:
        words = [w.lower() for w in re.findall(r"[A-Z][a-z0-9]*", name)]
        return f"dm_control/{words[0]}-{'_'.join(words[1:])}-v0"
    return f"dm_control/{_C_IDS[name]}-v0"


def _cpu_notice(name: str) -> None:
    """Says once per process, on a CPU, that MuJoCo's C simulator runs the task too."""
    import jax

    global _noticed
    if _noticed or jax.default_backend() != "cpu":
        return
    _noticed = True
    print(
        f"note: playground/{name} steps in MJX on this CPU; for -a es the same task also "
        f"runs in MuJoCo's C simulator, on the host: --task gym:{c_simulator_id(name)} "
        "(pip install 'evorl_pop[dmc]'). The environments guide compares their speeds.",
        file=sys.stderr,
    )


class PlaygroundFamily(JaxEnvFamily):
    """Playground's DM Control Suite (:class:`PlaygroundEnv`), named ``playground/<Task>``."""

    description = "MuJoCo Playground's DM Control Suite in MJX (playground/CheetahRun, ...)"
    pattern = PLAYGROUND_PREFIX + "<Task>"
    example = PLAYGROUND_PREFIX + "PointMass"
    settings = {"impl": IMPLS}
    drawing = "html"
    prefix, ids, env_class = PLAYGROUND_PREFIX, PLAYGROUND_ENVS, PlaygroundEnv

    def draw(self, env: PlaygroundEnv, episodes: Sequence[Trajectory], out: Path) -> int:
        """brax's HTML viewer of the episodes, one after the other: the task's MuJoCo
        model as a brax system, each frame its bodies' positions and rotations."""
        from brax.base import Transform
        from brax.io import mjcf

        with quiet_brax():
            system = mjcf.load_model(env.env.mj_model)
        frames = []
        for episode in episodes:
            data = episode.states.inner.data
            for t in range(len(episode.so_far)):
                bodies = Transform(pos=data.xpos[t, 1:], rot=data.xquat[t, 1:])  # less the world
                frames.append(types.SimpleNamespace(x=bodies))
        return write_html(system, frames, out)


registry.register_env_family("playground", PlaygroundFamily())
