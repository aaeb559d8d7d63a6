"""Dask arrays: lazy masks, built per block in a bounded number of graph executions.

Every mask is compared with the in-memory (NumPy) mask of the same data, bit for bit:
same ranking (magnitude ascending, NaN above +inf, ties by array then flat C-order
position), on chunkings whose blocks interleave in flat order (2-D blocks side by side),
with ties straddling blocks and arrays. Most tests set ``lazy.IN_MEMORY_SIZE`` to 0 so
that tiny arrays take the chunked path; the in-memory route of small inputs is tested
on its own.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
from dask.callbacks import Callback  # noqa: E402
from test_selection import make_data  # noqa: E402

import arrayprune as ap  # noqa: E402
from arrayprune import _blocks  # noqa: E402
from arrayprune.schedules import units_to_prune  # noqa: E402
from arrayprune.selection import lazy  # noqa: E402
from conftest import reference_keep  # noqa: E402

KINDS = ["gauss", "half_zeros", "all_equal", "integers", "nan_inf"]
#: (shape, chunks): 1-D and 2-D, uneven, blocks side by side, one entry per block.
CHUNKINGS = [
    ((60,), (7,)),
    ((60,), ((1,) * 60,)),
    ((6, 10), (4, 3)),
    ((6, 10), ((1, 5), (2, 5, 3))),
    ((6, 10), (6, 1)),
    ((6, 10), (1, 1)),
    ((3, 4, 5), (2, 3, 2)),
]


class Executions(Callback):
    """Counts graph executions: one per ``compute`` (of any number of collections)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _start(self, dsk):
        self.count += 1


@pytest.fixture
def chunked(monkeypatch):
    """Send every Dask input down the chunked path, however small, in slices of 7 entries."""
    monkeypatch.setattr(lazy, "IN_MEMORY_SIZE", 0)
    monkeypatch.setattr(lazy, "_SLICE", 7)


def _lazy(a, chunks):
    return da.from_array(a, chunks=chunks)


def _equal(got, want):
    got = dask.compute(*got) if isinstance(got, list) else got.compute()
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, list) else [want], strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


# --------------------------------------------------------------------------------------
# Where blocks lie in flat order
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, chunks", [*CHUNKINGS, ((), ()), ((4, 1, 3), ((4,), (1,), (1, 2)))])
def test_runs_cover_each_block_in_flat_order(shape, chunks):
    flat = np.arange(int(np.prod(shape))).reshape(shape)
    normal = da.from_array(flat, chunks=chunks).chunks
    for index in itertools.product(*(range(len(c)) for c in normal)):
        location = _blocks.block_location(normal, index)
        block = flat[tuple(slice(lo, hi) for lo, hi in location)].reshape(-1)
        starts, length = _blocks.run_starts(shape, location)
        runs = [np.arange(s, s + length) for s in starts]
        np.testing.assert_array_equal(np.concatenate(runs) if runs else [], block)


# --------------------------------------------------------------------------------------
# Masks equal NumPy's
# --------------------------------------------------------------------------------------


def _check_l1(x, chunks):
    dx = _lazy(x, chunks)
    for amount in (1, 0.3, 0.97, x.size):
        mask = ap.l1_unstructured(dx, amount)
        assert isinstance(mask, da.Array) and mask.chunks == dx.chunks
        _equal(mask, ap.l1_unstructured(x, amount))


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape, chunks", CHUNKINGS)
def test_l1_equals_numpy(kind, shape, chunks):
    _check_l1(make_data(kind, int(np.prod(shape)), seed=4).astype(np.float32).reshape(shape), chunks)


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape, chunks", [CHUNKINGS[0], CHUNKINGS[3]])
def test_l1_equals_numpy_other_widths(kind, dtype, shape, chunks):
    _check_l1(make_data(kind, int(np.prod(shape)), seed=4).astype(dtype).reshape(shape), chunks)


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("kind", KINDS)
def test_global_ties_straddle_blocks_and_arrays(kind):
    data = make_data(kind, 200, seed=5).astype(np.float32)
    arrays = [data[:84].reshape(7, 12), data[84:85], data[85:].reshape(5, 23)]
    chunked = [_lazy(arrays[0], (3, 5)), _lazy(arrays[1], 1), _lazy(arrays[2], (2, 4))]
    for k in (1, 37, 100, 163, 200):
        got = ap.global_unstructured(chunked, ap.L1Unstructured, amount=k)
        _equal(got, reference_keep(arrays, k))
        _equal(got, ap.global_unstructured(arrays, ap.L1Unstructured, amount=k))


