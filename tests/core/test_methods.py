"""Pruning methods and containers on every backend: hand-computed masks and contracts."""

from __future__ import annotations

import math

import array_api_compat as apc
import numpy as np
import pytest

import arrayprune as ap
from arrayprune.methods import combine_masks
from conftest import Backend, reference_keep, to_numpy

NAN, INF = math.nan, math.inf

# JAX compiles every operation anew for each new shape and dtype (about a second each on
# a loaded machine): the larger grids run a representative part of themselves on JAX.
NOT_JAX = pytest.mark.skip_backend("jax", reason="XLA compiles per shape: JAX runs the smaller grids")


def lighter_on_jax(backend, condition: bool) -> None:
    """Skip this parametrisation on JAX when `condition` holds (grid kept small there)."""
    if condition and backend.backend is Backend.JAX:
        pytest.skip("JAX runs a representative part of this grid")


def ones(backend, shape, dtype="bool"):
    return backend.asarray(np.ones(shape, dtype=np.float32), dtype)


# --------------------------------------------------------------------------------------
# L1Unstructured: hand-computed masks, ties, NaN, inf, signed zeros
# --------------------------------------------------------------------------------------

L1_CASES = [
    # (values, amount, expected keep mask)
    ([0.3, -0.1, 0.2, 0.0], 2, [1, 0, 1, 0]),
    ([0.3, -0.1, 0.2, 0.0], 0.5, [1, 0, 1, 0]),
    ([0.3, -0.1, 0.2, 0.0], 3, [1, 0, 0, 0]),
    ([0.3, -0.1, 0.2, 0.0], 0, [1, 1, 1, 1]),
    # ties: lowest flat index pruned first
    ([1.0, 1.0, 1.0, 1.0, 1.0], 2, [0, 0, 1, 1, 1]),
    ([-1.0, 1.0, -1.0, 1.0], 3, [0, 0, 0, 1]),
    ([2.0, -1.0, 1.0, 3.0, -1.0], 2, [1, 0, 0, 1, 1]),
    ([2.0, -1.0, 1.0, 3.0, -1.0], 1, [1, 0, 1, 1, 1]),
    ([5.0, 2.0, 2.0, 0.5, 2.0], 3, [1, 0, 0, 0, 1]),
    # signed zeros are equal magnitudes
    ([0.0, -0.0, -0.0, 0.0], 2, [0, 0, 1, 1]),
    ([-0.0, 1.0, 0.0], 1, [0, 1, 1]),
    # NaN above +inf, inf above any number; -inf has magnitude inf
    ([NAN, INF, 1.0, -INF], 1, [1, 1, 0, 1]),
    ([NAN, INF, 1.0, -INF], 2, [1, 0, 0, 1]),
    ([NAN, INF, 1.0, -INF], 3, [1, 0, 0, 0]),
    ([NAN, INF, 1.0, -INF], 4, [0, 0, 0, 0]),
    ([NAN, 0.0, NAN], 2, [0, 0, 1]),
    ([NAN, 1e30, -NAN, 0.0], 2, [1, 0, 1, 0]),
    ([-INF, INF, 7.0], 2, [0, 1, 0]),
]


@pytest.mark.parametrize("values,amount,expected", L1_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_l1_hand_computed(backend, dtype, values, amount, expected):
    lighter_on_jax(backend, dtype != "float32")
    x = np.array(values, dtype=np.float64)
    if dtype == "float32" and np.abs(x[np.isfinite(x)]).max(initial=0) > 1e30:
        x = np.where(np.abs(x) == 1e30, 1e30, x)
    t = backend.asarray(x, dtype)
    expected = np.array(expected, dtype=bool)
    mask = ap.L1Unstructured(amount).compute_mask(t, ones(backend, x.shape))
    np.testing.assert_array_equal(to_numpy(mask), expected)
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, amount)), expected)
    # same mask for the 2-D view: ties follow the C-order flat index
    if backend.backend is Backend.JAX:
        return
    t2 = backend.xp.reshape(t, (1, len(values)))
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t2, amount)).reshape(-1), expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_l1_hand_computed_half(backend, dtype):
    lighter_on_jax(backend, dtype != "bfloat16")
    if not backend.has_dtype(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    for values, amount, expected in L1_CASES:
        if any(abs(v) == 1e30 for v in values):
            continue
        t = backend.asarray(np.array(values, dtype=np.float32), dtype)
        mask = ap.l1_unstructured(t, amount)
        np.testing.assert_array_equal(to_numpy(mask), np.array(expected, dtype=bool), err_msg=str(values))


def test_l1_2d_flat_index_ties(backend):
    t = backend.asarray(np.array([[2.0, 1.0], [1.0, 2.0]], dtype=np.float32))
    expect = {
        1: [[1, 0], [1, 1]],
        2: [[1, 0], [0, 1]],
        3: [[0, 0], [0, 1]],
        4: [[0, 0], [0, 0]],
    }
    for k, e in expect.items():
        np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, k)), np.array(e, bool))


def test_l1_transposed_input_uses_logical_order(backend):
    x = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=np.float32)
    tt = backend.xp.permute_dims(backend.asarray(x), (1, 0))  # shape (3, 2), maybe a strided view
    mask = to_numpy(ap.l1_unstructured(tt, 3))
    np.testing.assert_array_equal(mask, np.array([[0, 0], [0, 1], [1, 1]], bool))


