"""The environment of the commands the tests start.

CPU only; no device count (the CLI's ``--devices`` and the launcher set their own);
the test session's XLA flags otherwise, so that a command compiles as the in-process
tests do and their results compare float for float.
"""

import os

#: XLA flags of every compilation in the tests, in this process and the commands it
#: starts: tiny workloads, where compiling is most of the time, leave out LLVM's
#: optimisation passes (about a quarter of the suite's time).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def cli_env(**extra) -> dict:
    """``os.environ`` for a command the tests start (``extra`` added)."""
    return {**os.environ, "XLA_FLAGS": TEST_XLA_FLAGS, "JAX_PLATFORMS": "cpu", **extra}
