"""Writes of a new file of known size that bypass the page cache (``O_DIRECT``).

A buffered write copies every byte into the kernel's page cache, and the kernel writes
it to disk later (or at ``fsync``). For a multi-gigabyte output that copy is most of the
cost of a write, and it is an unstable one: on a virtual machine whose host takes freed
memory back (a balloon with free page reporting), the page cache's fresh pages fault in
at the host first, and the same buffered write of 2 GB measured 0.6 s in one run and
3 s or more in the next. A direct write goes from the process's buffer to the device:
no page cache to fill, and the output does not push the input (or anything else) out of
memory.

Direct I/O has rules: each write starts at a file offset, from a memory address and with
a length that are multiples of the device's block size. :class:`DirectWrites` takes
writes of any offset and length (each byte of the file written once, in any order), as
:class:`~arrayprune.adapters.formats.safetensors_stream.TensorWriter` makes them, and
turns them into aligned ones: the whole blocks of a write are copied into an aligned
staging buffer and written; the partial blocks at its ends wait, in memory, until the
writes that fill them arrive. The last block is written padded, and the file cut to its
size at :meth:`DirectWrites.finish`.

:func:`open_direct` gives ``None`` where direct writes are not available (not Linux, no
``/proc``, a file system that refuses them, such as some network or in-memory ones):
the caller writes through the page cache then.
"""

from __future__ import annotations

import mmap
import os
import sys
import weakref
from typing import IO, Any

import numpy as np

__all__ = ["BLOCK", "ENV", "MIN_SIZE", "DirectWrites", "at_phase", "block_buffer", "open_direct"]

#: Alignment of every direct write (offset, address and length): 4 KiB, a multiple of
#: every common device's logical block size (512 or 4096 bytes).
BLOCK = 4096

#: Files smaller than this are written through the page cache (reopening the file and
#: aligning its writes would cost more than they save).
MIN_SIZE = 64 << 20

#: Bytes of the staging buffer: whole blocks are copied there and written in pieces of
#: at most this size.
_STAGING = 8 << 20

_O_DIRECT = getattr(os, "O_DIRECT", 0)

#: The environment variable that turns direct writes off (``ARRAYPRUNE_DIRECT_WRITES=0``):
#: every file is written through the page cache then.
ENV = "ARRAYPRUNE_DIRECT_WRITES"


def _aligned(size: int) -> np.ndarray:
    """`size` bytes of page-aligned memory (an anonymous map is aligned to a page)."""
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)


def block_buffer(nbytes: int) -> np.ndarray:
    """Bytes from which :func:`at_phase` takes `nbytes` at any phase."""
    return _aligned(nbytes + BLOCK)


def at_phase(buffer: np.ndarray, phase: int, dtype: Any, size: int) -> np.ndarray:
    """`size` entries of `dtype` in `buffer` (of :func:`block_buffer`), `phase` bytes past a block.

    Bytes bound for file offset ``k * BLOCK + phase`` and placed there are written by
    :meth:`DirectWrites.write` straight from memory, without a copy.
    """
    nbytes = size * np.dtype(dtype).itemsize
    if buffer.size < phase % BLOCK + nbytes:
        raise ValueError(f"a buffer of {buffer.size} bytes cannot hold {nbytes} at phase {phase % BLOCK}")
    return buffer[phase % BLOCK :][:nbytes].view(dtype)


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    """Write all of `data` at `offset` (a direct write may be short only by whole blocks)."""
    view = data.data
    while view.nbytes:
        done = os.pwrite(fd, view, offset)
        if done <= 0 or (done < view.nbytes and done % BLOCK):
            raise OSError(28, "short write (is the disk full?)")
        view, offset = view[done:], offset + done


