"""The private JAX APIs evorl_pop needs, each where it is expected, and a clear line if not."""

import jax
import pytest

from evorl_pop import jax_private


def test_backends_started_reads_jaxs_state():
    jax.devices()  # conftest started the backend already; this makes sure
    assert jax_private.backends_started() is True


def test_drop_failed_callbacks_leaves_no_error_behind():
    def fail(x):
        raise ValueError("on purpose")

    broken = jax.jit(lambda x: jax.pure_callback(fail, jax.ShapeDtypeStruct((), x.dtype), x))
    with pytest.raises(jax.errors.JaxRuntimeError):
        jax.block_until_ready(broken(jax.numpy.float32(1.0)))
    jax_private.drop_failed_callbacks()
    jax.effects_barrier()  # would raise the callback's error had it been kept
    assert float(jax.jit(lambda x: x + 1)(1.0)) == 2.0


def test_cluster_types_are_jaxs_cluster_environments():
    names = {cls.__name__ for cls in jax_private.cluster_types()}
    assert {"SlurmCluster", "OmpiCluster"} <= names


@pytest.mark.parametrize(
    "use, moved",
    [
        (jax_private.backends_started, ("jax._src.xla_bridge", "backends_are_initialized")),
        (jax_private.drop_failed_callbacks, ("jax._src.dispatch", "runtime_tokens")),
        (jax_private.cluster_types, ("jax._src.clusters", "ClusterEnv")),
    ],
)
def test_a_moved_private_api_is_one_line_naming_it(monkeypatch, use, moved):
    module, name = moved
    monkeypatch.delattr(f"{module}.{name}")  # as a JAX release that moved it would have it
    with pytest.raises(RuntimeError, match=rf"needs {module}\.{name}, which jax .* no longer has"):
        use()
