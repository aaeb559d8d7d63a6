"""Tests of arrayprune.adapters.mapping: the verbs of torch.nn.utils.prune on mappings."""

from __future__ import annotations

import importlib
import types
from collections import OrderedDict

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import mapping as mp

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

LIBS = ["numpy", "torch", "jax", "array_api_strict"]


def _lib(name):
    if name == "jax":
        pytest.importorskip("jax")
        import jax.numpy as jnp

        return jnp
    return pytest.importorskip(name)


def _as(lib, name, a):
    if name == "torch":
        return lib.from_numpy(np.array(a))
    return lib.asarray(a)


def _np(x):
    mod = type(x).__module__
    if mod.startswith("torch"):
        return x.detach().cpu().numpy()
    if mod.startswith(("numpy", "jax")):
        return np.asarray(x)
    return np.from_dlpack(x)  # array-api-strict: no implicit conversion


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _state_dict():
    return {
        "fc1.weight": _rand((6, 8), 1),
        "fc1.bias": _rand((6,), 2),
        "fc2.weight": _rand((4, 6), 3),
        "fc2.bias": _rand((4,), 4),
    }


def _snapshot(params):
    return {k: np.array(v, copy=True) for k, v in params.items()}


def _same(params, snap):
    return list(params) == list(snap) and all(np.array_equal(params[k], snap[k]) for k in snap)


# --------------------------------------------------------------------------------------
# the convention
# --------------------------------------------------------------------------------------


