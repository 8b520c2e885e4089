"""Building a run: its devices and mesh, its algorithm and initial state, checked
to fit in a device's memory before anything is compiled.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from evorl_pop.base import ConfigError, RunError
from evorl_pop.core.capabilities import OnTask, Pooled, Populated, Replicated
from evorl_pop.core.engine import make_mesh
from evorl_pop.run import config as config_lib
from evorl_pop.run import processes
from evorl_pop.run import replicas as replicas_lib
from evorl_pop.run.config import RunConfig


def _check_replicable(config: RunConfig) -> None:
    """Raises a ConfigError, in one line, for replicas of a task whose family shares one
    simulator pool per program (EnvPool's): they would step each other's episodes."""
    from evorl_pop.tasks.envs import env_family

    settings = config.algorithm_config
    task = settings.task if isinstance(settings, OnTask) else None
    family = env_family(task) if isinstance(task, str) else None
    if isinstance(family, Pooled):
        raise ConfigError(
            f"seeds/sweep: {task!r} steps one simulator pool per program, which replicas of "
            "a run cannot share: run each seed or setting as a run of its own (--seed S)."
        )


def build(config: RunConfig):
    """The algorithm of a run, its mesh and its initial state; RunError before any
    compile if the state and population cannot fit on a device.

    Returns:
      ``(algorithm, mesh, state, run_key, yaml)``: ``init`` is traced once, its
        shapes checked, then run; its state is replicated where it was not placed;
        ``yaml`` is the config as ``config.yaml`` holds it.
    """
    text = config_lib.dumps(config)
    config_lib.validate(config, algorithm=False)  # the algorithm checks its own config
    algorithm_class = config_lib.get(config.algorithm).algorithm_class
    devices = processes.mesh_devices(config)
    if jax.process_count() > 1 and devices not in (None, jax.device_count()):
        # A mesh over part of the devices would leave processes out of what they all run.
        raise RunError(
            f"devices={config.devices}, but a run over {jax.process_count()} processes uses "
            f"all of their {jax.device_count()} devices: leave devices unset (null) or set it "
            f"to {jax.device_count()}; the device count per process comes from the "
            "environment (XLA_FLAGS on CPUs, the launcher, the scheduler)."
        )
    mesh = make_mesh(devices)
    if config.seeds > 1 or config.sweep:  # replicas of seeds and settings, in one program
        _check_replicable(config)
        algorithm, init_key, run_key = replicas_lib.build(algorithm_class, config, mesh)
    else:
        algorithm = algorithm_class(config.algorithm_config, mesh=mesh)
        init_key, run_key = jax.random.split(jax.random.key(config.seed))
    init = jax.jit(algorithm.init).trace(init_key)
    leaves = jax.tree.leaves(init.out_info)
    dims = max(
        (x.shape[-1] for x in leaves if x.ndim and jnp.issubdtype(x.dtype, jnp.floating)), default=1
    )
    settings = config.algorithm_config
    population = (settings.population_size or 0) if isinstance(settings, Populated) else 0
    # Per device: the replicated state, and its slice of the population held
    # about three times over (candidates, noise, the updated copy).
    width = 8 if config.precision == "float64" else 4
    need = sum(x.size * x.dtype.itemsize for x in leaves)
    need += 3 * width * dims * -(-population // mesh.size)
    device = mesh.devices.flat[0]
    have = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
    # Simulated CPU devices share the host's memory.
    have = have or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // mesh.size
    replicas = (len(algorithm.labels) or 1) if isinstance(algorithm, Replicated) else 1
    need += 3 * width * dims * -(-population // mesh.size) * (replicas - 1)
    if need > have:
        if replicas > 1:
            fit = int(have // (need / replicas))
            settings = replicas // config.seeds
            what = f"seeds={config.seeds}" + (f" x {settings} settings" if config.sweep else "")
            raise RunError(
                f"{what} of population_size={population:,} with {dims:,} "
                f"parameters per candidate need about {need / 2**30:,.1f} GiB per device, more "
                f"than the {have / 2**30:,.1f} GiB there are: about {fit} replicas fit; lower "
                "seeds or the sweep (and run the others in a second run), or spread them over "
                "more devices."
            )
        raise RunError(
            f"population_size={population:,} with {dims:,} parameters per candidate needs about "
            f"{need / 2**30:,.1f} GiB per device, more than the {have / 2**30:,.1f} GiB there "
            "are: lower population_size (or the network), or spread it over more devices."
        )
    state = init.lower().compile()(init_key)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):  # a state placed otherwise than a chunk's output would compile it again
        if isinstance(x, jax.Array) and not isinstance(x.sharding, NamedSharding):
            return processes.put(x, replicated)
        return x

    return algorithm, mesh, jax.tree.map(place, state), run_key, text
