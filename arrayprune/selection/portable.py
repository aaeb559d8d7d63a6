"""Selection with whole-array operations of the Array API standard alone.

The storage for every array that does not live in host memory: CuPy, CUDA tensors,
JAX, array-api-strict, ... Keys are magnitudes in a floating dtype, and the bracket
algorithm of :mod:`.bracket` runs on them with one whole-array operation per step.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as apc
import array_api_extra as xpx

from .._namespace import widest_float
from .bracket import _BracketSelect, _sample_slice

Array = Any


def keep_masks(xp: Any, scores: list[Array], eligible: list[Array | None], k: int) -> list[Array]:
    """Keep masks shaped like `scores` that drop the `k` eligible entries of smallest magnitude."""
    if k == 0:
        return [xp.ones(s.shape, dtype=xp.bool, device=apc.device(s)) for s in scores]
    keep = _PortableSelect(xp, scores, eligible).keep(k)
    return [xp.reshape(m, s.shape) for m, s in zip(keep, scores, strict=True)]


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
