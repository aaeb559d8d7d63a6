"""Where a block of a chunked (Dask) array lies in the array's flat C-order positions.

A block is a product of index ranges, one per axis. In flat C order it is a set of
*runs*, equally long stretches of consecutive positions: the block covers every axis
after some axis ``lead`` fully and axis ``lead`` partly, so a run is one index on each
of the axes before ``lead``. The runs of one block, taken in the block's own C order,
have increasing flat positions: a block's entries keep their relative flat order, and
only runs of different blocks interleave (the rows of blocks side by side, say). Ties
broken by flat position and random streams drawn in flat order both rest on this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["block_location", "lead_axis", "run_starts"]

#: Per axis, ``(start, stop)`` of a block's indices.
Location = Sequence[tuple[int, int]]


def block_location(chunks: Sequence[Sequence[int]], index: Sequence[int]) -> list[tuple[int, int]]:
    """The ``(start, stop)`` per axis of block `index` of an array chunked as `chunks`.

    Parameters
    ----------
    chunks : sequence of sequences of int
        Dask's ``chunks``: per axis, the lengths of the blocks.
    index : sequence of int
        The block's position in the grid of blocks.

    Returns
    -------
    list of (int, int)
    """
    location = []
    for sizes, i in zip(chunks, index, strict=True):
        start = sum(sizes[:i])
        location.append((start, start + sizes[i]))
    return location


def lead_axis(shape: Sequence[int], location: Location) -> int:
    """The axis ``lead`` of a block: runs are indexed by the axes before it.

    Parameters
    ----------
    shape : sequence of int
        Shape of the whole array.
    location : sequence of (int, int)
        The block's index ranges.

    Returns
    -------
    int
        The last axis the block covers only partly; 0 if it covers every axis.
    """
    partial = [a for a, ((lo, hi), n) in enumerate(zip(location, shape, strict=True)) if hi - lo != n]
    return partial[-1] if partial else 0


def run_starts(shape: Sequence[int], location: Location) -> tuple[np.ndarray, int]:
    """Flat C-order positions of the runs of a block, and their common length.

    Parameters
    ----------
    shape : sequence of int
        Shape of the whole array.
    location : sequence of (int, int)
        The block's index ranges.

    Returns
    -------
    starts : ndarray of int64
        The first flat position of each run, in the block's C order (increasing).
    length : int
        Entries per run.
    """
    lead = lead_axis(shape, location)
    strides = [math.prod(shape[a + 1 :]) for a in range(len(shape))]
    extents = [hi - lo for lo, hi in location]
    length = math.prod(extents[lead:])
    starts = np.zeros((1,) * lead, dtype=np.int64) + (location[lead][0] * strides[lead] if shape else 0)
    for a in range(lead):
        grid = (np.arange(location[a][0], location[a][1], dtype=np.int64) * strides[a]).reshape(
            (1,) * a + (-1,) + (1,) * (lead - a - 1)
        )
        starts = starts + grid
    return starts.reshape(-1), length
