"""``.safetensors`` files: memory-mapped NumPy views, or PyTorch tensors for dtypes NumPy lacks."""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import files
from .arrays import _flat_arrays, _to_torch, to_numpy
from .errors import FormatError, import_optional
from .files import _open_regular
from .weightfile import WeightFile

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


def load(path: str) -> WeightFile:
    """Read a safetensors file: NumPy views, or PyTorch tensors for dtypes NumPy lacks."""
    safe_open = import_optional("safetensors", path, "reading safetensors files").safe_open

    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
    if len(head) < 8:
        raise FormatError(path, "truncated safetensors file (no header)")
    n = int.from_bytes(head, "little")
    if n > size - 8:
        raise FormatError(path, f"truncated or corrupt safetensors file (header of {n} bytes in a file of {size})")
    framework = "numpy"
    handle = safe_open(path, framework=framework)
    names = list(handle.keys())
    dtypes = {handle.get_slice(k).get_dtype() for k in names}
    exotic = sorted(dtypes - _SAFETENSORS_NUMPY_DTYPES)
    if exotic:
        import_optional("torch", path, f"reading dtype {exotic[0]}")
        framework = "pt"
        handle = safe_open(path, framework=framework)
    views = _safetensors_views(path, n, names) if framework == "numpy" else None
    params = _SafetensorsTensors(handle, names, views)
    return WeightFile(path, "safetensors", params, {"metadata": handle.metadata() or {}, "framework": framework})


def _safetensors_views(path: str, header_size: int, names: list[str]) -> dict[str, np.ndarray]:
    """Read-only NumPy views of the tensors of a safetensors file that `safe_open` accepted.

    `safe_open` has validated the header (offsets inside the file, sizes that match the
    shapes and dtypes, no overlaps); the header is read again here for the offsets it
    does not expose, and each view is checked against its byte range all the same.
    """
    with _open_regular(path) as f:
        f.seek(8)
        header = json.loads(f.read(header_size))
        whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # outlives the file object
    start = 8 + header_size
    views = {}
    for name in names:
        info = header[name]
        dtype = np.dtype(_SAFETENSORS_TO_NUMPY[info["dtype"]])
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        count = math.prod(shape)
        if end - begin != dtype.itemsize * count or not 0 <= begin <= end <= len(whole) - start:
            raise FormatError(path, f"tensor {name!r}: its byte range does not match its shape and dtype")
        views[name] = np.frombuffer(whole, dtype=dtype, count=count, offset=start + begin).reshape(shape)
    return views


def save(path: str, params: Mapping, like: WeightFile | None) -> None:
    """Write a safetensors file with the metadata of `like`; atomically."""
    arrays = _flat_arrays(path, params, "safetensors")
    metadata = None
    if like is not None and like.format == "safetensors":
        metadata = dict(like.context.get("metadata") or {}) or None
    use_torch = any(type(v).__module__.split(".")[0] == "torch" for v in arrays.values())
    if use_torch:
        st_save = import_optional("safetensors.torch", path, "writing safetensors files").save
        tensors = {k: _to_torch(path, v).contiguous() for k, v in arrays.items()}
        data = st_save(_unshared(tensors), metadata=metadata)
    else:
        np_save = import_optional("safetensors.numpy", path, "writing safetensors files").save
        data = np_save({k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}, metadata=metadata)
    files.atomic_write(path, lambda f: f.write(data))


def _unshared(tensors: dict[str, Any]) -> dict[str, Any]:
    """Tensors sharing memory (tied weights) copied apart: safetensors stores each name's data."""
    seen: set[int] = set()
    out = {}
    for k, t in tensors.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        out[k] = t.clone() if ptr and ptr in seen else t
        seen.add(ptr)
    return out
