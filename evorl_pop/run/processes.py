"""This process, its devices and the others: what must be settled before JAX
compiles (host devices, precision, the compilation cache), joining a run of
several processes, and what crosses processes.

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

Under ``jax.distributed`` (:func:`initialize`), arrays that span processes are
read through :func:`to_host`; what only process 0 does (read a run folder,
take its lock) reaches the others through :func:`share`, results and
exceptions alike. With one process all is local.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import socket
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from evorl_pop import jax_private
from evorl_pop.core.capabilities import OnTask, Populated, VectorEnvs
from evorl_pop.tasks.blackbox import BLACKBOX_TASKS
from evorl_pop.tasks.gym_envs import GYM_PREFIX

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
      config: a :class:`~evorl_pop.run.config.RunConfig`; its ``devices`` is a
        count, ``None`` (every device) or ``'auto'``: enough devices for at
        least :data:`MIN_PER_DEVICE` candidates each, up to every device (on
        the CPU, up to one per core unless ``XLA_FLAGS`` named a count); a
        Gymnasium task takes one device with sync vector envs (``evorl-pop
        launch`` spreads it over the cores).

    Returns:
      A device count for :func:`evorl_pop.make_mesh` (``None``: all).
    """
    if config.devices != "auto":
        return config.devices
    if jax.process_count() > 1:
        return None  # a run over several processes uses all of their devices
    limit = jax.device_count()
    if jax.default_backend() == "cpu" and host_device_count() is None:
        limit = min(limit, available_cores())
    algorithm = config.algorithm_config
    population = algorithm.population_size if isinstance(algorithm, Populated) else None
    if population is None:
        return limit
    task = algorithm.task if isinstance(algorithm, OnTask) else None
    sync = not isinstance(algorithm, VectorEnvs) or algorithm.vector == "sync"
    if isinstance(task, str) and task.startswith((GYM_PREFIX, "envpool:")) and sync:
        # A process's sync vector envs step one device at a time (Python's lock): more
        # devices add host callbacks, not stepping. Worker processes step in parallel.
        return 1
    kind = "blackbox" if task in BLACKBOX_TASKS else "env"
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
    if jax_private.backends_started():
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


# --- several processes (jax.distributed) ---------------------------------------------

#: Environment variables read when the command-line options are absent.
ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


#: The cluster environments (SLURM, Open MPI, ...) ``jax.distributed`` detects.
CLUSTER_TYPES = jax_private.cluster_types()


def detect_cluster() -> str | None:
    """The class name of the cluster environment (SLURM, Open MPI, ...) JAX detects, if any."""
    for env in CLUSTER_TYPES:
        try:
            # JAX's cluster classes: only some declare opt_in_only_method (foreign objects)
            if not getattr(env, "opt_in_only_method", False) and env.is_env_present():
                return env.__name__
        except Exception:  # a detector that needs a missing package, e.g. kubernetes
            pass
    return None


