"""Selection on host memory: NumPy arrays, and CPU tensors through zero-copy views.

Keys are unsigned integers made from the bit patterns of the values, so that integer
order is the wanted order, exact and total (the key space of :mod:`.keys`):

* by magnitude (`smallest_magnitude_keep`): a float's bits with the sign bit cleared
  order like ``|x|``, with every NaN above +inf;
* by value (`kth_smallest`): a float's bits with the sign bit set, or all bits flipped
  for negatives, order like ``x``; a NaN of either sign keeps its sign bit set and so
  ranks above +inf. Integers flip their sign bit; unsigned integers and booleans are
  their own keys.

Small inputs are selected exactly with NumPy's partition: on the values themselves
where NumPy's order is the wanted one (one float vector by magnitude, checked by a
count; values by value, as NumPy ranks NaN last), else on the keys. Larger ones (above
`SMALL_SIZE`, 2^15 entries) take the bracket of :mod:`.bracket`, streamed over the keys
in cache-sized chunks: its sample is partitioned rather than sorted, and long arrays of
keys (samples, candidates) are narrowed by a sub-sample before a partition
(`_narrow`), so that NumPy's partition, 5x faster on some machines than on others,
only ever sees a few percent of the data. PyTorch is never imported: CPU tensors are
recognised through ``sys.modules``.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

import array_api_compat as apc
import numpy as np

from . import bracket
from .bracket import _BracketSelect, _sample_slice, check_rank, stratified_stride
from .keys import BFLOAT16_INF_BITS, INF_BITS, INT_FOR_SIZE, MAGNITUDE, UINT_FOR_SIZE, value_keys

Array = Any

_NATIVE_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))

#: Up to this many entries in total (and up to ``bracket.SMALL_SIZE``), select exactly
#: with ``np.partition``; above, the bracket. See :func:`small_size`.
SMALL_SIZE = 1 << 15
#: The host's stratified sample holds about SAMPLE_SCALE * n**(2/3) of n keys (within
#: ``bracket.SAMPLE_BOUNDS``), the size that balances its cost (reading and ranking it,
#: linear in its size) against that of the candidates (inverse to its square root).
#: Its ranks are selected, not sorted, so it can be denser than the portable one.
SAMPLE_SCALE = 5.0
#: The host's bracket half-width, in standard deviations of the sample rank (and at most
#: ``bracket.BRACKET_SIGMAS``). A miss, at most once in 370 calls at 3 (the stratified
#: sample's rank varies less than a random one's on structured weights), costs one more
#: scan over a bracket 1.5 times as wide; the candidates a wider bracket gathers cost on
#: every call.
BRACKET_SIGMAS = 3.0
#: Key arrays longer than this (samples, candidates) are narrowed by a sub-sample of one
#: key in NARROW_STRIDE before a partition (`_narrow`).
NARROW_SIZE = 1 << 12
NARROW_STRIDE = 16


def small_size() -> int:
    """Up to this many entries in total, the host selects exactly with ``np.partition``.

    NumPy's partition costs 1 to 10 ns per entry depending on the machine (its SIMD
    kernels are 5x apart on two machines of one CPU family), the bracket a few passes over
    the data: the crossover is where the bracket wins on the slower machine, and not far
    from it on the faster one (``benchmarks/midsize.py``). ``bracket.SMALL_SIZE`` also
    bounds it, so that lowering that one forces the bracket on every storage.
    """
    return min(SMALL_SIZE, bracket.SMALL_SIZE)


def sigmas() -> float:
    """The host's bracket half-width: `BRACKET_SIGMAS`, at most ``bracket.BRACKET_SIGMAS``."""
    return min(BRACKET_SIGMAS, bracket.BRACKET_SIGMAS)


def keep_one(x: Array, k: int) -> Array | None:
    """The keep mask for one small host float array, or None if `x` is not one.

    The commonest call, and the one where per-call overhead shows: the exact path.
    """
    small = small_size()
    if type(x) is np.ndarray and x.ndim == 1 and x.dtype in _NATIVE_FLOATS and x.size <= small:
        return _small_keep_float(x, k)  # a flat NumPy vector: the leanest path
    bits = _host_bits(x)
    if bits is not None and bits.size <= small:
        return _from_host(_small_keep(bits, k), x)
    return None


