"""Hostile and degenerate input to the core: huge blocks, long N:M groups, empty arrays,
bad Wanda norms, Dask arrays of unknown chunk sizes, CSR off the default device."""

from __future__ import annotations

import tracemalloc

import numpy as np

import arrayprune as ap
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
