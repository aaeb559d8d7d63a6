"""Amount and dimension validation, and the number of units pruned (PyTorch's rules)."""

from __future__ import annotations

import fractions
import math

import numpy as np
import pytest

import arrayprune as ap
from arrayprune import amount as am
from conftest import to_numpy

UNSTRUCTURED = [ap.L1Unstructured, ap.RandomUnstructured]

# JAX compiles every operation anew for each new shape (about a second each): the
# count grids run elsewhere on JAX (test_methods, test_properties).
NOT_JAX = pytest.mark.skip_backend("jax", reason="XLA compiles per shape: covered by the smaller JAX tests")


def _ln(amount, dim=-1):
    return ap.LnStructured(amount, n=2, dim=dim)


def _rand_struct(amount, dim=-1):
    return ap.RandomStructured(amount, dim, seed=0)


STRUCTURED = [_ln, _rand_struct]
ALL_CTORS = [ap.L1Unstructured, lambda a: ap.RandomUnstructured(a, seed=0), _ln, _rand_struct]
CTOR_IDS = ["L1Unstructured", "RandomUnstructured", "LnStructured", "RandomStructured"]


# --------------------------------------------------------------------------------------
# validation at construction
# --------------------------------------------------------------------------------------

VALID = [0, 1, 7, 10**12, 0.0, 0.25, 1.0, np.float32(0.5), np.int64(3), fractions.Fraction(1, 3), True, False]
BAD_TYPE = ["0.5", None, [0.5], (1,), complex(0.5, 0), np.array([0.5]), object()]
BAD_VALUE = [-1, -(10**9), -0.0001, 1.0001, 2.0, math.inf, -math.inf, math.nan, np.int8(-3), np.float64(1.5)]


@pytest.mark.parametrize("amount", VALID, ids=repr)
def test_init_accepts(amount):
    am.validate_pruning_amount_init(amount)
    for ctor in ALL_CTORS:
        assert ctor(amount).amount == amount


@pytest.mark.parametrize("amount", BAD_TYPE, ids=repr)
@pytest.mark.parametrize("ctor", ALL_CTORS, ids=CTOR_IDS)
def test_init_rejects_type(ctor, amount):
    with pytest.raises(TypeError):
        am.validate_pruning_amount_init(amount)
    with pytest.raises(TypeError):
        ctor(amount)


@pytest.mark.parametrize("amount", BAD_VALUE, ids=repr)
@pytest.mark.parametrize("ctor", ALL_CTORS, ids=CTOR_IDS)
def test_init_rejects_value(ctor, amount):
    with pytest.raises(ValueError):
        am.validate_pruning_amount_init(amount)
    with pytest.raises(ValueError):
        ctor(amount)


def test_functional_validates_amount():
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises(ValueError):
        ap.l1_unstructured(x, 1.5)
    with pytest.raises(TypeError):
        ap.l1_unstructured(x, "half")
    with pytest.raises(ValueError):
        ap.ln_structured(x, -1, 2, 0)
    with pytest.raises(ValueError):
        ap.random_structured(x, 3.0, 0)
    with pytest.raises(ValueError):
        ap.random_unstructured(x, -0.5)
    with pytest.raises(ValueError):
        ap.global_unstructured([x], ap.L1Unstructured, amount=-2)


# --------------------------------------------------------------------------------------
# number of units: round(amount * n), Python's round (half to even)
# --------------------------------------------------------------------------------------

# (amount, n, expected) with expected written out: half-to-even cases included.
COUNTS = [
    (0.5, 5, 2),  # round(2.5) == 2
    (0.5, 7, 4),  # round(3.5) == 4
    (0.5, 1, 0),  # round(0.5) == 0
    (0.5, 3, 2),  # round(1.5) == 2
    (0.5, 9, 4),  # round(4.5) == 4
    (0.5, 11, 6),  # round(5.5) == 6
    (0.3, 5, 2),  # 0.3 * 5 == 1.5 exactly -> 2
    (0.7, 5, 4),  # 0.7 * 5 == 3.5 exactly -> 4
    (0.25, 10, 2),  # round(2.5) == 2
    (0.25, 6, 2),  # round(1.5) == 2
    (0.1, 25, 2),  # round(2.5) == 2
    (0.2, 12, 2),  # round(2.4) == 2
    (0.26, 10, 3),  # round(2.6) == 3
    (1.0, 13, 13),
    (0.0, 13, 0),
    (0.999, 1, 1),
    (0.49, 1, 0),
    (0.5, 0, 0),
    (3, 13, 3),
    (0, 0, 0),
    (13, 13, 13),
]


