"""PyTorch files: read with ``torch.load(weights_only=True)``, written with ``torch.save``.

No code runs from a file: ``weights_only=True`` refuses anything that is not plain
tensors and containers without running it.
"""

from __future__ import annotations

import re
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from . import files
from .arrays import _check_has_data, _is_array, _to_torch
from .errors import FormatError, _describe, import_optional
from .weightfile import WeightFile


def load(path: str) -> WeightFile:
    """Read a PyTorch file with ``torch.load(weights_only=True)``."""
    torch = import_optional("torch", path, "reading PyTorch files")
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


def save(path: str, params: Mapping, like: WeightFile | None = None) -> None:
    """Write `params` with ``torch.save`` (`like` is not needed); atomically."""
    torch = import_optional("torch", path, "writing PyTorch files")

    def convert(node: Any, name: str) -> Any:
        if isinstance(node, Mapping):
            out: Any = OrderedDict() if isinstance(node, OrderedDict) else {}
            for k, v in node.items():
                out[k] = convert(v, f"{name}/{k}" if name else str(k))
            meta = getattr(node, "_metadata", None)
            if meta is not None and isinstance(out, OrderedDict):
                setattr(out, "_metadata", meta)  # noqa: B010 (an attribute OrderedDict does not declare)
            return out
        if _is_array(node):
            _check_has_data(path, name, node)
            if not isinstance(node, torch.Tensor):
                return _to_torch(path, node)
        return node

    obj = convert(params, "")
    files.atomic_write(path, lambda f: torch.save(obj, f))