def _reach(address: str, process_id: int, timeout: float) -> None:
    """Fails fast, with what to change, when the coordinator cannot be reached."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--coordinator must be HOST:PORT (e.g. 10.0.0.1:1234), got {address!r}.")
    try:
        socket.getaddrinfo(host, int(port))
    except socket.gaierror as err:
        raise ValueError(
            f"--coordinator {address}: the host {host!r} does not resolve ({err.strerror}); "
            "give process 0's host name or IP address."
        ) from None
    start = time.monotonic()
    told = 0.0
    while process_id != 0:  # process 0 starts the coordinator itself
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return
        except OSError:
            waited = time.monotonic() - start
            if waited > timeout:
                raise ValueError(
                    f"No coordinator answered at {address} within {timeout:g} s: start process "
                    "0 there, check the address and port, or wait longer with "
                    "--connect-timeout."
                ) from None
            if waited - told >= 5:  # a user starting processes by hand sees it wait
                told = waited
                print(
                    f"waiting for the coordinator at {address}: {waited:.0f} s of "
                    f"{timeout:g} s (--connect-timeout)",
                    file=sys.stderr,
                )
            time.sleep(0.5)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = 100,
    shutdown_timeout: int = 60,
    connect_timeout: int = 30,
) -> bool:
    """Joins a multi-process run when one is asked for; must precede any JAX computation.

    Missing settings come from ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES``
    / ``JAX_PROCESS_ID``, else from a cluster job JAX detects. CPU collectives use gloo.

    Args:
      coordinator, num_processes, process_id: process 0's ``HOST:PORT``, the
        number of processes, this one's index.
      heartbeat_timeout: seconds after which a silent process counts as dead; also
        how long process 0 waits for the others to join (at least 20 s). The
        default is JAX's own: a busy host (compiling, or sharing its cores)
        can go quiet for tens of seconds without being dead.
      shutdown_timeout: seconds a finishing process waits for the others.
      connect_timeout: seconds a process other than 0 waits for the coordinator to
        answer at start-up, saying so every 5 s: a mistyped address fails in that time.

    Returns:
      Whether ``jax.distributed`` was initialised (here or before); ValueError
        for incomplete settings, a bad address, or no coordinator in time.
    """
    if jax.distributed.is_initialized():
        return True
    explicit = [coordinator, num_processes, process_id]
    for i, name in enumerate(ENV):
        text = os.environ.get(name, "").strip()
        if explicit[i] is None and text:
            try:
                explicit[i] = text if i == 0 else int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not an integer.") from None
    coordinator, num_processes, process_id = explicit
    cluster = detect_cluster() if None in explicit else None
    if cluster is None and all(v is None for v in explicit):
        return False  # a single process: nothing to join
    if cluster is None and None in explicit:
        names = ("--coordinator", "--num-processes", "--process-id")
        missing = [n for n, v in zip(names, explicit, strict=True) if v is None]
        raise ValueError(
            f"A multi-process run needs {', '.join(missing)} as well (or {' / '.join(ENV)}); no "
            "cluster environment (SLURM, Open MPI, ...) was detected to fill them in."
        )
    for name, value in (
        ("--num-processes", num_processes),
        ("--heartbeat-timeout", heartbeat_timeout),
        ("--connect-timeout", connect_timeout),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    if None not in (process_id, num_processes) and not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id must be in 0..{num_processes - 1}, got {process_id}.")
    if num_processes == 1 and cluster is None:
        return False  # one process needs no coordinator
    timeout = max(heartbeat_timeout, 20)
    if coordinator is not None and process_id is not None:
        _reach(coordinator, process_id, connect_timeout)
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_processes,
        process_id,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=heartbeat_timeout,
        shutdown_timeout_seconds=shutdown_timeout,
    )
    return True


def is_key(x) -> bool:
    """Whether ``x`` is a typed PRNG key array."""
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def key_data(x):
    """A typed key array's raw data (what a checkpoint holds); other leaves as they are."""
    return jax.random.key_data(x) if is_key(x) else x


def to_host(x) -> np.ndarray:
    """One array's full value as NumPy (typed keys as their key data), across processes too.

    An array sharded across processes is gathered: a collective every process
    must call in the same order.
    """
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(key_data(x)))
    if x.sharding.is_fully_replicated:
        return np.asarray(jax.device_get(key_data(x.addressable_data(0))))
    return np.asarray(multihost_utils.process_allgather(key_data(x), tiled=True))


def share(fn):
    """Runs ``fn()`` on process 0 only; its result, or the exception it raised, on every process.

    Exceptions travel pickled, so each process raises the same type with the
    same message. Every process must call it.
    """
    if jax.process_count() == 1:
        return fn()
    data = b""
    if jax.process_index() == 0:
        try:
            data = pickle.dumps((fn(), None))
        except Exception as err:
            data = pickle.dumps((None, err))
    length = int(multihost_utils.broadcast_one_to_all(np.asarray(len(data), np.int64)))
    buffer = np.zeros(length, np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    data = np.asarray(multihost_utils.broadcast_one_to_all(buffer)).tobytes()
    result, error = pickle.loads(data)
    if error is not None:
        raise error
    return result


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on some process (a collective for several processes)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def put(x, sharding):
    """``jax.device_put(x, sharding)`` that also works for shardings spanning processes.

    Each process builds its shards from its own copy (``device_put`` would
    compare the copies, and NaN never compares equal); typed keys travel as raw data.
    """
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)
    host = np.asarray(key_data(x))
    out = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.random.wrap_key_data(out, impl=jax.random.key_impl(x)) if is_key(x) else out


def replicate(tree, mesh):
    """:func:`put` of every array leaf of ``tree``, replicated (``P()``) over ``mesh``."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: put(x, replicated), tree)
