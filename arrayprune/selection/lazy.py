"""Selection on lazy (Dask) arrays: radix select over blocks, masks made per block.

Nothing is sorted, gathered or indexed by a boolean array of unknown length, and every
graph execution reads every block of every array once, all arrays in the same one:

1. the histogram of the first 16-bit digit of the keys (:func:`.radix.magnitude_keys`)
   and the count of ineligible entries, which turns the amount into `k`;
2. one histogram per further digit (:func:`.radix.cut`): none for 16-bit floats, one
   for float32, three for float64. The cut is then known: every key below
   :attr:`.radix.Cut.key` is dropped, and the first :attr:`.radix.Cut.need` equal to it;
3. only when the keys equal to the cut straddle it: per block and per run (a stretch of
   consecutive flat positions, see :mod:`arrayprune._blocks`), how many keys equal the
   cut. Ordered by array, then flat position, they give each run and hence each block
   its quota (:func:`.radix.tie_quotas`); within a block, entries keep their flat
   order, so the block drops the first of its equal keys in its own C order;
4. the masks, returned lazy: ``map_blocks`` drops each block's keys below the cut and
   its quota of equal ones (:class:`.radix.StreamingCut`). Computing them is the last
   execution.

float32 takes 3 executions with the final compute (4 if ties straddle the cut), float64
5 (6), float16 2 (3). Inputs of at most :data:`IN_MEMORY_SIZE` entries in all take one
execution instead: they are computed and selected in memory, and the masks come back
as Dask arrays of the same chunks. Dask is never imported here: its modules are taken
from ``sys.modules``, where the arrays handed in have put them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import array_api_compat as apc
import numpy as np

from .._blocks import block_location, lead_axis, run_starts
from .._namespace import check_known_shape
from . import host, radix
from .bracket import check_rank

__all__ = [
    "IN_MEMORY_SIZE",
    "as_lazy",
    "as_scalar",
    "defers_count",
    "fits_in_memory",
    "gather",
    "is_lazy",
    "keep_masks",
    "kth_smallest",
]

Array = Any
#: The number of entries to drop, or a function of the number of eligible entries that
#: gives it (an amount); lazy arrays count those in their first pass.
Count = int | Callable[[int], int]

#: Up to this many entries in all, lazy inputs are computed once and selected in memory.
#: Read at call time: tests set it to 0 to run the chunked path on small arrays.
IN_MEMORY_SIZE = 1 << 22
#: Partial histograms summed per task of the reduction tree.
_FAN_IN = 16
#: Entries per slice when a block is turned into keys (see `_key_slices`).
_SLICE = 1 << 18


def is_lazy(x: Array) -> bool:
    """Whether `x` is a lazy (Dask) array."""
    return apc.is_dask_array(x)


def defers_count(scores: Sequence[Array], eligible: Sequence[Array | None]) -> bool:
    """Whether counting the eligible entries first would cost a graph execution of its own.

    True for lazy arrays with eligibility masks: pass the amount as a function of that
    count (:data:`Count`) instead, and the first pass counts them.
    """
    return bool(scores) and is_lazy(scores[0]) and any(e is not None for e in eligible)


def fits_in_memory(arrays: Sequence[Array]) -> bool:
    """Whether `arrays` are small enough to be computed and selected in memory.

    Raises
    ------
    ValueError
        If an array has chunks of unknown size (the result of boolean indexing, say).
    """
    for a in arrays:
        check_known_shape(a)
    return sum(math.prod(a.shape) for a in arrays) <= IN_MEMORY_SIZE


def gather(scores: Sequence[Array], eligible: Sequence[Array | None], k: Count) -> tuple[list, list, int]:
    """Scores and eligibility masks computed into memory, in one graph execution, and `k`.

    Returns
    -------
    tuple
        NumPy scores, NumPy masks (or None), and `k` as an int.
    """
    host_scores, host_eligible = _dask().compute(list(scores), list(eligible))
    if callable(k):
        pairs = zip(host_scores, host_eligible, strict=True)
        k = k(sum(s.size if e is None else int(np.count_nonzero(e)) for s, e in pairs))
    return list(host_scores), list(host_eligible), k


def as_lazy(values: Sequence[np.ndarray], like: Sequence[Array]) -> list[Array]:
    """In-memory results as Dask arrays, chunked like `like` (one-to-one)."""
    da = _dask_array()
    return [da.from_array(np.asarray(v), chunks=a.chunks) for v, a in zip(values, like, strict=True)]


def as_scalar(value: Any) -> Array:
    """An in-memory scalar (NumPy scalar or 0-D array) as a 0-D Dask array of its dtype."""
    return _dask_array().from_array(np.asarray(value))


def keep_masks(scores: Sequence[Array], eligible: Sequence[Array | None], k: Count) -> list[Array]:
    """Lazy keep masks dropping the `k` eligible entries of smallest magnitude.

    Parameters
    ----------
    scores : sequence of Dask arrays
        Ranked together (magnitude ascending, NaN above +inf, ties by array then flat
        position), each of any shape and chunks.
    eligible : sequence of (boolean array or None)
        Per array, the entries that may be dropped (None: all); rechunked like its
        array.
    k : int or callable
        How many to drop, or a function of the number of eligible entries giving it.

    Returns
    -------
    list of Dask arrays
        Boolean, chunked like `scores`, False exactly at the dropped entries.

    Raises
    ------
    ValueError
        If `k` is negative or exceeds the number of eligible entries.
    """
    blocks = _Blocks(list(scores), list(eligible))
    if not callable(k) and k == 0:
        return blocks.all_kept()
    found = blocks.cut(k)
    if found is None:
        return blocks.all_kept()
    return blocks.masks(found.key, blocks.quotas(found))


def kth_smallest(x: Array, k: int) -> Array:
    """The `k`-th smallest value of a lazy real or boolean array, NaN above +inf.

    One graph execution per 16-bit digit of the dtype; the value comes back as a 0-D
    Dask array of the dtype of `x`.

    Raises
    ------
    ValueError
        If `k` is out of range.
    TypeError
        If `x` is neither real nor boolean.
    """
    total = math.prod(x.shape)
    check_rank(k, total)
    select = _value_select(np.zeros(0, dtype=x.dtype))
    parts = list(x.to_delayed().ravel())
    delayed = _dask().delayed

    def histogram(prefix: int, shift: int, width: int) -> np.ndarray:
        per_block = [delayed(_value_digit_histogram)(b, prefix, shift, width) for b in parts]
        return _compute_sum(per_block)

    found = radix.cut(histogram, 8 * x.dtype.itemsize, k, total)
    bits = np.asarray(select.bits_of(select.bits[0].dtype.type(found.key)))
    return as_scalar(bits.view(x.dtype))


class _Cut(NamedTuple):
    """Where the cut is (as :class:`.radix.Cut`), and how many keys in all equal its key."""

    key: int
    need: int
    equal: int


class _Blocks:
    """The blocks of arrays ranked together, in one space of magnitude keys."""

    def __init__(self, arrays: list[Array], eligible: list[Array | None]):
        if len(eligible) != len(arrays):
            raise ValueError("eligible must have one entry per score array")
        self.arrays = arrays
        self.eligible = [None if e is None else _chunked_like(e, a) for e, a in zip(eligible, arrays, strict=True)]
        self.kinds = [_key_kind(a.dtype) for a in arrays]
        self.shifted = any(e is not None for e in self.eligible)
        self.bits = radix.key_bits(self.kinds, shifted=self.shifted)
        self.total = sum(math.prod(a.shape) for a in arrays)
        self.parts = []  # (array, block index, block, its eligibility): delayed, flat order of blocks
        for i, (a, e) in enumerate(zip(arrays, self.eligible, strict=True)):
            blocks = a.to_delayed().ravel()
            masks = [None] * blocks.size if e is None else e.to_delayed().ravel()
            for index, b, m in zip(np.ndindex(*a.numblocks), blocks, masks, strict=True):
                self.parts.append((i, index, b, m))

    def _per_block(self, fn: Callable, *args: Any) -> list:
        """``fn(block, eligible, kind, bits, shifted, *args)`` for every block, delayed."""
        delayed = _dask().delayed
        return [delayed(fn)(b, m, self.kinds[i], self.bits, self.shifted, *args) for i, _, b, m in self.parts]

    def cut(self, k: Count) -> _Cut | None:
        """The cut of the `k` smallest eligible keys; None if `k` turns out to be 0."""
        width = min(radix.DIGIT_BITS, self.bits)
        first = (0, self.bits - width, width)
        counts, ineligible = _compute_sum(self._per_block(_first_digit_histogram, *first[1:]))
        available = self.total - int(ineligible)
        k = k(available) if callable(k) else k
        if not 0 <= k <= available:
            raise ValueError(f"cannot drop {k} of {available} entries")
        if k == 0:
            return None
        known = {first: counts}
        last: list[np.ndarray] = []

        def histogram(prefix: int, shift: int, width: int) -> np.ndarray:
            found = known.pop((prefix, shift, width), None)
            if found is None:
                found = _compute_sum(self._per_block(_digit_histogram, prefix, shift, width))
            last[:] = [found]
            return found

        found = radix.cut(histogram, self.bits, k + int(ineligible), self.total)
        equal = int(last[0][found.key & (last[0].size - 1)])  # the last digit has shift 0
        return _Cut(found.key, found.need, equal)

    def quotas(self, found: _Cut) -> list[np.ndarray]:
        """Per array, per block (shaped like its grid of blocks): equal keys it drops."""
        if found.need == found.equal:  # every key equal to the cut goes: no tie pass
            return [np.full(a.numblocks, found.need, dtype=np.int64) for a in self.arrays]
        where, ties, owner = self._tie_runs(found.key)
        order = np.lexsort(where[::-1])  # runs by array, then flat position
        per_run = radix.tie_quotas(ties[order].tolist(), found.need)
        per_block = np.zeros(len(self.parts), dtype=np.int64)
        np.add.at(per_block, owner[order], np.asarray(per_run, dtype=np.int64))
        out, offset = [], 0
        for a in self.arrays:
            n = math.prod(a.numblocks)
            out.append(per_block[offset : offset + n].reshape(a.numblocks))
            offset += n
        return out

    def _tie_runs(self, key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The runs holding keys equal to `key`, in one graph execution.

        Returns
        -------
        where : ndarray, shape (2, runs)
            Per run, its array and its first flat position: position order is
            lexicographic order of these.
        ties : ndarray
            Per run, its number of keys equal to `key`.
        owner : ndarray
            Per run, its block (index into ``self.parts``).
        """
        delayed = _dask().delayed
        per_block = _dask().compute(
            *[
                delayed(_tie_counts)(b, m, self.kinds[i], self.bits, self.shifted, key, self._lead(i, index))
                for i, index, b, m in self.parts
            ]
        )
        where, ties, owner = [], [], []
        for n, ((i, index, _, _), (runs, counts)) in enumerate(zip(self.parts, per_block, strict=True)):
            if counts.size:
                a = self.arrays[i]
                starts, _ = run_starts(a.shape, block_location(a.chunks, index))
                where.append(np.stack([np.full(counts.size, i, dtype=np.int64), starts[runs]]))
                ties.append(counts)
                owner.append(np.full(counts.size, n, dtype=np.int64))
        return np.concatenate(where, axis=1), np.concatenate(ties), np.concatenate(owner)

    def _lead(self, i: int, index: tuple[int, ...]) -> int:
        """The lead axis (:func:`arrayprune._blocks.lead_axis`) of a block of array `i`."""
        a = self.arrays[i]
        return lead_axis(a.shape, block_location(a.chunks, index))

    def masks(self, key: int, quotas: list[np.ndarray]) -> list[Array]:
        """The lazy keep masks of a cut at `key`, with per-block quotas of equal keys."""
        da = _dask_array()
        out = []
        for a, e, kind, q in zip(self.arrays, self.eligible, self.kinds, quotas, strict=True):
            args = [a, da.from_array(q, chunks=(1,) * q.ndim)] + ([] if e is None else [e])
            meta = np.empty((0,) * a.ndim, dtype=bool)
            out.append(
                da.map_blocks(
                    _keep_block, *args, dtype=bool, meta=meta, kind=kind, bits=self.bits, shifted=self.shifted, key=key
                )
            )
        return out

    def all_kept(self) -> list[Array]:
        da = _dask_array()
        return [da.ones(a.shape, dtype=bool, chunks=a.chunks) for a in self.arrays]


