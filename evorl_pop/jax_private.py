"""Every use of JAX's private modules, in one place.

JAX offers no public way to do these three things; each function names what
it needs and fails with one line that says so if a JAX release moved it
(``tests/test_jax_private.py`` calls each of them).
"""

from __future__ import annotations

import importlib


def _private(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        import jax

        raise RuntimeError(
            f"evorl_pop needs {module}.{name}, which jax {jax.__version__} no longer has "
            f"({err}); install the jax version pyproject.toml names."
        ) from None


def backends_started() -> bool:
    """Whether JAX's backends have started (after which the device count and the
    64-bit mode are fixed); asking ``jax.devices()`` would start them."""
    return _private("jax._src.xla_bridge", "backends_are_initialized")()


def drop_failed_callbacks() -> None:
    """Drops the error a failed host callback leaves on JAX's pending runtime tokens.

    When a callback fails, the callbacks of the computation's other devices
    fail too, and JAX keeps their errors on its runtime tokens, where they
    would surface in the next, unrelated computation that waits for them
    (``jax.effects_barrier`` raises the error but keeps it).
    """
    import jax

    tokens = _private("jax._src.dispatch", "runtime_tokens")
    try:
        tokens.block_until_ready()
    except jax.errors.JaxRuntimeError:
        tokens.clear()


def cluster_types() -> list[type]:
    """The cluster environments (SLURM, Open MPI, ...) ``jax.distributed`` detects."""
    return list(_private("jax._src.clusters", "ClusterEnv")._cluster_types)
