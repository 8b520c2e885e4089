"""Running the command line with the plug-ins of ``tests/plugins/``: named with
``--plugin``, or installed as ``evorl_pop.plugins`` entry points."""

import os
import subprocess
from pathlib import Path

import _env

#: The folder of the test plug-ins: each one file that touches no package file.
PLUGINS_DIR = Path(__file__).parent / "plugins"


def plugin_env(site: Path | None = None) -> dict:
    """The environment of a command that can import the test plug-ins (and, with
    ``site``, the distribution :func:`install_entry_points` wrote there)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = ""  # the CLI's --devices sets the device count itself
    env["JAX_PLATFORMS"] = "cpu"
    paths = [str(PLUGINS_DIR), *([str(site)] if site else [])]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def install_entry_points(site: Path, modules: dict[str, str], dist: str = "toy_plugins") -> Path:
    """Installs a distribution whose ``evorl_pop.plugins`` entry points are ``modules``
    (entry point name to module): its ``.dist-info`` in ``site``, as pip writes it."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"{name} = {module}" for name, module in modules.items()]
    (info / "entry_points.txt").write_text("[evorl_pop.plugins]\n" + "\n".join(lines) + "\n")
    return site


def run_cli(*args, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """``evorl-pop ARGS`` in a new process (10 minutes at most)."""
    return _env.run_cli(*args, env=plugin_env() if env is None else env, cwd=cwd)
