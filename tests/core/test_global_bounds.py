"""Global pruning with per-array sparsity bounds and LAMP scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayprune as ap
from conftest import available_backends, to_numpy


def _arrays(seed, sizes, scales):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * s).astype(np.float32) for n, s in zip(sizes, scales, strict=True)]


def _is_prefix_of_own_order(a, keep):
    order = np.argsort(np.abs(a), kind="stable")
    dropped = ~keep[order]
    k = int(dropped.sum())
    return dropped[:k].all() and not dropped[k:].any()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 200), min_size=1, max_size=5),
    amount=st.floats(0, 1),
    low=st.floats(0, 0.5),
    high=st.floats(0.5, 1),
)
def test_bounds_hold_and_total_is_exact(seed, sizes, amount, low, high):
    arrays = _arrays(seed, sizes, [10.0 ** (i % 3 - 1) for i in range(len(sizes))])
    total = sum(sizes)
    k = round(amount * total)
    lo = [math.ceil(low * n - 1e-9) for n in sizes]
    hi = [math.floor(high * n + 1e-9) for n in sizes]
    if any(a > b for a, b in zip(lo, hi, strict=True)) or not sum(lo) <= k <= sum(hi):
        with pytest.raises(ValueError):
            ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount, min_sparsity=low, max_sparsity=high)
        return
    masks = ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount, min_sparsity=low, max_sparsity=high)
    assert sum(int((~m).sum()) for m in masks) == k
    for a, m, l_, h_ in zip(arrays, masks, lo, hi, strict=True):
        assert l_ <= int((~m).sum()) <= h_
        assert _is_prefix_of_own_order(a, m)


@pytest.mark.slow
def test_bounds_protect_a_small_layer_and_match_across_backends():
    arrays = _arrays(0, [400, 30, 600], [1.0, 0.01, 1.0])
    plain = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5)
    assert not plain[1].any()  # the small layer is wiped out without bounds
    expected = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, max_sparsity=[1, 0.6, 1])
    assert int((~expected[1]).sum()) == 18
    assert sum(int((~m).sum()) for m in expected) == 515
    for b in available_backends():
        got = ap.global_unstructured(
            [b.asarray(a) for a in arrays], ap.L1Unstructured, amount=0.5, max_sparsity=[1, 0.6, 1]
        )
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(to_numpy(g), e, err_msg=b.name)


def test_bounds_by_mapping_and_with_earlier_masks():
    arrays = dict(zip("abc", _arrays(1, [100, 100, 100], [1.0, 0.1, 1.0]), strict=True))
    first = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.3)
    second = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, default_masks=first, max_sparsity={"b": 0.7})
    for key in "abc":
        assert not (second[key] & ~first[key]).any()
    assert int((~second["b"]).sum()) <= 70
    remaining = sum(int(m.sum()) for m in first.values())
    assert sum(int((~m).sum()) for m in second.values()) == sum(int((~m).sum()) for m in first.values()) + round(
        0.5 * remaining
    )


def test_lamp_scores_hand_computed():
    np.testing.assert_allclose(ap.lamp_scores(np.array([1.0, -2.0, 2.0, 3.0])), [1 / 18, 4 / 17, 4 / 13, 1.0])


def test_sorted_lamp_scores_are_lamp_scores_sorted_bit_for_bit(backend):
    from arrayprune.global_pruning import sorted_lamp_scores

    rng = np.random.default_rng(5)
    a = (rng.integers(-30, 31, (40, 25)) * 0.37 + rng.standard_normal((40, 25)) * (rng.random((40, 25)) < 0.5))
    x = backend.asarray(a.astype(np.float32))
    want = np.sort(to_numpy(ap.lamp_scores(x)).reshape(-1))
    got = to_numpy(sorted_lamp_scores(x))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert sorted_lamp_scores(backend.asarray(np.zeros((0, 3), np.float32))).shape == (0,)


def test_lamp_global_is_exact_and_protects_small_layers(backend):
    arrays = _arrays(2, [500, 40, 800], [1.0, 0.01, 0.5])
    masks = ap.global_unstructured(
        [backend.asarray(a) for a in arrays], ap.L1Unstructured, amount=0.6, normalization="lamp"
    )
    masks = [to_numpy(m) for m in masks]
    assert sum(int((~m).sum()) for m in masks) == round(0.6 * 1340)
    assert masks[1].any()  # LAMP keeps the largest entry of every layer (score 1)
    for a, m in zip(arrays, masks, strict=True):
        assert _is_prefix_of_own_order(a, m)
        assert m[np.argmax(np.abs(a))]


def test_bad_bounds_and_normalization():
    arrays = _arrays(3, [10, 10], [1, 1])
    with pytest.raises(ValueError):
        ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, normalization="l2")
    with pytest.raises(ValueError):
        ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, normalization="lamp")
    with pytest.raises(ValueError):
        ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, min_sparsity=1.5)
    with pytest.raises(ValueError):
        ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5, min_sparsity=0.6, max_sparsity=0.4)
    with pytest.raises(ValueError):
        ap.lamp_scores(np.array([1.0, np.nan]))
