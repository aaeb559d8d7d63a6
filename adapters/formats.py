"""Weight files in and out: ``.npz``, ``.safetensors``, ``.onnx`` and PyTorch state dicts.

:func:`load` reads a file into a :class:`WeightFile`, whose ``params`` is a mapping of
names to arrays that the functions of :mod:`arrayprune.adapters.mapping` work on;
:func:`save` writes such a mapping back. The format is recognised from the content
(zip magic and member names for ``.npz`` and PyTorch files, the header of a
safetensors file, the protobuf of an ONNX model, the pickle opcode of a legacy PyTorch
file); the suffix is consulted when the content is not recognised, so that a damaged
``model.safetensors`` is reported as a damaged safetensors file.

========================  ===========================================================
format                    ``params``
========================  ===========================================================
``npz``                   NumPy arrays, read with ``np.load(allow_pickle=False)``.
``safetensors``           Read-only NumPy views of the memory-mapped file (no copy);
                          PyTorch tensors, read on access, when a dtype NumPy lacks
                          (bfloat16, float8) is present and PyTorch is installed.
``onnx``                  The float initializers (float16/32/64) of the main graph as
                          NumPy arrays; external data is memory-mapped. Other
                          initializers, nodes and attributes are kept as they are.
``torch``                 What ``torch.load(weights_only=True)`` returns: a state dict
                          (or a nested checkpoint dict) of CPU tensors.
========================  ===========================================================

Safety: pickles are only ever read by ``torch.load(weights_only=True)``, which refuses
anything that is not plain tensors and containers without running it; ONNX external
data must lie inside the model's folder (absolute paths, ``..`` and symlinks leading
out are refused). Every problem is raised as :class:`FormatError`, whose message is one
line naming the file.

Writing goes to a temporary file in the destination folder, renamed into place with
:func:`os.replace` once complete: a destination is never left half written.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

__all__ = [
    "FORMATS",
    "FormatError",
    "WeightFile",
    "detect_format",
    "format_from_suffix",
    "load",
    "save",
    "atomic_write",
    "to_numpy",
]

FORMATS = ("npz", "safetensors", "onnx", "torch")

_SUFFIXES = {
    ".npz": "npz",
    ".safetensors": "safetensors",
    ".onnx": "onnx",
    ".pt": "torch",
    ".pth": "torch",
    ".bin": "torch",
    ".ckpt": "torch",
}

_ONNX_FLOAT_TYPES = (1, 10, 11)  # FLOAT, FLOAT16, DOUBLE
_SAFETENSORS_NUMPY_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"}
_EXTERNAL_THRESHOLD = 1024  # bytes: smaller tensors stay inside an ONNX model written with external data
_PROTOBUF_LIMIT = 2**31 - 2**20


class FormatError(Exception):
    """A file that cannot be read or written, with a one-line reason.

    Parameters
    ----------
    path : str or os.PathLike
        The file concerned.
    problem : str
        What is wrong, one line.
    """

    def __init__(self, path: Any, problem: str):
        self.path = os.fspath(path)
        self.problem = _one_line(problem)
        super().__init__(f"{self.path}: {self.problem}")


@dataclass
class WeightFile:
    """A weight file read by :func:`load`.

    Attributes
    ----------
    path : str
        Where it was read from.
    format : str
        One of :data:`FORMATS`.
    params : mapping
        Names to arrays (nested mappings for PyTorch checkpoints that nest them).
    context : dict
        What else :func:`save` needs to write the file again in its format (the ONNX
        model, safetensors metadata, npz compression).
    """

    path: str
    format: str
    params: Mapping[str, Any]
    context: dict[str, Any] = field(default_factory=dict)


def _one_line(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return " ".join(lines[:1]) if lines else "unknown error"


def _describe(exc: BaseException) -> str:
    text = _one_line(str(exc))
    if len(text) > 160:  # libraries explain at length; the first sentence says what is wrong
        cut = text.find(". ", 20)
        text = text[: cut + 1] if 0 < cut < 160 else text[:157] + "..."
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != "unknown error" else name


# --------------------------------------------------------------------------------------
# Recognising a format
# --------------------------------------------------------------------------------------


def format_from_suffix(path: Any) -> str | None:
    """The format a file name suggests (``'npz'``, ...), or None.

    Parameters
    ----------
    path : str or os.PathLike
        A file name.

    Returns
    -------
    str or None
        The format, from the (lower-cased) suffix.
    """
    return _SUFFIXES.get(os.path.splitext(os.fspath(path))[1].lower())


def detect_format(path: Any) -> str:
    """Recognise the format of a file from its content, then its suffix.

    Parameters
    ----------
    path : str or os.PathLike
        An existing file.

    Returns
    -------
    str
        One of :data:`FORMATS`.

    Raises
    ------
    FormatError
        If the file cannot be read or its format is not recognised.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(16)
    except IsADirectoryError:
        raise FormatError(path, "is a directory") from None
    except OSError as exc:
        raise FormatError(path, exc.strerror or _describe(exc)) from None
    if size == 0:
        raise FormatError(path, "empty file")
    suffix = format_from_suffix(path)
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise FormatError(path, f"corrupt or truncated zip archive ({_describe(exc)})") from None
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "torch"
        if all(n.endswith(".npy") for n in names):
            return "npz"
        raise FormatError(path, "zip archive that is neither an .npz file nor a PyTorch file")
    if len(head) >= 9:
        n = int.from_bytes(head[:8], "little")
        if 2 <= n <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "torch"  # a pickle: a legacy (non-zip) torch.save file
    if suffix == "onnx":
        return "onnx"
    if head[:1] == b"\x08" and size < _PROTOBUF_LIMIT:  # field 1 (ir_version) opens an ONNX model
        try:
            _parse_onnx(path)
            return "onnx"
        except FormatError:
            pass
    if suffix is not None:
        return suffix  # not recognised by content: let that format's reader say what is wrong
    raise FormatError(path, "unrecognised file format (expected .npz, .safetensors, .onnx or a PyTorch state dict)")


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load(path: Any, format: str | None = None) -> WeightFile:
    """Read a weight file.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    format : str, optional
        One of :data:`FORMATS`; recognised with :func:`detect_format` if omitted.

    Returns
    -------
    WeightFile
        The arrays and what is needed to write them back.

    Raises
    ------
    FormatError
        If the file cannot be read, is corrupt, or holds something other than weights.
    """
    path = os.fspath(path)
    fmt = format or detect_format(path)
    readers: dict[str, Callable[[str], WeightFile]] = {
        "npz": _load_npz,
        "safetensors": _load_safetensors,
        "onnx": _load_onnx,
        "torch": _load_torch,
    }
    if fmt not in readers:
        raise FormatError(path, f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:
        return readers[fmt](path)
    except FormatError:
        raise
    except MemoryError:
        raise FormatError(path, "out of memory while reading") from None
    except Exception as exc:  # every library has its own errors for damaged files
        raise FormatError(path, f"cannot read as {fmt}: {_describe(exc)}") from None


def _load_npz(path: str) -> WeightFile:
    params: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            compressed = any(i.compress_type != zipfile.ZIP_STORED for i in zf.infolist())
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise FormatError(path, "not an .npz archive")
            for name in z.files:
                try:
                    params[name] = z[name]
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        problem = f"array {name!r} holds Python objects, refused (allow_pickle=False)"
                        raise FormatError(path, problem) from None
                    raise
    except (zipfile.BadZipFile, EOFError) as exc:
        raise FormatError(path, f"corrupt or truncated .npz archive ({_describe(exc)})") from None
    return WeightFile(path, "npz", params, {"compressed": compressed})


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


def _load_safetensors(path: str) -> WeightFile:
    from safetensors import safe_open

    with open(path, "rb") as f:
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
        try:
            import torch  # noqa: F401
        except ImportError:
            raise FormatError(path, f"dtype {exotic[0]} needs PyTorch to be read (pip install torch)") from None
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
    with open(path, "rb") as f:
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


def _parse_onnx(path: str) -> Any:
    try:
        import onnx
    except ImportError:
        raise FormatError(path, "reading ONNX models needs the 'onnx' package (pip install onnx)") from None
    try:
        model = onnx.load_model(path, load_external_data=False)
    except Exception as exc:
        raise FormatError(path, f"not a valid ONNX model ({_describe(exc)})") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise FormatError(path, "not a valid ONNX model (truncated, or no graph / opset)")
    return model


def _check_inside(path: str, location: str, what: str) -> str:
    """Resolve an external-data `location` of the model at `path`, refusing escapes."""
    if not location:
        raise FormatError(path, f"{what}: external data without a location")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location):
        raise FormatError(
            path, f"{what}: external data path {location!r} is absolute; it must lie inside the model's folder"
        )
    parts = re.split(r"[\\/]+", location)
    if ".." in parts:
        raise FormatError(path, f"{what}: external data path {location!r} leads outside the model's folder")
    base = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    real = os.path.realpath(os.path.join(base, *parts))
    if os.path.commonpath([base, real]) != base:
        raise FormatError(path, f"{what}: external data path {location!r} leads outside the model's folder (symlink)")
    if not os.path.isfile(real):
        raise FormatError(path, f"{what}: external data file {location!r} not found")
    return real


