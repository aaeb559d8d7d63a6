"""Pruning the tensors of safetensors files in bounded memory, tensor by tensor.

The tensors are :class:`~arrayprune.adapters.formats.safetensors_stream.StoredTensor` descriptors, planned like
arrays (:func:`arrayprune.adapters.plan.make_plan`); :func:`prune_stored` reads them
from memory-mapped files and writes every tensor of the plan, pruned or not, through a
:class:`~arrayprune.adapters.formats.safetensors_stream.TensorWriter`, so that no more than a chunk or a tensor is
in memory at a time.

* **Global magnitude pruning** (``global_unstructured`` with ``L1Unstructured``): one
  exact threshold over all the selected tensors, by radix selection
  (:mod:`arrayprune.selection.radix`): the magnitudes are turned into order-preserving
  integer keys chunk by chunk, and one histogram pass per 16-bit digit of the key (one
  for 16-bit floats, two for float32, four for float64) finds the k-th smallest key
  and how many keys equal to it are dropped. The write pass then reads the tensors
  again in the same order and applies the cut chunk by chunk
  (:class:`~arrayprune.selection.radix.StreamingCut`). The masks are those of
  :func:`arrayprune.global_unstructured` on the tensors in plan order: ties broken by
  position (tensors in plan order, then flat index), NaN above +inf. Memory: a chunk's
  keys and 65,536 counters.
* **Magnitude pruning per tensor** (``l1_unstructured``): the same, one tensor at a
  time.
* **Any other method per tensor**: the tensor is read whole and pruned by the core
  (bfloat16 as a PyTorch tensor, as the in-memory path reads it), then written.

Pruned entries are folded as the in-memory path folds them, ``w * mask``: NumPy's
multiplication for float16/32/64; for bfloat16 (read as uint16 bit patterns, without
PyTorch) the product is taken exactly in float32 and its upper half kept, which is the
bfloat16 product bit for bit (``-w`` pruned is ``-0.0``, ``inf`` pruned is NaN), NaN
payloads aside (PyTorch's bfloat16 multiply rewrites NaNs to 0x7FC0 or 0xFFFF, by
position in its vector loops; here a kept NaN keeps its bits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arrayprune import L1Unstructured
from arrayprune.adapters.formats.errors import FormatError, _describe
from arrayprune.adapters.formats.safetensors_stream import TensorFiles, TensorWriter, zero_count
from arrayprune.selection import radix

__all__ = ["MAGNITUDE_DTYPES", "PruneSummary", "Totals", "fold", "prune_source", "prune_stored"]

#: The safetensors dtypes whose magnitudes are ranked here, and their names for the keys.
MAGNITUDE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}

Progress = Callable[[Sequence[Any], str], Iterable[Any]]


@dataclass
class Totals:
    """Tensors, entries and zero entries counted while writing."""

    tensors: int = 0
    size: int = 0
    zeros: int = 0

    def add(self, size: int, zeros: int) -> None:
        """Count one more tensor."""
        self.tensors += 1
        self.size += size
        self.zeros += zeros


@dataclass
class PruneSummary:
    """What :func:`prune_stored` wrote.

    Attributes
    ----------
    pruned : Totals
        The tensors it pruned.
    whole : Totals
        Every tensor written.
    files : list of str
        Files written (for a checkpoint folder: shards, copied files, the index).
    left : list of str
        Files of a checkpoint folder that were not copied, each with the reason.
    by_tensor : dict of str to (int, int)
        Each pruned tensor's zeros and entries, by name.
    """

    pruned: Totals = field(default_factory=Totals)
    whole: Totals = field(default_factory=Totals)
    files: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    by_tensor: dict[str, tuple[int, int]] = field(default_factory=dict)


def fold(raw: np.ndarray, keep: np.ndarray, code: str) -> np.ndarray:
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

    Returns
    -------
    ndarray
        The folded entries, in the dtype of `raw`.
    """
    with np.errstate(invalid="ignore"):  # inf * 0 is NaN, as in the in-memory path
        if code != "BF16":
            return raw * keep
        # Finite entries: kept as they are, pruned to the zero of their sign (bit masks).
        bits = keep.astype(np.uint16)
        bits *= np.uint16(0x7FFF)
        bits |= np.uint16(0x8000)
        out = raw & bits
        # Pruned inf and NaN: the float32 product, whose upper half is exact. Kept ones
        # keep their bits above (a float32 product would quiet a signalling NaN).
        special = ((raw & np.uint16(0x7F80)) == np.uint16(0x7F80)) & ~keep
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