def test_l1_importance_scores(backend):
    t = backend.asarray(np.array([[10.0, 20.0], [30.0, 40.0]], dtype=np.float32))
    scores = backend.asarray(np.array([[4.0, -3.0], [2.0, 1.0]], dtype=np.float32))
    expected = np.array([[1, 1], [0, 0]], bool)
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, 2, importance_scores=scores)), expected)
    np.testing.assert_array_equal(to_numpy(ap.L1Unstructured(2).compute_mask(scores, ones(backend, (2, 2)))), expected)
    pruned = ap.L1Unstructured(2).prune(t, importance_scores=scores)
    np.testing.assert_array_equal(to_numpy(pruned), np.array([[10.0, 20.0], [0.0, 0.0]], np.float32))
    assert to_numpy(pruned).dtype == np.float32


def test_l1_compute_mask_ranks_all_entries_like_torch(backend):
    # compute_mask used directly ranks every entry of t, including those the default mask
    # already zeroes (as torch's L1Unstructured.compute_mask does)
    t = backend.asarray(np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32))
    default = backend.asarray(np.array([0.0, 1.0, 1.0, 1.0], dtype=np.float32))
    mask = to_numpy(ap.L1Unstructured(2).compute_mask(t, default))
    np.testing.assert_array_equal(mask, np.array([0, 0, 1, 1], np.float32))
    # the container / functional form acts on what remains
    mask = to_numpy(ap.PruningContainer(ap.L1Unstructured(2)).compute_mask(t, default))
    np.testing.assert_array_equal(mask, np.array([0, 0, 0, 1], np.float32))
    mask = to_numpy(ap.l1_unstructured(t, 2, default_mask=default))
    np.testing.assert_array_equal(mask, np.array([0, 0, 0, 1], np.float32))


# --------------------------------------------------------------------------------------
# LnStructured: norms, ties, NaN channels
# --------------------------------------------------------------------------------------

# columns: c0 = [3, 3], c1 = [5, 0], c2 = [2, 2.5]
COLS = np.array([[3.0, 5.0, 2.0], [3.0, 0.0, 2.5]], dtype=np.float32)
# n -> (kept columns when pruning 1, kept columns when pruning 2)
LN_EXPECT = {
    1: ([1, 1, 0], [1, 0, 0]),  # norms 6, 5, 4.5
    2: ([1, 1, 0], [0, 1, 0]),  # 4.24, 5, 3.20
    "fro": ([1, 1, 0], [0, 1, 0]),
    3: ([1, 1, 0], [0, 1, 0]),  # 3.78, 5, 2.87
    INF: ([1, 1, 0], [0, 1, 0]),  # 3, 5, 2.5
    -INF: ([1, 0, 1], [1, 0, 0]),  # 3, 0, 2
    0: ([1, 0, 1], [0, 0, 1]),  # 2, 1, 2: tie between c0 and c2, c0 goes first
}


@pytest.mark.parametrize("n", list(LN_EXPECT), ids=str)
def test_ln_structured_hand_computed(backend, n):
    t = backend.asarray(COLS)
    for amount, expected_cols in zip((1, 2), LN_EXPECT[n], strict=True):
        want = np.broadcast_to(np.array(expected_cols, bool), COLS.shape)
        for dim in (1, -1):
            mask = ap.LnStructured(amount, n, dim).compute_mask(t, ones(backend, COLS.shape))
            np.testing.assert_array_equal(to_numpy(mask), want, err_msg=f"n={n} amount={amount}")
        # rows of the transpose are the same channels
        tt = backend.asarray(np.ascontiguousarray(COLS.T))
        mask = ap.ln_structured(tt, amount, n, 0)
        np.testing.assert_array_equal(to_numpy(mask), want.T)
        # amount as a fraction of 3 channels: round(0.5 * 3) == 2, round(0.4 * 3) == 1
        frac = {1: 0.4, 2: 0.5}[amount]
        np.testing.assert_array_equal(to_numpy(ap.ln_structured(t, frac, n, -1)), want)


def test_ln_structured_nuclear_norm(backend):
    # channel 0 = identity (nuc 2, fro 1.41), channel 1 = diag(1.8, 0) (nuc 1.8, fro 1.8)
    x = np.zeros((2, 2, 2), dtype=np.float32)
    x[0] = np.eye(2)
    x[1, 0, 0] = 1.8
    t = backend.asarray(x)
    m_nuc = to_numpy(ap.ln_structured(t, 1, "nuc", 0))
    m_fro = to_numpy(ap.ln_structured(t, 1, "fro", 0))
    np.testing.assert_array_equal(m_nuc.any(axis=(1, 2)), [True, False])
    np.testing.assert_array_equal(m_fro.any(axis=(1, 2)), [False, True])
    # along the last dim: channels x[:, :, j]
    y = np.moveaxis(x, 0, -1).copy()
    m = to_numpy(ap.ln_structured(backend.asarray(y), 1, "nuc", -1))
    np.testing.assert_array_equal(m.any(axis=(0, 1)), [True, False])


def test_ln_structured_nuclear_norm_needs_3d(backend):
    with pytest.raises(ValueError):
        ap.ln_structured(backend.asarray(COLS), 1, "nuc", 0)
    with pytest.raises(ValueError):
        ap.ln_structured(backend.asarray(np.ones((2, 2, 2, 2), np.float32)), 1, "nuc", 0)


