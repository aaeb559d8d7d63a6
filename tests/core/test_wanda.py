"""Wanda (`arrayprune.Wanda`, `arrayprune.wanda_scores`) against NumPy references.

The reference prunes each output unit on its own with `reference_keep` (the stable
argsort order shared by every test: |score| ascending, NaN above +inf, ties by
position), counting with Python's `round` as PyTorch does; scores are |W| times the
input norms, written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayprune as ap
from conftest import reference_keep, to_numpy


def reference_wanda(scores: np.ndarray, amount, dim: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Per output unit along `dim`: drop `amount` of its eligible entries, smallest |score| first."""
    s = np.moveaxis(np.asarray(scores, dtype=np.float64), dim, 0)
    m = None if mask is None else np.moveaxis(np.asarray(mask) != 0, dim, 0)
    keep = np.ones(s.shape, bool)
    for i in range(s.shape[0]):
        eligible = None if m is None else m[i]
        available = s[i].size if m is None else int(m[i].sum())
        k = amount if isinstance(amount, int) else round(amount * available)
        keep[i] = reference_keep([s[i]], k, None if eligible is None else [eligible])[0]
        if m is not None:
            keep[i] &= m[i]
    return np.moveaxis(keep, 0, dim)


def tied(shape, seed=0) -> np.ndarray:
    """Values with many ties, signed zeros, inf and NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, size=shape).astype(np.float64) / 2
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.05] = np.nan
    flat[rng.random(flat.size) < 0.03] = -np.inf
    flat[rng.random(flat.size) < 0.05] = -0.0
    return x


@pytest.mark.parametrize("shape, dim", [((6, 10), 0), ((6, 10), 1), ((4, 3, 3, 2), 0), ((5, 4, 3), -1)])
@pytest.mark.parametrize("amount", [0.0, 0.3, 0.5, 0.9, 1.0, 2])
def test_masks_equal_reference(backend, xp, shape, dim, amount):
    w = tied(shape, seed=len(shape) + dim)
    got = to_numpy(ap.wanda(backend.asarray(w), amount, dim=dim))
    np.testing.assert_array_equal(got, reference_wanda(w, amount, dim))
    assert got.dtype == np.bool_


def test_hand_computed_matmul_and_gemm_layouts():
    """MatMul B [K, N] groups columns (dim=1); Gemm transB=1 / Linear [N, K] groups rows."""
    w_kn = np.array([[0.5, -3.0], [-0.1, 2.0], [0.2, 1.0], [4.0, -0.5]])  # K=4, N=2
    norms = np.array([1.0, 10.0, 1.0, 0.1])  # one per K
    scores = ap.wanda_scores(w_kn, norms, reduction_axis=0)
    np.testing.assert_allclose(scores, [[0.5, 3.0], [1.0, 20.0], [0.2, 1.0], [0.4, 0.05]])
    keep = ap.wanda(w_kn, 0.5, dim=1, importance_scores=scores)
    np.testing.assert_array_equal(keep, [[True, True], [True, True], [False, False], [False, False]])
    # The same layer as a Gemm with transB=1 (or a torch Linear): weight [N, K]
    keep_nk = ap.wanda(w_kn.T, 0.5, dim=0, importance_scores=ap.wanda_scores(w_kn.T, norms, reduction_axis=1))
    np.testing.assert_array_equal(keep_nk, keep.T)


def test_scores_for_convolutions_broadcast_over_the_kernel():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2, 2, 2))
    norms = np.array([2.0, 0.5])
    want = np.abs(w) * norms[None, :, None, None]
    np.testing.assert_allclose(ap.wanda_scores(w, norms, 1), want)


def test_scores_on_backends(backend, xp):
    w = np.arange(-6.0, 6.0).reshape(3, 4)
    norms = np.array([1.0, 2.0, 3.0, 4.0])
    got = ap.wanda_scores(backend.asarray(w, "float32"), backend.asarray(norms, "float32"), 1)
    np.testing.assert_allclose(to_numpy(got), np.abs(w) * norms, rtol=1e-6)


def test_scores_check_the_norms():
    w = np.ones((3, 4))
    with pytest.raises(ValueError, match="one norm per input feature"):
        ap.wanda_scores(w, np.ones(3), 1)
    with pytest.raises(ValueError, match="one norm per input feature"):
        ap.wanda_scores(w, np.ones((4, 1)), 1)
    with pytest.raises(IndexError):
        ap.wanda_scores(w, np.ones(4), 2)


@pytest.mark.parametrize("first, second", [(0.3, 0.5), (2, 0.5), (0.5, 3)])
def test_iterative_pruning_counts_what_each_unit_has_left(backend, xp, first, second):
    """In a container, the amount is relative to each output unit's unpruned entries."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 12))
    scores = tied((5, 12), seed=9)
    m1 = ap.l1_unstructured(backend.asarray(w), first)  # unstructured first: units differ
    got = ap.PruningContainer(ap.L1Unstructured(first), ap.Wanda(second, dim=0)).compute_mask(
        backend.asarray(scores), m1
    )
    want = reference_wanda(scores, second, 0, mask=to_numpy(m1))
    np.testing.assert_array_equal(to_numpy(got), want)


