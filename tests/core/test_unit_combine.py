"""``UnitPruningMethod.combine_scores``: one score per unit from several consumers' scores.

OBS scores are increases of squared output errors (they add); activation-aware scores are
roots of sums of squares (combined as one). Checked by hand against NumPy on every backend.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.structured_methods import ActivationStructured, ObsStructured, UnitPruningMethod

A = np.array([3.0, 0.0, 1.0, 2.0])
B = np.array([4.0, 1.0, 0.0, 2.0])
C = np.array([0.0, 2.0, 2.0, 1.0])


@pytest.mark.parametrize(
    ("method", "want"),
    [
        (ObsStructured(0.5), A + B + C),
        (ActivationStructured(0.5), np.sqrt(A**2 + B**2 + C**2)),
        (UnitPruningMethod(0.5), A + B + C),  # the base: scores add
    ],
)
def test_combine_by_hand(backend, method, want):
    got = method.combine_scores([backend.asarray(A), backend.asarray(B), backend.asarray(C)])
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-15)
    # one consumer: its own scores (activation scores are non-negative norms)
    np.testing.assert_allclose(backend.to_numpy(method.combine_scores([backend.asarray(A)])), A, rtol=1e-15)


@pytest.mark.parametrize("method", [ObsStructured(0.5), ActivationStructured(0.5)])
def test_combine_refuses_nothing_and_mixed_shapes(method):
    with pytest.raises(ValueError, match="no unit scores to combine"):
        method.combine_scores([])
    with pytest.raises(ValueError, match=r"differ in shape: \(4,\) and \(3,\)"):
        method.combine_scores([A, A[:3]])


@pytest.mark.parametrize("compensate", [True, False])
def test_refit_units_is_the_weight_prune_units_gives_for_those_units(compensate):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 8))
    x = rng.standard_normal((40, 8))
    h = x.T @ x
    method = ObsStructured(0.5, compensate=compensate)
    choice = method.prune_units(w, h, 4)  # units of 2 columns
    got = method.refit_units(w, h, choice.kept, 4)
    np.testing.assert_array_equal(got, choice.weight)
    dropped = sorted(set(range(4)) - set(choice.kept.tolist()))
    for u in dropped:
        assert not got[:, 2 * u : 2 * u + 2].any()
    if not compensate:
        kept_cols = [c for u in choice.kept.tolist() for c in (2 * u, 2 * u + 1)]
        np.testing.assert_array_equal(got[:, kept_cols], w[:, kept_cols])
