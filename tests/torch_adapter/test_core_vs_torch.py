"""Differential tests: the core against ``torch.nn.utils.prune`` itself.

Random float32 data from a seeded NumPy generator (continuous values: ties have
probability ~0), so the masks must be *identical*. arrayprune runs on NumPy arrays, on
torch tensors and on array-api-strict arrays; torch's methods on torch tensors. Where
ties exist (integer-valued data) torch's choice is unspecified: counts must agree and
arrayprune's mask must follow its own rule (lowest index first).

Random methods: without a seed, the PyTorch adapter's methods (the core's, drawing as
PyTorch does) run under the same ``torch.manual_seed`` as torch's, and masks and the
state of the global generator must be equal. With a seed, the core's own streams are
compared by counts only, on every library.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import arrayprune as ap
from conftest import Backend, _load, reference_keep, to_numpy

torch = pytest.importorskip("torch")
tp = pytest.importorskip("torch.nn.utils.prune")

INF = math.inf
SIDES = [Backend.NUMPY, Backend.TORCH, Backend.ARRAY_API_STRICT]


@pytest.fixture(params=SIDES, ids=str)
def side(request):
    """The library arrayprune runs on in a differential test."""
    return _load(request.param)


def data(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def binary(shape, seed, p=0.7):
    return (np.random.default_rng(seed + 1000).random(shape) < p).astype(np.float32)


def torch_mask(method, t, default):
    """torch's compute_mask, on copies (its containers write into default_mask)."""
    return method.compute_mask(torch.from_numpy(t.copy()), torch.from_numpy(default.copy())).numpy()


def ap_mask(side, method, t, default):
    out = method.compute_mask(side.asarray(t), side.asarray(default))
    assert out.dtype == side.dtype("float32")
    return to_numpy(out)


def tname(method):
    method._tensor_name = None
    return method


# --------------------------------------------------------------------------------------
# single methods
# --------------------------------------------------------------------------------------

UNSTRUCTURED_SHAPES = [(50,), (20, 30), (4, 5, 6), (3, 4, 5, 6)]
AMOUNTS = [0.0, 0.1, 0.5, 0.77, 1.0, 0, 1, 17]


@pytest.mark.parametrize("shape", UNSTRUCTURED_SHAPES, ids=str)
@pytest.mark.parametrize("default_kind", ["ones", "binary"])
def test_l1_unstructured(side, shape, default_kind):
    for seed in range(3):
        t = data(shape, seed)
        scores = data(shape, seed + 100)
        default = np.ones(shape, np.float32) if default_kind == "ones" else binary(shape, seed)
        for amount in AMOUNTS:
            want = torch_mask(tp.L1Unstructured(amount), t, default)
            got = ap_mask(side, ap.L1Unstructured(amount), t, default)
            np.testing.assert_array_equal(got, want, err_msg=f"seed={seed} amount={amount}")
            # importance scores rank instead of t (torch: prune(t, importance_scores=...))
            want_p = tp.L1Unstructured(amount).prune(
                torch.from_numpy(t.copy()), torch.from_numpy(default.copy()), torch.from_numpy(scores.copy())
            ).numpy()
            got_p = to_numpy(
                ap.L1Unstructured(amount).prune(side.asarray(t), side.asarray(default), side.asarray(scores))
            )
            np.testing.assert_array_equal(got_p, want_p, err_msg=f"scores seed={seed} amount={amount}")


STRUCTURED = [
    ((20, 30), [0, 1, -1, -2]),
    ((4, 5, 6), [0, 1, 2, -1, -3]),
    ((3, 4, 5, 6), [0, 3, -2]),
]


@pytest.mark.parametrize("n", [1, 2, 3, INF, -INF, "fro", "nuc"], ids=str)
@pytest.mark.parametrize("shape,dims", STRUCTURED, ids=lambda v: str(v))
@pytest.mark.parametrize("default_kind", ["ones", "binary"])
def test_ln_structured(side, n, shape, dims, default_kind):
    if n == "nuc" and len(shape) != 3:
        pytest.skip("nuclear norm: 3-D only")
    if n == "fro" and len(shape) > 3:
        # torch.norm(p='fro') takes at most 2 dims (RuntimeError); arrayprune: the 2-norm
        t = data(shape, 0)
        for dim in dims:
            a = ap_mask(side, ap.LnStructured(0.5, "fro", dim), t, np.ones(shape, np.float32))
            b = torch_mask(tp.LnStructured(0.5, 2, dim), t, np.ones(shape, np.float32))
            np.testing.assert_array_equal(a, b)
        return
    for seed in range(2):
        t = data(shape, seed)
        default = np.ones(shape, np.float32) if default_kind == "ones" else binary(shape, seed)
        for dim in dims:
            channels = shape[dim]
            for amount in (0.0, 0.2, 0.5, 1.0, 1, channels - 1):
                want = torch_mask(tp.LnStructured(amount, n, dim), t, default)
                got = ap_mask(side, ap.LnStructured(amount, n, dim), t, default)
                np.testing.assert_array_equal(got, want, err_msg=f"seed={seed} dim={dim} amount={amount}")


