"""Differential tests: arrayprune.adapters.torch against torch.nn.utils.prune.

Random modules receive random sequences of pruning calls (local and global, with and
without importance scores, repeated, removed, interleaved with training-like updates and
forward passes) through both libraries. Weights are continuous random numbers, so there
are no ties and the deterministic methods must agree exactly: the same parameters and
buffers (values and dtypes), the same pruned tensors, hooks of the same shape, the same
forward outputs and gradients, and the same exception types. Unseeded random methods
must reproduce PyTorch exactly: every call starts both libraries from the same state of
the global generator, and afterwards the masks are equal bit for bit and so are the
generator states (the same draws were made, or none).

The explicit tests below pin the unseeded random methods to PyTorch in all float dtypes
(where draws tie often), fresh and after earlier pruning, through every entry point, and
in global pruning over modules of different dtypes and sizes.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as tprune
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrayprune.adapters.torch as aprune

SETTINGS = settings(
    max_examples=int(os.environ.get("ARRAYPRUNE_DIFF_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

NORMS = [1, 2, 3, 0.5, math.inf, "fro"]


# --------------------------------------------------------------------------------------
# A small zoo of modules, built twice from one seed
# --------------------------------------------------------------------------------------


def make_zoo(seed: int, dtype: torch.dtype) -> tuple[nn.ModuleList, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    mods = nn.ModuleList(
        [nn.Linear(7, 5), nn.Conv1d(3, 4, 3), nn.Conv2d(2, 6, 3), nn.Conv3d(2, 3, 2), nn.Embedding(6, 4)]
    )
    mods = mods.to(dtype)
    with torch.no_grad():
        for p in mods.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype))
    inputs = [
        torch.randn(2, 7, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(2, 3, 8, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(2, 2, 4, 4, 4, generator=g, dtype=torch.float64).to(dtype),
        torch.tensor([[0, 3, 5], [1, 1, 2]]),
    ]
    return mods, inputs


TARGETS = [(i, name) for i in range(5) for name in ("weight", "bias") if not (i == 4 and name == "bias")]


def param_of(module: nn.Module, name: str) -> torch.Tensor:
    return getattr(module, name + "_orig") if hasattr(module, name + "_orig") else getattr(module, name)


def is_pruned_name(module: nn.Module, name: str) -> bool:
    return hasattr(module, name + "_mask")


# --------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------


def hook_shape(module: nn.Module) -> list:
    out = []
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, tprune.PruningContainer):
            out.append((hook._tensor_name, tuple(type(m).__name__ for m in hook)))
        elif isinstance(hook, tprune.BasePruningMethod):
            out.append((hook._tensor_name, type(hook).__name__))
    return sorted(out, key=repr)


def assert_same_state(t_mods: nn.ModuleList, a_mods: nn.ModuleList) -> None:
    for tm, am in zip(t_mods, a_mods, strict=True):
        tp, ap_ = dict(tm.named_parameters()), dict(am.named_parameters())
        tb, ab = dict(tm.named_buffers()), dict(am.named_buffers())
        assert tp.keys() == ap_.keys()
        assert tb.keys() == ab.keys()
        for key in tp:
            assert tp[key].dtype == ap_[key].dtype
            assert torch.equal(tp[key], ap_[key]), key
        for key in tb:
            assert tb[key].dtype == ab[key].dtype, (key, tb[key].dtype, ab[key].dtype)
            assert torch.equal(tb[key], ab[key]), (key, tb[key], ab[key])
        for key in tb:
            if key.endswith("_mask"):
                name = key[: -len("_mask")]
                assert torch.equal(getattr(tm, name), getattr(am, name)), name
        assert hook_shape(tm) == hook_shape(am)


def forward_all(mods: nn.ModuleList, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [m(x) for m, x in zip(mods, inputs, strict=True)]


def assert_same_forward_backward(t_mods, a_mods, inputs) -> None:
    t_out, a_out = forward_all(t_mods, inputs), forward_all(a_mods, inputs)
    for x, y in zip(t_out, a_out, strict=True):
        assert torch.equal(x, y)
    sum(o.float().sum() for o in t_out).backward()
    sum(o.float().sum() for o in a_out).backward()
    # (by name: after a failed first pruning PyTorch re-registers the parameter last,
    # arrayprune restores the original order)
    t_params, a_params = dict(t_mods.named_parameters()), dict(a_mods.named_parameters())
    assert t_params.keys() == a_params.keys()
    for key, pt in t_params.items():
        pa = a_params[key]
        assert (pt.grad is None) == (pa.grad is None)
        if pt.grad is not None:
            assert torch.equal(pt.grad, pa.grad), key
    for _tm, am in zip(t_mods, a_mods, strict=True):
        for key, buf in am.named_buffers():
            if key.endswith("_mask"):
                grad = getattr(am, key[: -len("_mask")] + "_orig").grad
                if grad is not None:
                    assert torch.all(grad[buf == 0] == 0)


def run_both(fn_torch, fn_ours):
    """Run an operation through both libraries, from one state of the global generator.

    Returns the exceptions (or None) and the generator states after each call; the
    generator is left as PyTorch's call left it.
    """
    errors, states = [], []
    start = torch.get_rng_state()
    for fn in (fn_torch, fn_ours):
        torch.set_rng_state(start)
        try:
            fn()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - any exception type is compared
            errors.append(exc)
        states.append(torch.get_rng_state())
    torch.set_rng_state(states[0])
    return errors, states


def state_snapshot(mods: nn.ModuleList) -> list:
    snap = []
    for m in mods:
        snap.append(
            (
                {k: v for k, v in m._parameters.items()},
                {k: v.clone() for k, v in m._buffers.items() if v is not None},
                list(m._forward_pre_hooks.items()),
                [(h, tuple(h)) for h in m._forward_pre_hooks.values() if isinstance(h, tprune.PruningContainer)],
                {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)},
            )
        )
    return snap


def assert_unchanged(mods: nn.ModuleList, snap: list) -> None:
    for m, (params, buffers, hooks, containers, attrs) in zip(mods, snap, strict=True):
        assert m._parameters.keys() == params.keys()
        assert all(m._parameters[k] is v for k, v in params.items())
        assert m._buffers.keys() == buffers.keys()
        assert all(torch.equal(m._buffers[k], v) for k, v in buffers.items())
        assert list(m._forward_pre_hooks.items()) == hooks
        assert [
            (h, tuple(h)) for h in m._forward_pre_hooks.values() if isinstance(h, tprune.PruningContainer)
        ] == containers
        assert {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}.keys() == attrs.keys()
        assert all(vars(m)[k] is v for k, v in attrs.items())


# --------------------------------------------------------------------------------------
# Drawing operations
# --------------------------------------------------------------------------------------


def draw_amount(data, available: int):
    if data.draw(st.booleans(), label="float amount"):
        return data.draw(st.floats(0.0, 1.0), label="amount")
    return data.draw(st.integers(0, available + 1), label="amount")


def remaining_entries(module, name) -> int:
    if is_pruned_name(module, name):
        return int((getattr(module, name + "_mask") == 1).sum())
    return getattr(module, name).numel()


def remaining_channels(module, name, dim) -> int:
    t = param_of(module, name)
    if t.dim() < 2 or not -t.dim() <= dim < t.dim():
        return 2
    d = dim % t.dim()
    if not is_pruned_name(module, name):
        return t.shape[d]
    mask = getattr(module, name + "_mask")
    return int((mask.sum(dim=[i for i in range(t.dim()) if i != d]) != 0).sum())


def scores_like(data, t: torch.Tensor, rng: torch.Generator):
    """Importance scores or None; all scores of an example come from one stream (no ties)."""
    if data.draw(st.booleans(), label="use importance scores"):
        return torch.randn(t.shape, generator=rng, dtype=torch.float64).to(t.dtype)
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_random_call_sequences_match_pytorch(dtype, data, seed):
    t_mods, inputs = make_zoo(seed, dtype)
    a_mods, _ = make_zoo(seed, dtype)
    rng = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)  # random methods draw from the global generator: replayable examples
    n_ops = data.draw(st.integers(1, 7), label="number of calls")
    for _ in range(n_ops):
        kind = data.draw(
            st.sampled_from(
                ["l1", "ln", "random_u", "random_s", "global", "identity", "custom", "remove", "perturb", "forward"]
            ),
            label="call",
        )
        if kind in ("ln", "random_s") and data.draw(st.integers(0, 9), label="weights only") > 0:
            i, name = data.draw(st.sampled_from([t for t in TARGETS if t[1] == "weight"]), label="target")
        else:
            i, name = data.draw(st.sampled_from(TARGETS), label="target")
        tm, am = t_mods[i], a_mods[i]
        t_param = param_of(tm, name)
        snap = state_snapshot(a_mods)

        if kind == "l1":
            amount = draw_amount(data, remaining_entries(am, name))
            scores = scores_like(data, t_param, rng)
            errors, states = run_both(
                lambda: tprune.l1_unstructured(tm, name, amount, importance_scores=scores),
                lambda: aprune.l1_unstructured(am, name, amount, importance_scores=scores),
            )
        elif kind == "ln":
            dim = data.draw(st.integers(-4, 3), label="dim")
            scores = scores_like(data, t_param, rng)
            norms = NORMS + (["nuc"] if t_param.dim() == 3 else []) + ([-math.inf] if scores is not None else [])
            n = data.draw(st.sampled_from(norms), label="n")
            if n == "fro" and t_param.dim() > 3:
                n = 2  # torch.norm refuses 'fro' over more than two dimensions
            amount = draw_amount(data, remaining_channels(am, name, dim))
            errors, states = run_both(
                lambda: tprune.ln_structured(tm, name, amount, n, dim, importance_scores=scores),
                lambda: aprune.ln_structured(am, name, amount, n, dim, importance_scores=scores),
            )
        elif kind == "random_u":
            amount = draw_amount(data, remaining_entries(am, name))
            scores = scores_like(data, t_param, rng)
            if scores is None:
                errors, states = run_both(
                    lambda: tprune.random_unstructured(tm, name, amount),
                    lambda: aprune.random_unstructured(am, name, amount),
                )
            else:  # (the verbs take no scores; the base class's apply does)
                errors, states = run_both(
                    lambda: tprune.BasePruningMethod.apply.__func__(
                        tprune.RandomUnstructured, tm, name, amount=amount, importance_scores=scores
                    ),
                    lambda: aprune.BasePruningMethod.apply.__func__(
                        aprune.RandomUnstructured, am, name, amount=amount, importance_scores=scores
                    ),
                )
        elif kind == "random_s":
            dim = data.draw(st.integers(-3, 2), label="dim")
            amount = draw_amount(data, remaining_channels(am, name, dim))
            errors, states = run_both(
                lambda: tprune.random_structured(tm, name, amount, dim),
                lambda: aprune.random_structured(am, name, amount, dim),
            )
        elif kind == "global":
            chosen = data.draw(st.lists(st.sampled_from(TARGETS), min_size=1, max_size=5, unique=True), label="params")
            t_pairs = [(t_mods[j], nm) for j, nm in chosen]
            a_pairs = [(a_mods[j], nm) for j, nm in chosen]
            t_scores, a_scores = {}, {}
            for (j, nm), tp_, ap_ in zip(chosen, t_pairs, a_pairs, strict=True):
                s = scores_like(data, param_of(t_mods[j], nm), rng)
                if s is not None:
                    t_scores[tp_], a_scores[ap_] = s, s
            amount = draw_amount(data, sum(remaining_entries(a_mods[j], nm) for j, nm in chosen))
            random_method = data.draw(st.booleans(), label="random global")
            t_method = tprune.RandomUnstructured if random_method else tprune.L1Unstructured
            a_method = aprune.RandomUnstructured if random_method else aprune.L1Unstructured
            errors, states = run_both(
                lambda: tprune.global_unstructured(t_pairs, t_method, importance_scores=t_scores, amount=amount),
                lambda: aprune.global_unstructured(a_pairs, a_method, importance_scores=a_scores, amount=amount),
            )
        elif kind == "identity":
            errors, states = run_both(lambda: tprune.identity(tm, name), lambda: aprune.identity(am, name))
        elif kind == "custom":
            seed_m = data.draw(st.integers(0, 2**31 - 1), label="mask seed")
            mask = torch.rand(t_param.shape, generator=torch.Generator().manual_seed(seed_m)) > 0.3
            errors, states = run_both(
                lambda: tprune.custom_from_mask(tm, name, mask), lambda: aprune.custom_from_mask(am, name, mask)
            )
        elif kind == "remove":
            errors, states = run_both(lambda: tprune.remove(tm, name), lambda: aprune.remove(am, name))
            if errors == [None, None]:
                # The permanently pruned zeros would tie: make the values distinct again.
                noise = torch.randn(t_param.shape, generator=rng, dtype=torch.float64).to(dtype)
                with torch.no_grad():
                    getattr(tm, name).add_(noise)
                    getattr(am, name).add_(noise)
        elif kind == "perturb":
            noise = torch.randn(t_param.shape, generator=rng, dtype=torch.float64).to(dtype)
            with torch.no_grad():
                param_of(tm, name).add_(noise)
                param_of(am, name).add_(noise)
            errors, states = [None, None], None
        else:  # forward
            with torch.no_grad():
                for x, y in zip(forward_all(t_mods, inputs), forward_all(a_mods, inputs), strict=True):
                    assert torch.equal(x, y)
            errors, states = [None, None], None

        t_err, a_err = errors
        if kind in ("ln", "random_s") and t_param.dim() < 2:
            # Structured pruning of a 1-D tensor: arrayprune always raises ValueError;
            # PyTorch's container raises IndexError or prunes a phantom channel
            # dimension, depending on dim and amount.
            assert isinstance(a_err, ValueError)
            if t_err is None or not isinstance(t_err, ValueError):
                return
        if states is not None:
            # the same draws (or none), whatever the call and its outcome
            assert torch.equal(states[0], states[1]), f"{kind}: the generators differ afterwards"
        if t_err is not None or a_err is not None:
            assert t_err is not None, f"only arrayprune raised {a_err!r}"
            assert a_err is not None, f"only PyTorch raised {t_err!r}"
            assert isinstance(a_err, type(t_err)), (t_err, a_err)
            assert_unchanged(a_mods, snap)
            try:
                assert_same_state(t_mods, a_mods)
            except AssertionError:
                return  # PyTorch was left half-pruned (it has no full rollback): stop here
            continue
        assert_same_state(t_mods, a_mods)

    assert_same_forward_backward(t_mods, a_mods, inputs)


# --------------------------------------------------------------------------------------
# Unseeded random methods: PyTorch's draws and masks, bit for bit
# --------------------------------------------------------------------------------------

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def distinct_conv(seed: int, dtype: torch.dtype, out_channels: int = 8) -> nn.Conv2d:
    """A Conv2d whose weights have distinct magnitudes, exact in every float dtype.

    Magnitudes are the integers 1..n (n <= 256) over 16 with random signs, so L1 and
    L-inf rankings have no ties even in bfloat16: only the random methods are at stake.
    """
    g = torch.Generator().manual_seed(seed)
    m = nn.Conv2d(3, out_channels, 3).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            n = p.numel()
            signs = torch.randint(0, 2, (n,), generator=g) * 2 - 1
            p.copy_(((torch.randperm(n, generator=g) + 1) * signs / 16).reshape(p.shape).to(dtype))
    return m


def twin_convs(seed: int, dtype: torch.dtype) -> tuple[nn.Conv2d, nn.Conv2d]:
    return distinct_conv(seed, dtype), distinct_conv(seed, dtype)


def same_draws(fn_torch, fn_ours, seed: int) -> Exception | None:
    """Run both under ``torch.manual_seed(seed)``; same exception type and generator state.

    Returns PyTorch's exception (or None).
    """
    errors, states = [], []
    for fn in (fn_torch, fn_ours):
        torch.manual_seed(seed)
        try:
            fn()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - any exception type is compared
            errors.append(exc)
        states.append(torch.get_rng_state())
    t_err, a_err = errors
    assert (t_err is None) == (a_err is None), errors
    if t_err is not None:
        assert isinstance(a_err, type(t_err)), errors
    assert torch.equal(states[0], states[1]), "the global generator ends in another state"
    return t_err


def assert_same_mask(tm: nn.Module, am: nn.Module, name: str = "weight") -> None:
    t_mask, a_mask = getattr(tm, name + "_mask"), getattr(am, name + "_mask")
    assert t_mask.dtype == a_mask.dtype
    assert torch.equal(t_mask, a_mask), (t_mask != a_mask).nonzero()[:5]
    assert torch.equal(getattr(tm, name), getattr(am, name))


def prune_both(kind: str, tm: nn.Module, am: nn.Module, arg: Any, seed: int) -> None:
    """One call of the kind through both libraries, compared."""
    if kind == "random_u":
        same_draws(
            lambda: tprune.random_unstructured(tm, "weight", arg),
            lambda: aprune.random_unstructured(am, "weight", arg),
            seed,
        )
    elif kind == "random_s":
        amount, dim = arg
        same_draws(
            lambda: tprune.random_structured(tm, "weight", amount, dim),
            lambda: aprune.random_structured(am, "weight", amount, dim),
            seed,
        )
    elif kind == "l1":
        same_draws(
            lambda: tprune.l1_unstructured(tm, "weight", arg), lambda: aprune.l1_unstructured(am, "weight", arg), seed
        )
    elif kind == "ln":
        same_draws(
            lambda: tprune.ln_structured(tm, "weight", arg, math.inf, 0),
            lambda: aprune.ln_structured(am, "weight", arg, math.inf, 0),
            seed,
        )
    else:  # custom
        mask = torch.rand(tm.weight.shape, generator=torch.Generator().manual_seed(seed)) > 0.4
        same_draws(
            lambda: tprune.custom_from_mask(tm, "weight", mask),
            lambda: aprune.custom_from_mask(am, "weight", mask),
            seed,
        )
    assert_same_mask(tm, am)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_random_unstructured_fresh_matches_pytorch(dtype):
    for seed in range(6):
        for amount in (0.3, 0.9, 17, 1.0, 216):
            tm, am = twin_convs(seed, dtype)
            prune_both("random_u", tm, am, amount, seed)
            assert int((am.weight_mask == 0).sum()) == (amount if isinstance(amount, int) else round(amount * 216))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_random_structured_fresh_matches_pytorch(dtype):
    # PyTorch draws torch.rand(nchannels): on the CPU, in the default dtype
    default = torch.get_default_dtype()
    try:
        for default_dtype in (torch.float32, torch.float64):
            torch.set_default_dtype(default_dtype)
            for seed in range(6):
                for amount, dim in [(0.5, 0), (3, 0), (0.34, 1), (1, -1), (1.0, 0), (2, 2)]:
                    tm, am = twin_convs(seed, dtype)
                    prune_both("random_s", tm, am, (amount, dim), seed)
    finally:
        torch.set_default_dtype(default)


CHAINS = [
    [("random_u", 0.3), ("random_u", 0.5), ("random_u", 11)],
    [("random_s", (0.25, 0)), ("random_s", (2, 1)), ("random_s", (0.5, 0))],
    [("l1", 0.4), ("random_u", 0.5), ("random_s", (3, 0))],
    [("ln", 2), ("random_s", (0.5, 0)), ("random_u", 0.25)],
    [("custom", None), ("random_u", 20), ("random_s", (1, -1)), ("l1", 5), ("random_u", 1.0)],
    [("random_s", (0.5, 1)), ("ln", 0.25), ("random_u", 0.6), ("random_s", (1.0, 0))],
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("chain", range(len(CHAINS)))
def test_random_methods_after_earlier_pruning_match_pytorch(dtype, chain):
    for seed in range(5):
        tm, am = twin_convs(seed, dtype)
        for step, (kind, arg) in enumerate(CHAINS[chain]):
            prune_both(kind, tm, am, arg, seed * 10 + step)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_amount_zero_draws_nothing(dtype):
    tm, am = twin_convs(0, dtype)
    for kind, arg in [("random_u", 0), ("random_u", 0.0), ("random_s", (0, 0)), ("random_s", (0.01, 1))]:
        torch.manual_seed(3)
        before = torch.get_rng_state()
        prune_both(kind, tm, am, arg, 3)
        assert torch.equal(torch.get_rng_state(), before)
    # pruned before, then nothing more: still no draw
    prune_both("random_u", tm, am, 0.5, 4)
    for kind, arg in [("random_u", 0), ("random_s", (0.0, 0))]:
        torch.manual_seed(5)
        before = torch.get_rng_state()
        prune_both(kind, tm, am, arg, 5)
        assert torch.equal(torch.get_rng_state(), before)
    # and the generator goes on as PyTorch's
    prune_both("random_u", tm, am, 0.5, 6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_amount_too_large_raises_before_drawing(dtype):
    def pruned_twins():
        tm, am = twin_convs(1, dtype)
        prune_both("random_u", tm, am, 0.5, 1)
        prune_both("random_s", tm, am, (2, 0), 2)  # 6 channels remain
        return tm, am

    remaining = int((pruned_twins()[1].weight_mask == 1).sum())
    cases = [
        (lambda lib, m: lib.random_unstructured(m, "weight", remaining + 1), ValueError),
        (lambda lib, m: lib.random_structured(m, "weight", 7, 0), ValueError),
        (lambda lib, m: lib.random_structured(m, "weight", 1, 4), IndexError),
        (lambda lib, m: lib.random_structured(m, "bias", 1, 0), ValueError),
        (lambda lib, m: lib.random_unstructured(m, "bias", 9), ValueError),
    ]
    for call, error in cases:
        tm, am = pruned_twins()
        torch.manual_seed(7)
        before = torch.get_rng_state()
        err = same_draws(lambda: call(tprune, tm), lambda: call(aprune, am), 7)
        assert isinstance(err, error)
        assert torch.equal(torch.get_rng_state(), before)
        # arrayprune's module is untouched and goes on as PyTorch's would have without
        # the failed call (PyTorch drops the pruning hook of a container that fails)
        reference, _ = pruned_twins()
        assert_same_mask(reference, am)
        prune_both("random_u", reference, am, remaining, 8)
        prune_both("random_s", reference, am, (1.0, 0), 9)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("score_dtype", [None, torch.float64, torch.float16], ids=str)
def test_importance_scores_decide_the_draw(dtype, score_dtype):
    # PyTorch draws rand_like(importance_scores): their dtype decides the stream.
    for seed in range(4):
        tm, am = twin_convs(seed, dtype)
        scores = torch.randn(tm.weight.shape, generator=torch.Generator().manual_seed(seed)).to(score_dtype or dtype)
        for step, amount in enumerate([0.3, 5, 0.5]):
            same_draws(
                lambda: tprune.BasePruningMethod.apply.__func__(
                    tprune.RandomUnstructured, tm, "weight", amount=amount, importance_scores=scores
                ),
                lambda: aprune.BasePruningMethod.apply.__func__(
                    aprune.RandomUnstructured, am, "weight", amount=amount, importance_scores=scores
                ),
                seed * 10 + step,
            )
            assert_same_mask(tm, am)
        # prune(): the pruned tensor, from the scores' draw
        t = tm.weight_orig.detach()
        out = []
        for lib in (tprune, aprune):
            torch.manual_seed(seed)
            out.append((lib.RandomUnstructured(0.4).prune(t, importance_scores=scores), torch.get_rng_state()))
        assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_class_entry_points_match_pytorch(dtype):
    t = distinct_conv(2, dtype).weight.detach()
    for seed in range(4):
        ones = torch.ones_like(t)
        partial = (torch.rand(t.shape, generator=torch.Generator().manual_seed(seed)) > 0.3).to(dtype)
        pairs = [
            (tprune.RandomUnstructured(0.3), aprune.RandomUnstructured(0.3)),
            (tprune.RandomUnstructured(13), aprune.RandomUnstructured(13)),
            (tprune.RandomStructured(0.5, 0), aprune.RandomStructured(0.5, 0)),
            (tprune.RandomStructured(2, -1), aprune.RandomStructured(2, -1)),
        ]
        for tm, am in pairs:
            for default in (ones, partial):
                for how in ("compute_mask", "prune", "container"):
                    got = []
                    for method in (tm, am):
                        torch.manual_seed(seed)
                        if how == "compute_mask":
                            out = method.compute_mask(t, default_mask=default.clone())
                        elif how == "prune":
                            out = method.prune(t, default_mask=default.clone())
                        else:
                            method._tensor_name = "w"
                            container = (tprune if method is tm else aprune).PruningContainer(method)
                            out = container.compute_mask(t, default_mask=default.clone())
                        got.append((out, torch.get_rng_state()))
                    (t_out, t_state), (a_out, a_state) = got
                    assert t_out.dtype == a_out.dtype, (how, tm)
                    assert torch.equal(t_out, a_out), (how, tm)
                    assert torch.equal(t_state, a_state), (how, tm)
        # apply(): the class method of either library, on twin modules
        tmod, amod = twin_convs(seed, dtype)
        same_draws(
            lambda: tprune.RandomStructured.apply(tmod, "weight", 0.5, 1),
            lambda: aprune.RandomStructured.apply(amod, "weight", 0.5, 1),
            seed,
        )
        same_draws(
            lambda: tprune.RandomUnstructured.apply(tmod, "weight", 0.5),
            lambda: aprune.RandomUnstructured.apply(amod, "weight", 0.5),
            seed + 1,
        )
        assert_same_mask(tmod, amod)


def global_zoo(seed: int) -> nn.ModuleList:
    """Modules of different dtypes and sizes, some pruned already, with distinct magnitudes."""
    g = torch.Generator().manual_seed(seed)
    mods = nn.ModuleList(
        [
            nn.Linear(9, 7).to(torch.float32),
            nn.Conv2d(2, 5, 3).to(torch.float16),
            nn.Linear(4, 3).to(torch.float64),
            nn.Conv1d(3, 4, 2).to(torch.bfloat16),
            nn.Linear(30, 6).to(torch.float32),
        ]
    )
    with torch.no_grad():
        for p in mods.parameters():
            n = p.numel()
            signs = torch.randint(0, 2, (n,), generator=g) * 2 - 1
            p.copy_(((torch.randperm(n, generator=g) + 1) * signs / 16).reshape(p.shape).to(p.dtype))
    return mods


GLOBAL_SETS = [
    [(0, "weight"), (1, "weight"), (2, "weight")],  # float32 + float16 + float64: float64 draws
    [(1, "weight"), (3, "weight")],  # float16 + bfloat16: float32 draws
    [(3, "weight"), (3, "bias")],  # bfloat16 only
    [(1, "weight"), (1, "bias")],  # float16 only
    [(4, "weight"), (0, "bias"), (1, "weight"), (3, "weight"), (2, "bias")],
]


@pytest.mark.parametrize("which", range(len(GLOBAL_SETS)))
@pytest.mark.parametrize("use_scores", [False, True])
def test_global_random_unstructured_matches_pytorch(which, use_scores):
    for seed in range(4):
        t_mods, a_mods = global_zoo(seed), global_zoo(seed)
        # some parameters pruned already, by different methods
        prune_both("random_u", t_mods[0], a_mods[0], 0.3, seed)
        same_draws(
            lambda: tprune.l1_unstructured(t_mods[1], "weight", 0.5),
            lambda: aprune.l1_unstructured(a_mods[1], "weight", 0.5),
            seed,
        )
        same_draws(
            lambda: tprune.random_structured(t_mods[3], "weight", 1, 0),
            lambda: aprune.random_structured(a_mods[3], "weight", 1, 0),
            seed,
        )
        t_pairs = [(t_mods[i], name) for i, name in GLOBAL_SETS[which]]
        a_pairs = [(a_mods[i], name) for i, name in GLOBAL_SETS[which]]
        t_scores, a_scores = {}, {}
        if use_scores:  # scores for the first pair only, in another dtype
            s = torch.randn(
                getattr(*t_pairs[0]).shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
            )
            t_scores[t_pairs[0]], a_scores[a_pairs[0]] = s, s
        for step, amount in enumerate([0.2, 9, 0.0, 0, 0.5, 1.0]):
            same_draws(
                lambda: tprune.global_unstructured(
                    t_pairs, tprune.RandomUnstructured, importance_scores=t_scores, amount=amount
                ),
                lambda: aprune.global_unstructured(
                    a_pairs, aprune.RandomUnstructured, importance_scores=a_scores, amount=amount
                ),
                seed * 10 + step,
            )
            for (tm, name), (am, _) in zip(t_pairs, a_pairs, strict=True):
                assert_same_mask(tm, am, name)
        # nothing left: an integer amount is too large, before any draw
        torch.manual_seed(0)
        before = torch.get_rng_state()
        err = same_draws(
            lambda: tprune.global_unstructured(t_pairs, tprune.RandomUnstructured, amount=1),
            lambda: aprune.global_unstructured(a_pairs, aprune.RandomUnstructured, amount=1),
            0,
        )
        assert isinstance(err, ValueError)
        assert torch.equal(torch.get_rng_state(), before)


def test_global_random_zero_amount_draws_nothing():
    t_mods, a_mods = global_zoo(0), global_zoo(0)
    pairs = [(0, "weight"), (1, "weight"), (3, "bias")]
    for amount in (0, 0.0, 0.001):
        torch.manual_seed(1)
        before = torch.get_rng_state()
        same_draws(
            lambda: tprune.global_unstructured(
                [(t_mods[i], n) for i, n in pairs], tprune.RandomUnstructured, amount=amount
            ),
            lambda: aprune.global_unstructured(
                [(a_mods[i], n) for i, n in pairs], aprune.RandomUnstructured, amount=amount
            ),
            1,
        )
        assert torch.equal(torch.get_rng_state(), before)
        for i, name in pairs:
            assert_same_mask(t_mods[i], a_mods[i], name)


def test_seeded_random_methods_keep_arrayprune_streams():
    # seed= / generator= use the core's documented streams and leave the global generator alone
    import arrayprune as ap

    t = distinct_conv(3, torch.float32).weight.detach()
    for seed in range(3):
        m = distinct_conv(3, torch.float32)  # (module initialization draws)
        torch.manual_seed(0)
        before = torch.get_rng_state()
        for ours, core in [
            (aprune.RandomUnstructured(0.4, seed=seed), ap.RandomUnstructured(0.4, seed=seed)),
            (aprune.RandomStructured(3, 0, seed=seed), ap.RandomStructured(3, 0, seed=seed)),
        ]:
            got = ours.compute_mask(t, torch.ones_like(t))
            want = core.compute_mask(t, torch.ones_like(t))
            assert torch.equal(got, want)
        aprune.random_unstructured(m, "weight", 0.4, generator=torch.Generator().manual_seed(seed))
        want = ap.RandomUnstructured(0.4, generator=torch.Generator().manual_seed(seed)).compute_mask(t, None)
        assert torch.equal(m.weight_mask, want.to(torch.float32))
        assert torch.equal(torch.get_rng_state(), before)
