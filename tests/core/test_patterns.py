"""N:M and block pruning: exact patterns, containers, backends."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayprune as ap
from conftest import available_backends, to_numpy


def _reference_nm(x: np.ndarray, n: int, m: int, dim: int, default: np.ndarray | None = None) -> np.ndarray:
    """Keep mask by brute force: per group, stable order of (already pruned first, |x|)."""
    xm = np.moveaxis(np.abs(x).astype(np.float64), dim, -1)
    dm = np.ones(xm.shape, bool) if default is None else np.moveaxis(default != 0, dim, -1)
    keep = dm.copy()
    flat_x, flat_d, flat_k = xm.reshape(-1, xm.shape[-1]), dm.reshape(-1, xm.shape[-1]), keep.reshape(-1, xm.shape[-1])
    for row in range(flat_x.shape[0]):
        for g in range(0, xm.shape[-1], m):
            vals, live = flat_x[row, g : g + m], flat_d[row, g : g + m]
            n_drop = n if vals.size == m else max(0, vals.size - (m - n))
            key = np.where(live, np.where(np.isnan(vals), np.inf, vals), -1.0)
            nan_rank = np.isnan(vals) & live
            order = np.lexsort((np.arange(vals.size), key, nan_rank))
            flat_k[row, g + order[:n_drop]] = False
    return np.moveaxis(keep, -1, dim)


def test_nm_hand_computed(backend):
    x = np.array([[0.4, -0.1, 0.3, 0.2, 5.0, 0.0, 0.0, -1.0]], dtype=np.float32)
    mask = ap.NMStructured(2, 4).compute_mask(backend.asarray(x), backend.asarray(np.ones(x.shape, bool)))
    np.testing.assert_array_equal(to_numpy(mask), [[True, False, True, False, True, False, False, True]])


def test_nm_ties_and_nan(backend):
    # Ties: earlier position pruned first; NaN above +inf.
    x = np.array([[1.0, 1.0, 1.0, 1.0, np.nan, np.inf, 2.0, 3.0]], dtype=np.float32)
    mask = ap.NMStructured(2, 4).compute_mask(backend.asarray(x), backend.asarray(np.ones(x.shape, bool)))
    np.testing.assert_array_equal(to_numpy(mask), [[False, False, True, True, True, True, False, False]])


def test_nm_trailing_group_keeps_at_most_m_minus_n(backend):
    x = np.arange(1, 8, dtype=np.float32).reshape(1, 7)  # groups [1..4], [5, 6, 7]
    mask = to_numpy(ap.NMStructured(2, 4).compute_mask(backend.asarray(x), backend.asarray(np.ones(x.shape, bool))))
    np.testing.assert_array_equal(mask, [[False, False, True, True, False, True, True]])
    assert ap.is_nm_sparse(backend.asarray(x * mask), 2, 4)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 13),
    nm=st.sampled_from([(1, 2), (2, 4), (1, 4), (3, 4), (4, 8), (0, 4), (4, 4)]),
    dim=st.sampled_from([0, 1, -1]),
    seed=st.integers(0, 2**16),
    prune_first=st.booleans(),
)
@pytest.mark.slow
def test_nm_matches_reference_on_every_backend(rows, cols, nm, dim, seed, prune_first):
    n, m = nm
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = 0.5  # ties
    default = (rng.random(x.shape) > 0.3) if prune_first else np.ones(x.shape, bool)
    expected = _reference_nm(x, n, m, dim, default)
    for b in available_backends():
        got = to_numpy(ap.NMStructured(n, m, dim).compute_mask(b.asarray(x), b.asarray(default)))
        np.testing.assert_array_equal(got, expected, err_msg=b.name)
        assert not (got & ~default).any()  # pruned stays pruned
        assert ap.is_nm_sparse(b.asarray(x * got), n, m, dim)


def test_nm_float_mask_and_container(backend):
    rng = np.random.default_rng(1)
    x = backend.asarray(rng.standard_normal((8, 16)).astype(np.float32))
    ones = backend.asarray(np.ones((8, 16), np.float32))
    c = ap.PruningContainer(ap.L1Unstructured(0.25))
    mask = c.compute_mask(x, ones)
    c.add_pruning_method(ap.NMStructured(2, 4))
    mask2 = c.compute_mask(x, mask)
    m1, m2 = to_numpy(mask), to_numpy(mask2)
    assert m2.dtype == np.float32
    assert not ((m2 != 0) & (m1 == 0)).any()
    assert ap.is_nm_sparse(backend.asarray(m2), 2, 4)
    c.add_pruning_method(ap.L1Unstructured(5))
    m3 = to_numpy(c.compute_mask(x, mask2))
    assert (m3 == 0).sum() == (m2 == 0).sum() + 5


def test_is_nm_sparse_detects_violations(backend):
    ok = np.array([[1, 0, 0, 2, 0, 3, 4, 0]], dtype=np.float32)
    bad = np.array([[1, 0, 5, 2, 0, 3, 4, 0]], dtype=np.float32)
    assert ap.is_nm_sparse(backend.asarray(ok), 2, 4)
    assert not ap.is_nm_sparse(backend.asarray(bad), 2, 4)
    assert ap.is_nm_sparse(backend.asarray(ok.T.copy()), 2, 4, dim=0)


@pytest.mark.parametrize(
    "args, error", [((3, 2), ValueError), ((-1, 4), ValueError), ((2.0, 4), TypeError), ((2, 0), ValueError)]
)
def test_nm_bad_arguments(args, error):
    with pytest.raises(error):
        ap.NMStructured(*args)


def _reference_blocks(x: np.ndarray, amount, block, n=1.0, default=None):
    block = (1,) * (x.ndim - len(block)) + tuple(block)
    grid = [math.ceil(d / b) for d, b in zip(x.shape, block, strict=True)]
    scores, live = [], []
    for idx in np.ndindex(*grid):
        sl = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block, strict=True))
        a = np.abs(x[sl]).astype(np.float64)
        scores.append(a.max() if n == math.inf else (np.mean(a**n)) ** (1 / n))
        live.append(True if default is None else bool((default[sl] != 0).any()))
    scores, live = np.array(scores), np.array(live)
    k = amount if isinstance(amount, int) else round(amount * live.sum())
    order = [i for i in np.argsort(scores, kind="stable") if live[i]][:k]
    keep = np.ones(x.shape, bool) if default is None else (default != 0).copy()
    for flat in order:
        idx = np.unravel_index(flat, grid)
        keep[tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block, strict=True))] = False
    return keep


@pytest.mark.parametrize(
    "shape, block", [((8, 12), (1, 4)), ((9, 10), (4, 4)), ((5, 7), (2, 3)), ((4, 3, 5, 5), (2, 2))]
)
@pytest.mark.parametrize("n", [1, 2, math.inf])
def test_blocks_match_reference(backend, shape, block, n):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    mask = ap.BlockUnstructured(0.4, block, n).compute_mask(backend.asarray(x), backend.asarray(np.ones(shape, bool)))
    np.testing.assert_array_equal(to_numpy(mask), _reference_blocks(x, 0.4, block, n))


def test_blocks_count_only_remaining(backend):
    x = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32)
    default = np.ones((8, 8), np.float32)
    default[:4, :4] = 0  # four 2x2 blocks already pruned
    mask = to_numpy(ap.BlockUnstructured(0.5, (2, 2)).compute_mask(backend.asarray(x), backend.asarray(default)))
    np.testing.assert_array_equal(mask != 0, _reference_blocks(x, 0.5, (2, 2), default=default))
    assert (mask[:4, :4] == 0).all()
    assert int((mask == 0).sum()) == 16 + 4 * 6  # round(0.5 * 12) more blocks


def test_blocks_errors():
    with pytest.raises(ValueError):
        ap.BlockUnstructured(0.5, (2, 2)).compute_mask(np.ones(4), np.ones(4, bool))
    with pytest.raises(ValueError):
        ap.BlockUnstructured(0.5, (0, 2))
    with pytest.raises(TypeError):
        ap.BlockUnstructured(0.5, (2.0, 2))
    with pytest.raises(ValueError):
        ap.BlockUnstructured(10, (2, 2)).compute_mask(np.ones((4, 4)), np.ones((4, 4), bool))
