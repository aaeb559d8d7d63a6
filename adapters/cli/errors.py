"""Errors of the command line: one line, ``arrayprune: error: [file: ]problem``, exit status 2."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["PROG", "CliError"]


PROG = "arrayprune"


class CliError(Exception):
    """An error reported as one line, ``arrayprune: error: [file: ]problem``.

    Parameters
    ----------
    problem : str
        What went wrong.
    file : str, optional
        The file concerned.
    """

    def __init__(self, problem: str, file: Any = None):
        self.file = None if file is None else os.fspath(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}" if self.file else problem)


def _message(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())


def _optional(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or a one-line error naming the extra that installs it."""

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CliError(f'{what} needs the {module!r} package: pip install "arrayprune[{extra}]"') from None


def _warn(message: str, kind: str = "warning") -> None:
    """One line on stderr, ``arrayprune: warning: ...`` (or ``note``); the run goes on."""
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: {kind}: {' '.join(message.split())}\n")
    sys.stderr.flush()


def _error(message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
    sys.stderr.flush()
