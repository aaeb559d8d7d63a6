"""Order statistics: the one operation the Array API standard lacks.

Every pruning mask in arrayprune comes down to "drop the `k` entries of smallest
magnitude", over one array or over many at once. The standard offers ``sort`` but no
selection, and sorting a large array is far slower than reading it. This package holds
that operation, once; this module only chooses the route:

* :mod:`.host`: NumPy arrays and CPU tensors (zero-copy views), on the integer bit
  patterns of the floats, streamed in cache-sized chunks;
* :mod:`.lazy`: Dask arrays, by the radix select of :mod:`.radix` over their blocks
  (a bounded number of graph executions; the masks come back lazy), or in memory when
  small;
* :mod:`.portable`: every other library (CuPy, CUDA tensors, JAX, array-api-strict,
  ...), with whole-array operations of the standard alone (on an H100 the fastest of
  the routes tried, and 3x faster than torch's ``topk`` mask at 2^27 entries:
  ``benchmarks/results/gpu-bench-h100-run1.md``).

The host and portable routes run the sample-bracket select of :mod:`.bracket` on large
inputs and an exact selection (partition or sort) on small ones. Order is total and
identical on every route: magnitudes ascending, NaN above +inf, ties by position (over
several arrays, earlier array first, then lowest flat index); subnormals rank by value
on every library and device (JAX and GPUs compare them as zero, so those compare the
floats' bit patterns as integers). `kth_smallest` takes the same routes with signed
values ascending, NaN above +inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._namespace import namespace
from . import host, lazy, portable
from .lazy import Count, defers_count

__all__ = ["defers_count", "kth_smallest", "smallest_magnitude_keep"]

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
    if value is not None:
        return value
    if lazy.is_lazy(x):
        if not lazy.fits_in_memory([x]):
            return lazy.kth_smallest(x, k)
        (values,), _, _ = lazy.gather([x], [None], 0)
        return lazy.as_scalar(kth_smallest(values, k))
    return portable.kth_smallest(namespace(x), x, k)


def smallest_magnitude_keep(
    scores: Sequence[Array],
    k: Count,
    eligible: Sequence[Array | None] | None = None,
) -> list[Array]:
    """Boolean keep masks that drop the `k` eligible entries of smallest magnitude.

    The arrays are ranked together, as if concatenated (without concatenating them):
    by ``|score|`` ascending, NaN above +inf, ties by position.

    Parameters
    ----------
    scores : sequence of arrays
        Arrays of one namespace and device, any shapes.
    k : int or callable
        Number of entries to drop, ``0 <= k <= number of eligible entries``. For Dask
        arrays (see :func:`defers_count`) also a function of the number of eligible
        entries returning it, such as an amount's ``count``: they are then counted in
        the first pass over the data, not in a pass of their own.
    eligible : sequence of (boolean array or None), optional
        Per array, the entries that may be dropped (same shape as the scores); ``None``
        means all. Ineligible entries are neither counted nor dropped.

    Returns
    -------
    list of arrays
        Boolean arrays shaped like `scores`: False exactly at the `k` dropped entries
        (lazy Dask arrays, chunked like `scores`, for Dask input).
    """
    if type(scores[0]) is not np.ndarray and lazy.is_lazy(scores[0]):
        return _lazy_keep(list(scores), [None] * len(scores) if eligible is None else list(eligible), k)
    if callable(k):  # a count deferred to the first pass: for lazy arrays only
        raise TypeError("k must be an int for arrays in memory")
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


def _lazy_keep(scores: list[Array], eligible: list[Array | None], k: Count) -> list[Array]:
    """The route of Dask arrays: in memory when small, over their blocks otherwise."""
    if not callable(k) and k < 0:
        raise ValueError(f"cannot drop a negative number of entries ({k})")
    if not lazy.fits_in_memory(scores):
        return lazy.keep_masks(scores, eligible, k)
    host_scores, host_eligible, k = lazy.gather(scores, eligible, k)
    return lazy.as_lazy(smallest_magnitude_keep(host_scores, k, host_eligible), scores)
