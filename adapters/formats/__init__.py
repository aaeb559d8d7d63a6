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
                          NumPy arrays; external data is memory-mapped. bfloat16 ones
                          as float32 (exact), written back as bfloat16. Other
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
a name made from its content, ``OUT.onnx.<16 hex digits>.data`` (the start of its
SHA-256, so the same command writes the same bytes), which no other model references
(a file of that name that the old ``OUT`` does not reference is left alone, and ``-1``,
``-2``, ... appended); the model is renamed into place last.
Only then are the data files of the old ``OUT`` removed, and only those that the old
model referenced, that are named after ``OUT`` (``OUT.onnx.data``, ``OUT.onnx.*.data``)
and that the new model does not use (so data shared with other models is never removed;
when ``OUT`` is the input, its old data is unlinked while the input's arrays stay valid:
they are memory maps, which survive the unlink on POSIX). At every instant ``OUT`` loads
as the complete old model or the complete new one; a failed write removes every file it
created. Two processes writing one single-file destination at once each rename a whole
file into place (the last rename wins), and a sharded folder is exchanged as a whole (see
:func:`.files.replace_folder`); two processes writing one ONNX model with external data
at once are not supported.

A write in the main thread turns SIGTERM and SIGHUP (while they have their default
action) into an exception, so that its temporary files are removed, and the process
then exits with status 128 + the signal number; :func:`cleanup_on_signals` does the same
around any block of code (the command line wraps its whole run in it). SIGINT raises
:class:`KeyboardInterrupt`, which cleans up likewise. A process killed by SIGKILL may
leave a temporary file (``.NAME.*.tmp``) or an unreferenced data file, never a damaged
destination.

Layout
------
One module per format, each with a ``load(path)`` and a ``save(path, params, like)``
that :func:`load` and :func:`save` dispatch to: :mod:`.npz` (with the size checks and
:func:`memory_limit`), :mod:`.safetensors`, :mod:`.onnx` (external data) and
:mod:`.pytorch`; the ONNX writer's pieces are :mod:`.onnx_skeleton` (a model without
its initializers, written around them) and :mod:`.protowire` (protobuf's wire format).
Shared pieces: :mod:`.errors` (:class:`FormatError`, optional imports),
:mod:`.files` (regular files, :func:`atomic_write`, :func:`cleanup_on_signals`),
:mod:`.arrays` (:func:`to_numpy`, flattening) and :mod:`.weightfile`
(:class:`WeightFile`). Safetensors tensor by tensor, in bounded memory:
:mod:`.safetensors_stream` (stored tensors read from memory maps that give their pages
back, a writer that puts each tensor in place) and :mod:`.sharded` (sharded checkpoints
and their index). This package only reads and writes: pruning stored tensors one at a
time is :mod:`arrayprune.adapters.pipeline.stream_pruning`, beside the pipeline
(:mod:`arrayprune.adapters.pipeline`).
:data:`MEMORY_LIMIT`, :data:`NPZ_MAX_RATIO` and :data:`NPZ_RATIO_MIN_SIZE` are
settings of this package, handed to the npz module at every load.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

from arrayprune.adapters.mapping import TreeError, check_tree

from . import npz, onnx, pytorch, safetensors
from .arrays import to_numpy
from .errors import FormatError, _describe
from .files import _open_regular, _require_regular, atomic_write, cleanup_on_signals
from .onnx import _PROTOBUF_LIMIT, _parse_onnx
from .weightfile import WeightFile

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

_READERS: dict[str, Callable[[str], WeightFile]] = {
    "npz": lambda path: npz.load(path, _npz_limits()),
    "safetensors": safetensors.load,
    "onnx": onnx.load,
    "torch": pytorch.load,
}

_WRITERS: dict[str, Callable[[str, Mapping, WeightFile | None], None]] = {
    "npz": npz.save,
    "safetensors": safetensors.save,
    "onnx": onnx.save,
    "torch": pytorch.save,
}

# --------------------------------------------------------------------------------------
# Settings of the npz checks: they live here, and every load hands them to the npz module
# (``formats.MEMORY_LIMIT = 8 * 2**30`` is seen at once).
# --------------------------------------------------------------------------------------

MEMORY_LIMIT: int | None = None
"""Bytes that the arrays of an ``.npz`` file may take once inflated; None (the default)
derives the limit from the memory available (see :func:`memory_limit`)."""

NPZ_MAX_RATIO: float = 1000
"""Largest compression ratio (inflated / compressed bytes) accepted for an ``.npz``
member of :data:`NPZ_RATIO_MIN_SIZE` bytes or more; 0 disables the check. Environment
variable: ``ARRAYPRUNE_NPZ_MAX_RATIO``."""

NPZ_RATIO_MIN_SIZE: int = 256 * 2**20
"""Inflated size from which :data:`NPZ_MAX_RATIO` applies (256 MiB)."""


def _npz_limits() -> npz.NpzLimits:
    return npz.NpzLimits(MEMORY_LIMIT, NPZ_MAX_RATIO, NPZ_RATIO_MIN_SIZE)


def memory_limit() -> int:
    """Bytes that the arrays of an ``.npz`` file may take once inflated.

    :data:`MEMORY_LIMIT` if set, else the environment variable ``ARRAYPRUNE_MEMORY_LIMIT``
    (bytes, or with a suffix: ``512M``, ``8G``), else what the process can still take (see
    :func:`.npz.memory_limit`).

    Returns
    -------
    int
        The limit in bytes (``2**63 - 1`` when nothing is known).
    """
    return npz.memory_limit(MEMORY_LIMIT)


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
    if fmt not in _READERS:
        raise FormatError(path, f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:
        return _READERS[fmt](path)
    except FormatError:
        raise
    except MemoryError:
        raise FormatError(path, "out of memory while reading") from None
    except Exception as exc:  # every library has its own errors for damaged files
        raise FormatError(path, f"cannot read as {fmt}: {_describe(exc)}") from None


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
    if fmt not in _WRITERS:
        raise FormatError(path, f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")

    try:
        check_tree(params)  # the writers recurse: bounded depth, no cycles
    except (TreeError, TypeError) as exc:
        raise FormatError(path, f"cannot write this tree: {exc}") from None
    try:
        with cleanup_on_signals():
            _WRITERS[fmt](path, params, like)
    except FormatError:
        raise
    except Exception as exc:
        raise FormatError(path, f"cannot write as {fmt}: {_describe(exc)}") from None