@pytest.mark.parametrize("n", ["l2", None, NAN, True, [2]], ids=repr)
def test_ln_structured_invalid_norm(n):
    with pytest.raises(ValueError):
        ap.ln_structured(COLS, 1, n, 0)


def test_ln_structured_channel_ties_lowest_first(backend):
    x = np.array([[1.0, -2.0, 2.0, 1.0, 2.0]], dtype=np.float32).repeat(3, axis=0)
    t = backend.asarray(x)
    for k, kept in [(1, [0, 1, 1, 1, 1]), (2, [0, 1, 1, 0, 1]), (3, [0, 0, 1, 0, 1]), (4, [0, 0, 0, 0, 1])]:
        for n in (1, 2, INF):
            m = to_numpy(ap.ln_structured(t, k, n, 1))
            np.testing.assert_array_equal(m.any(axis=0), np.array(kept, bool), err_msg=f"k={k} n={n}")


def test_ln_structured_nan_channel_never_before_numbers(backend):
    x = np.array([[NAN, 1.0, INF, 0.5], [0.0, 1.0, 1.0, 0.5]], dtype=np.float32)
    t = backend.asarray(x)
    # L1 norms: nan, 2, inf, 1
    for k, kept in [(1, [1, 1, 1, 0]), (2, [1, 0, 1, 0]), (3, [1, 0, 0, 0]), (4, [0, 0, 0, 0])]:
        m = to_numpy(ap.ln_structured(t, k, 1, 1))
        np.testing.assert_array_equal(m.any(axis=0), np.array(kept, bool), err_msg=f"k={k}")


def test_ln_structured_importance_scores(backend):
    t = backend.asarray(np.ones((2, 3), np.float32))
    scores = backend.asarray(COLS)
    m = to_numpy(ap.ln_structured(t, 2, 1, 1, importance_scores=scores))
    np.testing.assert_array_equal(m, np.broadcast_to(np.array([1, 0, 0], bool), (2, 3)))
    pruned = to_numpy(ap.LnStructured(2, 1, 1).prune(t, importance_scores=scores))
    np.testing.assert_array_equal(pruned, np.broadcast_to(np.array([1, 0, 0], np.float32), (2, 3)))


def test_structured_compute_mask_on_top_of_default(backend):
    t = backend.asarray(COLS)
    default = backend.asarray(np.array([[1, 0, 1], [0, 1, 1]], np.float32))
    # compute_mask ranks every channel (as torch), then multiplies by the default mask
    m = to_numpy(ap.LnStructured(1, 1, -1).compute_mask(t, default))
    np.testing.assert_array_equal(m, np.array([[1, 0, 0], [0, 1, 0]], np.float32))
    assert m.dtype == np.float32


def test_structured_channels_fully_pruned_are_not_counted_again(backend):
    # column 2 already entirely zero in the mask: only columns 0, 1 remain; prune 1 of them
    t = backend.asarray(COLS)
    default = backend.asarray(np.array([[1, 1, 0], [0, 1, 0]], np.float32))
    m = to_numpy(ap.ln_structured(t, 0.5, 1, -1, default_mask=default))  # round(0.5*2) = 1
    np.testing.assert_array_equal(m, np.array([[1, 0, 0], [0, 0, 0]], np.float32))


# --------------------------------------------------------------------------------------
# Mask dtype, namespace and device; input dtypes
# --------------------------------------------------------------------------------------


def _methods(backend, shape):
    custom = backend.asarray(np.arange(math.prod(shape)).reshape(shape) % 3 != 0)
    return {
        "Identity": ap.Identity(),
        "L1Unstructured": ap.L1Unstructured(0.4),
        "RandomUnstructured": ap.RandomUnstructured(0.4, seed=0),
        "LnStructured": ap.LnStructured(0.5, 2, dim=0),
        "RandomStructured": ap.RandomStructured(0.5, dim=-1, seed=0),
        "CustomFromMask": ap.CustomFromMask(custom),
    }


METHOD_NAMES = list(_methods.__code__.co_consts[-1]) if False else [
    "Identity", "L1Unstructured", "RandomUnstructured", "LnStructured", "RandomStructured", "CustomFromMask"
]


@pytest.mark.parametrize("mask_dtype", ["bool", "float32", "float64", "float16", "uint8"])
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_mask_dtype_follows_default_mask(backend, name, mask_dtype):
    lighter_on_jax(backend, mask_dtype not in ("bool", "float32"))
    if not backend.has_dtype(mask_dtype):
        pytest.skip(f"no {mask_dtype}")
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    t = backend.asarray(x)
    method = _methods(backend, x.shape)[name]
    default = ones(backend, x.shape, mask_dtype)
    mask = method.compute_mask(t, default)
    assert mask.dtype == backend.dtype(mask_dtype)
    assert apc.array_namespace(mask) is apc.array_namespace(t)
    assert apc.device(mask) == apc.device(t)
    assert tuple(mask.shape) == x.shape
    # the same entries as the boolean mask; in containers too
    as_bool = to_numpy(method.compute_mask(t, ones(backend, x.shape))).astype(bool)
    np.testing.assert_array_equal(to_numpy(mask).astype(bool), as_bool)
    assert set(np.unique(to_numpy(mask)).tolist()) <= {0, 1}
    c = ap.PruningContainer(method)
    cm = c.compute_mask(t, default)
    assert cm.dtype == backend.dtype(mask_dtype)
    np.testing.assert_array_equal(to_numpy(cm).astype(bool), as_bool)


