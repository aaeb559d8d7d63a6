"""SparseGPT (`arrayprune.sparsegpt`), its Hessian accumulator and im2col helper.

The yardstick is `reference_sparsegpt`, a float64 NumPy transcription of the paper's
algorithm written here with plain loops over columns: the inverse Hessian's upper
Cholesky factor comes by another route (Cholesky of H, triangular inverse, product,
Cholesky again), each column's error is applied by hand, and the mask of a block is a
stable argsort of its scores. Layers are fed correlated inputs (X = Z @ A), where
reconstruction matters.
"""

from __future__ import annotations

import doctest
import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayprune as ap
import arrayprune.reconstruction as reconstruction
from conftest import to_numpy


def reference_sparsegpt(w, h, counts=None, *, nm=None, block_size=128, damp=0.01, fraction=None):
    """SparseGPT on ``w [rows, K]`` in float64 with loops; returns ``(updated, keep)``.

    Unstructured: ``counts[b]`` entries of block ``b`` are pruned (or, with `fraction`,
    ``round(fraction * entries of the block)`` as in the paper), smallest
    ``w^2 / U_jj^2`` over the block first, ties by row-major position. N:M: each group
    of ``m`` columns, per row, the ``n`` smallest scores when the group is reached.
    """
    w = np.array(w, dtype=np.float64)
    h = np.array(h, dtype=np.float64)
    rows, k = w.shape
    diag = np.diag(h).copy()
    dead = np.flatnonzero(diag == 0)
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * diag.mean() * np.eye(k)
    chol = np.linalg.cholesky(h)
    chol_inv = np.linalg.inv(chol)
    u = np.linalg.cholesky(chol_inv.T @ chol_inv).T  # U^T U = H^-1
    keep = np.ones((rows, k), bool)
    for b, i1 in enumerate(range(0, k, block_size)):
        i2 = min(i1 + block_size, k)
        if nm is None:
            scores = w[:, i1:i2] ** 2 / np.diag(u)[i1:i2] ** 2
            count = round(fraction * scores.size) if fraction is not None else counts[b]
            block_keep = np.ones(scores.size, bool)
            block_keep[np.argsort(scores.reshape(-1), kind="stable")[:count]] = False
            keep[:, i1:i2] = block_keep.reshape(scores.shape)
        errors = np.zeros((rows, i2 - i1))
        for j in range(i1, i2):
            if nm is not None and (j - i1) % nm[1] == 0:
                n, m = nm
                stop = min(j + m, k)
                drop = n if stop - j == m else max(0, (stop - j) - (m - n))
                for r in range(rows):
                    s = w[r, j:stop] ** 2 / np.diag(u)[j:stop] ** 2
                    keep[r, j + np.argsort(s, kind="stable")[:drop]] = False
            for r in range(rows):
                q = w[r, j] if keep[r, j] else 0.0
                e = (w[r, j] - q) / u[j, j]
                for c in range(j, i2):
                    w[r, c] -= e * u[j, c]
                w[r, j] = q
                errors[r, j - i1] = e
        w[:, i2:] -= errors @ u[i1:i2, i2:]
    w[~keep] = 0.0
    return w, keep


def exact_block_counts(total, k, block_size):
    """Entries per block: differences of floor(total * column / k + 1/2), in exact arithmetic."""
    share = [math.floor(Fraction(total * c, k) + Fraction(1, 2)) for c in range(0, k + 1)]
    return [share[min(s + block_size, k)] - share[s] for s in range(0, k, block_size)]


