"""Calibrated scores of structured units and the refit of their consumer, against float64 NumPy.

References are written out here: scores by their formulas, the OBS score as the increase
of the damped squared error when a unit's columns go and the others are refit, and the
refit as NumPy's least-squares solution on the calibration inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.structured import (
    absorb,
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


# --------------------------------------------------------------------------------------
# The methods of the table: ``activation_structured`` and ``obs_structured``
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("compensate_", [True, False])
@pytest.mark.parametrize("name, units", [("activation_structured", 8), ("obs_structured", 2), ("obs_structured", 8)])
def test_prune_units_by_hand(backend, name, units, compensate_):
    import arrayprune as ap

    w, x = _problem(4)
    x[:, 5] *= 1e-3  # a quiet input: its column goes first by activation
    h = x.T @ x
    hd = h + 0.01 * np.mean(np.diagonal(h)) * np.eye(8)
    per = 8 // units
    if name == "activation_structured":
        col = np.linalg.norm(w, axis=0) * np.linalg.norm(x, axis=0)
        scores = np.sqrt((col**2).reshape(units, per).sum(1))
    else:
        scores = np.array([_refit_error(w, hd, np.arange(u * per, (u + 1) * per)) for u in range(units)])
    drop = round(0.5 * units)
    kept = np.sort(np.argsort(scores, kind="stable")[drop:])
    columns = (kept[:, None] * per + np.arange(per)).reshape(-1)
    want = np.zeros_like(w)
    refit = w @ hd[:, columns] @ np.linalg.inv(hd[np.ix_(columns, columns)])
    want[:, columns] = refit if compensate_ else w[:, columns]

    method = ap.METHODS[name](0.5, compensate=compensate_)
    assert isinstance(method, ap.UnitPruningMethod)
    choice = method.prune_units(backend.asarray(w), backend.asarray(h), units)
    np.testing.assert_allclose(backend.to_numpy(choice.scores), scores, rtol=1e-9)
    np.testing.assert_array_equal(backend.to_numpy(choice.kept), kept)
    np.testing.assert_array_equal(backend.to_numpy(choice.columns), columns)
    np.testing.assert_allclose(backend.to_numpy(choice.weight), want, rtol=1e-8, atol=1e-12)
    if name == "activation_structured" and units == 8:
        assert 5 not in kept


def test_unit_methods_without_statistics_rank_by_l2_norm():
    import arrayprune as ap

    w = np.random.default_rng(2).standard_normal((6, 10)).astype(np.float32)
    for cls in (ap.ActivationStructured, ap.ObsStructured):
        for amount, dim in ((0.5, 0), (3, -1)):
            np.testing.assert_array_equal(cls(amount, dim).keep_mask(w), ap.ln_structured(w, amount, 2, dim))


def test_unit_methods_check_their_arguments():
    import arrayprune as ap

    with pytest.raises(TypeError, match="compensate must be True or False"):
        ap.ObsStructured(0.5, compensate=1)
    with pytest.raises(ValueError, match="damp must be a number >= 0"):
        ap.ActivationStructured(0.5, damp=-1.0)
    with pytest.raises(ValueError):
        ap.ObsStructured(3).prune_units(np.ones((2, 4)), np.eye(4), 2)  # 3 of 2 units
    with pytest.raises(ValueError, match="do not split into 3 units"):
        ap.ActivationStructured(0.5).prune_units(np.ones((2, 8)), np.eye(8), 3)


def test_integer_hessians_are_damped_as_floats():
    """Counts (an integer ``X^T X``) give what the same Hessian in float64 gives."""
    x = np.arange(12).reshape(3, 4) % 5
    h = x.T @ x
    w = np.arange(8.0).reshape(2, 4) - 3
    for got, want in [
        (damped(h), damped(h.astype(np.float64))),
        (compensate(w, h, np.array([0, 2])), compensate(w, h.astype(np.float64), np.array([0, 2]))),
        (obs_unit_scores(w, h, 2), obs_unit_scores(w, h.astype(np.float64), 2)),
    ]:
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("damp", [0.0, 0.01])
def test_absorb_is_the_damped_least_squares_refit(damp):
    """``X W'^T`` fits ``X W^T + F``: with ``damp=0`` exactly the least-squares solution."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((60, 6)) @ rng.standard_normal((6, 6))
    w = rng.standard_normal((3, 6))
    f = rng.standard_normal((60, 3))
    h = x.T @ x
    copy = h.copy()
    got = absorb(w, h, x.T @ f, damp)
    hd = h + damp * np.mean(np.diag(h)) * np.eye(6)
    np.testing.assert_allclose(got, w + np.linalg.solve(hd, x.T @ f).T, rtol=1e-10)
    if damp == 0:
        np.testing.assert_allclose(x @ got.T, x @ w.T + x @ np.linalg.lstsq(x, f, rcond=None)[0], atol=1e-9)
    np.testing.assert_array_equal(h, copy)  # the caller's Hessian as it was
    absorb(w, h, x.T @ f, damp, overwrite_hessian=True)
    assert not np.array_equal(h, copy) or damp == 0  # damped in place
    with pytest.raises(ValueError, match="cross must be"):
        absorb(w, copy, f.T @ x, damp)