@pytest.mark.parametrize("amount,n,expected", COUNTS)
def test_compute_nparams_toprune(amount, n, expected):
    assert expected == (round(amount * n) if isinstance(amount, float) else amount)
    got = am.compute_nparams_toprune(amount, n)
    assert got == expected
    assert type(got) is int


def test_compute_nparams_toprune_numpy_scalars():
    assert am.compute_nparams_toprune(np.int64(4), 10) == 4
    assert am.compute_nparams_toprune(np.float64(0.5), 5) == 2
    assert am.compute_nparams_toprune(True, 5) == 1


def test_validate_pruning_amount():
    am.validate_pruning_amount(5, 5)
    am.validate_pruning_amount(0, 0)
    am.validate_pruning_amount(0.9, 0)  # a float always fits
    with pytest.raises(ValueError):
        am.validate_pruning_amount(6, 5)
    with pytest.raises(ValueError):
        am.validate_pruning_amount(1, 0)


# End-to-end on every backend, with few distinct sizes (JAX compiles once per shape).
E2E_COUNTS = [c for c in COUNTS if c[1] in (1, 5, 7, 10, 13)]


@NOT_JAX
@pytest.mark.parametrize("amount,n,expected", E2E_COUNTS)
@pytest.mark.parametrize("cls", UNSTRUCTURED, ids=lambda c: c.__name__)
def test_unstructured_prunes_exactly(backend, cls, amount, n, expected):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    t = backend.asarray(x)
    method = cls(amount) if cls is ap.L1Unstructured else cls(amount, seed=1)
    mask = to_numpy(method.compute_mask(t, backend.asarray(np.ones(n, dtype=bool))))
    assert mask.dtype == np.bool_
    assert int((~mask).sum()) == expected
    # functional form, no default mask
    f = ap.l1_unstructured if cls is ap.L1Unstructured else ap.random_unstructured
    assert int((~to_numpy(f(t, amount))).sum()) == expected


@NOT_JAX
@pytest.mark.parametrize("amount,n,expected", E2E_COUNTS)
@pytest.mark.parametrize("ctor", STRUCTURED, ids=["LnStructured", "RandomStructured"])
def test_structured_prunes_exactly(backend, ctor, amount, n, expected):
    x = np.random.default_rng(n).standard_normal((3, n, 2)).astype(np.float32)
    t = backend.asarray(x)
    mask = to_numpy(ctor(amount, dim=1).compute_mask(t, backend.asarray(np.ones(x.shape, dtype=bool))))
    channel_kept = mask.any(axis=(0, 2))
    # whole channels only
    assert np.array_equal(mask, np.broadcast_to(channel_kept[None, :, None], x.shape))
    assert int((~channel_kept).sum()) == expected


def test_half_to_even_on_one_shape(backend):
    """The rounding cases on every backend (JAX included), with one shape."""
    x = np.arange(1, 11, dtype=np.float32)
    t = backend.asarray(x)
    for amount, k in [(0.25, 2), (0.35, 4), (0.45, 4), (0.15, 2), (0.05, 0), (0.55, 6)]:
        assert k == round(amount * 10)
        m = to_numpy(ap.l1_unstructured(t, amount))
        np.testing.assert_array_equal(m, np.arange(10) >= k)
        assert int((~to_numpy(ap.random_unstructured(t, amount, seed=0))).sum()) == k
    t2 = backend.asarray(x.reshape(2, 5))
    for amount, k in [(0.5, 2), (0.7, 4), (0.3, 2), (0.1, 0), (0.9, 4)]:
        assert k == round(amount * 5)
        m = to_numpy(ap.ln_structured(t2, amount, 1, 1))
        np.testing.assert_array_equal(m.any(axis=0), np.arange(5) >= k)
        m = to_numpy(ap.random_structured(t2, amount, 1, seed=0))
        assert int((~m.any(axis=0)).sum()) == k
    with pytest.raises(ValueError):
        ap.l1_unstructured(t, 11)
    with pytest.raises(ValueError):
        ap.random_structured(t2, 6, 1, seed=0)