def keep_masks(scores: list[Array], eligible: list[Array | None], k: int) -> list[Array] | None:
    """Keep masks shaped like `scores`, or None if the host path cannot take them.

    It takes float arrays of one dtype in host memory, with host eligibility masks.
    """
    bits = [b for b in (_host_bits(s) for s in scores) if b is not None]
    # Bit patterns only compare within one float format (float16 and bfloat16 share a
    # width, not an encoding): mixed dtypes take the portable path, which promotes.
    if len(bits) != len(scores) or len({str(s.dtype) for s in scores}) != 1:
        return None
    host_elig = [None if e is None else _host_bool(e) for e in eligible]
    if any((e is None) != (h is None) for e, h in zip(eligible, host_elig, strict=True)):
        return None
    keep = NumpyKeyStorage(bits, host_elig).keep(k)
    return [_from_host(m, s) for m, s in zip(keep, scores, strict=True)]


def kth_smallest(x: Array, k: int) -> Array | None:
    """The `k`-th smallest value of a real or boolean host array, or None if `x` is not one.

    The value comes back as a NumPy scalar for NumPy input and as a 0-D CPU tensor for
    a tensor, of the dtype of `x`.
    """
    view = _host_values(x)
    if view is None:
        return None
    if view.values is not None and view.bits.size <= small_size():
        # The exact path on the values themselves, as `keep_one` does: NumPy's partition
        # ranks NaN last, and keys would cost passes a copy does not.
        check_rank(k, view.values.size)
        return _scalar_like(_nth_in_place(view.values.copy(), k), x)
    select = NumpyKeyStorage([view.bits], [None], by_value=view.kind, inf=view.inf)
    return _scalar_like(select.bits_of(select.kth(k)), x)  # a NaN comes back positive


