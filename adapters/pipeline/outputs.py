"""Checks of an output path against the input, made before anything is read or written.

An empty OUT (``-o ""``) would resolve to the working directory; an OUT that is one of
IN's files (a shard, the index, ``config.json``, an ONNX model's external data) or a
folder holding IN would destroy IN when written. Both are refused, ``--force`` or not;
OUT = IN itself (pruning in place, atomically) stays a matter of ``--force``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from arrayprune.adapters.formats import FormatError, detect_format
from arrayprune.adapters.formats.onnx import _parse_onnx
from arrayprune.adapters.formats.onnx_skeleton import external_locations
from arrayprune.adapters.pipeline.errors import PruneError
from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["check_output_name", "check_not_input"]


def check_output_name(dst: Any, flag: str = "-o/--output") -> None:
    """Refuse an empty or whitespace-only output name.

    Parameters
    ----------
    dst : str or os.PathLike or None
        The output as given (None: none given, nothing to check).
    flag : str, optional
        The option that named it, for the message.

    Raises
    ------
    PruneError
        One line naming `flag`.
    """
    if dst is not None and not os.fspath(dst).strip():
        raise PruneError(f"{flag} is empty: give the name of the file or folder to write")


def _onnx_data(src: str) -> list[str]:
    """The external-data files an ONNX model references (none if it cannot be read here)."""

    try:
        if detect_format(src) != "onnx":
            return []

        locations = external_locations(_parse_onnx(src))
    except FormatError:
        return []  # reading IN reports it
    folder = os.path.dirname(os.path.abspath(src))
    return [os.path.join(folder, loc) for loc in locations]


def _input_files(src: str) -> Iterator[str]:
    """Every path IN consists of: the file and its external data, or a checkpoint
    folder and its entries (shards, index, ``config.json``, tokenizer files, ...)."""
    folder = None
    if os.path.isdir(src):
        folder = src
    elif src.lower().endswith(".json"):  # a sharded checkpoint's index
        folder = os.path.dirname(os.path.abspath(src))
    if folder is not None:
        yield folder
        yield from (os.path.join(folder, name) for name in os.listdir(folder))
        return
    yield src
    yield from _onnx_data(src)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_not_input(src: Any, dst: Any, flag: str = "-o/--output", *, in_place: bool = True) -> None:
    """Refuse an output that is one of the input's files, or a folder holding the input.

    The input itself (OUT = IN, written in place atomically) is left to the ``--force``
    checks; a shard, the index or another file of a checkpoint folder, an ONNX model's
    external data, or a folder that holds IN are refused whatever the options, as is
    anything that resolves to one of them (symlinks, hard links).

    Parameters
    ----------
    src, dst : str or os.PathLike
        The input and the output (`dst` need not exist).
    flag : str, optional
        The option that named `dst`, for the message.
    in_place : bool, default True
        Whether OUT may be IN itself (a pruned model written over its input); False for
        outputs of another kind (a scan's JSON, a picture).

    Raises
    ------
    PruneError
        One line naming `dst`.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if not os.path.exists(src):
        return
    real_out = os.path.realpath(dst)
    whole = src if os.path.isdir(src) or not src.lower().endswith(".json") else os.path.dirname(os.path.abspath(src))
    real_in = os.path.realpath(whole)  # an index stands for its folder
    if real_in.startswith(real_out.rstrip(os.sep) + os.sep):
        raise PruneError(f"{flag} is a folder holding the input {src}; refusing to replace it, --force or not", dst)
    if not os.path.lexists(dst):
        return
    if _same(whole, dst):
        if in_place:
            return
        raise PruneError(f"{flag} is the input {src}; refusing to overwrite it, --force or not", dst)
    for path in _input_files(src):
        if os.path.realpath(path) == real_out or _same(path, dst):
            if _same(path, whole):
                return
            raise PruneError(
                f"{flag} is {os.path.basename(path)!r}, a file of the input {src}; refusing to overwrite it, "
                "--force or not",
                dst,
            )


def check_whole_output(src: str, dst: str | None, spec: PruneSpec) -> str:
    """Refuse an output that cannot be written (a whole file), before anything is read."""
    if dst is None:
        raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
    if os.path.isdir(dst):
        raise PruneError("is a directory", dst)
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise PruneError("folder does not exist", dst)
    if os.path.exists(dst):
        if os.path.samefile(src, dst) and not spec.force:
            raise PruneError("is the input file; refusing to overwrite it without --force", dst)
        if not spec.force:
            raise PruneError("exists; use --force to overwrite it", dst)
    return dst
