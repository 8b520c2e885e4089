"""What every family of environments stepped in JAX shares: :class:`JaxEnvFamily`.

A family is a plug-in (:class:`~evorl_pop.core.interfaces.EnvFamily`): one
file says which names it owns and how it builds one, and registers itself::

    from evorl_pop import registry
    from evorl_pop.tasks.jax_family import JaxEnvFamily

    class PointMasses(JaxEnvFamily):
        description = "point masses in JAX (toy/reach, ...)"
        pattern = "toy/<task>"

        def names(self):
            return ("toy/reach",)

        def make_env(self, name, episode_length=None):
            return PointMass(name, episode_length)  # reset / step in JAX

    registry.register_env_family("toy", PointMasses())

Its tasks are then :class:`~evorl_pop.tasks.control.ControlTask`'s, for ES
and the hybrid algorithms; its environments serve every learner (PPO, SAC);
``evorl-pop render`` draws their episodes as a GIF of the observations unless
the family draws its states itself (:meth:`JaxEnvFamily.draw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evorl_pop.core.interfaces import Env
from evorl_pop.tasks.control import ControlTask
from evorl_pop.tasks.drawing import Trajectory, write_gif


class JaxEnvFamily:
    """An :class:`~evorl_pop.core.interfaces.EnvFamily` of environments stepped in JAX.

    A subclass sets :attr:`description` and :attr:`pattern` and defines :meth:`names`
    and :meth:`make_env` (and :attr:`settings`, :meth:`owns`, :meth:`draw` where it
    differs); the protocol documents each member.
    """

    description: str = ""
    pattern: str = ""
    settings: dict[str, tuple[str, ...]] = {}
    steps_in_jax: bool = True
    drawing: str | None = "gif"
    example: str | None = None
    #: A family whose names are ``prefix + <id>`` may set these instead of defining
    #: :meth:`names` and :meth:`make_env`: the prefix (``'brax/'``), the ids it lists,
    #: and the class built as ``env_class(<id>, **settings)``.
    prefix: str = ""
    ids: tuple[str, ...] = ()
    env_class: type | None = None

    def names(self) -> tuple[str, ...]:
        return tuple(self.prefix + name for name in self.ids)

    def owns(self, name: str) -> bool:
        return name in self.names()

    def make_env(self, name: str, **settings) -> Env:
        if self.env_class is None:
            raise NotImplementedError(f"{type(self).__name__} defines no make_env")
        return self.env_class(name.removeprefix(self.prefix), **settings)

    def make_task(self, name: str, **kwargs) -> ControlTask:
        """A :class:`~evorl_pop.tasks.control.ControlTask` on environment ``name``:
        ``kwargs`` are its arguments and the family's own :attr:`settings`."""
        settings = {key: kwargs.pop(key) for key in self.settings if key in kwargs}
        settings["episode_length"] = kwargs.get("episode_length")
        # this family owns the name: it builds the environment itself (None: the default)
        env = self.make_env(name, **{k: v for k, v in settings.items() if v is not None})
        return ControlTask(env, **kwargs)

    def draw(self, env: Env, episodes: Sequence[Trajectory], out: Path) -> int:
        """A GIF of the observations (:func:`~evorl_pop.tasks.drawing.write_gif`)."""
        return write_gif(env, episodes, out)