class NumpyKeyStorage(_BracketSelect):
    """Selection on bit patterns held as unsigned NumPy integers.

    Keys order by magnitude (the default: float bits only), or by value when `by_value`
    names how the bits encode values: ``"f"`` (IEEE float, with `inf` the bits of
    +inf), ``"i"`` (two's complement) or ``"u"`` (unsigned, boolean). With eligibility
    masks (by magnitude only), keys become ``bits + 1`` on eligible entries and 0
    elsewhere.
    """

    def __init__(
        self,
        bits: list[np.ndarray],
        eligible: list[np.ndarray | None],
        *,
        by_value: str | None = None,
        inf: int = 0,
    ):
        self.bits = bits
        self.eligible = eligible
        self.sizes = [b.size for b in bits]
        utype = bits[0].dtype
        nbits = utype.itemsize * 8
        self.magnitude = utype.type((1 << (nbits - 1)) - 1)
        self.shifted = any(e is not None for e in eligible)
        self.by_value = by_value
        if by_value is not None:
            if self.shifted:
                raise ValueError("eligibility masks only apply to the order by magnitude")
            self.sign = utype.type(1 << (nbits - 1))
            self.inf = utype.type(inf)
        self.n_ineligible = sum(e.size - int(np.count_nonzero(e)) for e in eligible if e is not None)
        self.min_key = utype.type(1 if self.shifted else 0)
        self.max_key = utype.type((1 << nbits) - 1)

    # keys ----------------------------------------------------------------------------
    def _keys(self, i: int, sl: slice, out: np.ndarray | None = None) -> np.ndarray:
        """Keys of ``bits[i][sl]``: always a new array, or `out`."""
        if self.by_value is not None:
            return self._value_keys(self.bits[i][sl], out)
        key = np.bitwise_and(self.bits[i][sl], self.magnitude, out=out)
        if self.shifted:
            np.add(key, 1, out=key)
            e = self.eligible[i]
            if e is not None:
                np.multiply(key, e[sl], out=key)
        return key

    def _value_keys(self, bits: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        return value_keys(bits, self.by_value or "u", self.inf if self.by_value == "f" else 0, out)

    def bits_of(self, key: Any) -> Any:
        """The bit pattern of the value whose key (by value) is `key`."""
        if self.by_value == "f":
            return key ^ self.sign if key >= self.sign else ~key
        return key ^ self.sign if self.by_value == "i" else key

    def small_size(self) -> int:
        return small_size()

    def sample_stride(self, total: int) -> int:
        return stratified_stride(total, max(1, round(total ** (1 / 3) / SAMPLE_SCALE)))

    def sigmas(self) -> float:
        return sigmas()

    def count(self, keys: np.ndarray) -> int:
        return keys.size

    def ranked(self, sample: np.ndarray, ranks: list[int]) -> list[tuple[Any, int, int]]:
        part, offset = _narrow(sample, min(ranks), max(ranks))
        part.partition(sorted({r - offset for r in ranks}))  # `sample` is ours to reorder
        out = []
        for r in ranks:
            # Rank i is in place: the keys before it are <= part[i], those after >=.
            i = r - offset
            equal = part == part[i]
            out.append((part[i], r - int(np.count_nonzero(equal[:i])), r + int(np.count_nonzero(equal[i + 1 :]))))
        return out

    def after(self, v: Any) -> Any:
        return v + 1 if v < self.max_key else v

    def before(self, v: Any) -> Any:
        return v - 1 if v > self.min_key else v

    def _chunk(self) -> int:
        return min(bracket.CHUNK_SIZE, max(self.sizes))

    def _chunks(self):
        chunk = self._chunk()
        for i, n in enumerate(self.sizes):
            for start in range(0, n, chunk):
                yield i, slice(start, min(start + chunk, n))

    def scan_tie(self, v: Any):
        """One pass: kept = key > v, and the number of keys below and equal to v."""
        masks = [np.empty(n, dtype=bool) for n in self.sizes]
        key_buf = np.empty(self._chunk(), dtype=self.bits[0].dtype)
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
        key_buf = np.empty(self._chunk(), dtype=self.bits[0].dtype)
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
        return parts[0] if len(parts) == 1 else np.concatenate(parts)  # a new array either way

    # passes ----------------------------------------------------------------------------
    def scan(self, lo: Any, hi: Any):
        # Per chunk, in cache: keys, kept = key > hi, and the candidates lo <= key <= hi
        # as (key >= lo) != kept (lo <= hi); "below" is what is neither kept nor one.
        masks, cand_keys, cand_where = [], [], []
        below = 0
        chunk = self._chunk()
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
                np.greater_equal(key, lo, out=cand)
                np.not_equal(cand, kept, out=cand)
                pos = cand.nonzero()[0]
                below += m - int(np.count_nonzero(kept)) - pos.size
                if pos.size:
                    cand_keys.append(key[pos])
                    cand_where.append((i, pos + start))
                if e is not None:
                    np.logical_not(e[sl], out=cand)
                    np.logical_or(kept, cand, out=kept)
            masks.append(keep)
        keys = np.concatenate(cand_keys) if cand_keys else np.empty(0, key_buf.dtype)
        return masks, below, keys, cand_where

    def write_candidates(self, masks, cand_keys, cand_where, rank: int) -> None:
        keep = _keep_after_rank(cand_keys, rank, self.nth(cand_keys, rank))
        offset = 0
        for i, pos in cand_where:
            masks[i][pos] = keep[offset : offset + pos.size]
            offset += pos.size

    def all_kept(self) -> list[np.ndarray]:
        return [np.ones(n, dtype=bool) for n in self.sizes]

    def nth(self, keys: np.ndarray, rank: int) -> Any:
        part, offset = _narrow(keys, rank - 1, rank - 1)
        return _nth_in_place(part.copy() if part is keys else part, rank - offset)

    def _all_keys(self) -> np.ndarray:
        """The keys of all arrays, in order, as a new array."""
        if len(self.bits) == 1:
            return self._keys(0, slice(None))
        return np.concatenate([self._keys(i, slice(None)) for i in range(len(self.bits))])

    def exact_kth(self, k: int) -> Any:
        return _nth_in_place(self._all_keys(), k)

    def exact(self, kk: int) -> list[np.ndarray]:
        keys = self._all_keys()
        keep = _keep_after_rank(keys, kk, self.nth(keys, kk))
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
    keys = bits & MAGNITUDE[bits.itemsize]
    part = keys.copy()
    part.partition(k - 1)  # `_nth_in_place`, inline: a call shows on the smallest arrays
    v = part[k - 1]
    keep = keys > v
    if n - np.count_nonzero(keep) == k:  # no tie straddles the cut
        return keep
    return _keep_after_rank(keys, k, v)


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
    part.partition(k - 1)  # `_nth_in_place`, inline
    keep = a > part[k - 1]
    if n - np.count_nonzero(keep) == k:
        return keep
    return _small_keep(x.view(UINT_FOR_SIZE[x.dtype.itemsize]), k)


def _nth_in_place(keys: np.ndarray, rank: int) -> Any:
    """The `rank`-th smallest of `keys` (1-based), partitioning `keys` in place.

    The method skips ``np.partition``'s dispatch and copy: it shows on small arrays.
    """
    keys.partition(rank - 1)
    return keys[rank - 1]


def _narrow(keys: np.ndarray, first: int, last: int) -> tuple[np.ndarray, int]:
    """The keys of a value range holding ranks `first` to `last` (0-based) of `keys`.

    Returns ``(part, offset)``: `part` holds, in any order, every key of a range
    ``[a, b]`` such that ranks ``first - offset`` to ``last - offset`` of `part` are
    those ranks of `keys`, and keys equal to them are all in `part`. A sub-sample
    brackets the range, then a pass gathers its keys: a few passes and a gather of a
    few percent of the keys, where a partition of them all costs more, and 5x more on
    some machines than on others. Short arrays, or a bracket that missed, give
    ``(keys, 0)``.
    """
    n = keys.size
    if n <= NARROW_SIZE:
        return keys, 0
    sub = keys[_sample_slice(n, NARROW_STRIDE)].copy()
    m = sub.size
    half = sigmas() * math.sqrt(m / 4) + 2.0  # the rank's deviation, at most
    j_lo, j_hi = math.floor(first * m / n - half), math.ceil((last + 1) * m / n + half)
    if j_lo < 0 and j_hi >= m:
        return keys, 0
    sub.partition([j for j in (j_lo, j_hi) if 0 <= j < m])
    inside = keys >= (sub[j_lo] if j_lo >= 0 else 0)
    offset = n - int(np.count_nonzero(inside))
    if j_hi < m:
        inside &= keys <= sub[j_hi]
    part = np.compress(inside, keys)
    if not offset <= first <= last < offset + part.size:
        return keys, 0
    return part, offset


def _keep_after_rank(keys: np.ndarray, rank: int, v: Any) -> np.ndarray:
    """Keep mask dropping the `rank` smallest of `keys`, given the rank-th value `v`."""
    keep = keys > v
    n_drop = keys.size - int(np.count_nonzero(keep))
    if n_drop != rank:
        # Entries equal to v straddle the cut: drop the earliest of them only.
        ties = np.flatnonzero(keys == v)
        keep[ties[rank - (n_drop - ties.size) :]] = True
    return keep


def _host_bits(x: Array) -> np.ndarray | None:
    """Flat unsigned-integer view of a float array's bits, if it lives in host memory.

    `_host_values` for floats only, on every call of `smallest_magnitude_keep`: kept
    lean, as on small arrays its overhead shows.
    """
    if type(x) is np.ndarray or apc.is_numpy_array(x):
        dtype = x.dtype
        utype = UINT_FOR_SIZE.get(dtype.itemsize) if dtype.kind == "f" else None
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
    return host.reshape(-1).view(UINT_FOR_SIZE[host.dtype.itemsize])


class _HostView(NamedTuple):
    """A real or boolean host array, flat, in native byte order, without copies."""

    bits: np.ndarray  # as unsigned integers of its width
    kind: str  # how the bits encode values: "f" IEEE float, "i" two's complement, "u"
    inf: int  # the bits of +inf for floats, else 0
    values: np.ndarray | None  # as NumPy values (None for bfloat16, which NumPy lacks)


def _host_values(x: Array) -> _HostView | None:
    """`x` as a `_HostView` if it is a NumPy array or CPU tensor of a real or boolean dtype."""
    if type(x) is np.ndarray or apc.is_numpy_array(x):
        host = x
    else:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(x, torch.Tensor) or not x.is_cpu:
            return None
        if x.requires_grad:
            x = x.detach()
        if x.dtype is torch.bfloat16:  # NumPy has no bfloat16: reinterpret in torch first
            return _HostView(x.view(torch.int16).numpy().reshape(-1).view(np.uint16), "f", BFLOAT16_INF_BITS, None)
        try:
            host = x.numpy()  # zero-copy
        except TypeError:  # a dtype NumPy lacks
            return None
    dtype = host.dtype
    utype = UINT_FOR_SIZE.get(dtype.itemsize)
    if utype is None or dtype.kind not in "fiub":
        return None
    if not dtype.isnative:
        host = host.astype(dtype.newbyteorder("="))  # bit patterns are read in native order
    values = host if host.ndim == 1 else host.reshape(-1)
    if dtype.kind == "f":
        return _HostView(values.view(utype), "f", INF_BITS[dtype.itemsize], values)
    return _HostView(values.view(utype), "i" if dtype.kind == "i" else "u", 0, values)


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


def _scalar_like(value: np.generic, like: Array) -> Array:
    """A NumPy scalar with the bits of `value`, or a 0-D CPU tensor if `like` is a tensor.

    The result has the dtype of `like`; `value` may hold the bits as an unsigned integer.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        # Through a signed integer of the same width, which torch reinterprets as any
        # dtype of that width (bfloat16 and the unsigned ones too).
        one = np.array([value]).view(INT_FOR_SIZE[value.itemsize])
        return torch.from_numpy(one).view(like.dtype).reshape(())
    return value.view(like.dtype.newbyteorder("="))
