"""How the command line shows a run on a terminal: stages and progress bars.

Which tensors are pruned is the plan's business (:mod:`arrayprune.adapters.plan`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from arrayprune.adapters.plan import stream_seed

from .errors import PROG

__all__ = ["stream_seed"]


def _interactive() -> bool:
    """Whether progress is shown: stderr is a terminal."""
    return sys.stderr.isatty()


def _stage(what: str) -> None:
    """Announce a stage of the run (loading, calibration, global threshold) on a terminal."""
    if _interactive():
        sys.stderr.write(f"{PROG}: {what}\n")
        sys.stderr.flush()


def _progress(items: Sequence[Any], desc: str, unit: str = "tensor") -> Any:
    """`items`, with a progress bar on a terminal (tqdm, when installed)."""
    if not _interactive():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False)
