"""Global pruning: one ranking across many arrays, without concatenating them."""

from __future__ import annotations

import array_api_compat as apc
import numpy as np
import pytest

import arrayprune as ap
from conftest import Backend, reference_keep, to_numpy

NOT_JAX = pytest.mark.skip_backend("jax", reason="XLA compiles per shape: JAX runs the smaller tests")


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((8, 5)).astype(np.float32),
        rng.standard_normal(7).astype(np.float32),
        rng.standard_normal((2, 3, 4)).astype(np.float32),
    ]


def test_list_and_dict(backend):
    xs = _arrays()
    arrays = [backend.asarray(x) for x in xs]
    total = sum(x.size for x in xs)
    for amount, k in [(0.3, round(0.3 * total)), (0.5, round(0.5 * total)), (10, 10), (0, 0), (1.0, total)]:
        got = ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount)
        want = reference_keep(xs, k)
        assert isinstance(got, list) and len(got) == 3
        for g, w, a in zip(got, want, arrays, strict=True):
            assert g.dtype == backend.dtype("bool")
            assert apc.array_namespace(g) is apc.array_namespace(a)
            assert apc.device(g) == apc.device(a)
            np.testing.assert_array_equal(to_numpy(g), w, err_msg=f"amount={amount}")
        d = ap.global_unstructured(dict(zip("abc", arrays, strict=True)), ap.L1Unstructured, amount=amount)
        assert isinstance(d, dict) and list(d) == ["a", "b", "c"]
        for key, w in zip("abc", want, strict=True):
            np.testing.assert_array_equal(to_numpy(d[key]), w)


def test_ties_across_arrays(backend):
    a = backend.asarray(np.ones(3, np.float32))
    b = backend.asarray(np.ones((2, 1), np.float32))
    got = ap.global_unstructured([a, b], ap.L1Unstructured, amount=4)
    np.testing.assert_array_equal(to_numpy(got[0]), [False, False, False])
    np.testing.assert_array_equal(to_numpy(got[1]), [[False], [True]])
    got = ap.global_unstructured({"b": b, "a": a}, ap.L1Unstructured, amount=1)  # mapping order
    np.testing.assert_array_equal(to_numpy(got["b"]), [[False], [True]])
    np.testing.assert_array_equal(to_numpy(got["a"]), [True, True, True])


def test_importance_scores(backend):
    xs = _arrays(1)
    arrays = [backend.asarray(x) for x in xs]
    rng = np.random.default_rng(2)
    score1 = rng.standard_normal(7).astype(np.float32)
    got = ap.global_unstructured(arrays, ap.L1Unstructured, [None, backend.asarray(score1), None], amount=20)
    want = reference_keep([xs[0], score1, xs[2]], 20)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(to_numpy(g), w)
    got = ap.global_unstructured(
        dict(zip("abc", arrays, strict=True)), ap.L1Unstructured, {"b": backend.asarray(score1)}, amount=20
    )
    for key, w in zip("abc", want, strict=True):
        np.testing.assert_array_equal(to_numpy(got[key]), w)


def test_iterated_with_default_masks(backend):
    xs = _arrays(3)
    arrays = [backend.asarray(x) for x in xs]
    total = sum(x.size for x in xs)
    masks = None
    pruned = 0
    for amount in (0.2, 0.5, 5, 0.25):
        remaining = total - pruned
        step = amount if isinstance(amount, int) else round(amount * remaining)
        new = ap.global_unstructured(arrays, ap.L1Unstructured, default_masks=masks, amount=amount)
        pruned += step
        want = reference_keep(xs, pruned)  # iterated L1 = L1 of the cumulated count
        for i, (g, w) in enumerate(zip(new, want, strict=True)):
            np.testing.assert_array_equal(to_numpy(g).astype(bool), w, err_msg=f"amount={amount}")
            if masks is not None:
                assert not to_numpy(g).astype(bool)[~to_numpy(masks[i]).astype(bool)].any()
        # float masks from then on: the dtype of each default mask is kept
        masks = [backend.xp.astype(m, backend.dtype("float32")) for m in new]
    assert masks[0].dtype == backend.dtype("float32")
    with pytest.raises(ValueError):  # more than what remains
        ap.global_unstructured(arrays, ap.L1Unstructured, default_masks=masks, amount=total - pruned + 1)


