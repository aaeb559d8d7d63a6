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

Safety
------
- No code runs from a file: pickles are only ever read by ``torch.load(weights_only=True)``,
  which refuses anything that is not plain tensors and containers without running it;
  ``.npz`` files are read with ``allow_pickle=False``.
- ONNX external data must lie inside the model's folder (absolute paths, ``..`` and
  symlinks leading out are refused).
- Only regular files are read (after following symlinks): a FIFO, device or socket given
  as a model or as ONNX external data is refused before it is opened, instead of blocking.
- ``.npz`` members are checked before they are inflated: the npy header must describe
  exactly the bytes of the member, the arrays must fit in :func:`memory_limit` (derived
  from the memory available: ``MemAvailable``, the ``RLIMIT_AS`` / ``RLIMIT_DATA`` of the
  process less what it uses, the cgroup's ``memory.max`` less its anonymous memory; set
  it with :data:`MEMORY_LIMIT` or the environment variable ``ARRAYPRUNE_MEMORY_LIMIT``,
  e.g. ``8G``), and a member of :data:`NPZ_RATIO_MIN_SIZE` (256 MiB) or more may not be
  compressed more than :data:`NPZ_MAX_RATIO` (1000:1, which only a nearly constant
  array reaches: deflate's limit is about 1032:1; ``ARRAYPRUNE_NPZ_MAX_RATIO=0`` turns the
  check off). Refusals are immediate, without inflating anything.
- Missing optional packages are named with the extra that installs them
  (``pip install "arrayprune[onnx]"``).

Every problem is raised as :class:`FormatError`, whose message is one line naming the
file.

Writing is atomic: a destination is either left as it was or replaced whole, never half
written. Each file goes to a temporary file ``.NAME.XXXXXXXX.tmp`` in the destination
folder, is flushed to disk (``fsync``) and renamed into place with :func:`os.replace`.
An ONNX model with external data is replaced as a unit: its data is written first under
a name that no file has yet, ``OUT.onnx.data`` or else ``OUT.onnx.<8 hex digits>.data``
(random), which only the new model references; the model is renamed into place last.
Only then are the data files of the old ``OUT`` removed, and only those that the old
model referenced, that are named after ``OUT`` (``OUT.onnx.data``, ``OUT.onnx.*.data``)
and that the new model does not use (so data shared with other models is never removed;
when ``OUT`` is the input, its old data is unlinked while the input's arrays stay valid:
they are memory maps, which survive the unlink on POSIX). At every instant ``OUT`` loads
as the complete old model or the complete new one; a failed write removes every file it
created. Two processes writing the same destination at once are not supported.

A write in the main thread turns SIGTERM and SIGHUP (while they have their default
action) into an exception, so that its temporary files are removed, and the process
then exits with status 128 + the signal number; :func:`cleanup_on_signals` does the same
around any block of code (the command line wraps its whole run in it). SIGINT raises
:class:`KeyboardInterrupt`, which cleans up likewise. A process killed by SIGKILL may
leave a temporary file (``.NAME.*.tmp``) or an unreferenced data file, never a damaged
destination.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import math
import mmap
import os
import re
import secrets
import signal
import stat
import tempfile
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any

import numpy as np

