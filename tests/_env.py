"""The environment of the commands the tests start: CPU only, and no device count (the
CLI's ``--devices`` and the launcher set their own)."""

import os
import subprocess
import sys

#: The command the tests start: the CLI of the package under test.
CLI = (sys.executable, "-m", "evorl_pop.cli")


def cli_env(**extra) -> dict:
    """``os.environ`` for a command the tests start (``extra`` added)."""
    return {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", **extra}


def with_path(env: dict, *folders) -> dict:
    """``env`` with ``folders`` in front of its ``PYTHONPATH`` (plug-ins a user's own)."""
    path = [str(f) for f in folders] + [p for p in [env.get("PYTHONPATH", "")] if p]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


def run_cli(*args, env: dict | None = None, cwd=None, timeout: float = 600):
    """``evorl-pop ARGS`` in a new process, its output captured (10 minutes at most)."""
    return subprocess.run(
        [*CLI, *args],
        env=cli_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