def test_l1_unstructured_writes_the_state_dict_convention():
    sd = _state_dict()
    snap = _snapshot(sd)
    out = mp.l1_unstructured(sd, "fc1.weight", amount=0.3)
    assert _same(sd, snap), "the input mapping must not change"
    assert list(out) == ["fc1.weight_orig", "fc1.weight_mask", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert out["fc1.weight_orig"] is sd["fc1.weight"]
    assert out["fc2.weight"] is sd["fc2.weight"]
    mask = out["fc1.weight_mask"]
    assert mask.dtype == np.float32 and mask.shape == (6, 8)
    assert set(np.unique(mask)) <= {0.0, 1.0}
    assert int((mask == 0).sum()) == round(0.3 * 48) == 14
    kept = np.abs(sd["fc1.weight"])[mask == 1]
    assert kept.min() > np.abs(sd["fc1.weight"])[mask == 0].max()
    assert mp.is_pruned(out) and not mp.is_pruned(sd)
    assert mp.pruned_keys(out) == [("fc1.weight",)]


def test_apply_masks_and_remove_fold_the_mask():
    sd = _state_dict()
    out = mp.l1_unstructured(sd, "fc1.weight", amount=10)
    eff = mp.apply_masks(out)
    assert list(eff) == list(sd)
    np.testing.assert_array_equal(eff["fc1.weight"], sd["fc1.weight"] * out["fc1.weight_mask"])
    assert int((eff["fc1.weight"] == 0).sum()) == 10
    assert eff["fc1.bias"] is sd["fc1.bias"]
    removed = mp.remove(out, "fc1.weight")
    assert list(removed) == list(sd) and not mp.is_pruned(removed)
    np.testing.assert_array_equal(removed["fc1.weight"], eff["fc1.weight"])
    assert "fc1.weight_mask" in out, "remove must not mutate its input"
    with pytest.raises(ValueError, match="has to be pruned"):
        mp.remove(sd, "fc1.weight")
    with pytest.raises(KeyError):
        mp.remove(out, "nope.weight")


def test_repeated_pruning_combines_like_pruning_container():
    sd = _state_dict()
    w = sd["fc1.weight"]
    out = mp.l1_unstructured(sd, "fc1.weight", amount=0.25)
    out = mp.ln_structured(out, "fc1.weight", amount=0.5, n=2, dim=0)
    out = mp.l1_unstructured(out, "fc1.weight", amount=5)
    m1 = ap.L1Unstructured(0.25).compute_mask(w, np.ones_like(w))
    m2 = ap.PruningContainer(ap.L1Unstructured(0.25), ap.LnStructured(0.5, 2, 0)).compute_mask(w, m1)
    m3 = ap.combine_masks(ap.L1Unstructured(5), w, m2)
    np.testing.assert_array_equal(out["fc1.weight_mask"], m3)
    assert out["fc1.weight_orig"] is w
    # counts: 12 entries; then 3 of the 6 rows (none was empty yet); then 5 more entries
    assert int((m1 == 0).sum()) == 12 and int((m1.sum(axis=1) == 0).sum()) == 0
    assert int((m2.sum(axis=1) == 0).sum()) == 3
    assert int(m3.sum()) == int(m2.sum()) - 5


def test_masks_keep_existing_dtype_and_new_ones_take_the_param_dtype():
    sd = {"w": _rand((5, 4), 0, np.float64), "h": _rand((4, 4), 1, np.float16), "b": _rand((3, 3), 2)}
    out = mp.l1_unstructured(sd, "w", 0.5)
    out = mp.random_unstructured(out, "h", 0.5, seed=1)
    assert out["w_mask"].dtype == np.float64 and out["h_mask"].dtype == np.float16
    out["b_orig"] = out.pop("b")
    out["b_mask"] = np.ones((3, 3), dtype=bool)
    out = mp.l1_unstructured(out, "b", 3)
    assert out["b_mask"].dtype == np.bool_ and int((~out["b_mask"]).sum()) == 3
    eff = mp.apply_masks(out)
    assert eff["b"].dtype == np.float32 and int((eff["b"] == 0).sum()) == 3


def test_identity_custom_from_mask_and_random_methods():
    sd = _state_dict()
    out = mp.identity(sd, "fc1.weight")
    np.testing.assert_array_equal(out["fc1.weight_mask"], np.ones((6, 8), np.float32))
    custom = np.zeros((6, 8), dtype=bool)
    custom[0, :3] = True
    custom[1] = True
    out = mp.custom_from_mask(out, "fc1.weight", custom)
    np.testing.assert_array_equal(out["fc1.weight_mask"], custom.astype(np.float32))
    assert out["fc1.weight_mask"].dtype == np.float32
    a = mp.random_unstructured(sd, "fc2.weight", 0.5, seed=3)
    b = mp.random_unstructured(sd, "fc2.weight", 0.5, seed=3)
    np.testing.assert_array_equal(a["fc2.weight_mask"], b["fc2.weight_mask"])
    assert int((a["fc2.weight_mask"] == 0).sum()) == 12
    r = mp.random_structured(sd, "fc1.weight", 0.5, dim=1, seed=0)
    cols = r["fc1.weight_mask"].sum(axis=0)
    assert sorted(set(cols.tolist())) == [0.0, 6.0] and int((cols == 0).sum()) == 4
    with pytest.raises(ValueError):
        mp.custom_from_mask(sd, "fc1.weight", np.ones((2, 2)))


def test_importance_scores_rank_instead_of_weights():
    sd = {"w": np.arange(1, 13, dtype=np.float32).reshape(3, 4)}
    scores = -np.arange(12, dtype=np.float32).reshape(3, 4)  # |scores| largest first
    out = mp.l1_unstructured(sd, "w", 4, importance_scores=scores)
    assert out["w_mask"].reshape(-1).tolist() == [0.0] * 4 + [1.0] * 8
    rows = mp.ln_structured(sd, "w", 1, n=1, dim=0, importance_scores=scores[::-1].copy())
    assert rows["w_mask"].sum(axis=1).tolist() == [4.0, 4.0, 0.0]
    with pytest.raises(ValueError, match="same shape"):
        mp.l1_unstructured(sd, "w", 4, importance_scores=np.ones(3))


# --------------------------------------------------------------------------------------
# errors: raised, input untouched
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda sd: mp.l1_unstructured(sd, "missing", 0.5), KeyError),
        (lambda sd: mp.l1_unstructured(sd, "fc1.weight", 1.5), ValueError),
        (lambda sd: mp.l1_unstructured(sd, "fc1.weight", -1), ValueError),
        (lambda sd: mp.l1_unstructured(sd, "fc1.weight", "half"), TypeError),
        (lambda sd: mp.l1_unstructured(sd, "fc1.weight", 49), ValueError),
        (lambda sd: mp.ln_structured(sd, "fc1.bias", 0.5, n=2, dim=0), ValueError),
        (lambda sd: mp.ln_structured(sd, "fc1.weight", 0.5, n=2, dim=2), IndexError),
        (lambda sd: mp.random_structured(sd, "fc1.weight", 7, dim=0), ValueError),
        (lambda sd: mp.random_unstructured(sd, "fc1.weight", 0.5, seed=1.5), TypeError),
        (lambda sd: mp.identity(sd, ("fc1.weight", "x")), KeyError),
        (lambda sd: mp.identity(sd, "a/b"), KeyError),
        (lambda sd: mp.global_unstructured(sd, ["fc1.weight", "nope"], ap.L1Unstructured, amount=0.5), KeyError),
        (
            lambda sd: mp.global_unstructured(sd, ["fc1.weight", "fc1.weight"], ap.L1Unstructured, amount=0.5),
            ValueError,
        ),
        (lambda sd: mp.global_unstructured(sd, ["fc1.weight"], ap.LnStructured, amount=0.5, n=2, dim=0), TypeError),
        (lambda sd: mp.global_unstructured(sd, ["fc1.weight", "fc2.weight"], ap.L1Unstructured, amount=73), ValueError),
    ],
)
def test_errors_are_raised_before_anything_changes(call, exc):
    sd = _state_dict()
    snap = _snapshot(sd)
    with pytest.raises(exc):
        call(sd)
    assert _same(sd, snap)


