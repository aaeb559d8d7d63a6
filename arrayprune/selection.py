"""Order statistics: the one operation the Array API standard lacks.

Every pruning mask in arrayprune comes down to "drop the `k` entries of smallest
magnitude", over one array or over many at once. The standard offers ``sort`` but no
selection, and sorting a large array is far slower than reading it. This module holds
that operation, once, with

* a NumPy fast path (also used for PyTorch CPU tensors through zero-copy views): a
  *sample-bracket select* that streams over the data in cache-sized chunks, working on
  the integer bit patterns of the floats;
* a portable path written against the standard alone (CuPy, CUDA tensors, JAX,
  array-api-strict, ...), which runs the same bracket algorithm with whole-array
  operations;
* an exact path (partition or sort) for small inputs and for the rare case where the
  bracket misses.

Order is total and identical on every backend: magnitudes ascending, NaN above +inf,
ties broken by position (earlier array first, then lowest flat index).

The sample-bracket select
-------------------------
Sort a small stratified sample of the magnitudes and read off two values ``lo`` and
``hi`` that enclose the k-th smallest with overwhelming probability. One pass over the
data counts the entries below ``lo``, marks those above ``hi`` as kept, and collects the
few entries in ``[lo, hi]`` (the candidates) with their positions. The k-th smallest is
then selected exactly among the candidates. If the bracket missed, the scan is repeated
with the bracket extended to the side that missed, which always succeeds. Main-memory
traffic is one read of the data and one write of the mask; nothing is concatenated.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import array_api_compat as apc
import array_api_extra as xpx
import numpy as np

from ._namespace import namespace, widest_float

__all__ = ["kth_smallest", "smallest_magnitude_keep"]

Array = Any

#: Below this many entries in total, select exactly without a bracket. NumPy's SIMD
#: partition wins while the data stays in the last-level cache.
SMALL_SIZE = 1 << 22
#: Entries per chunk in the NumPy scan (fits the L2 cache with its temporaries).
CHUNK_SIZE = 1 << 16
#: The stratified sample holds one entry in SAMPLE_STRIDE, within these bounds. A
#: larger sample narrows the bracket, and gathering the candidates (mispredicted
#: branches, one per candidate) costs more than sorting the sample.
SAMPLE_STRIDE = 256
SAMPLE_BOUNDS = (1 << 12, 1 << 17)
#: Half-width of the bracket, in standard deviations of the sample rank.
BRACKET_SIGMAS = 5.0


# --------------------------------------------------------------------------------------
# k-th smallest value
# --------------------------------------------------------------------------------------


def kth_smallest(x: Array, k: int, /) -> Array:
    """Return the `k`-th smallest value of `x` (1-based), NaN ranking above +inf.

    Parameters
    ----------
    x : array
        Any Array API array; it is flattened.
    k : int
        Rank, ``1 <= k <= x.size``.

    Returns
    -------
    array
        A 0-D array of the namespace, dtype and device of `x`.

    Raises
    ------
    ValueError
        If `k` is out of range.
    """
    xp = namespace(x)
    flat = xp.reshape(x, (-1,))
    n = flat.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k={k} is out of range for an array of {n} entries")
    if apc.is_numpy_array(flat) or apc.is_cupy_array(flat):
        native = sys.modules[type(flat).__module__.split(".")[0]]
        return native.partition(flat, k - 1)[k - 1]
    if apc.is_torch_array(flat):
        return sys.modules["torch"].kthvalue(flat, k).values
    if xp.isdtype(flat.dtype, "real floating"):
        nan = xp.isnan(flat)
        n_nan = int(xp.count_nonzero(nan))
        if k > n - n_nan:
            return xp.asarray(xp.nan, dtype=flat.dtype, device=apc.device(flat))
        flat = xp.where(nan, xp.asarray(xp.inf, dtype=flat.dtype), flat)
    return xp.sort(flat)[k - 1]


# --------------------------------------------------------------------------------------
# Keep masks: drop the k smallest magnitudes
# --------------------------------------------------------------------------------------


def smallest_magnitude_keep(
    scores: Sequence[Array],
    k: int,
    eligible: Sequence[Array | None] | None = None,
) -> list[Array]:
    """Boolean keep masks that drop the `k` eligible entries of smallest magnitude.

    The arrays are ranked together, as if concatenated (without concatenating them):
    by ``|score|`` ascending, NaN above +inf, ties by position.

    Parameters
    ----------
    scores : sequence of arrays
        Arrays of one namespace and device, any shapes.
    k : int
        Number of entries to drop, ``0 <= k <= number of eligible entries``.
    eligible : sequence of (boolean array or None), optional
        Per array, the entries that may be dropped (same shape as the scores); ``None``
        means all. Ineligible entries are neither counted nor dropped.

    Returns
    -------
    list of arrays
        Boolean arrays shaped like `scores`: False exactly at the `k` dropped entries.
    """
    if k < 0:
        raise ValueError(f"cannot drop a negative number of entries ({k})")
    if len(scores) == 1 and (eligible is None or eligible[0] is None):
        # The commonest call, one host array of moderate size: straight to the exact path.
        x = scores[0]
        if type(x) is np.ndarray and x.ndim == 1 and x.dtype in _NATIVE_FLOATS and x.size <= SMALL_SIZE:
            return [_small_keep_float(x, k)]  # a flat NumPy vector: the leanest path
        one = _host_bits(x)
        if one is not None and one.size <= SMALL_SIZE:
            return [_from_host(_small_keep(one, k), scores[0])]
    scores = list(scores)
    elig = [None] * len(scores) if eligible is None else list(eligible)
    if len(elig) != len(scores):
        raise ValueError("eligible must have one entry per score array")
    # The host fast path comes first and never resolves a namespace: on small arrays
    # that lookup would cost more than the selection itself.
    bits = [_host_bits(s) for s in scores]
    # Bit patterns only compare within one float format (float16 and bfloat16 share a
    # width, not an encoding): mixed dtypes take the portable path, which promotes.
    if all(b is not None for b in bits) and len({str(s.dtype) for s in scores}) == 1:
        host_elig = [None if e is None else _host_bool(e) for e in elig]
        if all((e is None) == (h is None) for e, h in zip(elig, host_elig, strict=True)):
            keep = _NumpyBitsSelect(bits, host_elig).keep(k)
            return [_from_host(m, s) for m, s in zip(keep, scores, strict=True)]
    xp = namespace(*scores)
    if k == 0:
        return [xp.ones(s.shape, dtype=xp.bool, device=apc.device(s)) for s in scores]
    keep = _PortableSelect(xp, scores, elig).keep(k)
    return [xp.reshape(m, s.shape) for m, s in zip(keep, scores, strict=True)]


# --------------------------------------------------------------------------------------
# The algorithm, independent of how keys are stored
# --------------------------------------------------------------------------------------


class _BracketSelect:
    """Sample-bracket selection over several flat arrays of ordered keys.

    Subclasses say how keys are read (`sample`, `scan`, `exact`) and how candidate
    results are written back (`write_candidates`). Ineligible entries get a key below
    every eligible one, so selecting ``k + n_ineligible`` smallest keys drops them all
    plus the `k` wanted; `scan` and `exact` then report them as kept.
    """

    sizes: list[int]
    n_ineligible: int

    def keep(self, k: int) -> list[Any]:
        total = sum(self.sizes)
        kk = k + self.n_ineligible
        if kk > total:
            raise ValueError(f"cannot drop {k} of {total - self.n_ineligible} entries")
        if k == 0:
            return self.all_kept()
        if total <= SMALL_SIZE:
            return self.exact(kk)
        lo, hi, tie = self.bracket(kk, total)
        if tie is not None:
            # The k-th key is probably one heavily repeated value (exact zeros of
            # weights pruned before, quantized weights): count instead of gathering.
            masks, below, ties = self.scan_tie(tie)
            if below < kk <= below + sum(ties):
                self.resolve_tie(masks, tie, kk - below, ties)
                return masks
            lo, hi = (self.after(tie), self.max_key) if kk > below + sum(ties) else (self.min_key, self.before(tie))
        for _ in range(3):
            masks, below, cand_keys, cand_where = self.scan(lo, hi)
            rank = kk - below
            n_cand = self.count(cand_keys)
            if 1 <= rank <= n_cand:
                self.write_candidates(masks, cand_keys, cand_where, rank)
                return masks
            # The bracket missed: the k-th key lies on one side of it. Extend that side
            # to the end of the key range, which cannot miss.
            lo, hi = (self.min_key, lo) if rank < 1 else (hi, self.max_key)
        return self.exact(kk)  # only reached for NaN thresholds on the portable path

    def bracket(self, kk: int, total: int) -> tuple[Any, Any, Any]:
        """Bounds ``lo``, ``hi`` likely to enclose the kk-th key, or a likely tie value."""
        size = min(max(total // SAMPLE_STRIDE, SAMPLE_BOUNDS[0]), SAMPLE_BOUNDS[1])
        sample = self.sample(max(1, total // size))
        m = self.count(sample)
        q = kk / total
        centre = q * m
        half = BRACKET_SIGMAS * math.sqrt(m * q * (1.0 - q)) + 2.0
        i_lo, i_hi = math.floor(centre - half), math.ceil(centre + half)
        c = min(max(int(centre), 0), m - 1)
        first, last = self.run(sample, c)
        if last - first > half and self.at(sample, c) >= self.min_key:
            return None, None, self.at(sample, c)
        lo = self.at(sample, i_lo) if i_lo >= 0 else self.min_key
        hi = self.at(sample, i_hi) if i_hi < m else self.max_key
        # A heavy run of equal keys at an edge, wholly on one side of the centre, is
        # moved out of the bracket: it is counted, not gathered as candidates.
        if i_lo >= 0:
            first, last = self.run(sample, i_lo)
            if last - first > half and last < c:
                lo = self.after(lo)
        if i_hi < m:
            first, last = self.run(sample, i_hi)
            if last - first > half and first > c:
                hi = self.before(hi)
        # Ineligible keys sit below min_key and must never become candidates.
        lo = max(lo, self.min_key)
        return lo, max(lo, hi), None


class _NumpyBitsSelect(_BracketSelect):
    """Selection on the bit patterns of IEEE floats, held as unsigned NumPy integers.

    Clearing the sign bit of a float's bit pattern gives an integer that orders like
    ``|x|``, with every NaN above +inf: the ranking is exact, total and cheap. With
    eligibility masks, keys become ``bits + 1`` on eligible entries and 0 elsewhere.
    """

    def __init__(self, bits: list[np.ndarray], eligible: list[np.ndarray | None]):
        self.bits = bits
        self.eligible = eligible
        self.sizes = [b.size for b in bits]
        utype = bits[0].dtype
        nbits = utype.itemsize * 8
        self.magnitude = utype.type((1 << (nbits - 1)) - 1)
        self.shifted = any(e is not None for e in eligible)
        self.n_ineligible = sum(e.size - int(np.count_nonzero(e)) for e in eligible if e is not None)
        self.min_key = utype.type(1 if self.shifted else 0)
        self.max_key = utype.type((1 << nbits) - 1)

    # keys ----------------------------------------------------------------------------
    def _keys(self, i: int, sl: slice, out: np.ndarray | None = None) -> np.ndarray:
        key = np.bitwise_and(self.bits[i][sl], self.magnitude, out=out)
        if self.shifted:
            np.add(key, 1, out=key)
            e = self.eligible[i]
            if e is not None:
                np.multiply(key, e[sl], out=key)
        return key

    def count(self, keys: np.ndarray) -> int:
        return keys.size

    def at(self, keys: np.ndarray, i: int) -> Any:
        return keys[i]

    def run(self, sample: np.ndarray, i: int) -> tuple[int, int]:
        v = sample[i]
        return int(np.searchsorted(sample, v, "left")), int(np.searchsorted(sample, v, "right")) - 1

    def after(self, v: Any) -> Any:
        return v + 1 if v < self.max_key else v

    def before(self, v: Any) -> Any:
        return v - 1 if v > self.min_key else v

    def _chunks(self):
        chunk = min(CHUNK_SIZE, max(self.sizes))
        for i, n in enumerate(self.sizes):
            for start in range(0, n, chunk):
                yield i, slice(start, min(start + chunk, n))

    def scan_tie(self, v: Any):
        """One pass: kept = key > v, and the number of keys below and equal to v."""
        masks = [np.empty(n, dtype=bool) for n in self.sizes]
        key_buf = np.empty(min(CHUNK_SIZE, max(self.sizes)), dtype=self.bits[0].dtype)
        below, ties = 0, []
        for i, sl in self._chunks():
            m = sl.stop - sl.start
            key = self._keys(i, sl, out=key_buf[:m])
            kept = masks[i][sl]
            np.greater(key, v, out=kept)
            n_below = int(np.count_nonzero(key < v))
            below += n_below
            ties.append(m - n_below - int(np.count_nonzero(kept)))
            e = self.eligible[i]
            if e is not None:
                kept |= ~e[sl]
        return masks, below, ties

    def resolve_tie(self, masks, v: Any, need: int, ties: list[int]) -> None:
        """Keep the keys equal to v after the first `need` of them (in position order)."""
        key_buf = np.empty(min(CHUNK_SIZE, max(self.sizes)), dtype=self.bits[0].dtype)
        for (i, sl), n_ties in zip(self._chunks(), ties, strict=True):
            if n_ties == 0:
                continue
            m = sl.stop - sl.start
            key = self._keys(i, sl, out=key_buf[:m])
            kept = masks[i][sl]
            if need >= n_ties:
                need -= n_ties
            elif need > 0:
                kept[np.flatnonzero(key == v)[need:]] = True
                need = 0
            else:
                kept |= key == v

    def sample(self, stride: int) -> np.ndarray:
        parts = [self._keys(i, _sample_slice(n, stride)) for i, n in enumerate(self.sizes)]
        sample = np.concatenate(parts)
        sample.sort()
        return sample

    # passes ----------------------------------------------------------------------------
    def scan(self, lo: Any, hi: Any):
        # Per chunk, in cache: keys, kept = key > hi, then key - lo in place. Unsigned
        # subtraction wraps the keys below lo to huge values, so one comparison with
        # hi - lo finds the candidates, and "below" is what is neither kept nor one.
        masks, cand_keys, cand_where = [], [], []
        below = 0
        span = self.bits[0].dtype.type(hi - lo)
        chunk = min(CHUNK_SIZE, max(self.sizes))
        key_buf = np.empty(chunk, dtype=self.bits[0].dtype)
        cand_buf = np.empty(chunk, dtype=bool)
        for i, n in enumerate(self.sizes):
            keep = np.empty(n, dtype=bool)
            e = self.eligible[i]
            for start in range(0, n, chunk):
                sl = slice(start, min(start + chunk, n))
                m = sl.stop - start
                key = self._keys(i, sl, out=key_buf[:m])
                kept = keep[sl]
                cand = cand_buf[:m]
                np.greater(key, hi, out=kept)
                np.subtract(key, lo, out=key)
                np.less_equal(key, span, out=cand)
                pos = np.flatnonzero(cand)
                below += m - int(np.count_nonzero(kept)) - pos.size
                if pos.size:
                    cand_keys.append(key[pos] + lo)
                    cand_where.append((i, pos + start))
                if e is not None:
                    np.logical_not(e[sl], out=cand)
                    np.logical_or(kept, cand, out=kept)
            masks.append(keep)
        keys = np.concatenate(cand_keys) if cand_keys else np.empty(0, key_buf.dtype)
        return masks, below, keys, cand_where

    def write_candidates(self, masks, cand_keys, cand_where, rank: int) -> None:
        keep = _keep_after_rank(cand_keys, rank, np.partition(cand_keys, rank - 1)[rank - 1])
        offset = 0
        for i, pos in cand_where:
            masks[i][pos] = keep[offset : offset + pos.size]
            offset += pos.size

    def all_kept(self) -> list[np.ndarray]:
        return [np.ones(n, dtype=bool) for n in self.sizes]

    def exact(self, kk: int) -> list[np.ndarray]:
        if len(self.bits) == 1:
            keys = self._keys(0, slice(None))
        else:
            keys = np.concatenate([self._keys(i, slice(None)) for i in range(len(self.bits))])
        keep = _keep_after_rank(keys, kk, np.partition(keys, kk - 1)[kk - 1])
        masks = [keep] if len(self.bits) == 1 else np.split(keep, np.cumsum(self.sizes)[:-1])
        for m, e in zip(masks, self.eligible, strict=True):
            if e is not None:
                m |= ~e
        return masks


def _small_keep(bits: np.ndarray, k: int) -> np.ndarray:
    """Keep mask for one small host array: the exact path with the least overhead."""
    n = bits.size
    if not 0 < k <= n:
        if k == 0:
            return np.ones(n, dtype=bool)
        raise ValueError(f"cannot drop {k} of {n} entries")
    keys = bits & _MAGNITUDE[bits.itemsize]
    part = keys.copy()
    part.partition(k - 1)  # the method skips np.partition's dispatch: it shows on small arrays
    v = part[k - 1]
    keep = keys > v
    if n - np.count_nonzero(keep) == k:  # no tie straddles the cut
        return keep
    return _keep_after_rank(keys, k, v)


def _sample_slice(n: int, stride: int) -> slice:
    """Every `stride`-th entry of an array of `n`, from the middle of the first stride.

    The start stays inside the array (an array shorter than half a stride gives its
    first entry), as the standard leaves out-of-range slice starts undefined.
    """
    return slice(min(stride // 2, max(n - 1, 0)), n, stride)


def _small_keep_float(x: np.ndarray, k: int) -> np.ndarray:
    """`_small_keep` on the floats themselves, checked by an exact count.

    ``|x| > v`` with ``v`` the k-th smallest magnitude drops exactly `k` entries unless
    entries equal to ``v`` straddle the cut or NaN is involved (NaN compares false, and
    partition puts it last); then the count differs and the bit-pattern path decides.
    """
    n = x.size
    if not 0 < k <= n:
        if k == 0:
            return np.ones(n, dtype=bool)
        raise ValueError(f"cannot drop {k} of {n} entries")
    a = np.abs(x)
    part = a.copy()
    part.partition(k - 1)
    keep = a > part[k - 1]
    if n - np.count_nonzero(keep) == k:
        return keep
    return _small_keep(x.view(_UINT_FOR_SIZE[x.dtype.itemsize]), k)


def _keep_after_rank(keys: np.ndarray, rank: int, v: Any) -> np.ndarray:
    """Keep mask dropping the `rank` smallest of `keys`, given the rank-th value `v`."""
    keep = keys > v
    n_drop = keys.size - int(np.count_nonzero(keep))
    if n_drop != rank:
        # Entries equal to v straddle the cut: drop the earliest of them only.
        ties = np.flatnonzero(keys == v)
        keep[ties[rank - (n_drop - ties.size) :]] = True
    return keep


class _PortableSelect(_BracketSelect):
    """The same selection with whole-array operations of the Array API standard.

    Keys are magnitudes in a floating dtype; ineligible entries get -1. NaN compares
    false with everything, so it is never below the bracket nor inside it: it is kept,
    unless the k-th key itself is NaN, which only the exact path reaches.
    """

    def __init__(self, xp: Any, scores: list[Array], eligible: list[Array | None]):
        self.xp = xp
        self.device = apc.device(scores[0])
        dtypes = [s.dtype for s in scores]
        if all(xp.isdtype(d, "real floating") for d in dtypes):
            self.dtype = xp.result_type(*dtypes)
        else:
            self.dtype = widest_float(xp, self.device)
        self.eligible = [None if e is None else xp.reshape(e, (-1,)) for e in eligible]
        self.keys = [self._keys(s, e) for s, e in zip(scores, self.eligible, strict=True)]
        self.sizes = [k.shape[0] for k in self.keys]
        self.n_ineligible = sum(
            e.shape[0] - int(xp.count_nonzero(e)) for e in self.eligible if e is not None
        )
        self.shifted = any(e is not None for e in self.eligible)
        self.min_key = 0.0 if self.shifted else -1.0
        self.max_key = math.inf

    def _keys(self, s: Array, e: Array | None) -> Array:
        xp = self.xp
        key = xp.abs(xp.astype(xp.reshape(s, (-1,)), self.dtype, copy=False))
        if e is not None:
            key = xp.where(e, key, xp.asarray(-1.0, dtype=self.dtype, device=self.device))
        return key

    def all_kept(self) -> list[Array]:
        xp = self.xp
        return [xp.ones((n,), dtype=xp.bool, device=self.device) for n in self.sizes]

    def count(self, keys: Array) -> int:
        return int(keys.shape[0])

    def at(self, keys: Array, i: int) -> Any:
        return float(keys[i])

    def run(self, sample: Array, i: int) -> tuple[int, int]:
        xp = self.xp
        v = sample[i : i + 1]
        return int(xp.searchsorted(sample, v, side="left")[0]), int(xp.searchsorted(sample, v, side="right")[0]) - 1

    def _step(self, v: float, towards: float) -> float:
        xp = self.xp
        a = xp.asarray(v, dtype=self.dtype, device=self.device)
        return float(xp.nextafter(a, xp.asarray(towards, dtype=self.dtype, device=self.device)))

    def after(self, v: float) -> float:
        return self._step(v, math.inf)

    def before(self, v: float) -> float:
        return self._step(v, -math.inf)

    def scan_tie(self, v: float):
        xp = self.xp
        masks, ties, below = [], [], 0
        for key, e in zip(self.keys, self.eligible, strict=True):
            keep = ~(key <= v)
            below += int(xp.count_nonzero(key < v))
            ties.append(int(xp.count_nonzero(key == v)))
            masks.append(keep if e is None else keep | ~e)
        return masks, below, ties

    def resolve_tie(self, masks, v: float, need: int, ties: list[int]) -> None:
        xp = self.xp
        for i, (key, n_ties) in enumerate(zip(self.keys, ties, strict=True)):
            if n_ties == 0:
                continue
            equal = key == v
            if need >= n_ties:
                need -= n_ties
                continue
            if need > 0:
                counter = xp.int32 if key.shape[0] < 2**31 else xp.int64
                equal = equal & (xp.cumulative_sum(xp.astype(equal, counter)) > need)
                need = 0
            masks[i] = masks[i] | equal

    def sample(self, stride: int) -> Array:
        xp = self.xp
        parts = [k[_sample_slice(n, stride)] for k, n in zip(self.keys, self.sizes, strict=True)]
        sample = xp.concat(parts) if len(parts) > 1 else parts[0]
        sample = xp.where(xp.isnan(sample), xp.asarray(xp.inf, dtype=self.dtype), sample)
        return xp.sort(sample)

    def scan(self, lo: float, hi: float):
        xp = self.xp
        masks, cand_keys, cand_where = [], [], []
        below = 0
        for i, key in enumerate(self.keys):
            below += int(xp.count_nonzero(key < lo))
            keep = ~(key <= hi)
            cand = (key >= lo) & (key <= hi)
            n_cand = int(xp.count_nonzero(cand))
            if n_cand:
                cand_keys.append(key[cand])
                cand_where.append((i, cand, n_cand))
            e = self.eligible[i]
            masks.append(keep if e is None else keep | ~e)
        if cand_keys:
            keys = xp.concat(cand_keys) if len(cand_keys) > 1 else cand_keys[0]
        else:
            keys = xp.empty((0,), dtype=self.dtype, device=self.device)
        return masks, below, keys, cand_where

    def write_candidates(self, masks, cand_keys, cand_where, rank: int) -> None:
        keep = self._keep_after_rank(cand_keys, rank)
        offset = 0
        for i, cand, n in cand_where:
            masks[i] = xpx.at(masks[i], cand).set(keep[offset : offset + n], xp=self.xp)
            offset += n

    def exact(self, kk: int) -> list[Array]:
        xp = self.xp
        keys = xp.concat(self.keys) if len(self.keys) > 1 else self.keys[0]
        keep = self._keep_after_rank(keys, kk)
        masks, offset = [], 0
        for n, e in zip(self.sizes, self.eligible, strict=True):
            m = keep[offset : offset + n]
            masks.append(m if e is None else m | ~e)
            offset += n
        return masks

    def _keep_after_rank(self, keys: Array, rank: int) -> Array:
        """Keep mask dropping the `rank` smallest keys (NaN highest, ties by position)."""
        xp = self.xp
        nan = xp.isnan(keys)
        n_nan = int(xp.count_nonzero(nan))
        if rank > keys.shape[0] - n_nan:
            below, at_v = ~nan, nan  # the threshold is NaN itself
        else:
            finite = xp.where(nan, xp.asarray(xp.inf, dtype=keys.dtype), keys)
            v = xp.sort(finite)[rank - 1]
            below, at_v = keys < v, keys == v
        need = rank - int(xp.count_nonzero(below))
        counter = xp.int32 if keys.shape[0] < 2**31 else xp.int64
        order = xp.cumulative_sum(xp.astype(at_v, counter))
        return ~(below | (at_v & (order <= need)))


# --------------------------------------------------------------------------------------
# Host views: NumPy arrays and CPU tensors as unsigned integers, without copies
# --------------------------------------------------------------------------------------

_UINT_FOR_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_MAGNITUDE = {n: t((1 << (8 * n - 1)) - 1) for n, t in _UINT_FOR_SIZE.items()}
_NATIVE_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _host_bits(x: Array) -> np.ndarray | None:
    """Flat unsigned-integer view of a float array's bits, if it lives in host memory."""
    if type(x) is np.ndarray or apc.is_numpy_array(x):
        dtype = x.dtype
        utype = _UINT_FOR_SIZE.get(dtype.itemsize) if dtype.kind == "f" else None
        if utype is None:
            return None
        if not dtype.isnative:
            x = x.astype(dtype.newbyteorder("="))  # bit patterns are read in native order
        return (x if x.ndim == 1 else x.reshape(-1)).view(utype)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or not x.is_cpu:
        return None
    if x.requires_grad:
        x = x.detach()
    if x.dtype is torch.bfloat16:  # NumPy has no bfloat16: reinterpret in torch first
        return x.view(torch.int16).numpy().reshape(-1).view(np.uint16)
    if x.dtype not in (torch.float32, torch.float64, torch.float16):
        return None
    host = x.numpy()  # zero-copy
    return host.reshape(-1).view(_UINT_FOR_SIZE[host.dtype.itemsize])


def _host_bool(x: Array) -> np.ndarray | None:
    """Flat NumPy view of a boolean host array (NumPy or CPU tensor), else None."""
    if apc.is_numpy_array(x) and x.dtype == np.bool_:
        return np.ravel(x)
    if apc.is_torch_array(x) and x.device.type == "cpu" and x.dtype == sys.modules["torch"].bool:
        return x.detach().reshape(-1).numpy()
    return None


def _from_host(mask: np.ndarray, like: Array) -> Array:
    """Reshape a host mask like `like`, as an array of the same library."""
    if type(like) is np.ndarray:
        return mask if like.ndim == 1 else mask.reshape(like.shape)
    mask = mask.reshape(like.shape)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.from_numpy(mask)
    return mask