class _Cut:
    """The k smallest magnitudes of some tensors, found by radix passes, applied in order."""

    def __init__(self, targets: Sequence[Any], files: TensorFiles, method: Any, *, release: bool):
        self.names = {e.name: _magnitude_name(e) for e in targets}
        self.bits = radix.key_bits(self.names.values())
        total = sum(e.value.size for e in targets)
        k = method.count(total)
        self.stream = None
        if k:

            def keys() -> Iterable[np.ndarray]:
                for e in targets:
                    for raw in files.chunks(e.value, release=release):
                        yield radix.magnitude_keys(raw, self.names[e.name], self.bits)

            self.stream = radix.StreamingCut(radix.cut_of_chunks(keys, self.bits, k, total))

    def write(self, entry: Any, files: TensorFiles, writer: TensorWriter) -> int:
        """Write the next target (in the order of the passes) pruned; its number of zeros."""
        t, zeros = entry.value, 0
        for raw in files.chunks(t):
            if self.stream is None:
                keep = np.ones(raw.shape, dtype=bool)
            else:
                keep = self.stream.keep(radix.magnitude_keys(raw, self.names[entry.name], self.bits))
            out = fold(raw, keep, t.code)
            writer.write(t.name, out)
            zeros += zero_count(out, t.code)
        return zeros


def _prune_in_core(entry: Any, files: TensorFiles, writer: TensorWriter, method: Any) -> int:
    """Prune one tensor with the core, read whole; write it; its number of zeros."""
    from arrayprune.adapters import mapping as mp

    t = entry.value
    _magnitude_name(entry)
    value = files.load(t) if t.code == "BF16" else files.raw(t).reshape(t.shape)
    folded = mp.remove(mp.prune({"t": value}, "t", method), "t")["t"]
    del value
    if t.code == "BF16":  # a PyTorch tensor: its bit patterns
        import torch

        folded = folded.contiguous().view(torch.int16).numpy()
    raw = np.ascontiguousarray(folded).reshape(-1).view(t.raw_dtype)
    writer.write(t.name, raw)
    zeros = zero_count(raw, t.code)
    files.release_tensor(t)
    return zeros


def _copy(t: Any, files: TensorFiles, writer: TensorWriter) -> int:
    zeros = 0
    for raw in files.chunks(t):
        writer.write(t.name, raw)
        zeros += zero_count(raw, t.code)
    return zeros


def prune_stored(
    plan: Sequence[Any],
    writers: Mapping[str, TensorWriter],
    files: TensorFiles,
    *,
    method_for: Callable[[Any], Any],
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
    global_method : L1Unstructured, optional
        Prune all the selected tensors together with this method (global pruning);
        only magnitude pruning (:class:`arrayprune.L1Unstructured`) is done here.
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
        If `global_method` is not an ``L1Unstructured``, or a selected tensor's dtype
        cannot be pruned here (float8 and other formats without a magnitude order).
    ValueError
        If the amount is too large, or the method fails on a tensor (the message names it).
    """
    targets = [e for e in plan if e.prune]
    summary = PruneSummary()
    cut = None
    if global_method is not None:
        if type(global_method) is not L1Unstructured:
            name = type(global_method).__name__
            raise TypeError(f"global pruning of stored tensors ranks magnitudes (L1Unstructured), not {name}")
        cut = _Cut(targets, files, global_method, release=True)
    for entry in (progress or (lambda items, desc: items))(list(plan), "pruning"):
        t = entry.value
        writer = writers[t.name]
        if not entry.prune:
            summary.whole.add(t.size, _copy(t, files, writer))
            continue
        if replaced is not None and entry.name in replaced:
            raw = np.ascontiguousarray(replaced[entry.name]()).reshape(-1)
            writer.write(t.name, raw)
            zeros = zero_count(raw, t.code)
        elif cut is not None:
            zeros = cut.write(entry, files, writer)
        else:
            method = method_for(entry)
            try:
                if type(method) is L1Unstructured:
                    zeros = _Cut([entry], files, method, release=False).write(entry, files, writer)
                    files.release_tensor(t)
                else:
                    zeros = _prune_in_core(entry, files, writer, method)
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
    global_method: Any = None,
    progress: Progress | None = None,
    replaced: Mapping[str, Callable[[], np.ndarray]] | None = None,
) -> PruneSummary:
    """:func:`prune_stored` from a checkpoint to `dst`, written atomically by the checkpoint.

    Parameters
    ----------
    source : SafetensorsFile or ShardedCheckpoint
        What the plan's tensors come from; its ``write(dst, fill)`` writes `dst`.
    dst : str
        The output file (or folder, for a sharded checkpoint).
    plan, method_for, global_method, progress, replaced
        As for :func:`prune_stored`.

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
                    global_method=global_method,
                    progress=progress,
                    replaced=replaced,
                ),
            )
    except OSError as exc:  # a full disk, a folder that cannot be written: nothing was written
        raise FormatError(dst, f"cannot write: {exc.strerror or _describe(exc)}") from None
    except MemoryError:
        raise FormatError(dst, "out of memory while pruning") from None