@pytest.mark.usefixtures("chunked")
def test_ties_resolved_in_flat_order_not_block_order():
    """Equal values in blocks side by side: flat order takes row 0 of both blocks first."""
    x = np.ones((4, 6), dtype=np.float32)
    dx = _lazy(x, (4, 3))  # block (0, 1) holds columns 3..5 of every row
    for k in range(x.size + 1):
        _equal(ap.l1_unstructured(dx, k), ap.l1_unstructured(x, k))


@pytest.mark.usefixtures("chunked")
def test_mixed_dtypes_and_integer_scores():
    rng = np.random.default_rng(6)
    half = np.round(rng.standard_normal((8, 9)), 1).astype(np.float16)
    single = np.round(rng.standard_normal(50), 1).astype(np.float32)
    ints = rng.integers(-3, 4, (5, 5))
    arrays = [half, single, ints]
    chunked = [_lazy(half, (3, 4)), _lazy(single, 7), _lazy(ints, 2)]
    for amount in (0.2, 0.6):
        _equal(
            ap.global_unstructured(chunked, ap.L1Unstructured, amount=amount),
            ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount),
        )


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("mask_dtype", ["bool", "float32"])
def test_eligibility_and_iterative_pruning(mask_dtype):
    rng = np.random.default_rng(7)
    x = np.round(rng.standard_normal((9, 14)), 1).astype(np.float32)
    y = make_data("half_zeros", 40, seed=2).astype(np.float32)
    first = [(rng.random(x.shape) < 0.7).astype(mask_dtype), None]
    lazy_first = [_lazy(first[0], (4, 5)), None]
    lx, ly = _lazy(x, (2, 5)), _lazy(y, 9)
    for amount in (0.25, 0.5, 17):
        got = ap.global_unstructured([lx, ly], ap.L1Unstructured, amount=amount, default_masks=lazy_first)
        _equal(got, ap.global_unstructured([x, y], ap.L1Unstructured, amount=amount, default_masks=first))
        got = ap.l1_unstructured(lx, amount, default_mask=lazy_first[0])
        _equal(got, ap.l1_unstructured(x, amount, default_mask=first[0]))
    # A NumPy mask with a Dask array: rechunked like it.
    _equal(ap.l1_unstructured(lx, 0.5, default_mask=first[0]), ap.l1_unstructured(x, 0.5, default_mask=first[0]))
    container = ap.PruningContainer(ap.L1Unstructured(0.3), ap.L1Unstructured(0.4))
    _equal(container.compute_mask(lx, lazy_first[0]), container.compute_mask(x, first[0]))
    with pytest.raises(ValueError):
        dask.compute(*ap.global_unstructured([lx, ly], ap.L1Unstructured, amount=10**6, default_masks=lazy_first))


@pytest.mark.usefixtures("chunked")
def test_prune_to_sparsity_and_kth_smallest():
    x = make_data("nan_inf", 300, seed=8).astype(np.float32).reshape(15, 20)
    x[2:5] = -0.0
    dx = _lazy(x, (4, 6))
    mask = ap.l1_unstructured(x, 0.2)
    _equal(ap.prune_to_sparsity(dx, 0.5), ap.prune_to_sparsity(x, 0.5))
    _equal(ap.prune_to_sparsity(dx, 0.5, default_mask=_lazy(mask, 7)), ap.prune_to_sparsity(x, 0.5, default_mask=mask))
    for k in (1, 40, 150, 270, 300):
        got = ap.kth_smallest(dx, k)
        assert isinstance(got, da.Array) and got.dtype == x.dtype
        np.testing.assert_array_equal(got.compute(), ap.kth_smallest(x, k))
    ints = np.random.default_rng(1).integers(-50, 50, (10, 10)).astype(np.int16)
    np.testing.assert_array_equal(ap.kth_smallest(_lazy(ints, 3), 33).compute(), np.sort(ints, axis=None)[32])
    with pytest.raises(ValueError, match="out of range"):
        ap.kth_smallest(dx, 301)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        ap.smallest_magnitude_keep([dx[dx > 0]], 3)


