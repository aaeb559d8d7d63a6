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

Writing neither copies nor serializes a whole model: the model without its main graph's
initializers is copied and serialized in pieces (:mod:`.onnx_skeleton`), and each
initializer's data goes to the file straight from its array, inside the model as a
record of protobuf's wire format (:mod:`.protowire`), or to the external data file,
hashed for its name while it is written. The files have the bytes that serializing the
whole model with protobuf would give.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np

from . import files, protowire
from .arrays import _flat_arrays, release_pages, to_numpy
from .direct_writes import open_direct
from .errors import FormatError, _describe, import_optional
from .files import _fsync_dir, cache_blobs, resolve_inside
from .onnx_skeleton import TENSOR_RAW_DATA, Skeleton, external_locations, graph_initializers, write_buffers
from .weightfile import WeightFile

_ONNX_FLOAT_TYPES = (1, 10, 11)  # FLOAT, FLOAT16, DOUBLE
_ONNX_BFLOAT16 = 16
_ONNX_INT_TYPES = (2, 3, 4, 5, 6, 7, 9, 12, 13)  # UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL, UINT32, UINT64
_STREAMED_TYPES = frozenset((*_ONNX_FLOAT_TYPES, *_ONNX_INT_TYPES, _ONNX_BFLOAT16))  # raw data = the array's bytes
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
    x = np.asarray(x, dtype=np.float32, order="C")
    u = x.reshape(-1).view(np.uint32)  # 1-D: a 0-d array's operations would give scalars
    bits = (u >> 16).astype(np.uint16)
    inexact = (u & 0xFFFF) != 0
    if inexact.any():
        v = u[inexact]
        rounded = ((v + 0x7FFF + ((v >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(v.view(np.float32))
        rounded[nan] = bits[inexact][nan] | 0x0040
        bits[inexact] = rounded
    return bits.reshape(x.shape)


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
    yield from graph_initializers(model.graph)


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
    return {loc for loc in external_locations(old) if _named_after(base, loc)}


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
    """Write `like`'s model with `params` as its initializers; model and data replaced as a unit.

    Neither the model nor its tensor data go through a whole-model protobuf copy or
    serialization: everything but the main graph's initializers is copied (small) and
    serialized around them (:class:`~.onnx_skeleton.Skeleton`), and each initializer's
    data is written from its array, inside the model (a record of protobuf's wire
    format) or to the external data file; the bytes are those of the model serialized
    whole. A model that would not fit protobuf's 2 GiB limit inline is written with
    external data.
    """
    onnx = import_optional("onnx", path, "writing ONNX models")
    numpy_helper = import_optional("onnx.numpy_helper", path, "writing ONNX models")
    helper = import_optional("onnx.helper", path, "writing ONNX models")

    if like is None or like.format != "onnx":
        raise FormatError(path, "an ONNX model can only be written from an ONNX model (its graph is needed)")
    model = like.context["model"]  # read only: the output is built beside it
    external: dict[str, np.ndarray] = like.context.get("external", {})
    flat = _flat_arrays(path, params, "onnx")
    made = like.context.get("provenance")
    skeleton = Skeleton(model, made)
    tensors = [*model.graph.initializer, *skeleton.subgraph_initializers()]
    by_name = {t.name for t in tensors}
    unknown = [k for k in flat if k not in by_name]
    if unknown:
        raise FormatError(
            path, f"{unknown[0]!r} is not an initializer of the model (an ONNX model stores effective weights only)"
        )
    values = _new_values(path, tensors, flat, external, helper)

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FormatError(path, f"folder {folder!r} does not exist")
    base = os.path.basename(path)
    old_data = _old_onnx_data(path)
    main = len(model.graph.initializer)
    buffers = None
    if not external and sum(v.nbytes for v in values if v is not None) <= _PROTOBUF_LIMIT:
        buffers = _inline_buffers(onnx, numpy_helper, skeleton, tensors, values, main)
    created: str | None = None
    if buffers is None:  # external data: each large tensor's bytes go to the data file
        skeleton = Skeleton(model, made)  # afresh: the inline attempt filled the subgraphs' tensors
        tensors[main:] = skeleton.subgraph_initializers()
        protos, moved = _external_protos(onnx, numpy_helper, tensors, values, main)
        data_path = _write_data(folder, base, moved, old_data)  # complete and synced before any model refers to it
        if os.path.basename(data_path) not in old_data:  # else the old model's own file, now with the same bytes
            created = data_path
        buffers = skeleton.buffers([[t.SerializeToString()] for t in protos])
    else:
        protos = tensors[:main]  # the external data they reference (none when read inline)
    stale = old_data - skeleton.external_locations(protos)
    try:
        files.atomic_write(path, lambda f: write_buffers(f, buffers))  # the switch from the old model to the new one
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


def _new_values(
    path: str, tensors: list[Any], flat: Mapping[str, Any], external: Mapping[str, np.ndarray], helper: Any
) -> list[np.ndarray | None]:
    """The new value of each of `tensors` (little-endian, C order bytes to be its data;
    bfloat16 ones as their bits), or None to leave the tensor as it is; checked against
    the tensor's shape and dtype."""
    values: list[np.ndarray | None] = []
    done: set[str] = set()
    for tensor in tensors:
        if tensor.name in done:  # a later scope's tensor of that name: not read, left as it is
            values.append(None)
            continue
        done.add(tensor.name)
        is_bfloat16 = tensor.data_type == _ONNX_BFLOAT16
        arr: np.ndarray | None = None
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
        values.append(arr)
    return values


def _streamed(tensor: Any, value: np.ndarray) -> bool:
    """Whether the data of `tensor` holding `value` is `value`'s bytes as they are (not
    packed sub-byte types, not strings): written from the array, not through protobuf."""
    return value.dtype != object and tensor.data_type in _STREAMED_TYPES


def _inline_buffers(
    onnx: Any, numpy_helper: Any, skeleton: Skeleton, tensors: list[Any], values: list[Any], main: int
) -> list[Any] | None:
    """The model with its data inside, as buffers to write; None if over the protobuf limit.

    The main graph's initializers are records whose raw data is the arrays' memory;
    the subgraphs' are set in the skeleton's copies.
    """
    records: list[list[Any]] = []
    for tensor, value in zip(tensors[:main], values[:main], strict=True):
        if value is None:
            records.append([tensor.SerializeToString()])  # as it is
        elif _streamed(tensor, value):
            meta = _tensor_with_data(onnx, numpy_helper, tensor, value, b"")
            below, above = protowire.split(meta, TENSOR_RAW_DATA)
            raw = _le_bytes(value)
            header = protowire.field_header(TENSOR_RAW_DATA, len(raw))
            records.append([below.SerializeToString(), header, raw, above.SerializeToString()])
        else:
            records.append([_tensor_with_data(onnx, numpy_helper, tensor, value, None).SerializeToString()])
    for tensor, value in zip(tensors[main:], values[main:], strict=True):
        if value is not None:
            tensor.CopyFrom(_tensor_with_data(onnx, numpy_helper, tensor, value, None))
    try:
        buffers = skeleton.buffers(records)
    except Exception:  # noqa: BLE001 - over what protobuf serializes: external data instead
        return None
    return buffers if protowire.nbytes(buffers) <= _PROTOBUF_LIMIT else None


def _external_protos(
    onnx: Any, numpy_helper: Any, tensors: list[Any], values: list[Any], main: int
) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """The main graph's initializers as written with external data, and what moves out.

    Tensors from ``tensors[main:]`` (the skeleton's copies of the subgraphs') are changed
    in place. Returns the main graph's new protos (the originals where unchanged) and
    ``(proto, data)`` for every tensor whose data goes to the data file, in order.
    """
    protos: list[Any] = []
    moved: list[tuple[Any, Any]] = []
    for i, (tensor, value) in enumerate(zip(tensors, values, strict=True)):
        new: Any = None
        raw: Any = None
        if value is not None and _streamed(tensor, value) and value.nbytes >= _EXTERNAL_THRESHOLD:
            raw = _le_bytes(value)  # straight from the array: memory-mapped input data included
            new = _tensor_with_data(onnx, numpy_helper, tensor, value, b"")
            new.ClearField("raw_data")
        elif value is not None:
            new = _tensor_with_data(onnx, numpy_helper, tensor, value, None)
            data = new.raw_data if new.HasField("raw_data") else b""
            if len(data) >= _EXTERNAL_THRESHOLD:
                raw = data
                new.ClearField("raw_data")
        elif tensor.HasField("raw_data"):
            data = tensor.raw_data
            if len(data) >= _EXTERNAL_THRESHOLD:
                raw = data
                new = protowire.without(tensor, TENSOR_RAW_DATA)
        if new is not None and i >= main:  # in the skeleton: changed there
            tensor.CopyFrom(new)
            new = tensor
        if i < main:
            protos.append(tensor if new is None else new)
        if raw is not None:
            moved.append((new, raw))
    return protos, moved


def _write_data(folder: str, base: str, moved: list[tuple[Any, Any]], old_data: set[str]) -> str:
    """Write the external data file of `moved` (``(proto, data)``) and point each proto at
    its data; the file's name is made from its content (:func:`_content_data_name`).

    The data are written in order, each at an offset that is a multiple of 64, while a
    second thread hashes them (both release the GIL); the file is then renamed to its
    name, and synced. Returns its path.
    """
    onnx = importlib.import_module("onnx")
    parts: list[Any] = []
    offsets: list[int] = []
    offset = 0
    for _, raw in moved:
        pad = (-offset) % 64
        if pad:
            parts.append(b"\0" * pad)
            offset += pad
        parts.append(raw)
        offsets.append(offset)
        offset += len(raw)

    def write(f: IO[bytes]) -> str:
        digest = hashlib.sha256()
        direct = open_direct(f, offset)  # a large file: past the page cache
        at = 0
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrayprune-sha256")
        try:
            hashed = [pool.submit(digest.update, part) for part in parts]  # one worker: in order
            for part, done in zip(parts, hashed, strict=True):
                if direct is not None:
                    direct.write(at, part)
                    at += len(part)
                else:
                    files.write_out(f, part)
                done.result()
                if isinstance(part, memoryview):
                    release_pages(part.obj)  # memory-mapped input data: written and hashed, given back
            if direct is not None:
                direct.finish()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if direct is not None:
                direct.close()
        # never a file that another model uses, nor one the old model uses with other bytes
        return _content_data_name(folder, base, digest.hexdigest(), old_data)

    data_path = files.atomic_write_named(folder, base + ".data", write)
    name = os.path.basename(data_path)
    for (proto, raw), start in zip(moved, offsets, strict=True):
        proto.data_location = onnx.TensorProto.EXTERNAL
        del proto.external_data[:]
        for key, text in (("location", name), ("offset", str(start)), ("length", str(len(raw)))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, text
    return data_path


def _le_bytes(arr: np.ndarray) -> memoryview:
    """The bytes ONNX stores for `arr`: little-endian, C order (no copy where they are so),
    as a 1-D byte view (``len`` is the byte count)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr.reshape(-1)).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer


def _tensor_with_data(onnx: Any, numpy_helper: Any, tensor: Any, arr: np.ndarray, raw: bytes | None) -> Any:
    """Initializer `tensor` holding `arr`, as ``numpy_helper.from_array`` (or, for
    bfloat16, :func:`_bfloat16_tensor`) makes it, with `tensor`'s doc string; with
    ``raw=b""``, everything but the data (which is written from `arr`)."""
    if tensor.data_type == _ONNX_BFLOAT16:
        new = _bfloat16_tensor(onnx, tensor.name, arr if raw is None else np.zeros(0, np.uint16))
    elif raw is None:
        new = numpy_helper.from_array(np.asarray(arr, order="C"), tensor.name)  # 0-d stays 0-d
    else:
        new = numpy_helper.from_array(np.zeros(0, dtype=arr.dtype), tensor.name)
    if raw is not None:  # the shape of `arr`, without its data
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