def test_ln_structured_importance_scores(side):
    t, scores = data((6, 8), 1), data((6, 8), 2)
    for n in (1, 2, INF):
        want = tp.LnStructured(3, n, 1).prune(
            torch.from_numpy(t.copy()), torch.ones(6, 8), torch.from_numpy(scores.copy())
        ).numpy()
        got = to_numpy(
            ap.LnStructured(3, n, 1).prune(
                side.asarray(t), side.asarray(np.ones((6, 8), np.float32)), side.asarray(scores)
            )
        )
        np.testing.assert_array_equal(got, want)


def test_identity_and_custom_from_mask(side):
    shape = (7, 9)
    t = data(shape, 3)
    for seed in range(3):
        default = binary(shape, seed)
        np.testing.assert_array_equal(ap_mask(side, ap.Identity(), t, default), torch_mask(tp.Identity(), t, default))
        custom = binary(shape, seed + 50, 0.5)
        want = torch_mask(tp.CustomFromMask(torch.from_numpy(custom.copy())), t, default)
        got = ap_mask(side, ap.CustomFromMask(side.asarray(custom)), t, default)
        np.testing.assert_array_equal(got, want)


def test_errors_match_torch(side):
    t1 = np.ones(5, np.float32)
    t2 = np.ones((3, 4), np.float32)
    cases = [
        (lambda m: m.L1Unstructured(6), t1),
        (lambda m: m.RandomUnstructured(6), t1),
        (lambda m: m.LnStructured(0.5, 2, 0), t1),
        (lambda m: m.LnStructured(5, 2, 1), t2),
        (lambda m: m.LnStructured(1, 2, 2), t2),
        (lambda m: m.RandomStructured(4, 0), t2),
        (lambda m: m.RandomStructured(0.5, 5), t2),
    ]
    for make, t in cases:
        with pytest.raises(Exception) as torch_err:
            make(tp).compute_mask(torch.from_numpy(t.copy()), torch.ones(t.shape))
        with pytest.raises(Exception) as ap_err:
            make(ap).compute_mask(side.asarray(t), side.asarray(np.ones(t.shape, np.float32)))
        assert isinstance(ap_err.value, type(torch_err.value)), (ap_err.value, torch_err.value)
    for amount in (-1, 1.5, "0.5", None):
        with pytest.raises(Exception) as torch_err:
            tp.L1Unstructured(amount)
        with pytest.raises(type(torch_err.value)):
            ap.L1Unstructured(amount)


# --------------------------------------------------------------------------------------
# containers: chains of 2-4 methods, compared at every step
# --------------------------------------------------------------------------------------


def _pool(rng, shape):
    """(torch method, arrayprune method) pairs, deterministic."""
    ndim = len(shape)
    kind = rng.integers(0, 6)
    if kind in (0, 1):
        amount = float(rng.choice([0.1, 0.3, 0.5, 0.75])) if kind == 0 else int(rng.integers(0, 4))
        return tp.L1Unstructured(amount), ap.L1Unstructured(amount)
    if kind in (2, 3):
        dim = int(rng.integers(-ndim, ndim))
        norms = [1, 2, 3, INF, -INF] + (["fro"] if ndim <= 3 else []) + (["nuc"] if ndim == 3 else [])
        n = norms[int(rng.integers(0, len(norms)))]
        amount = float(rng.choice([0.2, 0.4, 0.5])) if kind == 2 else int(rng.integers(0, 2))
        return tp.LnStructured(amount, n, dim), ap.LnStructured(amount, n, dim)
    if kind == 4:
        custom = (rng.random(shape) < 0.8).astype(np.float32)
        return tp.CustomFromMask(torch.from_numpy(custom.copy())), ap.CustomFromMask(custom)
    return tp.Identity(), ap.Identity()


