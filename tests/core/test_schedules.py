"""Gradual pruning schedules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayprune as ap
from conftest import to_numpy


def test_polynomial_decay_values():
    s = ap.PolynomialDecay(0.2, 0.8, begin_step=10, end_step=20, power=3)
    assert s(0) == 0.0
    assert s(10) == pytest.approx(0.2)
    assert s(15) == pytest.approx(0.8 + (0.2 - 0.8) * 0.5**3)
    assert s(20) == 0.8 and s(1000) == 0.8
    assert ap.ConstantSparsity(0.5, begin_step=3)(2) == 0.0
    assert ap.ConstantSparsity(0.5, begin_step=3)(3) == 0.5


def test_schedules_are_immutable_and_validated():
    s = ap.PolynomialDecay(0.0, 0.9, 0, 100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.final_sparsity = 0.5  # type: ignore[misc]
    with pytest.raises(ValueError):
        ap.PolynomialDecay(0.0, 1.5, 0, 10)
    with pytest.raises(ValueError):
        ap.PolynomialDecay(0.0, 0.5, 10, 5)
    with pytest.raises(TypeError):
        ap.ConstantSparsity("0.5")
    with pytest.raises(ValueError):
        ap.PolynomialDecay(0.0, 0.5, 0, 10, power=0)


@settings(max_examples=30, deadline=None)
@given(
    final=st.floats(0, 1),
    initial=st.floats(0, 1),
    end=st.integers(1, 40),
    seed=st.integers(0, 1000),
    size=st.integers(1, 300),
)
def test_gradual_pruning_reaches_target_exactly(final, initial, end, seed, size):
    x = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
    schedule = ap.PolynomialDecay(min(initial, final), final, 0, end)
    mask = None
    for step in range(0, end + 3):
        new = ap.prune_to_schedule(x, schedule, step, default_mask=mask)
        pruned = int((~new).sum())
        target = round(schedule(step) * size)
        previous = 0 if mask is None else int((~mask).sum())
        assert pruned == max(target, previous)  # exactly enough, never un-pruned
        if mask is not None:
            assert not (new & ~mask).any()
        mask = new
    assert int((~mask).sum()) == round(final * size)


def test_structured_schedule_counts_channels(backend):
    x = backend.asarray(np.random.default_rng(0).standard_normal((20, 6)).astype(np.float32))
    mask = None
    for target in (0.1, 0.35, 0.5):
        mask = ap.prune_to_sparsity(x, target, default_mask=mask, pruning_method=ap.LnStructured, n=2, dim=0)
        m = to_numpy(mask)
        assert int((~m.any(axis=1)).sum()) == round(target * 20)
        assert all(row.all() or not row.any() for row in m)


def test_prune_to_sparsity_rejects_global_methods():
    with pytest.raises(TypeError):
        ap.prune_to_sparsity(np.ones(4), 0.5, pruning_method=ap.CustomFromMask)


def test_mapping_adapter_follows_a_schedule():
    from arrayprune.adapters import mapping as mp

    w = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    params = {"layer": {"kernel": w}}
    schedule = ap.PolynomialDecay(0.0, 0.75, 0, 30)
    expected = None
    for step in range(0, 40, 10):
        params = mp.prune_to_sparsity(params, ("layer", "kernel"), schedule(step))
        expected = ap.prune_to_schedule(w, schedule, step, default_mask=expected)
        mask = params["layer"]["kernel_mask"]
        assert mask.dtype == np.float32 and int((mask == 0).sum()) == round(schedule(step) * 128)
        np.testing.assert_array_equal(mask != 0, expected)
