"""Several processes under ``jax.distributed``: start-up and host-side transfers.

One run may span several processes (one per host, or several on one machine
through ``evorl-pop launch``). Every process runs the same program on the
global mesh; arrays that span processes are not fully addressable, so the
host-side code (metrics, checkpoints, logging) reads them through
:func:`to_host`, and values that only process 0 reads from disk reach the
others through :func:`broadcast_bytes`. With one process every function here
is a cheap no-op or a plain ``np.asarray``.
"""

from __future__ import annotations

import os

import numpy as np

#: Environment variables read when the command-line options are absent.
#: ``JAX_COORDINATOR_ADDRESS`` is JAX's own; the other two complete it.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

#: Seconds without heartbeats after which the coordinator declares a process
#: dead, so that the survivors fail instead of waiting forever (JAX: 100).
DEFAULT_HEARTBEAT_TIMEOUT = 30
#: Seconds a finishing process waits for the others at shutdown (JAX: 300).
DEFAULT_SHUTDOWN_TIMEOUT = 60


def detect_cluster() -> str | None:
    """The cluster environment JAX's own auto-detection would use, if any.

    Only the environments JAX checks without being asked (SLURM, Open MPI,
    Cloud TPU, Kubernetes, ...) count; opt-in ones such as ``mpi4py`` do not.

    Returns:
      The environment's class name (e.g. ``'SlurmCluster'``), or ``None``.
    """
    try:
        from jax._src import clusters
    except ImportError:  # a JAX without the cluster registry
        return None
    for env in clusters.ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False):
            continue
        try:
            present = env.is_env_present()
        except Exception:  # a detector that needs a missing package, e.g. kubernetes
            present = False
        if present:
            return env.__name__
    return None


def _int_env(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer.") from None


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT,
    initialization_timeout: int = 300,
) -> bool:
    """Joins a multi-process run when one is asked for; must precede any JAX computation.

    The coordinator address, process count and process id come from the
    arguments, else from ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
    ``JAX_PROCESS_ID``. With none of them, ``jax.distributed.initialize()`` is
    called without arguments only when JAX detects a cluster environment (a
    SLURM step, an Open MPI job, ...), and lets JAX fill everything in. CPU
    collectives across processes use gloo.

    Args:
      coordinator: ``HOST:PORT`` of process 0's coordinator service.
      num_processes: processes in the run.
      process_id: this process's index, ``0 .. num_processes - 1``.
      heartbeat_timeout: seconds after which a silent process counts as dead
        and the others fail rather than hang.
      shutdown_timeout: seconds a finishing process waits for the others.
      initialization_timeout: seconds to wait for every process to connect.

    Returns:
      Whether ``jax.distributed`` was initialised (here or before).

    Raises:
      ValueError: an incomplete or inconsistent set of settings.
    """
    import jax
    from jax._src import distributed as jax_distributed

    if jax_distributed.global_state.client is not None:
        return True
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _int_env(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _int_env(ENV_PROCESS_ID)
    explicit = (coordinator, num_processes, process_id)
    cluster = None
    if all(v is None for v in explicit):
        cluster = detect_cluster()
        if cluster is None:
            return False  # a single process: nothing to join
    elif any(v is None for v in explicit) and detect_cluster() is None:
        names = ("--coordinator", "--num-processes", "--process-id")
        missing = [n for n, v in zip(names, explicit, strict=True) if v is None]
        raise ValueError(
            f"A multi-process run needs {', '.join(missing)} as well (or "
            f"{ENV_COORDINATOR} / {ENV_NUM_PROCESSES} / {ENV_PROCESS_ID}); no cluster "
            "environment (SLURM, Open MPI, ...) was detected to fill them in."
        )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num-processes must be >= 1, got {num_processes}.")
    if process_id is not None and num_processes is not None:
        if not 0 <= process_id < num_processes:
            raise ValueError(f"--process-id must be in 0..{num_processes - 1}, got {process_id}.")
    if num_processes == 1 and cluster is None:
        return False  # one process needs no coordinator
    # Cross-process collectives on CPU devices need an implementation; gloo
    # ships with jaxlib. GPU and TPU backends ignore the setting.
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_processes,
        process_id,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout,
        shutdown_timeout_seconds=shutdown_timeout,
    )
    return True


