"""Selection on accelerators: CuPy arrays and PyTorch tensors off the CPU, with no host sync.

The portable route reads counts back to Python between its steps (the bracket's
candidates, the size of a gather), and each read waits for the device. This route never
reads anything back: every intermediate result, the rank included, stays a small array
on the device, and the Python code only queues kernels.

Keys are the magnitude keys of :class:`~.keys.BitKeys`: a float's bits with the sign
cleared, as signed integers of its width (int16 for float16 and bfloat16, int32 for
float32, int64 for float64). They order like ``|x|``, NaN above +inf, and subnormals by
value (GPU float comparisons flush them to zero; integers compare exactly), so the
order is the host route's on every input. Ineligible entries get the key -1, below every
eligible one.

The k-th smallest key ``T`` comes from a radix select by digits of ``DIGIT_BITS`` bits,
most significant first. Each pass histograms one digit of every key inside the range the
previous passes narrowed down (keys below the range fall in a first bin, keys above in a
last one), and a cumulative sum with ``searchsorted`` of the rank gives the bin holding
it, as a one-entry array. After the last digit, ``T`` and the number of keys below it are
known on the device; one pass writes the masks: keys above ``T`` are kept, and of the
keys equal to ``T`` the first ``need`` in flat order (earlier arrays first) are dropped, by
a running count of them.

Histograms are scatter-adds (``index_add_`` on tensors, ``scatter_add`` on CuPy arrays):
the libraries' own ``bincount`` reads the largest input back to size its output. The
route also runs on CPU tensors and on meta tensors (:func:`keep`), which is how it is
tested without a GPU: a meta tensor has no values, so any read-back would raise.
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import array_api_compat as apc

from .._namespace import namespace, widest_float
from .keys import BitKeys, on_accelerator

__all__ = ["DIGIT_BITS", "RADIX_SIZE", "accepts", "keep", "keep_masks"]

Array = Any

#: Bits per radix digit: a float32 key (31 bits) takes two passes of 16 and 15 bits, a
#: float64 key four, a 16-bit float's one. Wider digits mean fewer passes over the keys
#: and larger histograms (more bins to scan, and to contend for in the scatter-add).
DIGIT_BITS = 16
#: Up to this many entries in total, the k-th key comes from the library's own sort of
#: the keys instead of the radix passes. Not measured yet (``benchmarks/gpu_bench.py``
#: times both): 0 sends every size to the radix select.
RADIX_SIZE = 0


def accepts(scores: list[Array]) -> bool:
    """Whether this route takes the arrays: CuPy arrays or tensors off the CPU."""
    return all(on_accelerator(s) for s in scores)


def keep_masks(scores: list[Array], eligible: list[Array | None], k: int) -> list[Array] | None:
    """Keep masks dropping the `k` eligible entries of smallest magnitude, or None if the
    arrays are not on an accelerator (see :func:`keep`)."""
    if not accepts(scores):
        return None
    return keep(scores, eligible, k)


def keep(scores: list[Array], eligible: list[Array | None], k: int) -> list[Array]:
    """Keep masks shaped like `scores` that drop the `k` eligible entries of smallest magnitude.

    By ``|score|`` ascending, NaN above +inf, subnormals by value, ties by position (over
    several arrays, earlier array first): the masks of the host route, bit for bit.
    Nothing is read back from the device. Takes CuPy arrays and PyTorch tensors on any
    device (CPU and meta tensors too, for tests).

    Parameters
    ----------
    scores : list of arrays
        Arrays of one library and device, any shapes.
    eligible : list of (boolean array or None)
        Per array, the entries that may be dropped; None means all.
    k : int
        Entries to drop. Without eligibility masks it must not exceed the number of
        entries; with them it is checked against the number of entries only (the number
        of eligible ones is not read back): beyond it, every eligible entry is dropped.

    Returns
    -------
    list of arrays
        Boolean arrays shaped like `scores`, on their device.
    """
    xp = namespace(*scores)
    if len(eligible) != len(scores):
        raise ValueError("eligible must have one entry per score array")
    total = sum(math.prod(s.shape) for s in scores)
    if k < 0:
        raise ValueError(f"cannot drop a negative number of entries ({k})")
    if k > total:
        raise ValueError(f"cannot drop {k} of {total} entries")
    device = apc.device(scores[0])
    if k == 0:
        return [xp.ones(s.shape, dtype=xp.bool, device=device) for s in scores]
    select = _RadixSelect(xp, scores, eligible)
    masks = select.masks(k)
    return [xp.reshape(m, s.shape) for m, s in zip(masks, scores, strict=True)]


class _RadixSelect:
    """The keys of several arrays and the passes over them."""

    def __init__(self, xp: Any, scores: list[Array], eligible: list[Array | None]):
        self.xp = xp
        self.device = apc.device(scores[0])
        self.torch = apc.is_torch_array(scores[0])
        dtypes = [s.dtype for s in scores]
        if all(xp.isdtype(d, "real floating") for d in dtypes):
            dtype = xp.result_type(*dtypes)  # widening floats is exact
        else:
            dtype = widest_float(xp, self.device)  # as the portable route converts
        bits = BitKeys(xp, dtype)
        self.key_dtype = bits.dtype
        self.width = xp.iinfo(bits.dtype).bits
        self.max_key = bits.low_bits
        self.eligible = [None if e is None else xp.reshape(e, (-1,)) for e in eligible]
        self.shifted = any(e is not None for e in self.eligible)
        self.keys = []
        minus_one = xp.asarray(-1, dtype=self.key_dtype, device=self.device)
        for s, e in zip(scores, self.eligible, strict=True):
            if self.torch and s.requires_grad:
                s = s.detach()
            flat = xp.astype(xp.reshape(s, (-1,)), dtype, copy=False)
            key = bits.magnitude(flat)
            self.keys.append(key if e is None else xp.where(e, key, minus_one))
        self.total = sum(int(key.shape[0]) for key in self.keys)
        self.counter = xp.int32 if self.total < 2**31 else xp.int64

    # ----------------------------------------------------------------------------------
    # device scalars: one-entry arrays of int64

    def _scalar(self, value: int) -> Array:
        return self.xp.asarray([value], dtype=self.xp.int64, device=self.device)

    def _as_key(self, value: Array) -> Array:
        return self.xp.astype(value, self.key_dtype)

    # ----------------------------------------------------------------------------------

    def masks(self, k: int) -> list[Array]:
        """Keep masks (flat) dropping the `k` smallest eligible keys."""
        threshold, below, kk = self.kth_key(k)
        need = self.xp.astype(kk - below, self.counter)  # keys equal to T that are dropped
        return self.write(threshold, need)

    def kth_key(self, k: int) -> tuple[Array, Array, Array]:
        """The kk-th smallest key ``T`` (kk = `k` + ineligible entries), the number of keys
        below it and kk, as one-entry arrays."""
        if self.total <= RADIX_SIZE:
            return self._kth_key_sorted(k)
        return self._kth_key_radix(k)

    def _kth_key_sorted(self, k: int) -> tuple[Array, Array, Array]:
        """The library's own sort of all keys."""
        xp = self.xp
        keys = xp.concat(self.keys) if len(self.keys) > 1 else self.keys[0]
        ordered = xp.sort(keys)
        kk = self._scalar(k)
        if self.shifted:
            ineligible = xp.astype(xp.sum(xp.astype(keys < 0, xp.int64)), xp.int64)
            kk = xp.minimum(kk + ineligible, self._scalar(self.total))
        threshold = xp.take(ordered, kk - 1)
        below = xp.astype(xp.searchsorted(ordered, threshold, side="left"), xp.int64)
        return threshold, below, kk

    def _kth_key_radix(self, k: int) -> tuple[Array, Array, Array]:
        """Radix select, most significant digit first."""
        xp = self.xp
        digit_bits = min(max(DIGIT_BITS, 1), 30)
        value_bits = self.width - 1
        passes = -(-value_bits // digit_bits)
        first = value_bits - digit_bits * (passes - 1)
        shift = value_bits - first
        # Pass 1: the top digit; ineligible keys (-1) land in bin 0 (offset by one).
        offset = int(self.shifted)
        tops = [key >> shift if shift else key for key in self.keys]
        if offset:
            # Unshifted 16-bit keys are widened first: the NaN key 0x7fff plus one overflows.
            tops = [(t if shift else xp.astype(t, xp.int32)) + offset for t in tops]
        hist = self._histogram(tops, (1 << first) + offset)
        kk = self._scalar(k)
        if self.shifted:
            kk = xp.minimum(kk + hist[:1], self._scalar(self.total))
        below, chosen = self._locate(hist, kk)
        low = xp.clip(chosen - offset, 0, None) << shift  # the smallest key of the chosen bin
        span = shift  # keys in [low, low + 2**span) hold rank kk
        while span > 0:
            shift = max(span - digit_bits, 0)
            # Bin 0: keys below `low`; 1 .. 2**(span-shift): the digit plus one; the last:
            # keys above the range. Clipping first keeps every difference in range.
            start = low - (1 << shift)
            # min(low + 2**span, max_key), without overflowing int64
            end = xp.clip(low, None, self.max_key - (1 << span)) + (1 << span)
            start_key, end_key = self._as_key(start), self._as_key(end)
            digits = [(key.clip(start_key, end_key) - start_key) >> shift for key in self.keys]
            hist = self._histogram(digits, (1 << (span - shift)) + 2)
            below, chosen = self._locate(hist, kk)
            low = low + ((chosen - 1) << shift)
            span = shift
        return self._as_key(low), below, kk

    def _locate(self, hist: Array, kk: Array) -> tuple[Array, Array]:
        """The bin holding rank `kk` and the number of keys in the bins before it."""
        xp = self.xp
        cumulative = xp.cumulative_sum(hist)
        chosen = xp.astype(xp.searchsorted(cumulative, kk, side="left"), xp.int64)
        return xp.take(cumulative, chosen) - xp.take(hist, chosen), chosen

    def _histogram(self, digits: list[Array], bins: int) -> Array:
        """Counts (int64) of the digits of every array, by scatter-add (no read-back)."""
        xp = self.xp
        if self.torch:
            counts = xp.zeros((bins,), dtype=xp.int64, device=self.device)
            one = xp.ones((1,), dtype=xp.int64, device=self.device)
            for d in digits:
                if d.dtype not in (xp.int32, xp.int64):
                    d = xp.astype(d, xp.int32)
                counts.index_add_(0, d, one.expand(d.shape[0]))
            return counts
        counts = xp.zeros((bins,), dtype=xp.uint64, device=self.device)  # CuPy's atomicAdd type
        for d in digits:
            _cupy_scatter_add(counts, d)
        return xp.astype(counts, xp.int64)

    def write(self, threshold: Array, need: Array) -> list[Array]:
        """Keep masks: keys above `threshold`, and of the keys equal to it all but the first
        `need` in flat order; ineligible entries kept."""
        xp = self.xp
        masks = []
        seen = None  # keys equal to the threshold in earlier arrays
        for key, e in zip(self.keys, self.eligible, strict=True):
            if key.shape[0] == 0:
                masks.append(xp.ones((0,), dtype=xp.bool, device=self.device))
                continue
            equal = key == threshold
            running = equal.cumsum(0, dtype=self.counter)
            if seen is not None:
                running = running + seen
            seen = running[-1:]
            keep = (key > threshold) | (equal & (running > need))
            masks.append(keep if e is None else keep | ~e)
        return masks


def _cupy_scatter_add(counts: Array, digits: Array) -> None:
    """``counts[digits] += 1`` with repeated digits counted, on CuPy arrays."""
    add = getattr(counts, "scatter_add", None)
    if add is not None:
        add(digits, 1)
        return
    cupyx = sys.modules.get("cupyx") or importlib.import_module("cupyx")  # pragma: no cover
    cupyx.scatter_add(counts, digits, 1)  # pragma: no cover
