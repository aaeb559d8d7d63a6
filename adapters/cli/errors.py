"""Errors of the command line: one line, ``arrayprune: error: [file: ]problem``, exit status 2."""

from __future__ import annotations

import sys

from arrayprune.adapters.pipeline.request import PruneError

__all__ = ["PROG", "CliError"]


PROG = "arrayprune"


class CliError(PruneError):
    """An error of the command line itself (its arguments), reported as one line,
    ``arrayprune: error: [file: ]problem``; the pipeline's are :class:`PruneError`.

    Parameters
    ----------
    problem : str
        What went wrong.
    file : str, optional
        The file concerned.
    """


def _warn(message: str, kind: str = "warning") -> None:
    """One line on stderr, ``arrayprune: warning: ...`` (or ``note``); the run goes on."""
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: {kind}: {' '.join(message.split())}\n")
    sys.stderr.flush()


def _error(message: str, *more: str) -> None:
    """``arrayprune: error: message`` on stderr; each of `more` (further problems) on a line of its own."""
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
    sys.stderr.write("".join(f"  {' '.join(line.split())}\n" for line in more))
    sys.stderr.flush()
