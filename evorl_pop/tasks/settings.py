"""The task settings block: the one place a config names its task and how it is built.

``es``, ``mapelites``, ``nsga2`` / ``nsga3`` and a plug-in's config embed
:class:`TaskSettings` (a dataclass base: its fields are the config's own, so
``--set hidden_sizes=[64]`` and YAML keys read as before) and build their task with
its one :meth:`TaskSettings.make_task`. Each kind of task reads some of the
settings (:meth:`TaskSettings.reads`) and leaves the others, so that one config can
switch between tasks; the settings that change how an environment's episodes are
evaluated (:data:`EVALUATION`) are refused by :meth:`TaskSettings.check_task` where
the task does not read them::

    kind                    reads
    black-box functions     num_dims, x0 (BBOB: instance)
    mo/<problem>            num_dims (and the config's num_objectives)
    qd/<black-box task>     num_dims
    qd/<brax task>          hidden_sizes, activation, episode_length, backend
    mo/<brax task>          hidden_sizes, activation, episodes, episode_length, backend
    environments            hidden_sizes, activation, policy, episodes, episode_length,
                            normalize_obs, the family's own (backend, impl, vector, team);
                            stepped in JAX: rollout_lanes, virtual_batch_norm
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from evorl_pop.base import ConfigError, check_config
from evorl_pop.tasks.blackbox import BBOB_PREFIX, BLACKBOX_FUNCTIONS, BLACKBOX_TASKS
from evorl_pop.tasks.envs import env_family, env_names, env_settings
from evorl_pop.tasks.multiobjective import MO_PREFIX, make_mo_task
from evorl_pop.tasks.policies import ACTIVATIONS
from evorl_pop.tasks.qd import QD_TASKS, BraxQDTask, make_qd_task

#: The settings every control task reads (a policy network, its episodes).
CONTROL = ("hidden_sizes", "activation", "episodes", "episode_length")

#: Settings that change how an environment's episodes are evaluated: set for a task
#: that does not read them, they are refused rather than left.
EVALUATION = ("normalize_obs", "virtual_batch_norm", "rollout_lanes")

#: The kinds of task a name can be (:meth:`TaskSettings.kind`).
KINDS = ("blackbox", "mo", "qd", "env")


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What a population is scored on, and how the task is built.

    Attributes:
      task: a black-box function (``sphere``, ``bbob/<function>``), a multi-objective
        problem (``mo/zdt1``), a quality-diversity task (``qd/arm``), an environment
        (``CartPole-v1``, ``brax/hopper``, ``playground/CheetahRun``, ``gym:<id>``) or a
        plug-in family's name; which of them a config takes, its ``validate`` says.
      num_dims: black-box tasks: the dimension (``None``: the problem's own).
      x0: black-box functions: every coordinate of the starting point.
      instance: BBOB tasks: the instance seed (shift, rotations, ``f_opt``), from 1.
      hidden_sizes: control tasks: the policy's hidden layers (after the CNN's
        convolutions for image observations).
      activation: control tasks: ``'tanh'``, ``'relu'`` or ``'elu'``.
      policy: environments: ``'auto'`` (a CNN for image observations such as
        MinAtar's, else an MLP on the flattened observation), ``'mlp'``, ``'cnn'`` or
        ``'keypoints'`` (each image channel's spatial soft-argmax, then the MLP).
      episode_length: control tasks: steps after which an episode ends (``None``: the
        environment's own limit; 1000 for brax).
      episodes: control tasks: episodes per candidate.
      backend: brax tasks: the physics backend, ``'spring'`` (the fastest),
        ``'positional'``, ``'generalized'`` (the most accurate) or ``'mjx'``.
      impl: Playground tasks: the MJX implementation, ``'jax'`` or ``'warp'``.
      team: ``marl/`` tasks: a team's weights, ``'shared'`` (one network for every
        agent, told apart by a one-hot id) or ``'per_agent'`` (a network each).
      vector: ``gym:`` tasks: ``'sync'`` (each device steps its slice's episodes in
        turn, in this process) or ``'async'`` (a worker process per episode).
      normalize_obs: environments: running observation normalisation.
      virtual_batch_norm: environments stepped in JAX: standardise the policy's hidden
        layers over a fixed batch of observations of random play (Salimans et al. 2017).
      rollout_lanes: environments stepped in JAX: episodes a device steps at once
        (``None``: 16 on a CPU, the whole slice on an accelerator).
    """

    task: str = "CartPole-v1"
    num_dims: int | None = 10
    x0: float = 3.0
    instance: int = 1
    hidden_sizes: tuple[int, ...] = (32,)
    activation: str = "tanh"
    policy: str = "auto"
    episode_length: int | None = None
    episodes: int = 1
    backend: str | None = "spring"
    impl: str = "jax"
    vector: str = "sync"
    team: str = "shared"
    normalize_obs: bool = False
    virtual_batch_norm: bool = False
    rollout_lanes: int | None = None

    #: The kinds of task (:data:`KINDS`) the config takes; its ``validate`` says more
    #: about a task of another kind where it can (``-a nsga2`` for ``mo/`` problems).
    TASK_KINDS: ClassVar[tuple[str, ...]] = ("blackbox", "env")

    def kind(self) -> str | None:
        """What ``task`` names: ``'blackbox'`` (a function, BBOB), ``'mo'`` (several
        objectives), ``'qd'`` (behaviour descriptors), ``'env'`` (an environment family's),
        or ``None``: an unknown name."""
        name = self.task
        if name in BLACKBOX_TASKS:
            return "blackbox"
        if name.startswith(MO_PREFIX):
            return "mo"
        if name in QD_TASKS:
            return "qd"
        return "env" if env_family(name) is not None else None

    def reads(self) -> tuple[str, ...]:
        """The settings the task ``task`` names is built with (see the module's table)."""
        name = self.task
        if name in BLACKBOX_FUNCTIONS:
            return ("num_dims", "x0")
        if name.startswith(BBOB_PREFIX):
            return ("num_dims", "x0", "instance")
        if name in QD_TASKS:
            if issubclass(QD_TASKS[name], BraxQDTask):
                return ("hidden_sizes", "activation", "episode_length", "backend")
            return ("num_dims",)
        if name.startswith(MO_PREFIX):
            from evorl_pop.tasks.mo_brax import MO_BRAX

            if name[len(MO_PREFIX) :] in MO_BRAX:
                return (*CONTROL, "backend")
            return ("num_dims",)
        family = env_family(name)
        if family is None:  # an unknown name: check_task names the valid ones
            return ()
        own = tuple(setting for setting in family.settings if setting in self._fields())
        in_jax = ("rollout_lanes", "virtual_batch_norm") if family.steps_in_jax else ()
        return (*CONTROL, "policy", "normalize_obs", *own, *in_jax)

    def check_task(self) -> None:
        """Raises a :class:`~evorl_pop.base.ConfigError` for task settings that cannot
        run: an unknown task, a value out of range, or one of :data:`EVALUATION` set
        for a task that does not read it."""
        own = {
            k: v for k, v in env_settings(self._fields()).items() if getattr(self, k) is not None
        }
        names = (*BLACKBOX_TASKS, *env_names()) if "env" in self.TASK_KINDS else BLACKBOX_TASKS
        check_config(
            self,
            choices={
                **own,  # a family's own, whatever the task
                **({} if self.kind() in self.TASK_KINDS else {"task": names}),
                "activation": tuple(ACTIVATIONS),
            },
            least={
                "num_dims": 1,
                "episodes": 1,
                "episode_length": 1,
                "rollout_lanes": 1,
            },
            widths=("hidden_sizes",),
        )
        reads = set(self.reads())
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in EVALUATION}
        for name, default in defaults.items():
            if name not in reads and getattr(self, name) != default:
                raise ConfigError(
                    f"{name} does not apply to {self._described()} (it reads "
                    f"{', '.join(sorted(reads)) or 'no setting'}): leave it at {default!r}."
                )

    def _described(self) -> str:
        """``the black-box task 'sphere'``, ``the environment 'gym:CartPole-v1', stepped on
        the host``, ...: the task, for messages."""
        kind = self.kind()
        if kind == "env":
            host = "" if env_family(self.task).steps_in_jax else ", stepped on the host"
            return f"the environment {self.task!r}{host}"
        what = {"blackbox": "black-box task", "mo": "multi-objective task", "qd": "QD task"}
        return f"the {what.get(kind, 'task')} {self.task!r}"

    def make_task(self, **extra):
        """The task ``task`` names, built with the settings it reads (:meth:`reads`);
        ``extra``: a config's own settings of that kind of task (NSGA's
        ``num_objectives``)."""
        kwargs = {name: getattr(self, name) for name in self.reads()}
        if "hidden_sizes" in kwargs:
            kwargs["hidden_sizes"] = tuple(kwargs["hidden_sizes"])
        name = self.task
        if name in QD_TASKS:
            if "num_dims" in kwargs and kwargs["num_dims"] is None:
                kwargs.pop("num_dims")  # the task's own
            return make_qd_task(name, **kwargs, **extra)
        if name.startswith(MO_PREFIX):
            return make_mo_task(name, **kwargs, **extra)
        if "num_dims" in kwargs and kwargs["num_dims"] is None:
            kwargs.pop("num_dims")  # the function's default dimension
        family = env_family(name)
        if family is None:  # a black-box function (tasks.make_task names the valid ones)
            from evorl_pop.tasks import make_task

            return make_task(name, **kwargs, **extra)
        if family.steps_in_jax:
            kwargs["lanes"] = kwargs.pop("rollout_lanes")
        return family.make_task(name, **kwargs, **extra)

    def _fields(self) -> set[str]:
        return {field.name for field in dataclasses.fields(self)}


__all__ = ["CONTROL", "EVALUATION", "KINDS", "TaskSettings"]
