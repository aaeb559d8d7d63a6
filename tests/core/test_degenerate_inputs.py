"""Hostile and degenerate input to the core: huge blocks, long N:M groups, empty arrays,
bad Wanda norms, Dask arrays of unknown chunk sizes, CSR off the default device."""

from __future__ import annotations

import re
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


# --------------------------------------------------------------------------------------
# empty arrays
# --------------------------------------------------------------------------------------


def test_wanda_without_output_units_is_an_empty_mask(backend):
    w = backend.asarray(np.zeros((0, 4), np.float32))
    mask = ap.wanda(w, amount=0.5)
    assert tuple(mask.shape) == (0, 4) and to_numpy(mask).dtype == np.bool_
    default = backend.asarray(np.zeros((0, 4), np.float32))
    assert tuple(ap.wanda(w, amount=0.5, default_mask=default).shape) == (0, 4)
    assert tuple(ap.wanda(backend.asarray(np.zeros((2, 0, 3), np.float32)), amount=1, dim=1).shape) == (2, 0, 3)
    # The amount is still checked against the inputs of a unit, as for any output count.
    with pytest.raises(ValueError, match="amount=5 should be smaller than the number of parameters to prune=4"):
        ap.wanda(w, amount=5)


def test_nm_on_an_empty_axis_is_an_empty_mask(backend):
    for shape, dim in (((3, 0), -1), ((0, 3), 0), ((0, 8), -1), ((2, 0, 16), -1)):
        mask = ap.nm_structured(backend.asarray(np.zeros(shape, np.float32)), 2, 4, dim)
        assert tuple(mask.shape) == shape and to_numpy(mask).dtype == np.bool_
    mask = ap.nm_structured(backend.asarray(np.zeros((3, 0), np.float32)), 1, 64)
    assert tuple(mask.shape) == (3, 0)


def test_lamp_on_empty_chunked_dask_arrays():
    da = pytest.importorskip("dask.array")
    from arrayprune.selection import lazy

    w = np.arange(1, 13, dtype=np.float64).reshape(4, 3)
    expected = [np.zeros((0, 3), bool), np.arange(12).reshape(4, 3) >= 6]
    for in_memory in (lazy.IN_MEMORY_SIZE, 0):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lazy, "IN_MEMORY_SIZE", in_memory)
            arrays = [da.zeros((0, 3), chunks=(1, 1)), da.from_array(w, chunks=(2, 2))]
            masks = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, normalization="lamp")
            for got, want in zip(masks, expected, strict=True):
                np.testing.assert_array_equal(got.compute(), want)
            (only,) = ap.global_unstructured(
                [da.zeros((3, 0), chunks=(1, 1))], ap.L1Unstructured, amount=0.5, normalization="lamp"
            )
            assert only.compute().shape == (3, 0)
    scores = ap.lamp_scores(da.zeros((0, 3), chunks=(1, 1)))
    assert isinstance(scores, da.Array) and scores.dtype == np.float64 and scores.compute().shape == (0, 3)


