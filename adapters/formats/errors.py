"""Errors of the weight-file readers and writers, and the import of optional packages.

Every problem is raised as :class:`FormatError`, whose message is one line naming the
file; :func:`import_optional` names the extra of arrayprune that installs a missing package.
"""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType
from typing import Any

# Optional dependencies: import name -> the extra of arrayprune that installs it.
_EXTRAS = {"onnx": "onnx", "onnxruntime": "onnx", "safetensors": "safetensors", "torch": "torch", "tqdm": "cli"}


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



def write_failure(path: Any, exc: OSError) -> FormatError:
    """The one-line error of a write to `path` that failed with `exc` (a full disk, a folder
    that cannot be written): ``PATH: cannot write: No space left on device``."""
    return FormatError(path, f"cannot write: {exc.strerror or _describe(exc)}")


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


def import_optional(module: str, path: Any, purpose: str) -> ModuleType:
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