def test_mixed_default_mask_dtypes(backend):
    xs = _arrays(4)
    arrays = [backend.asarray(x) for x in xs]
    d0 = backend.asarray((np.arange(40).reshape(8, 5) % 4 != 0).astype(np.float32))
    d2 = backend.asarray(np.arange(24).reshape(2, 3, 4) % 3 != 0)
    got = ap.global_unstructured(arrays, ap.L1Unstructured, default_masks=[d0, None, d2], amount=0.5)
    assert got[0].dtype == backend.dtype("float32")
    assert got[1].dtype == backend.dtype("bool")
    assert got[2].dtype == backend.dtype("bool")
    elig = [to_numpy(d0) == 1, None, to_numpy(d2)]
    n_elig = 30 + 7 + 16
    want = reference_keep(xs, round(0.5 * n_elig), elig)
    np.testing.assert_array_equal(to_numpy(got[0]), (want[0] & elig[0]).astype(np.float32))
    np.testing.assert_array_equal(to_numpy(got[1]), want[1])
    np.testing.assert_array_equal(to_numpy(got[2]), want[2] & elig[2])


def test_random_unstructured_counts_and_seed(backend):
    xs = _arrays(5)
    arrays = [backend.asarray(x) for x in xs]
    total = sum(x.size for x in xs)
    a = ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.4, seed=3)
    b = ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.4, seed=3)
    assert sum(int((~to_numpy(m)).sum()) for m in a) == round(0.4 * total)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
    c = ap.global_unstructured(arrays, ap.RandomUnstructured, default_masks=a, amount=0.5, seed=4)
    assert sum(int((~to_numpy(m)).sum()) for m in c) == round(0.4 * total) + round(0.5 * (total - round(0.4 * total)))
    for old, new in zip(a, c, strict=True):
        assert not to_numpy(new)[~to_numpy(old)].any()


