"""SparseGPT's column loop in place (NumPy, PyTorch, CuPy) equals the full-width update bit for bit.

Where a library updates slices in place, each column updates only the block's columns
from itself on (``U`` is upper triangular); the full-width update also subtracts
``err * (+0)`` from the finished columns, which changes nothing but turns a ``-0`` into
``+0`` after an error with its sign bit set. array-api-strict takes the full-width
update, so every result here is compared, byte for byte, with the same call on
array-api-strict: weights with negative zeros, dead inputs (zero Hessian rows), N:M and
amounts, both reduction axes.
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayprune as ap
import arrayprune.reconstruction as reconstruction

strict = pytest.importorskip("array_api_strict")


def _case(seed, rows, k, zeros):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k))
    w[rng.random(w.shape) < zeros] = -0.0  # kept zeros stay zeros: their sign is what differs
    x = rng.standard_normal((64, k))
    x[:, rng.random(k) < 0.2] = 0.0  # dead inputs: U has exact zeros off the diagonal
    return w, x.T @ x / 64


@pytest.mark.parametrize("step", [3, 16])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("options", [{"amount": 0.3}, {"amount": 0.7}, {"n": 2, "m": 4}])
def test_numpy_in_place_equals_the_full_width_update(monkeypatch, seed, options, step):
    monkeypatch.setattr(reconstruction, "_COLUMN_STEP", step)  # a block of 8 in steps of 3 (4 for N:M), or one
    w, h = _case(seed, 9, 24, zeros=0.3)
    axis = seed % 2
    w = w if axis == 1 else np.ascontiguousarray(w.T)
    new, keep = ap.sparsegpt(w, h, block_size=8, reduction_axis=axis, **options)
    ref, ref_keep = ap.sparsegpt(strict.asarray(w), strict.asarray(h), block_size=8, reduction_axis=axis, **options)
    assert new.tobytes() == np.asarray(ref).tobytes()
    assert np.array_equal(keep, np.asarray(ref_keep))


def test_the_zero_sign_fix_is_needed_and_right():
    # Find a case where some kept entry is -0 and a later error in its block is negative:
    # without the fix the bytes would differ (the test of the fix can fail).
    found = 0
    for seed in range(40):
        w, h = _case(seed, 6, 16, zeros=0.5)
        ref = np.asarray(ap.sparsegpt(strict.asarray(w), strict.asarray(h), 0.25, block_size=8)[0])
        new = ap.sparsegpt(w, h, 0.25, block_size=8)[0]
        assert new.tobytes() == ref.tobytes()
        fixed = reconstruction._signed_zeros_as_full_update
        try:
            reconstruction._signed_zeros_as_full_update = lambda xp, block, errs, zero: block
            unfixed = ap.sparsegpt(w, h, 0.25, block_size=8)[0]
        finally:
            reconstruction._signed_zeros_as_full_update = fixed
        found += unfixed.tobytes() != ref.tobytes()
        assert np.array_equal(unfixed, ref)  # equal as numbers: only signs of zeros differ
    assert found > 0


@pytest.mark.slow
def test_torch_in_place_equals_its_full_width_update(monkeypatch):
    torch = pytest.importorskip("torch")  # its own linear algebra: compared with itself, updated full width
    cases = [_case(seed, 10, 32, zeros=0.3) for seed in range(4)]
    got = [ap.sparsegpt(torch.from_numpy(w), torch.from_numpy(h), 0.5, block_size=16) for w, h in cases]
    monkeypatch.setattr(reconstruction, "_views_update_in_place", lambda x: False)
    for (w, h), (new, keep) in zip(cases, got, strict=True):
        ref, ref_keep = ap.sparsegpt(torch.from_numpy(w), torch.from_numpy(h), 0.5, block_size=16)
        assert new.numpy().tobytes() == ref.numpy().tobytes()
        assert torch.equal(keep, ref_keep)


def test_the_caller_weight_is_not_modified():
    w, h = _case(7, 8, 16, zeros=0.0)
    before = w.copy()
    ap.sparsegpt(w, h, 0.5, block_size=4)
    assert w.tobytes() == before.tobytes()
