"""The accelerator route (`selection.device`) against the host route, bit for bit.

The route takes CuPy arrays and tensors off the CPU; its function `device.keep` takes
tensors on any device, so that it runs here on CPU tensors, where the host route (and
the stable-argsort reference) give the masks it must equal, and on meta tensors, which
have no values: any read-back to the host (``.item()``, ``bool()``, a ``bincount``
sizing its output) raises there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrayprune as ap
from arrayprune import selection as sel
from arrayprune.selection import device, portable
from conftest import reference_keep, to_numpy

torch = pytest.importorskip("torch")

DTYPES = ["float16", "bfloat16", "float32", "float64"]
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def palette(dtype: str) -> np.ndarray:
    """Values that tie, straddle zero and the ends of the range, in float64."""
    width = np.float16 if dtype == "float16" else (np.float64 if dtype == "float64" else np.float32)
    tiny = float(np.finfo(width).smallest_subnormal) if dtype != "bfloat16" else 2.0**-133
    return np.array(
        [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, tiny, -tiny, 2 * tiny, 5 * tiny, math.nan, -math.nan]
        + [math.inf, -math.inf, 1e-3, -7.25, 65504.0 if dtype == "float16" else 1e30]
    )


def as_tensor(values: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(values).to(TORCH_DTYPES[dtype])


def host_keep(tensors, k, eligible):
    """The host route's masks (the portable one for mixed dtypes), as NumPy arrays."""
    return [to_numpy(m) for m in sel.smallest_magnitude_keep(tensors, k, eligible)]


