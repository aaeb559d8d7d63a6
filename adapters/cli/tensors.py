"""The tensors of a file as the command line sees them: checks, counts, seeds, progress.

Which tensors are pruned is the plan's business (:mod:`arrayprune.adapters.plan`).
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from arrayprune.adapters import mapping as mp
from arrayprune.adapters.plan import _name

from .errors import CliError

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