# ---------------------------------------------------------------------------------------
# Per-block work (module-level functions: picklable for distributed schedulers)
# ---------------------------------------------------------------------------------------


def _key_slices(
    block: np.ndarray, eligible: np.ndarray | None, kind: str, bits: int, shifted: bool
) -> Iterator[tuple[slice, np.ndarray]]:
    """The block's magnitude keys, in the key space of all arrays, slice by flat slice.

    Slices of `_SLICE` entries keep the keys and their temporaries in cache: on a block
    of millions of entries that is several times faster, and threads do not contend
    for fresh memory.
    """
    flat = np.asarray(block).reshape(-1)
    mask = None if eligible is None else np.asarray(eligible).reshape(-1)
    for start in range(0, flat.size, _SLICE):
        where = slice(start, start + _SLICE)
        part = flat[where]
        if part.dtype.name != kind:  # integers, booleans: ranked as float64, as in memory
            part = part.astype(np.float64)
        if mask is not None:
            yield where, radix.magnitude_keys(part, kind, bits, mask[where])
        else:
            yield where, radix.magnitude_keys(part, kind, bits, np.ones(part.size, dtype=bool) if shifted else None)


def _first_digit_histogram(block, eligible, kind, bits, shifted, shift, width) -> tuple[np.ndarray, int]:
    ineligible = 0 if eligible is None else int(eligible.size - np.count_nonzero(eligible))
    return _digit_histogram(block, eligible, kind, bits, shifted, 0, shift, width), ineligible