# --------------------------------------------------------------------------------------
# Wanda's norms and groups
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "norms, kwargs, error, message",
    [
        (np.array([-1.0, 1.0]), {}, ValueError, "non-negative and not NaN: 1 of 2 are not"),
        (np.array([np.nan, np.nan]), {}, ValueError, "non-negative and not NaN: 2 of 2 are not"),
        (np.array([-3, 1]), {}, ValueError, "non-negative and not NaN: 1 of 2 are not"),
        (None, {}, TypeError, "input_norms must be an array of norms, got NoneType"),
        ("ab", {}, TypeError, "input_norms must be an array of norms, got str"),
        (["a", "b"], {}, TypeError, "input_norms must hold real numbers, got dtype <U1"),
        (np.array([True, False]), {}, TypeError, "input_norms must hold real numbers, got dtype bool"),
        (np.ones(2), {"groups": 0}, ValueError, "groups must be a positive int, got 0"),
        (np.ones(2), {"groups": -2}, ValueError, "groups must be a positive int, got -2"),
        (np.ones(2), {"groups": 1.0}, TypeError, "groups must be an int, got float"),
        (np.ones(2), {"groups": True}, TypeError, "groups must be an int, got bool"),
    ],
)
def test_wanda_scores_refuses_bad_norms(norms, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ap.wanda_scores(np.ones((2, 2)), norms, 1, **kwargs)


def test_wanda_scores_refuses_nan_norms_on_every_backend(backend):
    w = backend.asarray(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="non-negative and not NaN: 1 of 3 are not"):
        ap.wanda_scores(w, backend.asarray(np.array([1.0, np.nan, 2.0], np.float32)), 1)
    # A plain list of numbers is still fine, and so are zero norms.
    np.testing.assert_array_equal(to_numpy(ap.wanda_scores(w, [0, 1, 2], 1)), [[0, 1, 2], [0, 1, 2]])


# --------------------------------------------------------------------------------------
# Dask arrays of unknown chunk sizes
# --------------------------------------------------------------------------------------

UNKNOWN = "unknown chunk sizes; call `.compute_chunk_sizes()` on the Dask array first"


def test_unknown_chunk_sizes_are_named_by_every_entry_point():
    da = pytest.importorskip("dask.array")
    x0 = da.from_array(np.arange(1, 13.0).reshape(3, 4), chunks=2)
    x = x0[x0 > 3]  # shape (nan,)
    x2 = da.stack([x, x])  # shape (2, nan)
    calls = [
        lambda: ap.l1_unstructured(x, 0.5),
        lambda: ap.random_unstructured(x, 0.5, seed=0),
        lambda: ap.ln_structured(x2, 0.5, 2, dim=0),
        lambda: ap.random_structured(x2, 0.5, dim=1, seed=0),
        lambda: ap.nm_structured(x),
        lambda: ap.block_unstructured(x, 0.5, (2,)),
        lambda: ap.wanda(x2, 0.5),
        lambda: ap.wanda_scores(x0, x, 1),
        lambda: ap.global_unstructured([x0, x], ap.L1Unstructured, amount=0.5),
        lambda: ap.global_unstructured([x], ap.L1Unstructured, amount=0.5, normalization="lamp"),
        lambda: ap.lamp_scores(x),
        lambda: ap.kth_smallest(x, 1),
        lambda: ap.prune_to_sparsity(x, 0.5),
        lambda: ap.identity(x),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        shape = "(2, nan)" if "x2" in call.__code__.co_freevars else "(nan,)"
        assert str(info.value) == f"cannot prune an array of shape {shape}: {UNKNOWN}"


# --------------------------------------------------------------------------------------
# CSR off the default device
# --------------------------------------------------------------------------------------


def test_to_csr_is_host_only_and_says_so_on_another_device():
    xps = pytest.importorskip("array_api_strict")
    pytest.importorskip("scipy.sparse")
    w = np.array([[1.0, 0.0, -2.0], [0.0, 0.0, 3.0]], np.float32)
    on_device1 = xps.asarray(w, device=xps.Device("device1"))
    with pytest.raises(TypeError) as info:
        ap.to_csr(on_device1)
    assert str(info.value) == (
        "to_csr builds a SciPy CSR array in host memory: move the array from device "
        "array_api_strict.Device('device1') to the CPU first"
    )
    # On the CPU device, the same data makes the CSR arrays of SciPy.
    csr = ap.to_csr(xps.asarray(w))
    assert csr.indptr.tolist() == [0, 2, 3] and csr.indices.tolist() == [0, 2, 2]
    assert csr.data.tolist() == [1.0, -2.0, 3.0]
    # The byte counts need no host: they work on device1 too.
    assert ap.sparse_nbytes(on_device1) == {"dense": 24, "csr": 3 * 8 + 3 * 4, "bitmask": 3 * 4 + 1}
