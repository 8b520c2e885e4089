"""Eight simulated CPU devices for every test; a test picks the first n."""

import atexit
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

# Must happen before JAX initialises its backend.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for this test session (its worker processes and the
# commands they start inherit it), not the user's, removed at the end.
if "PYTEST_XDIST_WORKER" not in os.environ and "EVORL_POP_COMPILATION_CACHE" not in os.environ:
    os.environ["EVORL_POP_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="evorl_pop-test-jax-")
    atexit.register(shutil.rmtree, os.environ["EVORL_POP_COMPILATION_CACHE"], True)

import jax  # noqa: E402
import pytest  # noqa: E402

from evorl_pop.run.processes import use_compilation_cache  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# Every worker compiles through the session's cache, not only the commands a test starts:
# the slow tier and tests that build the same program load it instead of compiling again.
use_compilation_cache()
# Start the backend now, with the 8 devices: an in-process `evorl-pop train
# --devices N` must find it running and not get to set its own device count.
jax.devices()


@pytest.fixture(scope="session")
def num_devices():
    return jax.device_count()


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build) -> folder``: the folder ``build(folder)`` fills, once per
    test session. The worker processes share it: the first to ask builds it while the
    others wait, then read it (a documentation site takes a minute to build)."""

    def get(name: str, build) -> Path:
        if "PYTEST_XDIST_WORKER" not in os.environ:
            folder = tmp_path_factory.mktemp(name)
            build(folder)
            return folder
        shared = tmp_path_factory.getbasetemp().parent  # one per session, every worker's
        folder = shared / name
        with open(shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (shared / f"{name}.built").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)  # a failure leaves it unmarked: the next worker tries again
                (shared / f"{name}.built").touch()
        return folder

    return get


def pytest_report_header(config):
    return f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices"


# Three tiers. `python -m pytest` runs the default one (about 16 minutes on 2 cores):
# every feature against its reference, one task of each environment family. The tests
# marked `slow` (learning to a target, every algorithm on every family, every example)
# run alone with `-m slow`; CI runs these two tiers. The tests marked `exhaustive` train
# every listed environment of the families whose tasks each compile for a minute on a
# CPU (Playground's, brax's), every algorithm on Playground's quick task, and variants
# whose code the long tier runs through a sibling (a fourth device count, a second
# learner, a DM Control cell a Gymnasium task covers): run them alone with
# `-m exhaustive` before a release, or every tier at once with `--full`.
TIERS = ("slow", "exhaustive")


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        help="run every tier: the tests marked slow and exhaustive too",
    )


def _named(config):
    """The tests named on the command line (``FILE::TEST``): run whatever their tier."""
    named = []
    for arg in config.args:
        path, sep, name = arg.partition("::")
        if sep:
            named.append(((config.invocation_params.dir / path).resolve(), name))
    return named


def _default_tier(config) -> bool:
    # `-m` chooses for itself: `-m slow` runs the slow tier alone
    return not (config.getoption("--full") or config.getoption("-m"))


def pytest_collection_modifyitems(config, items):
    if not _default_tier(config):
        return
    named = _named(config)

    def left_out(item):
        name = item.nodeid.partition("::")[2]
        tier = any(item.get_closest_marker(marker) for marker in TIERS)
        return tier and not any(
            item.path == path and (name == n or name.startswith((n + "[", n + "::")))
            for path, n in named
        )

    kept, slow = [], []
    for item in items:
        (slow if left_out(item) else kept).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = kept


_MATRIX: list[str] = []


def pytest_runtest_logreport(report):
    """The algorithm x family pairs test_matrix ran (from any worker), for the summary."""
    if report.when == "call":
        _MATRIX.extend(value for name, value in report.user_properties if name == "matrix")


def pytest_terminal_summary(terminalreporter, config):
    if _MATRIX:
        terminalreporter.section("algorithm x family matrix")
        for line in sorted(_MATRIX):
            terminalreporter.write_line(line)
    if _default_tier(config):
        terminalreporter.write_line(
            "the default tier: the tests marked slow or exhaustive were left out "
            "(`-m slow` runs the slow ones, `--full` all)"
        )
