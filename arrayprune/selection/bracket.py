"""The sample-bracket select, independent of how keys are stored.

Take a small stratified sample of the keys and read off, at two ranks, two values
``lo`` and ``hi`` that enclose the k-th smallest with overwhelming probability. One pass
over the data counts the keys below ``lo``, marks those above ``hi`` as kept, and
collects the few keys in ``[lo, hi]`` (the candidates) with their positions. The k-th
smallest is then selected exactly among the candidates. If the bracket missed, the scan
is repeated with the bracket extended on the side that missed: by a few bracket widths
of the sample first, then to the end of the key range, which always succeeds. Main-memory
traffic is one read of the data and one write of the mask; nothing is concatenated.

A storage (:mod:`.host`, :mod:`.portable`) subclasses :class:`_BracketSelect` and says
how keys are read and how results are written (the :class:`KeyStorage` protocol); it
may also choose its own crossover and sample and bracket
(:meth:`~_BracketSelect.small_size`, :meth:`~_BracketSelect.sample_stride`,
:meth:`~_BracketSelect.sigmas`), as :mod:`.host`
does. The tuning constants below are read at call time, so tests shrink
them with ``monkeypatch`` to reach every path on small data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

#: Up to this many entries in total, select exactly without a bracket (a storage may
#: take a smaller crossover, never a larger one: lowering this forces the bracket).
SMALL_SIZE = 1 << 22
#: Entries per chunk in the host scan: its keys and flags stay in cache, and longer
#: chunks spend less Python per entry (measured best of 2^16 to 2^18, 2^18 to 2^25).
CHUNK_SIZE = 1 << 18
#: The stratified sample holds one entry in SAMPLE_STRIDE, within these bounds. A
#: larger sample narrows the bracket, and gathering the candidates (mispredicted
#: branches, one per candidate) costs more than sorting the sample.
SAMPLE_STRIDE = 256
SAMPLE_BOUNDS = (1 << 12, 1 << 17)
#: Half-width of the bracket, in standard deviations of the sample rank.
BRACKET_SIGMAS = 5.0
#: A bracket that missed is extended by this many half-widths of sample ranks first.
WIDEN = 3


class _Tie(NamedTuple):
    """The kk-th key is `value`; of the keys equal to it, the first `need` are dropped."""

    masks: list[Any]  # kept = key > value, ineligible entries kept
    value: Any
    need: int
    ties: list[int]  # keys equal to value, per chunk of the scan


class _Candidates(NamedTuple):
    """The kk-th key is the `rank`-th smallest of the candidate `keys`."""

    masks: list[Any]  # kept = key > hi, ineligible entries kept
    keys: Any
    where: list[Any]  # where the candidates sit, per array
    rank: int


class KeyStorage(Protocol):
    """What the bracket asks of a storage of keys (:mod:`.host`, :mod:`.portable`).

    How keys are read (`sample`, `scan`, `scan_tie`, `exact`, `exact_kth`), how results
    are written back (`write_candidates`, `resolve_tie`, `all_kept`), and the helpers on
    keys (`count`, `after`, `before`, `nth`; and :meth:`_BracketSelect.at` and
    :meth:`_BracketSelect.run` on a sorted sample, unless the storage ranks its sample
    itself with :meth:`_BracketSelect.ranked`). Ineligible
    entries get a key below every eligible one, so selecting ``k + n_ineligible``
    smallest keys drops them all plus the `k` wanted; `scan` and `exact` then report them
    as kept.
    """

    sizes: list[int]
    n_ineligible: int
    min_key: Any
    max_key: Any

    def sample(self, stride: int) -> Any:
        """A stratified sample of the eligible keys, one in `stride` (sorted, by default)."""
        ...

    def scan(self, lo: Any, hi: Any) -> tuple[list[Any], int, Any, list[Any]]:
        """One pass: keep masks (kept = key > `hi`), the count below `lo`, the candidate
        keys in ``[lo, hi]`` and where they sit, per array."""
        ...

    def scan_tie(self, v: Any) -> tuple[list[Any], int, list[int]]:
        """One pass: keep masks (kept = key > `v`), the count below `v`, the count equal
        to `v` per chunk."""
        ...

    def resolve_tie(self, masks: list[Any], v: Any, need: int, ties: list[int]) -> None:
        """Drop the first `need` keys equal to `v` (flat order) from `masks`, in place."""
        ...

    def write_candidates(self, masks: list[Any], cand_keys: Any, cand_where: list[Any], rank: int) -> None:
        """Drop the `rank` smallest candidates from `masks`, in place."""
        ...

    def exact(self, kk: int) -> list[Any]:
        """Keep masks dropping the `kk` smallest keys, without a bracket."""
        ...

    def exact_kth(self, k: int) -> Any:
        """The `k`-th smallest key, without a bracket."""
        ...

    def all_kept(self) -> list[Any]:
        """Keep masks keeping everything."""
        ...

    def count(self, keys: Any) -> int:
        """How many keys `keys` holds."""
        ...

    def nth(self, keys: Any, rank: int) -> Any:
        """The `rank`-th smallest (1-based) of `keys`."""
        ...

    def after(self, v: Any) -> Any:
        """The smallest key above `v`."""
        ...

    def before(self, v: Any) -> Any:
        """The largest key below `v`."""
        ...



class _BracketSelect(KeyStorage):
    """Sample-bracket selection over several flat arrays of ordered keys: a storage
    derives from it and implements the :class:`KeyStorage` hooks."""

    def at(self, sample: Any, i: int) -> Any:
        """The key of rank `i` (0-based) of a sorted sample (for the default :meth:`ranked`)."""
        raise NotImplementedError

    def run(self, sample: Any, i: int) -> tuple[int, int]:
        """The first and last ranks of the keys equal to the `i`-th of a sorted sample."""
        raise NotImplementedError

    def keep(self, k: int) -> list[Any]:
        """Keep masks, one per array, that drop the `k` smallest eligible keys."""
        total = sum(self.sizes)
        kk = k + self.n_ineligible
        if kk > total:
            raise ValueError(f"cannot drop {k} of {total - self.n_ineligible} entries")
        if k == 0:
            return self.all_kept()
        found = None if total <= self.small_size() else self._locate(kk, total)
        if found is None:
            return self.exact(kk)
        if isinstance(found, _Tie):
            self.resolve_tie(found.masks, found.value, found.need, found.ties)
        else:
            self.write_candidates(found.masks, found.keys, found.where, found.rank)
        return found.masks

    def kth(self, k: int) -> Any:
        """The `k`-th smallest key (1-based), with the same passes as `keep`."""
        total = sum(self.sizes)
        check_rank(k, total)
        found = None if total <= self.small_size() else self._locate(k, total)
        if found is None:
            return self.exact_kth(k)
        return found.value if isinstance(found, _Tie) else self.nth(found.keys, found.rank)

    def small_size(self) -> int:
        """Up to this many entries in total, select exactly (`exact`, `exact_kth`)."""
        return SMALL_SIZE

    def sample_stride(self, total: int) -> int:
        """Stride of the stratified sample of `total` keys."""
        return stratified_stride(total, SAMPLE_STRIDE)

    def sigmas(self) -> float:
        """Half-width of the bracket, in standard deviations of the sample rank."""
        return BRACKET_SIGMAS

    def ranked(self, sample: Any, ranks: list[int]) -> list[tuple[Any, int, int]]:
        """The keys of rank `ranks` in `sample` (0-based), each with its run of equal keys.

        Returns ``(key, first, last)`` per rank: the key, and the first and last ranks
        holding keys equal to it. The default reads a sorted sample with `at` and `run`;
        a storage whose `sample` is not sorted selects these ranks instead.
        """
        return [(self.at(sample, r), *self.run(sample, r)) for r in ranks]

    def _locate(self, kk: int, total: int) -> _Tie | _Candidates | None:
        """Scan until the kk-th key is pinned down; None if three brackets missed."""
        lo, hi, tie, beyond = self.bracket(kk, total)
        if tie is not None:
            # The k-th key is probably one heavily repeated value (exact zeros of
            # weights pruned before, quantized weights): count instead of gathering.
            masks, below, ties = self.scan_tie(tie)
            if below < kk <= below + sum(ties):
                return _Tie(masks, tie, kk - below, ties)
            lo, hi = (self.after(tie), self.max_key) if kk > below + sum(ties) else (self.min_key, self.before(tie))
            beyond = None
        for _ in range(3):
            masks, below, cand_keys, cand_where = self.scan(lo, hi)
            rank = kk - below
            if 1 <= rank <= self.count(cand_keys):
                return _Candidates(masks, cand_keys, cand_where, rank)
            # The bracket missed: the k-th key lies on one side of it. Extend that side,
            # first by a few bracket widths of the sample, then to the end of the key
            # range, which cannot miss.
            edge = None if beyond is None else beyond(rank < 1)
            beyond = None
            if rank < 1:
                lo, hi = (self.min_key if edge is None else max(edge, self.min_key)), lo
            else:
                lo, hi = hi, (self.max_key if edge is None else edge)
        return None  # only reached for NaN thresholds on the portable path

    def bracket(self, kk: int, total: int) -> tuple[Any, Any, Any, Callable[[bool], Any] | None]:
        """Bounds ``lo``, ``hi`` likely to enclose the kk-th key, or a likely tie value.

        The last item, ``beyond(low)``, gives the sample key WIDEN bracket half-widths
        below ``lo`` (`low`) or above ``hi``, None past the end of the sample: where to
        extend the bracket if it missed.
        """
        sample = self.sample(self.sample_stride(total))
        m = self.count(sample)
        q = kk / total
        centre = q * m
        half = self.sigmas() * math.sqrt(m * q * (1.0 - q)) + 2.0
        i_lo, i_hi = math.floor(centre - half), math.ceil(centre + half)
        c = min(max(int(centre), 0), m - 1)
        ranks = [c, *(i for i in (i_lo, i_hi) if 0 <= i < m)]
        found = dict(zip(ranks, self.ranked(sample, ranks), strict=True))
        value, first, last = found[c]

        def beyond(low: bool) -> Any:
            i = math.floor(i_lo - WIDEN * half) if low else math.ceil(i_hi + WIDEN * half)
            return self.ranked(sample, [i])[0][0] if 0 <= i < m else None

        if last - first > half and value >= self.min_key:
            return None, None, value, beyond
        lo, hi = self.min_key, self.max_key
        # A heavy run of equal keys at an edge, wholly on one side of the centre, is
        # moved out of the bracket: it is counted, not gathered as candidates.
        if i_lo >= 0:
            lo, first, last = found[i_lo]
            if last - first > half and last < c:
                lo = self.after(lo)
        if i_hi < m:
            hi, first, last = found[i_hi]
            if last - first > half and first > c:
                hi = self.before(hi)
        # Ineligible keys sit below min_key and must never become candidates.
        lo = max(lo, self.min_key)
        return lo, max(lo, hi), None, beyond


def check_rank(k: int, n: int) -> None:
    """Raise unless `k` is a rank (1-based) in an array of `n` entries."""
    if not 1 <= k <= n:
        raise ValueError(f"k={k} is out of range for an array of {n} entries")


def stratified_stride(total: int, stride: int) -> int:
    """The stride giving about one key in `stride` of `total`, within SAMPLE_BOUNDS keys.

    It is prime to 2 and 3: weight layouts repeat with periods made of those (rows of
    256 entries, 3x3 kernels), and a stride sharing a factor with the period would see
    only some of its positions.
    """
    size = min(max(total // stride, SAMPLE_BOUNDS[0]), SAMPLE_BOUNDS[1])
    stride = max(1, total // size) | 1
    return stride + 2 if stride % 3 == 0 else stride


def _sample_slice(n: int, stride: int) -> slice:
    """Every `stride`-th entry of an array of `n`, from the middle of the first stride.

    The start stays inside the array (an array shorter than half a stride gives its
    first entry), as the standard leaves out-of-range slice starts undefined.
    """
    return slice(min(stride // 2, max(n - 1, 0)), n, stride)
