"""Safetensors files tensor by tensor, in bounded memory.

Reading: :func:`stored_tensors` lists the tensors of a file as :class:`StoredTensor`
descriptors (name, dtype, shape, byte range: no data is read), which the plan and the
roles take like arrays. :class:`TensorFiles` reads them through read-only memory maps,
as whole tensors or as chunks of at most a given number of entries, and gives the pages
back (``madvise(MADV_DONTNEED)``) once a chunk or a tensor is done, so that the resident
memory of the process does not grow with the size of the file. Entries are read in a
NumPy dtype of their width: bfloat16 as its uint16 bit patterns and float8 as bytes,
without PyTorch; :meth:`TensorFiles.load` makes PyTorch tensors of dtypes NumPy lacks,
as :func:`~arrayprune.adapters.formats.load` does.

Writing: :class:`TensorWriter` writes a safetensors file header first, then each
tensor's bytes at its place, in any order and in as many pieces as wanted; the layout is
the one the ``safetensors`` package writes for the same tensors (tensors sorted by dtype,
widest first in its order, then by name; the header padded with spaces to a multiple
of 8 bytes), so that a file written here equals, tensor for tensor and offset for offset,
what ``safetensors.numpy.save`` or ``safetensors.torch.save`` would write.
"""

from __future__ import annotations

import json
import math
import mmap
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import numpy as np

from arrayprune.adapters.formats.record import with_record

from .direct_writes import BLOCK, open_direct
from .errors import FormatError, import_optional
from .files import _open_regular, atomic_write, write_out
from .safetensors import DTYPE_BITS, read_header

__all__ = [
    "CHUNK",
    "DTYPE_NAMES",
    "BackgroundWrites",
    "SafetensorsFile",
    "StoredTensor",
    "TensorFiles",
    "TensorWriter",
    "header_bytes",
    "stored_tensors",
    "zero_count",
]

#: Entries per chunk of a streaming pass (4 Mi: 8 MiB of bfloat16, 16 MiB of float32).
CHUNK = 1 << 22

#: The name of each safetensors dtype, as PyTorch and NumPy spell it.
DTYPE_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
    "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
    "F32": "float32", "F64": "float64", "C64": "complex64", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2", "F6_E2M3": "float6_e2m3fn",
    "F6_E3M2": "float6_e3m2fn",
}

#: The NumPy dtype entries are read in: their own where NumPy has it, else unsigned
#: integers of their width (bit patterns). Packed dtypes (F4, F6) are read as bytes.
_RAW = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
    "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8", "C64": "<c8", "BF16": "<u2",
    "F8_E5M2": "u1", "F8_E4M3": "u1", "F8_E8M0": "u1", "F8_E4M3FNUZ": "u1", "F8_E5M2FNUZ": "u1",
    "F4": "u1", "F6_E2M3": "u1", "F6_E3M2": "u1",
}

#: The ``safetensors`` writer's order of dtypes (its ``Dtype`` enum); tensors are laid
#: out from the last dtype to the first, then by name.
_LAYOUT_ORDER = (
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
)
_RANK = {code: i for i, code in enumerate(_LAYOUT_ORDER)}

