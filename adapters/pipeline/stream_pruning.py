"""Pruning the tensors of safetensors files in bounded memory, tensor by tensor.

The tensors are :class:`~arrayprune.adapters.formats.safetensors_stream.StoredTensor` descriptors, planned like
arrays (:func:`arrayprune.adapters.plan.make_plan`); :func:`prune_stored` reads them
from memory-mapped files and writes every tensor of the plan, pruned or not, through a
:class:`~arrayprune.adapters.formats.safetensors_stream.TensorWriter`, so that no more than a chunk or a tensor is
in memory at a time.

* **Global pruning by an elementwise score** (``global_unstructured`` with
  ``L1Unstructured``, or any method whose ``SCORE`` is elementwise: :func:`streams`):
  one exact threshold over all the selected tensors, by radix selection
  (:mod:`arrayprune.selection.radix`): the magnitudes are turned into order-preserving
  integer keys chunk by chunk, and one histogram pass per 16-bit digit of the key (one
  for 16-bit floats, two for float32, four for float64) finds the k-th smallest key
  and how many keys equal to it are dropped. The write pass then reads the tensors
  again in the same order and applies the cut chunk by chunk
  (:class:`~arrayprune.selection.radix.StreamingCut`). The masks are those of
  :func:`arrayprune.global_unstructured` on the tensors in plan order: ties broken by
  position (tensors in plan order, then flat index), NaN above +inf. Memory: a chunk's
  keys and 65,536 counters. Usually one pass finds the threshold: a sample of about
  a million keys, read in blocks spread over the tensors, brackets the k-th key, and the
  pass counts the keys below the bracket and each key inside it
  (:func:`arrayprune.selection.radix.cut_of_chunks`); the digit passes follow only
  when the bracket misses. The sample changes the time, never the masks. A magnitude
  score ranks the stored entries as they are; another elementwise score is computed
  chunk by chunk, and its magnitudes ranked.
* **Global pruning with per-tensor bounds or LAMP scores** (``--min-sparsity``,
  ``--max-sparsity``, ``--lamp``): such a ranking drops from every tensor a prefix of
  its own order, so :func:`global_counts` finds each tensor's count (one histogram pass
  per digit, per tensor, clipped to its bounds:
  :func:`arrayprune.selection.radix.bounded_counts`) and each tensor is then pruned
  alone to its count (by its LAMP scores, read whole one tensor at a time, for LAMP).
* **Pruning per tensor by an elementwise score** (``l1_unstructured``, ...): the same,
  one tensor at a time.
* **N:M pruning** along the last axis (``nm_structured``, the reduction axis of a
  Hugging Face ``[out, in]`` weight): chunk by chunk of whole rows, ranked on integer
  keys of the bit patterns (bfloat16 without PyTorch), the order of
  :class:`arrayprune.NMStructured`.
* **Any other method per tensor**: the tensor is read whole and pruned by the core
  (bfloat16 as a PyTorch tensor, as the in-memory path reads it), then written.

Every write goes through one background thread
(:class:`~arrayprune.adapters.formats.safetensors_stream.BackgroundWrites`, at most one
chunk waiting), so that the next chunk is read and pruned while the last is written;
output chunks, keys and keep masks are reused from chunk to chunk. Per tensor, the next
tensor's cut is found by a worker thread while the current one is written
(:class:`_CutsAhead`); the global cut's counting passes run in two threads over halves
of the chunks (``split`` of :func:`arrayprune.selection.radix.cut_of_chunks`). Neither
changes a mask. Zeros are counted from the keep mask where the
threshold lies strictly between 0 and +inf (every pruned entry folds to a zero, no kept
one is zero), else from the folded entries.

Pruned entries are folded as the in-memory path folds them, ``w * mask``: NumPy's
multiplication for float16/32/64; for bfloat16 (read as uint16 bit patterns, without
PyTorch) the product is taken exactly in float32 and its upper half kept, which is the
bfloat16 product bit for bit (``-w`` pruned is ``-0.0``, ``inf`` pruned is NaN), NaN
payloads aside (PyTorch's bfloat16 multiply rewrites NaNs to 0x7FC0 or 0xFFFF, by
position in its vector loops; here a kept NaN keeps its bits).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats import safetensors_stream
from arrayprune.adapters.formats.arrays import to_numpy
from arrayprune.adapters.formats.direct_writes import BLOCK, at_phase, block_buffer
from arrayprune.adapters.formats.errors import FormatError, write_failure
from arrayprune.adapters.formats.safetensors_stream import BackgroundWrites, TensorFiles, TensorWriter, zero_count
from arrayprune.adapters.summary import PruneSummary, Totals
from arrayprune.global_pruning import _bounds, _check_total, sorted_lamp_scores
from arrayprune.method_parts import N_OF_M, pattern_of, score_of
from arrayprune.selection import radix

__all__ = ["MAGNITUDE_DTYPES", "PruneSummary", "Totals", "fold", "global_counts", "prune_source", "prune_stored"]

#: The safetensors dtypes whose magnitudes are ranked here, and their names for the keys.
MAGNITUDE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}

Progress = Callable[[Sequence[Any], str], Iterable[Any]]


def fold(raw: np.ndarray, keep: np.ndarray, code: str, out: np.ndarray | None = None) -> np.ndarray:
    """``w * keep`` on entries as read (bfloat16 as uint16 bit patterns).

    Parameters
    ----------
    raw : ndarray
        Entries of safetensors dtype `code` as :class:`~arrayprune.adapters.formats.safetensors_stream.TensorFiles`
        reads them.
    keep : ndarray of bool
        Same shape: False where the entry is pruned.
    code : str
        ``"F16"``, ``"BF16"``, ``"F32"`` or ``"F64"``.
    out : ndarray, optional
        Where to put the result (the shape and dtype of `raw`).

    Returns
    -------
    ndarray
        The folded entries, in the dtype of `raw`.
    """
    with np.errstate(invalid="ignore"):  # inf * 0 is NaN, as in the in-memory path
        if code != "BF16":
            return np.multiply(raw, keep, out=out)
        # Finite entries: kept as they are, pruned to the zero of their sign (bit masks).
        bits = keep.astype(np.uint16)
        bits *= np.uint16(0x7FFF)
        bits |= np.uint16(0x8000)
        out = np.bitwise_and(raw, bits, out=out)
        # Pruned inf and NaN: the float32 product, whose upper half is exact. Kept ones
        # keep their bits above (a float32 product would quiet a signalling NaN).
        special = (raw & np.uint16(0x7F80)) == np.uint16(0x7F80)
        if special.any():
            special &= ~keep
        if special.any():
            wide = (raw[special].astype(np.uint32) << np.uint32(16)).view(np.float32)
            out[special] = ((wide * keep[special]).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return out


def _magnitude_name(entry: Any) -> str:
    code = entry.value.code
    if code not in MAGNITUDE_DTYPES:
        raise TypeError(
            f"tensor {entry.name!r}: {entry.value.dtype} is not pruned here, only float16, bfloat16, float32 and "
            "float64 (leave it with --exclude)"
        )
    return MAGNITUDE_DTYPES[code]


def streams(method: Any) -> bool:
    """Whether `method` prunes stored tensors chunk by chunk (alone, or ranked across them):
    its score is elementwise, needs nothing but the values, and its units are entries."""
    score = score_of(method)
    return score.elementwise and score.uses_values and not score.needs_calibration and pattern_of(method).across_arrays


#: Threads that count the keys of the global cut's passes (each over its own run of chunks).
_COUNTING_THREADS = min(2, os.cpu_count() or 1)

#: Threads that key, cut and fold the chunks of a magnitude cut's write pass.
_FOLD_THREADS = min(2, os.cpu_count() or 1)

#: Keys of the sample that guides the radix passes (:func:`_sample`), and its blocks.
_SAMPLE, _BLOCK = 1 << 20, 1 << 12

#: Bytes around a sampled block given back with it: a fault may map a whole large folio.
_AROUND = 4 << 20

#: Each safetensors dtype's +inf as read (bfloat16 as its bit pattern).
_INF: dict[str, np.ndarray] = {
    "F16": np.array([np.inf], dtype=np.float16), "BF16": np.array([0x7F80], dtype=np.uint16),
    "F32": np.array([np.inf], dtype=np.float32), "F64": np.array([np.inf], dtype=np.float64),
}


class _Scratch:
    """One flat buffer per dtype, as large as the largest chunk asked for: the
    temporaries of a pass (keys, a keep mask), written anew for every chunk, so that
    no chunk allocates (and faults in) fresh memory."""

    def __init__(self) -> None:
        self._held: dict[str, np.ndarray] = {}

    def take(self, dtype: Any, size: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        held = self._held.get(dtype.str)
        if held is None or held.size < size:
            held = self._held[dtype.str] = np.empty(size, dtype=dtype)
        return held[:size]


class _Buffers:
    """Output chunks to reuse once written, at most :attr:`KEPT` of them held.

    A chunk bound for a file written directly (:mod:`~arrayprune.adapters.formats.direct_writes`)
    is placed in memory as it lies in the file's blocks (its `phase`), so that it is
    written from where it is: each buffer has a block to spare and serves any phase.
    """

    KEPT = 4

    def __init__(self) -> None:
        self._free: collections.deque[np.ndarray] = collections.deque()
        self._lock = threading.Lock()

    def take(self, like: np.ndarray, phase: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """An array of `like`'s size and dtype (at `phase` in a block, if given), and the
        memory it lies in, to :meth:`give` back once written."""
        nbytes = like.nbytes
        with self._lock:
            for i, held in enumerate(self._free):
                if held.size == nbytes + BLOCK:
                    del self._free[i]
                    break
            else:
                held = block_buffer(nbytes)
        return at_phase(held, phase or 0, like.dtype, like.size), held

    def close(self) -> None:
        """Drop the buffers held (their memory goes when the last user lets go)."""
        with self._lock:
            self._free.clear()

    def give(self, held: np.ndarray, data: Any = None) -> None:
        """Take back the memory `held` of an array that :meth:`take` gave (from any thread)."""
        with self._lock:
            self._free.append(held)
            if len(self._free) > self.KEPT:
                self._free.popleft()


#: The output buffers of every streamed prune: tensors after the first reuse them (fresh
#: memory is dear: it is faulted in page by page). Emptied when a prune ends.
_BUFFERS = _Buffers()


def _sample(targets: Sequence[Any], files: TensorFiles, keys: Callable[[Any, np.ndarray], np.ndarray]) -> np.ndarray:
    """Keys of blocks spread evenly over the targets, about :data:`_SAMPLE` in all."""
    total = sum(e.value.raw_count for e in targets) or 1
    parts = []
    for e in targets:
        t = e.value
        n = t.raw_count
        blocks = max(1, round(_SAMPLE * n / total / _BLOCK))
        if blocks * _BLOCK >= n:
            spans = [(0, n)] if n else []
        else:
            starts = (i * (n - _BLOCK) // max(blocks - 1, 1) for i in range(blocks))
            spans = [(start, start + _BLOCK) for start in starts]
        size = t.raw_dtype.itemsize
        for start, stop in spans:
            parts.append(keys(e, files.raw(t, start, stop)))
            # the pages read, and those the kernel mapped around them (a large folio)
            begin, end = t.begin + start * size - _AROUND, t.begin + stop * size + _AROUND
            files.release(t.path, max(begin, t.begin), min(end, t.end))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


class _Cut:
    """The k smallest scores of some tensors, found by radix passes, applied in order.

    A magnitude score ranks the stored bit patterns as they are; another elementwise
    score is computed chunk by chunk (``method.entry_scores``) and its magnitudes ranked.
    """

    def __init__(
        self,
        targets: Sequence[Any],
        files: TensorFiles,
        method: Any,
        *,
        release: bool,
        threads: int = 1,
        find: bool = True,
    ):
        self.names = {e.name: _magnitude_name(e) for e in targets}
        self.method = None if score_of(method).magnitude else method
        self.score_names = self.names if self.method is None else {e.name: self._score_dtype(e) for e in targets}
        self.bits = radix.key_bits(self.score_names.values())
        total = sum(e.value.size for e in targets)
        k = method.count(total) if find else 0  # not `find`: the keys alone (:meth:`keys`)
        self.stream = None
        self.key = 0
        self.buffers = _BUFFERS
        self.scratch = _Scratch()
        if k:

            def keys() -> Iterable[np.ndarray]:  # each chunk's keys are used before the next
                for e in targets:
                    for raw in files.chunks(e.value, release=release):
                        yield self.keys(e, raw, scratch=self.scratch)

            def part(pieces: Sequence[tuple[Any, int, int]]) -> Iterable[np.ndarray]:
                scratch = _Scratch()  # its own buffers: the parts are read at once
                for e, start, stop in pieces:
                    yield self.keys(e, files.raw(e.value, start, stop), scratch=scratch)
                    if release:
                        size = e.value.raw_dtype.itemsize
                        files.release(e.value.path, e.value.begin + start * size, e.value.begin + stop * size)

            def split() -> list[Iterable[np.ndarray]]:
                """The chunks in `threads` runs of about equal numbers of entries."""
                pieces = [
                    (e, start, min(start + safetensors_stream.CHUNK, e.value.raw_count))
                    for e in targets
                    for start in range(0, e.value.raw_count, safetensors_stream.CHUNK)
                ]
                ends = np.cumsum([stop - start for _, start, stop in pieces])
                bounds = [0] + [int(np.searchsorted(ends, ends[-1] * i / threads)) + 1 for i in range(1, threads)]
                bounds.append(len(pieces))
                return [part(pieces[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

            sample = _sample(targets, files, self.keys)
            many = threads > 1 and self.method is None  # the method's scores are made in one thread
            found = radix.cut_of_chunks(keys, self.bits, k, total, sample=sample, split=split if many else None)
            self.key = found.key
            self.stream = radix.StreamingCut(found)

    def _scores(self, entry: Any, raw: np.ndarray) -> np.ndarray:
        """The method's scores of entries as read (bfloat16 widened to float32)."""
        if self.method is None:  # magnitudes rank the stored bits: no scores to compute
            raise TypeError("a magnitude score ranks the entries as stored")
        values = raw
        if entry.value.code == "BF16":
            values = (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return np.asarray(self.method.entry_scores([values])[0])

    def _score_dtype(self, entry: Any) -> str:
        code = entry.value.code
        probe = np.full(1, 0x3F80, np.uint16) if code == "BF16" else np.ones(1, MAGNITUDE_DTYPES[code])  # ones
        name = self._scores(entry, probe).dtype.name
        if name not in ("float16", "float32", "float64"):
            raise TypeError(f"tensor {entry.name!r}: {type(self.method).__name__} scores are {name}, not floating")
        return name

    def keys(
        self, entry: Any, raw: np.ndarray, *, scratch: _Scratch | None = None, into: np.ndarray | None = None
    ) -> np.ndarray:
        """The radix keys of a chunk of `entry` as read: in `into` (a buffer of the
        chunk's size and width) or `scratch`'s buffer (which the next call with it
        overwrites) where magnitudes rank keys as wide as the entries."""
        if self.method is None:
            name = self.names[entry.name]
            out = None
            if 8 * raw.dtype.itemsize == self.bits + 1:  # keys as wide as the entries
                width = f"u{raw.dtype.itemsize}"
                out = into.view(width) if into is not None else scratch.take(width, raw.size) if scratch else None
            return radix.magnitude_keys(raw, name, self.bits, out=out)
        scores = self._scores(entry, raw)
        return radix.magnitude_keys(scores, self.score_names[entry.name], self.bits)

    def _finite(self, entry: Any) -> bool:
        """Whether the zeros written are the pruned entries, counted from the mask: so
        below the key of +inf and above 0 (every pruned entry folds to a zero and no
        kept one is zero)."""
        if self.method is not None or self.stream is None:
            return False
        name = self.names[entry.name]
        return 0 < self.key < int(radix.magnitude_keys(_INF[entry.value.code], name, self.bits)[0])

    def write(self, entry: Any, files: TensorFiles, sink: BackgroundWrites, *, threads: int = 1) -> int:
        """Write the next target (in the order of the passes) pruned; its number of zeros.

        With `threads` > 1, magnitude cuts fold chunks in that many threads
        (:meth:`_write_in_threads`); the bytes written are the same.
        """
        if threads > 1 and self.method is None and self.stream is not None:
            return self._write_in_threads(entry, files, sink, threads)
        t, zeros = entry.value, 0
        finite = self._finite(entry)
        for raw in files.chunks(t):
            if self.stream is None:
                keep = np.ones(raw.shape, dtype=bool)
            else:
                keys = self.keys(entry, raw, scratch=self.scratch)
                keep = self.stream.keep(keys, out=self.scratch.take(bool, raw.size))
            out, held = self.buffers.take(raw, sink.phase(t.name))
            out = fold(raw, keep, t.code, out=out)
            zeros += raw.size - int(np.count_nonzero(keep)) if finite else zero_count(out, t.code)
            sink.write(t.name, out, functools.partial(self.buffers.give, held))
        return zeros

    def _write_in_threads(self, entry: Any, files: TensorFiles, sink: BackgroundWrites, threads: int) -> int:
        """:meth:`write`, the chunks keyed, cut and folded in `threads` threads.

        A chunk's mask depends on the chunks before it only through the entries equal
        to the cut's key that are still to drop (the first ones in position order):
        each chunk's task finds its equal keys, then waits for the count its
        predecessor leaves (a future) before it drops its share and passes the rest on.
        Once none is left, a chunk is cut by one comparison. Chunks are written in
        order; at most `threads` are under way, in chunks of half the usual size, each
        keyed in its output buffer (where entries as wide as the keys allow), so that
        the memory held is less than one thread's.
        """
        from concurrent.futures import Future, ThreadPoolExecutor

        t, stream, finite = entry.value, self.stream, self._finite(entry)
        if stream is None:
            raise TypeError("no cut to apply")  # write() writes such a tensor whole
        size, itemsize = max(1, safetensors_stream.CHUNK // 2), t.raw_dtype.itemsize
        scratches: queue.SimpleQueue[_Scratch] = queue.SimpleQueue()
        for _ in range(threads):
            scratches.put(_Scratch())

        def task(start: int, stop: int, phase: int | None, before: Future[int], after: Future[int]) -> tuple[Any, ...]:
            scratch = scratches.get()
            try:
                raw = files.raw(t, start, stop)
                out, held = self.buffers.take(raw, phase)
                keys = self.keys(entry, raw, scratch=scratch, into=out)  # in the output where they fit
                keep = scratch.take(bool, raw.size)
                key = keys.dtype.type(stream.key)
                if before.done() and before.result() == 0:
                    np.greater_equal(keys, key, out=keep)
                    after.set_result(0)
                else:
                    np.greater(keys, key, out=keep)
                    equal = np.flatnonzero(keys == key)
                    left = before.result()  # waits for the chunk before (raises its error)
                    drop = min(left, equal.size)
                    keep[equal[drop:]] = True
                    after.set_result(left - drop)
                fold(raw, keep, t.code, out=out)  # over the keys, used up
                zeros = raw.size - int(np.count_nonzero(keep)) if finite else zero_count(out, t.code)
                return out, held, zeros
            except BaseException as exc:
                if not after.done():
                    after.set_exception(exc)
                raise
            finally:
                scratches.put(scratch)

        first: Future[int] = Future()
        first.set_result(stream.left)
        before, zeros, ahead = first, 0, 0
        pending: collections.deque[tuple[Any, int, int]] = collections.deque()

        def collect() -> None:
            nonlocal zeros, ahead
            future, start, stop = pending.popleft()
            out, held, count = future.result()
            zeros += count
            ahead -= out.nbytes
            sink.write(t.name, out, functools.partial(self.buffers.give, held))
            files.release(t.path, t.begin + start * itemsize, t.begin + stop * itemsize)

        with ThreadPoolExecutor(threads, thread_name_prefix="arrayprune-fold") as pool:
            try:
                for start in range(0, t.raw_count, size):
                    stop = min(start + size, t.raw_count)
                    after: Future[int] = Future()
                    phase = sink.phase(t.name, ahead)
                    pending.append((pool.submit(task, start, stop, phase, before, after), start, stop))
                    before, ahead = after, ahead + (stop - start) * itemsize
                    if len(pending) >= threads:
                        collect()
                while pending:
                    collect()
                stream.left = before.result()
            except BaseException:
                # Tasks start in order, so none that started waits on one cancelled here;
                # leaving the pool waits for those under way.
                for future, _, _ in pending:
                    future.cancel()
                raise
        return zeros


#: Each dtype's key of NaN, as :func:`_nm_keep` ranks it: every NaN alike, above +inf.
_NAN_KEY = {"F16": 0x7C01, "BF16": 0x7F81, "F32": 0x7F80_0001, "F64": 0x7FF0_0000_0000_0001}

#: The longest groups :func:`_nm_keep` ranks by pairwise comparisons.
_NM_MAX_M = 8


def _nm_keep(raw: np.ndarray, code: str, n: int, m: int) -> np.ndarray:
    """Keep mask of `n`:`m` pruning of consecutive groups of `raw` (flat, entries as read).

    The order of :class:`arrayprune.NMStructured`: magnitude ascending, NaN above +inf
    (all NaNs alike), ties by position; integer keys of the bit patterns (sign cleared)
    order entries as their magnitudes do, bfloat16 included.
    """
    utype = raw.dtype.type if raw.dtype.kind == "u" else np.dtype(f"u{raw.dtype.itemsize}").type
    keys = raw.view(utype) & utype((1 << (8 * raw.dtype.itemsize - 1)) - 1)
    np.minimum(keys, utype(_NAN_KEY[code]), out=keys)
    groups = keys.reshape(-1, m)
    cols = [groups[:, j] for j in range(m)]
    ranks = [np.zeros(groups.shape[0], dtype=np.uint8) for _ in range(m)]
    for j in range(1, m):
        for i in range(j):
            first = cols[i] <= cols[j]  # position i ranks below position j (ties: the earlier)
            ranks[j] += first
            ranks[i] += ~first
    keep = np.empty(groups.shape, dtype=bool)
    for j in range(m):
        np.greater_equal(ranks[j], n, out=keep[:, j])
    return keep.reshape(-1)


def _prune_nm_streamed(entry: Any, files: TensorFiles, sink: BackgroundWrites, method: Any) -> int | None:
    """N:M pruning along the last axis in chunks of whole rows; its number of zeros.

    None (nothing read or written) where the groups do not run along the tensor's last
    axis, the axis is not a multiple of ``m`` long, groups are long, or a row does not
    fit in a chunk: the tensor is then pruned whole by the core.
    """
    t = entry.value
    if pattern_of(method) is not N_OF_M or not score_of(method).magnitude:
        return None
    if not t.shape or t.code not in MAGNITUDE_DTYPES or method.m > _NM_MAX_M:
        return None
    length = t.shape[-1]
    if method.dim % len(t.shape) != len(t.shape) - 1 or length % method.m or length > safetensors_stream.CHUNK:
        return None

    def keep(raw: np.ndarray, start: int) -> np.ndarray:
        return _nm_keep(raw, t.code, method.n, method.m) if method.n else np.ones(raw.shape, dtype=bool)

    return _fold_by_chunks(entry, files, sink, keep, safetensors_stream.CHUNK // length * length)


def _prune_in_core(entry: Any, files: TensorFiles, sink: BackgroundWrites, method: Any, scores_for: Any) -> int:
    """Prune one tensor with the core, read whole; write it; its number of zeros.

    Without importance scores, the core computes only the boolean keep mask
    (:meth:`~arrayprune.BasePruningMethod.keep_mask`) and the tensor is folded and
    written chunk by chunk: no second copy of it is made.
    """

    t = entry.value
    value = read_whole(files, entry)
    if scores_for is None:
        mask = to_numpy(method.keep_mask(value)).reshape(-1)  # the mapping adapter's mask, as booleans
        if mask.dtype == np.bool_:
            del value
            files.release_tensor(t)  # read whole for the mask; folded chunk by chunk below
            return _fold_by_chunks(entry, files, sink, lambda raw, start: mask[start : start + raw.size])
    scores = None if scores_for is None else scores_for(entry, value)
    folded = mp.remove(mp.prune({"t": value}, "t", method, scores), "t")["t"]
    del value
    if t.code == "BF16":  # a PyTorch tensor: its bit patterns
        import torch

        folded = folded.contiguous().view(torch.int16).numpy()
    raw = np.ascontiguousarray(folded).reshape(-1).view(t.raw_dtype)
    sink.write(t.name, raw)
    zeros = zero_count(raw, t.code)
    sink.wait()  # a whole tensor: written before the next one is read
    files.release_tensor(t)
    return zeros


def _fold_by_chunks(
    entry: Any,
    files: TensorFiles,
    sink: BackgroundWrites,
    keep: Callable[[np.ndarray, int], np.ndarray],
    size: int | None = None,
) -> int:
    """Write tensor `entry` folded chunk by chunk (of `size` entries) into reused
    buffers, ``keep(raw, start)`` the boolean mask of the chunk at flat index `start`;
    its number of zeros."""
    t, buffers, zeros, start = entry.value, _BUFFERS, 0, 0
    for raw in files.chunks(t, size):
        mask = keep(raw, start)  # before a buffer is taken: the last one written is back by then
        out, held = buffers.take(raw, sink.phase(t.name))
        out = fold(raw, mask, t.code, out=out)
        start += raw.size
        zeros += zero_count(out, t.code)
        sink.write(t.name, out, functools.partial(buffers.give, held))
    return zeros


class _CutsAhead:
    """The cut of the next tensor pruned on its own, found in a second thread while the
    current one is written.

    Pruning per tensor by an elementwise score takes a sample and a counting pass over
    a tensor (compute alone) before its write pass (compute and writes). Here the next
    tensor's cut is found by a worker thread (NumPy releases the GIL) while the caller
    writes the current one, so that both cores work. At most one cut is ahead: memory
    stays bounded (one more chunk's keys and a sample). The cuts, and so the masks, are
    those found in order; each method is made once, in plan order, by the caller's
    thread, and an error is raised when its tensor is reached.
    """

    def __init__(self, targets: Sequence[Any], files: TensorFiles, method_for: Callable[[Any], Any]):
        from concurrent.futures import ThreadPoolExecutor

        self._targets = list(targets)
        self._index = {e.name: i for i, e in enumerate(self._targets)}
        self._files = files
        self._method_for = method_for
        self._started: dict[str, tuple[Any, Any]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrayprune-cut")

    def _start(self, entry: Any) -> tuple[Any, Any]:
        method = self._method_for(entry)
        if not streams(method):
            return method, None
        return method, self._pool.submit(_Cut, [entry], self._files, method, release=True)

    def take(self, entry: Any) -> tuple[Any, Any]:
        """``(method, future of its _Cut or None)`` for `entry`; starts the next one's cut."""
        started = self._started.pop(entry.name, None)
        if started is None:
            started = self._start(entry)
        i = self._index.get(entry.name)
        if started[1] is not None and i is not None and i + 1 < len(self._targets):
            following = self._targets[i + 1]
            if following.name not in self._started:
                try:
                    self._started[following.name] = self._start(following)
                except Exception:  # noqa: BLE001 - made again, and raised, when its tensor is reached
                    pass
        return started

    def close(self) -> None:
        """Drop the cut ahead (if not begun) or wait for it (reads only, no writes)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def read_whole(files: TensorFiles, entry: Any) -> Any:
    """A target read whole, as the in-memory path reads it (bfloat16 as a PyTorch tensor)."""
    t = entry.value
    _magnitude_name(entry)
    return files.load(t) if t.code == "BF16" else files.raw(t).reshape(t.shape)


def global_counts(
    targets: Sequence[Any],
    files: TensorFiles,
    method: Any,
    *,
    lamp: bool = False,
    min_sparsity: float | None = None,
    max_sparsity: float | None = None,
) -> tuple[dict[str, int], set[str]]:
    """Each target's number of pruned entries under one global ranking, with per-tensor
    bounds or LAMP scores: the counts of :func:`arrayprune.global_unstructured` with
    `min_sparsity`, `max_sparsity` and ``normalization="lamp"`` on the targets in order.

    Such a ranking drops from every tensor a prefix of its own order (its entries
    ranked by score, ties by position): pruning each target alone to its count
    (:func:`prune_stored` with the count as its amount, ranked by its LAMP scores for
    `lamp`) writes the masks of the global ranking. The counts of an elementwise score
    come from one histogram pass per 16-bit digit of its keys, chunk by chunk
    (:func:`arrayprune.selection.radix.bounded_counts`). LAMP scores come from one
    target read whole at a time, sorted
    (:func:`arrayprune.global_pruning.sorted_lamp_scores`, the values of
    :func:`arrayprune.lamp_scores`), usually in two passes
    (:func:`arrayprune.selection.radix.bounded_counts_of_sorted`; else four digit passes).
    LAMP scores grow with the magnitudes: where a target's last score dropped is below
    its first kept, its count drops the same entries by magnitude.

    Parameters
    ----------
    targets : sequence of PlanEntry
        The selected tensors, in plan order (the order of ties).
    files : TensorFiles
        Reads them.
    method : UnstructuredPruningMethod
        The global method (its amount counts entries over all targets); its score is
        elementwise (:func:`streams`).
    lamp : bool, default False
        Rank by LAMP scores (a magnitude method).
    min_sparsity, max_sparsity : float, optional
        Bounds on every target's sparsity.

    Returns
    -------
    dict of str to int
        Target name to its pruned entries.
    set of str
        With `lamp`: the targets whose count drops the same entries ranked by magnitude
        as by LAMP score (empty without `lamp`).

    Raises
    ------
    ValueError
        Bounds that cannot hold the amount, or a tensor holding NaN with `lamp` (the
        messages of :func:`arrayprune.global_unstructured`).
    TypeError
        A dtype that cannot be ranked here.
    """

    total = sum(e.value.size for e in targets)
    k = method.count(total)
    bounds = _bounds(None, [e.value for e in targets], [None] * len(targets), min_sparsity, max_sparsity)
    _check_total(k, bounds)
    keyed = _Cut(targets, files, method, release=True, find=False)
    bits = radix.key_bits(["float64"]) if lamp else keyed.bits
    scratch = _Scratch()

    def lamp_keys(entry: Any) -> np.ndarray:
        scores = to_numpy(sorted_lamp_scores(read_whole(files, entry)))
        files.release_tensor(entry.value)
        return radix.magnitude_keys(scores, "float64", bits)  # ascending, as the scores

    if lamp:
        sizes = [e.value.size for e in targets]
        found = radix.bounded_counts_of_sorted(lambda: map(lamp_keys, targets), sizes, k, bounds)
        if found is not None:
            exact = {e.name for e, flag in zip(targets, found[1], strict=True) if flag}
            return {e.name: c for e, c in zip(targets, found[0], strict=True)}, exact

    def keys_of(entry: Any) -> Iterable[np.ndarray]:
        if lamp:
            yield lamp_keys(entry)  # their order does not count
            return
        for raw in files.chunks(entry.value):
            yield keyed.keys(entry, raw, scratch=scratch)

    def histograms(prefix: int, shift: int, width: int) -> Iterable[np.ndarray]:
        for entry in targets:
            counts = np.zeros(1 << width, dtype=np.int64)
            for keys in keys_of(entry):
                counts += radix.digit_histogram(keys, prefix, shift, width)
            yield counts

    counts = radix.bounded_counts(histograms, bits, k, bounds)
    return {e.name: c for e, c in zip(targets, counts, strict=True)}, set()


def _copy(t: Any, files: TensorFiles, sink: BackgroundWrites) -> int:
    zeros = 0
    for raw in files.chunks(t):
        sink.write(t.name, raw)
        zeros += zero_count(raw, t.code)
    return zeros


def prune_stored(
    plan: Sequence[Any],
    writers: Mapping[str, TensorWriter],
    files: TensorFiles,
    *,
    method_for: Callable[[Any], Any],
    scores_for: Callable[[Any, Any], Any] | None = None,
    global_method: Any = None,
    progress: Progress | None = None,
    replaced: Mapping[str, Callable[[], np.ndarray]] | None = None,
) -> PruneSummary:
    """Write every tensor of a plan, pruning those it selects, in bounded memory.

    Parameters
    ----------
    plan : sequence of PlanEntry
        :func:`~arrayprune.adapters.plan.make_plan` of a mapping of names to
        :class:`~arrayprune.adapters.formats.safetensors_stream.StoredTensor` (no tensor pruned before in the
        ``name_orig`` + ``name_mask`` convention). The order of the plan is the order
        of the global ranking's ties.
    writers : mapping
        Tensor name to the :class:`~arrayprune.adapters.formats.safetensors_stream.TensorWriter` of its output file.
    files : TensorFiles
        Reads the tensors.
    method_for : callable
        ``method_for(entry)``: the method instance that prunes a selected tensor on its
        own (its ``dim`` and seed chosen for it).
    scores_for : callable, optional
        ``scores_for(entry, value)``: the importance scores a selected tensor is ranked
        by, given its value read whole (Wanda's); without it, the values rank.
    global_method : UnstructuredPruningMethod, optional
        Prune all the selected tensors together with this method (global pruning): one
        whose score is elementwise (:func:`streams`), such as
        :class:`arrayprune.L1Unstructured`.
    progress : callable, optional
        ``progress(items, description)`` wraps the loop over tensors (a progress bar).
    replaced : mapping, optional
        Selected tensors already pruned elsewhere (weights updated by a reconstruction
        method): name -> a function returning the entries to write (raw, as
        :class:`~arrayprune.adapters.formats.safetensors_stream.TensorFiles` reads them).

    Returns
    -------
    PruneSummary

    Raises
    ------
    TypeError
        If `global_method`'s score is not elementwise, or a selected tensor's dtype
        cannot be pruned here (float8 and other formats without a magnitude order).
    ValueError
        If the amount is too large, or the method fails on a tensor (the message names it).
    """
    targets = [e for e in plan if e.prune]
    summary = PruneSummary()
    cut = None
    if global_method is not None:
        if not streams(global_method):
            name = type(global_method).__name__
            raise TypeError(f"global pruning of stored tensors ranks an elementwise score, not {name}'s")
        cut = _Cut(targets, files, global_method, release=True, threads=_COUNTING_THREADS)
    ahead = None
    if cut is None and scores_for is None:
        ahead = _CutsAhead([e for e in targets if replaced is None or e.name not in replaced], files, method_for)
    closing_ahead = contextlib.closing(ahead) if ahead is not None else contextlib.nullcontext()
    with closing_ahead, contextlib.closing(_BUFFERS), BackgroundWrites(writers) as sink:
        for entry in (progress or (lambda items, desc: items))(list(plan), "pruning"):
            t = entry.value
            if not entry.prune:
                summary.whole.add(t.size, _copy(t, files, sink))
                continue
            if replaced is not None and entry.name in replaced:
                raw = np.ascontiguousarray(replaced[entry.name]()).reshape(-1)
                sink.write(t.name, raw)
                zeros = zero_count(raw, t.code)
                sink.wait()  # a whole tensor: written before the next one is read
            elif cut is not None:
                zeros = cut.write(entry, files, sink, threads=_FOLD_THREADS)
            else:
                try:
                    method, found = ahead.take(entry) if ahead is not None else (method_for(entry), None)
                    if found is not None:
                        zeros = found.result().write(entry, files, sink, threads=_FOLD_THREADS)
                        files.release_tensor(t)
                    elif scores_for is None and streams(method):
                        alone = _Cut([entry], files, method, release=True)
                        zeros = alone.write(entry, files, sink, threads=_FOLD_THREADS)
                        files.release_tensor(t)
                    else:
                        streamed = None if scores_for is not None else _prune_nm_streamed(entry, files, sink, method)
                        zeros = _prune_in_core(entry, files, sink, method, scores_for) if streamed is None else streamed
                except (ValueError, TypeError, IndexError, KeyError) as exc:
                    text = str(exc.args[0] if exc.args else exc)
                    raise type(exc)(text if text.startswith("tensor ") else f"tensor {entry.name!r}: {text}") from None
            summary.pruned.add(t.size, zeros)
            summary.by_tensor[entry.name] = (zeros, t.size)
            summary.whole.add(t.size, zeros)
    return summary


def prune_source(
    source: Any,
    dst: str,
    plan: Sequence[Any],
    *,
    method_for: Callable[[Any], Any],
    scores_for: Callable[[Any, Any], Any] | None = None,
    global_method: Any = None,
    progress: Progress | None = None,
    replaced: Mapping[str, Callable[[], np.ndarray]] | None = None,
    made: Mapping[str, str] | None = None,
    replace: bool = True,
) -> PruneSummary:
    """:func:`prune_stored` from a checkpoint to `dst`, written atomically by the checkpoint.

    Parameters
    ----------
    source : SafetensorsFile or ShardedCheckpoint
        What the plan's tensors come from; its ``write(dst, fill)`` writes `dst`.
    dst : str
        The output file (or folder, for a sharded checkpoint).
    plan, method_for, scores_for, global_method, progress, replaced
        As for :func:`prune_stored`.
    made : mapping of str to str, optional
        The provenance record written with the output (:mod:`arrayprune.adapters.provenance`).
    replace : bool, default True
        Whether an existing output folder may be replaced (``--force``); without, a folder
        that another run switched in meanwhile fails this write. A single file is renamed
        into place.

    Returns
    -------
    PruneSummary

    Raises
    ------
    FormatError
        If writing fails (nothing is left of the output then), or memory runs out.
    """
    try:
        with TensorFiles() as files:
            return source.write(
                dst,
                lambda writers: prune_stored(
                    plan,
                    writers,
                    files,
                    method_for=method_for,
                    scores_for=scores_for,
                    global_method=global_method,
                    progress=progress,
                    replaced=replaced,
                ),
                made=made,
                **({} if isinstance(source, safetensors_stream.SafetensorsFile) else {"replace": replace}),
            )
    except OSError as exc:  # a full disk, a folder that cannot be written: nothing was written
        raise write_failure(dst, exc) from None
    except MemoryError:
        raise FormatError(dst, "out of memory while pruning") from None
