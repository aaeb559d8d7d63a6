"""Selection with whole-array operations of the Array API standard alone.

The storage for every array that does not live in host memory: CuPy, CUDA tensors,
JAX, array-api-strict, ... The bracket algorithm of :mod:`.bracket` runs with one
whole-array operation per step, on keys that are the values themselves: magnitudes in
a floating dtype for `smallest_magnitude_keep`, the signed values for `kth_smallest`.
JAX floats, CuPy's and those of tensors off the CPU are keyed by their bit patterns
instead (see `BitKeys`): subnormals then rank by value, as on the host.

Arrays traced by ``jax.jit`` take the exact path only, with no value read back to
Python: one sort finds the k-th key, and the tie rule counts with arrays. The number of
entries dropped is a Python int (it depends on shapes and the amount only); with
eligibility masks, how many entries are ineligible stays an array.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as apc
import array_api_extra as xpx

from .._namespace import widest_float
from .._tracing import is_traced
from .bracket import _BracketSelect, _sample_slice, check_rank
from .keys import BitKeys

Array = Any


def keep_masks(xp: Any, scores: list[Array], eligible: list[Array | None], k: int) -> list[Array]:
    """Keep masks shaped like `scores` that drop the `k` eligible entries of smallest magnitude."""
    if k == 0:
        return [xp.ones(s.shape, dtype=xp.bool, device=apc.device(s)) for s in scores]
    select = StandardKeyStorage(xp, scores, eligible)
    keep = select.keep_traced(k) if select.traced else select.keep(k)
    return [xp.reshape(m, s.shape) for m, s in zip(keep, scores, strict=True)]


def kth_smallest(xp: Any, x: Array, k: int) -> Array:
    """The `k`-th smallest value of `x` (1-based, NaN last), a 0-D array like `x`."""
    flat = xp.reshape(x, (-1,))
    check_rank(k, flat.shape[0])
    if not xp.isdtype(flat.dtype, ("real floating", "integral")):
        # No order the bracket knows (booleans, complex): whatever the library's sort does.
        return xp.sort(flat)[k - 1]
    select = StandardKeyStorage(xp, [flat], [None], by_value=True)
    value = select.exact_kth(k) if select.traced else select.kth(k)
    if type(value) in (int, float):  # a tie value, read back from the sample
        value = xp.asarray(value, dtype=select.key_dtype, device=select.device)
    return value if select.bits is None else select.bits.decode(value)


def magnitude_keys(xp: Any, x: Array, dtype: Any) -> Array:
    """Keys of `x` (converted to the floating `dtype`) that order like ``|x|``, NaN last.

    ``|x|`` itself, or on JAX and accelerators the integer keys of `BitKeys` (exact on subnormals).
    Float keys leave the place of NaN to the caller (NaN compares false).
    """
    x = xp.astype(x, dtype, copy=False)
    bits = BitKeys.of(xp, x, dtype)
    return xp.abs(x) if bits is None else bits.magnitude(x)


def _read_back(x: Array) -> list[Any]:
    """`x` as (nested) Python lists: one transfer where the library has ``tolist``."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if x.ndim > 1:
        return [_read_back(x[i, ...]) for i in range(x.shape[0])]
    return [x[i] for i in range(x.shape[0])]


def _sets_by_position(x: Array) -> bool:
    """Whether `x`'s library assigns at integer-array indices (beyond the standard)."""
    return apc.is_numpy_array(x) or apc.is_cupy_array(x) or apc.is_torch_array(x)


