"""The tensors of a file as the command line sees them: checks, counts, seeds, progress.

Which tensors are pruned is the plan's business (:mod:`arrayprune.adapters.plan`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from arrayprune.adapters import mapping as mp
from arrayprune.adapters.plan import _name, stream_seed

from .errors import PROG, CliError

__all__ = ["stream_seed"]


def _zeros(x: Any) -> int:
    import array_api_compat as apc

    xp = apc.array_namespace(x)
    return int(xp.count_nonzero(x == 0))


def _check_arrays(params: Mapping, src: str) -> None:
    """Refuse trees that cannot be walked and tensors that hold no values."""
    try:
        for path, value in mp.iter_arrays(params):
            if getattr(value, "is_meta", False):
                raise CliError(f"tensor {_name(path)!r} is on the meta device: it holds no values to prune", src)
    except mp.TreeError as exc:
        raise CliError(f"cannot walk the file's contents: {exc}", src) from None


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