def test_ambiguous_or_half_pruned_entries_are_refused():
    sd = {"w_orig": np.ones((2, 2), np.float32), "w_mask": np.ones((2, 2), np.float32), "w": np.ones((2, 2))}
    with pytest.raises(ValueError, match="beside"):
        mp.l1_unstructured(sd, "w", 1)
    with pytest.raises(KeyError, match="without its pair"):
        mp.l1_unstructured({"v_orig": np.ones((2, 2))}, "v", 1)
    with pytest.raises(KeyError, match="not an array"):
        mp.l1_unstructured({"params": {"k": np.ones((2, 2))}}, "params", 1)


# --------------------------------------------------------------------------------------
# global pruning
# --------------------------------------------------------------------------------------


def test_global_unstructured_equals_the_core_and_iterates():
    sd = _state_dict()
    keys = ["fc1.weight", "fc2.weight"]
    out = mp.global_unstructured(sd, keys, ap.L1Unstructured, amount=0.5)
    core = ap.global_unstructured([sd[k] for k in keys], ap.L1Unstructured, amount=0.5)
    for k, m in zip(keys, core, strict=True):
        np.testing.assert_array_equal(out[k + "_mask"], m.astype(np.float32))
        assert out[k + "_mask"].dtype == np.float32
    assert sum(int((out[k + "_mask"] == 0).sum()) for k in keys) == round(0.5 * 72) == 36
    # a second round prunes 50% of what remains, across both, and keeps earlier zeros
    again = mp.global_unstructured(out, keys, ap.L1Unstructured, amount=0.5)
    assert sum(int((again[k + "_mask"] == 0).sum()) for k in keys) == 36 + 18
    for k in keys:
        assert np.all(again[k + "_mask"] <= out[k + "_mask"])
    # importance scores by key
    scores = {"fc2.weight": np.zeros((4, 6), np.float32)}
    s = mp.global_unstructured(sd, keys, ap.L1Unstructured, importance_scores=scores, amount=24)
    assert int(s["fc2.weight_mask"].sum()) == 0 and int(s["fc1.weight_mask"].sum()) == 48
    with pytest.raises(KeyError):
        mp.global_unstructured(sd, keys, ap.L1Unstructured, importance_scores={"fc1.bias": sd["fc1.bias"]}, amount=1)


