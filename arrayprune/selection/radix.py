"""Radix selection: the k-th smallest key from histograms of its digits, in passes.

Keys are unsigned integers whose order is the wanted order (:mod:`.keys`, where
:func:`magnitude_keys` and :func:`key_bits` live). The k-th smallest key is found one
digit of `DIGIT_BITS` bits at a time, most significant first: a histogram of the first
digit over all keys gives the digit of the k-th key and how many keys lie below it; a
histogram of the next digit over the keys that share that first digit gives the next
one; and so on until every bit is known. Histograms add up over chunks, arrays and
files, so a pass reads each chunk once, in any order, and holds ``2**DIGIT_BITS``
counters: nothing is gathered or concatenated. A 32-bit key takes two
passes, a 16-bit one (float16, bfloat16) one, a 64-bit one four.

The result is a :class:`Cut`: every key below ``Cut.key`` is dropped, and of the keys
equal to it the first ``Cut.need`` in position order (arrays in the given order, then
flat index). :func:`tie_quotas` splits that `need` over arrays or chunks from their
counts of equal keys, and :class:`StreamingCut` applies a cut to chunks read in order,
so a mask never has to exist for more than a chunk at a time.

The storage supplies the histograms (:func:`cut` takes a function), so the same driver
serves NumPy chunks, memory-mapped files and lazy (Dask) arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, TypeVar

import numpy as np

from .keys import key_bits, magnitude_keys

__all__ = [
    "DIGIT_BITS",
    "Cut",
    "StreamingCut",
    "bounded_counts",
    "bounded_counts_of_sorted",
    "cut",
    "cut_of_chunks",
    "digit_histogram",
    "key_bits",
    "magnitude_keys",
    "tie_quotas",
]

#: Bits per digit: 65,536 counters per pass.
DIGIT_BITS = 16

#: A histogram of one digit: ``histogram(prefix, shift, width)`` counts, among the keys
#: with ``key >> (shift + width) == prefix``, each value of ``(key >> shift) % 2**width``;
#: it returns ``2**width`` integer counts.
Histogram = Callable[[int, int, int], np.ndarray]


class Cut(NamedTuple):
    """Where the `k` smallest keys end.

    Attributes
    ----------
    key : int
        The k-th smallest key.
    below : int
        How many keys are smaller than `key`.
    need : int
        How many keys equal to `key` are dropped too (the first ones in position
        order): ``k - below``, at least 1 when ``k >= 1``.
    """

    key: int
    below: int
    need: int


def cut(histogram: Histogram, bits: int, k: int, total: int) -> Cut:
    """The :class:`Cut` of the `k` smallest of `total` keys of `bits` bits.

    Parameters
    ----------
    histogram : callable
        ``histogram(prefix, shift, width)``, see :data:`Histogram`. It is called once
        per digit, ``ceil(bits / DIGIT_BITS)`` times.
    bits : int
        Width of the keys: every key is below ``2**bits``.
    k : int
        Rank, ``1 <= k <= total``.
    total : int
        Number of keys.

    Returns
    -------
    Cut

    Raises
    ------
    ValueError
        If `k` is out of range, or the histograms do not add up to `total` keys.
    """
    if not 1 <= k <= total:
        raise ValueError(f"k={k} is out of range for {total} keys")
    prefix, below, left = 0, 0, bits
    while left > 0:
        width = min(DIGIT_BITS, left)
        left -= width
        counts = np.cumsum(histogram(prefix, left, width), dtype=np.int64)
        if below + int(counts[-1]) < k:
            raise ValueError("the histograms do not account for every key")
        digit = int(np.searchsorted(counts, k - below, side="left"))
        below += int(counts[digit - 1]) if digit else 0
        prefix = (prefix << width) | digit
    return Cut(prefix, below, k - below)


def cut_of_chunks(
    chunks: Callable[[], Iterable[np.ndarray]],
    bits: int,
    k: int,
    total: int,
    sample: np.ndarray | None = None,
    *,
    split: Callable[[], Sequence[Iterable[np.ndarray]]] | None = None,
) -> Cut:
    """:func:`cut` over keys read as NumPy chunks, one pass over them per digit.

    With a `sample` of the keys, one pass usually does: the sample's order statistics
    give a narrow range of keys holding the k-th one with overwhelming probability; the
    pass counts the keys below the range and each key inside it (at most
    :data:`_BRACKET_KEYS` counters), which gives the cut when the k-th key is inside.
    Otherwise the digit passes follow. The sample only decides how fast the cut is
    found, never what it is.

    Parameters
    ----------
    chunks : callable
        Returns a new iterable over the keys, as unsigned NumPy arrays (any order, any
        sizes), each time it is called.
    bits, k, total
        As for :func:`cut`.
    sample : ndarray, optional
        Some of the keys (any, in any order; spread over all of them is best).
    split : callable, optional
        Returns new iterables that together hold the keys (each key in one of them),
        each time it is called: each is counted by its own thread and the counts are
        added (NumPy releases the GIL, so several cores count). Without it, `chunks`
        is read by the calling thread. The cut is the same either way.

    Returns
    -------
    Cut
    """

    def each(count: Callable[[Iterable[np.ndarray]], _T]) -> list[_T]:
        return [count(chunks())] if split is None else _in_threads(split(), count)

    def histogram(prefix: int, shift: int, width: int) -> np.ndarray:
        def count(part: Iterable[np.ndarray]) -> np.ndarray:
            counts = np.zeros(1 << width, dtype=np.int64)
            for keys in part:
                counts += digit_histogram(keys, prefix, shift, width)
            return counts

        return _added(each(count), 1 << width)

    if sample is not None and 1 <= k <= total:
        bracket = _bracket(sample, k, total)
        if bracket is not None:
            passes = each(lambda part: _bracket_pass(part, *bracket))
            below = sum(b for b, _ in passes)
            counts = _added([c for _, c in passes], bracket[1])
            if below < k <= below + int(counts.sum()):
                ranks = np.cumsum(counts, dtype=np.int64)
                offset = int(np.searchsorted(ranks, k - below, side="left"))
                below += int(ranks[offset - 1]) if offset else 0
                return Cut(bracket[0] + offset, below, k - below)
    return cut(histogram, bits, k, total)


_T = TypeVar("_T")

#: Keys of sorted arrays one bracketing pass may hold (:func:`bounded_counts_of_sorted`).
_SORTED_BRACKET = 1 << 24


def bounded_counts_of_sorted(
    arrays: Callable[[], Iterable[np.ndarray]],
    sizes: Sequence[int],
    k: int,
    bounds: Sequence[tuple[int, int]],
    sample: int = 1 << 20,
) -> tuple[list[int], list[bool]] | None:
    """:func:`bounded_counts` over arrays of keys each given sorted, in two passes.

    The first pass keeps every ``s``-th key of each array (about `sample` in all), whose
    ranks are known exactly: they bound every array's count below any key, and so give
    keys ``low`` and ``high`` between which the cut lies. The second pass keeps each
    array's keys between them and its count below ``low``, from which the cut is exact.

    Parameters
    ----------
    arrays : callable
        Returns a new iterable over the arrays' keys (unsigned, 1-D, ascending), one
        array at a time, in order, each time it is called (twice).
    sizes : sequence of int
        Keys of each array.
    k, bounds
        As for :func:`bounded_counts`.
    sample : int, default 2**20
        Keys kept by the first pass.

    Returns
    -------
    (list of int, list of bool) or None
        Per array, the keys it drops; and whether its last key dropped is smaller than
        its first key kept (the cut falls between two different keys of it, or drops
        none or all). None when the bracket would hold more than 16 Mi keys (use
        :func:`bounded_counts`).

    Raises
    ------
    ValueError
        If the bounds cannot hold `k`.
    """
    lows = np.array([lo for lo, _ in bounds], dtype=np.int64)
    highs = np.array([hi for _, hi in bounds], dtype=np.int64)
    if not int(lows.sum()) <= k <= int(highs.sum()):
        raise ValueError(f"cannot drop {k} keys within the bounds (between {int(lows.sum())} and {int(highs.sum())})")
    if k == int(lows.sum()):
        return [int(lo) for lo in lows], [True] * lows.size
    n_all = np.array(sizes, dtype=np.int64)
    if n_all.size != lows.size:
        raise ValueError("one size and one bound per array are needed")
    s_all = np.maximum(1, -(-int(n_all.sum()) // sample)) * np.ones(n_all.size, dtype=np.int64)  # every s-th key
    kept = [keys[s - 1 :: s].copy() for keys, s in zip(arrays(), s_all.tolist(), strict=True)]
    kept_sizes = np.array([c.size for c in kept], dtype=np.int64)

    def ranks(x: int) -> tuple[np.ndarray, np.ndarray]:
        """Per array, bounds on its count of keys below `x`, from the kept keys' ranks."""
        m = np.array([np.searchsorted(c, c.dtype.type(x), side="left") for c in kept], dtype=np.int64)
        return np.minimum(m * s_all, n_all), np.where(m < kept_sizes, (m + 1) * s_all - 1, n_all)

    def limits(x: int) -> tuple[int, int]:
        """Bounds on G(x)."""
        least, most = ranks(x)
        return int(np.clip(least, lows, highs).sum()), int(np.clip(most, lows, highs).sum())

    pooled = np.unique(np.concatenate(kept)) if kept else np.zeros(0, np.uint64)
    a, b = 0, pooled.size  # the largest kept key with G(x) surely < k: low
    while a < b:
        mid = (a + b) // 2
        if limits(int(pooled[mid]))[1] < k:
            a = mid + 1
        else:
            b = mid
    low = int(pooled[a - 1]) if a else 0
    a, b = 0, pooled.size  # the smallest kept key with G(x) surely >= k: high
    while a < b:
        mid = (a + b) // 2
        if limits(int(pooled[mid]))[0] >= k:
            b = mid
        else:
            a = mid + 1
    if a == pooled.size:
        return None
    high = int(pooled[a])
    if int((ranks(high)[1] - ranks(low)[0]).sum()) > _SORTED_BRACKET:  # keys held by the second pass, at most
        return None
    below = np.zeros(lows.size, dtype=np.int64)
    inside: list[np.ndarray] = []
    for i, keys in enumerate(arrays()):
        utype = keys.dtype.type
        start = np.searchsorted(keys, utype(low), side="left")
        stop = np.searchsorted(keys, utype(high), side="left")
        below[i] = start
        inside.append(keys[start:stop].copy())

    def counts_below(x: int) -> np.ndarray:
        return below + np.array([np.searchsorted(c, c.dtype.type(x), side="left") for c in inside], np.int64)

    present = np.unique(np.concatenate(inside)) if inside else np.zeros(0, np.uint64)
    if present.size == 0 or int(np.clip(counts_below(int(present[0])), lows, highs).sum()) >= k:
        return None  # the cut is not inside (kept keys bound it: not reached)
    a, b = 0, present.size  # T: the largest present key with G(T) < k
    while a < b:
        mid = (a + b) // 2
        if int(np.clip(counts_below(int(present[mid])), lows, highs).sum()) < k:
            a = mid + 1
        else:
            b = mid
    key = int(present[a - 1])
    at = counts_below(key)
    after = below + np.array([np.searchsorted(c, c.dtype.type(key), side="right") for c in inside], np.int64)
    dropped = np.clip(at, lows, highs)
    if int(np.clip(after, lows, highs).sum()) < k:
        return None
    ties = np.clip(after, lows, highs) - dropped
    quotas = tie_quotas([int(t) for t in ties], k - int(dropped.sum()))
    counts = [int(d) + q for d, q in zip(dropped, quotas, strict=True)]
    strict = []
    for i, c in enumerate(counts):
        start, stop, n = int(below[i]), int(below[i]) + inside[i].size, sizes[i]
        if c in (0, n) or c == start or c == stop:  # nothing, everything, or at the bracket's edge
            strict.append(True)
        elif start < c < stop:
            strict.append(bool(inside[i][c - 1 - start] < inside[i][c - start]))
        else:
            strict.append(False)
    return counts, strict