class DirectWrites:
    """Positioned writes of a file of `size` bytes, each byte once, through ``O_DIRECT``.

    Use :func:`open_direct` to make one. Not thread-safe: one thread writes (the
    background writer of a streamed prune).

    Parameters
    ----------
    fd : int
        A descriptor of the file opened for writing with ``O_DIRECT``; closed by
        :meth:`finish` or :meth:`close` (or when this object is collected).
    size : int
        The size the file will have.
    """

    def __init__(self, fd: int, size: int):
        self._fd = fd
        self._size = size
        self._closer = weakref.finalize(self, os.close, fd)
        self._staging: np.ndarray | None = None
        self._edge = _aligned(BLOCK)
        #: Blocks written in part so far: block index -> (its bytes, how many are filled).
        self._partial: dict[int, tuple[np.ndarray, int]] = {}

    def write(self, offset: int, data: Any) -> None:
        """Write the bytes of `data` (bytes or a C-contiguous array) at `offset`."""
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        end = offset + src.size
        if offset < 0 or end > self._size:
            raise ValueError(f"bytes {offset}..{end} lie outside a file of {self._size} bytes")
        first = -(-offset // BLOCK) * BLOCK  # the whole blocks: [first, last)
        last = end // BLOCK * BLOCK
        if first >= last:  # within one block, or across one boundary
            self._fill(offset, src)
            return
        self._fill(offset, src[: first - offset])
        self._fill(last, src[last - offset :])
        if (src.ctypes.data - offset) % BLOCK == 0:  # aligned in memory as in the file: no copy
            _pwrite_all(self._fd, src[first - offset : last - offset], first)
            return
        if self._staging is None:
            self._staging = _aligned(_STAGING)
        for start in range(first, last, _STAGING):
            stop = min(start + _STAGING, last)
            piece = self._staging[: stop - start]
            np.copyto(piece, src[start - offset : stop - offset])
            _pwrite_all(self._fd, piece, start)

    def _fill(self, offset: int, src: np.ndarray) -> None:
        """Put `src`'s bytes into the partial blocks they fall in; write those filled."""
        while src.size:
            index, at = divmod(offset, BLOCK)
            n = min(src.size, BLOCK - at)
            block, filled = self._partial.get(index) or (np.zeros(BLOCK, dtype=np.uint8), 0)
            block[at : at + n] = src[:n]
            filled += n
            if filled == min(BLOCK, self._size - index * BLOCK):  # whole (the last block: up to the end)
                self._partial.pop(index, None)
                self._edge[:] = block
                _pwrite_all(self._fd, self._edge, index * BLOCK)
            else:
                self._partial[index] = (block, filled)
            src, offset = src[n:], offset + n

    def finish(self) -> None:
        """Check that every byte was written; cut the file to its size; close it.

        Raises
        ------
        ValueError
            If some bytes were never written.
        """
        try:
            if self._partial:
                index = min(self._partial)
                raise ValueError(f"bytes of block {index} (offset {index * BLOCK}) were never written")
            os.ftruncate(self._fd, self._size)  # the last block was written whole, padded
        finally:
            self.close()

    def close(self) -> None:
        """Close the file (what was written stays written)."""
        self._closer()


def open_direct(f: IO[bytes], size: int, *, min_size: int | None = None) -> DirectWrites | None:
    """Direct writes of the new, empty file `f` will hold `size` bytes, or None.

    None where the file is smaller than `min_size`, direct writes are not available
    here, or the environment variable ``ARRAYPRUNE_DIRECT_WRITES`` is ``0`` (the
    caller writes through `f` then). The file is opened a second time, with
    ``O_DIRECT``; `f` itself is left as it is (its ``fsync`` after :meth:`DirectWrites.finish`
    makes the direct writes durable, as it does buffered ones).

    Parameters
    ----------
    f : binary file
        A new, empty regular file open for writing.
    size : int
        Its size once written.
    min_size : int, optional
        The smallest file written directly (default :data:`MIN_SIZE`).
    """
    if not _O_DIRECT or size < (MIN_SIZE if min_size is None else min_size) or not sys.platform.startswith("linux"):
        return None
    if os.environ.get(ENV, "1").strip() == "0":
        return None
    try:
        fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_WRONLY | _O_DIRECT | os.O_CLOEXEC)
    except (OSError, ValueError, AttributeError):
        return None
    try:  # a file system may open with O_DIRECT and refuse the write itself
        _pwrite_all(fd, _aligned(BLOCK), 0)
    except OSError:
        os.close(fd)
        return None
    return DirectWrites(fd, size)