@pytest.mark.usefixtures("chunked")
def test_bounds_and_lamp_give_numpy_masks():
    """Per-array sparsity bounds and LAMP stay eager, but are exact and never crash."""
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal(10).astype(np.float32)]
    chunked = [_lazy(arrays[0], (4, 3)), _lazy(arrays[1], 3)]
    for options in ({"min_sparsity": 0.2}, {"max_sparsity": [0.9, 0.1]}, {"normalization": "lamp"}):
        _equal(
            ap.global_unstructured(chunked, ap.L1Unstructured, amount=0.5, **options),
            ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, **options),
        )


def test_small_inputs_are_selected_in_memory_once():
    x = make_data("integers", 120, seed=3).astype(np.float32).reshape(10, 12)
    dx = _lazy(x, (3, 5))
    with Executions() as runs:
        mask = ap.l1_unstructured(dx, 0.4, default_mask=_lazy(x != 0, (3, 5)))
        assert runs.count == 1
    assert isinstance(mask, da.Array) and mask.chunks == dx.chunks
    _equal(mask, ap.l1_unstructured(x, 0.4, default_mask=x != 0))
    _equal(ap.ln_structured(dx, 0.5, n=2, dim=0), ap.ln_structured(x, 0.5, n=2, dim=0))
    _equal(ap.random_structured(dx, 0.5, dim=1, seed=4), ap.random_structured(x, 0.5, dim=1, seed=4))
    _equal(ap.nm_structured(dx[:, :8], n=2, m=4), ap.nm_structured(x[:, :8], n=2, m=4))
    np.testing.assert_array_equal(ap.kth_smallest(dx, 7).compute(), ap.kth_smallest(x, 7))


# --------------------------------------------------------------------------------------
# Random scores: NumPy's stream, drawn per block
# --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("shape, chunks", CHUNKINGS)
def test_random_equals_numpy_for_a_seed(shape, chunks):
    x = np.zeros(shape, dtype=np.float32)
    dx = _lazy(x, chunks)
    for seed in (0, 11):
        _equal(ap.random_unstructured(dx, 0.4, seed=seed), ap.random_unstructured(x, 0.4, seed=seed))
    arrays = [x, np.zeros(7, np.float32), x]
    chunked = [dx, _lazy(arrays[1], 2), dx]
    _equal(
        ap.global_unstructured(chunked, ap.RandomUnstructured, amount=0.5, seed=3),
        ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=3),
    )


@pytest.mark.usefixtures("chunked")
def test_random_from_a_generator_advances_it_as_numpy_does():
    x = np.zeros((5, 7), dtype=np.float32)
    dx = _lazy(x, (2, 3))
    for bit_generator in (np.random.PCG64, np.random.MT19937):  # MT19937 cannot jump: drawn eagerly
        mine, theirs = np.random.Generator(bit_generator(4)), np.random.Generator(bit_generator(4))
        mine.random(3, dtype=np.float32), theirs.random(3, dtype=np.float32)  # half a 64-bit word left
        for _ in range(2):
            _equal(ap.random_unstructured(dx, 0.5, generator=mine), ap.random_unstructured(x, 0.5, generator=theirs))
        assert mine.random() == theirs.random()


@pytest.mark.usefixtures("chunked")
def test_random_scores_are_lazy_and_repeatable():
    dx = _lazy(np.zeros((40, 30), np.float32), (16, 7))
    with Executions() as runs:
        mask = ap.random_unstructured(dx, 0.5, seed=1)
        built = runs.count
        first, again = mask.compute(), mask.compute()
    assert built <= 3 and runs.count == built + 2
    np.testing.assert_array_equal(first, again)
    assert int((~first).sum()) == 600


