"""``.safetensors`` files: memory-mapped NumPy views, or PyTorch tensors for dtypes NumPy lacks."""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from arrayprune.adapters.formats.record import with_record

from . import files
from .arrays import _flat_arrays, _to_torch, to_numpy
from .errors import FormatError, _describe, import_optional
from .files import _open_regular
from .weightfile import WeightFile

__all__ = ["DTYPE_BITS", "HEADER_MAX_BYTES", "Header", "load", "read_header", "save"]

_SAFETENSORS_NUMPY_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"}

_SAFETENSORS_TO_NUMPY = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "U16": "<u2", "I16": "<i2", "U32": "<u4",
    "I32": "<i4", "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8",
}


class _SafetensorsTensors(Mapping):
    """Tensors of a safetensors file, read on access.

    With NumPy dtypes only, each tensor is a read-only view of the memory-mapped file
    (no copy: the page cache holds the data, and the input cannot be written through
    it). Otherwise (bfloat16 and other dtypes NumPy lacks) safetensors reads a copy
    of the tensor on each access.
    """

    def __init__(self, handle: Any, names: list[str], views: dict[str, np.ndarray] | None = None):
        self._handle = handle
        self._names = names
        self._views = views

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        if self._views is not None:
            return self._views[name]
        return self._handle.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


#: Bits per entry of each safetensors dtype (F4 and F6 are packed).
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


#: The largest safetensors header read: the format's own limit (the ``safetensors``
#: crate refuses larger ones as ``HeaderTooLarge``).
HEADER_MAX_BYTES = 100_000_000


class Header(NamedTuple):
    """The validated header of a safetensors file.

    Attributes
    ----------
    metadata : dict
        The ``__metadata__`` strings, in the file's order (empty if none).
    names : list of str
        The tensor names in the order :func:`safetensors.safe_open` lists them (sorted).
    entries : dict
        Name to ``(dtype, shape, begin, end)``: the safetensors dtype code (``"BF16"``),
        the shape, and the tensor's byte range in the file (absolute offsets).
    """

    metadata: dict[str, str]
    names: list[str]
    entries: dict[str, tuple[str, tuple[int, ...], int, int]]


def read_header(path: str) -> Header:
    """Read and check the header of a safetensors file, without reading any tensor.

    `safe_open` validates the header (offsets inside the file, sizes that match the
    shapes and dtypes, no overlaps); it is read again here for what `safe_open` does not
    expose (byte offsets, the order of the metadata), and every byte range is checked
    all the same.

    Parameters
    ----------
    path : str
        A safetensors file.

    Returns
    -------
    Header

    Raises
    ------
    FormatError
        If the file is not a regular file, is truncated or corrupt, its header is
        larger than :data:`HEADER_MAX_BYTES` (refused before it is read), or it holds a
        dtype this module does not know.
    """
    safe_open = import_optional("safetensors", path, "reading safetensors files").safe_open
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(path, "truncated safetensors file (no header)")
        n = int.from_bytes(head, "little")
        if n > HEADER_MAX_BYTES:  # before reading it: a sparse file may claim gigabytes
            raise FormatError(
                path, f"safetensors header of {n} bytes, larger than the format's limit of {HEADER_MAX_BYTES}"
            )
        if n > size - 8:
            raise FormatError(path, f"truncated or corrupt safetensors file (header of {n} bytes in a file of {size})")
        raw = f.read(n)
    try:
        handle = safe_open(path, framework="numpy")
        names = list(handle.keys())
        header = json.loads(raw)
    except FormatError:
        raise
    except Exception as exc:
        raise FormatError(path, f"cannot read as safetensors: {_describe(exc)}") from None
    metadata = header.get("__metadata__") or {}
    start = 8 + n
    entries = {}
    for name in names:
        info = header[name]
        code = info["dtype"]
        if code not in DTYPE_BITS:
            raise FormatError(path, f"tensor {name!r}: dtype {code} is not supported")
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        if (end - begin) * 8 != DTYPE_BITS[code] * math.prod(shape) or not 0 <= begin <= end <= size - start:
            raise FormatError(path, f"tensor {name!r}: its byte range does not match its shape and dtype")
        entries[name] = (code, shape, start + begin, start + end)
    return Header(dict(metadata), names, entries)


def load(path: str) -> WeightFile:
    """Read a safetensors file: NumPy views, or PyTorch tensors for dtypes NumPy lacks."""
    safe_open = import_optional("safetensors", path, "reading safetensors files").safe_open
    header = read_header(path)
    names = header.names
    exotic = sorted({header.entries[k][0] for k in names} - _SAFETENSORS_NUMPY_DTYPES)
    if exotic:
        import_optional("torch", path, f"reading dtype {exotic[0]}")
        handle = safe_open(path, framework="pt")
        params = _SafetensorsTensors(handle, names)
        return WeightFile(path, "safetensors", params, {"metadata": header.metadata, "framework": "pt"})
    params = _SafetensorsTensors(None, names, _safetensors_views(path, header))
    return WeightFile(path, "safetensors", params, {"metadata": header.metadata, "framework": "numpy"})


def _safetensors_views(path: str, header: Header) -> dict[str, np.ndarray]:
    """Read-only NumPy views of the tensors of a safetensors file, on one memory map."""
    with _open_regular(path) as f:
        whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # outlives the file object
    views = {}
    for name in header.names:
        code, shape, begin, _ = header.entries[name]
        dtype = np.dtype(_SAFETENSORS_TO_NUMPY[code])
        views[name] = np.frombuffer(whole, dtype=dtype, count=math.prod(shape), offset=begin).reshape(shape)
    return views


def save(path: str, params: Mapping, like: WeightFile | None) -> None:
    """Write a safetensors file with the metadata of `like` (and its provenance record); atomically."""

    arrays = _flat_arrays(path, params, "safetensors")
    metadata = None
    if like is not None and like.format == "safetensors":
        metadata = dict(like.context.get("metadata") or {}) or None
    if like is not None and like.context.get("provenance"):
        metadata = with_record(metadata, like.context["provenance"])
    use_torch = any(type(v).__module__.split(".")[0] == "torch" for v in arrays.values())
    if use_torch:
        st_save = import_optional("safetensors.torch", path, "writing safetensors files").save
        tensors = {k: _to_torch(path, v).contiguous() for k, v in arrays.items()}
        data = st_save(_unshared(tensors), metadata=metadata)
    else:
        np_save = import_optional("safetensors.numpy", path, "writing safetensors files").save
        data = np_save({k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}, metadata=metadata)
    data = _metadata_sorted(data) if metadata and len(metadata) > 1 else data
    files.atomic_write(path, lambda f: f.write(data))


def _metadata_sorted(data: bytes) -> bytes:
    """`data` (a safetensors file) with its metadata keys sorted: the ``safetensors`` package
    orders them at random (a hash map), and the same command must write the same bytes.

    The header keeps its length (the same entries, reordered); `data` is returned as it is
    if its header is not the compact JSON that package writes."""
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n]
    header = json.loads(text, object_pairs_hook=dict)
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    new += b" " * (n - len(new))
    if len(new) != n or json.loads(new) != json.loads(text):
        return data
    return data[:8] + new + data[8 + n :]


def _unshared(tensors: dict[str, Any]) -> dict[str, Any]:
    """Tensors sharing memory (tied weights) copied apart: safetensors stores each name's data."""
    seen: set[int] = set()
    out = {}
    for k, t in tensors.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        out[k] = t.clone() if ptr and ptr in seen else t
        seen.add(ptr)
    return out
