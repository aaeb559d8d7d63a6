"""Order statistics: the one operation the Array API standard lacks.

Every pruning mask in arrayprune comes down to "drop the `k` entries of smallest
magnitude", over one array or over many at once. The standard offers ``sort`` but no
selection, and sorting a large array is far slower than reading it. This package holds
that operation, once; this module only chooses the route:

* :mod:`.host`: NumPy arrays and CPU tensors (zero-copy views), on the integer bit
  patterns of the floats, streamed in cache-sized chunks;
* :mod:`.portable`: every other library (CuPy, CUDA tensors, JAX, array-api-strict,
  ...), with whole-array operations of the standard alone.

Both run the sample-bracket select of :mod:`.bracket` on large inputs and an exact
selection (partition or sort) on small ones. Order is total and identical on every
route: magnitudes ascending, NaN above +inf, ties by position (over several arrays,
earlier array first, then lowest flat index). `kth_smallest` takes the same routes
with signed values ascending, NaN above +inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._namespace import namespace
from . import host, portable

__all__ = ["kth_smallest", "smallest_magnitude_keep"]

Array = Any


def kth_smallest(x: Array, k: int, /) -> Array:
    """Return the `k`-th smallest value of `x` (1-based), NaN ranking above +inf.

    Parameters
    ----------
    x : array
        Any Array API array; it is flattened.
    k : int
        Rank, ``1 <= k <= x.size``.

    Returns
    -------
    array
        A 0-D array of the namespace, dtype and device of `x`.

    Raises
    ------
    ValueError
        If `k` is out of range.
    """
    value = host.kth_smallest(x, k)
    if value is None:
        value = portable.kth_smallest(namespace(x), x, k)
    return value


def smallest_magnitude_keep(
    scores: Sequence[Array],
    k: int,
    eligible: Sequence[Array | None] | None = None,
) -> list[Array]:
    """Boolean keep masks that drop the `k` eligible entries of smallest magnitude.

    The arrays are ranked together, as if concatenated (without concatenating them):
    by ``|score|`` ascending, NaN above +inf, ties by position.

    Parameters
    ----------
    scores : sequence of arrays
        Arrays of one namespace and device, any shapes.
    k : int
        Number of entries to drop, ``0 <= k <= number of eligible entries``.
    eligible : sequence of (boolean array or None), optional
        Per array, the entries that may be dropped (same shape as the scores); ``None``
        means all. Ineligible entries are neither counted nor dropped.

    Returns
    -------
    list of arrays
        Boolean arrays shaped like `scores`: False exactly at the `k` dropped entries.
    """
    if k < 0:
        raise ValueError(f"cannot drop a negative number of entries ({k})")
    if len(scores) == 1 and (eligible is None or eligible[0] is None):
        keep = host.keep_one(scores[0], k)
        if keep is not None:
            return [keep]
    scores = list(scores)
    elig = [None] * len(scores) if eligible is None else list(eligible)
    if len(elig) != len(scores):
        raise ValueError("eligible must have one entry per score array")
    # The host route comes first and never resolves a namespace: on small arrays that
    # lookup would cost more than the selection itself.
    keep = host.keep_masks(scores, elig, k)
    if keep is None:
        keep = portable.keep_masks(namespace(*scores), scores, elig, k)
    return keep
