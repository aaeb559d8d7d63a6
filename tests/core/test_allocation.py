"""Per-layer sparsity from sensitivity curves and from OWL's outlier ratios (the core, hand-computed)."""

from __future__ import annotations

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.allocation import counts_near, predicted_error


def test_curves_fill_the_cheapest_segments_first():
    # layer 0 costs 0.1/50 = 0.002 per entry on both segments; layer 1 costs 0.02 then 0.06
    curves, sizes, sp = [[0.1, 0.2], [1.0, 4.0]], [100, 100], [0.5, 1.0]
    assert ap.allocate_from_curves(curves, sizes, 0.5, sparsities=sp) == [100, 0]
    # layer 0 is capped at 90 entries: layer 1 takes the other 60 (its first segment and 10 more)
    assert ap.allocate_from_curves(curves, sizes, 0.75, sparsities=sp, max_sparsity=0.9) == [90, 60]
    # a floor on every layer is taken first, the rest goes to the cheap layer
    assert ap.allocate_from_curves(curves, sizes, 0.5, sparsities=sp, min_sparsity=0.2) == [80, 20]
    # per-layer bounds, as sequences
    assert ap.allocate_from_curves(curves, sizes, 0.5, sparsities=sp, max_sparsity=[0.3, 1.0]) == [30, 70]
    # an integer amount is a count, as in PyTorch
    assert ap.allocate_from_curves(curves, sizes, 7, sparsities=sp) == [7, 0]


def test_exact_total_bounds_and_the_fragile_layer_gets_less():
    rng = np.random.default_rng(0)
    sp = [0.1, 0.3, 0.5, 0.7, 0.9]
    base = np.array([1e-5, 1e-4, 1e-3, 1e-2, 1e-1])
    curves = [base, base * 30, base * 0.5, base * 2]  # layer 1 is fragile
    sizes = [1000, 1000, 3001, 517]
    for amount in (0.3, 0.55, 0.8, 0.9):
        counts = ap.allocate_from_curves(curves, sizes, amount, sparsities=sp, min_sparsity=0.2, max_sparsity=0.95)
        assert sum(counts) == round(amount * sum(sizes))
        for k, n in zip(counts, sizes, strict=True):
            assert 0.2 * n - 1e-9 <= k <= 0.95 * n + 1e-9
        assert counts[1] / sizes[1] == min(k / n for k, n in zip(counts, sizes, strict=True))
        # the optimum beats uniform shares on the predicted error
        uniform = [round(amount * n) for n in sizes]
        assert predicted_error(curves, sp, sizes, counts) <= predicted_error(curves, sp, sizes, uniform) + 1e-12
    del rng


def test_steps_move_layers_in_whole_units():
    curves, sizes, sp = [[0.1, 0.2], [1.0, 4.0]], [100, 100], [0.5, 1.0]
    # 140 asked: the cheap layer 0 takes all 100 (steps of 10), layer 1 40 (two steps of 20)
    assert ap.allocate_from_curves(curves, sizes, 0.7, sparsities=sp, steps=[10, 20]) == [100, 40]
    # 130 asked: layer 1 takes one step of 20; the 10 left fit no step of it
    assert ap.allocate_from_curves(curves, sizes, 0.65, sparsities=sp, steps=[10, 20]) == [100, 20]


def test_allocation_errors():
    with pytest.raises(ValueError, match="between 0 and 100"):
        ap.allocate_from_curves([[0.1], [0.2]], [100, 100], 0.6, sparsities=[0.5], max_sparsity=0.5)
    with pytest.raises(ValueError, match="ascending"):
        ap.allocate_from_curves([[0.1, 0.2]], [100], 0.5, sparsities=[0.5, 0.4])
    with pytest.raises(ValueError, match="finite"):
        ap.allocate_from_curves([[0.1, float("nan")]], [100], 0.5, sparsities=[0.4, 0.5])
    with pytest.raises(ValueError, match="2 errors for 1"):
        ap.allocate_from_curves([[0.1, 0.2]], [100], 0.5, sparsities=[0.5])
    with pytest.raises(ValueError, match="min_sparsity 0.6 exceeds"):
        ap.allocate_from_curves([[0.1]], [100], 0.5, sparsities=[0.5], min_sparsity=0.6, max_sparsity=0.5)


def test_outlier_ratio_counts_scores_above_m_means():
    x = np.ones(100)
    x[:3] = 40.0  # mean (97 + 120) / 100 = 2.17; 5 means = 10.85: the three 40s are outliers
    assert ap.outlier_ratio(x) == pytest.approx(0.03)
    assert ap.outlier_ratio(x, m=20) == 0.0  # 20 means = 43.4
    assert ap.outlier_ratio(np.zeros((0, 3))) == 0.0


def test_owl_gives_the_outlier_rich_layer_less_within_lambda():
    many, few = np.ones((10, 10)), np.ones((10, 10))
    many[0, :4] = 100.0  # 4% outliers
    few[0, 0] = 100.0  # 1%
    # ratios scaled to [0, 0.16] -> [0.16, 0]; centred: [+0.08, -0.08]; sparsities 0.5 -/+ 0.08
    assert ap.owl_allocation([many, few], 0.5) == [42, 58]
    assert ap.owl_allocation([many, few], 0.5, lam=0.2) == [30, 70]
    # bounds clip, the total stays exact
    assert ap.owl_allocation([many, few], 0.5, lam=0.2, max_sparsity=0.6) == [40, 60]
    # layers of different sizes: shifted to the exact total, within [S - lam, S + lam]
    big = np.ones((30, 10))
    counts = ap.owl_allocation([many, big], 0.5)
    assert sum(counts) == 200 and counts[0] < 50 and 0.42 * 100 <= counts[0] and counts[1] <= 0.58 * 300


def test_counts_near_meets_the_total_with_steps():
    assert counts_near([0.5, 0.5], [100, 100], 0.5) == [50, 50]
    counts = counts_near([0.2, 0.9], [100, 300], 0.75)
    assert sum(counts) == 300 and counts[0] < counts[1] / 3
    assert sum(counts_near([0.5, 0.5], [100, 100], 0.5, steps=[10, 5])) == 100