# --------------------------------------------------------------------------------------
# Graph executions, and the large arrays that used to crash
# --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("chunked")
@pytest.mark.parametrize("dtype, most", [("float16", 3), ("float32", 4), ("float64", 6)])
@pytest.mark.parametrize("with_masks", [False, True])
def test_global_l1_executions_are_bounded(dtype, most, with_masks):
    rng = np.random.default_rng(10)
    # Integer values: keys equal to the cut straddle it, so the tie pass runs (the worst case).
    arrays = [rng.integers(-9, 10, s).astype(dtype) for s in [(30, 40), (500,), (8, 9, 10)]]
    chunked = [_lazy(arrays[0], (7, 11)), _lazy(arrays[1], 64), _lazy(arrays[2], (3, 4, 5))]
    masks = [rng.random(a.shape) < 0.8 for a in arrays] if with_masks else None
    lazy_masks = [_lazy(m, c.chunks) for m, c in zip(masks, chunked, strict=True)] if with_masks else None
    want = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.45, default_masks=masks)
    with Executions() as runs:
        got = ap.global_unstructured(chunked, ap.L1Unstructured, amount=0.45, default_masks=lazy_masks)
        assert all(isinstance(m, da.Array) for m in got)
        computed = dask.compute(*got)
    assert runs.count == most <= 6
    for g, w in zip(computed, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_above_2_to_the_22_entries():
    """The sizes that crashed (a boolean index of unknown length): now lazy and exact."""
    n = (1 << 22) + 4099
    rng = np.random.default_rng(12)
    x = np.round(rng.standard_normal(n), 3).astype(np.float32)  # heavy ties
    y = rng.standard_normal((64, 100)).astype(np.float32)
    dx, dy = _lazy(x, 1 << 20), _lazy(y, (20, 30))
    with Executions() as runs:
        got = ap.global_unstructured([dx, dy], ap.L1Unstructured, amount=0.6)
        computed = dask.compute(*got)
    assert runs.count <= 4
    for g, w in zip(computed, ap.global_unstructured([x, y], ap.L1Unstructured, amount=0.6), strict=True):
        np.testing.assert_array_equal(g, w)
    first = computed[0]
    again = ap.l1_unstructured(dx, 0.5, default_mask=_lazy(first, 1 << 21))
    _equal(again, ap.l1_unstructured(x, 0.5, default_mask=first))
    _equal(ap.random_unstructured(dx, 0.3, seed=2), ap.random_unstructured(x, 0.3, seed=2))


@pytest.mark.parametrize(
    "method, kwargs",
    [(ap.BlockUnstructured, {"block_shape": (2, 2)}), (ap.LnStructured, {"n": 2, "dim": 0}), (ap.L1Unstructured, {})],
    ids=["blocks", "channels", "entries"],
)
def test_unknown_chunk_sizes_say_compute_chunk_sizes(method, kwargs):
    """Rows kept by a boolean index have NaN chunk lengths: a clear error, and the advised fix works."""
    x = np.random.default_rng(3).standard_normal((20, 8)).astype(np.float32)
    dx = _lazy(x, (5, 4))
    rows = dx[dx[:, 0] > 0]
    assert np.isnan(rows.shape[0])
    message = r"cannot prune an array of shape \(nan, 8\): unknown chunk sizes; call `\.compute_chunk_sizes\(\)`"
    with pytest.raises(ValueError, match=message):
        ap.prune_to_sparsity(rows, 0.5, pruning_method=method, **kwargs)
    with pytest.raises(ValueError, match=message):
        units_to_prune(rows, 0.5, None, method, **kwargs)
    with pytest.raises(ValueError, match=message):
        method(0, **kwargs).units(rows)
    rows.compute_chunk_sizes()
    _equal(
        ap.prune_to_sparsity(rows, 0.5, pruning_method=method, **kwargs),
        ap.prune_to_sparsity(x[x[:, 0] > 0], 0.5, pruning_method=method, **kwargs),
    )