@NOT_JAX
@pytest.mark.parametrize("ctor", ALL_CTORS, ids=CTOR_IDS)
def test_int_amount_too_large_fails_at_compute_time(backend, ctor):
    x = backend.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    ones = backend.asarray(np.ones((3, 4), dtype=np.float32))
    structured = ctor in (_ln, _rand_struct)
    limit = 4 if structured else 12
    ctor(limit).compute_mask(x, ones)  # exactly as many as there are: fine
    method = ctor(limit + 1)  # construction does not know the size
    with pytest.raises(ValueError):
        method.compute_mask(x, ones)
    with pytest.raises(ValueError):
        method.prune(x)


def test_int_amount_counts_remaining_units_in_containers(backend):
    x = backend.asarray(np.arange(1, 13, dtype=np.float32).reshape(3, 4))
    mask = backend.asarray(np.ones((3, 4), dtype=np.float32))
    c = ap.PruningContainer(ap.L1Unstructured(8))
    mask = c.compute_mask(x, mask)
    c.add_pruning_method(ap.L1Unstructured(5))  # only 4 entries remain
    with pytest.raises(ValueError):
        c.compute_mask(x, mask)
    # structured: remaining channels. Entries 9..12 (row 2) remain -> every column alive.
    c2 = ap.PruningContainer(ap.LnStructured(2, 1, dim=1))
    m2 = c2.compute_mask(x, mask)  # prunes 2 of 4 columns
    c2.add_pruning_method(ap.LnStructured(3, 1, dim=1))  # only 2 columns remain
    with pytest.raises(ValueError):
        c2.compute_mask(x, m2)
    c2.add_pruning_method(ap.LnStructured(2, 1, dim=1))
    assert not to_numpy(c2.compute_mask(x, m2)).any()