@st.composite
def cases(draw):
    """Arrays of one dtype (or mixed), optional eligibility, and k up to every eligible entry."""
    mixed = draw(st.booleans()) and draw(st.booleans())
    n_arrays = draw(st.integers(1, 3))
    if mixed:
        dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n_arrays)]
    else:
        dtypes = [draw(st.sampled_from(DTYPES))] * n_arrays
    tensors, eligible, values = [], [], []
    for dtype in dtypes:
        n = draw(st.integers(0, 60))
        pal = palette(dtype)
        idx = draw(st.lists(st.integers(0, pal.size + 3), min_size=n, max_size=n))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        v = np.array([pal[i] if i < pal.size else rng.standard_normal() for i in idx], dtype=np.float64)
        t = as_tensor(v, dtype)
        tensors.append(t)
        values.append(to_numpy(t).astype(np.float64))
        if draw(st.booleans()):
            e = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
            eligible.append(torch.from_numpy(e))
        else:
            eligible.append(None)
    n_eligible = sum(t.numel() if e is None else int(e.sum()) for t, e in zip(tensors, eligible, strict=True))
    k = draw(st.sampled_from([0, n_eligible, draw(st.integers(0, n_eligible))]))
    return tensors, eligible, values, k


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), digit_bits=st.sampled_from([16, 11, 5]), by_sort=st.booleans())
def test_device_route_equals_host_route(case, digit_bits, by_sort):
    tensors, eligible, values, k = case
    old = device.DIGIT_BITS, device.RADIX_SIZE
    device.DIGIT_BITS, device.RADIX_SIZE = digit_bits, (1 << 30) if by_sort else 0
    try:
        got = [to_numpy(m) for m in device.keep(tensors, eligible, k)]
    finally:
        device.DIGIT_BITS, device.RADIX_SIZE = old
    want = reference_keep(values, k, [None if e is None else e.numpy() for e in eligible])
    for g, w, t in zip(got, want, tensors, strict=True):
        assert g.dtype == np.bool_ and g.shape == tuple(t.shape)
        np.testing.assert_array_equal(g, w)
    for g, h in zip(got, host_keep(tensors, k, eligible), strict=True):
        np.testing.assert_array_equal(g, h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("digit_bits", [16, 8, 3])
def test_large_tie_heavy_arrays(dtype, digit_bits, monkeypatch):
    """Several arrays of thousands of entries, zeros, NaN, infinities and subnormals."""
    monkeypatch.setattr(device, "DIGIT_BITS", digit_bits)
    rng = np.random.default_rng(3)
    pal = palette(dtype)
    arrays = [as_tensor(pal[rng.integers(0, pal.size, size=shape)], dtype) for shape in [(40, 50), (3000,), (7, 7, 7)]]
    arrays.append(as_tensor(rng.standard_normal(5000), dtype))
    total = sum(a.numel() for a in arrays)
    for k in [1, 17, total // 3, total // 2, total - 1, total]:
        got = device.keep(arrays, [None] * len(arrays), k)
        for g, h in zip(got, host_keep(arrays, k, None), strict=True):
            np.testing.assert_array_equal(to_numpy(g), h)
    eligible = [torch.from_numpy(rng.random(tuple(a.shape)) < 0.7) for a in arrays]
    n_eligible = sum(int(e.sum()) for e in eligible)
    for k in [1, n_eligible // 2, n_eligible]:
        got = device.keep(arrays, eligible, k)
        for g, h in zip(got, host_keep(arrays, k, eligible), strict=True):
            np.testing.assert_array_equal(to_numpy(g), h)


@pytest.mark.parametrize("dtype", ["int64", "int8", "bool"])
def test_other_dtypes_rank_as_the_portable_route_converts_them(dtype):
    rng = np.random.default_rng(4)
    t = torch.from_numpy(rng.integers(-3, 4, size=(20, 30))).to(getattr(torch, dtype))
    for k in [1, 200, 600]:
        np.testing.assert_array_equal(to_numpy(device.keep([t], [None], k)[0]), host_keep([t], k, None)[0])


def test_requires_grad_and_non_contiguous_inputs():
    x = torch.randn(30, 40).round().t().requires_grad_(True)
    got = device.keep([x], [None], 500)[0]
    np.testing.assert_array_equal(to_numpy(got), host_keep([x.detach()], 500, None)[0])


def test_errors_and_k_zero():
    x = torch.ones(5)
    with pytest.raises(ValueError, match="negative"):
        device.keep([x], [None], -1)
    with pytest.raises(ValueError, match="cannot drop 6 of 5"):
        device.keep([x], [None], 6)
    with pytest.raises(ValueError, match="one entry per"):
        device.keep([x], [], 1)
    assert bool(device.keep([x], [None], 0)[0].all())


def test_eligibility_count_is_not_read_back():
    """With eligibility, k is checked against the entries only: beyond the eligible ones,
    every eligible entry is dropped."""
    x = torch.arange(6.0)
    e = torch.tensor([True, False, True, False, False, False])
    np.testing.assert_array_equal(to_numpy(device.keep([x], [e], 4)[0]), [False, True, False, True, True, True])
    assert bool(device.keep([x], [torch.zeros(6, dtype=torch.bool)], 3)[0].all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("by_sort", [False, True])
def test_runs_on_meta_tensors_so_reads_nothing_back(dtype, by_sort, monkeypatch):
    """Meta tensors have no values: ``.item()``, ``bool()`` and ``bincount`` raise on them."""
    if by_sort:
        monkeypatch.setattr(device, "RADIX_SIZE", 1 << 30)
    meta = torch.device("meta")
    scores = [torch.empty(1000, dtype=TORCH_DTYPES[dtype], device=meta), torch.empty(4, 5, device=meta)]
    with pytest.raises((RuntimeError, NotImplementedError)):
        scores[0].sum().item()  # the check itself: a read-back raises
    eligible = [torch.empty(1000, dtype=torch.bool, device=meta), None]
    for elig in ([None, None], eligible):
        masks = device.keep(scores, elig, 10)
        assert [m.device.type for m in masks] == ["meta", "meta"]
        assert [tuple(m.shape) for m in masks] == [(1000,), (4, 5)]
        assert all(m.dtype == torch.bool for m in masks)


def test_route_takes_tensors_off_the_cpu_only(monkeypatch):
    calls = []
    real = device.keep

    def spy(scores, eligible, k):
        calls.append(scores[0].device.type)
        return real(scores, eligible, k)

    monkeypatch.setattr(device, "keep", spy)
    x = torch.randn(100)
    sel.smallest_magnitude_keep([x], 10)
    sel.smallest_magnitude_keep([x, x], 10, [x > 0, None])
    assert calls == []  # CPU tensors take the host route
    meta = torch.empty(100, device="meta")
    (mask,) = sel.smallest_magnitude_keep([meta], 10)
    assert calls == ["meta"] and mask.device.type == "meta"


def test_magnitude_keys_off_the_cpu_are_integer_bits():
    """Off the CPU, magnitudes are keyed by bits (exact on subnormals), as on JAX."""
    xp = sel.namespace(torch.empty(1))
    meta = torch.empty(3, device="meta")
    assert portable.magnitude_keys(xp, meta, torch.float32).dtype == torch.int32
    assert portable.magnitude_keys(xp, torch.empty(3), torch.float32).dtype == torch.float32


def test_subnormals_rank_by_value_in_l1_on_every_backend(backend, xp):
    """GPUs compare subnormals as zero; the masks rank them by value on every backend
    (CuPy and CUDA tensors take the accelerator route)."""
    tiny = np.finfo(np.float32).smallest_subnormal
    w = np.array([3 * tiny, 0.0, tiny, -2 * tiny, 5 * tiny, -tiny, 0.0, 4 * tiny], dtype=np.float32)
    got = to_numpy(ap.l1_unstructured(backend.asarray(w), 4))
    np.testing.assert_array_equal(got, [True, False, False, True, True, False, False, True])
    np.testing.assert_array_equal(to_numpy(ap.kth_smallest(backend.asarray(w), 4)), np.float32(0.0))
    np.testing.assert_array_equal(to_numpy(ap.kth_smallest(backend.asarray(w), 5)), np.float32(tiny))


def test_bit_keys_where_tensors_count_as_on_an_accelerator(monkeypatch):
    """What CuPy and CUDA tensors run, forced on CPU tensors: Wanda's per-row selection and
    the portable route on integer keys rank subnormals by value, as the host does."""
    from arrayprune.selection import keys

    monkeypatch.setattr(keys, "on_accelerator", lambda x: apc_is_torch(x))
    tiny = np.finfo(np.float32).smallest_subnormal
    w = np.array([[3 * tiny, 0.0, tiny, -2 * tiny], [5 * tiny, -tiny, 0.0, 4 * tiny]], dtype=np.float32)
    got = to_numpy(ap.wanda(torch.from_numpy(w), 2, dim=0))
    np.testing.assert_array_equal(got, [[True, False, False, True], [True, False, False, True]])
    rng = np.random.default_rng(5)
    x = torch.from_numpy(palette("float32")[rng.integers(0, 19, size=500)].astype(np.float32))
    e = torch.from_numpy(rng.random(500) < 0.5)
    xp = sel.namespace(x)
    for k in [1, 100, int(e.sum())]:
        got = portable.keep_masks(xp, [x, x[:50]], [e, None], k)
        for g, h in zip(got, host_keep([x, x[:50]], k, [e, None]), strict=True):
            np.testing.assert_array_equal(to_numpy(g), h)
    assert float(portable.kth_smallest(xp, x, 3)) == float(np.sort(to_numpy(x))[2])


def apc_is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)