def bounded_counts(
    histograms: Callable[[int, int, int], Iterable[np.ndarray]],
    bits: int,
    k: int,
    bounds: Sequence[tuple[int, int]],
) -> list[int]:
    """How many keys each array drops when `k` are dropped in all, each array within its bounds.

    The ranking is one over all arrays (keys ascending, ties by array order, then
    position), clipped to the bounds: array ``i`` drops its ``lo_i`` smallest keys, then
    the rest are the smallest of the keys ranked between ``lo_i`` and ``hi_i`` in their
    own arrays. Every array so drops a prefix of its own order: only the counts are
    found here, one pass per digit. With ``b_i(x)`` the keys of array ``i`` below `x`
    and ``G(x) = sum_i clip(b_i(x), lo_i, hi_i)``, the cut key ``T`` has
    ``G(T) < k <= G(T + 1)``; array ``i`` drops ``clip(b_i(T), lo_i, hi_i)`` keys and,
    filled in array order (:func:`tie_quotas`), some of those equal to ``T`` its bounds
    leave it. Bounds ``(0, size)`` give the counts of the plain ranking.

    Parameters
    ----------
    histograms : callable
        ``histograms(prefix, shift, width)``: for each array in order, the counts of
        :data:`Histogram` over that array's keys alone (an iterable, read once per digit).
    bits : int
        Width of the keys.
    k : int
        Keys to drop in all.
    bounds : sequence of (int, int)
        Per array, the fewest and most keys it drops.

    Returns
    -------
    list of int
        Per array, the keys it drops: its smallest ones, ties by position.

    Raises
    ------
    ValueError
        If the bounds cannot hold `k`, or the histograms do not account for it.
    """
    lows = np.array([lo for lo, _ in bounds], dtype=np.int64)
    highs = np.array([hi for _, hi in bounds], dtype=np.int64)
    if not int(lows.sum()) <= k <= int(highs.sum()):
        raise ValueError(f"cannot drop {k} keys within the bounds (between {int(lows.sum())} and {int(highs.sum())})")
    if k == int(lows.sum()):
        return [int(lo) for lo in lows]
    below = np.zeros(lows.size, dtype=np.int64)  # per array, its keys below the prefix
    equal = below
    prefix, left = 0, bits
    while left > 0:
        width = min(DIGIT_BITS, left)
        left -= width
        ranked = np.zeros((1 << width) + 1, dtype=np.int64)  # G at the start of each digit
        kept = []  # per array: its digits present and the running counts there (sparse)
        for i, counts in enumerate(histograms(prefix, left, width)):
            running = np.cumsum(counts, dtype=np.int64)
            ranked[1:] += np.clip(below[i] + running, lows[i], highs[i])
            ranked[0] += np.clip(below[i], lows[i], highs[i])
            present = np.flatnonzero(counts)
            kept.append((present, running[present], counts[present]))
        if len(kept) != lows.size or int(ranked[-1]) < k:
            raise ValueError("the histograms do not account for every key")
        digit = int(np.searchsorted(ranked, k, side="left")) - 1
        equal = np.zeros(lows.size, dtype=np.int64)
        for i, (present, running, counts) in enumerate(kept):
            j = int(np.searchsorted(present, digit, side="left"))  # digits present below `digit`
            below[i] += int(running[j - 1]) if j else 0
            if j < present.size and present[j] == digit:
                equal[i] = counts[j]
        prefix = (prefix << width) | digit
    dropped = np.clip(below, lows, highs)
    ties = np.clip(below + equal, lows, highs) - dropped
    quotas = tie_quotas([int(t) for t in ties], k - int(dropped.sum()))
    return [int(d) + q for d, q in zip(dropped, quotas, strict=True)]