def test_global_unstructured_matches_torch():
    torch = pytest.importorskip("torch")
    import torch.nn.utils.prune as tprune

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    tprune.l1_unstructured(net[0], "weight", amount=0.2)
    sd = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    tprune.global_unstructured([(net[0], "weight"), (net[2], "weight")], tprune.L1Unstructured, amount=0.4)
    out = mp.global_unstructured(sd, ["0.weight", "2.weight"], ap.L1Unstructured, amount=0.4)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(out[k], v.numpy(), err_msg=k)
    assert set(out) == set(net.state_dict())


# --------------------------------------------------------------------------------------
# backends, nested and immutable mappings
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LIBS)
def test_any_array_api_library(name):
    lib = _lib(name)
    w = _rand((8, 5), 7)
    sd = {"w": _as(lib, name, w), "b": _as(lib, name, _rand((5,), 8))}
    out = mp.l1_unstructured(sd, "w", 0.5)
    out = mp.ln_structured(out, "w", 0.25, n=1, dim=0)
    mask = out["w_mask"]
    assert type(mask) is type(sd["w"]) and mask.dtype == sd["w"].dtype
    ref = ap.l1_unstructured(w, 0.5, default_mask=np.ones_like(w))
    ref = ap.ln_structured(w, 0.25, 1, 0, default_mask=ref)
    np.testing.assert_array_equal(_np(mask), ref)
    eff = mp.apply_masks(out)["w"]
    assert type(eff) is type(sd["w"])
    np.testing.assert_array_equal(_np(eff), w * ref)
    g = mp.global_unstructured(sd, ["w", "b"], ap.RandomUnstructured, amount=9, seed=0)
    zeros = sum(int(np.sum(_np(g[k]) == 0)) for k in ("w_mask", "b_mask"))
    assert zeros == 9


def test_nested_flax_style_paths_and_immutable_jax():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    kernel = _rand((6, 4), 11)
    params = {
        "params": {
            "Dense_0": {"kernel": jnp.asarray(kernel), "bias": jnp.zeros(4)},
            "Dense_1": {"kernel": jnp.ones((4, 2))},
        }
    }
    out = mp.l1_unstructured(params, "params/Dense_0/kernel", 0.5)
    dense = out["params"]["Dense_0"]
    assert list(dense) == ["kernel_orig", "kernel_mask", "bias"]
    assert isinstance(dense["kernel_mask"], jnp.ndarray) and dense["kernel_mask"].dtype == jnp.float32
    assert int((dense["kernel_mask"] == 0).sum()) == 12
    assert out["params"]["Dense_1"] is params["params"]["Dense_1"], "untouched branches are shared"
    assert list(params["params"]["Dense_0"]) == ["kernel", "bias"], "input unchanged"
    same = mp.l1_unstructured(params, ("params", "Dense_0", "kernel"), 0.5)
    np.testing.assert_array_equal(same["params"]["Dense_0"]["kernel_mask"], dense["kernel_mask"])
    out = mp.random_structured(out, ("params", "Dense_0", "kernel"), 1, dim=1, seed=0)
    assert mp.pruned_keys(out) == [("params", "Dense_0", "kernel")] and mp.is_pruned(out)
    eff = mp.apply_masks(out)
    assert list(eff["params"]["Dense_0"]) == ["kernel", "bias"]
    np.testing.assert_array_equal(
        np.asarray(eff["params"]["Dense_0"]["kernel"]), kernel * np.asarray(out["params"]["Dense_0"]["kernel_mask"])
    )
    back = mp.remove(out, "params/Dense_0/kernel")
    np.testing.assert_array_equal(
        np.asarray(back["params"]["Dense_0"]["kernel"]), np.asarray(eff["params"]["Dense_0"]["kernel"])
    )
    both = mp.global_unstructured(
        params, ["params/Dense_0/kernel", ("params", "Dense_1", "kernel")], ap.L1Unstructured, amount=0.5
    )
    assert [p for p in mp.pruned_keys(both)] == [("params", "Dense_0", "kernel"), ("params", "Dense_1", "kernel")]
    flat = dict(mp.iter_arrays(both, effective=True))
    assert set(flat) == {
        ("params", "Dense_0", "kernel"),
        ("params", "Dense_0", "bias"),
        ("params", "Dense_1", "kernel"),
    }
    assert sum(int((np.asarray(v) == 0).sum()) for k, v in flat.items() if k[-1] == "kernel") >= round(0.5 * 32)


