"""Pattern sparsity beyond ``torch.nn.utils.prune``: N:M groups and whole blocks.

Both methods respect the ``default_mask`` inside :meth:`compute_mask` itself: entries
already pruned stay pruned and count first. Their patterns take the whole array
(``PATTERN.whole_array``, PyTorch's ``PRUNING_TYPE = 'global'``), so a
:class:`~arrayprune.PruningContainer` (arrayprune's or PyTorch's) hands them the whole
array and its mask, and they combine with every other method. Blocks are units of an
amount, so :class:`BlockUnstructured` follows sparsity schedules; an N:M pattern has no
amount and does not.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar

import array_api_compat as apc
import array_api_extra as xpx

from . import amount as _amount
from . import method_parts as _parts
from ._masks import apply_keep, check_same_shape, count_true, eligible, known_count, mask_or_ones
from ._namespace import check_known_shape, namespace
from ._tracing import is_traced
from .methods import AmountPruningMethod, BasePruningMethod
from .selection import smallest_magnitude_keep
from .selection.portable import magnitude_keys

__all__ = ["NMStructured", "BlockUnstructured", "is_nm_sparse"]

Array = Any


def _check_nm(n: Any, m: Any) -> tuple[int, int]:
    for name, v in (("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if m < 1 or not 0 <= n <= m:
        raise ValueError(f"need 0 <= n <= m and m >= 1 for n:m sparsity, got {n}:{m}")
    return int(n), int(m)


def _to_last(xp: Any, x: Array, dim: int) -> Array:
    order = tuple(d for d in range(x.ndim) if d != dim) + (dim,)
    return xp.permute_dims(x, order)


def _from_last(xp: Any, x: Array, dim: int) -> Array:
    order = tuple(d for d in range(x.ndim) if d != dim) + (dim,)
    return xp.permute_dims(x, tuple(order.index(d) for d in range(x.ndim)))


class NMStructured(BasePruningMethod):
    """Prune `n` of every `m` consecutive entries along `dim` (2:4 by default).

    In each group of `m` consecutive entries the `n` of smallest score are pruned
    (entries already pruned count first; ties by position; NaN above +inf), so every
    group keeps at most ``m - n`` non-zeros. A trailing group of ``r < m`` entries
    also keeps at most ``m - n``.

    Parameters
    ----------
    n : int, default 2
        Entries pruned per group.
    m : int, default 4
        Group length.
    dim : int, default -1
        Axis along which groups run (the input dimension of a linear weight is -1).
    """

    PRUNING_TYPE = "global"
    SCORE: ClassVar[_parts.Score] = _parts.MAGNITUDE
    PATTERN: ClassVar[_parts.Pattern] = _parts.N_OF_M
    FLAGS = {
        "n": _parts.Flag("--nm", str, "N:M, N zeros in every M consecutive entries"),
        "m": _parts.Flag("--nm", str, "N:M, N zeros in every M consecutive entries"),
        "dim": _parts.Flag("--dim", int, "the axis of the groups (default: each weight's reduction axis)"),
    }

    def __init__(self, n: int = 2, m: int = 4, dim: int = -1):
        self.n, self.m = _check_nm(n, m)
        self.dim = dim

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        default_mask = mask_or_ones(t, default_mask)
        if t.ndim == 0:
            raise ValueError("N:M pruning needs at least one dimension")
        xp = namespace(t, default_mask)
        dim = _amount.normalize_dim(t.shape, self.dim)
        keys = magnitude_keys(xp, t, _float_dtype(xp, t.dtype))
        keys = xp.where(eligible(default_mask), keys, xp.asarray(-1, dtype=keys.dtype, device=apc.device(t)))
        keys = _to_last(xp, keys, dim)
        length = keys.shape[-1]
        full = (length // self.m) * self.m
        parts = []
        if full:
            groups = xp.reshape(keys[..., :full], (*keys.shape[:-1], full // self.m, self.m))
            drop = _smallest_in_groups(xp, groups, self.n)
            parts.append(xp.reshape(drop, (*keys.shape[:-1], full)))
        if full < length:
            tail = keys[..., full:]
            n_tail = max(0, tail.shape[-1] - (self.m - self.n))
            parts.append(_smallest_in_groups(xp, tail, n_tail))
        if not parts:  # an empty axis: no groups, nothing to prune
            drop = xp.zeros(keys.shape, dtype=xp.bool, device=apc.device(t))
        else:
            drop = parts[0] if len(parts) == 1 else xp.concat(parts, axis=-1)
        return apply_keep(default_mask, _from_last(xp, ~drop, dim))


def _float_dtype(xp: Any, dtype: Any) -> Any:
    """`dtype` if it is floating, else float32: the dtype magnitudes are compared in."""
    return dtype if xp.isdtype(dtype, "real floating") else xp.float32


def _magnitudes(xp: Any, t: Array) -> Array:
    """``|t|`` in a floating dtype (float32 for other dtypes)."""
    return xp.astype(xp.abs(t), _float_dtype(xp, t.dtype), copy=False)


#: Groups up to this long are ranked by pairwise comparisons (elementwise, so Dask keeps
#: its chunks); longer ones by a sort along the group, whose cost grows as ``m log m``.
_PAIRWISE_MAX_M = 8


def _smallest_in_groups(xp: Any, keys: Array, n: int) -> Array:
    """Boolean mask of the `n` smallest entries of each group (last axis).

    Order: value ascending, NaN above +inf, ties by position.
    """
    if n == 0:
        return xp.zeros(keys.shape, dtype=xp.bool, device=apc.device(keys))
    if keys.shape[-1] <= _PAIRWISE_MAX_M:
        return _rank_in_groups(xp, keys) < n
    return _sorted_smallest(xp, keys, n)


def _has_nan(xp: Any, keys: Array) -> tuple[bool, Array | None]:
    """Whether `keys` may hold NaN (always inside ``jax.jit``), and where."""
    if not xp.isdtype(keys.dtype, "real floating"):
        return False, None  # integer keys have no NaN to look for
    nan = xp.isnan(keys)
    return is_traced(keys) or bool(xp.any(nan)), nan


def _sorted_smallest(xp: Any, keys: Array, n: int) -> Array:
    """:func:`_smallest_in_groups` by a sort along each group, for long groups.

    The `n`-th smallest key ``v`` of a group comes from a sort of its values; the group
    drops its keys below ``v`` and, by position, as many of those equal to ``v`` as it
    takes to reach `n`. NaN sorts as +inf, and comes after every +inf.
    """
    device = apc.device(keys)
    has_nan, nan = _has_nan(xp, keys)
    if has_nan:
        keys = xp.where(nan, xp.asarray(xp.inf, dtype=keys.dtype, device=device), keys)
    cut = xp.sort(keys, axis=-1)[..., n - 1 : n]
    below = keys < cut
    equal = keys == cut
    if has_nan and nan is not None:
        equal = equal & ~nan
    need = n - xp.sum(xp.astype(below, xp.int32), axis=-1, keepdims=True)
    drop = below | (equal & (xp.cumulative_sum(xp.astype(equal, xp.int32), axis=-1) <= need))
    if has_nan and nan is not None:  # a cut at +inf: the NaNs come after every +inf, first by position
        need = need - xp.sum(xp.astype(equal, xp.int32), axis=-1, keepdims=True)
        drop = drop | (nan & (xp.cumulative_sum(xp.astype(nan, xp.int32), axis=-1) <= need))
    return drop


def _rank_in_groups(xp: Any, keys: Array) -> Array:
    """Rank of each entry within its group (last axis, short): 0 for the smallest.

    Order: value ascending, NaN above +inf, ties by position. Each pair of positions is
    compared once, on whole columns, so the cost is ``(m - 1) / 2`` comparisons per
    entry and the memory a few columns. Integer keys have no NaN to look for.
    """
    m = keys.shape[-1]
    nan = xp.isnan(keys)
    has_nan = xp.isdtype(keys.dtype, "real floating") and (is_traced(keys) or bool(xp.any(nan)))
    if has_nan:
        keys = xp.where(nan, xp.asarray(xp.inf, dtype=keys.dtype, device=apc.device(keys)), keys)
    cols = [keys[..., j] for j in range(m)]
    flags = [nan[..., j] for j in range(m)] if has_nan else []
    device = apc.device(keys)
    ranks = [xp.zeros(cols[0].shape, dtype=xp.int16, device=device) for _ in range(m)]
    for j in range(1, m):
        for i in range(j):
            # Does position i come before position j? Ties go to the earlier one.
            if has_nan:
                tie = (cols[i] == cols[j]) & (~flags[i] | flags[j])
                first = (cols[i] < cols[j]) | tie
            else:
                first = cols[i] <= cols[j]
            step = xp.astype(first, xp.int16)
            ranks[j] += step
            ranks[i] += 1 - step
    return xp.stack(ranks, axis=-1)


def is_nm_sparse(x: Array, n: int = 2, m: int = 4, dim: int = -1) -> bool:
    """Whether every group of `m` consecutive entries along `dim` has at least `n` zeros.

    A trailing group of ``r < m`` entries must hold at most ``m - n`` non-zeros.

    Parameters
    ----------
    x : array
        Weights (or a mask).
    n, m : int
        The pattern, 2:4 by default.
    dim : int, default -1
        Axis along which groups run.

    Returns
    -------
    bool
        True if the pattern holds everywhere.
    """
    n, m = _check_nm(n, m)
    xp = namespace(x)
    if x.ndim == 0:
        raise ValueError("N:M sparsity needs at least one dimension")
    dim = _amount.normalize_dim(x.shape, dim)
    nonzero = xp.astype(_to_last(xp, x != 0, dim), xp.int32)
    length = nonzero.shape[-1]
    full = (length // m) * m
    if full:
        groups = xp.reshape(nonzero[..., :full], (*nonzero.shape[:-1], full // m, m))
        if bool(xp.any(xp.sum(groups, axis=-1) > m - n)):
            return False
    if full < length and bool(xp.any(xp.sum(nonzero[..., full:], axis=-1) > m - n)):
        return False
    return True


class BlockUnstructured(AmountPruningMethod):
    """Prune whole blocks of a given shape, those of smallest norm first.

    The array is tiled with blocks of `block_shape`, aligned to its trailing dimensions
    (a 2-D shape on a 4-D convolution weight tiles its last two axes; leading axes get
    blocks of size 1). Blocks at the edges may be smaller; a block longer than the array
    along an axis is clipped to it and covers that whole axis (a block larger than the
    array is the whole array), in memory bounded by the array's. A block's score is the power
    mean of its magnitudes, ``(mean |x|^n)^(1/n)`` (``max |x|`` for ``n = inf``), so edge
    blocks are scored on the same footing as full ones. Blocks already entirely pruned
    by the default mask are not counted; `amount` is relative to the remaining blocks.
    Ties go to the lowest block index (row-major over the block grid).

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean (positive, or ``inf``).
    """

    PRUNING_TYPE = "global"
    SCORE: ClassVar[_parts.Score] = _parts.BLOCK_NORM
    PATTERN: ClassVar[_parts.Pattern] = _parts.BLOCKS
    FLAGS = {
        "block_shape": _parts.Flag("--block", str, "block shape, RxC"),
        "n": _parts.Flag("--n", float, "order of the block power mean (default: 1)"),
    }

    def __init__(self, amount: int | float, block_shape: tuple[int, ...], n: float = 1):
        super().__init__(amount)
        shape = tuple(block_shape) if isinstance(block_shape, (tuple, list)) else (block_shape,)
        if not shape or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) for b in shape):
            raise TypeError(f"block_shape must be a tuple of ints, got {block_shape!r}")
        if any(b < 1 for b in shape):
            raise ValueError(f"block sizes must be positive, got {block_shape!r}")
        if isinstance(n, bool) or not isinstance(n, numbers.Real) or not (n > 0):
            raise ValueError(f"n must be a positive number or inf, got {n!r}")
        self.block_shape: tuple[int, ...] = tuple(int(b) for b in shape)
        self.n: float = n

    def _full_block_shape(self, ndim: int) -> tuple[int, ...]:
        if len(self.block_shape) > ndim:
            raise ValueError(
                f"block_shape {self.block_shape} has more dimensions than the array ({ndim})"
            )
        return (1,) * (ndim - len(self.block_shape)) + self.block_shape

    def _grid(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The block shape over all axes of an array of `shape`, and the block grid.

        A block longer than an axis is clipped to it: the same blocks and scores, but
        padding and the expanded mask stay within the array's size.
        """
        block = tuple(min(b, max(d, 1)) for b, d in zip(self._full_block_shape(len(shape)), shape, strict=True))
        return block, tuple(-(-d // b) for d, b in zip(shape, block, strict=True))

    def keep_mask(self, t: Array) -> Array:
        return self.compute_mask(t, None)

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        if default_mask is not None:
            check_same_shape(t, default_mask, "default_mask")
        xp = namespace(t) if default_mask is None else namespace(t, default_mask)
        block, grid = self._grid(tuple(t.shape))
        if math.prod(t.shape) == 0:
            self.count(0)
            return mask_or_ones(t, default_mask)
        keys = _magnitudes(xp, t)
        power = math.inf if self.n == math.inf else float(self.n)
        summed = keys if power in (1.0, math.inf) else keys**power
        totals = _block_reduce(xp, summed, block, grid, "max" if power == math.inf else "sum")
        if power == math.inf:
            scores = totals
        else:
            counts = _block_counts(xp, t.shape, block, grid, keys.dtype, apc.device(t))
            scores = (totals / counts) ** (1.0 / power)
        # Without a default mask every block remains: its count is known inside jax.jit too.
        remaining = None if default_mask is None else _block_reduce(xp, eligible(default_mask), block, grid, "any")
        k = self.count(math.prod(grid) if remaining is None else known_count(remaining))
        keep_blocks = smallest_magnitude_keep([scores], k, [remaining])[0]
        keep = _expand_blocks(xp, keep_blocks, block, t.shape)
        return apply_keep(mask_or_ones(t, default_mask), keep, owned=False)  # may be a broadcast view

    def units(self, t: Array, mask: Array | None = None) -> tuple[int, int]:
        check_known_shape(t)
        block, grid = self._grid(tuple(t.shape))
        n = math.prod(grid)
        if mask is None or n == 0:
            return n, 0
        remaining = _block_reduce(namespace(mask), eligible(mask), block, grid, "any")
        return n, n - count_true(remaining)


def _block_reduce(xp: Any, x: Array, block: tuple[int, ...], grid: tuple[int, ...], how: str) -> Array:
    """Reduce each block of `x` (zero- or False-padded at the edges) to one value."""
    pad = [(0, g * b - d) for d, b, g in zip(x.shape, block, grid, strict=True)]
    if any(p for _, p in pad):
        x = xpx.pad(x, pad, xp=xp)
    split = tuple(v for g, b in zip(grid, block, strict=True) for v in (g, b))
    x = xp.reshape(x, split)
    reduce = {"max": xp.max, "sum": xp.sum, "any": xp.any}[how]
    combine = {"max": xp.maximum, "sum": xp.add, "any": xp.logical_or}[how]
    # One block axis at a time, innermost first. A short axis is folded by combining
    # its slices (whole-array operations); reducing many tiny segments is much slower.
    for axis in range(2 * len(grid) - 1, 0, -2):
        length = x.shape[axis]
        if length > 16:
            x = reduce(x, axis=axis)
            continue
        head = (slice(None),) * axis
        acc = x[head + (0, ...)]
        for i in range(1, length):
            acc = combine(acc, x[head + (i, ...)])
        x = acc
    return x


def _block_counts(
    xp: Any, shape: tuple[int, ...], block: tuple[int, ...], grid: tuple[int, ...], dtype: Any, device: Any
) -> Array:
    """Number of real (unpadded) entries in every block, as an outer product."""
    counts = xp.ones(grid, dtype=dtype, device=device)
    for axis, (d, b, g) in enumerate(zip(shape, block, grid, strict=True)):
        sizes = xp.minimum(
            xp.full((g,), b, dtype=dtype, device=device),
            xp.asarray(d, dtype=dtype, device=device) - xp.arange(g, dtype=dtype, device=device) * b,
        )
        view = [1] * len(grid)
        view[axis] = g
        counts = counts * xp.reshape(sizes, tuple(view))
    return counts


def _expand_blocks(xp: Any, keep_blocks: Array, block: tuple[int, ...], shape: tuple[int, ...]) -> Array:
    """Entry-level mask from a block-level one, cropped to `shape`."""
    grid = keep_blocks.shape
    split = tuple(v for g in grid for v in (g, 1))
    full = tuple(v for g, b in zip(grid, block, strict=True) for v in (g, b))
    expanded = xp.broadcast_to(xp.reshape(keep_blocks, split), full)
    expanded = xp.reshape(expanded, tuple(g * b for g, b in zip(grid, block, strict=True)))
    return expanded[tuple(slice(0, d) for d in shape)]
