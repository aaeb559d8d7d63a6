"""The upper Cholesky factor of an inverse Hessian (`arrayprune._factor`), on every backend.

Compared with the route it replaced, ``cholesky(inv(H))^T`` in float64 NumPy: the same
factor to rounding, exactly upper triangular, and ``U^T U H = I``, for sizes below, at
and above the size where the triangular inverse stops splitting.
"""

from __future__ import annotations

import array_api_compat.numpy as xp
import numpy as np
import pytest

from arrayprune import _factor
from conftest import to_numpy


def _hessian(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2 * n + 8, n)) @ rng.standard_normal((n, n))  # correlated inputs
    return x.T @ x / len(x) + 0.01 * np.eye(n)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 129, 200])
def test_factor_is_the_upper_cholesky_factor_of_the_inverse(backend, n):
    if not backend.has_dtype("float64"):
        pytest.skip("float64 is needed to compare to 1e-9")
    h = _hessian(n)
    got = to_numpy(_factor.upper_inverse_factor(backend.xp, backend.asarray(h)))
    expected = np.linalg.cholesky(np.linalg.inv(h)).T
    assert got.dtype == np.float64 and got.shape == (n, n)
    assert np.all(np.tril(got, -1) == 0) and np.all(np.diag(got) > 0)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    np.testing.assert_allclose(got.T @ got @ h, np.eye(n), atol=1e-8)


@pytest.mark.parametrize("n", [3, 100])
def test_a_matrix_that_is_not_positive_definite_is_refused(n):
    h = _hessian(n)
    h[n // 2, n // 2] = -1.0
    with pytest.raises(ValueError, match="not positive definite"):
        _factor.upper_inverse_factor(xp, h)


@pytest.mark.parametrize("n", [5, 90])
def test_a_singular_matrix_is_refused_though_its_cholesky_succeeds(backend, n):
    """Two equal inputs make ``X^T X`` singular; rounding leaves a tiny positive pivot."""
    if not backend.has_dtype("float64"):
        pytest.skip("the float64 case")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3 * n, n))
    x[:, n - 2] = x[:, 1]
    h = x.T @ x
    with pytest.raises(ValueError, match="not positive definite"):
        _factor.upper_inverse_factor(backend.xp, backend.asarray(h))


def test_a_damped_float32_hessian_with_outlier_inputs_is_factored():
    """Two equal inputs a thousand times the others (massive activations): damping leaves
    the second one's pivot about 2 * damp / n of its diagonal, 164 units of float32
    rounding at n = 2048. Positive definite, so factored, not refused (a bound of n units
    would refuse it)."""
    n = 2048
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2048, n)).astype(np.float32)
    x[:, 0] = x[:, 1] = 1000 * x[:, 1]
    h = x.T @ x
    h += np.float32(0.01) * np.mean(np.diag(h)) * np.eye(n, dtype=np.float32)
    u = _factor.upper_inverse_factor(xp, h)
    assert u.dtype == np.float32
    expected = np.linalg.cholesky(np.linalg.inv(h.astype(np.float64))).T
    np.testing.assert_allclose(u, expected, rtol=0, atol=1e-3 * np.abs(expected).max())


def test_the_split_inverse_equals_the_direct_one():
    """Splitting changes only the rounding: the 200 x 200 inverse by halves equals NumPy's."""
    r = np.linalg.cholesky(_hessian(200, seed=1)).T
    np.testing.assert_allclose(_factor._upper_triangular_inverse(xp, r), np.linalg.inv(r), rtol=1e-9, atol=1e-12)
