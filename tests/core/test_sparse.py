"""Sparse export: bit packing, CSR, storage sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra import numpy as hnp

import arrayprune as ap
from conftest import to_numpy


@settings(max_examples=50, deadline=None)
@given(mask=hnp.arrays(bool, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9)))
def test_pack_matches_numpy_packbits_and_round_trips(mask):
    packed = ap.pack_mask(mask)
    np.testing.assert_array_equal(packed, np.packbits(mask.ravel()))
    np.testing.assert_array_equal(ap.unpack_mask(packed, mask.shape), mask)


def test_pack_round_trip_on_every_backend(backend):
    mask = np.random.default_rng(0).random((5, 11)) < 0.4
    packed = ap.pack_mask(backend.asarray(mask))
    np.testing.assert_array_equal(to_numpy(packed), np.packbits(mask.ravel()))
    np.testing.assert_array_equal(to_numpy(ap.unpack_mask(packed, mask.shape)), mask)
    float_mask = backend.asarray(mask.astype(np.float32))
    np.testing.assert_array_equal(to_numpy(ap.pack_mask(float_mask)), np.packbits(mask.ravel()))


def test_unpack_rejects_wrong_size():
    with pytest.raises(ValueError):
        ap.unpack_mask(np.zeros(3, np.uint8), (5, 5))


def test_csr_round_trip_numpy_and_torch():
    pytest.importorskip("scipy")
    torch = pytest.importorskip("torch")
    w = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    w *= ap.l1_unstructured(w, 0.7)
    c = ap.to_csr(w)
    np.testing.assert_array_equal(c.toarray(), w)
    assert c.nnz == int(np.count_nonzero(w))
    t = ap.to_csr(torch.from_numpy(w))
    assert t.layout == torch.sparse_csr
    np.testing.assert_array_equal(t.to_dense().numpy(), w)
    conv = np.random.default_rng(2).standard_normal((4, 3, 2, 2)).astype(np.float32)
    np.testing.assert_array_equal(ap.to_csr(conv).toarray(), conv.reshape(4, -1))


def test_sparse_nbytes_exact():
    w = np.zeros((4, 8), np.float32)
    w[:, ::4] = 1.0
    w[:, 1::4] = 2.0  # 2:4 pattern, 16 non-zeros
    sizes = ap.sparse_nbytes(w)
    assert sizes == {
        "dense": 128,
        "csr": 16 * 8 + 5 * 4,
        "bitmask": 16 * 4 + 4,
        "semi_structured_2_4": 16 * 4 + 4,
    }
    w[0, 2] = 3.0
    assert "semi_structured_2_4" not in ap.sparse_nbytes(w)


def test_semi_structured_needs_cuda():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError):
        ap.to_semi_structured(torch.zeros(4, 8))


@pytest.mark.skipif("not __import__('torch').cuda.is_available()")
def test_semi_structured_on_cuda():  # pragma: no cover - needs a GPU
    import torch

    w = torch.randn(128, 128, device="cuda", dtype=torch.float16)
    w = w * ap.NMStructured(2, 4).compute_mask(w, torch.ones_like(w))
    s = ap.to_semi_structured(w)
    torch.testing.assert_close(s.to_dense(), w)
