"""Sharded safetensors checkpoints, and pruning checkpoints in bounded memory.

A sharded checkpoint is a folder of shards (``model-00001-of-00003.safetensors``, ...)
and an index, ``model.safetensors.index.json``::

    {"metadata": {"total_size": ...}, "weight_map": {"model.layers.0.mlp.up_proj.weight":
     "model-00001-of-00003.safetensors", ...}}

as Hugging Face ships large models, beside other files (``config.json``, tokenizer
files, ``generation_config.json``, ...). :func:`open_checkpoint` reads the folder (or
the index itself) into a :class:`ShardedCheckpoint` whose ``tensors`` map every name to
a :class:`~.safetensors_stream.StoredTensor` (nothing is read but headers), sorted by
name: the order in which a safetensors file holding all the tensors would list them,
and the order of the plan. :meth:`ShardedCheckpoint.write` writes a folder of the same
shard names, the other files and the index, and switches it with the output folder as a
whole (:func:`~.files.replace_folder`).

Checks, before anything is written:

- the index is a JSON object of at most :data:`INDEX_MAX_BYTES` with a ``weight_map``
  of names to shard files, no name twice, not nested deeper than the JSON parser goes;
- shard names are plain file names in the checkpoint's folder: no absolute path, no
  ``..``, no NUL byte, no symlink leading out of the folder, only regular files (as for
  ONNX external data);
- each shard is a valid safetensors file; every tensor listed in the index is in its
  shard, every tensor of a shard is listed there, and no name is in two shards.

A folder holding one ``*.safetensors`` file and no index (``model.safetensors`` beside
``config.json`` and tokenizer files, as small models ship) is read the same way, that
file being its one shard; it is written as a folder too, without an index.

Hugging Face cache snapshots (``models--ORG--NAME/snapshots/REVISION/``, whose files
are symlinks to ``../../blobs/SHA256``) are read like plain folders: a symlink of the
folder may lead into the ``blobs`` folder of its own cache repository
(:func:`~.files.cache_blobs`), nowhere else out of the folder. The output is regular
files; the blobs are only read.

Sub-folders (a sentence-transformers model's ``1_Pooling/``, ``2_Dense/``) are walked:
each ``*.safetensors`` file in one is a shard of its own, not in the index, whose tensors
are named ``FOLDER/NAME`` (``2_Dense/linear.weight``) in :attr:`ShardedCheckpoint.tensors`
and written back under their own names.

Other files: the regular files of the folder and its sub-folders are copied unchanged,
except hidden ones (``.name``), weight files the index does not list (``*.bin``,
``*.pt``, ``*.onnx``, ... : they would carry the unpruned weights), symlinks leading out
of the folder and anything but regular files. :attr:`ShardedCheckpoint.left` says what
was left and why.

Pruning such a checkpoint in bounded memory is the pipeline's
(:func:`arrayprune.adapters.pipeline.prune_checkpoint`, which prunes with
:mod:`arrayprune.adapters.pipeline.stream_pruning`); this module only reads and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from arrayprune.adapters.formats.record import KEY, with_record
from arrayprune.adapters.roles.hf_config import config_bytes, read_config

from . import files
from .errors import FormatError
from .files import _open_regular, cache_blobs, read_json, replace_folder, resolve_inside
from .safetensors_stream import SafetensorsFile, StoredTensor, TensorWriter, stored_tensors

__all__ = [
    "INDEX_MAX_BYTES",
    "INDEX_SUFFIX",
    "ShardedCheckpoint",
    "check_destination",
    "is_sharded",
    "open_checkpoint",
    "writes_one_file",
]

#: How the index of a sharded safetensors checkpoint is named.
INDEX_SUFFIX = ".safetensors.index.json"

#: The largest index read (a 70B model's is about 100 KB).
INDEX_MAX_BYTES = 64 << 20

#: Files of a checkpoint folder that hold weights: copied only if they are shards.
WEIGHT_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz", ".data", ".index.json",
)

#: A Hugging Face folder's model configuration, which receives the provenance record.
CONFIG = "config.json"

R = TypeVar("R")

_WHERE = {
    "empty": "an empty name",
    "absolute": "an absolute path; shards must lie in the checkpoint's folder",
    "outside": "outside the checkpoint's folder",
    "symlink": "a symlink leading outside the checkpoint's folder",
    "missing": "not found",
}


def is_sharded(path: Any) -> bool:
    """Whether `path` names a sharded checkpoint: a folder, or a ``.json`` index."""
    path = os.fspath(path)
    return os.path.isdir(path) or path.lower().endswith(".json")


def _index_path(src: str) -> tuple[str, str | None]:
    """The folder of a checkpoint and its index; or, for a folder holding one safetensors
    file and no index, the folder and None."""
    if not os.path.isdir(src):
        return os.path.dirname(os.path.abspath(src)), os.path.abspath(src)
    names = sorted(n for n in os.listdir(src) if n.endswith(INDEX_SUFFIX) and not n.startswith("."))
    if len(names) > 1:
        raise FormatError(src, f"a folder with several indexes ({', '.join(names)}): give one of them as IN")
    if names:
        return os.path.abspath(src), os.path.abspath(os.path.join(src, names[0]))
    files = sorted(n for n in os.listdir(src) if n.endswith(".safetensors") and not n.startswith("."))
    if not files:
        raise FormatError(
            src, f"is a directory without a sharded safetensors index (*{INDEX_SUFFIX}) or a .safetensors file"
        )
    if len(files) > 1:
        shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        raise FormatError(src, f"a folder with several safetensors files ({shown}) and no index")
    return os.path.abspath(src), None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the name {key!r} appears twice")
        out[key] = value
    return out


def _read_index(path: str) -> dict[str, str]:
    """The weight map of an index: tensor names to shard file names, in the index's order."""
    index = read_json(path, INDEX_MAX_BYTES, "index", "not a valid index", object_pairs_hook=_unique_keys)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(path, 'not a sharded checkpoint index: no "weight_map" of tensor names to shard files')
    bad = next((k for k, v in weight_map.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise FormatError(path, f"weight_map: the shard of {bad!r} is not a file name")
    if not isinstance(index.get("metadata", {}), dict):
        raise FormatError(path, '"metadata" is not an object')
    return weight_map


class ShardedCheckpoint:
    """A sharded safetensors checkpoint: shards, index and other files of one folder.

    Use :func:`open_checkpoint` to read one.

    Attributes
    ----------
    folder : str
        The checkpoint's folder.
    index : str
        The index file; empty for a folder holding one safetensors file and no index
        (that file is then the one shard, and :attr:`kind` is ``"safetensors folder"``).
    blobs : str or None
        For a Hugging Face cache snapshot, the cache repository's ``blobs`` folder,
        which the folder's symlinks may lead into (:func:`~.files.cache_blobs`).
    shards : list of str
        Shard file names, in the order the index first names them, then the safetensors
        files of sub-folders (``2_Dense/model.safetensors``).
    metadata : dict
        Shard name to its safetensors ``__metadata__``.
    tensors : dict
        Tensor name to :class:`~.safetensors_stream.StoredTensor`, sorted by name.
    shard_of : dict
        Tensor name to its shard's name.
    folders : list of str
        The sub-folders (paths relative to :attr:`folder`, ``/``-separated), created in
        the output.
    files : list of str
        The other files (relative paths), copied unchanged.
    left : list of str
        Files and folders not copied, each with the reason.
    """

    kind = "sharded safetensors"

    def __init__(self, src: Any):
        self.folder, index = _index_path(os.fspath(src))
        self.blobs = cache_blobs(self.folder)
        if index is None:  # a folder holding one safetensors file: its one shard
            self.kind = "safetensors folder"
            self.index = ""
            name = next(n for n in sorted(os.listdir(self.folder)) if n.endswith(".safetensors") and n[0] != ".")
            self.shards = [name]
            weight_map = dict.fromkeys(stored_tensors(self._shard_path(name))[1], name)
        else:
            self.index = index
            weight_map = _read_index(self.index)
            self.shards = list(dict.fromkeys(weight_map.values()))
        self.metadata: dict[str, dict[str, str]] = {}
        found: dict[str, dict[str, StoredTensor]] = {}
        for shard in self.shards:
            real = self._shard_path(shard)
            self.metadata[shard], found[shard] = stored_tensors(real)
        holders: dict[str, list[str]] = {}
        for shard, tensors in found.items():
            for name in tensors:
                holders.setdefault(name, []).append(shard)
        for name, where in holders.items():
            if len(where) > 1:
                raise FormatError(self.index, f"tensor {name!r} is in two shards, {where[0]} and {where[1]}")
            if name not in weight_map:
                raise FormatError(self.index, f"tensor {name!r} of {where[0]} is not listed in the index")
            if weight_map[name] != where[0]:
                raise FormatError(
                    self.index, f"tensor {name!r} is listed in {weight_map[name]} but stored in {where[0]}"
                )
        for name, shard in weight_map.items():
            if name not in found[shard]:
                raise FormatError(self.index, f"tensor {name!r} is listed in {shard}, which does not hold it")
        self.folders, self.files, self.left, nested = self._other_files()
        for shard in nested:  # a sub-folder's weights: a shard of their own, named FOLDER/NAME
            folder = shard.rsplit("/", 1)[0] + "/"
            self.metadata[shard], tensors = stored_tensors(os.path.join(self.folder, *shard.split("/")))
            for name, t in tensors.items():
                holders[folder + name] = [shard]
                found.setdefault(shard, {})[folder + name] = dataclasses.replace(t, name=folder + name)
            self.shards.append(shard)
        self.shard_of = {name: where[0] for name, where in holders.items()}
        self.tensors = {name: found[self.shard_of[name]][name] for name in sorted(holders)}

    def _shard_path(self, shard: str) -> str:
        where = self.index or self.folder
        if "\0" in shard:
            raise FormatError(where, f"shard {shard!r}: a name holding a NUL byte")
        real, problem = resolve_inside(self.folder, shard, blobs=self.blobs)
        if problem in ("empty", "absolute", "outside", "symlink"):
            raise FormatError(where, f"shard {shard!r}: {_WHERE[problem]}")
        if "/" in shard or "\\" in shard:
            raise FormatError(where, f"shard {shard!r}: not a file name of the checkpoint's folder (a sub-folder)")
        if real is None:
            raise FormatError(where, f"shard {shard!r}: {_WHERE.get(str(problem), problem)}")
        return real

    def _other_files(self) -> tuple[list[str], list[str], list[str], list[str]]:
        """The sub-folders, the files copied, those left (with why) and the safetensors
        files of sub-folders (their own shards), as paths relative to the folder."""
        ours = {*self.shards, os.path.basename(self.index)}  # "" when there is no index
        folders: list[str] = []
        files: list[str] = []
        left: list[str] = []
        nested: list[str] = []
        pending = [""]
        while pending:
            here = pending.pop(0)
            for name in sorted(os.listdir(os.path.join(self.folder, here) if here else self.folder)):
                rel = here + name
                if rel in ours:
                    continue
                path = os.path.join(self.folder, *rel.split("/"))
                problem = resolve_inside(self.folder, rel, blobs=self.blobs)[1]
                if name.startswith("."):
                    left.append(f"{rel} (hidden)")
                elif problem in ("symlink", "outside", "absolute", "missing"):
                    left.append(f"{rel} ({_WHERE.get(problem, problem)})")
                elif os.path.isdir(path):
                    if os.path.islink(path):
                        left.append(f"{rel}/ (a symlink to a folder)")
                    else:
                        folders.append(rel)
                        pending.append(rel + "/")
                elif here and name.lower().endswith(".safetensors") and problem is None:
                    nested.append(rel)
                elif name.lower().endswith(WEIGHT_SUFFIXES):
                    left.append(f"{rel} (weights the index does not list)")
                elif problem is not None:
                    left.append(f"{rel} ({_WHERE.get(problem, problem)})")
                else:
                    files.append(rel)
        return folders, files, left, nested

    def write(
        self,
        dst: str,
        fill: Callable[[Mapping[str, TensorWriter]], R],
        *,
        tensors: Mapping[str, StoredTensor] | None = None,
        contents: Mapping[str, bytes] | None = None,
        made: Mapping[str, str] | None = None,
        replace: bool = True,
        origin: Mapping[str, str] | None = None,
    ) -> R:
        """Write the checkpoint to folder `dst` as a whole: shards filled by ``fill(writers)``, then the rest.

        Every file is written into a new hidden folder beside `dst`: the shards, then
        the other files and the index (copied unchanged: pruning changes no name, shape
        or size). When all are complete and synced, the entries of an existing `dst`
        that the checkpoint does not write are carried over and the new folder replaces
        `dst` in one step (:func:`~.files.replace_folder`), so that `dst` is the old
        checkpoint or the new one, whole, whatever happens. On any failure the new
        folder is removed and `dst` is left as it was (or absent).

        Parameters
        ----------
        dst : str
            The output folder.
        fill : callable
            Receives each tensor name's :class:`~.safetensors_stream.TensorWriter` and
            must write every tensor whole; its result is returned.
        tensors : mapping, optional
            The tensors to write (same names as :attr:`tensors`; other shapes, for
            shrinking), instead of :attr:`tensors`.
        contents : mapping of str to bytes, optional
            Other files (the index, ``config.json``) written with these bytes instead of
            copied.
        made : mapping of str to str, optional
            A provenance record (:mod:`arrayprune.adapters.provenance`): it joins every
            shard's metadata and, under its key, the top ``config.json`` (a JSON object)
            unless `contents` gives that file.
        replace : bool, default True
            Whether an existing folder `dst` may be replaced (``--force``); without, a
            folder there, or one another run switches in meanwhile, fails the write
            (:func:`~.files.replace_folder`).
        origin : mapping of str to str, optional
            Tensors renamed or left out (layers or experts removed): `tensors` holds the
            new names, and ``origin[new]`` is the tensor of the checkpoint whose shard it
            goes into. A shard left with no tensor is not written (the caller writes
            the index, through `contents`).
        """
        if origin is not None:
            if tensors is None or set(tensors) != set(origin) or not set(origin.values()) <= set(self.tensors):
                raise ValueError("renamed tensors must each name a tensor of the checkpoint they come from")
        elif tensors is not None and set(tensors) != set(self.tensors):
            raise ValueError("the tensors written must have the names of the checkpoint's tensors")
        tensors = self.tensors if tensors is None else tensors
        contents = dict(contents or {})
        if writes_one_file(dst):
            if tensors is not self.tensors or contents:
                raise ValueError("new shapes or files are written to a folder, not one .safetensors file")
            return self._write_one_file(dst, fill, made)
        if made and CONFIG in self.files and CONFIG not in contents:
            contents[CONFIG] = self._config_with(made)
        names = self.written()
        shard_of = {new: self.shard_of[old] for new, old in origin.items()} if origin is not None else self.shard_of
        shards = [s for s in self.shards if origin is None or s in set(shard_of.values())]
        with replace_folder(dst, replace=replace) as tmp:
            for folder in self.folders:
                os.mkdir(os.path.join(tmp, *folder.split("/")))
            with contextlib.ExitStack() as stack:
                handles = [stack.enter_context(open(os.path.join(tmp, *n.split("/")), "xb")) for n in shards]
                writers: dict[str, Any] = {}
                for shard, f in zip(shards, handles, strict=True):
                    mine = [t for name, t in tensors.items() if shard_of[name] == shard]
                    prefix = shard[: shard.rfind("/") + 1]  # a sub-folder's shard stores names without it
                    local = [dataclasses.replace(t, name=t.name[len(prefix) :]) for t in mine] if prefix else mine
                    writer = TensorWriter(f, with_record(self.metadata[shard], made), local)
                    writers[shard] = _LocalNames(writer, len(prefix)) if prefix else writer
                result = fill({name: writers[shard_of[name]] for name in tensors})
                for shard, f in zip(shards, handles, strict=True):
                    writers[shard].finish()
                    os.fsync(f.fileno())
                    files._step(f"shard {shard}")
            for name in names[len(self.shards) :]:
                if name in contents:
                    with open(os.path.join(tmp, *name.split("/")), "xb") as f:
                        f.write(contents[name])
                        f.flush()
                        os.fsync(f.fileno())
                    files._step(f"write {name}")
                    continue
                source, target = os.path.join(self.folder, *name.split("/")), os.path.join(tmp, *name.split("/"))
                with _open_regular(source) as src, open(target, "xb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
                    f.flush()
                    os.fsync(f.fileno())
                files._step(f"copy {name}")
        return result

    def _write_one_file(
        self, dst: str, fill: Callable[[Mapping[str, TensorWriter]], R], made: Mapping[str, str] | None
    ) -> R:
        """Write every tensor into one safetensors file `dst`, atomically (bounded memory).

        Its metadata is what all shards' metadata have in common, and the record `made`.
        """
        first, *rest = (self.metadata[s] for s in self.shards)
        metadata = {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}
        return SafetensorsFile.write_tensors(dst, with_record(metadata, made), self.tensors, fill)

    def _config_with(self, made: Mapping[str, str]) -> bytes:
        """The folder's ``config.json`` with the provenance record under its key, as ``transformers`` writes it."""

        return config_bytes({**(read_config(self.folder) or {}), KEY: dict(made)})

    def written(self) -> list[str]:
        """The names :meth:`write` writes, in order."""
        return [*self.shards, *self.files, *([os.path.basename(self.index)] if self.index else [])]


class _LocalNames:
    """The writer of a sub-folder's shard, taking the checkpoint's ``FOLDER/NAME`` names."""

    def __init__(self, writer: TensorWriter, cut: int):
        self._writer, self._cut = writer, cut

    def write(self, name: str, data: Any) -> None:
        self._writer.write(name[self._cut :], data)

    def phase(self, name: str, done: int) -> int | None:
        return self._writer.phase(name[self._cut :], done)

    def finish(self) -> None:
        self._writer.finish()


def writes_one_file(dst: Any) -> bool:
    """Whether a checkpoint written to `dst` is one safetensors file (`dst` ends in
    ``.safetensors``) rather than a folder."""
    return os.fspath(dst).lower().endswith(".safetensors")


def open_checkpoint(src: Any) -> ShardedCheckpoint | SafetensorsFile:
    """Read a checkpoint's headers: a sharded one (folder or index) or one safetensors file.

    Parameters
    ----------
    src : str or os.PathLike
        A folder holding shards and their index, the index file, or a safetensors file.

    Returns
    -------
    ShardedCheckpoint or SafetensorsFile
        Both have ``tensors`` (names to stored tensors, sorted by name) and
        ``write(dst, fill)``.

    Raises
    ------
    FormatError
        For a missing or hostile index, shard or file (see the module's checks).
    """
    src = os.fspath(src)
    if not os.path.exists(src):
        raise FormatError(src, "no such file or folder")
    return ShardedCheckpoint(src) if is_sharded(src) else SafetensorsFile(src)


def check_destination(dst: Any, source: ShardedCheckpoint | SafetensorsFile, force: bool) -> None:
    """Refuse a destination that cannot receive `source`, before anything is written.

    A sharded checkpoint goes to a folder: a new one in an existing folder, or, with
    `force`, an existing one (its files of the same names are replaced; others stay),
    which must not hold a folder named like a file of the checkpoint.
    A single file, or a sharded checkpoint written to a ``.safetensors`` name (one file
    holding every tensor), goes to a file: an existing one (or the input itself) only
    with `force`.

    Raises
    ------
    FormatError
        Naming `dst` and the problem.
    """
    dst = os.fspath(dst)
    sharded = isinstance(source, ShardedCheckpoint) and not writes_one_file(dst)
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise FormatError(dst, "its folder does not exist")
    if not os.path.lexists(dst):
        return
    if sharded and not os.path.isdir(dst):
        raise FormatError(dst, "exists and is not a folder (a sharded checkpoint is written to a folder)")
    if not sharded and os.path.isdir(dst):
        raise FormatError(dst, "is a directory")
    if sharded and isinstance(source, ShardedCheckpoint):
        for name in source.written():
            if os.path.isdir(os.path.join(dst, name)):
                raise FormatError(dst, f"holds a folder named {name!r}, a file of the checkpoint; not replaced")
    if force:
        return
    what = source.folder if isinstance(source, ShardedCheckpoint) else source.path
    if os.path.exists(dst) and os.path.samefile(dst, what):
        kind = "folder" if sharded else "file"
        raise FormatError(dst, f"is the input {kind}; refusing to overwrite it without --force")
    raise FormatError(dst, "exists; use --force to overwrite it")