__all__ = [
    "FORMATS",
    "MEMORY_LIMIT",
    "NPZ_MAX_RATIO",
    "NPZ_RATIO_MIN_SIZE",
    "FormatError",
    "WeightFile",
    "atomic_write",
    "cleanup_on_signals",
    "detect_format",
    "format_from_suffix",
    "load",
    "memory_limit",
    "save",
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

MEMORY_LIMIT: int | None = None
"""Bytes that the arrays of an ``.npz`` file may take once inflated; None (the default)
derives the limit from the memory available (see :func:`memory_limit`)."""

NPZ_MAX_RATIO = 1000
"""Largest compression ratio (inflated / compressed bytes) accepted for an ``.npz``
member of :data:`NPZ_RATIO_MIN_SIZE` bytes or more; 0 disables the check. Environment
variable: ``ARRAYPRUNE_NPZ_MAX_RATIO``."""

NPZ_RATIO_MIN_SIZE = 256 * 2**20
"""Inflated size from which :data:`NPZ_MAX_RATIO` applies (256 MiB)."""

# Optional dependencies: import name -> the extra of arrayprune that installs it.
_EXTRAS = {"onnx": "onnx", "safetensors": "safetensors", "torch": "torch"}


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


def _optional(module: str, path: Any, purpose: str) -> ModuleType:
    """Import an optional dependency, or raise :class:`FormatError` naming its extra.

    Parameters
    ----------
    module : str
        What to import, e.g. ``'onnx'`` or ``'safetensors.numpy'``.
    path : str or os.PathLike
        The file being read or written, for the message.
    purpose : str
        What needs the module, e.g. ``'reading ONNX models'``.

    Returns
    -------
    module
        The imported module.
    """
    top = module.split(".")[0]
    try:
        importlib.import_module(top)  # first: a cached submodule must not hide a missing package
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(top, top)
        raise FormatError(
            path, f'{purpose} needs {top}: pip install "arrayprune[{extra}]" ({_describe(exc)})'
        ) from None


_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def _require_regular(path: str) -> os.stat_result:
    """Stat `path` (following symlinks); refuse anything but an existing regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FormatError(path, exc.strerror or _describe(exc)) from None
    problem = _not_regular(st.st_mode)
    if problem:
        raise FormatError(path, problem)
    return st


def _open_regular(path: str) -> IO[bytes]:
    """Open a regular file for reading without ever blocking on a FIFO or device."""
    _require_regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FormatError(path, exc.strerror or _describe(exc)) from None
    problem = _not_regular(os.fstat(fd).st_mode)  # replaced between stat and open
    if problem:
        os.close(fd)
        raise FormatError(path, problem)
    return os.fdopen(fd, "rb")


def _fsync_dir(folder: str) -> None:
    """Make renames in `folder` durable (where the platform allows it)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _bytes(n: int) -> str:
    """A size for messages: '2.5 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


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
        If the file cannot be read, is not a regular file (a FIFO, device, socket or
        directory, after following symlinks), or its format is not recognised.
    """
    path = os.fspath(path)
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(16)
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
        If the file cannot be read, is not a regular file, is corrupt, holds something
        other than weights, or (``.npz``) would inflate beyond :func:`memory_limit`.
    """
    path = os.fspath(path)
    _require_regular(path)  # a FIFO or device would block or never end
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
            _check_npz_sizes(path, zf)
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


def _parse_size(text: str) -> int:
    """'8G', '512M', '1.5GiB', '1000000' -> bytes."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not found:
        raise ValueError(f"not a size: {text!r} (examples: 8G, 512M, 1000000)")
    unit = found.group(2).lower()
    scale = 1024 ** ("kmgt".index(unit) + 1) if unit else 1
    return int(float(found.group(1)) * scale)


def _proc_kib(path: str, key: str) -> int | None:
    """A ``Key:   123 kB`` value from /proc/meminfo or /proc/self/status, in bytes."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat_value(path: str, key: str) -> int | None:
    """A ``key 123`` value (bytes) from a cgroup ``memory.stat`` file."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # missing, or 'max'


def memory_limit() -> int:
    """Bytes that the arrays of an ``.npz`` file may take once inflated.

    :data:`MEMORY_LIMIT` if set, else the environment variable
    ``ARRAYPRUNE_MEMORY_LIMIT`` (bytes, or with a suffix: ``512M``, ``8G``), else the
    smallest of: the memory available (``MemAvailable`` of ``/proc/meminfo``, or
    ``SC_AVPHYS_PAGES``), the soft ``RLIMIT_AS`` and ``RLIMIT_DATA`` of the process
    less its current virtual size and data, and the cgroup's ``memory.max`` less the
    anonymous memory its processes hold (``memory.stat``; ``memory.current`` if absent).

    Returns
    -------
    int
        The limit in bytes (``2**63 - 1`` when nothing is known).
    """
    if MEMORY_LIMIT is not None:
        return int(MEMORY_LIMIT)
    env = os.environ.get("ARRAYPRUNE_MEMORY_LIMIT", "").strip()
    if env:
        return _parse_size(env)
    found: list[int] = []
    available = _proc_kib("/proc/meminfo", "MemAvailable")
    if available is None and hasattr(os, "sysconf"):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = None
    if available is not None:
        found.append(available)
    try:
        import resource
    except ImportError:  # not on Windows
        resource = None  # type: ignore[assignment]
    if resource is not None:
        for name, used_key in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
            which = getattr(resource, name, None)
            if which is None:
                continue
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft >= 0:
                used = _proc_kib("/proc/self/status", used_key) or 0
                found.append(max(0, soft - used))
    cg_max = _read_int("/sys/fs/cgroup/memory.max")
    if cg_max is not None:  # less what the cgroup's processes hold (the page cache can be reclaimed)
        anon = _stat_value("/sys/fs/cgroup/memory.stat", "anon")
        used = anon if anon is not None else _read_int("/sys/fs/cgroup/memory.current") or 0
        found.append(max(0, cg_max - used))
    return min(found) if found else 2**63 - 1


def _npz_max_ratio() -> float:
    env = os.environ.get("ARRAYPRUNE_NPZ_MAX_RATIO", "").strip()
    return float(env) if env else float(NPZ_MAX_RATIO)


def _npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """Shape, dtype and header length of an npy stream, or None if it is not one."""
    magic = stream.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        return None
    major = magic[6]
    width = 2 if major == 1 else 4
    raw = stream.read(width)
    if len(raw) < width:
        raise ValueError("truncated npy header")
    n = int.from_bytes(raw, "little")
    if n > 100_000:
        raise ValueError(f"npy header of {n} bytes")
    text = stream.read(n)
    if len(text) < n:
        raise ValueError("truncated npy header")
    header = ast.literal_eval(text.decode("utf8" if major >= 3 else "latin1"))
    if not isinstance(header, dict) or not {"descr", "shape", "fortran_order"} <= header.keys():
        raise ValueError("npy header without descr, shape and fortran_order")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"npy header with shape {shape!r}")
    dtype = np.lib.format.descr_to_dtype(header["descr"])
    return shape, dtype, 8 + width + n


