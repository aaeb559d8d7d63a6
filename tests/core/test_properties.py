"""Property-based tests (Hypothesis): exact counts, nesting, one mask on every backend."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import arrayprune as ap
from conftest import Backend, _load, available_backends, reference_keep, to_numpy

INF = math.inf
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
FAST = [Backend.NUMPY, Backend.TORCH, Backend.ARRAY_API_STRICT]  # no per-shape compilation


# --------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6)


def float_arrays(shape, dtype=np.float32, allow_subnormal=True):
    return hnp.arrays(
        dtype,
        shape,
        elements=st.floats(
            allow_nan=True, allow_infinity=True, allow_subnormal=allow_subnormal, width=8 * np.dtype(dtype).itemsize
        ),
    )


def int_valued(shape):
    return hnp.arrays(np.float32, shape, elements=st.integers(-5, 5).map(float))


@st.composite
def amount_for(draw, n):
    if draw(st.booleans()):
        return draw(st.floats(0.0, 1.0))
    return draw(st.integers(0, n))


def norm_ref(x: np.ndarray, n, dim: int) -> np.ndarray:
    """Channel norms in float64 (exact enough for small integer-valued data)."""
    a = np.abs(np.moveaxis(x.astype(np.float64), dim, 0).reshape(x.shape[dim], -1))
    if n == 1:
        return a.sum(axis=1)
    if n in (2, "fro"):
        return np.sqrt((a**2).sum(axis=1))
    if n == 3:
        return np.cbrt((a**3).sum(axis=1))
    if n == INF:
        return a.max(axis=1, initial=0.0)
    if n == -INF:
        return a.min(axis=1, initial=INF) if a.shape[1] else np.zeros(a.shape[0])
    raise ValueError(n)


# --------------------------------------------------------------------------------------
# exact masks and counts
# --------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), dtype=st.sampled_from([np.float16, np.float32, np.float64]))
def test_l1_is_the_stable_reference(data, dtype):
    x = data.draw(shapes.flatmap(lambda s: float_arrays(s, dtype)))
    amount = data.draw(amount_for(x.size))
    k = amount if isinstance(amount, int) else round(amount * x.size)
    want = reference_keep([x], k)[0]
    for b in FAST:
        be = _load(b)
        if not be.has_dtype(np.dtype(dtype).name):
            continue
        mask = to_numpy(ap.l1_unstructured(be.asarray(x), amount))
        np.testing.assert_array_equal(mask, want, err_msg=f"{b} amount={amount}")
        assert int((~mask).sum()) == k


@SETTINGS
@given(
    data=st.data(),
    n=st.sampled_from([1, 2, 3, INF, -INF, "fro"]),
)
def test_ln_structured_exact_channels(data, n):
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6))
    x = data.draw(int_valued(shape))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    channels = shape[dim]
    amount = data.draw(amount_for(channels))
    k = amount if isinstance(amount, int) else round(amount * channels)
    keep_channels = reference_keep([norm_ref(x, n, dim % len(shape))], k)[0]
    bshape = [1] * len(shape)
    bshape[dim] = channels
    want = np.broadcast_to(keep_channels.reshape(bshape), shape)
    for b in FAST:
        be = _load(b)
        mask = to_numpy(ap.ln_structured(be.asarray(x), amount, n, dim))
        np.testing.assert_array_equal(mask, want, err_msg=f"{b} n={n} dim={dim} amount={amount}")


# --------------------------------------------------------------------------------------
# chains: exact counts per step, pruned entries stay pruned
# --------------------------------------------------------------------------------------

method_specs = st.tuples(
    st.sampled_from(["l1", "l1", "ln", "rand_u", "rand_s", "custom", "identity"]),
    st.floats(0.0, 1.0),
    st.booleans(),  # integer amount
    st.sampled_from([1, 2, INF, -INF]),
    st.integers(-3, 2),
    st.integers(0, 2**16),
)


def build(spec, x_shape, remaining_units, be):
    kind, frac, as_int, n, dim, seed = spec
    amount = int(frac * remaining_units) if as_int else frac
    ndim = len(x_shape)
    dim = dim % ndim
    if kind == "l1":
        return ap.L1Unstructured(amount)
    if kind == "rand_u":
        return ap.RandomUnstructured(amount, seed=seed)
    if kind == "ln":
        return ap.LnStructured(amount, n, dim)
    if kind == "rand_s":
        return ap.RandomStructured(amount, dim, seed=seed)
    if kind == "custom":
        m = (np.random.default_rng(seed).random(x_shape) < 0.8).astype(np.float32)
        return ap.CustomFromMask(be.asarray(m))
    return ap.Identity()


def alive_channels(mask, dim):
    others = tuple(d for d in range(mask.ndim) if d != dim)
    return mask.sum(axis=others) != 0


@SETTINGS
@given(
    data=st.data(),
    specs=st.lists(method_specs, min_size=2, max_size=4),
    backend_name=st.sampled_from(FAST),
    mask_dtype=st.sampled_from(["bool", "float32"]),
)
def test_chains_exact_counts_and_nesting(data, specs, backend_name, mask_dtype):
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6))
    x = data.draw(float_arrays(shape))
    be = _load(backend_name)
    t = be.asarray(x)
    mask = be.asarray(np.ones(shape, np.float32), mask_dtype)
    c = ap.PruningContainer()
    for spec in specs:
        old = to_numpy(mask).astype(bool)
        kind, dim = spec[0], spec[4] % len(shape)
        structured = kind in ("ln", "rand_s")
        units = int(alive_channels(old, dim).sum()) if structured else int(old.sum())
        method = build(spec, shape, units, be)
        c.add_pruning_method(method)
        mask = c.compute_mask(t, mask)
        assert mask.dtype == be.dtype(mask_dtype)
        new = to_numpy(mask).astype(bool)
        assert not new[~old].any(), "a pruned entry came back"
        if kind in ("l1", "rand_u", "ln", "rand_s"):
            k = method.amount if isinstance(method.amount, int) else round(method.amount * units)
            if structured:
                newly_dead = alive_channels(old, dim) & ~alive_channels(new, dim)
                assert int(newly_dead.sum()) == k
                # whole channels only: the new mask is the old one with channels removed
                bshape = [1] * len(shape)
                bshape[dim] = shape[dim]
                np.testing.assert_array_equal(new, old & ~newly_dead.reshape(bshape))
            else:
                assert int((old & ~new).sum()) == k
            if kind == "l1":
                np.testing.assert_array_equal(new, old & reference_keep([x], k, [old])[0])
        elif kind == "identity":
            np.testing.assert_array_equal(new, old)
        else:
            np.testing.assert_array_equal(new, old & (to_numpy(method.mask) != 0))


# --------------------------------------------------------------------------------------
# one mask on every backend (fixed shapes: JAX compiles once per shape)
# --------------------------------------------------------------------------------------

FIXED_SHAPES = [(24,), (4, 6), (2, 3, 4)]


@settings(SETTINGS, max_examples=40)
@given(data=st.data(), shape=st.sampled_from(FIXED_SHAPES))
@pytest.mark.slow
def test_same_mask_on_every_backend(data, shape):
    x = data.draw(float_arrays(shape))
    xi = data.draw(int_valued(shape))
    default = data.draw(hnp.arrays(np.bool_, shape))
    amount = data.draw(amount_for(int(default.sum())))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.sampled_from([1, 2, INF, -INF]))
    s_amount = data.draw(amount_for(shape[dim]))
    s_frac = data.draw(st.floats(0.0, 1.0))  # with a default mask fewer channels may remain
    results = {}
    for be in available_backends():
        out = [to_numpy(ap.l1_unstructured(be.asarray(x), amount if isinstance(amount, float) else 0))]
        out.append(to_numpy(ap.l1_unstructured(be.asarray(x), amount, default_mask=be.asarray(default))))
        if len(shape) >= 2:
            out.append(to_numpy(ap.ln_structured(be.asarray(xi), s_amount, n, dim)))
            out.append(to_numpy(ap.ln_structured(be.asarray(xi), s_frac, n, dim, default_mask=be.asarray(default))))
        results[be.name] = out
    first_name, first = next(iter(results.items()))
    assert len(results) >= 3
    for name, out in results.items():
        for i, (a, b) in enumerate(zip(first, out, strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"{first_name} vs {name}, output {i}")
    # and the unstructured ones are the reference
    k = amount if isinstance(amount, int) else round(amount * int(default.sum()))
    np.testing.assert_array_equal(first[1], default & reference_keep([x], k, [default])[0])


@settings(SETTINGS, max_examples=25)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(FIXED_SHAPES[1:]))
def test_seeded_random_methods_reproducible(data, seed, shape):
    amount = data.draw(st.floats(0.0, 1.0))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.ones(shape, np.float32)
    size = math.prod(shape)
    for be in available_backends():
        t = be.asarray(x)
        a = to_numpy(ap.random_unstructured(t, amount, seed=seed))
        b = to_numpy(ap.random_unstructured(t, amount, seed=seed))
        np.testing.assert_array_equal(a, b, err_msg=be.name)
        assert int((~a).sum()) == round(amount * size)
        a = to_numpy(ap.random_structured(t, amount, dim, seed=seed))
        b = to_numpy(ap.random_structured(t, amount, dim, seed=seed))
        np.testing.assert_array_equal(a, b, err_msg=be.name)
        others = tuple(d for d in range(len(shape)) if d != dim % len(shape))
        assert int((~a.any(axis=others)).sum()) == round(amount * shape[dim])


@settings(SETTINGS, max_examples=40)
@given(data=st.data())
def test_global_matches_reference(data):
    arrays = data.draw(st.lists(shapes.flatmap(float_arrays), min_size=1, max_size=4))
    elig = [data.draw(st.one_of(st.none(), hnp.arrays(np.bool_, a.shape))) for a in arrays]
    n = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, elig, strict=True))
    amount = data.draw(amount_for(n))
    k = amount if isinstance(amount, int) else round(amount * n)
    want = reference_keep(arrays, k, elig)
    for b in FAST:
        be = _load(b)
        got = ap.global_unstructured(
            [be.asarray(a) for a in arrays],
            ap.L1Unstructured,
            default_masks=[None if e is None else be.asarray(e) for e in elig],
            amount=amount,
        )
        for g, w, e in zip(got, want, elig, strict=True):
            expect = w if e is None else (w & e)
            np.testing.assert_array_equal(to_numpy(g), expect, err_msg=str(b))


def test_property_helpers_are_right():
    x = np.array([[3.0, 0.0], [4.0, -2.0]])
    np.testing.assert_allclose(norm_ref(x, 2, 1), [5.0, 2.0])
    np.testing.assert_allclose(norm_ref(x, -INF, 0), [0.0, 2.0])
    np.testing.assert_allclose(norm_ref(x, 1, 0), [3.0, 6.0])


def test_jax_ranks_subnormals_by_value():
    """XLA flushes subnormal floats to zero in comparisons; JAX masks rank bit patterns instead."""
    jnp = pytest.importorskip("jax.numpy")
    x = np.array([8.8e-40, 0.0, 1.0], np.float32)
    np.testing.assert_array_equal(ap.l1_unstructured(x, 1), [True, False, True])
    np.testing.assert_array_equal(np.asarray(ap.l1_unstructured(jnp.asarray(x), 1)), [True, False, True])