def test_immutable_mapping_types_are_kept():
    inner = types.MappingProxyType({"kernel": _rand((4, 4), 0)})
    params = types.MappingProxyType({"layer": inner, "note": "kept"})
    out = mp.l1_unstructured(params, "layer/kernel", 8)
    assert isinstance(out, types.MappingProxyType) and isinstance(out["layer"], types.MappingProxyType)
    assert out["note"] == "kept" and list(params["layer"]) == ["kernel"]
    assert int((out["layer"]["kernel_mask"] == 0).sum()) == 8


def test_literal_keys_win_over_paths_and_tuples_reach_slashes():
    sd = {"dense/kernel:0": _rand((3, 3), 0), "dense": {"kernel:0": _rand((3, 3), 1)}}
    out = mp.l1_unstructured(sd, "dense/kernel:0", 3)
    assert "dense/kernel:0_mask" in out and list(out["dense"]) == ["kernel:0"]
    out = mp.l1_unstructured(out, ("dense", "kernel:0"), 3)
    assert list(out["dense"]) == ["kernel:0_orig", "kernel:0_mask"]
    out = mp.l1_unstructured(out, "dense/kernel:0", 3)  # the pruned literal key is found by its _orig
    assert int((out["dense/kernel:0_mask"] == 0).sum()) == 6


def test_ordered_dict_metadata_survives():
    sd = OrderedDict(_state_dict())
    sd._metadata = OrderedDict({"": {"version": 1}})
    out = mp.l1_unstructured(sd, "fc1.weight", 0.5)
    assert type(out) is OrderedDict and out._metadata is sd._metadata
    assert mp.apply_masks(out)._metadata is sd._metadata


# --------------------------------------------------------------------------------------
# PyTorch state dicts: round trip
# --------------------------------------------------------------------------------------


def _prune_modules():
    mods = [pytest.param("torch.nn.utils.prune", id="torch.nn.utils.prune")]
    try:
        importlib.import_module("arrayprune.adapters.torch")
    except Exception:
        pass
    else:
        mods.append(pytest.param("arrayprune.adapters.torch", id="arrayprune.adapters.torch"))
    return mods


def _net(torch, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


@pytest.mark.parametrize("prune_module", _prune_modules())
def test_torch_state_dict_round_trip(prune_module):
    torch = pytest.importorskip("torch")
    tprune = importlib.import_module(prune_module)

    # a model pruned with torch, saved as NumPy arrays
    net = _net(torch, 0)
    tprune.l1_unstructured(net[0], "weight", amount=0.3)
    tprune.ln_structured(net[2], "weight", amount=0.25, n=2, dim=0)
    sd = net.state_dict()
    arrays = OrderedDict((k, v.detach().numpy().copy()) for k, v in sd.items())
    arrays._metadata = sd._metadata

    # pruned further here: iterative on pruned params, fresh on another
    out = mp.l1_unstructured(arrays, "0.weight", amount=0.5)
    out = mp.l1_unstructured(out, "2.weight", amount=0.4)
    out = mp.random_unstructured(out, "4.weight", amount=0.5, seed=0)
    for k in ("0.weight_mask", "2.weight_mask", "4.weight_mask"):
        assert out[k].dtype == np.float32

    # the same steps with torch on the module (4.weight gets the mask computed here)
    tprune.l1_unstructured(net[0], "weight", amount=0.5)
    tprune.l1_unstructured(net[2], "weight", amount=0.4)
    tprune.custom_from_mask(net[4], "weight", mask=torch.from_numpy(out["4.weight_mask"]))

    # loads into a fresh module pruned with torch (so that it has _orig/_mask)
    fresh = _net(torch, 1)
    for i in (0, 2, 4):
        tprune.identity(fresh[i], "weight")
    fresh.load_state_dict(OrderedDict((k, torch.from_numpy(v)) for k, v in out.items()), strict=True)
    ref = net.state_dict()
    assert set(fresh.state_dict()) == set(ref)
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0, msg=k)
    x = torch.randn(5, 16)
    torch.testing.assert_close(fresh(x), net(x), rtol=0, atol=0)
    # counts: 0.weight: 58 of 192 then half of the remaining 134 more
    assert int((out["0.weight_mask"] == 0).sum()) == 58 + round(0.5 * (192 - 58))
    assert int((out["4.weight_mask"] == 0).sum()) == 12

    # folding here equals torch's remove()
    eff = mp.apply_masks(out)
    for i in (0, 2, 4):
        tprune.remove(net[i], "weight")
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(eff[k], v.numpy(), err_msg=k)