def test_functional_mask_is_boolean_without_default(backend):
    t = backend.asarray(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))
    for mask in [
        ap.identity(t),
        ap.l1_unstructured(t, 0.5),
        ap.random_unstructured(t, 0.5, seed=1),
        ap.ln_structured(t, 0.5, 1, 0),
        ap.random_structured(t, 0.5, 1, seed=1),
        ap.custom_from_mask(t, backend.asarray(np.eye(4, 6, dtype=np.float32))),
    ]:
        assert mask.dtype == backend.dtype("bool")
        assert apc.array_namespace(mask) is apc.array_namespace(t)
        assert apc.device(mask) == apc.device(t)
    np.testing.assert_array_equal(to_numpy(ap.identity(t)), np.ones((4, 6), bool))
    np.testing.assert_array_equal(
        to_numpy(ap.custom_from_mask(t, backend.asarray(np.eye(4, 6, dtype=np.float32)))), np.eye(4, 6, dtype=bool)
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_input_dtypes(backend, dtype):
    lighter_on_jax(backend, dtype in ("float32", "float64"))
    if not backend.has_dtype(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    x = np.random.default_rng(1).standard_normal((8, 10)).astype(np.float32)
    t = backend.asarray(x, dtype)
    host = to_numpy(t).astype(np.float64)  # the values after rounding to `dtype`
    # unstructured: the stable reference on the rounded values (rounding may create ties)
    for k in (0, 1, 17, 40, 79, 80):
        mask = ap.l1_unstructured(t, k)
        assert mask.dtype == backend.dtype("bool")
        np.testing.assert_array_equal(to_numpy(mask), reference_keep([host], k)[0], err_msg=f"k={k}")
    # structured: exact count, whole channels
    m = to_numpy(ap.ln_structured(t, 0.3, 2, 1))
    kept = m.any(axis=0)
    assert int((~kept).sum()) == 3
    np.testing.assert_array_equal(m, np.broadcast_to(kept, m.shape))
    # float default masks of the same dtype keep that dtype
    fm = ap.L1Unstructured(5).compute_mask(t, ones(backend, x.shape, dtype))
    assert fm.dtype == backend.dtype(dtype)
    assert int((to_numpy(fm) == 0).sum()) == 5
    pruned = ap.L1Unstructured(5).prune(t)
    assert pruned.dtype == t.dtype
    assert int((to_numpy(pruned) == 0).sum()) >= 5


def test_integer_scores(backend):
    t = backend.asarray(np.array([[3, -1, 2], [0, -5, 1]], dtype=np.int32))
    m = to_numpy(ap.l1_unstructured(t, 3))
    np.testing.assert_array_equal(m, np.array([[1, 0, 1], [0, 1, 0]], bool))
    # ties among integers: -1 at flat 1 and 1 at flat 5 -> flat 1 first
    m = to_numpy(ap.l1_unstructured(t, 2))
    np.testing.assert_array_equal(m, np.array([[1, 0, 1], [0, 1, 1]], bool))


# --------------------------------------------------------------------------------------
# Degenerate sizes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)])
def test_zero_size(backend, shape):
    lighter_on_jax(backend, shape in ((0, 3), (2, 0, 4)))
    t = backend.asarray(np.ones(shape, np.float32))
    for amount in (0, 0.0, 0.5, 1.0):
        m = ap.l1_unstructured(t, amount)
        assert tuple(m.shape) == shape and m.dtype == backend.dtype("bool")
        m = ap.random_unstructured(t, amount, seed=0)
        assert tuple(m.shape) == shape
        m = ap.L1Unstructured(amount).compute_mask(t, ones(backend, shape, "float32"))
        assert tuple(m.shape) == shape and m.dtype == backend.dtype("float32")
    with pytest.raises(ValueError):
        ap.l1_unstructured(t, 1)
    assert tuple(ap.identity(t).shape) == shape
    if len(shape) >= 2:
        channels = shape[0]
        m = ap.ln_structured(t, 0.5, 2, 0)
        assert tuple(m.shape) == shape
        m = ap.random_structured(t, channels, 0, seed=0)
        assert tuple(m.shape) == shape
        with pytest.raises(ValueError):
            ap.ln_structured(t, channels + 1, 2, 0)


def test_one_element(backend):
    t = backend.asarray(np.array([-3.0], np.float32))
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, 0.5)), [True])  # round(0.5) == 0
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, 0.51)), [False])
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, 1)), [False])
    np.testing.assert_array_equal(to_numpy(ap.l1_unstructured(t, 1.0)), [False])
    np.testing.assert_array_equal(to_numpy(ap.random_unstructured(t, 0.5, seed=0)), [True])
    np.testing.assert_array_equal(to_numpy(ap.random_unstructured(t, 1, seed=0)), [False])
    t2 = backend.asarray(np.array([[2.0]], np.float32))
    np.testing.assert_array_equal(to_numpy(ap.ln_structured(t2, 0.5, 1, 0)), [[True]])
    np.testing.assert_array_equal(to_numpy(ap.ln_structured(t2, 1, 1, 0)), [[False]])
    np.testing.assert_array_equal(to_numpy(ap.random_structured(t2, 1.0, 1, seed=0)), [[False]])


