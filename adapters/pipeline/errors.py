"""The errors of the file pipeline: one line each, several reported together.

The bottom of :mod:`arrayprune.adapters`: every stage raises these and imports them from
here; nothing here imports the project.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["PruneError", "PruneProblems", "error_text", "optional_module", "raise_problems"]


class PruneError(ValueError):
    """An error of a pruning request or run, reported as one line, ``[file: ]problem``.

    Parameters
    ----------
    problem : str
        What went wrong.
    file : str or os.PathLike, optional
        The file concerned.
    """

    def __init__(self, problem: str, file: Any = None):
        self.file = None if file is None else os.fspath(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}" if self.file else problem)


class PruneProblems(PruneError):
    """Several problems found at once, before anything is run: one error, reported as a
    first line saying how many, then one line per problem.

    Parameters
    ----------
    problems : list of Exception
        The problems (each a one-line :class:`PruneError` or ``FormatError``).
    """

    def __init__(self, problems: list[Exception]):
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} problems:\n" + "\n".join(str(p) for p in self.problems))


def raise_problems(problems: list[Exception]) -> None:
    """Raise nothing for no problem, the problem itself for one, :class:`PruneProblems` for several."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise PruneProblems(problems)


def error_text(exc: BaseException) -> str:
    """The one-line message of `exc` (a ``KeyError``'s text without its quotes)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())


def optional_module(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or a :class:`PruneError` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PruneError(f'{what} needs the {module!r} package: pip install "arrayprune[{extra}]"') from None