def _digit_histogram(block, eligible, kind, bits, shifted, prefix, shift, width) -> np.ndarray:
    counts = np.zeros(1 << width, dtype=np.int64)
    for _, keys in _key_slices(block, eligible, kind, bits, shifted):
        counts += radix.digit_histogram(keys, prefix, shift, width)
    return counts


def _tie_counts(block, eligible, kind, bits, shifted, key, lead) -> tuple[np.ndarray, np.ndarray]:
    """Runs of the block holding keys equal to `key`: their indices and counts."""
    equal = np.empty(np.size(block), dtype=bool)
    for where, keys in _key_slices(block, eligible, kind, bits, shifted):
        np.equal(keys, keys.dtype.type(key), out=equal[where])
    equal = equal.reshape(np.shape(block))
    per_run = np.count_nonzero(equal, axis=tuple(range(lead, equal.ndim))).reshape(-1)
    which = np.flatnonzero(per_run)
    return which, per_run[which].astype(np.int64)


def _keep_block(block, quota, eligible=None, *, kind, bits, shifted, key) -> np.ndarray:
    """Keep mask of a block: keys above the cut, and equal ones past the block's quota."""
    keep = np.empty(np.size(block), dtype=bool)
    cut = radix.StreamingCut(radix.Cut(key, 0, int(np.asarray(quota).reshape(-1)[0])))
    for where, keys in _key_slices(block, eligible, kind, bits, shifted):
        keep[where] = cut.keep(keys)
    if eligible is not None:
        keep |= ~np.asarray(eligible).reshape(-1)
    return keep.reshape(np.shape(block))


