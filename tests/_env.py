"""The environment of the commands the tests start: CPU only, and no device count (the
CLI's ``--devices`` and the launcher set their own)."""

import os


def cli_env(**extra) -> dict:
    """``os.environ`` for a command the tests start (``extra`` added)."""
    return {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", **extra}