def test_zero_dim(backend):
    t = backend.asarray(np.array(2.5, np.float32))
    assert to_numpy(ap.l1_unstructured(t, 0)).tolist() is True
    assert to_numpy(ap.l1_unstructured(t, 1)).tolist() is False
    assert tuple(ap.l1_unstructured(t, 1).shape) == ()


# --------------------------------------------------------------------------------------
# Inputs are never written
# --------------------------------------------------------------------------------------


def _readonly(a):
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("size", [24, 1 << 16])
def test_numpy_read_only_inputs(size):
    rng = np.random.default_rng(3)
    shape = (size // 8, 8)
    t = _readonly(rng.standard_normal(shape).astype(np.float32))
    scores = _readonly(rng.standard_normal(shape).astype(np.float32))
    masks = {
        "bool": _readonly(rng.random(shape) < 0.8),
        "float32": _readonly((rng.random(shape) < 0.8).astype(np.float32)),
    }
    for default in masks.values():
        before = default.copy()
        ap.l1_unstructured(t, 0.3, default_mask=default, importance_scores=scores)
        ap.l1_unstructured(t, 0.3, default_mask=default)
        ap.random_unstructured(t, 0.3, default_mask=default, seed=0)
        ap.ln_structured(t, 0.3, 2, 1, default_mask=default, importance_scores=scores)
        ap.random_structured(t, 0.3, 0, default_mask=default, seed=0)
        ap.custom_from_mask(t, masks["bool"], default_mask=default)
        for m in _methods_np(shape):
            m.compute_mask(t, default)
            m.prune(t, default_mask=default, importance_scores=scores)
            ap.PruningContainer(m).compute_mask(scores, default)
        ap.global_unstructured(
            [t, scores], ap.L1Unstructured, [scores, None], default_masks=[default, None], amount=0.5
        )
        np.testing.assert_array_equal(default, before)
        assert not default.flags.writeable


def _methods_np(shape):
    return [
        ap.Identity(),
        ap.L1Unstructured(0.4),
        ap.RandomUnstructured(0.4, seed=0),
        ap.LnStructured(0.5, 1, 0),
        ap.RandomStructured(0.5, 1, seed=0),
        ap.CustomFromMask(_readonly(np.ones(shape, bool))),
    ]


@pytest.mark.skip_backend("jax", reason="JAX arrays cannot be written: test_jax_arrays_are_accepted")
def test_inputs_unchanged_on_every_backend(backend):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    s = rng.standard_normal((6, 5)).astype(np.float32)
    d = (rng.random((6, 5)) < 0.7).astype(np.float32)
    t, scores, default = backend.asarray(x), backend.asarray(s), backend.asarray(d)
    for method in _methods(backend, x.shape).values():
        method.compute_mask(t, default)
        method.prune(t, default_mask=default, importance_scores=scores)
        ap.PruningContainer(method).compute_mask(scores, default)
        ap.PruningContainer(method).compute_mask(scores, backend.xp.astype(default, backend.dtype("bool")))
    ap.global_unstructured([t, scores], ap.L1Unstructured, default_masks=[default, default], amount=0.5)
    np.testing.assert_array_equal(to_numpy(t), x)
    np.testing.assert_array_equal(to_numpy(scores), s)
    np.testing.assert_array_equal(to_numpy(default), d)


def test_jax_arrays_are_accepted():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4) - 5)
    m = ap.l1_unstructured(x, 3)
    np.testing.assert_array_equal(np.asarray(m), reference_keep([np.asarray(x)], 3)[0])
    assert type(m).__module__.split(".")[0] in ("jax", "jaxlib")


def test_torch_tensors_requiring_grad():
    torch = pytest.importorskip("torch")
    w = torch.randn(6, 4, requires_grad=True)
    m = ap.l1_unstructured(w, 0.5)
    assert m.dtype == torch.bool and int((~m).sum()) == 12
    m = ap.ln_structured(w, 0.5, 2, 0)
    assert int((~m.any(dim=1)).sum()) == 3
    out = ap.L1Unstructured(0.5).prune(w)
    out.sum().backward()
    assert int((w.grad == 0).sum()) == 12


# --------------------------------------------------------------------------------------
# Random methods
# --------------------------------------------------------------------------------------


def test_random_methods_seed_reproducible(backend):
    t = backend.asarray(np.ones((20, 30), np.float32))
    a = to_numpy(ap.random_unstructured(t, 0.37, seed=11))
    b = to_numpy(ap.random_unstructured(t, 0.37, seed=11))
    c = to_numpy(ap.random_unstructured(t, 0.37, seed=12))
    np.testing.assert_array_equal(a, b)
    assert int((~a).sum()) == round(0.37 * 600)
    assert not np.array_equal(a, c)
    a = to_numpy(ap.random_structured(t, 0.5, 1, seed=11))
    b = to_numpy(ap.random_structured(t, 0.5, 1, seed=11))
    np.testing.assert_array_equal(a, b)
    assert int((~a.any(axis=0)).sum()) == 15
    c = [to_numpy(ap.random_structured(t, 0.5, 1, seed=s)) for s in range(5)]
    assert any(not np.array_equal(a, ci) for ci in c)