@pytest.mark.parametrize("shape", [(12, 10), (4, 5, 6), (2, 3, 4, 5)], ids=str)
@pytest.mark.parametrize("default_kind", ["ones", "binary"])
def test_container_chains(side, shape, default_kind):
    compared = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        t = data(shape, seed)
        start = np.ones(shape, np.float32) if default_kind == "ones" else binary(shape, seed)
        tc = tp.PruningContainer()
        tc._tensor_name = None
        ac = ap.PruningContainer()
        tmask = torch.from_numpy(start.copy())
        amask = side.asarray(start)
        tt = torch.from_numpy(t.copy())
        at = side.asarray(t)
        for step in range(int(rng.integers(2, 5))):
            tm, am = _pool(rng, shape)
            if isinstance(am, ap.CustomFromMask):
                am = ap.CustomFromMask(side.asarray(np.asarray(am.mask)))
            tc.add_pruning_method(tname(tm))
            ac.add_pruning_method(am)
            try:
                tmask = tc.compute_mask(tt, tmask.clone())
            except ValueError:
                with pytest.raises(ValueError):
                    ac.compute_mask(at, amask)
                break
            previous = to_numpy(amask)
            amask = ac.compute_mask(at, amask)
            got = to_numpy(amask)
            np.testing.assert_array_equal(got, tmask.numpy(), err_msg=f"seed={seed} step={step} {am!r}")
            assert not got[previous == 0].any()
            compared += 1
    assert compared >= 30


def test_container_chain_hand_built_like_torch_apply(side):
    # the sequence torch.nn.utils.prune would build through repeated module pruning
    t = data((16, 12), 5)
    methods = [
        (tp.L1Unstructured(0.3), ap.L1Unstructured(0.3)),
        (tp.LnStructured(0.25, 2, 0), ap.LnStructured(0.25, 2, 0)),
        (tp.L1Unstructured(10), ap.L1Unstructured(10)),
        (tp.LnStructured(0.5, 1, -1), ap.LnStructured(0.5, 1, -1)),
    ]
    tc = tp.PruningContainer(tname(methods[0][0]))
    ac = ap.PruningContainer(methods[0][1])
    tmask = tc.compute_mask(torch.from_numpy(t.copy()), torch.ones(16, 12))
    amask = ac.compute_mask(side.asarray(t), side.asarray(np.ones((16, 12), np.float32)))
    np.testing.assert_array_equal(to_numpy(amask), tmask.numpy())
    for tm, am in methods[1:]:
        tc.add_pruning_method(tname(tm))
        ac.add_pruning_method(am)
        tmask = tc.compute_mask(torch.from_numpy(t.copy()), tmask.clone())
        amask = ac.compute_mask(side.asarray(t), amask)
        np.testing.assert_array_equal(to_numpy(amask), tmask.numpy())


# --------------------------------------------------------------------------------------
# global_unstructured, iterated
# --------------------------------------------------------------------------------------


class Holder(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))


@pytest.mark.parametrize("use_scores", [False, True])
def test_global_unstructured_iterated(side, use_scores):
    for seed in range(3):
        shapes = [(10, 8), (25,), (3, 4, 5), (6, 6)]
        ws = [data(s, seed * 10 + i) for i, s in enumerate(shapes)]
        scores = [data(s, seed * 10 + i + 50) for i, s in enumerate(shapes)]
        modules = [Holder(w) for w in ws]
        params = [(m, "weight") for m in modules]
        masks = None
        for rnd, amount in enumerate([0.3, 20, 0.5, 0.2]):
            kw = {}
            ap_scores = None
            if use_scores:
                kw["importance_scores"] = {
                    (modules[i], "weight"): torch.from_numpy(scores[i].copy()) for i in (0, 2)
                }
                ap_scores = [side.asarray(scores[0]), None, side.asarray(scores[2]), None]
            tp.global_unstructured(params, pruning_method=tp.L1Unstructured, amount=amount, **kw)
            new = ap.global_unstructured(
                [side.asarray(w) for w in ws], ap.L1Unstructured, ap_scores, default_masks=masks, amount=amount
            )
            for i, (m, g) in enumerate(zip(modules, new, strict=True)):
                np.testing.assert_array_equal(
                    to_numpy(g).astype(np.float32), m.weight_mask.numpy(), err_msg=f"seed={seed} round={rnd} array={i}"
                )
            masks = [side.asarray(m.weight_mask.numpy()) for m in modules]  # float32, as torch keeps them


