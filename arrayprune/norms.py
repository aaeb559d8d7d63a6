"""Norms of the channels of an array, with the meaning of ``p`` in ``torch.norm``."""

from __future__ import annotations

import math
import numbers
from typing import Any

from ._namespace import namespace

__all__ = ["channel_norms"]

Array = Any


def channel_norms(t: Array, n: Any, dim: int) -> Array:
    """Norm of every channel of `t` along `dim`, over all its other dimensions.

    Parameters
    ----------
    t : array
        Array with at least two dimensions.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        The order of the norm, as ``p`` in :func:`torch.norm`: a number gives the vector
        p-norm of each channel's entries (``inf``: largest magnitude, ``-inf``: smallest,
        ``0``: number of non-zeros), ``'fro'`` the 2-norm, ``'nuc'`` the nuclear norm of
        each channel seen as a matrix (three-dimensional `t` only).
    dim : int
        Non-negative channel axis.

    Returns
    -------
    array
        One norm per channel, shape ``(t.shape[dim],)``. Half-precision inputs are
        accumulated in float32 and the result rounded back, as PyTorch does.

    Raises
    ------
    ValueError
        If `n` is not a valid order, or ``'nuc'`` is asked of an array that is not 3-D.
    """
    xp = namespace(t)
    others = tuple(d for d in range(t.ndim) if d != dim)
    wide = t.dtype == xp.float32 or t.dtype == xp.float64
    floating = wide or xp.isdtype(t.dtype, "real floating")
    narrow = not wide
    work = xp.astype(t, xp.float32) if narrow else t
    if n == "nuc":
        if t.ndim != 3:
            raise ValueError(
                "the nuclear norm ('nuc') needs exactly two dimensions besides the channel "
                f"dimension; got a tensor of shape {tuple(t.shape)}"
            )
        norms = xp.linalg.matrix_norm(xp.permute_dims(work, (dim, *others)), ord="nuc")
    elif dim == 0 and _order(n) == 2.0 and hasattr(xp, "vecdot"):
        # Leading channels: each channel is a contiguous row, and a fused dot product of
        # the row with itself needs no squared temporary (several times faster).
        rows = xp.reshape(work, (t.shape[0], -1))
        norms = xp.sqrt(xp.vecdot(rows, rows))
    else:
        norms = _vector_norm(xp, work, others, _order(n))
    return xp.astype(norms, t.dtype) if floating and narrow else norms


def _order(n: Any) -> float:
    if n == "fro":
        return 2.0
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or math.isnan(n):
        raise ValueError(f"invalid norm order n={n!r}: use a number, inf, -inf, 'fro' or 'nuc'")
    return float(n)


def _vector_norm(xp: Any, x: Array, axes: tuple[int, ...], p: float) -> Array:
    linalg = getattr(xp, "linalg", None)
    if linalg is not None and hasattr(linalg, "vector_norm"):
        return linalg.vector_norm(x, axis=axes, ord=p)
    a = xp.abs(x)  # pragma: no cover - every supported library has linalg
    if p == math.inf:
        return xp.max(a, axis=axes)
    if p == -math.inf:
        return xp.min(a, axis=axes)
    if p == 0:
        return xp.sum(xp.astype(a != 0, x.dtype), axis=axes)
    return xp.sum(a**p, axis=axes) ** (1.0 / p)