def test_random_methods_generators(backend):
    t_np = np.ones((10, 10), np.float32)
    t = backend.asarray(t_np)
    if backend.backend is Backend.NUMPY or backend.backend is Backend.ARRAY_API_STRICT:
        make = lambda s: np.random.default_rng(s)  # noqa: E731
    elif backend.backend is Backend.TORCH:
        import torch

        make = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    elif backend.backend is Backend.JAX:
        import jax

        make = lambda s: jax.random.key(s)  # noqa: E731
    else:  # pragma: no cover
        import cupy

        make = lambda s: cupy.random.default_rng(s)  # noqa: E731
    a = to_numpy(ap.random_unstructured(t, 0.5, generator=make(3)))
    b = to_numpy(ap.random_unstructured(t, 0.5, generator=make(3)))
    np.testing.assert_array_equal(a, b)
    assert int((~a).sum()) == 50
    m = to_numpy(ap.random_structured(t, 3, 0, generator=make(4)))
    assert int((~m.any(axis=1)).sum()) == 3


def test_random_methods_reject_bad_sources():
    with pytest.raises(TypeError):
        ap.RandomUnstructured(0.5, seed=1, generator=np.random.default_rng(1))
    with pytest.raises(TypeError):
        ap.RandomStructured(0.5, 0, seed=1, generator=np.random.default_rng(1))
    with pytest.raises(TypeError):
        ap.RandomUnstructured(0.5, seed=1.5)
    with pytest.raises(TypeError):
        ap.RandomUnstructured(0.5, seed="1")
    with pytest.raises(TypeError):
        ap.random_unstructured(np.ones(4), 0.5, generator=object())


def test_random_unstructured_only_remaining_in_container(backend):
    t = backend.asarray(np.ones((10, 10), np.float32))
    mask = ones(backend, (10, 10), "float32")
    c = ap.PruningContainer()
    pruned = 0
    for i, amount in enumerate([0.5, 0.5, 10, 0.2]):
        c.add_pruning_method(ap.RandomUnstructured(amount, seed=i))
        new = c.compute_mask(t, mask)
        remaining = 100 - pruned
        step = amount if isinstance(amount, int) else round(amount * remaining)
        assert int((to_numpy(new) == 0).sum()) == pruned + step
        assert np.all(to_numpy(new)[to_numpy(mask) == 0] == 0)
        pruned += step
        mask = new


# --------------------------------------------------------------------------------------
# Identity and CustomFromMask
# --------------------------------------------------------------------------------------


def test_identity(backend):
    t = backend.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    d = np.array([[1, 0, 1], [0, 1, 1]], np.float32)
    m = ap.Identity().compute_mask(t, backend.asarray(d))
    np.testing.assert_array_equal(to_numpy(m), d)
    np.testing.assert_array_equal(to_numpy(ap.identity(t, default_mask=backend.asarray(d))), d)
    np.testing.assert_array_equal(to_numpy(ap.Identity().prune(t)), np.arange(6).reshape(2, 3))
    assert ap.Identity.PRUNING_TYPE == "unstructured"


def test_custom_from_mask(backend):
    t = backend.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    custom = np.array([[1, 1, 0], [0, 1, 1]], np.float32)
    d = np.array([[1, 0, 1], [1, 1, 1]], np.float32)
    m = ap.CustomFromMask(backend.asarray(custom)).compute_mask(t, backend.asarray(d))
    np.testing.assert_array_equal(to_numpy(m), custom * d)
    assert m.dtype == backend.dtype("float32")
    # boolean custom mask on a float default, and a float custom mask on a bool default
    m = ap.CustomFromMask(backend.asarray(custom.astype(bool))).compute_mask(t, backend.asarray(d))
    np.testing.assert_array_equal(to_numpy(m), custom * d)
    m = ap.CustomFromMask(backend.asarray(custom)).compute_mask(t, backend.asarray(d.astype(bool)))
    assert m.dtype == backend.dtype("bool")
    np.testing.assert_array_equal(to_numpy(m), (custom * d).astype(bool))
    # a NumPy mask applied to arrays of another library is moved there
    m = ap.custom_from_mask(t, custom)
    assert apc.array_namespace(m) is apc.array_namespace(t)
    np.testing.assert_array_equal(to_numpy(m), custom.astype(bool))
    with pytest.raises(ValueError):
        ap.CustomFromMask(backend.asarray(np.ones((3, 2), np.float32))).compute_mask(t, backend.asarray(d))
    assert ap.CustomFromMask.PRUNING_TYPE == "global"


# --------------------------------------------------------------------------------------
# PruningContainer
# --------------------------------------------------------------------------------------


def test_container_api():
    a, b = ap.L1Unstructured(0.1), ap.LnStructured(0.2, 1, 0)
    c = ap.PruningContainer(a, b)
    assert len(c) == 2 and c[0] is a and c[1] is b and list(c) == [a, b]
    assert list(ap.PruningContainer([a, b])) == [a, b]
    assert list(ap.PruningContainer(a)) == [a]
    c.add_pruning_method(None)
    assert len(c) == 2
    with pytest.raises(TypeError):
        c.add_pruning_method("L1Unstructured")
    with pytest.raises(TypeError):
        c.add_pruning_method(ap.L1Unstructured)  # the class, not an instance
    other = ap.Identity()
    other._tensor_name = "bias"
    with pytest.raises(ValueError):
        c.add_pruning_method(other)
    named = ap.Identity()
    named._tensor_name = "weight"
    c2 = ap.PruningContainer(named)
    assert c2._tensor_name == "weight"
    with pytest.raises(ValueError):
        c2.add_pruning_method(ap.Identity())
    with pytest.raises(IndexError):
        ap.PruningContainer().compute_mask(np.ones(3), np.ones(3))
    assert "L1Unstructured" in repr(c)