class StandardKeyStorage(_BracketSelect):
    """The same selection with whole-array operations of the Array API standard.

    By magnitude, keys are ``|x|`` in a floating dtype and ineligible entries get -1.
    By value (`by_value`, one array, no eligibility), keys are the values in their own
    dtype, integers included. NaN compares false with everything, so it is never below
    the bracket nor inside it: it is kept, unless the k-th key itself is NaN, which only
    the exact path reaches.
    """

    def __init__(self, xp: Any, scores: list[Array], eligible: list[Array | None], *, by_value: bool = False):
        self.xp = xp
        self.by_value = by_value
        self.device = apc.device(scores[0])
        dtypes = [s.dtype for s in scores]
        if by_value:
            (self.dtype,) = dtypes
        elif all(xp.isdtype(d, "real floating") for d in dtypes):
            self.dtype = xp.result_type(*dtypes)
        else:
            self.dtype = widest_float(xp, self.device)
        self.bits = BitKeys.of(xp, scores[0], self.dtype)
        self.key_dtype = self.dtype if self.bits is None else self.bits.dtype
        self.floating = xp.isdtype(self.key_dtype, "real floating")
        self.eligible = [None if e is None else xp.reshape(e, (-1,)) for e in eligible]
        self.keys = [self._keys(s, e) for s, e in zip(scores, self.eligible, strict=True)]
        self.sizes = [k.shape[0] for k in self.keys]
        ineligible = [e.shape[0] - xp.count_nonzero(e) for e in self.eligible if e is not None]
        # Results, not inputs, tell whether JAX traces: constants closed over by a jitted
        # function are concrete, what is computed from them is not.
        self.traced = is_traced(*self.keys, *ineligible)
        # Inside jax.jit the count stays an array: `keep_traced` reads nothing back.
        self.n_ineligible = sum(ineligible) if self.traced else sum(int(n) for n in ineligible)
        self.shifted = any(e is not None for e in self.eligible)
        # Masks written in place at integer positions where the library can (NumPy,
        # CuPy, tensors); the standard's `__setitem__` takes boolean masks only.
        self.writeable = apc.is_writeable_array(scores[0]) and _sets_by_position(scores[0])
        if by_value and self.shifted:
            raise ValueError("eligibility masks only apply to the order by magnitude")
        if self.floating:
            self.min_key, self.max_key = -math.inf, math.inf
        else:
            info = xp.iinfo(self.key_dtype)
            self.min_key, self.max_key = int(info.min), int(info.max)
        if not by_value:  # magnitudes are non-negative; ineligible entries are keyed -1
            lowest = 0 if self.shifted else -1
            self.min_key = float(lowest) if self.floating else lowest

    def _keys(self, s: Array, e: Array | None) -> Array:
        xp = self.xp
        flat = xp.reshape(s, (-1,))
        if self.by_value:
            return flat if self.bits is None else self.bits.value(flat)
        key = magnitude_keys(xp, flat, self.dtype)
        if e is not None:
            key = xp.where(e, key, xp.asarray(-1, dtype=self.key_dtype, device=self.device))
        return key

    def keep_traced(self, k: int) -> list[Array]:
        """Keep masks like `keep`'s, reading no value back: the path for ``jax.jit``.

        The exact path at rank ``k + n_ineligible``, a Python int or, with eligibility
        masks, an array. `k` is checked against the number of entries only: if it
        exceeds the eligible ones (unknown at trace time), every eligible entry is dropped.
        """
        total = sum(self.sizes)
        if k > total:
            raise ValueError(f"cannot drop {k} of {total} entries")
        rank = k + self.n_ineligible
        if not isinstance(rank, int):
            rank = self.xp.minimum(rank, self.xp.asarray(total, dtype=rank.dtype, device=self.device))
        return self.exact(rank)

    def all_kept(self) -> list[Array]:
        xp = self.xp
        return [xp.ones((n,), dtype=xp.bool, device=self.device) for n in self.sizes]

    def count(self, keys: Array) -> int:
        return int(keys.shape[0])

    def ranked(self, sample: Array, ranks: list[int]) -> list[tuple[Any, int, int]]:
        # All ranks at once: on a GPU every value read back is a synchronisation.
        xp = self.xp
        keys = xp.take(sample, xp.asarray(ranks, dtype=xp.int64, device=self.device))
        runs = xp.stack([xp.searchsorted(sample, keys, side="left"), xp.searchsorted(sample, keys, side="right") - 1])
        values, (first, last) = _read_back(keys), _read_back(runs)
        kind = float if self.floating else int
        return [(kind(v), int(a), int(b)) for v, a, b in zip(values, first, last, strict=True)]

    def _step(self, v: float, towards: float) -> float:
        xp = self.xp
        if not self.floating:
            return min(max(v + (1 if towards > v else -1), self.min_key), self.max_key)
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
        if self.floating:
            sample = xp.where(xp.isnan(sample), xp.asarray(xp.inf, dtype=self.dtype, device=self.device), sample)
        return xp.sort(sample)

    def scan(self, lo: float, hi: float):
        # Two comparisons and one reduction per array: `key <= hi` gives the kept entries
        # (its negation; NaN compares false, so it is kept) and, counted, the keys below
        # `lo` once the candidates are taken away (NaN is neither).
        xp = self.xp
        masks, cand_keys, cand_where = [], [], []
        below = 0
        for i, key in enumerate(self.keys):
            at_most_hi = key <= hi
            cand = at_most_hi & (key >= lo)
            if self.writeable:
                # One gather of positions, reused to write the candidates back: a
                # boolean index would gather them a second time.
                where = xp.nonzero(cand)[0]
                n_cand = int(where.shape[0])
                keys = xp.take(key, where)
            else:
                where = cand
                n_cand = int(xp.count_nonzero(cand))
                keys = key[cand]
            below += int(xp.count_nonzero(at_most_hi)) - n_cand
            if n_cand:
                cand_keys.append(keys)
                cand_where.append((i, where, n_cand))
            keep = ~at_most_hi
            e = self.eligible[i]
            masks.append(keep if e is None else keep | ~e)
        if cand_keys:
            keys = xp.concat(cand_keys) if len(cand_keys) > 1 else cand_keys[0]
        else:
            keys = xp.empty((0,), dtype=self.key_dtype, device=self.device)
        return masks, below, keys, cand_where

    def write_candidates(self, masks, cand_keys, cand_where, rank: int) -> None:
        keep = self._keep_after_rank(cand_keys, rank)
        offset = 0
        for i, where, n in cand_where:
            masks[i] = xpx.at(masks[i], where).set(keep[offset : offset + n], xp=self.xp)
            offset += n

    def nth(self, keys: Array, rank: int) -> Array:
        v = self._nth_below_nan(keys, rank)
        return self.xp.asarray(self.xp.nan, dtype=keys.dtype, device=self.device) if v is None else v

    def _nth_below_nan(self, keys: Array, rank: int | Array) -> Array | None:
        """The `rank`-th smallest key as a 0-D array, or None if it is NaN.

        The standard leaves the place of NaN in ``sort`` open: NaN sorts as +inf, and a
        rank past the other keys is NaN.
        """
        xp = self.xp
        if not self.floating:
            return xp.sort(keys)[rank - 1]
        nan = xp.isnan(keys)
        if rank > keys.shape[0] - int(xp.count_nonzero(nan)):
            return None
        inf = xp.asarray(xp.inf, dtype=keys.dtype, device=self.device)
        return xp.sort(xp.where(nan, inf, keys))[rank - 1]

    def _all_keys(self) -> Array:
        return self.xp.concat(self.keys) if len(self.keys) > 1 else self.keys[0]

    def exact_kth(self, k: int) -> Array:
        return self.nth(self._all_keys(), k)

    def exact(self, kk: int) -> list[Array]:
        keys = self._all_keys()
        keep = self._keep_after_rank(keys, kk)
        masks, offset = [], 0
        for n, e in zip(self.sizes, self.eligible, strict=True):
            m = keep[offset : offset + n]
            masks.append(m if e is None else m | ~e)
            offset += n
        return masks

    def _keep_after_rank(self, keys: Array, rank: int | Array) -> Array:
        """Keep mask dropping the `rank` smallest keys (NaN highest, ties by position).

        `rank` may be a 0-D integer array (inside ``jax.jit``); nothing is read back.
        """
        xp = self.xp
        v = self._nth_below_nan(keys, rank)
        if v is None:  # the threshold is NaN itself
            at_v = xp.isnan(keys)
            below = ~at_v
        else:
            below, at_v = keys < v, keys == v
        counter = xp.int32 if keys.shape[0] < 2**31 else xp.int64
        need = xp.astype(rank - xp.count_nonzero(below), counter)  # of the keys equal to v
        order = xp.cumulative_sum(xp.astype(at_v, counter))
        return ~(below | (at_v & (order <= need)))