def test_float_default_mask_keeps_its_dtype():
    w = tied((4, 6), seed=2)
    mask = np.ones((4, 6), np.float32)
    mask[:, 0] = 0
    got = ap.Wanda(0.4, dim=0).compute_mask(w, mask)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got != 0, reference_wanda(w, 0.4, 0, mask=mask))


def test_errors_like_pytorch():
    w = np.ones((3, 4))
    with pytest.raises(ValueError, match="amount"):
        ap.Wanda(1.5)
    with pytest.raises(ValueError):
        ap.wanda(w, 5, dim=0)  # more than an output unit has
    with pytest.raises(ValueError):
        ap.wanda(np.ones(4), 0.5)  # no output axis on a vector
    with pytest.raises(IndexError):
        ap.wanda(w, 0.5, dim=2)
    with pytest.raises(TypeError, match="schedule"):
        ap.prune_to_sparsity(w, 0.5, pruning_method=ap.Wanda)


def test_in_the_method_table():
    assert ap.METHODS["wanda"] is ap.Wanda
    assert "wanda_scores" in ap.__all__ and "wanda" in ap.__all__


def test_two_four_and_global_take_wanda_scores():
    """Wanda scores feed the 2:4 pattern and global pruning like any importance scores."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 8))
    norms = rng.random(8) * 3
    scores = ap.wanda_scores(w, norms, 1)
    nm = ap.nm_structured(w, 2, 4, dim=1, importance_scores=scores)
    groups = scores.reshape(4, 2, 4)
    want = np.ones((4, 2, 4), bool)
    for i in range(4):
        for g in range(2):
            want[i, g, np.argsort(groups[i, g], kind="stable")[:2]] = False
    np.testing.assert_array_equal(nm, want.reshape(4, 8))
    (glob,) = ap.global_unstructured([w], ap.L1Unstructured, importance_scores=[scores], amount=10)
    np.testing.assert_array_equal(glob, reference_keep([scores], 10)[0])


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 9),
    dim=st.integers(0, 1),
    amount=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_property_every_unit_loses_the_same_count(rows, cols, dim, amount, seed):
    w = tied((rows, cols), seed=seed)
    keep = ap.wanda(w, amount, dim=dim)
    np.testing.assert_array_equal(keep, reference_wanda(w, amount, dim))
    units = w.shape[dim]
    per_unit = w.size // units
    dropped = (~keep).sum(axis=1 - dim)
    assert (dropped == round(amount * per_unit)).all()
    assert dropped.shape == (units,)


def test_grouped_scores_take_each_output_units_group(backend, xp):
    """groups=2: outputs 0-2 read features 0-1, outputs 3-5 read features 2-3."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((6, 2, 3))
    norms = np.array([1.0, 2.0, 30.0, 40.0])
    want = np.abs(w) * np.array([[1.0, 2.0]] * 3 + [[30.0, 40.0]] * 3)[:, :, None]
    got = ap.wanda_scores(backend.asarray(w), backend.asarray(norms), 1, groups=2)
    np.testing.assert_allclose(to_numpy(got), want)
    # the same weight stored [in/groups, out, k]: output axis 1
    got_t = ap.wanda_scores(
        backend.asarray(np.transpose(w, (1, 0, 2))), backend.asarray(norms), 0, groups=2, output_axis=1
    )
    np.testing.assert_allclose(to_numpy(got_t), np.transpose(want, (1, 0, 2)))
    with pytest.raises(ValueError, match="groups"):
        ap.wanda_scores(backend.asarray(w), backend.asarray(np.ones(8)), 1, groups=4)


def test_subnormals_rank_by_value_on_every_backend(backend, xp):
    """JAX compares subnormals as zero; Wanda ranks them by their bits, like NumPy."""
    tiny = np.finfo(np.float32).smallest_subnormal
    w = np.array([[3 * tiny, 0.0, tiny, -2 * tiny], [5 * tiny, -tiny, 0.0, 4 * tiny]], dtype=np.float32)
    got = to_numpy(ap.wanda(backend.asarray(w), 2, dim=0))
    np.testing.assert_array_equal(got, [[True, False, False, True], [True, False, False, True]])


def test_bool_weights_score_as_zero_and_one_like_the_magnitude_methods(backend, xp):
    """A boolean weight ranks as 0 and 1, as ``L1Unstructured`` and ``Wanda`` rank it, on every backend."""
    w = np.array([[True, False, True], [False, True, True]])
    got = to_numpy(ap.wanda_scores(backend.asarray(w), backend.asarray(np.array([2.0, 3.0, 0.5])), 1))
    np.testing.assert_array_equal(got, [[2.0, 0.0, 0.5], [0.0, 3.0, 0.5]])
    assert got.dtype.kind == "f"