def test_container_unstructured_chain_exact_counts(backend):
    x = np.random.default_rng(7).standard_normal((10, 10)).astype(np.float32)
    t = backend.asarray(x)
    mask = ones(backend, x.shape)
    c = ap.PruningContainer()
    expected_zeros = 0
    for amount in (0.5, 0.5, 3, 0.1, 1.0):
        c.add_pruning_method(ap.L1Unstructured(amount))
        new = c.compute_mask(t, mask)
        remaining = 100 - expected_zeros
        expected_zeros += amount if isinstance(amount, int) else round(amount * remaining)
        got = to_numpy(new)
        assert int((~got).sum()) == expected_zeros
        assert not got[~to_numpy(mask)].any()  # pruned stay pruned
        # the new ones are the smallest of what remained
        np.testing.assert_array_equal(got, reference_keep([x], expected_zeros)[0])
        mask = new
    assert not to_numpy(mask).any()


def test_container_structured_chain_exact_counts(backend):
    x = np.random.default_rng(8).standard_normal((4, 10)).astype(np.float32)
    t = backend.asarray(x)
    mask = ones(backend, x.shape, "float32")
    c = ap.PruningContainer(ap.LnStructured(0.3, 2, -1))
    mask = c.compute_mask(t, mask)  # prunes 3 of 10
    kept = to_numpy(mask).any(axis=0)
    assert int((~kept).sum()) == 3
    c.add_pruning_method(ap.LnStructured(0.5, 2, 1))  # 0.5 of remaining 7: round(3.5) = 4
    new = c.compute_mask(t, mask)
    kept2 = to_numpy(new).any(axis=0)
    assert int((~kept2).sum()) == 7 and not kept2[~kept].any()
    norms = np.linalg.norm(x, axis=0)
    np.testing.assert_array_equal(np.sort(np.flatnonzero(kept2)), np.sort(np.argsort(norms)[7:]))


