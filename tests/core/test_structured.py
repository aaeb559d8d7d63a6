"""Calibrated scores of structured units and the refit of their consumer, against float64 NumPy.

References are written out here: scores by their formulas, the OBS score as the increase
of the damped squared error when a unit's columns go and the others are refit, and the
refit as NumPy's least-squares solution on the calibration inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.structured import (
    activation_unit_scores,
    compensate,
    damped,
    expert_scores,
    obs_unit_scores,
    residual_change,
)


def _problem(seed=0, out=5, k=8, n=40):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)) * rng.uniform(0.2, 3.0, size=k)  # columns of different scales
    w = rng.standard_normal((out, k))
    return w, x


def test_activation_scores_by_hand(backend):
    w, x = _problem()
    h = x.T @ x
    per_column = np.linalg.norm(w, axis=0) * np.linalg.norm(x, axis=0)
    got = backend.to_numpy(activation_unit_scores(backend.asarray(w), backend.asarray(np.diagonal(h).copy()), 8))
    np.testing.assert_allclose(got, per_column, rtol=1e-12)
    heads = backend.to_numpy(activation_unit_scores(backend.asarray(w), backend.asarray(np.diagonal(h).copy()), 2))
    np.testing.assert_allclose(heads, np.sqrt((per_column**2).reshape(2, 4).sum(1)), rtol=1e-12)


def _refit_error(w, hd, removed):
    """min over W' with W'[:, removed] = 0 of tr((W - W') Hd (W - W')^T), by NumPy's solve."""
    kept = np.setdiff1d(np.arange(w.shape[1]), removed)
    wk = w @ hd[:, kept] @ np.linalg.inv(hd[np.ix_(kept, kept)])
    full = np.zeros_like(w)
    full[:, kept] = wk
    d = w - full
    return np.trace(d @ hd @ d.T)


@pytest.mark.parametrize("units", [8, 2])
def test_obs_scores_are_the_refit_error(backend, units):
    w, x = _problem(1)
    h = x.T @ x
    hd = h + 0.01 * np.mean(np.diagonal(h)) * np.eye(8)
    per = 8 // units
    want = np.array([_refit_error(w, hd, np.arange(u * per, (u + 1) * per)) for u in range(units)])
    got = backend.to_numpy(obs_unit_scores(backend.asarray(w), backend.asarray(h), units))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    if units == 8:  # one column: ||W[:, j]||^2 / [Hd^-1]_jj
        np.testing.assert_allclose(got, (w**2).sum(0) / np.diagonal(np.linalg.inv(hd)), rtol=1e-10)


def test_compensation_is_the_least_squares_refit(backend):
    w, x = _problem(2)
    kept = np.array([0, 2, 3, 6, 7])
    got = backend.to_numpy(compensate(backend.asarray(w), backend.asarray(x.T @ x), backend.asarray(kept), damp=0.0))
    want = np.linalg.lstsq(x[:, kept], x @ w.T, rcond=None)[0].T  # X_K W'^T ~ X W^T
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
    # the layer's outputs on the calibration inputs: no other W'_K does better
    err = np.linalg.norm(x @ w.T - x[:, kept] @ got.T)
    assert err < np.linalg.norm(x @ w.T - x[:, kept] @ w[:, kept].T)
    damped_got = backend.to_numpy(compensate(backend.asarray(w), backend.asarray(x.T @ x), backend.asarray(kept)))
    hd = x.T @ x + 0.01 * np.mean(np.sum(x * x, 0)) * np.eye(8)
    np.testing.assert_allclose(damped_got, w @ hd[:, kept] @ np.linalg.inv(hd[np.ix_(kept, kept)]), rtol=1e-9)


def test_damped_and_errors():
    h = np.diag([2.0, 4.0])
    np.testing.assert_allclose(damped(h, 0.5), np.diag([3.5, 5.5]))
    np.testing.assert_allclose(damped(np.zeros((2, 2))), 0.01 * np.eye(2))  # a zero Hessian still inverts
    with pytest.raises(ValueError, match="do not split into 3 units"):
        activation_unit_scores(np.ones((2, 8)), np.ones(8), 3)
    with pytest.raises(ValueError, match="2 input columns, the statistics 3"):
        obs_unit_scores(np.ones((2, 2)), np.eye(3), 2)
    with pytest.raises(ValueError, match="must be square"):
        damped(np.ones((2, 3)))


def test_expert_scores_and_residual_change(backend):
    counts, sums = backend.asarray(np.array([3, 0, 5])), backend.asarray(np.array([1.5, 0.0, 1.0]))
    got = backend.to_numpy(expert_scores(counts, sums, 4))
    np.testing.assert_allclose(got, [1.5 / 4 + 3e-9 / 4, 0.0, 0.25 + 5e-9 / 4])
    a = np.array([[[1.0, 0.0], [1.0, 1.0]]])
    b = np.array([[[0.0, 2.0], [2.0, 2.0]]])
    total, n = residual_change(backend.asarray(a), backend.asarray(b))
    assert float(backend.to_numpy(total)) == pytest.approx(1.0) and float(backend.to_numpy(n)) == 2
    total, n = residual_change(backend.asarray(a), backend.asarray(b), backend.asarray(np.array([[1.0, 0.0]])))
    assert float(backend.to_numpy(total)) == pytest.approx(1.0) and float(backend.to_numpy(n)) == 1
