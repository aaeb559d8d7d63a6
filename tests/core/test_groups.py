"""Channel groups in the core: scores over all weight members, exact choice, slicing."""

from __future__ import annotations

import array_api_compat as apc
import array_api_strict as xps
import numpy as np
import pytest

import arrayprune as ap
from arrayprune.groups import ChannelGroup, Member, choose_channels, group_scores, shrink, take_channels
from conftest import to_numpy


def _ffn(seed: int = 0, k: int = 5, c: int = 8, n: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((k, c)).astype(np.float32),  # MatMul B [K, N]: channels on axis 1
        "b1": rng.standard_normal(c).astype(np.float32),
        "w2": rng.standard_normal((c, n)).astype(np.float32),  # consumer [K, N]: channels on axis 0
        "other": rng.standard_normal((3, 3)).astype(np.float32),
    }


GROUP = ChannelGroup([("w1", 1), ("b1", 0, False), ("w2", 0)], channels=8, name="h")


def _reference_keep(arrays: dict[str, np.ndarray], drop: int, p: float = 2.0) -> np.ndarray:
    """Kept channels by the L_p norm of the concatenated weight members (float64, stable)."""
    rows = np.concatenate([arrays["w1"].T.astype(np.float64), arrays["w2"].astype(np.float64)], axis=1)
    norms = np.sum(np.abs(rows) ** p, axis=1) ** (1 / p)
    order = np.argsort(norms, kind="stable")
    return np.sort(order[drop:])


@pytest.mark.parametrize("amount, drop", [(0.5, 4), (0.3, 2), (0.0, 0), (3, 3), (1.0, 8), (0.3125, 2)])
def test_shrink_keeps_top_channels_by_concatenated_norm(backend, amount, drop):
    data = _ffn()
    arrays = {k: backend.asarray(v) for k, v in data.items()}
    out, kept = shrink(arrays, [GROUP], amount)
    expect = _reference_keep(data, drop)
    np.testing.assert_array_equal(to_numpy(kept[0]), expect)
    np.testing.assert_array_equal(to_numpy(out["w1"]), data["w1"][:, expect])
    np.testing.assert_array_equal(to_numpy(out["b1"]), data["b1"][expect])
    np.testing.assert_array_equal(to_numpy(out["w2"]), data["w2"][expect, :])
    assert out["other"] is arrays["other"]  # untouched: the same object
    assert list(out) == list(arrays)
    for key in ("w1", "b1", "w2"):
        assert apc.array_namespace(out[key]) is apc.array_namespace(arrays[key])
        assert out[key].dtype == arrays[key].dtype


def test_l1_norm_and_bias_does_not_score():
    data = _ffn(seed=3)
    big_bias = dict(data, b1=np.arange(8, dtype=np.float32)[::-1] * 100)  # would dominate if it scored
    out, kept = shrink(big_bias, [GROUP], 0.5, "ln_structured", n=1)
    np.testing.assert_array_equal(kept[0], _reference_keep(data, 4, p=1.0))
    scores = group_scores(data, GROUP, "ln_structured", n=1)
    rows = np.concatenate([data["w1"].T, data["w2"]], axis=1).astype(np.float64)
    np.testing.assert_allclose(scores, np.abs(rows).sum(axis=1), rtol=1e-6)


def test_ties_go_to_the_lower_index(backend):
    w1 = np.ones((2, 6), dtype=np.float32)
    w1[:, 4] = 2.0  # channel 4 is the strongest, all others tie
    w2 = np.ones((6, 3), dtype=np.float32)
    arrays = {"w1": backend.asarray(w1), "w2": backend.asarray(w2)}
    g = ChannelGroup([Member("w1", 1), Member("w2", 0)], 6)
    _, kept = shrink(arrays, [g], 3)
    np.testing.assert_array_equal(to_numpy(kept[0]), [3, 4, 5])