@pytest.mark.parametrize("amount", [1.0, 12])
def test_all_pruned(backend, amount):
    x = backend.asarray(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    assert not to_numpy(ap.l1_unstructured(x, amount)).any()
    assert not to_numpy(ap.random_unstructured(x, amount, seed=3)).any()


# --------------------------------------------------------------------------------------
# structured validation: >= 2 dims (ValueError), valid dim (IndexError)
# --------------------------------------------------------------------------------------


def test_validate_structured_pruning():
    am.validate_structured_pruning((2, 3))
    am.validate_structured_pruning((0, 3))
    for shape in [(), (5,), (0,)]:
        with pytest.raises(ValueError):
            am.validate_structured_pruning(shape)


@pytest.mark.parametrize("dim,norm", [(0, 0), (1, 1), (2, 2), (-1, 2), (-2, 1), (-3, 0)])
def test_normalize_dim(dim, norm):
    am.validate_pruning_dim((2, 3, 4), dim)
    assert am.normalize_dim((2, 3, 4), dim) == norm


@pytest.mark.parametrize("dim", [3, 4, -4, -100])
def test_normalize_dim_out_of_range(dim):
    with pytest.raises(IndexError):
        am.validate_pruning_dim((2, 3, 4), dim)


@pytest.mark.parametrize("dim", [1.0, "0", None, True])
def test_normalize_dim_type(dim):
    with pytest.raises(TypeError):
        am.normalize_dim((2, 3, 4), dim)


@pytest.mark.parametrize("ctor", STRUCTURED, ids=["LnStructured", "RandomStructured"])
@pytest.mark.parametrize("shape", [(6,), ()])
def test_structured_needs_two_dims(backend, ctor, shape):
    t = backend.asarray(np.ones(shape, dtype=np.float32))
    with pytest.raises(ValueError):
        ctor(0.5, dim=0).compute_mask(t, backend.asarray(np.ones(shape, dtype=bool)))
    with pytest.raises(ValueError):
        ctor(0.5, dim=0).prune(t)
    f = {_ln: lambda x: ap.ln_structured(x, 0.5, 2, 0), _rand_struct: lambda x: ap.random_structured(x, 0.5, 0)}[ctor]
    with pytest.raises(ValueError):
        f(t)


@pytest.mark.parametrize("ctor", STRUCTURED, ids=["LnStructured", "RandomStructured"])
@pytest.mark.parametrize("dim", [2, 5, -3])
def test_structured_invalid_dim(backend, ctor, dim):
    t = backend.asarray(np.ones((3, 4), dtype=np.float32))
    with pytest.raises(IndexError):
        ctor(1, dim=dim).compute_mask(t, backend.asarray(np.ones((3, 4), dtype=bool)))
    with pytest.raises(IndexError):
        ap.PruningContainer(ctor(1, dim=dim)).compute_mask(t, backend.asarray(np.ones((3, 4), dtype=bool)))


@pytest.mark.parametrize("ctor", STRUCTURED, ids=["LnStructured", "RandomStructured"])
def test_negative_dim_matches_positive(backend, ctor):
    x = np.random.default_rng(5).standard_normal((3, 5, 4)).astype(np.float32)
    t = backend.asarray(x)
    ones = backend.asarray(np.ones(x.shape, dtype=bool))
    for neg, pos in [(-1, 2), (-2, 1), (-3, 0)]:
        a = to_numpy(ctor(2, dim=neg).compute_mask(t, ones))
        b = to_numpy(ctor(2, dim=pos).compute_mask(t, ones))
        np.testing.assert_array_equal(a, b)
        kept = a.any(axis=tuple(d for d in range(3) if d != pos))
        assert int((~kept).sum()) == 2


# --------------------------------------------------------------------------------------
# shapes of importance scores and default masks: ValueError, never a bare assert
# --------------------------------------------------------------------------------------


def test_importance_scores_shape_mismatch(backend):
    t = backend.asarray(np.ones((3, 4), dtype=np.float32))
    bad = backend.asarray(np.ones((4, 3), dtype=np.float32))
    flat = backend.asarray(np.ones(12, dtype=np.float32))
    for scores in (bad, flat):
        for method in (ap.L1Unstructured(2), ap.LnStructured(1, 2, 0), ap.RandomUnstructured(1, seed=0), ap.Identity()):
            with pytest.raises(ValueError, match="importance_scores"):
                method.prune(t, importance_scores=scores)
        with pytest.raises(ValueError):
            ap.l1_unstructured(t, 2, importance_scores=scores)
        with pytest.raises(ValueError):
            ap.ln_structured(t, 1, 2, 0, importance_scores=scores)
        with pytest.raises(ValueError):
            ap.global_unstructured([t, t], ap.L1Unstructured, importance_scores=[None, scores], amount=2)


def test_default_mask_shape_mismatch(backend):
    t = backend.asarray(np.ones((3, 4), dtype=np.float32))
    bad = backend.asarray(np.ones((4, 3), dtype=bool))
    methods = [
        ap.L1Unstructured(2),
        ap.RandomUnstructured(2, seed=0),
        ap.LnStructured(1, 2, 0),
        ap.RandomStructured(1, 0, seed=0),
        ap.Identity(),
        ap.CustomFromMask(backend.asarray(np.ones((3, 4), dtype=bool))),
    ]
    for method in methods:
        with pytest.raises(ValueError):
            method.compute_mask(t, bad)
        with pytest.raises(ValueError):
            method.prune(t, default_mask=bad)
        with pytest.raises(ValueError):
            ap.PruningContainer(method).compute_mask(t, bad)
    with pytest.raises(ValueError):
        ap.l1_unstructured(t, 2, default_mask=bad)
    with pytest.raises(ValueError):
        ap.global_unstructured([t], ap.L1Unstructured, default_masks=[bad], amount=2)
