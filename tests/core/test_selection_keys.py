"""Bit keys on accelerators: CuPy arrays and tensors off the CPU rank by integer keys.

GPU float comparisons flush subnormals to zero; the portable route and Wanda's per-row
selection key the floats of CuPy arrays and tensors off the CPU by their bit patterns,
as on JAX, so that subnormals rank by value as on the host. Forced here on CPU tensors
(and on meta tensors, which hold no values).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import arrayprune as ap
from arrayprune import selection as sel
from arrayprune.selection import portable
from conftest import to_numpy

torch = pytest.importorskip("torch")


def palette(dtype: str) -> np.ndarray:
    """Values that tie, straddle zero and the ends of the range, in float64."""
    width = np.float16 if dtype == "float16" else (np.float64 if dtype == "float64" else np.float32)
    tiny = float(np.finfo(width).smallest_subnormal) if dtype != "bfloat16" else 2.0**-133
    return np.array(
        [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, tiny, -tiny, 2 * tiny, 5 * tiny, math.nan, -math.nan]
        + [math.inf, -math.inf, 1e-3, -7.25, 65504.0 if dtype == "float16" else 1e30]
    )


def host_keep(tensors, k, eligible):
    """The host route's masks (the portable one for mixed dtypes), as NumPy arrays."""
    return [to_numpy(m) for m in sel.smallest_magnitude_keep(tensors, k, eligible)]


def test_magnitude_keys_off_the_cpu_are_integer_bits():
    """Off the CPU, magnitudes are keyed by bits (exact on subnormals), as on JAX."""
    xp = sel.namespace(torch.empty(1))
    meta = torch.empty(3, device="meta")
    assert portable.magnitude_keys(xp, meta, torch.float32).dtype == torch.int32
    assert portable.magnitude_keys(xp, torch.empty(3), torch.float32).dtype == torch.float32


def test_subnormals_rank_by_value_in_l1_on_every_backend(backend, xp):
    """GPUs compare subnormals as zero; the masks rank them by value on every backend
    (CuPy and CUDA tensors take the portable route on bit keys)."""
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
