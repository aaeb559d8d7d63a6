"""``.npz`` files: NumPy arrays, read with ``allow_pickle=False`` after checking their sizes.

Members are checked before they are inflated: the npy header must describe exactly the
bytes of the member, the arrays must fit in :func:`memory_limit`, and a large member may
not be compressed more than :data:`NPZ_MAX_RATIO` (a possible zip bomb). These settings
are those of :mod:`arrayprune.adapters.formats`, read from there at every check.
"""

from __future__ import annotations

import ast
import math
import os
import re
import zipfile
from collections.abc import Mapping
from typing import IO, NamedTuple

import numpy as np

from . import files
from .arrays import _flat_arrays, to_numpy
from .errors import FormatError, _describe
from .weightfile import WeightFile


class NpzLimits(NamedTuple):
    """The size limits of the checks, as :mod:`arrayprune.adapters.formats` sets them."""

    memory: int | None = None
    """Bytes the arrays may take once inflated; None: see :func:`memory_limit`."""
    max_ratio: float = 1000
    """Largest compression ratio of a member of `ratio_min_size` bytes or more; 0: none."""
    ratio_min_size: int = 256 * 2**20
    """Inflated size from which `max_ratio` applies."""


def _bytes(n: int) -> str:
    """A size for messages: '2.5 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


DEFAULT_LIMITS = NpzLimits()


def load(path: str, limits: NpzLimits = DEFAULT_LIMITS) -> WeightFile:
    """Read an ``.npz`` file, its member sizes checked against `limits` before anything is inflated."""
    params: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            compressed = any(i.compress_type != zipfile.ZIP_STORED for i in zf.infolist())
            _check_npz_sizes(path, zf, limits)
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


def memory_limit(setting: int | None = None) -> int:
    """Bytes that the arrays of an ``.npz`` file may take once inflated.

    `setting` if given, else the environment variable
    ``ARRAYPRUNE_MEMORY_LIMIT`` (bytes, or with a suffix: ``512M``, ``8G``), else the
    smallest of: the memory available (``MemAvailable`` of ``/proc/meminfo``, or
    ``SC_AVPHYS_PAGES``), the soft ``RLIMIT_AS`` and ``RLIMIT_DATA`` of the process
    less its current virtual size and data, and the cgroup's ``memory.max`` less the
    anonymous memory its processes hold (``memory.stat``; ``memory.current`` if absent).

    Parameters
    ----------
    setting : int, optional
        The limit set by the caller (:data:`arrayprune.adapters.formats.MEMORY_LIMIT`).

    Returns
    -------
    int
        The limit in bytes (``2**63 - 1`` when nothing is known).
    """
    if setting is not None:
        return int(setting)
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


def _npz_max_ratio(setting: float) -> float:
    env = os.environ.get("ARRAYPRUNE_NPZ_MAX_RATIO", "").strip()
    return float(env) if env else float(setting)


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


def _check_npz_sizes(path: str, zf: zipfile.ZipFile, limits: NpzLimits) -> None:
    """Refuse, before inflating anything, members that would not fit or do not add up."""
    limit = memory_limit(limits.memory)
    max_ratio = _npz_max_ratio(limits.max_ratio)
    total = 0
    for info in zf.infolist():
        name = info.filename.removesuffix(".npy")
        size = info.file_size
        if max_ratio > 0 and info.compress_type != zipfile.ZIP_STORED and size >= limits.ratio_min_size:
            ratio = size / max(info.compress_size, 1)
            if ratio > max_ratio:
                raise FormatError(
                    path,
                    f"array {name!r} is implausibly compressed ({_bytes(size)} from {_bytes(info.compress_size)}, "
                    f"{ratio:.0f}:1; at most {max_ratio:.0f}:1 above {_bytes(limits.ratio_min_size)}): "
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


def save(path: str, params: Mapping, like: WeightFile | None) -> None:
    """Write an ``.npz`` file, compressed when `like` was; atomically."""
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

    files.atomic_write(path, write)
