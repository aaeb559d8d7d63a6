"""How a run of the file pipeline shows itself: :class:`Hooks`.

The command line announces stages and draws progress bars through them; from Python
(``prune_file``) a run is silent unless hooks are given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Hooks"]


def _same(items: Sequence[Any], desc: str, unit: str = "tensor") -> Iterable[Any]:
    return items


def _nothing(what: str) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """How a run shows itself: the command line announces stages and draws progress bars.

    Attributes
    ----------
    stage : callable
        ``stage(text)``: a stage begins (loading, calibration, the global threshold).
    progress : callable
        ``progress(items, description, unit="tensor")``: `items`, wrapped (a progress bar).
    """

    stage: Callable[[str], None] = _nothing
    progress: Callable[..., Iterable[Any]] = _same