# --------------------------------------------------------------------------------------
# first pruning: the core's boolean mask, stored in the array's dtype
# --------------------------------------------------------------------------------------

FIRST_PRUNINGS = {
    "random_unstructured": (
        lambda p: mp.random_unstructured(p, "w", 0.3, seed=5),
        lambda x, ones: ap.functional.random_unstructured(x, 0.3, seed=5, default_mask=ones),
    ),
    "random_structured": (
        lambda p: mp.random_structured(p, "w", 0.3, 1, seed=5),
        lambda x, ones: ap.functional.random_structured(x, 0.3, 1, seed=5, default_mask=ones),
    ),
    "l1_unstructured": (
        lambda p: mp.l1_unstructured(p, "w", 0.3),
        lambda x, ones: ap.functional.l1_unstructured(x, 0.3, default_mask=ones),
    ),
    "ln_structured": (
        lambda p: mp.ln_structured(p, "w", 0.3, 2, 0),
        lambda x, ones: ap.functional.ln_structured(x, 0.3, 2, 0, default_mask=ones),
    ),
    "block_unstructured": (
        lambda p: mp.block_unstructured(p, "w", 0.5, (4, 4)),
        lambda x, ones: ap.functional.block_unstructured(x, 0.5, (4, 4), default_mask=ones),
    ),
    "nm_structured": (
        lambda p: mp.nm_structured(p, "w", 2, 4),
        lambda x, ones: ap.functional.nm_structured(x, 2, 4, default_mask=ones),
    ),
    "identity": (lambda p: mp.identity(p, "w"), lambda x, ones: ones),
}