def _added(counts: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The sum of some int64 count arrays of `size` entries (zeros if there are none)."""
    total = np.zeros(size, dtype=np.int64)
    for c in counts:
        total += c
    return total


class _Stopped(Exception):
    """A counting thread told to stop (the caller's thread raised)."""


def _in_threads(parts: Sequence[Iterable[np.ndarray]], count: Callable[[Iterable[np.ndarray]], _T]) -> list[_T]:
    """``count(part)`` for every part, each in its own thread; results in order.

    If the calling thread is interrupted (an exception while it waits: a termination
    signal turned into one, say), the threads stop after their current chunk.
    """
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event()

    def guarded(part: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        for keys in part:
            if stop.is_set():
                raise _Stopped
            yield keys

    pool = ThreadPoolExecutor(max_workers=max(1, len(parts)), thread_name_prefix="arrayprune-count")
    try:
        futures = [pool.submit(count, guarded(part)) for part in parts]
        return [f.result() for f in futures]
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: The widest range of keys one pass with a sample counts key by key (8 MiB of counters).
_BRACKET_KEYS = 1 << 20

#: Keys gathered from the bracket before they are counted (bounds the memory of a pass).
_GATHER = 1 << 20


def _bracket(sample: np.ndarray, k: int, total: int) -> tuple[int, int] | None:
    """Keys ``low:low + span`` holding the k-th smallest key with overwhelming
    probability, by the sample's order statistics: ``(low, span)``, or None."""
    if sample.size < 1024:
        return None
    ordered = np.sort(sample.reshape(-1))
    n = ordered.size
    q = (k - 0.5) / total
    spread = 6.0 * (q * (1.0 - q) * n) ** 0.5 + 2.0
    first = int(ordered[int(min(max(q * n - spread, 0), n - 1))])
    last = int(ordered[int(min(max(q * n + spread, 0), n - 1))])
    span = last - first + 1
    return (first, span) if span <= _BRACKET_KEYS else None


def _bracket_pass(chunks: Iterable[np.ndarray], low: int, span: int) -> tuple[int, np.ndarray]:
    """How many keys lie below `low`, and the count of each key in ``low:low + span``."""
    below = 0
    counts = np.zeros(span, dtype=np.int64)
    gathered: list[np.ndarray] = []
    held = 0
    for keys in chunks:
        keys = keys.reshape(-1)
        utype = keys.dtype.type
        for start in range(0, keys.size, _SLICE):
            part = keys[start : start + _SLICE]
            below += int(np.count_nonzero(part < utype(low)))
            offset = part - utype(low)  # wraps below `low`: far above `span` then
            near = offset[offset < utype(span)]
            gathered.append(near)
            held += near.size
            if held >= _GATHER:
                counts += np.bincount(np.concatenate(gathered).astype(np.intp), minlength=span)
                gathered, held = [], 0
    if gathered:
        counts += np.bincount(np.concatenate(gathered).astype(np.intp), minlength=span)
    return below, counts


def digit_histogram(keys: np.ndarray, prefix: int, shift: int, width: int) -> np.ndarray:
    """Counts of each digit ``(key >> shift) % 2**width`` among keys of the given prefix.

    Parameters
    ----------
    keys : ndarray
        Unsigned integer keys, any shape.
    prefix, shift, width : int
        Only keys with ``key >> (shift + width) == prefix`` are counted.

    Returns
    -------
    ndarray
        ``2**width`` counts (int64).
    """
    keys = keys.reshape(-1)
    utype = keys.dtype.type
    top = shift + width
    # On the first digit of keys narrower than their dtype, one max says whether any key
    # has another prefix; past it, keys of another prefix are many: select, then count.
    select = top < 8 * keys.dtype.itemsize and not (prefix == 0 and (keys.size == 0 or int(keys.max()) >> top == 0))

    def count(part: np.ndarray) -> np.ndarray:
        if select:
            part = part[(part >> utype(top)) == utype(prefix)]
        digits = part >> utype(shift) if shift else part
        if prefix:  # the selected keys carry the prefix above the digit
            digits = digits & utype((1 << width) - 1)
        return np.bincount(digits, minlength=1 << width)

    if keys.size <= _SLICE:
        return count(keys).astype(np.int64, copy=False)
    counts = np.zeros(1 << width, dtype=np.int64)
    for start in range(0, keys.size, _SLICE):
        counts += count(keys[start : start + _SLICE])
    return counts


#: Keys per ``bincount`` call: its platform-integer copy of the digits stays in cache
#: (1.8x faster than one call on 4 Mi keys, measured on x86_64).
_SLICE = 1 << 18


def tie_quotas(ties: Sequence[int], need: int) -> list[int]:
    """How many equal keys each group drops, when the first `need` overall are dropped.

    Parameters
    ----------
    ties : sequence of int
        Per group (array, chunk, shard), in position order, its number of keys equal
        to the cut's key.
    need : int
        How many of those are dropped in all (:attr:`Cut.need`).

    Returns
    -------
    list of int
        Per group, how many of its equal keys (its first ones) are dropped: the groups
        are filled in order.
    """
    quotas = []
    for n in ties:
        take = min(max(need, 0), n)
        quotas.append(take)
        need -= take
    return quotas


class StreamingCut:
    """Apply a :class:`Cut` to chunks of keys read in position order.

    Parameters
    ----------
    found : Cut
        The cut of all the keys to be read.

    Examples
    --------
    >>> import numpy as np
    >>> keys = np.array([3, 1, 2, 1, 5], dtype=np.uint32)
    >>> found = cut_of_chunks(lambda: [keys], 3, 2, keys.size)
    >>> stream = StreamingCut(found)
    >>> np.concatenate([stream.keep(keys[:2]), stream.keep(keys[2:])])
    array([ True, False,  True, False,  True])
    """

    def __init__(self, found: Cut):
        self.key = found.key
        self.left = found.need

    def keep(self, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Keep mask of the next chunk: False at the keys it drops.

        Parameters
        ----------
        keys : ndarray
            The chunk's keys, in position order.
        out : ndarray of bool, optional
            Where to write the mask (the shape of `keys`), reused across chunks.

        Returns
        -------
        ndarray of bool
            The mask (`out` where given).
        """
        key = keys.dtype.type(self.key)
        if not self.left:  # no equal key is dropped any more: one comparison
            return np.greater_equal(keys, key, out=out)
        keep = np.greater(keys, key, out=out)
        equal = np.flatnonzero(keys.reshape(-1) == key)
        if equal.size > self.left:
            keep.reshape(-1)[equal[self.left :]] = True
        self.left -= min(self.left, equal.size)
        return keep
