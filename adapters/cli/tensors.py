"""The tensors of a file as the command line sees them: which to prune, tied names, seeds."""

from __future__ import annotations

import argparse
import fnmatch
import math
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from arrayprune.adapters import mapping as mp

from .errors import CliError

__all__ = ["Target", "stream_seed"]


def _name(path: tuple) -> str:
    return "/".join(map(str, path))


def _is_float(x: Any) -> bool:
    try:
        import array_api_compat as apc

        xp = apc.array_namespace(x)
        return bool(xp.isdtype(x.dtype, "real floating"))
    except Exception:
        return False


def _size(x: Any) -> int:
    return math.prod(int(s) for s in x.shape)


def _zeros(x: Any) -> int:
    import array_api_compat as apc

    xp = apc.array_namespace(x)
    return int(xp.count_nonzero(x == 0))


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def _default_rule(value: Any) -> str | None:
    """Why the default selection leaves `value`, or None if it prunes it."""
    if not _is_float(value):
        return f"{_dtype_name(value)}, not floating point"
    if len(value.shape) < 2:
        return f"{len(value.shape)}-D"
    return None


def _alias_key(value: Any) -> Any:
    """A key shared by the arrays that are one tensor under several names (tied weights).

    Two names are one tensor when they view the same memory with the same shape, strides
    and dtype, as ``torch.load`` returns tied parameters (``lm_head.weight`` and
    ``embed_tokens.weight``, say).
    """
    if _size(value) == 0:
        return ("distinct", id(value))
    if type(value).__module__.split(".")[0] == "torch":
        return ("torch", str(value.device), value.data_ptr(), tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, np.ndarray):
        return ("numpy", value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)
    return ("distinct", id(value))


def _check_arrays(params: Mapping, src: str) -> None:
    """Refuse trees that cannot be walked and tensors that hold no values."""
    try:
        for path, value in mp.iter_arrays(params):
            if getattr(value, "is_meta", False):
                raise CliError(f"tensor {_name(path)!r} is on the meta device: it holds no values to prune", src)
    except mp.TreeError as exc:
        raise CliError(f"cannot walk the file's contents: {exc}", src) from None


class Target(NamedTuple):
    """A tensor to prune: its path, its (original) array, and its other names if tied."""

    path: tuple
    value: Any
    tied: tuple[tuple, ...] = ()


def _select(params: Mapping, args: argparse.Namespace) -> list[Target]:
    """The tensors to prune, in the order of the file.

    Pruned entries (``name_orig`` + ``name_mask``) are candidates under their own name.
    A tensor stored under several names is one target, pruned once and written under all
    of them so that the names stay tied; it is selected if one of its names is, unless
    ``--exclude`` matches one of them.
    """
    groups: dict[Any, list[tuple[tuple, Any]]] = {}
    for path, value, mask in mp.iter_entries(params):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            key = ("pruned", path) if mask is not None else _alias_key(value)
            groups.setdefault(key, []).append((path, value))
    chosen = []
    for members in groups.values():
        names = [_name(path) for path, _ in members]
        value = members[0][1]
        if not _is_float(value) or _size(value) < args.min_size:
            continue
        if any(fnmatch.fnmatchcase(name, pat) for name in names for pat in args.exclude):
            continue
        if args.include:
            if not any(fnmatch.fnmatchcase(name, pat) for name in names for pat in args.include):
                continue
        elif _default_rule(value) is not None:
            continue
        chosen.append(Target(members[0][0], value, tuple(path for path, _ in members[1:])))
    return chosen


def stream_seed(seed: int | None, name: str = "") -> int | None:
    """The seed of one random stream, from the user's ``--seed`` and a tensor's name.

    Any integer is a seed. It is mixed with the name by NumPy's
    :class:`~numpy.random.SeedSequence` (entropy ``[crc32(name), seed < 0, |seed|]``,
    which tells every integer apart) into a 63-bit seed, which every library's generator
    accepts; the random method then draws from the generator of the tensor's own library
    seeded with it (see :mod:`arrayprune.rng`). Without ``--global`` each tensor has
    its own stream (its name), with ``--global`` one stream serves all (the empty name).

    Parameters
    ----------
    seed : int or None
        The user's seed; None means fresh entropy (None is returned).
    name : str, default ""
        The tensor's name.

    Returns
    -------
    int or None
        A seed in ``[0, 2**63)``.
    """
    if seed is None:
        return None
    entropy = [zlib.crc32(name.encode()), int(seed < 0), abs(int(seed))]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _progress(items: Sequence[Any], desc: str) -> Any:
    if not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="tensor", file=sys.stderr, leave=False)