@pytest.mark.parametrize("verb", sorted(FIRST_PRUNINGS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_first_pruning_equals_pruning_on_top_of_ones_of_the_dtype(verb, dtype):
    """No mask of ones is built, yet the result is PyTorch's: ones_like(w), then the method."""
    x = np.random.default_rng(0).standard_normal((32, 16)).astype(dtype)
    x[3, :5] = 0.0  # ties, resolved the same way from either start
    ours, reference = FIRST_PRUNINGS[verb]
    mask = ours({"w": x})["w_mask"]
    expected = reference(x, np.ones_like(x))
    assert mask.dtype == x.dtype
    np.testing.assert_array_equal(mask, expected)


def test_first_global_pruning_equals_pruning_on_top_of_ones():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((20, 8)).astype(np.float32), rng.standard_normal(30).astype(np.float64)
    out = mp.global_unstructured({"a": a, "b": b}, ["a", "b"], ap.RandomUnstructured, amount=0.4, seed=3)
    expected = ap.global_unstructured(
        [a, b], ap.RandomUnstructured, amount=0.4, seed=3, default_masks=[np.ones_like(a), np.ones_like(b)]
    )
    for key, ref, x in zip("ab", expected, (a, b), strict=True):
        assert out[key + "_mask"].dtype == x.dtype
        np.testing.assert_array_equal(out[key + "_mask"], ref)


def test_replace_swaps_arrays_in_place_and_shares_the_rest():
    inner = OrderedDict([("kernel", np.ones((2, 2))), ("bias", np.zeros(2))])
    params = {"dense": inner, "head": np.arange(3.0), "other": {"x": np.ones(1)}}
    out = mp.replace(params, {"dense/kernel": np.full((2, 2), 5.0), ("head",): np.arange(3.0) * 2})
    assert list(out) == ["dense", "head", "other"] and list(out["dense"]) == ["kernel", "bias"]
    assert type(out["dense"]) is OrderedDict
    np.testing.assert_array_equal(out["dense"]["kernel"], np.full((2, 2), 5.0))
    np.testing.assert_array_equal(out["head"], [0.0, 2.0, 4.0])
    assert out["dense"]["bias"] is inner["bias"] and out["other"] is params["other"]
    np.testing.assert_array_equal(params["dense"]["kernel"], np.ones((2, 2)))  # input untouched
    with pytest.raises(KeyError):
        mp.replace(params, {"dense/nope": np.ones(1)})
    pruned = mp.l1_unstructured(params, "head", 1)
    with pytest.raises(ValueError, match="pruned"):
        mp.replace(pruned, {"head": np.ones(3)})


# --------------------------------------------------------------------------------------
# hostile trees
# --------------------------------------------------------------------------------------


def _shared_bomb(levels):
    node = {"w": np.ones((2, 2), np.float32)}
    for _ in range(levels):
        node = {"a": node, "b": node}
    return node


@pytest.mark.parametrize("walker", [lambda t: list(mp.iter_arrays(t)), mp.pruned_keys, mp.apply_masks, mp.is_pruned])
def test_walkers_refuse_trees_that_never_end(walker):
    with pytest.raises(mp.TreeError, match="more than 1,000 entries"):
        mp.check_tree(_shared_bomb(40), max_entries=1000)
    loop = {"w": np.ones(2)}
    loop["inner"] = {"back": loop}
    with pytest.raises(mp.TreeError, match="'inner/back' contains itself"):
        walker(loop)
    deep = {"w": np.ones(2)}
    for _ in range(5000):
        deep = {"k": deep}
    with pytest.raises(mp.TreeError, match="nested deeper than 64 levels"):
        walker(deep)
    assert isinstance(mp.TreeError("x"), ValueError)


def test_check_tree_counts_shared_sub_mappings_once_per_parent():
    assert mp.check_tree(_shared_bomb(3)) == 2 + 4 + 8 + 8  # dict entries on every path
    sd = {"w": np.ones((2, 2))}
    assert [p for p, _ in mp.iter_arrays({"model": sd, "ema": sd})] == [("model", "w"), ("ema", "w")]
    assert mp.check_tree({"a": {"b": {"c": 1}}}, max_depth=2) == 3
    with pytest.raises(mp.TreeError, match="deeper than 1"):
        mp.check_tree({"a": {"b": {"c": 1}}}, max_depth=1)


def test_meta_tensors_are_refused_naming_the_device():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="'w' is on the meta device"):
        mp.l1_unstructured({"w": torch.empty(4, 4, device="meta")}, "w", 0.5)


def test_the_generic_verb_takes_any_method_including_a_user_written_one():
    import arrayprune as ap

    class FirstRow(ap.BasePruningMethod):
        """Prunes the first row, whatever the values (a method written by a user)."""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            mask = np.array(default_mask, dtype=bool, copy=True)
            mask[0] = False
            return mask

    w = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    out = mp.prune({"w": w}, "w", FirstRow())
    np.testing.assert_array_equal(out["w_mask"], np.array([[0, 0, 0], [1, 1, 1]], np.float32))
    again = mp.prune(out, "w", ap.L1Unstructured(1))  # on what is left: the smallest of 4, 5, 6
    np.testing.assert_array_equal(again["w_mask"], np.array([[0, 0, 0], [0, 1, 1]], np.float32))
    generic = mp.prune({"w": w}, "w", ap.L1Unstructured(2))["w_mask"]
    np.testing.assert_array_equal(generic, mp.l1_unstructured({"w": w}, "w", 2)["w_mask"])
    entries = list(mp.iter_entries({"a": again, "b": w}))
    assert [(p, m is None) for p, _, m in entries] == [(("a", "w"), False), (("b",), True)]
    assert entries[0][1] is w and entries[0][2] is again["w_mask"]