def _read_external(path: str, tensor: Any) -> np.ndarray:
    from onnx import helper

    info = {e.key: e.value for e in tensor.external_data}
    what = f"initializer {tensor.name!r}"
    real = _check_inside(path, info.get("location", ""), what)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    shape = tuple(int(d) for d in tensor.dims)
    nbytes = math.prod(shape) * dtype.itemsize
    offset = int(info.get("offset", 0) or 0)
    if "length" in info and int(info["length"]) != nbytes:
        raise FormatError(path, f"{what}: external data length {info['length']} does not match its shape {shape}")
    available = os.path.getsize(real)
    if offset < 0 or offset + nbytes > available:
        raise FormatError(path, f"{what}: external data file {info['location']!r} is too short (truncated?)")
    if nbytes == 0:
        return np.zeros(shape, dtype)
    mm = np.memmap(real, dtype=dtype, mode="r", offset=offset, shape=(math.prod(shape),))
    return np.asarray(mm).reshape(shape)


def _load_onnx(path: str) -> WeightFile:
    import onnx
    from onnx import numpy_helper

    model = _parse_onnx(path)
    params: dict[str, np.ndarray] = {}
    external: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    for tensor in model.graph.initializer:
        if tensor.name in seen:
            raise FormatError(path, f"initializer {tensor.name!r} appears twice")
        seen.add(tensor.name)
        is_external = tensor.data_location == onnx.TensorProto.EXTERNAL
        if is_external:
            if tensor.data_type == onnx.TensorProto.STRING:
                raise FormatError(path, f"initializer {tensor.name!r}: external string data is not supported")
            arr = _read_external(path, tensor)
            external[tensor.name] = arr
        elif tensor.data_type in _ONNX_FLOAT_TYPES:
            arr = numpy_helper.to_array(tensor)
        else:
            continue
        if tensor.data_type in _ONNX_FLOAT_TYPES:
            params[tensor.name] = arr
    return WeightFile(path, "onnx", params, {"model": model, "external": external})