#: PyTorch dtypes of the safetensors dtypes NumPy lacks, for :meth:`TensorFiles.load`.
_TORCH_DTYPES = {
    "BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


@dataclass(frozen=True, eq=False)
class StoredTensor:
    """A tensor of a safetensors file, described but not read.

    It has the ``shape`` and ``dtype`` (a name such as ``"bfloat16"``) that the plan
    and the roles read, so that a mapping of names to stored tensors can be planned like
    a mapping of arrays (:func:`arrayprune.adapters.plan.make_plan`).

    Attributes
    ----------
    path : str
        The file.
    name : str
        The tensor's name.
    code : str
        Its safetensors dtype (``"BF16"``, ``"F32"``, ...).
    shape : tuple of int
    begin, end : int
        Its byte range in the file.
    """

    path: str
    name: str
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype(self) -> str:
        """The dtype's name: ``"float32"``, ``"bfloat16"``, ``"float8_e4m3fn"``, ..."""
        return DTYPE_NAMES[self.code]

    @property
    def size(self) -> int:
        """Number of entries."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Number of bytes in the file."""
        return self.end - self.begin

    @property
    def raw_dtype(self) -> np.dtype:
        """The NumPy dtype its entries are read in (bit patterns where NumPy lacks the dtype)."""
        return np.dtype(_RAW[self.code])

    @property
    def raw_count(self) -> int:
        """Number of elements of :attr:`raw_dtype` (entries, or bytes of a packed dtype)."""
        return self.nbytes // self.raw_dtype.itemsize


def stored_tensors(path: str) -> tuple[dict[str, str], dict[str, StoredTensor]]:
    """The metadata and the tensors of a safetensors file, read from its header only.

    Parameters
    ----------
    path : str
        A safetensors file.

    Returns
    -------
    tuple
        The metadata (dict of str, in the file's order) and the tensors by name, in the
        order :func:`safetensors.safe_open` lists them (sorted by name).

    Raises
    ------
    FormatError
        If the file is not a valid safetensors file (see
        :func:`~arrayprune.adapters.formats.safetensors.read_header`).
    """
    header = read_header(path)
    tensors = {name: StoredTensor(path, name, *header.entries[name]) for name in header.names}
    return header.metadata, tensors


def zero_count(raw: np.ndarray, code: str) -> int:
    """How many entries of `raw` (entries of safetensors dtype `code`, as read) are zero.

    Negative zeros count. Bit patterns are read by their format: bfloat16 and float8
    with a sign bit are zero when every other bit is; ``FNUZ`` float8 only at 0 (their
    0x80 is NaN); E8M0 (powers of two) and packed dtypes count none.
    """
    if code == "BF16":
        return int(np.count_nonzero((raw & np.uint16(0x7FFF)) == 0))
    if code in ("F8_E5M2", "F8_E4M3"):
        return int(np.count_nonzero((raw & np.uint8(0x7F)) == 0))
    if code in ("F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"):
        return 0
    return int(np.count_nonzero(raw == 0))


R = TypeVar("R")

_RELEASE = getattr(mmap, "MADV_DONTNEED", None)


class TensorFiles:
    """Read-only memory maps of safetensors files, read chunk by chunk, pages given back.

    The mapped pages of a file are counted in the resident memory of the process while
    they are mapped; :meth:`release` (called by :meth:`chunks` after each chunk) drops
    them from the process (``madvise(MADV_DONTNEED)``; the kernel's page cache keeps
    them), so reading a whole model costs the memory of a chunk, not of the model.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()  # maps may be asked for from several threads

    def __enter__(self) -> TensorFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _map(self, path: str) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            with self._lock:
                mm = self._maps.get(path)
                if mm is None:
                    with _open_regular(path) as f:
                        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    self._maps[path] = mm
        return mm

    def raw(self, t: StoredTensor, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Entries ``start:stop`` of the flattened tensor, in :attr:`~StoredTensor.raw_dtype`.

        A read-only view of the memory map (no copy).
        """
        dtype = t.raw_dtype
        stop = t.raw_count if stop is None else stop
        offset = t.begin + start * dtype.itemsize
        return np.frombuffer(self._map(t.path), dtype=dtype, count=stop - start, offset=offset)

    def chunks(self, t: StoredTensor, size: int | None = None, *, release: bool = True) -> Iterator[np.ndarray]:
        """The flattened tensor as views of at most `size` elements (:data:`CHUNK`), in order.

        With `release`, the pages of each chunk are given back when the next one is asked
        for (and after the last).
        """
        size = CHUNK if size is None else size
        for start in range(0, t.raw_count, size):
            stop = min(start + size, t.raw_count)
            yield self.raw(t, start, stop)
            if release:
                itemsize = t.raw_dtype.itemsize
                self.release(t.path, t.begin + start * itemsize, t.begin + stop * itemsize)

    def release(self, path: str, begin: int, end: int) -> None:
        """Give back the mapped pages of bytes ``begin:end`` of `path` (whole pages inside)."""
        mm = self._maps.get(path)
        if mm is None or _RELEASE is None:
            return
        first = -(-begin // mmap.PAGESIZE) * mmap.PAGESIZE
        last = end // mmap.PAGESIZE * mmap.PAGESIZE if end < len(mm) else len(mm)
        if last > first:
            try:
                mm.madvise(_RELEASE, first, last - first)
            except (OSError, ValueError):  # pragma: no cover - a kernel that refuses
                pass

    def release_tensor(self, t: StoredTensor) -> None:
        """Give back every page of the tensor."""
        self.release(t.path, t.begin, t.end)

    def load(self, t: StoredTensor) -> Any:
        """The whole tensor as an array of its own dtype, in memory of its own.

        A NumPy array (a copy) where NumPy has the dtype, else a PyTorch tensor (bfloat16,
        float8: PyTorch is needed, as :func:`~arrayprune.adapters.formats.load` needs it).
        The tensor's mapped pages are given back.

        Raises
        ------
        FormatError
            For a dtype that neither library holds (packed F4, F6), or when PyTorch is
            needed and missing.
        """
        try:
            if t.code in _TORCH_DTYPES:
                torch = import_optional("torch", t.path, f"reading dtype {t.code}")
                signed = {1: np.int8, 2: np.int16}[t.raw_dtype.itemsize]
                data = np.array(self.raw(t).view(signed))  # a copy PyTorch may own
                return torch.from_numpy(data).view(getattr(torch, _TORCH_DTYPES[t.code])).reshape(t.shape)
            if t.raw_dtype.itemsize * 8 != DTYPE_BITS[t.code]:
                raise FormatError(t.path, f"tensor {t.name!r}: dtype {t.code} (packed) cannot be read as an array")
            return np.array(self.raw(t)).reshape(t.shape)
        finally:
            self.release_tensor(t)

    def scan(self, t: StoredTensor, dim: int = -1) -> tuple[int, bool] | None:
        """The number of zeros of the tensor, and whether it is 2:4 sparse along `dim`,
        read chunk by chunk (the memory of a chunk, whatever the tensor's size).

        Entries are tested as :func:`zero_count` tests them (negative zeros are zeros).
        2:4 is :func:`arrayprune.is_nm_sparse` with ``n=2, m=4``: every group of 4
        consecutive entries along `dim` holds at most 2 non-zeros; it is False when the
        axis's length is not a multiple of 4 (no 2:4 storage then) or the tensor has no
        axis or no entry.

        Returns
        -------
        tuple of (int, bool), or None
            None for a dtype other than the IEEE floats and bfloat16, or when the groups
            along `dim` do not fit in chunks (read the tensor whole then).
        """
        if t.code not in ("F16", "BF16", "F32", "F64"):
            return None
        shape = t.shape
        if not shape or not t.size:
            return zero_count(self.raw(t), t.code) if t.size else 0, False
        dim = dim % len(shape)
        pre, length, post = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :])
        check = length % 4 == 0
        slab = length * post
        if check and slab > CHUNK and post != 1:
            return None
        step = (max(1, CHUNK // slab) * slab) if check and post != 1 else CHUNK - CHUNK % 4
        zeros, sparse = 0, check
        for raw in self.chunks(t, step):
            nonzero = (raw & np.uint16(0x7FFF)) != 0 if t.code == "BF16" else raw != 0
            zeros += raw.size - int(np.count_nonzero(nonzero))
            if sparse:
                if post == 1:  # groups are 4 consecutive bytes of the mask: add them up
                    counts = (nonzero.view(np.uint32) * np.uint32(0x01010101)) >> np.uint32(24)
                else:
                    counts = nonzero.reshape(-1, length // 4, 4, post).sum(axis=2, dtype=np.uint8)
                sparse = not bool((counts > 2).any())
        return zeros, sparse and pre * slab > 0

    def close(self) -> None:
        """Unmap every file (maps still viewed by arrays stay until those are gone)."""
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass  # a view still uses it: freed with the view
        self._maps.clear()


def _layout(tensors: Iterable[StoredTensor]) -> list[StoredTensor]:
    """The tensors in the order the ``safetensors`` writer lays them out."""
    return sorted(tensors, key=lambda t: (-_RANK[t.code], t.name))


def header_bytes(metadata: Mapping[str, str], tensors: Iterable[StoredTensor]) -> tuple[bytes, dict[str, int]]:
    """The header of a safetensors file holding `tensors`, and where each one's data starts.

    Parameters
    ----------
    metadata : mapping of str to str
        The ``__metadata__`` (left out when empty).
    tensors : iterable of StoredTensor
        What the file will hold (names, dtypes, shapes and byte sizes are used).

    Returns
    -------
    tuple
        The 8-byte length and the JSON header padded with spaces to a multiple of 8
        bytes, and the absolute file offset of each tensor's data, by name.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offsets, position = {}, 0
    for t in _layout(tensors):
        header[t.name] = {"dtype": t.code, "shape": list(t.shape), "data_offsets": [position, position + t.nbytes]}
        offsets[t.name] = position
        position += t.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    return len(text).to_bytes(8, "little") + text, {name: start + o for name, o in offsets.items()}


class TensorWriter:
    """Write a safetensors file tensor by tensor: the header first, then data in place.

    Parameters
    ----------
    f : binary file
        New and empty, open for writing and seeking (a temporary file of
        :func:`~arrayprune.adapters.formats.files.atomic_files`, say).
    metadata : mapping of str to str
        The file's ``__metadata__``.
    tensors : iterable of StoredTensor
        What the file will hold: names, dtypes, shapes and byte sizes.

    Notes
    -----
    A file of at least :data:`~arrayprune.adapters.formats.direct_writes.MIN_SIZE`
    bytes is written past the page cache where the system allows it
    (:mod:`~arrayprune.adapters.formats.direct_writes`): the same bytes, without
    filling memory with the output. The caller's ``fsync`` of `f` after
    :meth:`finish` makes either kind of write durable.
    """

    def __init__(self, f: IO[bytes], metadata: Mapping[str, str], tensors: Iterable[StoredTensor]):
        tensors = list(tensors)
        head, self._offsets = header_bytes(metadata, tensors)
        self._f = f
        self._sizes = {t.name: t.nbytes for t in tensors}
        self._written = dict.fromkeys(self._sizes, 0)
        self._direct = open_direct(f, len(head) + sum(self._sizes.values()))
        if self._direct is not None:
            self._direct.write(0, head)
        else:
            f.seek(0)
            f.write(head)

    def write(self, name: str, data: Any) -> None:
        """Append `data` (bytes or a C-contiguous array) to the bytes of tensor `name`."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        done = self._written[name]
        if done + view.nbytes > self._sizes[name]:
            raise ValueError(f"tensor {name!r}: more bytes than its shape and dtype hold")
        if view.nbytes and self._direct is not None:
            self._direct.write(self._offsets[name] + done, view)
        elif view.nbytes:
            self._f.seek(self._offsets[name] + done)
            write_out(self._f, view)  # large writes start their way to disk as they go
        self._written[name] = done + view.nbytes

    def phase(self, name: str, done: int) -> int | None:
        """Where the bytes of tensor `name` after its first `done` lie in a block of
        direct writes (:func:`~arrayprune.adapters.formats.direct_writes.at_phase`),
        or None where this file is written through the page cache."""
        return None if self._direct is None else (self._offsets[name] + done) % BLOCK

    def finish(self) -> None:
        """Check that every tensor was written whole; flush."""
        for name, size in self._sizes.items():
            if self._written[name] != size:
                raise ValueError(f"tensor {name!r}: {self._written[name]} of its {size} bytes written")
        if self._direct is not None:
            self._direct.finish()
        self._f.flush()


class SafetensorsFile:
    """One safetensors file, read as stored tensors and written again tensor by tensor.

    Parameters
    ----------
    path : str
        The file.

    Attributes
    ----------
    path : str
    metadata : dict
        Its ``__metadata__``, written again unchanged.
    tensors : dict
        Name to :class:`StoredTensor`, sorted by name.
    """

    kind = "safetensors"

    def __init__(self, path: str):
        self.path = path
        self.metadata, self.tensors = stored_tensors(path)

    def write(
        self, dst: str, fill: Callable[[Mapping[str, TensorWriter]], R], *, made: Mapping[str, str] | None = None
    ) -> R:
        """Write `dst` atomically: the same tensors, filled in by ``fill(writers)``.

        ``fill`` receives each tensor name's :class:`TensorWriter` and must write every
        tensor whole; its result is returned. `made`, a provenance record
        (:mod:`arrayprune.adapters.provenance`), joins the metadata.
        """

        return self.write_tensors(dst, with_record(self.metadata, made), self.tensors, fill)

    @staticmethod
    def write_tensors(
        dst: str,
        metadata: Mapping[str, str],
        tensors: Mapping[str, StoredTensor],
        fill: Callable[[Mapping[str, TensorWriter]], R],
    ) -> R:
        """Write one safetensors file `dst` atomically, holding `tensors` filled in by ``fill``.

        Parameters
        ----------
        dst : str
            The file.
        metadata : mapping of str to str
            Its ``__metadata__``.
        tensors : mapping
            Name to :class:`StoredTensor` (names, dtypes, shapes, sizes), from any files.
        fill : callable
            Receives each tensor name's :class:`TensorWriter` and must write every
            tensor whole; its result is returned.
        """
        result: list[R] = []

        def write(f: IO[bytes]) -> None:
            writer = TensorWriter(f, metadata, tensors.values())
            result.append(fill(dict.fromkeys(tensors, writer)))
            writer.finish()

        atomic_write(dst, write)
        return result[0]


class BackgroundWrites:
    """The writes of :class:`TensorWriter` objects, done in order by one background thread.

    File writes release the GIL, so the thread writes one chunk while the caller reads
    and prunes the next: both cores of a small machine work. At most `depth` writes wait
    at a time (:meth:`write` blocks until one is done), so the memory held by waiting
    chunks stays bounded. Every write goes through the one thread in the order given, so
    each file sees exactly the writes a direct caller would make.

    Use as a context manager: leaving it normally waits for every write (and raises the
    first error of a write); leaving it by an exception (a termination signal turned into
    one, say) drops the waiting writes and waits for the one under way, so that nothing
    is written once the caller's cleanups start.

    Parameters
    ----------
    writers : mapping
        Tensor name to its :class:`TensorWriter`.
    depth : int
        How many writes may wait.
    """

    def __init__(self, writers: Mapping[str, TensorWriter], depth: int = 1):
        self._writers = writers
        self._issued: dict[str, int] = {}
        self._jobs: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="arrayprune-writes", daemon=True)
        self._thread.start()

    def __enter__(self) -> BackgroundWrites:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.close()
        else:
            self._stop()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            name, data, done = job
            if name is None:  # a wait: every write before it is done
                data.set()
            elif self._error is None:
                try:
                    self._writers[name].write(name, data)
                    if done is not None:
                        done(data)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                    self._error = exc

    def write(self, name: str, data: Any, done: Callable[[Any], None] | None = None) -> None:
        """Write `data` to tensor `name` (see :meth:`TensorWriter.write`) in the background.

        `data` must not change until it is written; ``done(data)`` is called then (to
        reuse its memory, say).
        """
        self._check()
        self._issued[name] = self._issued.get(name, 0) + memoryview(data).nbytes
        self._jobs.put((name, data, done))

    def phase(self, name: str, ahead: int = 0) -> int | None:
        """:meth:`TensorWriter.phase` of the bytes of tensor `name` that follow the
        ones written so far and `ahead` more."""
        return self._writers[name].phase(name, self._issued.get(name, 0) + ahead)

    def wait(self) -> None:
        """Wait until every write asked for so far is done."""
        event = threading.Event()
        self._jobs.put((None, event, None))
        event.wait()
        self._check()

    def close(self) -> None:
        """Wait for every write and stop the thread; raise the first error of a write."""
        self._jobs.put(None)
        self._thread.join()
        self._check()

    def _stop(self) -> None:
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self._jobs.put(None)
        self._thread.join()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