def _check_npz_sizes(path: str, zf: zipfile.ZipFile) -> None:
    """Refuse, before inflating anything, members that would not fit or do not add up."""
    limit = memory_limit()
    max_ratio = _npz_max_ratio()
    total = 0
    for info in zf.infolist():
        name = info.filename.removesuffix(".npy")
        size = info.file_size
        if max_ratio > 0 and info.compress_type != zipfile.ZIP_STORED and size >= NPZ_RATIO_MIN_SIZE:
            ratio = size / max(info.compress_size, 1)
            if ratio > max_ratio:
                raise FormatError(
                    path,
                    f"array {name!r} is implausibly compressed ({_bytes(size)} from {_bytes(info.compress_size)}, "
                    f"{ratio:.0f}:1; at most {max_ratio:.0f}:1 above {_bytes(NPZ_RATIO_MIN_SIZE)}): "
                    "refused as a possible zip bomb (ARRAYPRUNE_NPZ_MAX_RATIO=0 turns the check off)",
                )
        total += size
        if size > limit or total > limit:
            if size > limit:
                what = f"array {name!r} inflates to {_bytes(size)}"
            else:
                what = f"the arrays inflate to {_bytes(total)} or more"
            raise FormatError(
                path,
                f"{what}, more than the {_bytes(limit)} of memory available (ARRAYPRUNE_MEMORY_LIMIT sets the limit)",
            )
        if not info.filename.endswith(".npy"):
            continue
        with zf.open(info) as member:
            try:
                header = _npy_header(member)
            except (ValueError, SyntaxError, TypeError, MemoryError) as exc:
                raise FormatError(path, f"array {name!r}: bad npy header ({_describe(exc)})") from None
        if header is None:
            raise FormatError(path, f"member {info.filename!r} is not an npy array")
        shape, dtype, header_len = header
        if dtype.hasobject:
            continue  # refused when read (allow_pickle=False)
        nbytes = math.prod(shape) * dtype.itemsize
        if header_len + nbytes != size:
            raise FormatError(
                path,
                f"array {name!r}: its header declares shape {shape} of {dtype} ({nbytes} bytes), "
                f"but the member holds {size - header_len} (corrupt or crafted)",
            )


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
    safe_open = _optional("safetensors", path, "reading safetensors files").safe_open

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
        _optional("torch", path, f"reading dtype {exotic[0]}")
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