def process_count() -> int:
    """The number of processes of the run (1 without ``jax.distributed``)."""
    import jax

    return jax.process_count()


def to_host(x) -> np.ndarray:
    """One array's full value as NumPy, also when it spans several processes.

    A replicated array is read from this process's first copy (no
    communication); an array sharded across processes is gathered with
    ``multihost_utils.process_allgather``, a collective that every process
    must call in the same order. Typed PRNG keys become their raw key data.

    Args:
      x: a ``jax.Array``, NumPy array or scalar.

    Returns:
      A NumPy array.
    """
    import jax
    import jax.numpy as jnp

    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if x.is_fully_addressable:
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x))
    if x.sharding.is_fully_replicated:
        local = x.addressable_data(0)
        if jnp.issubdtype(local.dtype, jax.dtypes.prng_key):
            local = jax.random.key_data(local)
        return np.asarray(jax.device_get(local))
    from jax.experimental import multihost_utils

    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def needs_collective(tree) -> bool:
    """Whether :func:`tree_to_host` would communicate (a leaf sharded across processes).

    Args:
      tree: a pytree of arrays.

    Returns:
      ``True`` when some leaf is neither fully addressable nor replicated.
    """
    import jax

    return any(
        isinstance(x, jax.Array)
        and not x.is_fully_addressable
        and not x.sharding.is_fully_replicated
        for x in jax.tree.leaves(tree)
    )


def tree_to_host(tree):
    """:func:`to_host` on every leaf of a pytree.

    Args:
      tree: a pytree of arrays.

    Returns:
      The same structure with NumPy leaves.
    """
    import jax

    return jax.tree.map(to_host, tree)


def broadcast_bytes(data: bytes | None) -> bytes:
    """Process 0's bytes, on every process.

    Lets process 0 alone read a file (a checkpoint, a config) and share it,
    so the others need not see the same filesystem. Every process must call it.

    Args:
      data: the bytes on process 0; ignored elsewhere.

    Returns:
      Process 0's bytes.
    """
    import jax

    if jax.process_count() == 1:
        return bytes(data or b"")
    from jax.experimental import multihost_utils

    source = jax.process_index() == 0
    length = np.asarray(len(data) if source and data is not None else 0, np.int64)
    length = int(multihost_utils.broadcast_one_to_all(length))
    buffer = np.zeros(max(length, 1), np.uint8)
    if source and length:
        buffer[:length] = np.frombuffer(data, np.uint8)
    buffer = multihost_utils.broadcast_one_to_all(buffer)
    return np.asarray(buffer[:length]).tobytes()


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier of this name (no-op for one process).

    Args:
      name: the barrier's name, the same on every process.
    """
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def put(x, sharding):
    """``jax.device_put(x, sharding)`` that also works for shardings spanning processes.

    With one process it is exactly ``jax.device_put``. With several, a host
    value (NumPy, or an array on this process's devices) must be the same in
    every process; each process builds its own shards from its copy with
    ``jax.make_array_from_callback``. (``jax.device_put`` would first compare
    the value across processes, and a NaN never compares equal, so states
    holding NaN, e.g. an unset best fitness, would be refused.) Typed PRNG keys
    travel as their raw data and are wrapped again on the devices.

    Args:
      x: an array (or a typed key array).
      sharding: the target sharding.

    Returns:
      A ``jax.Array`` with that sharding.
    """
    import jax
    import jax.numpy as jnp

    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)
    impl = None
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        x = jax.random.key_data(x)
    host = np.asarray(x)
    out = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return out if impl is None else jax.random.wrap_key_data(out, impl=impl)


def replicate(tree, mesh):
    """:func:`put` of every array leaf, replicated (``P()``) over ``mesh``.

    Args:
      tree: a pytree of NumPy or JAX arrays, the same value in every process.
      mesh: the (global) mesh.

    Returns:
      The tree with every array leaf replicated over ``mesh``.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: put(x, replicated), tree)
