"""Arrays going into files: conversion to NumPy or PyTorch, flattening, data checks."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import FormatError, import_optional

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def release_pages(x: Any) -> None:
    """Give back the resident pages of `x` if it views a read-only memory map of a file.

    The process stops counting them (the kernel's page cache keeps them; reading `x`
    again maps them again), so reading the external data of a model tensor by tensor
    costs the memory of one tensor, not of the file. Anything else is left alone.
    """
    base = x
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    mm = getattr(base, "_mmap", None)
    if mm is None or _DONTNEED is None or getattr(base, "mode", "") != "r":
        return
    try:
        mm.madvise(_DONTNEED)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - closed, or a kernel that refuses
        pass


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
    torch = import_optional("torch", path, "writing PyTorch tensors")
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
