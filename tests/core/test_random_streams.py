"""Seeded random pruning over several arrays draws one stream, not one per array."""

from __future__ import annotations

import numpy as np

import arrayprune as ap
from conftest import to_numpy


def test_seeded_global_random_gives_independent_arrays(backend):
    arrays = [backend.asarray(np.ones((8, 8), np.float32)) for _ in range(3)]
    first = [to_numpy(m) for m in ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=7)]
    again = [to_numpy(m) for m in ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=7)]
    other = [to_numpy(m) for m in ap.global_unstructured(arrays, ap.RandomUnstructured, amount=0.5, seed=8)]
    assert sum(int((~m).sum()) for m in first) == 96
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))
