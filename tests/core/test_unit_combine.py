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


def _consumers(seed=0):
    """Two consumers: "a" reads groups 0 (3 channels) and 1 (2) side by side, "b" reads group 0 at offset 1."""
    rng = np.random.default_rng(seed)
    w = {"a": rng.standard_normal((4, 5)), "b": rng.standard_normal((3, 4))}
    h = {}
    for k, m in w.items():
        x = rng.standard_normal((40, m.shape[1]))
        h[k] = x.T @ x
    reads = [[("a", 0), ("b", 1)], [("a", 3)], []]
    return w, h, reads


@pytest.mark.parametrize("method", [ObsStructured(0.5), ActivationStructured(0.5)])
def test_group_scores_take_each_consumer_once_and_combine(method):
    w, h, reads = _consumers()
    got = method.group_scores(reads, [3, 2, 4], w.__getitem__, h, {"a": 1, "b": 1})
    a, b = (np.asarray(method.unit_scores(w[k], h[k], w[k].shape[1])) for k in ("a", "b"))
    np.testing.assert_allclose(got[0], np.asarray(method.combine_scores([a[0:3], b[1:4]])), rtol=1e-14)
    np.testing.assert_allclose(got[1], a[3:5], rtol=1e-14)
    assert got[2] is None  # a group no consumer reads


def test_refit_consumers_cut_every_group_a_consumer_reads():
    method = ObsStructured(0.5)
    w, h, reads = _consumers(1)
    got = method.refit_consumers([[0, 2], [1], []], reads, [3, 2, 4], w.__getitem__, h, {"a": 1, "b": 1})
    # "a" keeps channels 0, 2 of group 0 and channel 1 of group 1 (its column 4); "b" columns 1 and 3
    np.testing.assert_allclose(got["a"], method.refit_units(w["a"], h["a"], np.array([0, 2, 4]), 5), rtol=1e-12)
    np.testing.assert_allclose(got["b"], method.refit_units(w["b"], h["b"], np.array([0, 1, 3]), 4), rtol=1e-12)
    assert np.all(got["a"][:, [1, 3]] == 0) and np.all(got["b"][:, 2] == 0)
    assert method.refit_consumers([[0, 1, 2], [0, 1], []], reads, [3, 2, 4], w.__getitem__, h, {"a": 1, "b": 1}) == {}
