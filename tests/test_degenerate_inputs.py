"""Hostile and degenerate input to the core: huge blocks, long N:M groups, empty arrays,
bad Wanda norms, Dask arrays of unknown chunk sizes, CSR off the default device."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from test_patterns import _reference_nm

import arrayprune as ap
from arrayprune import patterns
from conftest import to_numpy

# --------------------------------------------------------------------------------------
# blocks larger than the array
# --------------------------------------------------------------------------------------


def test_block_larger_than_the_array_is_the_whole_array_in_constant_memory():
    w = np.arange(256, dtype=np.float32).reshape(16, 16)
    ap.block_unstructured(w, 1, block_shape=(4, 4))  # imports and caches outside the measure
    tracemalloc.start()
    try:
        everything = ap.block_unstructured(w, 1, block_shape=(100000, 100000))
        nothing = ap.block_unstructured(w, 0.4, block_shape=(100000, 100000))  # round(0.4 * 1) = 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the array is 1 KiB; an unclipped block would take 80 GB
    np.testing.assert_array_equal(everything, np.zeros((16, 16), bool))
    np.testing.assert_array_equal(nothing, np.ones((16, 16), bool))


def test_block_longer_than_one_axis_covers_that_axis(backend):
    # Blocks (all rows) x (2 columns): column pairs {0, 1} (sum 15) and {2, 3} (sum 27).
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    mask = ap.block_unstructured(backend.asarray(w), 0.5, block_shape=(100000, 2))
    np.testing.assert_array_equal(to_numpy(mask), [[False, False, True, True]] * 3)
    # The same as blocks of exactly the array's length.
    np.testing.assert_array_equal(to_numpy(mask), ap.block_unstructured(w, 0.5, block_shape=(3, 2)))
    assert ap.BlockUnstructured(0.5, (100000, 2)).units(w) == (2, 0)


# --------------------------------------------------------------------------------------
# N:M with long groups: a sort along the group, the same masks as pairwise ranking
# --------------------------------------------------------------------------------------


def _nm_masks_both_ways(monkeypatch, x, default, n, m, dim):
    """The N:M mask by a sort (every group) and by pairwise comparisons (every group)."""
    method = ap.NMStructured(n, m, dim)
    monkeypatch.setattr(patterns, "_PAIRWISE_MAX_M", 0)
    by_sort = method.compute_mask(x, default)
    monkeypatch.setattr(patterns, "_PAIRWISE_MAX_M", 1 << 30)
    pairwise = method.compute_mask(x, default)
    return by_sort, pairwise


@pytest.mark.parametrize("n, m", [(1, 4), (2, 4), (3, 8), (1, 16), (7, 16), (16, 16), (5, 33)])
def test_nm_by_sort_equals_pairwise_ranking(backend, monkeypatch, n, m):
    rng = np.random.default_rng(n * 100 + m)
    x = np.round(rng.standard_normal((5, 70)), 1).astype(np.float32)  # many ties
    x[rng.random(x.shape) < 0.05] = np.nan
    x[rng.random(x.shape) < 0.05] = np.inf
    x[rng.random(x.shape) < 0.05] = -np.inf
    x[rng.random(x.shape) < 0.05] = -0.0
    pruned = rng.random(x.shape) < 0.2
    for dim in (-1, 0):
        for default in (None, ~pruned):
            by_sort, pairwise = _nm_masks_both_ways(
                monkeypatch, backend.asarray(x), None if default is None else backend.asarray(default), n, m, dim
            )
            np.testing.assert_array_equal(to_numpy(by_sort), to_numpy(pairwise))
            np.testing.assert_array_equal(to_numpy(by_sort), _reference_nm(x, n, m, dim, default))


def test_nm_long_groups_hand_computed(backend):
    # Ties by position; NaN above +inf above every finite magnitude; -0 equals 0.
    row = np.ones(16, np.float32)
    row[[3, 9]] = 0.5
    row[[1, 2]] = np.nan
    row[[5, 6]] = np.inf
    row[12] = -0.0
    row[15] = 0.0
    x = backend.asarray(row[None, :])
    drop = lambda n: np.flatnonzero(~to_numpy(ap.nm_structured(x, n, 16))[0])  # noqa: E731
    assert drop(1).tolist() == [12]
    assert drop(4).tolist() == [3, 9, 12, 15]
    assert drop(6).tolist() == [0, 3, 4, 9, 12, 15]  # the first two of the ten ones
    assert drop(13).tolist() == [0, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15]  # every one, then +inf at 5
    assert drop(15).tolist() == [0, 1, *range(3, 16)]  # both +inf, then the NaN at 1
    # A trailing group of 20 - 16 = 4 entries keeps at most 16 - 13 = 3: drops its smallest.
    tail = backend.asarray(np.array([[*range(16, 0, -1), 9, 7, 8, 6]], np.float32))
    kept = to_numpy(ap.nm_structured(tail, 13, 16))[0]
    assert np.flatnonzero(~kept).tolist() == [*range(3, 16), 19]
