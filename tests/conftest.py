"""Eight simulated CPU devices for every test; a test picks the first n."""

import atexit
import os
import shutil
import tempfile

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


def pytest_report_header(config):
    return f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices"


# Two tiers. `python -m pytest` runs the default one (about 22 minutes on 2 cores):
# every feature against its reference, one task of each environment family. The
# tests marked `slow` (learning to a target, every listed environment and example
# trained) run with `--full`, or alone with `-m slow`; CI runs both tiers.
def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the tests marked slow (CI runs them: .ci/run)")  # fmt: skip


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
        return item.get_closest_marker("slow") and not any(
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
        terminalreporter.write_line("the default tier: the tests marked slow were left out "
                                    "(`--full` runs them too, `-m slow` alone)")  # fmt: skip
