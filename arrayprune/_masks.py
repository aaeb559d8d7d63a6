"""Small mask helpers shared by the methods: creation, combination, eligibility."""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as apc

from ._namespace import check_known_shape, namespace
from ._tracing import DATA_DEPENDENT, is_traced

Array = Any


def ones_mask(t: Array) -> Array:
    """A boolean mask of ones shaped like `t`, in its namespace and on its device."""
    xp = namespace(t)
    return xp.ones(t.shape, dtype=xp.bool, device=apc.device(t))


def mask_or_ones(t: Array, default_mask: Array | None) -> Array:
    """`default_mask`, or a boolean mask of ones shaped like `t` if it is None.

    ``default_mask=None`` means the same everywhere in the core: nothing was pruned
    before.
    """
    if default_mask is None:
        return ones_mask(t)
    check_same_shape(t, default_mask, "default_mask")
    return default_mask


def is_bool(x: Array) -> bool:
    """Whether `x` has a boolean dtype."""
    return x.dtype == namespace(x).bool


def eligible(mask: Array) -> Array:
    """Entries a new unstructured method may still prune: where the mask equals 1."""
    if is_bool(mask):
        return mask
    return mask == 1


def apply_keep(default_mask: Array, keep: Array, *, owned: bool = True) -> Array:
    """Zero `default_mask` where the boolean `keep` is False, keeping its dtype.

    `keep` may also be shaped to broadcast against `default_mask` (one entry per
    channel). When it has the full shape and is `owned` (a fresh array of the caller's,
    not a view of anything else) the result reuses its memory (immutable arrays such as
    JAX's simply rebind); pass ``owned=False`` for views, such as broadcast ones.
    """
    xp = namespace(default_mask)
    if not owned or tuple(keep.shape) != tuple(default_mask.shape):
        if is_bool(default_mask):
            return default_mask & keep
        return default_mask * xp.astype(keep, default_mask.dtype)
    if is_bool(default_mask):
        keep &= default_mask
        return keep
    out = xp.astype(keep, default_mask.dtype)
    out *= default_mask
    return out


def size(x: Array) -> int:
    """Number of entries of `x` (``x.size`` is a method on PyTorch tensors).

    Raises
    ------
    ValueError
        If the shape holds unknown lengths (a Dask array of unknown chunk sizes).
    """
    n = math.prod(x.shape)
    if n != n:
        check_known_shape(x)
    return n


def count_true(x: Array) -> int:
    """Number of True entries of a boolean array, as a Python int.

    Raises
    ------
    TypeError
        If `x` is traced by ``jax.jit``: its count is unknown while JAX traces.
    """
    count = known_count(x)
    if count is None:
        raise TypeError(DATA_DEPENDENT)
    return count


def known_count(x: Array) -> int | None:
    """Number of True entries of a boolean array, or None inside ``jax.jit`` (unknown).

    The count itself tells: inside ``jax.jit`` it is traced even if `x` is a constant.
    """
    count = namespace(x).count_nonzero(x)
    return None if is_traced(count) else int(count)


def check_same_shape(t: Array, other: Array, what: str) -> None:
    """Raise ValueError unless `other` has the shape of `t`."""
    if tuple(other.shape) != tuple(t.shape):
        raise ValueError(
            f"{what} should have the same shape as the tensor to prune: "
            f"got {tuple(other.shape)}, expected {tuple(t.shape)}"
        )
