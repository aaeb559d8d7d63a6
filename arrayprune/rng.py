"""Uniform random scores on the device of an array, from each library's own generator.

Random pruning methods accept a keyword-only ``seed`` (an int) or ``generator`` (the
library's generator object: :class:`numpy.random.Generator`, a CuPy generator, a
:class:`torch.Generator`, or a JAX PRNG key). With neither, the library's default
source is used: PyTorch's global generator, fresh entropy elsewhere. Libraries without
a generator of their own (array-api-strict, ...) get NumPy's numbers copied to their
device.

Seeded streams
--------------
A seed gives the same scores every time, and never touches a library's global
generator. Scores are float32 numbers in ``[0, 1)``:

=================  ====================================================================
NumPy (and         ``numpy.random.default_rng(seed).random(shape, dtype=float32)``
libraries without  (PCG64), copied to the array's device for the latter
a generator)
PyTorch            ``torch.Generator(device=x.device).manual_seed(seed)``, then
                   ``torch.rand(shape, dtype=float32, device=x.device)``
CuPy               ``cupy.random.default_rng(seed).random(shape, dtype=float32)`` on the
                   array's device
JAX                ``jax.random.uniform(jax.random.key(seed), shape, float32)``, put on
                   the array's device
Dask               NumPy's numbers, drawn lazily per block (:mod:`arrayprune._lazy_rng`)
=================  ====================================================================

Several arrays (global pruning, :func:`uniform_many`) draw from one generator made from
the seed, one array after another in the order given (JAX: the key is split into one
key per array), so the arrays get independent numbers. ``RandomUnstructured`` draws one
number per entry of every array (pruned entries included) and ``RandomStructured`` one
per channel along ``dim`` (all channels); the methods prune the eligible units with the
smallest numbers, ties broken by position. A ``generator`` given instead of a seed is
drawn from in the same way.

These streams are arrayprune's own: they do not reproduce ``torch.nn.utils.prune``. The
PyTorch adapter (``arrayprune.adapters.torch``) does, when no seed or generator is given:
it then makes PyTorch's own calls on PyTorch's global generator, not this module's.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

import array_api_compat as apc
import numpy as np

from . import _lazy_rng

__all__ = ["SEED_LIMIT", "check_random_source", "uniform_like", "uniform_many"]

Array = Any

SEED_LIMIT = 2**63
"""Seeds are ints in ``[0, SEED_LIMIT)``."""


def check_random_source(seed: Any, generator: Any) -> None:
    """Validate a ``seed`` / ``generator`` pair given to a random method.

    A seed is an int in ``[0, 2**63)``, the range that every supported library's
    generator accepts (NumPy, PyTorch, CuPy, JAX keys); the same rule holds for every
    library, so a seed that works on one works on all.

    Raises
    ------
    TypeError
        If `seed` is not an int, or both are given.
    ValueError
        If `seed` is outside ``[0, 2**63)``.
    """
    if seed is not None and generator is not None:
        raise TypeError("pass either seed or generator, not both")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not 0 <= int(seed) < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")


def uniform_like(x: Array, shape: tuple[int, ...], *, seed: int | None = None, generator: Any = None) -> Array:
    """Uniform float32 numbers in ``[0, 1)`` of `shape`, in the namespace and on the device of `x`.

    Parameters
    ----------
    x : array
        Any array: decides the library and the device.
    shape : tuple of int
        Shape of the result.
    seed : int, optional
        Seed for a fresh generator of the library: the same seed gives the same numbers.
    generator : object, optional
        The library's generator (or JAX key) to draw from.

    Returns
    -------
    array
        Random scores.
    """
    shape = tuple(int(s) for s in shape)
    if generator is None:
        generator = _generator_for(x, seed)
    if apc.is_numpy_array(x):
        return _numpy_uniform(shape, generator)
    if apc.is_torch_array(x):
        torch = sys.modules["torch"]
        return torch.rand(shape, generator=generator, device=x.device, dtype=torch.float32)
    if apc.is_cupy_array(x):
        with x.device:
            if hasattr(generator, "random"):
                return generator.random(shape, dtype=sys.modules["cupy"].float32)
            return generator.random_sample(shape, dtype=sys.modules["cupy"].float32)
    if apc.is_jax_array(x):
        jax = sys.modules["jax"]
        return jax.device_put(jax.random.uniform(generator, shape, dtype=jax.numpy.float32), apc.device(x))
    if apc.is_dask_array(x) and _lazy_rng.can_seek(generator):
        return _lazy_rng.uniform(x, shape, generator)  # NumPy's numbers, drawn per block
    xp = apc.array_namespace(x)
    return xp.asarray(_numpy_uniform(shape, generator), device=apc.device(x))


def _numpy_uniform(shape: tuple[int, ...], generator: Any) -> np.ndarray:
    if isinstance(generator, np.random.Generator):
        return generator.random(shape, dtype=np.float32)
    if isinstance(generator, np.random.RandomState):
        return generator.random_sample(shape).astype(np.float32)
    raise TypeError(f"unsupported generator for NumPy arrays: {type(generator).__name__}")


def uniform_many(
    arrays: list[Array], shapes: list[tuple[int, ...]], *, seed: int | None = None, generator: Any = None
) -> list[Array]:
    """Independent uniform arrays of the given shapes, from one stream.

    Drawing each array from a fresh generator with the same seed would give arrays of
    one shape identical numbers; here one generator (or one JAX key, split) serves all,
    so the draws are independent and the whole sequence is reproducible from `seed`.

    Parameters
    ----------
    arrays : list of arrays
        Decide the library and device (all of one library).
    shapes : list of tuple of int
        One shape per result.
    seed, generator
        As for :func:`uniform_like`.

    Returns
    -------
    list of arrays
        float32 numbers in ``[0, 1)``.
    """
    if not arrays:
        return []
    if generator is None:
        generator = _generator_for(arrays[0], seed)
    if apc.is_jax_array(arrays[0]):
        keys = sys.modules["jax"].random.split(generator, len(arrays))
        return [uniform_like(a, s, generator=k) for a, s, k in zip(arrays, shapes, keys, strict=True)]
    return [uniform_like(a, s, generator=generator) for a, s in zip(arrays, shapes, strict=True)]


def _generator_for(x: Array, seed: int | None) -> Any:
    """What draws for `x`: a fresh generator of its library (JAX: a key) seeded with `seed`.

    Without a seed: the library's default source, PyTorch's global generator (None) or
    fresh entropy elsewhere.
    """
    if apc.is_torch_array(x):
        return None if seed is None else sys.modules["torch"].Generator(device=x.device).manual_seed(int(seed))
    if apc.is_cupy_array(x):
        with x.device:
            return sys.modules["cupy"].random.default_rng(seed)
    if apc.is_jax_array(x):
        entropy = int(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        return sys.modules["jax"].random.key(entropy)
    return np.random.default_rng(seed)