class Firsts(ap.BasePruningMethod):
    """A user unstructured method: prunes the first k entries of what it is given."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, k):
        self.k = k

    def compute_mask(self, t, default_mask):
        xp = apc.array_namespace(t)
        keep = xp.reshape(xp.arange(t.shape[0], device=apc.device(t)) >= self.k, t.shape)
        if xp.isdtype(default_mask.dtype, "bool"):
            return default_mask & keep
        return default_mask * xp.astype(keep, default_mask.dtype)


def test_user_method_concatenates(backend):
    a = backend.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = backend.asarray(np.arange(4, dtype=np.float32))
    got = ap.global_unstructured([a, b], Firsts, k=7)
    np.testing.assert_array_equal(to_numpy(got[0]), np.zeros((2, 3), bool))
    np.testing.assert_array_equal(to_numpy(got[1]), [False, True, True, True])
    d = backend.asarray(np.array([[0, 1, 1], [1, 1, 1]], np.float32))
    got = ap.global_unstructured([a, b], Firsts, default_masks=[d, None], k=2)
    np.testing.assert_array_equal(to_numpy(got[0]), np.array([[0, 0, 0], [1, 1, 1]], np.float32))
    assert got[0].dtype == backend.dtype("float32")
    np.testing.assert_array_equal(to_numpy(got[1]), np.ones(4, bool))


def test_errors():
    a, b = np.ones((2, 3), np.float32), np.ones(4, np.float32)
    with pytest.raises(TypeError):
        ap.global_unstructured([a, b], ap.LnStructured, amount=1, n=2)
    with pytest.raises(TypeError):
        ap.global_unstructured([a, b], ap.CustomFromMask, mask=a)
    with pytest.raises(TypeError):
        ap.global_unstructured(a, ap.L1Unstructured, amount=1)  # an array, not a collection
    with pytest.raises(TypeError):
        ap.global_unstructured("ab", ap.L1Unstructured, amount=1)
    with pytest.raises(ValueError):
        ap.global_unstructured([a, b], ap.L1Unstructured, [None], amount=1)  # wrong length
    with pytest.raises(ValueError):
        ap.global_unstructured([a, b], ap.L1Unstructured, [a, a], amount=1)  # wrong shape
    with pytest.raises(TypeError):
        ap.global_unstructured([a, b], ap.L1Unstructured, {"x": a}, amount=1)
    with pytest.raises(TypeError):
        ap.global_unstructured({"a": a}, ap.L1Unstructured, [a], amount=1)
    with pytest.raises(ValueError):
        ap.global_unstructured({"a": a}, ap.L1Unstructured, {"z": a}, amount=1)  # unknown key
    with pytest.raises(ValueError):
        ap.global_unstructured({"a": a}, ap.L1Unstructured, default_masks={"a": b.astype(bool)}, amount=1)
    with pytest.raises(ValueError):
        ap.global_unstructured([a, b], ap.L1Unstructured, amount=11)
    with pytest.raises(ValueError):
        ap.global_unstructured([a, b], ap.L1Unstructured, amount=1.5)
    assert ap.global_unstructured([], ap.L1Unstructured, amount=0.5) == []
    assert ap.global_unstructured({}, ap.L1Unstructured, amount=0.5) == {}


def test_generator_input():
    xs = _arrays(6)
    got = ap.global_unstructured((x for x in xs), ap.L1Unstructured, amount=9)
    for g, w in zip(got, reference_keep(xs, 9), strict=True):
        np.testing.assert_array_equal(g, w)


@NOT_JAX
def test_equals_pruning_the_concatenation(backend):
    rng = np.random.default_rng(7)
    xs = [rng.integers(-4, 5, s).astype(np.float32) for s in [(30, 20), (50,), (3, 4, 5)]]
    arrays = [backend.asarray(x) for x in xs]
    flat = backend.asarray(np.concatenate([x.reshape(-1) for x in xs]))
    for amount in (0.1, 0.5, 0.77):
        got = ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount)
        whole = to_numpy(ap.l1_unstructured(flat, amount))
        np.testing.assert_array_equal(np.concatenate([to_numpy(g).reshape(-1) for g in got]), whole)


def test_read_only_numpy_inputs():
    xs = _arrays(8)
    masks = [np.ones(x.shape, np.float32) for x in xs]
    for a in xs + masks:
        a.flags.writeable = False
    got = ap.global_unstructured(xs, ap.L1Unstructured, xs, default_masks=masks, amount=0.5)
    for g, w in zip(got, reference_keep(xs, round(0.5 * sum(x.size for x in xs))), strict=True):
        np.testing.assert_array_equal(g, w.astype(np.float32))
    for m in masks:
        assert (m == 1).all()


def test_large_arrays_bracket(backend, monkeypatch):
    if backend.backend is Backend.JAX:
        pytest.skip("JAX covered by the small tests")
    from arrayprune.selection import bracket

    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((256, 300)).astype(np.float32), rng.standard_normal(20_000).astype(np.float32)]
    xs[1][::2] = 0.0
    arrays = [backend.asarray(x) for x in xs]
    got = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.6)
    for g, w in zip(got, reference_keep(xs, round(0.6 * (76_800 + 20_000))), strict=True):
        np.testing.assert_array_equal(to_numpy(g), w)


def test_random_global_arrays_draw_independently(backend):
    # one seeded stream across arrays: same-shaped arrays do not get the same mask
    arrays = [backend.asarray(np.ones((10, 10), np.float32)) for _ in range(3)]
    got = [to_numpy(m) for m in ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=5)]
    assert sum(int((~m).sum()) for m in got) == 150
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2])
    again = [to_numpy(m) for m in ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=5)]
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(a, b)