def _parse_onnx(path: str) -> Any:
    onnx = _optional("onnx", path, "reading ONNX models")
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
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise FormatError(path, f"{what}: external data file {location!r} not found") from None
    problem = _not_regular(mode)
    if problem:
        raise FormatError(path, f"{what}: external data file {location!r} {problem}")
    return real


def _read_external(path: str, tensor: Any) -> np.ndarray:
    helper = _optional("onnx.helper", path, "reading ONNX models")

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
    onnx = _optional("onnx", path, "reading ONNX models")
    numpy_helper = _optional("onnx.numpy_helper", path, "reading ONNX models")

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
    torch = _optional("torch", path, "reading PyTorch files")
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


_TERM_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _Terminated(BaseException):
    """A termination signal turned into an exception (a BaseException, like
    KeyboardInterrupt, so that ``except Exception`` lets it through to the cleanups)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_signals_state: dict[str, Any] = {"active": False, "received": None}


def _on_termination(signum: int, frame: Any) -> None:
    if _signals_state["received"] is not None:
        return  # a second signal while the first one's cleanups run: they finish first
    _signals_state["received"] = signum
    raise _Terminated(signum)


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception inside the block, then exit.

    While the block runs, these signals raise an exception in the main thread, so that
    ``finally`` clauses and cleanups (such as the removal of the temporary files of
    :func:`atomic_write`) run; the exception is then turned into
    ``SystemExit(128 + signum)`` (143 for SIGTERM, 129 for SIGHUP), the status a shell
    reports for a process killed by the signal. A second signal during the cleanups is
    ignored. The previous handlers are restored when the block ends.

    Only signals whose action is the default (termination) are taken over: signals that
    are ignored or already handled by the program are left alone. Outside the main
    thread (where Python cannot set handlers), and inside another such block, it does
    nothing. :func:`save` and :func:`atomic_write` use it themselves; a command-line
    program wraps its whole run in it::

        with formats.cleanup_on_signals():
            return run(args)

    Yields
    ------
    None

    Raises
    ------
    SystemExit
        With status 128 + the signal number, when one of the signals arrived.
    """
    if _signals_state["active"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for signum in _TERM_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                previous[signum] = signal.signal(signum, _on_termination)
        except (ValueError, OSError):  # pragma: no cover - a platform without it
            pass
    _signals_state["active"] = True

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _signals_state["active"] = False

    try:
        try:
            yield
        finally:
            restore()
    except _Terminated as exc:
        restore()  # again: the signal may have come while restoring
        _signals_state["received"] = None
        raise SystemExit(128 + exc.signum) from None


def atomic_write(path: Any, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file through a temporary file in its folder, renamed into place at the end.

    The temporary file is ``.NAME.XXXXXXXX.tmp`` in the destination's folder; it is
    flushed to disk (``fsync``) before :func:`os.replace` renames it into place, and the
    folder is synced after. If `write` or any step fails, or SIGINT, SIGTERM or SIGHUP
    arrives (see :func:`cleanup_on_signals`), the temporary file is removed and the
    destination is left as it was.

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
    with cleanup_on_signals():
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
        _fsync_dir(folder)


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

    Raises
    ------
    ValueError
        For a PyTorch tensor on the ``meta`` device, which has no data.
    """
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        if getattr(x, "is_meta", False):
            raise ValueError("tensor is on the meta device: it has no data")
        return x.detach().cpu().numpy()
    if mod == "cupy":
        return x.get()
    return np.asarray(x)


def _to_torch(path: str, x: Any) -> Any:
    torch = _optional("torch", path, "writing PyTorch tensors")
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.array(to_numpy(x), copy=True))


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, Mapping)


def _check_has_data(path: str, name: str, x: Any) -> None:
    """Refuse arrays without data (PyTorch tensors on the meta device)."""
    if getattr(x, "is_meta", False) is True:
        raise FormatError(path, f"tensor {name!r} is on the meta device: it has no data")


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
                _check_has_data(path, name, v)
                out[name] = v
            else:
                raise FormatError(path, f"cannot store {name!r} (a {type(v).__name__}) in a {fmt} file")

    walk(params, "")
    return out


def save(path: Any, params: Mapping, format: str | None = None, *, like: WeightFile | None = None) -> None:
    """Write arrays to a weight file, atomically.

    The destination is either left as it was or replaced whole (with its external data,
    for ONNX): see the module's notes on safety. SIGTERM and SIGHUP during the write
    remove the files it created, then exit (:func:`cleanup_on_signals`).

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
        If `params` cannot be stored in the format (including tensors on the meta
        device, which have no data), a package the format needs is missing, or writing
        fails.
    """
    path = os.fspath(path)
    fmt = format or format_from_suffix(path) or (like.format if like is not None else None)
    if fmt is None:
        raise FormatError(path, "cannot tell the format from the file name (use .npz, .safetensors, .onnx or .pt)")
    writers: dict[str, Callable[[], None]] = {
        "npz": lambda: _save_npz(path, params, like),
        "safetensors": lambda: _save_safetensors(path, params, like),
        "onnx": lambda: _save_onnx(path, params, like),
        "torch": lambda: _save_torch(path, params),
    }
    if fmt not in writers:
        raise FormatError(path, f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    from arrayprune.adapters.mapping import TreeError, check_tree

    try:
        check_tree(params)  # the writers recurse: bounded depth, no cycles
    except (TreeError, TypeError) as exc:
        raise FormatError(path, f"cannot write this tree: {exc}") from None
    try:
        with cleanup_on_signals():
            writers[fmt]()
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
        st_save = _optional("safetensors.torch", path, "writing safetensors files").save
        tensors = {k: _to_torch(path, v).contiguous() for k, v in arrays.items()}
        data = st_save(_unshared(tensors), metadata=metadata)
    else:
        np_save = _optional("safetensors.numpy", path, "writing safetensors files").save
        data = np_save({k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}, metadata=metadata)
    atomic_write(path, lambda f: f.write(data))


def _unshared(tensors: dict[str, Any]) -> dict[str, Any]:
    """Tensors sharing memory (tied weights) copied apart: safetensors stores each name's data."""
    seen: set[int] = set()
    out = {}
    for k, t in tensors.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        out[k] = t.clone() if ptr and ptr in seen else t
        seen.add(ptr)
    return out


def _save_torch(path: str, params: Mapping) -> None:
    torch = _optional("torch", path, "writing PyTorch files")

    def convert(node: Any, name: str) -> Any:
        if isinstance(node, Mapping):
            out: Any = OrderedDict() if isinstance(node, OrderedDict) else {}
            for k, v in node.items():
                out[k] = convert(v, f"{name}/{k}" if name else str(k))
            meta = getattr(node, "_metadata", None)
            if meta is not None and isinstance(out, OrderedDict):
                out._metadata = meta
            return out
        if _is_array(node):
            _check_has_data(path, name, node)
            if not isinstance(node, torch.Tensor):
                return _to_torch(path, node)
        return node

    obj = convert(params, "")
    atomic_write(path, lambda f: torch.save(obj, f))


def _external_locations(model: Any) -> set[str]:
    """The external-data locations that any tensor of an ONNX model references."""
    onnx = importlib.import_module("onnx")
    found: set[str] = set()

    def tensor(t: Any) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    found.add(e.value)

    def graph(g: Any) -> None:
        for t in g.initializer:
            tensor(t)
        for st in g.sparse_initializer:
            tensor(st.values)
            tensor(st.indices)
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    tensor(a.t)
                for t in a.tensors:
                    tensor(t)
                if a.HasField("g"):
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)

    graph(model.graph)
    for fn in model.functions:
        for node in fn.node:
            for a in node.attribute:
                if a.HasField("t"):
                    tensor(a.t)
    return found


def _named_after(base: str, location: str) -> bool:
    """Whether an external-data `location` is a data file of the model named `base`:
    ``BASE.data`` or ``BASE.<anything>.data``, in the model's own folder."""
    return location == base + ".data" or re.fullmatch(re.escape(base) + r"\.[^/\\]+\.data", location) is not None


def _old_onnx_data(path: str) -> set[str]:
    """Data files of the ONNX model now at `path` that writing over it may remove:
    those it references and that are named after it."""
    base = os.path.basename(path)
    try:
        st = os.stat(path)
    except OSError:
        return set()
    if not stat.S_ISREG(st.st_mode) or st.st_size >= _PROTOBUF_LIMIT:
        return set()
    onnx = importlib.import_module("onnx")
    try:
        old = onnx.load_model(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model: it references nothing
        return set()
    return {loc for loc in _external_locations(old) if _named_after(base, loc)}


def _fresh_data_name(folder: str, base: str) -> str:
    """``BASE.data`` if no file has that name, else ``BASE.<8 random hex digits>.data``."""
    name = base + ".data"
    while os.path.lexists(os.path.join(folder, name)):
        name = f"{base}.{secrets.token_hex(4)}.data"
    return name


def _save_onnx(path: str, params: Mapping, like: WeightFile | None) -> None:
    onnx = _optional("onnx", path, "writing ONNX models")
    numpy_helper = _optional("onnx.numpy_helper", path, "writing ONNX models")
    helper = _optional("onnx.helper", path, "writing ONNX models")

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

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FormatError(path, f"folder {folder!r} does not exist")
    base = os.path.basename(path)
    use_external = bool(external) or model.ByteSize() > _PROTOBUF_LIMIT
    blob_parts: list[bytes] = []
    data_name = None
    if use_external:
        data_name = _fresh_data_name(folder, base)  # never a file the old model (or another) uses
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
    data = model.SerializeToString()
    stale = _old_onnx_data(path) - _external_locations(model)

    def write_data(f: IO[bytes]) -> None:
        for part in blob_parts:
            f.write(part)

    created: str | None = None
    try:
        if data_name is not None:
            data_path = os.path.join(folder, data_name)
            atomic_write(data_path, write_data)  # complete and synced before any model refers to it
            created = data_path
        atomic_write(path, lambda f: f.write(data))  # the switch from the old model to the new one
    except BaseException:
        if created is not None:
            try:
                os.unlink(created)
            except OSError:
                pass
        raise
    # The new model is in place: the old one's own data files are garbage now. (When
    # OUT is the input, the input's arrays are memory maps, which outlive the unlink.)
    removed = False
    for name in sorted(stale):
        try:
            os.unlink(os.path.join(folder, name))
            removed = True
        except OSError:
            pass  # e.g. still mapped on Windows: left behind, harmless
    if removed:
        _fsync_dir(folder)