def test_container_mixed_chain(backend):
    x = np.array([[0.1, 5.0, 0.2, 4.0], [0.3, 6.0, 0.4, 3.0], [7.0, 0.5, 8.0, 0.6]], dtype=np.float32)
    t = backend.asarray(x)
    mask = ones(backend, x.shape)
    c = ap.PruningContainer(ap.L1Unstructured(4))
    mask = c.compute_mask(t, mask)
    expect = np.array([[0, 1, 0, 1], [0, 1, 0, 1], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(to_numpy(mask), expect)
    # rows: all three still alive; prune the row of smallest L1 norm among them
    c.add_pruning_method(ap.LnStructured(1, 1, 0))  # row norms: 9.3, 9.7, 16.1 -> row 0
    mask = c.compute_mask(t, mask)
    expect[0] = False
    np.testing.assert_array_equal(to_numpy(mask), expect)
    # columns: all four still have an unpruned entry; 0.5 of 4 -> 2. Norms are of the full
    # scores t (as in torch): 7.4, 11.5, 8.6, 7.6 -> columns 0 and 3
    c.add_pruning_method(ap.LnStructured(0.5, 1, 1))
    mask = c.compute_mask(t, mask)
    expect[:, [0, 3]] = False
    np.testing.assert_array_equal(to_numpy(mask), expect)
    # remaining entries: (1,1)=6.0, (2,1)=0.5, (2,2)=8.0; prune the smallest one
    c.add_pruning_method(ap.L1Unstructured(1))
    mask = c.compute_mask(t, mask)
    expect[2, 1] = False
    np.testing.assert_array_equal(to_numpy(mask), expect)
    c.add_pruning_method(ap.CustomFromMask(backend.asarray(np.array([[1, 0, 1, 1]] * 3, np.float32))))
    mask = c.compute_mask(t, mask)
    expect[:, 1] = False
    np.testing.assert_array_equal(to_numpy(mask), expect)
    assert to_numpy(mask).sum() == 1 and to_numpy(mask)[2, 2]
    c.add_pruning_method(ap.Identity())
    np.testing.assert_array_equal(to_numpy(c.compute_mask(t, mask)), expect)


def _and(mask, keep):
    xp = apc.array_namespace(mask)
    if xp.isdtype(mask.dtype, "bool"):
        return mask & keep
    return mask * xp.astype(keep, mask.dtype)


class FirstK(ap.BasePruningMethod):
    """A user method the core does not know: prunes the first k entries it is given."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, k):
        self.k = k

    def compute_mask(self, t, default_mask):
        xp = apc.array_namespace(t)
        idx = xp.arange(math.prod(t.shape), device=apc.device(t))
        keep = xp.reshape(idx >= self.k, t.shape)
        return _and(default_mask, keep)


class FirstChannels(ap.BasePruningMethod):
    """A user structured method: prunes the first k channels along dim."""

    PRUNING_TYPE = "structured"

    def __init__(self, k, dim):
        self.k, self.dim = k, dim

    def compute_mask(self, t, default_mask):
        xp = apc.array_namespace(t)
        shape = [1] * t.ndim
        shape[self.dim] = t.shape[self.dim]
        keep = xp.reshape(xp.arange(t.shape[self.dim], device=apc.device(t)) >= self.k, tuple(shape))
        return _and(default_mask, keep)


class NoDim:
    PRUNING_TYPE = "structured"

    def compute_mask(self, t, default_mask):  # pragma: no cover - never reached
        return default_mask


class Weird:
    PRUNING_TYPE = "diagonal"

    def compute_mask(self, t, default_mask):  # pragma: no cover - never reached
        return default_mask


def test_container_with_user_methods(backend):
    t = backend.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    d = np.array([[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
    # unstructured: acts on the entries still at 1, in flat order
    m = to_numpy(ap.PruningContainer(FirstK(3)).compute_mask(t, backend.asarray(d)))
    e = d.copy()
    e[0, 1] = e[0, 2] = e[1, 0] = 0
    np.testing.assert_array_equal(m, e)
    # structured: acts on channels not entirely pruned
    d2 = d.copy()
    d2[:, 1] = 0
    m = to_numpy(ap.PruningContainer(FirstChannels(2, 1)).compute_mask(t, backend.asarray(d2)))
    e = d2.copy()
    e[:, [0, 2]] = 0
    np.testing.assert_array_equal(m, e)
    m = to_numpy(ap.PruningContainer(FirstChannels(1, -2)).compute_mask(t, backend.asarray(d2)))
    e = d2.copy()
    e[0] = 0
    np.testing.assert_array_equal(m, e)
    with pytest.raises(AttributeError):
        combine_masks(NoDim(), t, backend.asarray(d))
    with pytest.raises(ValueError):
        combine_masks(Weird(), t, backend.asarray(d))
    # plain duck-typed objects may join a container
    c = ap.PruningContainer()
    c.add_pruning_method(NoDim())
    with pytest.raises(AttributeError):
        c.compute_mask(t, backend.asarray(d))


def test_prune_returns_masked_copy(backend):
    x = np.array([[0.3, -0.1], [0.2, 0.0]], np.float32)
    t = backend.asarray(x)
    out = ap.L1Unstructured(2).prune(t)
    assert out.dtype == t.dtype
    np.testing.assert_array_equal(to_numpy(out), np.array([[0.3, 0.0], [0.2, 0.0]], np.float32))
    d = backend.asarray(np.array([[0, 1], [1, 1]], np.float32))
    out = ap.L1Unstructured(1).prune(t, default_mask=d)
    np.testing.assert_array_equal(to_numpy(out), np.array([[0.0, -0.1], [0.2, 0.0]], np.float32))
    np.testing.assert_array_equal(to_numpy(t), x)


# --------------------------------------------------------------------------------------
# array-api-strict: every method and verb through the standard alone
# --------------------------------------------------------------------------------------


def test_every_method_on_array_api_strict():
    xs = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)
    t = xs.asarray(x)
    s = xs.asarray(rng.standard_normal((6, 5, 4)).astype(np.float32))
    for default in (xs.ones(t.shape, dtype=xs.bool), xs.ones(t.shape, dtype=xs.float32)):
        methods = [
            ap.Identity(),
            ap.L1Unstructured(0.3),
            ap.RandomUnstructured(0.3, seed=0),
            ap.RandomUnstructured(0.3, generator=np.random.default_rng(0)),
            ap.RandomStructured(0.3, 1, seed=0),
        ] + [ap.LnStructured(0.2, n, d) for n in (1, 2, 3, INF, -INF, "fro", "nuc", 0) for d in (0, -1)]
        methods.append(ap.CustomFromMask(xs.asarray(rng.random((6, 5, 4)) < 0.5)))
        methods += [FirstK(4), FirstChannels(1, 1)]
        c = ap.PruningContainer()
        mask = default
        for m in methods:
            out = m.compute_mask(s, default)
            assert isinstance(out, type(t)) and out.dtype == default.dtype
            c.add_pruning_method(m)
            new = c.compute_mask(s, mask)
            assert isinstance(new, type(t)) and new.dtype == default.dtype
            assert not np.any(np.from_dlpack(new)[~np.from_dlpack(mask).astype(bool)])
            mask = new
            if hasattr(m, "amount"):
                assert isinstance(m.prune(t, importance_scores=s), type(t))
        assert int(xs.count_nonzero(mask)) < 120
    for f in (
        lambda: ap.l1_unstructured(t, 0.4, importance_scores=s),
        lambda: ap.random_unstructured(t, 0.4, seed=1),
        lambda: ap.ln_structured(t, 0.4, 2, 0, importance_scores=s),
        lambda: ap.random_structured(t, 0.4, 2, seed=1),
        lambda: ap.identity(t),
        lambda: ap.custom_from_mask(t, xs.ones(t.shape)),
        lambda: ap.global_unstructured([t, s], ap.L1Unstructured, amount=0.4)[1],
        lambda: ap.global_unstructured([t, s], FirstK, k=7)[0],
        lambda: ap.global_unstructured({"a": t}, ap.RandomUnstructured, amount=0.4, seed=1)["a"],
        lambda: ap.kth_smallest(t, 5),
    ):
        assert isinstance(f(), type(t))
    np.testing.assert_array_equal(np.from_dlpack(ap.l1_unstructured(t, 37)), reference_keep([x], 37)[0])