def layer(rows=16, k=48, samples=400, seed=0, dead=()):
    """A weight [rows, k], correlated inputs X [samples, k] and H = X^T X / samples."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, k)) @ rng.standard_normal((k, k))
    x[:, list(dead)] = 0.0
    w = rng.standard_normal((rows, k))
    return w, x, x.T @ x / samples


def layer_error(x, w, new):
    return float(np.sum((x @ w.T - x @ new.T) ** 2))


@pytest.mark.parametrize("block_size", [128, 48, 16, 20, 7])
@pytest.mark.parametrize("amount", [0.5, 0.3, 100])
def test_unstructured_equals_reference(block_size, amount):
    w, x, h = layer()
    total = amount if isinstance(amount, int) else round(amount * w.size)
    new, keep = ap.sparsegpt(w, h, amount, block_size=block_size)
    ref, ref_keep = reference_sparsegpt(w, h, exact_block_counts(total, 48, block_size), block_size=block_size)
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-12)
    assert int((~keep).sum()) == total
    assert keep.dtype == np.bool_ and new.dtype == np.float64


@pytest.mark.parametrize("block_size", [128, 16, 20])
def test_layer_error_within_5_percent_of_paper_counts(block_size):
    """The paper prunes round(fraction * block) per block; exact counts change the error by < 5%."""
    w, x, h = layer(rows=24, k=60, seed=1)
    new, _ = ap.sparsegpt(w, h, 0.5, block_size=block_size)
    paper, _ = reference_sparsegpt(w, h, fraction=0.5, block_size=block_size)
    assert abs(layer_error(x, w, new) / layer_error(x, w, paper) - 1) < 0.05


@pytest.mark.parametrize("k, block_size", [(48, 16), (50, 128), (50, 8)])
@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (4, 8)])
def test_nm_equals_reference(k, block_size, n, m):
    w, x, h = layer(k=k, seed=2)
    new, keep = ap.sparsegpt(w, h, n=n, m=m, block_size=block_size)
    ref, ref_keep = reference_sparsegpt(w, h, nm=(n, m), block_size=block_size)
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-12)
    assert ap.is_nm_sparse(new, n, m) and ap.is_nm_sparse(keep, n, m)
    full_groups = k // m
    assert int((~keep).sum()) == w.shape[0] * (full_groups * n + max(0, k % m - (m - n)))


def wanda_keep(w, x, nm=False):
    scores = ap.wanda_scores(w, np.sqrt(np.sum(x**2, axis=0)), 1)
    return ap.nm_structured(scores, 2, 4) if nm else ap.wanda(scores, 0.5, dim=0)


@pytest.mark.parametrize("nm", [False, True], ids=["50%", "2:4"])
def test_beats_wanda_and_magnitude(nm):
    w, x, h = layer(rows=32, k=64, samples=512, seed=3)
    kwargs = {"n": 2, "m": 4} if nm else {"amount": 0.5}
    new, keep = ap.sparsegpt(w, h, block_size=32, **kwargs)
    ref, _ = reference_sparsegpt(w, h, [512, 512], nm=(2, 4) if nm else None, block_size=32)
    magnitude = ap.nm_structured(w, 2, 4) if nm else ap.l1_unstructured(w, 0.5)
    errors = {
        "sparsegpt": layer_error(x, w, new),
        "reference": layer_error(x, w, ref),
        "wanda": layer_error(x, w, w * wanda_keep(w, x, nm)),
        "magnitude": layer_error(x, w, w * magnitude),
    }
    assert abs(errors["sparsegpt"] / errors["reference"] - 1) < 0.05
    # Measured here (seed 3): 50%: sparsegpt/wanda 0.60, /magnitude 0.61; 2:4: 0.56 and 0.56.
    assert errors["sparsegpt"] < 0.7 * errors["wanda"]
    assert errors["sparsegpt"] < 0.7 * errors["magnitude"]
    assert int((~keep).sum()) == w.size // 2


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    k=st.integers(1, 20),
    block_size=st.integers(1, 9),
    amount=st.one_of(st.floats(0.0, 1.0), st.integers(0, 120)),
    seed=st.integers(0, 2**16),
)
def test_exact_counts(rows, k, block_size, amount, seed):
    rng = np.random.default_rng(seed)
    if isinstance(amount, int):
        amount = min(amount, rows * k)
    total = amount if isinstance(amount, int) else round(amount * rows * k)
    x = rng.standard_normal((2 * k + 1, k))
    w = rng.standard_normal((rows, k))
    new, keep = ap.sparsegpt(w, x.T @ x, amount, block_size=block_size)
    assert int((~keep).sum()) == total
    assert not np.any(new[~keep])
    for b, start in enumerate(range(0, k, block_size)):
        stop = min(start + block_size, k)
        dropped = int((~keep[:, start:stop]).sum())
        assert dropped == exact_block_counts(total, k, block_size)[b]
        assert abs(dropped - Fraction(total * (stop - start), k)) < 1


def test_reduction_axis_0_is_the_transposed_case():
    w, x, h = layer(seed=4)
    new, keep = ap.sparsegpt(w, h, 0.5, block_size=16)
    new_t, keep_t = ap.sparsegpt(np.ascontiguousarray(w.T), h, 0.5, block_size=16, reduction_axis=0)
    np.testing.assert_array_equal(keep_t, keep.T)
    np.testing.assert_array_equal(new_t, new.T)
    new_nm, _ = ap.sparsegpt(w.T, h, n=2, m=4, reduction_axis=0)
    assert ap.is_nm_sparse(new_nm, 2, 4, dim=0)


def test_conv_weight_flattens_after_the_output_axis():
    rng = np.random.default_rng(5)
    inputs = np.cumsum(np.cumsum(rng.standard_normal((4, 3, 9, 9)), axis=2), axis=3)  # smooth images
    inputs[:, 1] += inputs[:, 0]  # correlated channels
    w = rng.standard_normal((8, 3, 3, 3))
    patches = ap.unfold_patches(inputs, 3, padding=1)[0]
    acc = ap.HessianAccumulator(27)
    acc.update(patches)
    new, keep = ap.sparsegpt(w, acc.hessian(), 0.5, block_size=8)
    flat_new, flat_keep = ap.sparsegpt(w.reshape(8, 27), acc.hessian(), 0.5, block_size=8)
    np.testing.assert_array_equal(new, flat_new.reshape(w.shape))
    np.testing.assert_array_equal(keep, flat_keep.reshape(w.shape))
    np.testing.assert_array_equal(ap.sparsegpt(w, acc.hessian(), 0.5, block_size=8, reduction_axis=1)[0], new)
    flat = w.reshape(8, 27)
    error = layer_error(patches, flat, new.reshape(8, 27))
    magnitude = layer_error(patches, flat, flat * ap.l1_unstructured(flat, 0.5))
    assert error < 0.7 * magnitude, error / magnitude


def test_torch_equals_numpy():
    torch = pytest.importorskip("torch")
    w, x, h = layer(seed=6)
    new, keep = ap.sparsegpt(w, h, 0.5, block_size=16)
    t_new, t_keep = ap.sparsegpt(torch.from_numpy(w), torch.from_numpy(h), 0.5, block_size=16)
    assert isinstance(t_new, torch.Tensor) and t_keep.dtype == torch.bool and t_new.dtype == torch.float64
    np.testing.assert_array_equal(t_keep.numpy(), keep)
    np.testing.assert_allclose(t_new.numpy(), new, rtol=1e-10, atol=1e-12)
    # float32 weights are processed in float64 and cast back; a NumPy Hessian is accepted.
    t32, k32 = ap.sparsegpt(torch.from_numpy(w).float(), h, n=2, m=4)
    n32, _ = ap.sparsegpt(w.astype(np.float32), h, n=2, m=4)
    assert t32.dtype == torch.float32
    np.testing.assert_array_equal(t32.numpy(), n32)


def test_every_backend_equals_numpy(backend, xp):
    w, x, h = layer(rows=8, k=24, seed=7)
    new, keep = ap.sparsegpt(w, h, 0.5, block_size=8)
    b_new, b_keep = ap.sparsegpt(backend.asarray(w), backend.asarray(h), 0.5, block_size=8)
    np.testing.assert_array_equal(to_numpy(b_keep), keep)
    np.testing.assert_allclose(to_numpy(b_new), new, rtol=1e-9, atol=1e-12)
    acc = ap.HessianAccumulator(24)
    acc.update(backend.asarray(x[:150]))
    acc.update(backend.asarray(x[150:].reshape(10, 25, 24)))
    np.testing.assert_allclose(to_numpy(acc.hessian()), h, rtol=1e-12)


def test_array_api_strict_second_device():
    strict = pytest.importorskip("array_api_strict")
    device1 = strict.Device("device1")
    w, x, h = layer(rows=8, k=24, seed=8)
    results = []
    for device in (None, device1):
        ww = strict.asarray(w, device=device)
        hh = strict.asarray(h, device=device)
        new, keep = ap.sparsegpt(ww, hh, n=2, m=4, block_size=8)
        if device is not None:
            assert new.device == device1 and keep.device == device1
        acc = ap.HessianAccumulator(24)
        acc.update(strict.asarray(x, device=device))
        assert acc.hessian().device == (device1 if device is not None else ww.device)
        patches = ap.unfold_patches(strict.reshape(ww, (1, 2, 4, 24)), 3, padding=1, groups=2)
        if device is not None:
            assert patches.device == device1
        results.append([to_numpy(a) for a in (new, keep, acc.hessian(), patches)])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_dead_inputs():
    w, x, h = layer(seed=9, dead=(3, 10))
    assert h[3, 3] == 0 and h[10, 10] == 0
    new, keep = ap.sparsegpt(w, h, 0.5, block_size=16)
    # the 32 dead entries (block 0) are pruned first; the other 352 are shared over the 46 live columns
    live = [math.floor(Fraction(352 * c, 46) + Fraction(1, 2)) for c in (0, 14, 30, 46)]
    counts = [32 + live[1] - live[0], live[2] - live[1], live[3] - live[2]]
    ref, ref_keep = reference_sparsegpt(w, h, counts, block_size=16)
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-12)
    assert int((~keep).sum()) == w.size // 2
    assert not np.any(new[:, [3, 10]]) and not np.any(keep[:, [3, 10]])  # score 0: pruned first


def test_dead_inputs_never_more_than_the_amount():
    w, x, h = layer(seed=9, dead=(3, 10))
    few, few_keep = ap.sparsegpt(w, h, 5)  # fewer than the 32 dead entries: 5 pruned, 5 zeros
    assert int((~few_keep).sum()) == 5 and int((few == 0).sum()) == 5
    pruned = np.zeros_like(few_keep)
    pruned[[0, 0, 1, 1, 2], [3, 10, 3, 10, 3]] = True  # the first dead entries, row-major
    np.testing.assert_array_equal(few_keep, ~pruned)
    live = np.ones(48, dtype=bool)
    live[[3, 10]] = False
    np.testing.assert_array_equal(few[:, live], w[:, live])  # a dead entry pruned spreads no error
    np.testing.assert_array_equal(few[few_keep], w[few_keep])  # dead entries kept keep their values


def test_mostly_dead_inputs_count_exactly():
    w, x, h = layer(rows=4, k=16, seed=3, dead=tuple(range(1, 16)))  # one live input
    new, keep = ap.sparsegpt(w, h, 0.5, block_size=4)
    assert int((~keep).sum()) == 32 and int((new == 0).sum()) == 32
    np.testing.assert_array_equal(new[:, 0], w[:, 0])


def test_all_zero_hessian_is_refused():
    w = np.ones((3, 4))
    with pytest.raises(ValueError, match="the Hessian is all zero"):
        ap.sparsegpt(w, np.zeros((4, 4)), 0.5)


def test_scale_invariant_in_the_hessian():
    w, x, h = layer(seed=10, dead=(5,))
    new, keep = ap.sparsegpt(w, h, 0.6, block_size=16)
    for scale in (2.0 / x.shape[0], 1e-3, 7.5, 1e6):
        s_new, s_keep = ap.sparsegpt(w, h * scale, 0.6, block_size=16)
        np.testing.assert_array_equal(s_keep, keep)
        np.testing.assert_allclose(s_new, new, rtol=1e-8, atol=1e-10)


def test_amount_zero_and_one():
    w, x, h = layer(seed=11)
    new, keep = ap.sparsegpt(w, h, 0.0)
    np.testing.assert_array_equal(new, w)
    assert keep.all()
    new, keep = ap.sparsegpt(w, h, 1.0)
    assert not new.any() and not keep.any()
    empty, empty_keep = ap.sparsegpt(np.zeros((0, 3)), np.eye(3), 0.5)
    assert empty.shape == (0, 3) and empty_keep.shape == (0, 3)


def test_inputs_are_not_modified():
    w, x, h = layer(seed=12, dead=(0,))
    w0, h0 = w.copy(), h.copy()
    ap.sparsegpt(w, h, 0.5)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(h, h0)


NOT_K_BY_K = "the Hessian must be 5 x 5 (the length of the weight's reduction), got shape "
ONES = np.ones((3, 5))


@pytest.mark.parametrize(
    "hessian, error, message",
    [
        (np.eye(4), ValueError, NOT_K_BY_K + "(4, 4)"),
        (np.ones((5, 4)), ValueError, NOT_K_BY_K + "(5, 4)"),
        (np.ones(5), ValueError, NOT_K_BY_K + "(5,)"),
        (np.diag([1.0, np.nan, 1, 1, 1]), ValueError, "the Hessian has NaN or infinite entries"),
        (np.diag([1.0, 1, np.inf, 1, 1]), ValueError, "the Hessian has NaN or infinite entries"),
        (np.diag([1.0, 1, -1, 1, 1]), ValueError, "the Hessian has a negative diagonal entry: it is not X^T X"),
        (np.eye(5, dtype=complex), TypeError, "the Hessian must be real, got dtype complex128"),
        (np.ones((5, 5)) + np.diag([0, 0, 0, 0, -1e-3]), ValueError, "the damped Hessian is not positive definite"),
    ],
)
def test_hessian_validation(hessian, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ap.sparsegpt(np.ones((3, 5)), hessian, 0.5, damp=0.0)


def test_not_positive_definite_torch():
    torch = pytest.importorskip("torch")
    h = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="the damped Hessian is not positive definite"):
        ap.sparsegpt(torch.ones(3, 2), h, 0.5, damp=0.0)


@pytest.mark.parametrize(
    "weight, kwargs, error, message",
    [
        (ONES.astype(np.int64), {"amount": 0.5}, TypeError, "sparsegpt needs a floating weight, got dtype int64"),
        (np.ones(5), {"amount": 0.5}, ValueError, "sparsegpt needs a weight of at least 2 dimensions, got shape (5,)"),
        (np.full((3, 5), np.nan), {"amount": 0.5}, ValueError, "sparsegpt needs a finite weight"),
        (ONES, {"amount": 1.5}, ValueError, "amount=1.5 should either be a float in the range [0, 1]"),
        (ONES, {"amount": -1}, ValueError, "amount=-1 should either be a float in the range [0, 1]"),
        (ONES, {"amount": 16}, ValueError, "amount=16 should be smaller than the number of parameters to prune=15"),
        (ONES, {"amount": "half"}, TypeError, "Invalid type for amount: 'half'. Must be int or float."),
        (ONES, {}, ValueError, "sparsegpt needs an amount, or n and m for an N:M pattern"),
        (ONES, {"amount": 0.5, "n": 2, "m": 4}, ValueError, "give either amount or n and m, not both"),
        (ONES, {"n": 2}, ValueError, "an N:M pattern needs both n and m, got n=2, m=None"),
        (ONES, {"n": 5, "m": 4}, ValueError, "need 0 <= n <= m and m >= 1 for n:m sparsity, got 5:4"),
        (ONES, {"n": 2, "m": 4, "block_size": 6}, ValueError, "block_size=6 must be a multiple of m=4 for 2:4"),
        (ONES, {"amount": 0.5, "block_size": 0}, ValueError, "block_size must be positive, got 0"),
        (ONES, {"amount": 0.5, "block_size": 2.0}, TypeError, "block_size must be an int, got float"),
        (ONES, {"amount": 0.5, "damp": -0.1}, ValueError, "damp must be a finite non-negative number"),
        (ONES, {"amount": 0.5, "reduction_axis": 2}, IndexError, "Invalid index 2 for tensor of size (3, 5)"),
        (np.ones((5, 1, 5, 1)), {"amount": 0.5, "reduction_axis": 0}, ValueError, "reduction_axis=0 is not allowed"),
    ],
)
def test_argument_errors(weight, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ap.sparsegpt(weight, np.eye(5), **kwargs)


def test_hessian_accumulator():
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((7, 3)), rng.standard_normal((2, 4, 3)).astype(np.float32)
    acc = ap.HessianAccumulator(3)
    acc.update(a)
    acc.update(b)
    x = np.concatenate([a, b.reshape(8, 3).astype(np.float64)])
    assert acc.rows == 15
    np.testing.assert_allclose(acc.hessian(), x.T @ x / 15, rtol=1e-13)
    assert acc.hessian().dtype == np.float64
    acc.update(np.ones((0, 3)))
    assert acc.rows == 15
    with pytest.raises(ValueError, match=re.escape("inputs must be shaped [..., 3], got (4, 2)")):
        acc.update(np.ones((4, 2)))
    with pytest.raises(TypeError, match="inputs must be real, got dtype complex128"):
        acc.update(np.ones((4, 3), dtype=complex))
    with pytest.raises(ValueError, match="no inputs yet: call update with at least one row first"):
        ap.HessianAccumulator(3).hessian()
    with pytest.raises(ValueError, match="k must be positive, got 0"):
        ap.HessianAccumulator(0)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        ap.HessianAccumulator(3.0)


def test_hessian_accumulator_add_gram_equals_update():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((7, 3)), rng.standard_normal((5, 3))
    by_rows, by_grams = ap.HessianAccumulator(3), ap.HessianAccumulator(3)
    grams = [a.T @ a, b.T @ b]
    for x, gram in zip((a, b), grams, strict=True):
        by_rows.update(x)
        by_grams.add_gram(gram, 5 if x is b else 7)
    assert by_grams.rows == 12
    np.testing.assert_array_equal(grams[0], a.T @ a)  # the caller's gram is not added to in place
    np.testing.assert_array_equal(by_grams.hessian(), by_rows.hessian())
    np.testing.assert_allclose(by_grams.hessian(), np.concatenate([a, b]).T @ np.concatenate([a, b]) / 12, rtol=1e-13)
    with pytest.raises(ValueError, match=re.escape("gram must be 3 x 3, got shape (3, 2)")):
        by_grams.add_gram(np.ones((3, 2)), 1)
    with pytest.raises(ValueError, match="rows must be non-negative, got -1"):
        by_grams.add_gram(np.ones((3, 3)), -1)
    with pytest.raises(TypeError, match="rows must be an int, got float"):
        by_grams.add_gram(np.ones((3, 3)), 1.0)
    assert by_grams.rows == 12  # refused grams added nothing
    np.testing.assert_array_equal(by_grams.hessian(), by_rows.hessian())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 3},
        {"kernel_size": (2, 3), "stride": 2, "padding": (1, 2), "dilation": (2, 1)},
        {"kernel_size": 1, "stride": (1, 3)},
        {"kernel_size": 3, "padding": 1, "groups": 2},
        {"kernel_size": 2, "stride": 2, "dilation": 2, "groups": 4},
    ],
)
def test_unfold_patches_equals_torch(kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 4, 9, 10))
    groups = kwargs.get("groups", 1)
    kh, kw = kwargs["kernel_size"] if isinstance(kwargs["kernel_size"], tuple) else (kwargs["kernel_size"],) * 2
    w = rng.standard_normal((8, 4 // groups, kh, kw))
    patches = ap.unfold_patches(x, **kwargs)
    conv_kwargs = {key: value for key, value in kwargs.items() if key != "kernel_size"}
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), **conv_kwargs).numpy()
    out_h, out_w = expected.shape[2:]
    assert patches.shape == (groups, 2 * out_h * out_w, 4 // groups * kh * kw)
    per_group = 8 // groups
    for g in range(groups):
        got = patches[g] @ w[g * per_group : (g + 1) * per_group].reshape(per_group, -1).T
        want = expected[:, g * per_group : (g + 1) * per_group].transpose(0, 2, 3, 1).reshape(-1, per_group)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if groups == 1:
        conv_args = {key: kwargs[key] for key in ("kernel_size", "stride", "padding", "dilation") if key in kwargs}
        unfolded = torch.nn.functional.unfold(torch.from_numpy(x), **conv_args).numpy()  # [N, C*kh*kw, L]
        np.testing.assert_array_equal(patches[0], unfolded.transpose(0, 2, 1).reshape(-1, 4 * kh * kw))


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((np.ones((4, 9, 9)), 3), {}, ValueError, "unfold_patches needs an input [N, C, H, W], got shape (4, 9, 9)"),
        ((np.ones((1, 4, 9, 9)), 3), {"groups": 3}, ValueError, "groups=3 does not divide the 4 input channels"),
        ((np.ones((1, 4, 2, 9)), 3), {}, ValueError, "a kernel of 3 x 3 (dilation 1, 1) does not fit the padded input"),
        ((np.ones((1, 4, 9, 9)), 0), {}, ValueError, "kernel_size must be at least 1, got 0"),
        ((np.ones((1, 4, 9, 9)), 3), {"padding": -1}, ValueError, "padding must be at least 0, got -1"),
        ((np.ones((1, 4, 9, 9)), 3), {"stride": (1, 2, 3)}, TypeError, "stride must be an int or a pair of ints"),
    ],
)
def test_unfold_patches_errors(args, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ap.unfold_patches(*args, **kwargs)


def test_docstring_examples():
    result = doctest.testmod(reconstruction)
    assert result.failed == 0 and result.attempted >= 10


def test_nm_prunes_dead_inputs_first_and_no_more_than_n():
    w, x, h = layer(rows=3, k=8, seed=4, dead=(1, 2, 6))
    new, keep = ap.sparsegpt(w, h, n=1, m=4)
    # group 0 has two dead inputs: the first (by column) is pruned, the other keeps its value
    np.testing.assert_array_equal(keep, np.array([[1, 0, 1, 1, 1, 1, 0, 1]] * 3, dtype=bool))
    assert int((new == 0).sum()) == 6
    np.testing.assert_array_equal(new[:, 2], w[:, 2])


@pytest.mark.parametrize("step", [1, 3, 5, 16, 1000])
@pytest.mark.parametrize("options", [{"amount": 0.4}, {"n": 2, "m": 4}, {"n": 1, "m": 3}])
def test_any_column_step_equals_reference(monkeypatch, step, options):
    """Columns solved a few at a time between products give the paper's masks and weights;
    an N:M step is rounded to whole groups, so a group never straddles two steps."""
    monkeypatch.setattr(reconstruction, "_COLUMN_STEP", step)
    w, x, h = layer(rows=12, k=50, seed=5)
    block_size = 24
    if "amount" in options:
        total = round(options["amount"] * w.size)
        new, keep = ap.sparsegpt(w, h, block_size=block_size, **options)
        ref, ref_keep = reference_sparsegpt(w, h, exact_block_counts(total, 50, block_size), block_size=block_size)
    else:
        new, keep = ap.sparsegpt(w, h, block_size=block_size, **options)
        ref, ref_keep = reference_sparsegpt(w, h, nm=(options["n"], options["m"]), block_size=block_size)
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-12)


def test_gram_is_the_sum_the_hessian_divides():
    acc = ap.HessianAccumulator(3)
    with pytest.raises(ValueError, match="no inputs yet"):
        acc.gram()
    x = np.arange(12.0).reshape(4, 3)
    acc.update(x[:1])
    acc.update(x[1:])
    np.testing.assert_array_equal(acc.gram(), x.T @ x)
    np.testing.assert_allclose(acc.hessian(), x.T @ x / 4, rtol=1e-15)
