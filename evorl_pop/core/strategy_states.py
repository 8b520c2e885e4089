"""What the restarts' stop rules read of a strategy's state: capabilities of CMA-ES's
(evosax's and pycma's), each a protocol checked with ``isinstance``
(:mod:`evorl_pop.algorithms.restarts`)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax


@runtime_checkable
class HasCovariance(Protocol):
    """A strategy state with a covariance matrix ``C`` (CMA-ES's; a separable one's is its
    diagonal) and its evolution path ``p_c``."""

    mean: jax.Array
    std: jax.Array
    C: jax.Array
    p_c: jax.Array


@runtime_checkable
class HasAxisLengths(Protocol):
    """A strategy state with ``D``, the square roots of its covariance's eigenvalues (the
    distribution's axis lengths, up to ``std``)."""

    D: jax.Array


@runtime_checkable
class HasEigenbasis(Protocol):
    """A strategy state with its covariance's eigenvectors ``B`` (columns) beside ``D``."""

    B: jax.Array
    D: jax.Array


@runtime_checkable
class ScalesCoordinates(Protocol):
    """A strategy state with a per-coordinate scale of the genotype (pycma's ``sigma_vec``)."""

    scaling: jax.Array


@runtime_checkable
class CountsFlatFitness(Protocol):
    """A strategy state that counts the generations in a row whose fitness was flat."""

    flat_generations: jax.Array
