"""NumPy's seeded uniform numbers for Dask arrays, drawn lazily, block by block.

``numpy.random.Generator.random(shape, dtype=float32)`` takes one 32-bit word of its bit
generator's stream per number, in flat C order. PCG64 (NumPy's default) and PCG64DXSM
can jump ahead, so each block positions a copy of the generator at the flat position of
each of its runs (:mod:`arrayprune._blocks`) and draws there: the numbers are those the
in-memory draw gives, without drawing in memory. The generator handed in is then moved
past them, as that draw would have moved it, so that several arrays drawn one after
another from one generator get the numbers they get in memory.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._blocks import run_starts

__all__ = ["can_seek", "uniform"]

Array = Any

#: Bit generators that can jump ahead and buffer half a 64-bit output, as PCG64 does.
_SEEKABLE = ("PCG64", "PCG64DXSM")


def can_seek(generator: Any) -> bool:
    """Whether `generator` is a NumPy generator whose stream this module can jump along."""
    return isinstance(generator, np.random.Generator) and type(generator.bit_generator).__name__ in _SEEKABLE


def uniform(x: Array, shape: tuple[int, ...], generator: np.random.Generator) -> Array:
    """Lazy float32 numbers in ``[0, 1)``: ``generator.random(shape, dtype=float32)``.

    Parameters
    ----------
    x : Dask array
        Its chunks are used when `shape` is its shape.
    shape : tuple of int
        Shape of the result.
    generator : numpy.random.Generator
        A generator for which :func:`can_seek` holds; it is advanced past the numbers.

    Returns
    -------
    Dask array
        The numbers, chunked like `x` (or automatically for another shape).
    """
    da = sys.modules["dask.array"]
    if tuple(x.shape) == shape:
        chunks = x.chunks
    else:
        chunks = da.core.normalize_chunks("auto", shape, dtype=np.float32)
    state = generator.bit_generator.state
    meta = np.empty((0,) * len(shape), dtype=np.float32)
    out = da.map_blocks(_uniform_block, dtype=np.float32, chunks=chunks, meta=meta, state=state)
    generator.bit_generator.state = _positioned(state, math.prod(shape)).bit_generator.state
    return out


def _uniform_block(block_info: dict | None = None, *, state: dict) -> np.ndarray:
    """The numbers of one block, drawn run by run at their flat positions."""
    info = (block_info or {})[None]  # Dask always passes it
    location, shape = info["array-location"], info["shape"]
    extents = tuple(hi - lo for lo, hi in location)
    out = np.empty(math.prod(extents), dtype=np.float32)
    starts, length = run_starts(shape, location)
    if length:
        for j, start in enumerate(starts.tolist()):
            _positioned(state, start).random(length, dtype=np.float32, out=out[j * length : (j + 1) * length])
    return out.reshape(extents)


def _positioned(state: Mapping[str, Any], offset: int) -> np.random.Generator:
    """A generator whose next 32-bit word is word `offset` of the stream of `state`.

    A 64-bit output gives two words, low half first; the state may hold the high half
    of the last output (``has_uint32``), which comes first. ``advance`` counts 64-bit
    outputs and clears that buffer.
    """
    bit_generator = getattr(np.random, state["bit_generator"])()
    if state["has_uint32"]:
        if offset == 0:
            bit_generator.state = state
            return np.random.Generator(bit_generator)
        offset -= 1
        state = {**state, "has_uint32": 0, "uinteger": 0}
    bit_generator.state = state
    bit_generator.advance(offset // 2)
    generator = np.random.Generator(bit_generator)
    if offset % 2:
        generator.random(1, dtype=np.float32)  # the low half: its high half comes next
    return generator