def _load_torch(path: str) -> WeightFile:
    try:
        import torch
    except ImportError:
        raise FormatError(path, "reading PyTorch files needs the 'torch' package (pip install torch)") from None
    import pickle

    is_zip = zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"GLOBAL\s+([\w.]*\w\.\w[\w.]*?)\.?(?:\s|$)", text)
        reason = f"global {found.group(1)}" if found else None
        if reason is not None:
            raise FormatError(
                path,
                "refused: the pickle holds objects other than tensors, which could run code"
                + (f" ({reason})" if reason else ""),
            ) from None
        if "Weights only load failed" in text:
            raise FormatError(
                path, "corrupt or truncated PyTorch file, or one holding objects other than tensors (refused)"
            ) from None
        raise FormatError(path, f"corrupt PyTorch file ({_describe(exc)})") from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, ValueError) as exc:
        raise FormatError(path, f"corrupt or truncated PyTorch file ({_describe(exc)})") from None
    if not isinstance(obj, Mapping):
        raise FormatError(path, f"holds a {type(obj).__name__}, not a mapping of names to tensors")
    return WeightFile(path, "torch", obj, {})


# --------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------


def atomic_write(path: Any, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file through a temporary file in its folder, renamed into place at the end.

    Parameters
    ----------
    path : str or os.PathLike
        The destination.
    write : callable
        Called with a binary file object open for writing; what it writes becomes the
        file. If it raises, the destination is left as it was.

    Raises
    ------
    FormatError
        If the folder does not exist or cannot be written.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FormatError(path, f"folder {folder!r} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    except OSError as exc:
        raise FormatError(path, f"cannot write in {folder!r}: {exc.strerror or _describe(exc)}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array with the values of `x` (a NumPy array, PyTorch tensor, ...).

    Parameters
    ----------
    x : array
        Any array on the host, or on a device it can be copied from.

    Returns
    -------
    numpy.ndarray
        `x` itself for NumPy arrays, a host copy or view otherwise.
    """
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return x.detach().cpu().numpy()
    if mod == "cupy":
        return x.get()
    return np.asarray(x)


def _to_torch(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.array(to_numpy(x), copy=True))


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, Mapping)


def _flat_arrays(path: str, params: Mapping, fmt: str) -> dict[str, Any]:
    """Flatten nested mappings with '/'-joined names; refuse non-array entries."""
    out: dict[str, Any] = {}

    def walk(node: Mapping, prefix: str) -> None:
        for k, v in node.items():
            name = f"{prefix}{k}"
            if isinstance(v, Mapping):
                walk(v, name + "/")
            elif _is_array(v):
                if name in out:
                    raise FormatError(path, f"two entries are both named {name!r}")
                out[name] = v
            else:
                raise FormatError(path, f"cannot store {name!r} (a {type(v).__name__}) in a {fmt} file")

    walk(params, "")
    return out


def save(path: Any, params: Mapping, format: str | None = None, *, like: WeightFile | None = None) -> None:
    """Write arrays to a weight file, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        The destination.
    params : mapping
        Names to arrays. Nested mappings are written as they are to PyTorch files and
        with '/'-joined names elsewhere.
    format : str, optional
        One of :data:`FORMATS`; from the suffix of `path` if omitted, else the format
        of `like`.
    like : WeightFile, optional
        The file `params` came from: its safetensors metadata and npz compression are
        kept, and an ONNX model is written as `like`'s model with `params` as its
        initializers (required for ONNX).

    Raises
    ------
    FormatError
        If `params` cannot be stored in the format, or writing fails.
    """
    path = os.fspath(path)
    fmt = format or format_from_suffix(path) or (like.format if like is not None else None)
    if fmt is None:
        raise FormatError(path, "cannot tell the format from the file name (use .npz, .safetensors, .onnx or .pt)")
    try:
        if fmt == "npz":
            _save_npz(path, params, like)
        elif fmt == "safetensors":
            _save_safetensors(path, params, like)
        elif fmt == "onnx":
            _save_onnx(path, params, like)
        elif fmt == "torch":
            _save_torch(path, params)
        else:
            raise FormatError(path, f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    except FormatError:
        raise
    except Exception as exc:
        raise FormatError(path, f"cannot write as {fmt}: {_describe(exc)}") from None


def _save_npz(path: str, params: Mapping, like: WeightFile | None) -> None:
    arrays = {k: to_numpy(v) for k, v in _flat_arrays(path, params, "npz").items()}
    for k, v in arrays.items():
        if v.dtype.hasobject:
            raise FormatError(path, f"cannot store {k!r}: object arrays are not weights")
    compressed = bool(like is not None and like.format == "npz" and like.context.get("compressed"))
    compression = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED

    def write(f: IO[bytes]) -> None:
        with zipfile.ZipFile(f, "w", compression=compression, allowZip64=True) as zf:
            for k, v in arrays.items():
                with zf.open(k + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(v), allow_pickle=False)

    atomic_write(path, write)


def _save_safetensors(path: str, params: Mapping, like: WeightFile | None) -> None:
    arrays = _flat_arrays(path, params, "safetensors")
    metadata = None
    if like is not None and like.format == "safetensors":
        metadata = dict(like.context.get("metadata") or {}) or None
    use_torch = any(type(v).__module__.split(".")[0] == "torch" for v in arrays.values())
    if use_torch:
        from safetensors.torch import save as st_save

        tensors = {k: _to_torch(v).contiguous() for k, v in arrays.items()}
        data = st_save(tensors, metadata=metadata)
    else:
        from safetensors.numpy import save as np_save

        data = np_save({k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}, metadata=metadata)
    atomic_write(path, lambda f: f.write(data))


def _save_torch(path: str, params: Mapping) -> None:
    import torch

    def convert(node: Any) -> Any:
        if isinstance(node, Mapping):
            out: Any = OrderedDict() if isinstance(node, OrderedDict) else {}
            for k, v in node.items():
                out[k] = convert(v)
            meta = getattr(node, "_metadata", None)
            if meta is not None and isinstance(out, OrderedDict):
                out._metadata = meta
            return out
        if _is_array(node) and not isinstance(node, torch.Tensor):
            return _to_torch(node)
        return node

    obj = convert(params)
    atomic_write(path, lambda f: torch.save(obj, f))


def _save_onnx(path: str, params: Mapping, like: WeightFile | None) -> None:
    import onnx
    from onnx import numpy_helper

    if like is None or like.format != "onnx":
        raise FormatError(path, "an ONNX model can only be written from an ONNX model (its graph is needed)")
    model = onnx.ModelProto()
    model.CopyFrom(like.context["model"])
    external: dict[str, np.ndarray] = like.context.get("external", {})
    flat = _flat_arrays(path, params, "onnx")
    by_name = {t.name: t for t in model.graph.initializer}
    unknown = [k for k in flat if k not in by_name]
    if unknown:
        raise FormatError(
            path, f"{unknown[0]!r} is not an initializer of the model (an ONNX model stores effective weights only)"
        )
    for tensor in model.graph.initializer:
        if tensor.name in flat:
            arr = to_numpy(flat[tensor.name])
            want = tuple(int(d) for d in tensor.dims)
            if tuple(arr.shape) != want:
                raise FormatError(path, f"initializer {tensor.name!r} has shape {want}, got {tuple(arr.shape)}")
            from onnx import helper

            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
            if arr.dtype != dtype:
                raise FormatError(path, f"initializer {tensor.name!r} has dtype {dtype}, got {arr.dtype}")
        elif tensor.name in external:
            arr = external[tensor.name]
        else:
            continue
        doc = tensor.doc_string
        new = numpy_helper.from_array(np.ascontiguousarray(arr), tensor.name)
        if doc:
            new.doc_string = doc
        tensor.CopyFrom(new)

    use_external = bool(external) or model.ByteSize() > _PROTOBUF_LIMIT
    if use_external:
        data_name = os.path.basename(path) + ".data"
        blob_parts: list[bytes] = []
        offset = 0
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data") and len(tensor.raw_data) >= _EXTERNAL_THRESHOLD:
                raw = tensor.raw_data
                pad = (-offset) % 64
                if pad:
                    blob_parts.append(b"\0" * pad)
                    offset += pad
                blob_parts.append(raw)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                offset += len(raw)

        def write_data(f: IO[bytes]) -> None:
            for part in blob_parts:
                f.write(part)

        atomic_write(os.path.join(os.path.dirname(os.path.abspath(path)), data_name), write_data)
    data = model.SerializeToString()
    atomic_write(path, lambda f: f.write(data))