def _value_digit_histogram(block, prefix: int, shift: int, width: int) -> np.ndarray:
    select = _value_select(np.asarray(block))
    return radix.digit_histogram(select._value_keys(select.bits[0], None), prefix, shift, width)


def _value_select(x: np.ndarray) -> host.NumpyKeyStorage:
    """Host's selection by value on `x`: its keys, and the values of keys."""
    view = host._host_values(x)
    if view is None:
        raise TypeError(f"kth_smallest needs a real or boolean array, got {x.dtype}")
    return host.NumpyKeyStorage([view.bits], [None], by_value=view.kind, inf=view.inf)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _key_kind(dtype: Any) -> str:
    """The dtype name whose magnitude keys rank an array: its own if floating, else float64."""
    name = np.dtype(dtype).name
    return name if name in ("float16", "float32", "float64") else "float64"


def _chunked_like(mask: Array, like: Array) -> Array:
    """`mask` as a Dask array chunked like `like`."""
    if not is_lazy(mask):
        return _dask_array().from_array(np.asarray(mask), chunks=like.chunks)
    return mask if mask.chunks == like.chunks else mask.rechunk(like.chunks)


def _add(parts: Sequence[Any]) -> Any:
    """Sum of histograms (or of tuples of them, entry by entry)."""
    if isinstance(parts[0], tuple):
        return tuple(_add(column) for column in zip(*parts, strict=True))
    total = np.array(parts[0], copy=True)
    for p in parts[1:]:
        total += p
    return total


def _compute_sum(per_block: list) -> Any:
    """Compute the sum of delayed per-block results, as a tree, in one graph execution."""
    dask = _dask()
    while len(per_block) > 1:
        per_block = [dask.delayed(_add)(per_block[i : i + _FAN_IN]) for i in range(0, len(per_block), _FAN_IN)]
    (total,) = dask.compute(per_block[0])
    return total


def _dask() -> Any:
    return sys.modules["dask"]


def _dask_array() -> Any:
    return sys.modules["dask.array"]