def test_conv_members_and_negative_axes(backend):
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)  # Conv W [out, in, kh, kw]
    b1 = rng.standard_normal(6).astype(np.float32)
    w2 = rng.standard_normal((4, 6, 1, 1)).astype(np.float32)
    arrays = {"w1": backend.asarray(w1), "b1": backend.asarray(b1), "w2": backend.asarray(w2)}
    g = ChannelGroup([("w1", 0), ("b1", -1, False), ("w2", -3)], 6)
    out, kept = shrink(arrays, [g], 0.5)
    rows = np.concatenate([w1.reshape(6, -1), np.moveaxis(w2, 1, 0).reshape(6, -1)], axis=1).astype(np.float64)
    expect = np.sort(np.argsort(np.linalg.norm(rows, axis=1), kind="stable")[3:])
    np.testing.assert_array_equal(to_numpy(kept[0]), expect)
    np.testing.assert_array_equal(to_numpy(out["w2"]), w2[:, expect])
    np.testing.assert_array_equal(to_numpy(out["b1"]), b1[expect])


def test_two_groups_share_a_tensor_on_different_axes():
    data = _ffn(seed=5)
    data["w3"] = np.random.default_rng(9).standard_normal((4, 2)).astype(np.float32)
    g2 = ChannelGroup([("w2", 1), ("w3", 0)], 4, name="out")
    out, kept = shrink(data, [GROUP, g2], 0.5)
    # Scores come from the arrays as given: g2 sees all 8 rows of w2.
    rows2 = np.concatenate([data["w2"].T, data["w3"]], axis=1).astype(np.float64)
    expect2 = np.sort(np.argsort(np.linalg.norm(rows2, axis=1), kind="stable")[2:])
    expect1 = _reference_keep(data, 4)
    np.testing.assert_array_equal(kept[1], expect2)
    np.testing.assert_array_equal(out["w2"], data["w2"][np.ix_(expect1, expect2)])
    np.testing.assert_array_equal(out["w3"], data["w3"][expect2])


def test_random_structured_with_seed(backend):
    data = _ffn()
    arrays = {k: backend.asarray(v) for k, v in data.items()}
    scores = group_scores(arrays, GROUP, "random_structured", seed=7)
    again = group_scores(arrays, GROUP, ap.RandomStructured(0.9, seed=7))
    drawn = ap.rng.uniform_like(arrays["w1"], (8,), seed=7)
    np.testing.assert_array_equal(to_numpy(scores), to_numpy(drawn))
    np.testing.assert_array_equal(to_numpy(again), to_numpy(drawn))
    _, kept = shrink(arrays, [GROUP], 0.25, "random_structured", seed=7)
    expect = np.sort(np.argsort(to_numpy(drawn), kind="stable")[2:])
    np.testing.assert_array_equal(to_numpy(kept[0]), expect)


def test_importance_scores_replace_member_values():
    data = _ffn()
    imp = {"w1": np.zeros_like(data["w1"]), "w2": np.zeros_like(data["w2"])}
    imp["w2"][[1, 6], :] = 5.0
    _, kept = shrink(data, [GROUP], 6, importance_scores=imp)
    np.testing.assert_array_equal(kept[0], [1, 6])


def test_choose_channels_counts_and_order(xp):
    scores = xp.asarray([3.0, 1.0, 2.0, 1.0, 0.5, 4.0])
    np.testing.assert_array_equal(to_numpy(choose_channels(scores, 0.5)), [0, 2, 5])
    np.testing.assert_array_equal(to_numpy(choose_channels(scores, 2)), [0, 2, 3, 5])
    # round(0.25 * 6) = round(1.5) = 2; the tie at 1.0 drops index 1 before index 3
    np.testing.assert_array_equal(to_numpy(choose_channels(scores, 0.25)), [0, 2, 3, 5])
    # round(0.5 * 5) = round(2.5) = 2 (half to even, as PyTorch)
    np.testing.assert_array_equal(to_numpy(choose_channels(scores[:5], 0.5)), [0, 2, 3])
    assert to_numpy(choose_channels(scores, 1.0)).shape == (0,)
    np.testing.assert_array_equal(to_numpy(choose_channels(scores, 0)), np.arange(6))


