"""What must be settled before JAX compiles: host devices, precision, the compilation cache.

JAX reads the number of simulated CPU devices (``XLA_FLAGS``) and should
read its 64-bit mode once, when its backend starts; importing ``jax`` does not
start it, creating the first array does (importing gymnax does). So the
command line, the examples and scripts call :func:`set_host_devices` (or
:func:`use_all_cores`) and :func:`set_precision` first::

    import evorl_pop

    evorl_pop.use_all_cores()  # as many CPU devices as this process has cores
    mesh = evorl_pop.make_mesh()

A user's own ``XLA_FLAGS`` device count is kept unless a count is asked for
explicitly. :func:`use_compilation_cache` keeps compiled programs on disk
for the next run that compiles them.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import jax
from jax._src import xla_bridge  # no public way to ask whether the backend has started

DEVICE_FLAG = "--xla_force_host_platform_device_count"
#: Simulated CPU devices beyond this abort XLA (1,024 does) or only cost memory.
MAX_HOST_DEVICES = 512
#: Fewest candidates per device that pay for splitting: one rollout each for
#: environment tasks; black-box evaluations are so cheap that only very large
#: populations gain from more devices.
MIN_PER_DEVICE = {"env": 64, "blackbox": 4096}
#: A folder for :func:`use_compilation_cache`, or ``off``.
CACHE_ENV = "EVORL_POP_COMPILATION_CACHE"
#: The compilation cache's size limit: past it the least recently used programs go.
CACHE_MAX_BYTES = 2 * 2**30


def _cgroup_cpus(root: Path) -> float | None:
    """The CPU limit of cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``), if any."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cores(cgroup_root: str | os.PathLike = "/sys/fs/cgroup") -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU limit.

    Args:
      cgroup_root: where the cgroup file system is mounted.

    Returns:
      At least 1.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpus(Path(cgroup_root))
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def host_device_count() -> int | None:
    """The simulated CPU device count ``XLA_FLAGS`` asks for, if it names one."""
    found = re.findall(rf"{DEVICE_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def set_host_devices(count: int) -> str | None:
    """Asks for ``count`` simulated CPU devices; must run before JAX's backend starts.

    Args:
      count: the number of devices, 1 to :data:`MAX_HOST_DEVICES`.

    Returns:
      A note when this replaces a different count the user's ``XLA_FLAGS`` named, else ``None``.

    Raises:
      ValueError: an impossible count.
    """
    if not 1 <= count <= MAX_HOST_DEVICES:
        raise ValueError(
            f"devices={count}: between 1 and {MAX_HOST_DEVICES} CPU devices can be simulated "
            f"(this process has {available_cores()} core(s)); use --devices auto or a smaller N."
        )
    before = host_device_count()
    os.environ["XLA_FLAGS"] = with_host_devices(os.environ.get("XLA_FLAGS", ""), count)
    if before is not None and before != count:
        return f"devices={count} replaces the count of {before} that XLA_FLAGS named"
    return None


def with_host_devices(flags: str, count: int) -> str:
    """``XLA_FLAGS`` text ``flags`` with its simulated CPU device count set to ``count``."""
    others = re.sub(rf"{DEVICE_FLAG}=\S+", "", flags).strip()
    return f"{others} {DEVICE_FLAG}={count}".strip()


def use_all_cores() -> int:
    """One simulated CPU device per available core, unless ``XLA_FLAGS`` names a count.

    Call it before anything uses JAX; on GPUs and TPUs it changes nothing.

    Returns:
      The number of CPU devices JAX will start with.
    """
    user = host_device_count()
    if user is not None:
        return user
    cores = available_cores()
    set_host_devices(cores)
    return cores


def mesh_devices(config) -> int | None:
    """The devices a run's population axis uses.

    Args:
      config: a :class:`~evorl_pop.config.RunConfig`; its ``devices`` is a
        count, ``None`` (every device) or ``'auto'``: enough devices for at
        least :data:`MIN_PER_DEVICE` candidates each, up to every device (on
        the CPU, up to one per core unless ``XLA_FLAGS`` named a count).

    Returns:
      A device count for :func:`evorl_pop.mesh.make_mesh` (``None``: all).
    """
    from evorl_pop.tasks import BLACKBOX_FUNCTIONS  # imports gymnax, which starts JAX

    if config.devices != "auto":
        return config.devices
    if jax.process_count() > 1:
        return None  # a run over several processes uses all of their devices
    limit = jax.device_count()
    if jax.default_backend() == "cpu" and host_device_count() is None:
        limit = min(limit, available_cores())
    algorithm = config.algorithm_config
    population = getattr(algorithm, "population_size", None)
    if population is None:
        return limit
    task = str(getattr(algorithm, "task", None))
    kind = "blackbox" if task in BLACKBOX_FUNCTIONS or task.startswith("bbob/") else "env"
    return max(1, min(limit, population // MIN_PER_DEVICE[kind]))


def set_precision(precision: str) -> None:
    """Turns JAX's 64-bit mode on (``'float64'``) or keeps it off (``'float32'``).

    Args:
      precision: ``'float32'`` or ``'float64'``.

    Raises:
      ValueError: an unknown precision, or JAX's backend already started in the other mode.
    """
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}.")
    wanted = precision == "float64"
    if bool(jax.config.jax_enable_x64) == wanted:
        return
    if xla_bridge.backends_are_initialized():
        raise ValueError(
            f"precision={precision}, but JAX already started in "
            f"{'float64' if not wanted else 'float32'} mode in this process: set the precision "
            "before anything uses JAX (or run the command in a new process)."
        )
    jax.config.update("jax_enable_x64", wanted)


def use_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache, so that a run compiling what an
    earlier one compiled (a resume, a rerun, another seed) loads it from disk:
    on a CPU a generation of a brax task takes tens of seconds to compile.

    Call it before the first compile. Only programs that took a second or
    more to compile are kept, up to :data:`CACHE_MAX_BYTES` in all.

    Args:
      path: the folder (``None``: ``$EVORL_POP_COMPILATION_CACHE``, else
        ``$XDG_CACHE_HOME/evorl_pop/jax``, by default ``~/.cache/evorl_pop/jax``);
        ``'off'``: no cache. A folder already given to JAX
        (``JAX_COMPILATION_CACHE_DIR``) is kept.

    Returns:
      The cache folder, or ``None``: off, or the folder cannot be written.
    """
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evorl_pop/jax"
    path = str(path or os.environ.get(CACHE_ENV) or default)
    if path.lower() in ("off", "none", "0", "false"):
        return None
    path = os.path.expanduser(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None  # JAX would fail at the first compile instead
    if not os.access(path, os.W_OK | os.X_OK):
        return None
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    jax.config.update("jax_compilation_cache_dir", path)
    return path