def test_global_unstructured_dict_and_float_masks(side):
    ws = {"a": data((9, 7), 1), "b": data((30,), 2)}
    modules = {k: Holder(w) for k, w in ws.items()}
    tp.global_unstructured([(m, "weight") for m in modules.values()], tp.L1Unstructured, amount=0.6)
    got = ap.global_unstructured({k: side.asarray(w) for k, w in ws.items()}, ap.L1Unstructured, amount=0.6)
    for k in ws:
        np.testing.assert_array_equal(to_numpy(got[k]), modules[k].weight_mask.numpy().astype(bool))
    tp.global_unstructured([(m, "weight") for m in modules.values()], tp.L1Unstructured, amount=7)
    got = ap.global_unstructured(
        {k: side.asarray(w) for k, w in ws.items()},
        ap.L1Unstructured,
        default_masks={k: side.xp.astype(v, side.dtype("float32")) for k, v in got.items()},
        amount=7,
    )
    for k in ws:
        assert got[k].dtype == side.dtype("float32")
        np.testing.assert_array_equal(to_numpy(got[k]), modules[k].weight_mask.numpy())


# --------------------------------------------------------------------------------------
# random methods, unseeded: PyTorch's draws, bit for bit
# --------------------------------------------------------------------------------------


def _under_seed(seed, fn):
    """``fn()`` after ``torch.manual_seed(seed)``: its result and the generator state."""
    torch.manual_seed(seed)
    return fn(), torch.get_rng_state()


def _assert_same_run(torch_run, ours_run):
    (want, want_state), (got, got_state) = torch_run, ours_run
    assert got.dtype == want.dtype
    assert torch.equal(got, want)
    assert torch.equal(got_state, want_state), "the global generator ends in another state"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_unseeded_random_methods_match_torch(dtype):
    aprune = pytest.importorskip("arrayprune.adapters.torch")
    shape = (12, 10)
    t = torch.from_numpy(data(shape, 0)).to(getattr(torch, dtype))
    for seed in range(4):
        for default in (torch.ones(shape, dtype=t.dtype), torch.from_numpy(binary(shape, seed)).to(t.dtype)):
            for amount in (0.0, 0.25, 0.5, 1.0, 3, 120):
                _assert_same_run(
                    _under_seed(seed, lambda: tp.RandomUnstructured(amount).compute_mask(t, default.clone())),
                    _under_seed(seed, lambda: aprune.RandomUnstructured(amount).compute_mask(t, default.clone())),
                )
            for dim in (0, 1, -1):
                for amount in (0.0, 0.3, 0.5, 1.0, 2):
                    _assert_same_run(
                        _under_seed(seed, lambda: tp.RandomStructured(amount, dim).compute_mask(t, default.clone())),
                        _under_seed(
                            seed, lambda: aprune.RandomStructured(amount, dim).compute_mask(t, default.clone())
                        ),
                    )


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_unseeded_random_container_chains_match_torch(dtype):
    aprune = pytest.importorskip("arrayprune.adapters.torch")
    shape = (10, 8)
    t = torch.from_numpy(data(shape, 1)).to(getattr(torch, dtype))
    for seed in range(6):
        rng = np.random.default_rng(seed)
        tc = tp.PruningContainer()
        tc._tensor_name = None
        ac = aprune.PruningContainer()
        tmask = amask = torch.ones(shape, dtype=t.dtype)
        for step in range(5):
            kind = rng.integers(0, 3)
            if kind == 0:
                amount = float(rng.choice([0.2, 0.5])) if rng.random() < 0.5 else int(rng.integers(0, 6))
                tm, am = tp.RandomUnstructured(amount), aprune.RandomUnstructured(amount)
            elif kind == 1:
                amount, dim = float(rng.choice([0.25, 0.5])), int(rng.integers(-2, 2))
                tm, am = tp.RandomStructured(amount, dim), aprune.RandomStructured(amount, dim)
            else:  # a deterministic step in between (continuous data: no ties)
                amount = float(rng.choice([0.1, 0.3]))
                tm, am = tp.L1Unstructured(amount), aprune.L1Unstructured(amount)
            tc.add_pruning_method(tname(tm))
            am._tensor_name = None
            ac.add_pruning_method(am)
            torch_run = _under_seed(seed * 10 + step, lambda: tc.compute_mask(t, tmask.clone()))
            ours_run = _under_seed(seed * 10 + step, lambda: ac.compute_mask(t, amask))
            _assert_same_run(torch_run, ours_run)
            tmask, amask = torch_run[0], ours_run[0]


# --------------------------------------------------------------------------------------
# random methods, seeded (the core's own streams): counts only
# --------------------------------------------------------------------------------------


def _zero_channels(mask, dim):
    others = tuple(d for d in range(mask.ndim) if d != dim % mask.ndim)
    return int((mask.sum(axis=others) == 0).sum())


