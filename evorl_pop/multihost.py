"""Several processes under ``jax.distributed``: joining a run, and what crosses processes.

Arrays that span processes are read through :func:`to_host`; what only
process 0 does (read a run folder, take its lock) reaches the others through
:func:`share`, results and exceptions alike. With one process all is local.
"""

from __future__ import annotations

import os
import pickle
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import clusters
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

#: Environment variables read when the command-line options are absent.
ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def detect_cluster() -> str | None:
    """The class name of the cluster environment (SLURM, Open MPI, ...) JAX detects, if any."""
    for env in clusters.ClusterEnv._cluster_types:
        try:
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
    deadline = time.monotonic() + timeout
    while process_id != 0:  # process 0 starts the coordinator itself
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise ValueError(
                    f"No coordinator answered at {address} within {timeout:g} s: start process "
                    "0 there, check the address and port, or wait longer with "
                    "--heartbeat-timeout."
                ) from None
            time.sleep(0.5)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = 30,
    shutdown_timeout: int = 60,
) -> bool:
    """Joins a multi-process run when one is asked for; must precede any JAX computation.

    Missing settings come from ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES``
    / ``JAX_PROCESS_ID``, else from a cluster job JAX detects. CPU collectives use gloo.

    Args:
      coordinator, num_processes, process_id: process 0's ``HOST:PORT``, the
        number of processes, this one's index.
      heartbeat_timeout: seconds after which a silent process counts as dead; also
        how long to wait for the coordinator at start-up (at least 20 s).
      shutdown_timeout: seconds a finishing process waits for the others.

    Returns:
      Whether ``jax.distributed`` was initialised (here or before); ValueError
      for incomplete settings, a bad address, or no coordinator in time.
    """
    if jax_distributed.global_state.client is not None:
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
    for name, value in (("--num-processes", num_processes), ("--heartbeat-timeout",
                                                             heartbeat_timeout)):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    if None not in (process_id, num_processes) and not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id must be in 0..{num_processes - 1}, got {process_id}.")
    if num_processes == 1 and cluster is None:
        return False  # one process needs no coordinator
    timeout = max(heartbeat_timeout, 20)
    if coordinator is not None and process_id is not None:
        _reach(coordinator, process_id, timeout)
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


def _key_data(x):
    return jax.random.key_data(x) if is_key(x) else x


def to_host(x) -> np.ndarray:
    """One array's full value as NumPy (typed keys as their key data), across processes too.

    An array sharded across processes is gathered: a collective every process
    must call in the same order.
    """
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(_key_data(x)))
    if x.sharding.is_fully_replicated:
        return np.asarray(jax.device_get(_key_data(x.addressable_data(0))))
    return np.asarray(multihost_utils.process_allgather(_key_data(x), tiled=True))


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
    host = np.asarray(_key_data(x))
    out = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.random.wrap_key_data(out, impl=jax.random.key_impl(x)) if is_key(x) else out


def replicate(tree, mesh):
    """:func:`put` of every array leaf of ``tree``, replicated (``P()``) over ``mesh``."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: put(x, replicated), tree)