def test_device1_equals_default_device():
    data = _ffn(seed=11)
    dev1 = xps.Device("device1")
    for method, args in (("ln_structured", {}), ("random_structured", {"seed": 3})):
        a0 = {k: xps.asarray(v) for k, v in data.items()}
        a1 = {k: xps.asarray(v, device=dev1) for k, v in data.items()}
        out0, kept0 = shrink(a0, [GROUP], 0.5, method, **args)
        out1, kept1 = shrink(a1, [GROUP], 0.5, method, **args)
        assert kept1[0].device == dev1
        np.testing.assert_array_equal(to_numpy(kept0[0]), to_numpy(kept1[0]))
        for key in out1:
            assert out1[key].device == dev1
            np.testing.assert_array_equal(to_numpy(out0[key]), to_numpy(out1[key]))
        keep = choose_channels(xps.asarray([1.0, 0.0, 2.0], device=dev1), 0)
        assert keep.device == dev1


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda d: shrink(d, [GROUP], 1.5), ValueError, "amount"),
        (lambda d: shrink(d, [GROUP], -1), ValueError, "amount"),
        (lambda d: shrink(d, [GROUP], 9), ValueError, "smaller than"),
        (lambda d: shrink(d, [GROUP], "half"), TypeError, "amount"),
        (lambda d: shrink(d, [GROUP], 0.5, "l1_unstructured"), TypeError, "whole channels"),
        (lambda d: shrink(d, [GROUP], 0.5, ap.L1Unstructured(0.5)), TypeError, "whole channels"),
        (lambda d: shrink(d, [GROUP], 0.5, "nope"), ValueError, "unknown method"),
        (lambda d: shrink(d, [GROUP], 0.5, "ln_structured", dim=0), TypeError, "dim"),
        (lambda d: shrink(d, [ChannelGroup([("w1", 0)], 8)], 0.5), ValueError, "not the group's 8"),
        (lambda d: shrink(d, [ChannelGroup([("nope", 0)], 8)], 0.5), KeyError, "nope"),
        (lambda d: shrink(d, [ChannelGroup([("w1", 2)], 8)], 0.5), ValueError, "out of range"),
        (lambda d: shrink(d, [ChannelGroup([("b1", 0, False)], 8)], 0.5), ValueError, "no weight member"),
        (lambda d: shrink(d, [GROUP, ChannelGroup([("w2", 0)], 8)], 0.5), ValueError, "two groups"),
        (lambda d: ChannelGroup([("w1", 0), ("w1", 0)], 8), ValueError, "listed twice"),
        (lambda d: ChannelGroup([], 8), ValueError, "at least one"),
        (lambda d: ChannelGroup([("w1", "0")], 8), TypeError, "axis"),
        (lambda d: take_channels(d, [GROUP], [np.array([3, 1])]), ValueError, "ascending"),
        (lambda d: take_channels(d, [GROUP], [np.array([0, 8])]), ValueError, "out of range"),
    ],
)
def test_bad_input_raises_before_anything_changes(call, error, match):
    data = _ffn()
    before = {k: v.copy() for k, v in data.items()}
    with pytest.raises(error, match=match):
        call(data)
    for k in data:
        np.testing.assert_array_equal(data[k], before[k])


def test_shrink_arrays_adapter_keeps_mapping_type_and_seeds_each_group(backend):
    from collections import OrderedDict

    from arrayprune.adapters.plan import stream_seed
    from arrayprune.adapters.shrink import shrink_arrays

    data = _ffn(seed=2)
    data["w3"] = np.random.default_rng(4).standard_normal((4, 2)).astype(np.float32)
    params = OrderedDict((k, backend.asarray(v)) for k, v in data.items())
    g2 = ChannelGroup([("w2", 1), ("w3", 0)], 4, name="out")
    out, kept = shrink_arrays(params, [GROUP, g2], 0.5, "random_structured", seed=5)
    assert type(out) is OrderedDict and out["other"] is params["other"]
    for g, k in zip((GROUP, g2), kept, strict=True):
        drawn = to_numpy(ap.rng.uniform_like(params["w1"], (g.channels,), seed=stream_seed(5, g.name)))
        expect = np.sort(np.argsort(drawn, kind="stable")[g.channels // 2 :])
        np.testing.assert_array_equal(to_numpy(k), expect)
    out, kept = shrink_arrays(params, [GROUP], 0.5)
    np.testing.assert_array_equal(to_numpy(kept[0]), _reference_keep(data, 4))
