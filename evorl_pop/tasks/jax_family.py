"""A deprecated import path: ``from evorl_pop.tasks.jax_family import JaxEnvFamily``.

It still gives :class:`~evorl_pop.tasks.control.JaxEnvFamily`, which lives in
:mod:`evorl_pop.tasks.control` beside the :class:`~evorl_pop.tasks.control.ControlTask`
it builds, with a ``DeprecationWarning`` that names the import to write instead.
"""

from __future__ import annotations

import warnings


def __getattr__(name: str):
    if name == "JaxEnvFamily":
        warnings.warn(
            "evorl_pop.tasks.jax_family is deprecated: write "
            "`from evorl_pop.tasks.control import JaxEnvFamily`.",
            DeprecationWarning,
            stacklevel=2,
        )
        from evorl_pop.tasks.control import JaxEnvFamily

        return JaxEnvFamily
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