def test_seeded_random_methods_counts(side):
    torch.manual_seed(0)
    shape = (12, 10)
    t = data(shape, 0)
    for seed in range(4):
        for amount in (0.0, 0.25, 0.5, 1.0, 3, 120):
            want = torch_mask(tp.RandomUnstructured(amount), t, np.ones(shape, np.float32))
            got = ap_mask(side, ap.RandomUnstructured(amount, seed=seed), t, np.ones(shape, np.float32))
            assert int((got == 0).sum()) == int((want == 0).sum())
        for dim in (0, 1, -1):
            for amount in (0.0, 0.3, 0.5, 1.0, 2):
                want = torch_mask(tp.RandomStructured(amount, dim), t, np.ones(shape, np.float32))
                got = ap_mask(side, ap.RandomStructured(amount, dim, seed=seed), t, np.ones(shape, np.float32))
                assert _zero_channels(got, dim) == _zero_channels(want, dim)
                assert int((got == 0).sum()) == int((want == 0).sum())


def test_seeded_random_container_chains_counts(side):
    torch.manual_seed(1)
    shape = (10, 8)
    t = data(shape, 1)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        tc = tp.PruningContainer()
        tc._tensor_name = None
        ac = ap.PruningContainer()
        tmask = torch.ones(shape)
        amask = side.asarray(np.ones(shape, np.float32))
        for step in range(4):
            if rng.random() < 0.5:
                amount = float(rng.choice([0.2, 0.5]))
                tm, am = tp.RandomUnstructured(amount), ap.RandomUnstructured(amount, seed=seed * 10 + step)
            else:
                amount, dim = float(rng.choice([0.25, 0.5])), int(rng.integers(-2, 2))
                tm, am = tp.RandomStructured(amount, dim), ap.RandomStructured(amount, dim, seed=seed * 10 + step)
            tc.add_pruning_method(tname(tm))
            ac.add_pruning_method(am)
            old_t, old_a = tmask.numpy().copy(), to_numpy(amask)
            tmask = tc.compute_mask(torch.from_numpy(t.copy()), tmask.clone())
            amask = ac.compute_mask(side.asarray(t), amask)
            got, want = to_numpy(amask), tmask.numpy()
            assert not got[old_a == 0].any() and not want[old_t == 0].any()
            newly_t, newly_a = int(((old_t != 0) & (want == 0)).sum()), int(((old_a != 0) & (got == 0)).sum())
            if isinstance(am, ap.RandomUnstructured):
                # exactly round(amount * remaining) entries, on both sides
                assert newly_a == round(amount * int((old_a != 0).sum()))
                assert newly_t == round(amount * int((old_t != 0).sum()))
            else:
                other = 1 - am.dim % 2  # the axis summed over to get channels
                for old, new in ((old_a, got), (old_t, want)):
                    alive = old.sum(axis=other) != 0
                    dead_now = (new.sum(axis=other) == 0) & alive
                    assert int(dead_now.sum()) == round(amount * int(alive.sum()))


# --------------------------------------------------------------------------------------
# ties: counts agree with torch, arrayprune follows its rule
# --------------------------------------------------------------------------------------


def test_ties_unstructured(side):
    for seed in range(4):
        t = np.random.default_rng(seed).integers(-3, 4, (15, 16)).astype(np.float32)
        for amount in (0.1, 0.3, 0.5, 0.9, 37):
            want = torch_mask(tp.L1Unstructured(amount), t, np.ones(t.shape, np.float32))
            got = ap_mask(side, ap.L1Unstructured(amount), t, np.ones(t.shape, np.float32))
            assert int((got == 0).sum()) == int((want == 0).sum())
            # the same multiset of pruned magnitudes
            np.testing.assert_array_equal(np.sort(np.abs(t[got == 0])), np.sort(np.abs(t[want == 0])))
            k = int((want == 0).sum())
            np.testing.assert_array_equal(got.astype(bool), reference_keep([t], k)[0])


def test_ties_structured(side):
    for seed in range(4):
        t = np.random.default_rng(seed).integers(0, 2, (3, 12)).astype(np.float32)  # many equal norms
        for n in (1, 2, INF):
            for amount in (0.25, 0.5, 5):
                want = torch_mask(tp.LnStructured(amount, n, 1), t, np.ones(t.shape, np.float32))
                got = ap_mask(side, ap.LnStructured(amount, n, 1), t, np.ones(t.shape, np.float32))
                assert _zero_channels(got, 1) == _zero_channels(want, 1)
                norms = np.linalg.norm(t, ord=n, axis=0) if n != 1 else np.abs(t).sum(axis=0)
                k = _zero_channels(want, 1)
                keep = reference_keep([norms], k)[0]
                np.testing.assert_array_equal(got.any(axis=0), keep, err_msg=f"n={n} amount={amount}")
