"""ONNX models: float initializers as NumPy arrays; external data confined and replaced as a unit.

bfloat16 initializers (which NumPy lacks) are read as float32, an exact widening, and
written back as bfloat16: their names are kept in the context of the WeightFile
(``context["bfloat16"]``). Rounding to the nearest bfloat16 (ties to even) gives back
every value read bit for bit, and the zeros that pruning writes.

External data must lie inside the model's folder (absolute paths, ``..`` and symlinks
leading out are refused) and be a regular file. A model with external data is written
as a unit: new data first, under a name made from its content
(``OUT.onnx.<16 hex digits of its SHA-256>.data``: the same data, the same bytes), the
model renamed into place last, then the old model's own data files removed (see
:mod:`arrayprune.adapters.formats`).
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

from . import files
from .arrays import _flat_arrays, release_pages, to_numpy
from .errors import FormatError, _describe, import_optional
from .files import _fsync_dir, cache_blobs, resolve_inside
from .weightfile import WeightFile

_ONNX_FLOAT_TYPES = (1, 10, 11)  # FLOAT, FLOAT16, DOUBLE
_ONNX_BFLOAT16 = 16
_ONNX_INT_TYPES = (2, 3, 4, 5, 6, 7, 9, 12, 13)  # UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL, UINT32, UINT64
_EXTERNAL_THRESHOLD = 1024  # bytes: smaller tensors stay inside an ONNX model written with external data
_PROTOBUF_LIMIT = 2**31 - 2**20


def _parse_onnx(path: str) -> Any:
    onnx = import_optional("onnx", path, "reading ONNX models")
    try:
        model = onnx.load_model(path, load_external_data=False)
    except Exception as exc:
        raise FormatError(path, f"not a valid ONNX model ({_describe(exc)})") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise FormatError(path, "not a valid ONNX model (truncated, or no graph / opset)")
    return model


def _check_inside(path: str, location: str, what: str) -> str:
    """Resolve an external-data `location` of the model at `path`, refusing escapes."""
    folder = os.path.dirname(os.path.abspath(path))
    real, problem = resolve_inside(folder, location, blobs=cache_blobs(folder))
    messages = {
        "empty": "external data without a location",
        "absolute": f"external data path {location!r} is absolute; it must lie inside the model's folder",
        "outside": f"external data path {location!r} leads outside the model's folder",
        "symlink": f"external data path {location!r} leads outside the model's folder (symlink)",
        "missing": f"external data file {location!r} not found",
    }
    if real is None:
        raise FormatError(path, f"{what}: {messages.get(str(problem), f'external data file {location!r} {problem}')}")
    return real


def _read_external(path: str, tensor: Any) -> np.ndarray:
    """The external data of `tensor`, memory-mapped (bfloat16: its bits, as uint16)."""
    helper = import_optional("onnx.helper", path, "reading ONNX models")

    info = {e.key: e.value for e in tensor.external_data}
    what = f"initializer {tensor.name!r}"
    real = _check_inside(path, info.get("location", ""), what)
    if tensor.data_type == _ONNX_BFLOAT16:
        dtype = np.dtype("<u2")
    else:
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


def _bfloat16_bits(path: str, tensor: Any) -> np.ndarray:
    """The bits of a bfloat16 initializer stored in the model, as uint16."""
    shape = tuple(int(d) for d in tensor.dims)
    if tensor.HasField("raw_data"):
        bits = np.frombuffer(tensor.raw_data, dtype="<u2")
    else:  # one value per int32, in its low 16 bits
        bits = np.asarray(tensor.int32_data, dtype=np.int64).astype(np.uint16)
    if bits.size != math.prod(shape):
        raise FormatError(path, f"initializer {tensor.name!r}: {bits.size} bfloat16 values for shape {shape}")
    return bits.reshape(shape)


def _widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32 values, exactly: bfloat16 is the top half of float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _narrow_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits (uint16), rounded to the nearest, ties to even.

    Values that are bfloat16 already (widened by :func:`_widen_bfloat16`, or zero) keep
    their bits exactly, NaN payloads included; other NaNs stay NaN (quiet).
    """
    u = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    bits = (u >> 16).astype(np.uint16)
    inexact = (u & 0xFFFF) != 0
    if inexact.any():
        v = u[inexact]
        rounded = ((v + 0x7FFF + ((v >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(v.view(np.float32))
        rounded[nan] = bits[inexact][nan] | 0x0040
        bits[inexact] = rounded
    return bits


def _graph_initializers(graph: Any) -> Iterator[Any]:
    """The initializers of `graph`, then those of its subgraphs (the bodies of ``If``,
    ``Loop``, ``Scan``: any graph attribute), depth first in node and attribute order."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from _graph_initializers(a.g)
            for sub in a.graphs:
                yield from _graph_initializers(sub)


def iter_initializers(model: Any) -> Iterator[Any]:
    """Every initializer of an ONNX model: the main graph's, then its subgraphs' (in the
    order :func:`load` reads them).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Yields
    ------
    onnx.TensorProto
        Each initializer, as stored in `model` (changes to it change the model).
    """
    yield from _graph_initializers(model.graph)


def load(path: str) -> WeightFile:
    """Read the initializers of an ONNX model; external data confined to its folder.

    Initializers of the main graph and of its subgraphs (``If`` branches, ``Loop`` and
    ``Scan`` bodies) are read by name; a subgraph's initializer whose name an earlier one
    has (another scope's) is not exposed, and is carried to the output unchanged.
    float16, float32, float64, integer and boolean initializers are read as they are
    (external data memory-mapped), bfloat16 ones as float32 (a widened copy), their names
    listed in ``context["bfloat16"]`` so that :func:`save` writes them back as bfloat16,
    and in ``context["stored_dtypes"]`` (name -> ``"bfloat16"``) for listings.
    """
    onnx = import_optional("onnx", path, "reading ONNX models")
    numpy_helper = import_optional("onnx.numpy_helper", path, "reading ONNX models")

    model = _parse_onnx(path)
    params: dict[str, np.ndarray] = {}
    external: dict[str, np.ndarray] = {}
    bfloat16: set[str] = set()
    seen: set[str] = set()
    main = len(model.graph.initializer)
    for i, tensor in enumerate(iter_initializers(model)):
        is_external = tensor.data_location == onnx.TensorProto.EXTERNAL
        if is_external and tensor.data_type == onnx.TensorProto.STRING:
            raise FormatError(path, f"initializer {tensor.name!r}: external string data is not supported")
        if tensor.name in seen:
            if i < main:
                raise FormatError(path, f"initializer {tensor.name!r} appears twice")
            if is_external:  # a subgraph's own tensor of a name already read: carried inline
                tensor.CopyFrom(inline_tensor(tensor, _read_external(path, tensor)))
            continue
        seen.add(tensor.name)
        if is_external:
            arr = _read_external(path, tensor)
            external[tensor.name] = arr
        elif tensor.data_type in _ONNX_FLOAT_TYPES or tensor.data_type in _ONNX_INT_TYPES:
            arr = numpy_helper.to_array(tensor)
        elif tensor.data_type == _ONNX_BFLOAT16:
            arr = _bfloat16_bits(path, tensor)
        else:
            continue
        if tensor.data_type in _ONNX_FLOAT_TYPES or tensor.data_type in _ONNX_INT_TYPES:
            params[tensor.name] = arr
        elif tensor.data_type == _ONNX_BFLOAT16:
            params[tensor.name] = _widen_bfloat16(arr)
            bfloat16.add(tensor.name)
    # the dtype each tensor has in the file, where it differs from the array's: for listings
    stored_dtypes = dict.fromkeys(sorted(bfloat16), "bfloat16")
    context = {"model": model, "external": external, "bfloat16": frozenset(bfloat16), "stored_dtypes": stored_dtypes}
    return WeightFile(path, "onnx", params, context)


def _bfloat16_tensor(onnx: Any, name: str, bits: np.ndarray) -> Any:
    """A bfloat16 TensorProto holding `bits` (uint16) in its raw data."""
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = _ONNX_BFLOAT16
    tensor.dims.extend(int(d) for d in bits.shape)
    tensor.raw_data = np.asarray(bits, dtype="<u2", order="C").tobytes()
    return tensor


def _as_bfloat16_bits(path: str, name: str, arr: np.ndarray) -> np.ndarray:
    """The bits of the values given for bfloat16 initializer `name`: float32 or bfloat16."""
    if arr.dtype == np.float32:
        return _narrow_bfloat16(arr)
    if arr.dtype.name == "bfloat16" and arr.dtype.itemsize == 2:  # ml_dtypes' bfloat16
        return np.asarray(arr, order="C").view(np.uint16)
    raise FormatError(path, f"initializer {name!r} is bfloat16 (read as float32), got {arr.dtype}")


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


def _content_data_name(folder: str, base: str, digest: str, old: set[str]) -> str:
    """The name of a data file holding the bytes whose SHA-256 is `digest`.

    ``BASE.<first 16 hex digits of digest>.data``: a function of the content, so the same
    data gets the same name (and the model referencing it the same bytes). A file of that
    name is replaced only if the old model references it (`old`): it then holds these
    very bytes, and the old model stays whole while the file is swapped for an equal one.
    Any other file of that name is someone else's: ``-1``, ``-2``, ... are tried after it.
    """
    stem = f"{base}.{digest[:16]}"
    name, n = stem + ".data", 0
    while name not in old and os.path.lexists(os.path.join(folder, name)):
        n += 1
        name = f"{stem}-{n}.data"
    return name


def save(path: str, params: Mapping, like: WeightFile | None) -> None:
    """Write `like`'s model with `params` as its initializers; model and data replaced as a unit."""
    onnx = import_optional("onnx", path, "writing ONNX models")
    numpy_helper = import_optional("onnx.numpy_helper", path, "writing ONNX models")
    helper = import_optional("onnx.helper", path, "writing ONNX models")

    if like is None or like.format != "onnx":
        raise FormatError(path, "an ONNX model can only be written from an ONNX model (its graph is needed)")
    model = onnx.ModelProto()
    model.CopyFrom(like.context["model"])
    external: dict[str, np.ndarray] = like.context.get("external", {})
    flat = _flat_arrays(path, params, "onnx")
    by_name = {t.name for t in iter_initializers(model)}
    unknown = [k for k in flat if k not in by_name]
    if unknown:
        raise FormatError(
            path, f"{unknown[0]!r} is not an initializer of the model (an ONNX model stores effective weights only)"
        )
    # The new values of the initializers, in order: (tensor, array) with the array's
    # bytes (little-endian, C order) as the tensor's raw data; None to leave the tensor.
    chosen: list[tuple[Any, np.ndarray | None]] = []
    done: set[str] = set()
    for tensor in iter_initializers(model):
        if tensor.name in done:  # a later scope's tensor of that name: not read, left as it is
            chosen.append((tensor, None))
            continue
        done.add(tensor.name)
        is_bfloat16 = tensor.data_type == _ONNX_BFLOAT16
        if tensor.name in flat:
            arr = to_numpy(flat[tensor.name])
            want = tuple(int(d) for d in tensor.dims)
            if tuple(arr.shape) != want:
                raise FormatError(path, f"initializer {tensor.name!r} has shape {want}, got {tuple(arr.shape)}")
            if is_bfloat16:
                arr = _as_bfloat16_bits(path, tensor.name, arr)
            else:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
                if arr.dtype != dtype:
                    raise FormatError(path, f"initializer {tensor.name!r} has dtype {dtype}, got {arr.dtype}")
        elif tensor.name in external:
            arr = external[tensor.name]
            if is_bfloat16 and arr.dtype != np.uint16:  # its bits, as load reads them, or bfloat16 values
                arr = _as_bfloat16_bits(path, tensor.name, arr)
        else:
            chosen.append((tensor, None))
            continue
        chosen.append((tensor, arr))

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FormatError(path, f"folder {folder!r} does not exist")
    base = os.path.basename(path)
    old_data = _old_onnx_data(path)
    blob_parts: list[Any] = []
    data_name = None
    data = None
    if not external:  # serialized once, with the data inside, unless surely too large for that
        lower = sum(arr.nbytes for _, arr in chosen if arr is not None)
        if lower <= _PROTOBUF_LIMIT:
            for tensor, value in chosen:
                if value is not None:
                    tensor.CopyFrom(_tensor_with_data(onnx, numpy_helper, tensor, value, None))
            try:
                data = model.SerializeToString()
            except Exception:  # noqa: BLE001 - over what protobuf writes: external data below
                data = None
            if data is not None and len(data) > _PROTOBUF_LIMIT:
                data = None
            if data is None:  # the values are in the model now: moved to external data from there
                chosen = [(tensor, None) for tensor, _ in chosen]
    if data is None:
        # External data: each large tensor's bytes go to the data file straight from its
        # array (memory-mapped input data included); the model holds only their places.
        moved = []
        offset = 0
        for tensor, value in chosen:
            if value is not None and value.dtype != object and value.nbytes >= _EXTERNAL_THRESHOLD:
                raw: Any = _le_bytes(value)
                tensor.CopyFrom(_tensor_with_data(onnx, numpy_helper, tensor, value, b""))
                tensor.ClearField("raw_data")
            elif value is not None:
                tensor.CopyFrom(_tensor_with_data(onnx, numpy_helper, tensor, value, None))
                if not (tensor.HasField("raw_data") and len(tensor.raw_data) >= _EXTERNAL_THRESHOLD):
                    continue
                raw = tensor.raw_data
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= _EXTERNAL_THRESHOLD:
                raw = tensor.raw_data
            else:
                continue
            pad = (-offset) % 64
            if pad:
                blob_parts.append(b"\0" * pad)
                offset += pad
            blob_parts.append(raw)
            moved.append((tensor, offset, len(raw) if isinstance(raw, bytes) else raw.nbytes))
            offset += moved[-1][2]
        digest = hashlib.sha256()
        for part in blob_parts:
            digest.update(part)
            if isinstance(part, memoryview):
                release_pages(part.obj)
        # never a file that another model uses, nor one the old model uses with other bytes
        data_name = _content_data_name(folder, base, digest.hexdigest(), old_data)
        for tensor, start, length in moved:
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, text in (("location", data_name), ("offset", str(start)), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, text
        data = model.SerializeToString()
    stale = old_data - _external_locations(model)

    def write_data(f: IO[bytes]) -> None:
        for part in blob_parts:
            f.write(part)
            if isinstance(part, memoryview):
                release_pages(part.obj)  # memory-mapped input data: written, given back

    created: str | None = None
    try:
        if data_name is not None:
            data_path = os.path.join(folder, data_name)
            files.atomic_write(data_path, write_data)  # complete and synced before any model refers to it
            if data_name not in old_data:  # else the old model's own file, now with the same bytes: kept
                created = data_path
        files.atomic_write(path, lambda f: f.write(data))  # the switch from the old model to the new one
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


def _le_bytes(arr: np.ndarray) -> memoryview:
    """The bytes ONNX stores for `arr`: little-endian, C order (no copy where they are so)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer


def _tensor_with_data(onnx: Any, numpy_helper: Any, tensor: Any, arr: np.ndarray, raw: bytes | None) -> Any:
    """Initializer `tensor` holding `arr`, as ``numpy_helper.from_array`` (or, for
    bfloat16, :func:`_bfloat16_tensor`) makes it, with `tensor`'s doc string; with
    ``raw=b""``, everything but the data (which goes to external data)."""
    if tensor.data_type == _ONNX_BFLOAT16:
        new = _bfloat16_tensor(onnx, tensor.name, arr) if raw is None else _bfloat16_tensor(onnx, tensor.name, arr[:0])
        if raw is not None:
            del new.dims[:]
            new.dims.extend(int(d) for d in arr.shape)
    elif raw is None:
        new = numpy_helper.from_array(np.asarray(arr, order="C"), tensor.name)  # 0-d stays 0-d
    else:
        new = numpy_helper.from_array(np.zeros(0, dtype=arr.dtype), tensor.name)
        del new.dims[:]
        new.dims.extend(int(d) for d in arr.shape)
    if tensor.doc_string:
        new.doc_string = tensor.doc_string
    return new


def inline_tensor(tensor: Any, arr: np.ndarray) -> Any:
    """A copy of initializer `tensor` holding `arr` (its external data, as loaded) inline."""
    onnx = import_optional("onnx", tensor.name, "reading ONNX models")
    if tensor.data_type == _ONNX_BFLOAT16:
        bits = arr if arr.dtype == np.uint16 else _as_bfloat16_bits(tensor.name, tensor.name, arr)
        return _bfloat16_tensor(onnx, tensor.name, bits)
    numpy_helper = import_optional("onnx.numpy_helper", tensor.name, "reading ONNX models")
    return numpy_helper.from_array(np.asarray(arr, order="C"), tensor.name)
