"""Tests of arrayprune.adapters.torch, the drop-in for torch.nn.utils.prune."""

from __future__ import annotations

import copy
import inspect
import io
import math
import pickle
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as tprune

import arrayprune.adapters.torch as prune

PUBLIC = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]
PRIVATE_HELPERS = [
    "_validate_pruning_amount_init",
    "_validate_pruning_amount",
    "_compute_nparams_toprune",
    "_validate_pruning_dim",
    "_compute_norm",
]


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """`module` with continuous random parameters (no ties), from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return module


def pruning_hook(module: nn.Module, name: str):
    hooks = [
        h
        for h in module._forward_pre_hooks.values()
        if isinstance(h, tprune.BasePruningMethod) and h._tensor_name == name
    ]
    assert len(hooks) == 1
    return hooks[0]


def snapshot(module: nn.Module) -> dict:
    """Everything pruning may touch, by identity (and buffer values)."""
    return {
        "params": list(module._parameters.items()),
        "buffers": [(k, v, v.clone()) for k, v in module._buffers.items()],
        "hooks": list(module._forward_pre_hooks.items()),
        "containers": [
            (h, tuple(h)) for h in module._forward_pre_hooks.values() if isinstance(h, tprune.PruningContainer)
        ],
        "attrs": dict(vars(module)),
        "flat": list(module._flat_weights) if hasattr(module, "_flat_weights") else None,
    }


def assert_as_before(module: nn.Module, snap: dict) -> None:
    params = list(module._parameters.items())
    assert [k for k, _ in params] == [k for k, _ in snap["params"]]
    assert all(a is b for (_, a), (_, b) in zip(params, snap["params"], strict=True))
    buffers = list(module._buffers.items())
    assert [k for k, _ in buffers] == [k for k, _, _ in snap["buffers"]]
    assert all(
        v is old and torch.equal(v, val) for (_, v), (_, old, val) in zip(buffers, snap["buffers"], strict=True)
    )
    assert list(module._forward_pre_hooks.items()) == snap["hooks"]
    assert [
        (h, tuple(h)) for h in module._forward_pre_hooks.values() if isinstance(h, tprune.PruningContainer)
    ] == snap["containers"]
    attrs = dict(vars(module))
    assert attrs.keys() == snap["attrs"].keys()
    assert all(attrs[k] is v for k, v in snap["attrs"].items())
    if snap["flat"] is not None:
        assert all(a is b for a, b in zip(module._flat_weights, snap["flat"], strict=True))


# --------------------------------------------------------------------------------------
# API surface
# --------------------------------------------------------------------------------------


#: arrayprune's additions to PyTorch's public names.
EXTENSIONS = [
    "NMStructured",
    "BlockUnstructured",
    "Wanda",
    "nm_structured",
    "block_unstructured",
    "wanda",
    "prune_to_sparsity",
    "input_norms",
    "save_input_norms",
    "wanda_importance",
    "sparsegpt",
    "reconstruct",
    "shrink",
    "channel_groups",
    "shrink_llm",
]


def test_public_api_matches_torch():
    assert sorted(prune.__all__) == sorted(PUBLIC + EXTENSIONS)
    torch_public = {
        n
        for n in dir(tprune)
        if not n.startswith("_") and n not in {"ABC", "abstractmethod", "Iterable", "numbers", "torch"}
    }
    assert torch_public <= set(PUBLIC)
    for name in PUBLIC + PRIVATE_HELPERS:
        assert hasattr(prune, name), name


@pytest.mark.parametrize("name", [n for n in PUBLIC if n[0].islower()] + PRIVATE_HELPERS)
def test_function_signatures_extend_torch(name):
    var_kw = inspect.Parameter.VAR_KEYWORD
    ours_all = list(inspect.signature(getattr(prune, name)).parameters.values())
    theirs_all = list(inspect.signature(getattr(tprune, name)).parameters.values())
    # Keyword-only additions necessarily come before a **kwargs: compare without it.
    assert [p.kind for p in ours_all if p.kind is var_kw] == [p.kind for p in theirs_all if p.kind is var_kw]
    ours = [p for p in ours_all if p.kind is not var_kw]
    theirs = [p for p in theirs_all if p.kind is not var_kw]
    assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [(p.name, p.kind, p.default) for p in theirs]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in ours[len(theirs) :])


@pytest.mark.parametrize(
    "name", [n for n in PUBLIC if n[0].isupper() and n not in {"BasePruningMethod", "PruningContainer"}]
)
def test_class_signatures_extend_torch(name):
    for attr in ("__init__", "apply"):
        ours = list(inspect.signature(getattr(getattr(prune, name), attr)).parameters.values())
        theirs = list(inspect.signature(getattr(getattr(tprune, name), attr)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [
            (p.name, p.kind, p.default) for p in theirs
        ]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs) :])
    assert issubclass(getattr(prune, name), getattr(tprune, name))
    assert getattr(prune, name).PRUNING_TYPE == getattr(tprune, name).PRUNING_TYPE


def test_docstring_examples():
    import doctest

    result = doctest.testmod(prune, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_classes_derive_from_torch():
    assert issubclass(prune.BasePruningMethod, tprune.BasePruningMethod)
    assert issubclass(prune.PruningContainer, tprune.PruningContainer)
    with pytest.raises(TypeError):
        prune.BasePruningMethod()  # abstract


# --------------------------------------------------------------------------------------
# Private helpers
# --------------------------------------------------------------------------------------


def test_amount_helpers():
    with pytest.raises(TypeError):
        prune._validate_pruning_amount_init(amount="half")
    for bad in (1.1, 20.0, -0.1, -10):
        with pytest.raises(ValueError):
            prune._validate_pruning_amount_init(amount=bad)
    for good in (0.34, 1500, 0, 0.0, 1, 1.0):
        prune._validate_pruning_amount_init(amount=good)
    with pytest.raises(ValueError):
        prune._validate_pruning_amount(amount=20, tensor_size=19)
    for amount, size in ((0.3, 0), (19, 20), (0, 0), (1, 1)):
        prune._validate_pruning_amount(amount=amount, tensor_size=size)
    for amount, size, expected in (
        (0, 15, 0),
        (10, 15, 10),
        (1, 15, 1),
        (1.0, 15, 15),
        (0.4, 17, 7),
        (0.5, 5, 2),
        (0.5, 7, 4),
    ):
        assert prune._compute_nparams_toprune(amount=amount, tensor_size=size) == expected
        assert prune._compute_nparams_toprune(amount, size) == tprune._compute_nparams_toprune(amount, size)


def test_dim_and_norm_helpers():
    t = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1))
    prune._validate_pruning_dim(t, 2)
    prune._validate_pruning_dim(t, -3)
    for bad in (3, 7):
        with pytest.raises(IndexError):
            prune._validate_pruning_dim(t, bad)
        with pytest.raises(IndexError):
            tprune._validate_pruning_dim(t, bad)
    with pytest.raises(IndexError):
        prune._validate_pruning_dim(t, -4)
    for n in (1, 2, 3, 0.5, 0, math.inf, -math.inf, "fro", "nuc"):
        for dim in (0, 1, -1):
            ours, theirs = prune._compute_norm(t, n, dim), tprune._compute_norm(t, n, dim)
            assert ours.shape == theirs.shape == (t.shape[dim],)
            torch.testing.assert_close(ours, theirs)


# --------------------------------------------------------------------------------------
# Reparametrization
# --------------------------------------------------------------------------------------


def test_reparametrization_is_pytorchs():
    m = seeded(nn.Linear(6, 4))
    weight = m.weight
    ids = [id(p) for p in m.parameters()]
    returned = prune.l1_unstructured(m, "weight", amount=0.5)
    assert returned is m
    assert m.weight_orig is weight  # the same Parameter object, moved
    assert "weight" not in dict(m.named_parameters())
    assert sorted(dict(m.named_parameters())) == ["bias", "weight_orig"]
    assert sorted(dict(m.named_buffers())) == ["weight_mask"]
    assert sorted(m.state_dict()) == ["bias", "weight_mask", "weight_orig"]
    assert m.weight_mask.dtype == weight.dtype
    assert int((m.weight_mask == 0).sum()) == 12
    assert set(m.weight_mask.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(m.weight, m.weight_orig * m.weight_mask)
    assert sorted(id(p) for p in m.parameters()) == sorted(ids)
    hook = pruning_hook(m, "weight")
    assert isinstance(hook, prune.L1Unstructured)
    assert isinstance(hook, tprune.BasePruningMethod)
    assert isinstance(hook, tprune.L1Unstructured)
    assert hook._tensor_name == "weight"
    # the 12 smallest magnitudes are the ones pruned
    threshold = weight.detach().abs().flatten().sort().values[11]
    assert torch.equal(m.weight_mask == 0, weight.detach().abs() <= threshold)


def test_hook_recomputes_before_every_forward_and_gradients_are_masked():
    m = seeded(nn.Linear(5, 3))
    prune.random_unstructured(m, "weight", amount=0.4)
    x = torch.randn(2, 5)
    with torch.no_grad():
        m.weight_orig.add_(1.0)
    y = m(x)
    assert torch.equal(m.weight, m.weight_orig * m.weight_mask)
    torch.testing.assert_close(y, x @ (m.weight_orig * m.weight_mask).T + m.bias)
    y.sum().backward()
    expected = m.weight_mask * x.sum(0)
    torch.testing.assert_close(m.weight_orig.grad, expected.expand_as(m.weight_orig))
    assert torch.all(m.weight_orig.grad[m.weight_mask == 0] == 0)
    assert m.weight_mask.grad is None and not m.weight_mask.requires_grad


def test_identity_changes_nothing():
    m = seeded(nn.Linear(5, 2))
    x = torch.randn(3, 5)
    before = m(x)
    prune.identity(m, "weight")
    assert torch.equal(m.weight_mask, torch.ones(2, 5))
    assert torch.equal(m(x), before)
    assert isinstance(pruning_hook(m, "weight"), prune.Identity)


def test_pruning_twice_builds_a_container():
    m = seeded(nn.Conv3d(2, 4, 2))
    prune.l1_unstructured(m, "weight", amount=0.1)
    first = m.weight_mask.clone()
    prune.ln_structured(m, "weight", amount=0.3, n=2, dim=0)
    hook = pruning_hook(m, "weight")
    assert isinstance(hook, prune.PruningContainer)
    assert isinstance(hook, tprune.PruningContainer)
    assert hook._tensor_name == "weight"
    assert len(hook) == 2
    assert isinstance(hook[0], tprune.L1Unstructured) and isinstance(hook[1], tprune.LnStructured)
    assert torch.all(m.weight_mask[first == 0] == 0)
    pruned_channels = int((m.weight_mask.sum(dim=(1, 2, 3, 4)) == 0).sum())
    assert pruned_channels == round(0.3 * 4)
    prune.random_unstructured(m, "weight", amount=0.2)
    again = pruning_hook(m, "weight")
    assert again is hook and len(hook) == 3 and list(hook)[2].amount == 0.2


def test_iterative_amount_is_relative_to_what_remains():
    m = seeded(nn.Linear(10, 10))
    prune.l1_unstructured(m, "weight", amount=0.5)
    prune.l1_unstructured(m, "weight", amount=0.5)
    assert int((m.weight_mask == 0).sum()) == 50 + 25
    prune.l1_unstructured(m, "weight", amount=3)
    assert int((m.weight_mask == 0).sum()) == 78
    # the survivors are the largest magnitudes
    kept = m.weight_orig.detach().abs()[m.weight_mask == 1]
    dropped = m.weight_orig.detach().abs()[m.weight_mask == 0]
    assert kept.min() > dropped.max()


def test_remove_makes_pruning_permanent():
    m = seeded(nn.Linear(5, 7))
    original = m.weight
    prune.random_unstructured(m, "weight", amount=0.5)
    prune.l1_unstructured(m, "weight", amount=0.5)
    pruned = m.weight.detach().clone()
    x = torch.randn(2, 5)
    y = m(x)
    assert prune.remove(m, "weight") is m
    assert m.weight is original and isinstance(m.weight, nn.Parameter)
    assert torch.equal(m.weight.detach(), pruned)
    assert sorted(dict(m.named_parameters())) == ["bias", "weight"]
    assert dict(m.named_buffers()) == {}
    assert len(m._forward_pre_hooks) == 0
    assert torch.equal(m(x), y)
    assert not prune.is_pruned(m)
    with pytest.raises(ValueError):
        prune.remove(m, "weight")
    with pytest.raises(ValueError):
        prune.remove(m, "bias")


def test_is_pruned_looks_into_submodules():
    net = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 2)))
    assert not prune.is_pruned(net)
    prune.l1_unstructured(net[1][1], "bias", amount=1)
    assert prune.is_pruned(net) and tprune.is_pruned(net)
    assert not prune.is_pruned(net[0])


def test_prune_method_on_tensors():
    p = prune.L1Unstructured(amount=2)
    t = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    default = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    assert torch.equal(p.prune(t, default), t * torch.tensor([[0, 0, 1, 0], [1, 1, 0, 1]]))
    scores = torch.tensor([[1.0, 2, 3, 4], [1.5, 1.6, 1.7, 1.8]])
    assert torch.equal(p.prune(t, default, importance_scores=scores), t * torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1]]))
    assert torch.equal(p.prune(t), t * torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
    w = torch.randn(4, 4, requires_grad=True)
    prune.L1Unstructured(amount=0.5).prune(w).sum().backward()
    assert int((w.grad == 0).sum()) == 8


def test_compute_mask_of_each_method():
    t = torch.tensor([[1.0, -2, 3, -4], [5, -6, 0.5, 8]])
    ones = torch.ones_like(t)
    assert torch.equal(prune.L1Unstructured(3).compute_mask(t, ones), torch.tensor([[0.0, 0, 1, 1], [1, 1, 0, 1]]))
    assert torch.equal(prune.LnStructured(1, n=1, dim=0).compute_mask(t, ones), torch.tensor([[0.0] * 4, [1.0] * 4]))
    assert torch.equal(
        prune.LnStructured(2, n=math.inf, dim=-1).compute_mask(t, ones), torch.tensor([[0.0, 1, 0, 1], [0, 1, 0, 1]])
    )
    assert prune.Identity().compute_mask(t, ones) is ones
    custom = prune.CustomFromMask(mask=torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]]))
    got = custom.compute_mask(torch.rand(2, 4), torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    assert torch.equal(got, torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]]))
    # nothing pruned: structured methods hand back the default mask itself, as PyTorch's
    assert prune.LnStructured(0, n=2, dim=0).compute_mask(t, ones) is ones
    # ties: lowest index first
    flat = torch.tensor([1.0, -1.0, 1.0, 2.0])
    assert torch.equal(prune.L1Unstructured(2).compute_mask(flat, torch.ones(4)), torch.tensor([0.0, 0, 1, 1]))
    # masks of structured methods take the dtype of the scores when something is pruned
    assert prune.LnStructured(1, n=2, dim=0).compute_mask(t.double(), ones).dtype == torch.float64
    assert prune.RandomStructured(1, dim=0).compute_mask(t.double(), ones).dtype == torch.float64
    assert prune.L1Unstructured(1).compute_mask(t.double(), ones).dtype == torch.float32


def test_container_api():
    container = prune.PruningContainer()
    container._tensor_name = "test"
    assert len(container) == 0
    with pytest.raises(IndexError):
        container.compute_mask(torch.ones(2), torch.ones(2))
    p = prune.L1Unstructured(amount=2)
    p._tensor_name = "test"
    container.add_pruning_method(p)
    q = prune.L1Unstructured(amount=2)
    q._tensor_name = "another"
    with pytest.raises(ValueError):
        container.add_pruning_method(q)
    for bad in (10, "ugh", prune.L1Unstructured):
        with pytest.raises(TypeError):
            container.add_pruning_method(bad)
    assert list(container) == [p] and container[0] is p

    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.float32)
    default = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    got = container.compute_mask(t, default)
    assert got.dtype == torch.float32  # the dtype of t, as in PyTorch
    assert torch.equal(got, torch.tensor([[0.0, 0, 1, 0], [1, 1, 0, 1]]))
    r = prune.LnStructured(amount=1, n=2, dim=0)
    r._tensor_name = "test"
    container.add_pruning_method(r)
    assert torch.equal(container.compute_mask(t, default), torch.tensor([[0.0, 0, 0, 0], [1, 1, 0, 1]]))
    s = prune.LnStructured(amount=1, n=2, dim=1)
    s._tensor_name = "test"
    container.add_pruning_method(s)
    assert torch.equal(container.compute_mask(t, default), torch.tensor([[0.0, 1, 1, 0], [0, 1, 0, 1]]))
    # constructed from several methods, or from one iterable of them
    both = prune.PruningContainer(p, r)
    assert both._tensor_name == "test" and list(both) == [p, r]
    assert list(prune.PruningContainer([p, r])) == [p, r]


def test_functional_api_calls_compute_mask_through_the_class():
    m = seeded(nn.Linear(5, 2))
    mask = torch.zeros_like(m.weight)
    mask[1, 0] = mask[0, 3] = 1
    with mock.patch.object(prune.RandomUnstructured, "compute_mask", return_value=mask) as patched:
        prune.random_unstructured(m, "weight", amount=0.9)
    assert patched.call_count == 1
    assert torch.equal(m.weight_mask, mask)
    y = m(torch.ones(1, 5))
    torch.testing.assert_close(y[0, 0], m.weight_orig[0, 3] + m.bias[0])
    torch.testing.assert_close(y[0, 1], m.weight_orig[1, 0] + m.bias[1])
    # inside a container the (patched) compute_mask sees the unpruned entries only
    seen = []

    def fake(self, t, default_mask):
        seen.append(t.shape)
        return torch.zeros_like(default_mask)

    with mock.patch.object(prune.L1Unstructured, "compute_mask", fake):
        prune.l1_unstructured(m, "weight", amount=1)
    assert seen == [torch.Size([2])]
    assert torch.equal(m.weight_mask, torch.zeros_like(mask))


# --------------------------------------------------------------------------------------
# Rollback
# --------------------------------------------------------------------------------------


class Boom(Exception):
    pass


class FailingMethod(prune.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        raise Boom("cannot compute this mask")


MODULE_FACTORIES = [lambda: nn.Linear(5, 7), lambda: nn.Conv3d(2, 2, 2), lambda: nn.LSTM(4, 3)]


@pytest.mark.parametrize("make", MODULE_FACTORIES)
@pytest.mark.parametrize("earlier", [0, 1, 2])
def test_failed_mask_leaves_the_module_exactly_as_it_was(make, earlier):
    m = seeded(make())
    name = "weight_ih_l0" if isinstance(m, nn.LSTM) else "weight"
    other = "bias_hh_l0" if isinstance(m, nn.LSTM) else "bias"
    prune.l1_unstructured(m, other, amount=1)  # an unrelated hook
    m.register_forward_pre_hook(lambda mod, inp: None)
    for _ in range(earlier):  # 0: first pruning; 1: a method becomes a container; 2: container grows
        prune.random_unstructured(m, name, amount=0.2)
    snap = snapshot(m)
    with pytest.raises(Boom):
        FailingMethod.apply(m, name)
    assert_as_before(m, snap)
    with mock.patch.object(prune.L1Unstructured, "compute_mask", side_effect=Boom("HA!")):
        with pytest.raises(Boom):
            prune.l1_unstructured(m, name, amount=0.9)
    assert_as_before(m, snap)
    assert (name in dict(m.named_parameters())) == (earlier == 0)
    # still usable afterwards
    prune.l1_unstructured(m, name, amount=0.5)
    assert isinstance(pruning_hook(m, name), prune.PruningContainer) == (earlier > 0)


def test_failure_on_top_of_pytorch_pruning_rolls_back():
    m = seeded(nn.Linear(5, 4))
    tprune.l1_unstructured(m, "weight", amount=0.2)
    tprune.random_unstructured(m, "weight", amount=0.2)
    snap = snapshot(m)
    with pytest.raises(Boom):
        FailingMethod.apply(m, "weight")
    assert_as_before(m, snap)


ERROR_CASES = [
    (lambda lib, m: lib.l1_unstructured(m, "weight", amount="a lot"), TypeError),
    (lambda lib, m: lib.l1_unstructured(m, "weight", amount=1.5), ValueError),
    (lambda lib, m: lib.l1_unstructured(m, "weight", amount=-1), ValueError),
    (lambda lib, m: lib.l1_unstructured(m, "weight", amount=21), ValueError),
    (lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.5, importance_scores=torch.ones(5, 4)), AssertionError),
    (lambda lib, m: lib.ln_structured(m, "weight", amount=0.5, n=2, dim=2), IndexError),
    (lambda lib, m: lib.ln_structured(m, "weight", amount=0.5, n=2, dim=-3), IndexError),
    (lambda lib, m: lib.ln_structured(m, "weight", amount=5, n=2, dim=0), ValueError),
    (lambda lib, m: lib.ln_structured(m, "bias", amount=1, n=2, dim=0), ValueError),
    (lambda lib, m: lib.random_structured(m, "bias", amount=1, dim=0), ValueError),
    (lambda lib, m: lib.random_structured(m, "weight", amount=1, dim=3), IndexError),
    (lambda lib, m: lib.l1_unstructured(m, "no_such_param", amount=1), AttributeError),
    (lambda lib, m: lib.custom_from_mask(m, "weight", mask=torch.ones(5, 4)), AssertionError),
]
STRUCTURED_1D = (ERROR_CASES[8][0], ERROR_CASES[9][0])


@pytest.mark.parametrize("case", range(len(ERROR_CASES)))
@pytest.mark.parametrize("pruned_before", [False, True])
def test_errors_match_pytorch_and_leave_the_module_untouched(case, pruned_before):
    call, error = ERROR_CASES[case]
    modules = {}
    for lib in (prune, tprune):
        m = seeded(nn.Linear(5, 4))
        if pruned_before:
            lib.l1_unstructured(m, "weight", amount=0.1)
            lib.l1_unstructured(m, "bias", amount=1)
        modules[lib] = m
    snap = snapshot(modules[prune])
    with pytest.raises(error) as ours:
        call(prune, modules[prune])
    assert_as_before(modules[prune], snap)
    if pruned_before and call in STRUCTURED_1D:
        # PyTorch's container quietly prunes a phantom channel dimension of a 1-D
        # tensor here; arrayprune refuses structured pruning of 1-D tensors throughout.
        return
    with pytest.raises(error) as theirs:
        call(tprune, modules[tprune])
    if isinstance(theirs.value, AssertionError) and not isinstance(theirs.value, ValueError):
        assert isinstance(ours.value, ValueError)  # shape mismatches are both, in arrayprune
    else:
        assert isinstance(ours.value, type(theirs.value))


def test_seed_and_generator_together_raise_typeerror():
    m = seeded(nn.Linear(5, 4))
    snap = snapshot(m)
    with pytest.raises(TypeError):
        prune.random_unstructured(m, "weight", amount=0.5, seed=1, generator=torch.Generator())
    assert_as_before(m, snap)


def test_pruning_a_missing_bias_raises_typeerror_like_torch():
    m = nn.Linear(3, 2, bias=False)
    snap = snapshot(m)
    with pytest.raises(TypeError):
        prune.l1_unstructured(m, "bias", amount=1)
    assert_as_before(m, snap)
    with pytest.raises(TypeError):
        tprune.l1_unstructured(nn.Linear(3, 2, bias=False), "bias", amount=1)


def test_global_failure_restores_every_module():
    a, b = seeded(nn.Linear(4, 3), 1), seeded(nn.Linear(3, 2), 2)
    prune.l1_unstructured(b, "weight", amount=1)
    snaps = [snapshot(a), snapshot(b)]
    calls = []
    real = prune.CustomFromMask.compute_mask

    def second_fails(self, t, default_mask):
        calls.append(1)
        if len(calls) == 2:
            raise Boom("second parameter")
        return real(self, t, default_mask)

    with mock.patch.object(prune.CustomFromMask, "compute_mask", second_fails):
        with pytest.raises(Boom):
            prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured, amount=0.5)
    assert calls == [1, 1]
    assert_as_before(a, snaps[0])
    assert_as_before(b, snaps[1])


# --------------------------------------------------------------------------------------
# Serialization
# --------------------------------------------------------------------------------------


def pruned_model() -> nn.Sequential:
    net = seeded(nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)))
    prune.l1_unstructured(net[0], "weight", amount=0.3)
    prune.ln_structured(net[0], "weight", amount=1, n=2, dim=0)
    prune.random_unstructured(net[3], "bias", amount=2, seed=7)
    prune.global_unstructured([(net[0], "weight"), (net[3], "weight")], prune.L1Unstructured, amount=0.4)
    return net


X = torch.randn(3, 2, 6, 6, generator=torch.Generator().manual_seed(5))


def assert_same_pruned_model(a: nn.Module, b: nn.Module) -> None:
    assert a.state_dict().keys() == b.state_dict().keys()
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and va.dtype == vb.dtype and torch.equal(va, vb)
    for ma, mb in zip(a.modules(), b.modules(), strict=True):
        ha = [
            (type(h).__name__, h._tensor_name, len(h) if isinstance(h, tprune.PruningContainer) else 0)
            for h in ma._forward_pre_hooks.values()
        ]
        hb = [
            (type(h).__name__, h._tensor_name, len(h) if isinstance(h, tprune.PruningContainer) else 0)
            for h in mb._forward_pre_hooks.values()
        ]
        assert ha == hb
    assert torch.equal(a(X), b(X))


def assert_independent_and_trainable(copy_: nn.Module, original: nn.Module) -> None:
    before = original[0].weight_orig.detach().clone()
    with torch.no_grad():
        copy_[0].weight_orig.add_(1.0)
    assert torch.equal(original[0].weight_orig, before)
    copy_(X).sum().backward()
    assert copy_[0].weight_orig.grad is not None
    assert torch.all(copy_[0].weight_orig.grad[copy_[0].weight_mask == 0] == 0)
    assert original[0].weight_orig.grad is None
    assert torch.equal(copy_[0].weight, copy_[0].weight_orig * copy_[0].weight_mask)


def test_deepcopy_of_pruned_model():
    net = pruned_model()
    clone = copy.deepcopy(net)
    assert_same_pruned_model(net, clone)
    # the pruned tensor of the copy is computed from the copy's own tensors
    assert clone[0].weight.grad_fn is not None
    clone[0].weight.sum().backward()
    assert clone[0].weight_orig.grad is not None and net[0].weight_orig.grad is None
    clone[0].weight_orig.grad = None
    assert_independent_and_trainable(clone, net)
    # after a training step, and of a copy
    net(X).sum().backward()
    again = copy.deepcopy(copy.deepcopy(net))
    assert_same_pruned_model(net, again)
    hook = pruning_hook(again[3], "weight")
    assert isinstance(hook, prune.CustomFromMask) and not hook.mask.requires_grad


def test_deepcopy_after_global_pruning_where_pytorch_fails():
    # pytorch/pytorch#37322: PyTorch cannot deepcopy a module after global_unstructured
    net = seeded(nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)))
    prune.global_unstructured([(net[0], "weight"), (net[1], "weight")], prune.L1Unstructured, amount=0.5)
    clone = copy.deepcopy(net)
    x = torch.randn(2, 4)
    assert torch.equal(net(x), clone(x))
    assert clone[0].weight_mask is not net[0].weight_mask
    for module in clone:
        hook = pruning_hook(module, "weight")
        assert hook.mask.is_leaf and not hook.mask.requires_grad
        assert hook.mask.dtype == module.weight_orig.dtype


def test_pickle_roundtrip():
    net = pruned_model()
    net(X)
    other = pickle.loads(pickle.dumps(net))
    assert_same_pruned_model(net, other)
    assert_independent_and_trainable(other, net)
    # prune further after unpickling: the container grows
    prune.l1_unstructured(other[0], "weight", amount=0.1)
    assert len(pruning_hook(other[0], "weight")) == 4


def test_torch_save_whole_model_and_state_dict(tmp_path):
    net = pruned_model()
    path = tmp_path / "model.pt"
    torch.save(net, path)
    loaded = torch.load(path, weights_only=False)  # our own object: full unpickling is fine here
    assert_same_pruned_model(net, loaded)
    copy.deepcopy(loaded)

    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert "0.weight_orig" in state and "0.weight_mask" in state and "0.weight" not in state
    fresh = seeded(nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)), 99)
    for module, name in ((fresh[0], "weight"), (fresh[3], "bias"), (fresh[3], "weight")):
        prune.identity(module, name)
    fresh.load_state_dict(state)
    fresh(X)  # the hooks refresh the pruned tensors
    assert torch.equal(fresh(X), net(X))

    prune.remove(net[0], "weight")
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    assert "0.weight" in torch.load(buffer, weights_only=True)


# --------------------------------------------------------------------------------------
# Interoperation with torch.nn.utils.prune
# --------------------------------------------------------------------------------------


def test_pytorch_recognises_and_extends_arrayprune_pruning():
    ours, ref = seeded(nn.Conv2d(3, 6, 3)), seeded(nn.Conv2d(3, 6, 3))
    prune.l1_unstructured(ours, "weight", amount=0.3)
    tprune.l1_unstructured(ref, "weight", amount=0.3)
    assert tprune.is_pruned(ours)
    tprune.ln_structured(ours, "weight", amount=2, n=1, dim=0)  # torch's apply, onto our hook
    tprune.ln_structured(ref, "weight", amount=2, n=1, dim=0)
    prune.ln_structured(ours, "weight", amount=1, n=2, dim=1)
    tprune.ln_structured(ref, "weight", amount=1, n=2, dim=1)
    tprune.l1_unstructured(ours, "weight", amount=0.2)  # our container extended by PyTorch
    tprune.l1_unstructured(ref, "weight", amount=0.2)
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    hook = pruning_hook(ours, "weight")
    assert isinstance(hook, prune.PruningContainer) and len(hook) == 4
    assert [type(h).__module__.split(".")[0] for h in hook] == ["arrayprune", "torch", "arrayprune", "torch"]
    tprune.remove(ours, "weight")
    tprune.remove(ref, "weight")
    assert not tprune.is_pruned(ours)
    assert torch.equal(ours.weight, ref.weight)


@pytest.mark.parametrize("torch_calls", [1, 2])
def test_arrayprune_extends_pytorch_pruning(torch_calls):
    ours, ref = seeded(nn.Linear(8, 6)), seeded(nn.Linear(8, 6))
    for module in (ours, ref):
        tprune.l1_unstructured(module, "weight", amount=0.25)
        if torch_calls == 2:
            tprune.ln_structured(module, "weight", amount=1, n=2, dim=0)
    torch_hook = pruning_hook(ours, "weight")
    prune.l1_unstructured(ours, "weight", amount=0.3)
    tprune.l1_unstructured(ref, "weight", amount=0.3)
    prune.ln_structured(ours, "weight", amount=0.5, n=math.inf, dim=1, importance_scores=ours.weight_orig * 2)
    tprune.ln_structured(ref, "weight", amount=0.5, n=math.inf, dim=1, importance_scores=ref.weight_orig * 2)
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    hook = pruning_hook(ours, "weight")
    assert isinstance(hook, prune.PruningContainer) and len(hook) == torch_calls + 2
    expected_first = list(torch_hook) if torch_calls == 2 else [torch_hook]
    assert list(hook)[:torch_calls] == expected_first
    x = torch.randn(3, 8)
    assert torch.equal(ours(x), ref(x))
    prune.remove(ours, "weight")
    assert torch.equal(ours.weight, ref.weight)


class ThresholdPruning(tprune.BasePruningMethod):
    """A user's method written against PyTorch: prune entries below a threshold."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, threshold):
        self.threshold = threshold

    def compute_mask(self, t, default_mask):
        return default_mask * (t.abs() > self.threshold).to(default_mask.dtype)


class DropFirstChannels(tprune.BasePruningMethod):
    """A user's structured method: drop the first `k` channels it is shown."""

    PRUNING_TYPE = "structured"

    def __init__(self, k, dim=-1):
        self.k, self.dim = k, dim

    def compute_mask(self, t, default_mask):
        mask = default_mask.clone()
        index = [slice(None)] * t.dim()
        index[self.dim] = slice(0, self.k)
        mask[tuple(index)] = 0
        return mask


def test_user_methods_written_for_pytorch_work_in_arrayprune_containers():
    ours, ref = seeded(nn.Linear(6, 5)), seeded(nn.Linear(6, 5))
    prune.l1_unstructured(ours, "weight", amount=0.2)
    tprune.l1_unstructured(ref, "weight", amount=0.2)
    prune.l1_unstructured(ours, "weight", amount=0.1)
    tprune.l1_unstructured(ref, "weight", amount=0.1)
    ThresholdPruning.apply(ours, "weight", threshold=0.5)  # PyTorch's apply, our container
    ThresholdPruning.apply(ref, "weight", threshold=0.5)
    assert isinstance(pruning_hook(ours, "weight"), prune.PruningContainer)
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    DropFirstChannels.apply(ours, "weight", k=2, dim=1)
    DropFirstChannels.apply(ref, "weight", k=2, dim=1)
    prune.ln_structured(ours, "weight", amount=1, n=2, dim=1)
    tprune.ln_structured(ref, "weight", amount=1, n=2, dim=1)
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    assert [type(h).__name__ for h in pruning_hook(ours, "weight")] == [
        "L1Unstructured",
        "L1Unstructured",
        "ThresholdPruning",
        "DropFirstChannels",
        "LnStructured",
    ]
    # a single arrayprune method extended by PyTorch's apply gets PyTorch's container
    single, single_ref = seeded(nn.Linear(6, 5)), seeded(nn.Linear(6, 5))
    prune.l1_unstructured(single, "weight", amount=0.2)
    tprune.l1_unstructured(single_ref, "weight", amount=0.2)
    ThresholdPruning.apply(single, "weight", threshold=0.5)
    ThresholdPruning.apply(single_ref, "weight", threshold=0.5)
    assert type(pruning_hook(single, "weight")) is tprune.PruningContainer
    prune.l1_unstructured(single, "weight", amount=2)  # and arrayprune takes it over again
    tprune.l1_unstructured(single_ref, "weight", amount=2)
    assert isinstance(pruning_hook(single, "weight"), prune.PruningContainer)
    assert torch.equal(single.weight_mask, single_ref.weight_mask)


def test_user_subclass_of_arrayprune_base():
    class EveryOther(prune.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            mask = default_mask.clone()
            mask.view(-1)[::2] = 0
            return mask

    m = seeded(nn.Linear(4, 2))
    hook = EveryOther.apply(m, "weight")
    assert torch.equal(m.weight_mask.view(-1), torch.tensor([0.0, 1] * 4))
    prune.l1_unstructured(m, "weight", amount=1)
    EveryOther.apply(m, "weight")  # sees the 3 remaining entries: drops the 1st and 3rd
    assert int(m.weight_mask.sum()) == 1
    assert isinstance(pruning_hook(m, "weight"), prune.PruningContainer)
    assert pruning_hook(m, "weight")[0] is hook


def test_global_with_foreign_methods_matches_pytorch():
    class SmallestSquares(tprune.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def __init__(self, amount):
            self.amount = amount

        def compute_mask(self, t, default_mask):
            k = tprune._compute_nparams_toprune(self.amount, t.nelement())
            mask = default_mask.clone()
            mask.view(-1)[torch.topk((t * t).view(-1), k, largest=False).indices] = 0
            return mask

    ours = [seeded(nn.Linear(5, 4), 3), seeded(nn.Conv1d(2, 3, 2), 4)]
    ref = [seeded(nn.Linear(5, 4), 3), seeded(nn.Conv1d(2, 3, 2), 4)]
    for mods, lib in ((ours, prune), (ref, tprune)):
        lib.l1_unstructured(mods[0], "weight", amount=3)
        pairs = [(mods[0], "weight"), (mods[1], "weight"), (mods[1], "bias")]
        lib.global_unstructured(pairs, SmallestSquares, amount=0.4)
        lib.global_unstructured(pairs, tprune.L1Unstructured, amount=0.2)
    for a, b in zip(ours, ref, strict=True):
        for key in ("weight_mask", "weight", "bias_mask"):
            if hasattr(b, key):
                assert torch.equal(getattr(a, key), getattr(b, key)), key


# --------------------------------------------------------------------------------------
# Global pruning
# --------------------------------------------------------------------------------------


def test_global_pruning_by_hand():
    m, n = nn.Linear(4, 2), nn.Linear(3, 1)
    m.weight = nn.Parameter(torch.tensor([[1.0, 2, 3, 4], [-4, -3, -2, -1]]))
    n.weight = nn.Parameter(torch.tensor([[0, 0.1, -2]]))
    prune.global_unstructured(((m, "weight"), (n, "weight")), pruning_method=prune.L1Unstructured, amount=4)
    assert torch.equal(m.weight, torch.tensor([[0.0, 2, 3, 4], [-4, -3, -2, 0]]))
    assert torch.equal(n.weight, torch.tensor([[0.0, 0, -2]]))
    assert m.weight_mask.dtype == torch.float32
    assert isinstance(pruning_hook(m, "weight"), prune.CustomFromMask)
    scores = {
        (m, "weight"): torch.tensor([[4.0, 2, 1, 3], [-3, -1, -2, -4]]),
        (n, "weight"): torch.tensor([[0, 10.0, -0.2]]),
    }
    m2, n2 = nn.Linear(4, 2), nn.Linear(3, 1)
    m2.weight, n2.weight = nn.Parameter(m.weight_orig.detach().clone()), nn.Parameter(n.weight_orig.detach().clone())
    scores = {(m2, "weight"): scores[(m, "weight")], (n2, "weight"): scores[(n, "weight")]}
    prune.global_unstructured(
        [(m2, "weight"), (n2, "weight")], prune.L1Unstructured, importance_scores=scores, amount=4
    )
    assert torch.equal(m2.weight, torch.tensor([[1.0, 2, 0, 4], [-4, 0, -2, -1]]))
    assert torch.equal(n2.weight, torch.tensor([[0, 0.1, 0]]))


def test_global_errors():
    m = seeded(nn.Linear(3, 2))
    snap = snapshot(m)
    with pytest.raises(TypeError):
        prune.global_unstructured(5, prune.L1Unstructured, amount=1)
    with pytest.raises(TypeError):
        prune.global_unstructured([(m, "weight")], prune.L1Unstructured, importance_scores=[torch.ones(2, 3)], amount=1)
    with pytest.raises(TypeError):
        prune.global_unstructured([(m, "weight")], prune.RandomStructured, amount=1)
    with pytest.raises(TypeError):
        tprune.global_unstructured([(m, "weight")], tprune.RandomStructured, amount=1)
    with pytest.raises(ValueError):
        prune.global_unstructured([(m, "weight"), (m, "bias")], prune.L1Unstructured, amount=9)
    with pytest.raises(ValueError):
        prune.global_unstructured(
            [(m, "weight")], prune.L1Unstructured, importance_scores={(m, "weight"): torch.ones(3, 2)}, amount=1
        )
    assert_as_before(m, snap)
    prune.global_unstructured([], prune.L1Unstructured, amount=0.5)  # nothing to do


def test_global_accepts_generators_and_mixed_dtypes():
    a, b = seeded(nn.Linear(6, 5)), seeded(nn.Linear(5, 4).double(), 1)
    ra, rb = seeded(nn.Linear(6, 5)), seeded(nn.Linear(5, 4).double(), 1)
    prune.global_unstructured(((mod, "weight") for mod in (a, b)), prune.L1Unstructured, amount=0.5)
    tprune.global_unstructured([(ra, "weight"), (rb, "weight")], tprune.L1Unstructured, amount=0.5)
    assert a.weight_mask.dtype == torch.float32 and b.weight_mask.dtype == torch.float64
    assert int((a.weight_mask == 0).sum() + (b.weight_mask == 0).sum()) == 25
    assert torch.equal(a.weight_mask, ra.weight_mask) and torch.equal(b.weight_mask, rb.weight_mask)


def test_global_then_local_then_global():
    net = seeded(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)))
    ref = seeded(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)))
    for mods, lib in ((net, prune), (ref, tprune)):
        pairs = [(mods[0], "weight"), (mods[1], "weight"), (mods[1], "bias")]
        lib.global_unstructured(pairs, lib.L1Unstructured, amount=0.3)
        lib.ln_structured(mods[0], "weight", amount=2, n=2, dim=0)
        lib.global_unstructured(pairs, lib.L1Unstructured, amount=10)
    for a, b in zip(net, ref, strict=True):
        assert torch.equal(a.weight_mask, b.weight_mask)
    assert len(pruning_hook(net[0], "weight")) == 3


# --------------------------------------------------------------------------------------
# Modules and dtypes
# --------------------------------------------------------------------------------------


def test_lstm_forward_uses_the_pruned_weight():
    lstm = seeded(nn.LSTM(6, 5, num_layers=2))
    ref = copy.deepcopy(lstm)
    x = torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(2))
    prune.l1_unstructured(lstm, "weight_ih_l0", amount=0.5)
    prune.ln_structured(lstm, "weight_hh_l1", amount=0.4, n=2, dim=0)
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 6
    out, _ = lstm(x)
    clone = copy.deepcopy(lstm)
    assert torch.equal(clone(x)[0], out)
    assert clone._flat_weights[0] is clone.weight_ih_l0
    with torch.no_grad():
        ref.weight_ih_l0.mul_(lstm.weight_ih_l0_mask)
        ref.weight_hh_l1.mul_(lstm.weight_hh_l1_mask)
    expected, _ = ref(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    assert torch.all(lstm.weight_ih_l0_orig.grad[lstm.weight_ih_l0_mask == 0] == 0)
    # the same as PyTorch's pruning
    tref = seeded(nn.LSTM(6, 5, num_layers=2))
    tprune.l1_unstructured(tref, "weight_ih_l0", amount=0.5)
    tprune.ln_structured(tref, "weight_hh_l1", amount=0.4, n=2, dim=0)
    assert torch.equal(tref(x)[0], lstm(x)[0])
    # weights changed in place are picked up at the next forward
    with torch.no_grad():
        lstm.weight_ih_l0_orig.mul_(2)
        ref.weight_ih_l0.mul_(2)
    torch.testing.assert_close(lstm(x)[0], ref(x)[0], rtol=0, atol=0)
    prune.remove(lstm, "weight_ih_l0")
    prune.remove(lstm, "weight_hh_l1")
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 8
    assert "weight_ih_l0" in lstm._parameters and "weight_ih_l0_orig" not in dict(lstm.named_parameters())
    torch.testing.assert_close(lstm(x)[0], ref(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "make, x",
    [
        (lambda: nn.Conv1d(3, 4, 3), torch.randn(2, 3, 9)),
        (lambda: nn.Conv2d(3, 4, 3), torch.randn(2, 3, 7, 7)),
        (lambda: nn.Conv3d(2, 4, 2), torch.randn(2, 2, 4, 4, 4)),
        (lambda: nn.Embedding(10, 4), torch.tensor([[1, 2, 9], [0, 0, 5]])),
        (lambda: nn.Linear(5, 3), torch.randn(4, 5)),
    ],
)
def test_modules_match_pytorch(make, x):
    ours, ref = seeded(make()), seeded(make())
    for module, lib in ((ours, prune), (ref, tprune)):
        lib.l1_unstructured(module, "weight", amount=0.3)
        lib.ln_structured(module, "weight", amount=1, n=1, dim=0)
        if hasattr(module, "bias") and module.bias is not None:
            lib.l1_unstructured(module, "bias", amount=0.5)
    assert torch.equal(ours(x), ref(x))
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    ours(x).sum().backward()
    ref(x).sum().backward()
    assert torch.equal(ours.weight_orig.grad, ref.weight_orig.grad)


# --------------------------------------------------------------------------------------
# Module bookkeeping: direct writes on plain modules, public methods on the others
# --------------------------------------------------------------------------------------


class LoggingLinear(nn.Linear):
    """A Linear whose attribute protocol is its own: the adapter must go through it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["set_names"] = []

    def __setattr__(self, name, value):
        self.__dict__.setdefault("set_names", []).append(name)
        super().__setattr__(name, value)


def module_layout(m: nn.Module) -> dict:
    """What a module looks like from outside: names in order, values, hooks' types."""
    return {
        "params": [(k, v.detach().clone()) for k, v in m._parameters.items()],
        "buffers": [(k, v.clone()) for k, v in m._buffers.items()],
        "non_persistent": sorted(m._non_persistent_buffers_set),
        "state_dict": list(m.state_dict()),
        "attrs": sorted(k for k, v in vars(m).items() if isinstance(v, torch.Tensor)),
        "hooks": len(m._forward_pre_hooks),
    }


def assert_same_layout(a: dict, b: dict) -> None:
    for key in ("params", "buffers"):
        assert [k for k, _ in a[key]] == [k for k, _ in b[key]], key
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a[key], b[key], strict=True)), key
    assert a["non_persistent"] == b["non_persistent"]
    assert a["state_dict"] == b["state_dict"]
    assert a["attrs"] == b["attrs"]
    assert a["hooks"] == b["hooks"]


@pytest.mark.parametrize("make", [lambda: nn.Linear(6, 5), lambda: nn.Conv2d(2, 3, 3), lambda: LoggingLinear(6, 5)])
def test_module_layout_matches_pytorch_through_prune_and_remove(make):
    ours, ref = seeded(make()), seeded(make())
    steps = [
        lambda lib, m: lib.l1_unstructured(m, "bias", amount=2),
        lambda lib, m: lib.ln_structured(m, "weight", amount=1, n=2, dim=0),
        lambda lib, m: lib.remove(m, "bias"),
        lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.3),
        lambda lib, m: lib.remove(m, "weight"),
        lambda lib, m: lib.ln_structured(m, "weight", amount=1, n=1, dim=1),
    ]
    for step in steps:
        step(prune, ours)
        step(tprune, ref)
        assert_same_layout(module_layout(ours), module_layout(ref))
    if isinstance(ours, LoggingLinear):
        # Module.__setattr__ overridden: every assignment PyTorch makes went through it
        assert ours.set_names == ref.set_names


def test_global_registration_hooks_see_what_pytorch_shows_them():
    from torch.nn.modules import module as torch_module

    seen = []
    handles = [
        torch_module.register_module_parameter_registration_hook(lambda m, n, p: seen.append(("param", n))),
        torch_module.register_module_buffer_registration_hook(lambda m, n, b: seen.append(("buffer", n))),
    ]
    try:
        calls = {}
        for lib in (prune, tprune):
            seen.clear()
            m = seeded(nn.Linear(4, 3))
            lib.l1_unstructured(m, "weight", amount=0.5)
            lib.l1_unstructured(m, "bias", amount=1)
            lib.remove(m, "weight")
            calls[lib] = list(seen)
        assert calls[prune] == calls[tprune]
        assert ("param", "weight_orig") in calls[prune] and ("buffer", "weight_mask") in calls[prune]
    finally:
        for h in handles:
            h.remove()


class WithOrigAttribute(nn.Linear):
    weight_orig = "a class attribute in the way"


def with_mask_attribute() -> nn.Module:
    m = nn.Linear(3, 2)
    m.weight_mask = "a plain attribute in the way"
    return m


def with_orig_buffer() -> nn.Module:
    m = nn.Linear(3, 2)
    m.register_buffer("weight_orig", torch.zeros(1))
    return m


@pytest.mark.parametrize("make", [lambda: WithOrigAttribute(3, 2), with_mask_attribute, with_orig_buffer])
def test_names_in_the_way_raise_keyerror_like_pytorch(make):
    m = seeded(make())
    snap = snapshot(m)
    with pytest.raises(KeyError, match="already exists"):
        prune.l1_unstructured(m, "weight", amount=0.5)
    assert_as_before(m, snap)
    with pytest.raises(KeyError, match="already exists"):
        tprune.l1_unstructured(seeded(make()), "weight", amount=0.5)


def distinct_weights(shape, dtype, seed=0, offset=0.0):
    """Entries of distinct magnitudes ``(k + offset) / 256``, exact in `dtype` (no ties)."""
    n = math.prod(shape)
    g = torch.Generator().manual_seed(seed)
    magnitudes = (torch.randperm(n, generator=g) + 1 + offset).to(torch.float64) / 256
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (magnitudes * signs).reshape(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype):
    ours, ref = nn.Linear(16, 12).to(dtype), nn.Linear(16, 12).to(dtype)  # 192 + 12 entries
    for module in (ours, ref):
        with torch.no_grad():
            module.weight.copy_(distinct_weights((12, 16), dtype))
            module.bias.copy_(distinct_weights((12,), dtype, seed=1, offset=0.5))  # none equal to a weight
    for module, lib in ((ours, prune), (ref, tprune)):
        lib.l1_unstructured(module, "weight", amount=0.25)
        lib.ln_structured(module, "weight", amount=3, n=math.inf, dim=0)
        lib.l1_unstructured(module, "weight", amount=0.1)
        lib.global_unstructured([(module, "weight"), (module, "bias")], lib.L1Unstructured, amount=0.2)
    assert ours.weight_mask.dtype == ours.bias_mask.dtype == dtype
    assert torch.equal(ours.weight_mask, ref.weight_mask)
    assert torch.equal(ours.bias_mask, ref.bias_mask)
    prune.random_unstructured(ours, "bias", amount=0.5)
    assert ours.bias_mask.dtype == dtype
    x = torch.ones(2, 16, dtype=dtype)
    y = ours(x)
    assert y.dtype == dtype
    y.float().sum().backward()
    assert torch.all(ours.weight_orig.grad[ours.weight_mask == 0] == 0)


# --------------------------------------------------------------------------------------
# Random methods
# --------------------------------------------------------------------------------------


def test_random_methods_use_torch_global_rng_by_default():
    masks = []
    for _ in range(2):
        torch.manual_seed(123)
        m = nn.Linear(20, 10)
        prune.random_unstructured(m, "weight", amount=0.5)
        prune.random_structured(m, "weight", amount=2, dim=1)
        masks.append(m.weight_mask)
    assert torch.equal(masks[0], masks[1])
    torch.manual_seed(124)
    m = nn.Linear(20, 10)
    prune.random_unstructured(m, "weight", amount=0.5)
    assert not torch.equal(m.weight_mask, masks[0])


def test_random_methods_with_seed_or_generator():
    def run(**kw):
        m = nn.Linear(20, 10)
        prune.random_unstructured(m, "weight", amount=0.3, **kw)
        prune.random_structured(m, "weight", amount=0.25, dim=0, **kw)
        return m.weight_mask

    torch.manual_seed(1)
    a = run(seed=5)
    torch.manual_seed(2)
    b = run(seed=5)
    assert torch.equal(a, b)
    assert int((a.sum(dim=1) == 0).sum()) == round(0.25 * 10)
    assert int((a == 0).sum()) >= 60
    c = run(generator=torch.Generator().manual_seed(9))
    d = run(generator=torch.Generator().manual_seed(9))
    assert torch.equal(c, d)
    with pytest.raises(TypeError):
        prune.RandomUnstructured(0.5, seed=1, generator=torch.Generator())
    with pytest.raises(TypeError):
        prune.RandomStructured(0.5, seed=1.5)
    method = prune.RandomUnstructured(3, seed=1)
    t = torch.randn(4, 5)
    assert torch.equal(method.compute_mask(t, torch.ones_like(t)), method.compute_mask(t, torch.ones_like(t)))


def test_random_counts():
    m = nn.Conv2d(4, 6, 3)
    prune.random_unstructured(m, "weight", amount=0.37)
    assert int((m.weight_mask == 0).sum()) == round(0.37 * 216)
    prune.random_structured(m, "weight", amount=0.5, dim=1)
    assert int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum()) == 2
    mask = prune.RandomStructured(amount=0.6, dim=2).compute_mask(torch.randn(5, 4, 2), torch.ones(5, 4, 2))
    assert sorted((mask == 0).sum(dim=(0, 1)).tolist()) == [0, 20]


def test_earlier_masks_are_never_written_and_never_shared():
    m = seeded(nn.Linear(8, 6))
    prune.l1_unstructured(m, "weight", amount=0.25)
    first = m.weight_mask
    kept = first.clone()
    prune.ln_structured(m, "weight", amount=2, n=1, dim=0)
    assert torch.equal(first, kept)
    second = m.weight_mask
    prune.identity(m, "weight")
    assert torch.equal(m.weight_mask, second)
    assert m.weight_mask.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    prune.custom_from_mask(m, "weight", mask=torch.ones(6, 8))
    assert torch.equal(m.weight_mask, second)
    assert torch.equal(first, kept)


def test_custom_mask_requiring_grad_is_stored_detached():
    m = seeded(nn.Linear(4, 3))
    mask = (torch.rand(3, 4) > 0.5).float().requires_grad_()
    prune.custom_from_mask(m, "weight", mask=mask * 1)  # a non-leaf
    hook = pruning_hook(m, "weight")
    assert not hook.mask.requires_grad and not m.weight_mask.requires_grad
    clone = copy.deepcopy(m)
    assert torch.equal(clone.weight_mask, mask.detach())


def test_portable_selection_path_as_used_for_cuda_tensors():
    """CUDA tensors take the core's portable (pure tensor) path; force it on CPU."""
    from arrayprune.selection import host

    ours = seeded(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 120)))
    ref = copy.deepcopy(ours)
    with mock.patch.object(host, "_host_bits", lambda x: None):
        for net, lib in ((ours, prune), (ref, tprune)):
            lib.l1_unstructured(net[0], "weight", amount=0.3)
            lib.ln_structured(net[0], "weight", amount=2, n=2, dim=0)
            lib.global_unstructured([(net[0], "weight"), (net[2], "weight")], lib.L1Unstructured, amount=0.5)
            lib.l1_unstructured(net[2], "weight", amount=0.2)  # 34560 entries: the bracket path
        prune.random_unstructured(ours[2], "bias", amount=7)
    for a, b in ((ours[0], ref[0]), (ours[2], ref[2])):
        assert torch.equal(a.weight_mask, b.weight_mask)
    assert int((ours[2].bias_mask == 0).sum()) == 7


# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_masks_match_cpu_and_stay_on_device(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 convolutions on both sides
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cpu = seeded(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)))
    gpu = copy.deepcopy(cpu).cuda()
    for net in (cpu, gpu):
        prune.l1_unstructured(net[0], "weight", amount=0.3)
        prune.ln_structured(net[0], "weight", amount=2, n=2, dim=0)
        prune.global_unstructured([(net[0], "weight"), (net[2], "weight")], prune.L1Unstructured, amount=0.5)
        prune.random_unstructured(net[2], "bias", amount=3, generator=None)
    assert gpu[0].weight_mask.device.type == "cuda" and gpu[2].bias_mask.device.type == "cuda"
    assert torch.equal(gpu[0].weight_mask.cpu(), cpu[0].weight_mask)
    assert torch.equal(gpu[2].weight_mask.cpu(), cpu[2].weight_mask)
    assert int((gpu[2].bias_mask == 0).sum()) == 3
    # the bias's random draws come from CUDA's generator, not the CPU's: the same mask on both
    # sides before comparing the outputs (an H100 run compared them with different masks)
    cpu[2].bias_mask.copy_(gpu[2].bias_mask.cpu())
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), rtol=1e-4, atol=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(0)
    prune.random_structured(gpu[0], "weight", amount=1, dim=0, generator=generator)
    copy.deepcopy(gpu)


@pytest.mark.parametrize("verb", ["l1", "ln", "random_u", "random_s"])
def test_meta_modules_get_meta_masks_as_in_pytorch(verb):
    """A module on the meta device has shapes and no values: PyTorch gives it a meta mask."""
    calls = {
        "l1": lambda p, m: p.l1_unstructured(m, "weight", 0.5),
        "ln": lambda p, m: p.ln_structured(m, "weight", 0.5, 2, 0),
        "random_u": lambda p, m: p.random_unstructured(m, "weight", 0.5),
        "random_s": lambda p, m: p.random_structured(m, "weight", 0.5, 0),
    }
    got = []
    for lib in (tprune, prune):
        m = torch.nn.Linear(6, 4, device="meta")
        calls[verb](lib, m)
        got.append([(k, tuple(v.shape), v.dtype, v.device.type) for k, v in m.state_dict().items()])
        assert m(torch.empty(2, 6, device="meta")).shape == (2, 4)
    assert got[0] == got[1]
    assert ("weight_mask", (4, 6), torch.float32, "meta") in got[1]


def test_the_drop_in_places_every_tensor_on_the_input_device_under_a_meta_default():
    """With ``torch.device("meta")`` as the default device and the model on the CPU, every
    verb gives the masks and weights it gives without: a tensor the adapter made without
    the input's device would land on ``meta`` and fail (as next to a CUDA model). Not
    ``random_structured``: it draws on the default device as PyTorch does."""
    import contextlib

    def run(context):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
        batches = [torch.randn(4, 16) for _ in range(3)]
        given = torch.arange(8) % 2  # the user's mask, made beside the model
        with context:
            prune.l1_unstructured(net[0], "weight", 0.3)
            prune.ln_structured(net[0], "weight", 0.25, n=2, dim=0)
            prune.random_unstructured(net[2], "bias", 0.5)
            prune.nm_structured(net[2], "weight")
            prune.global_unstructured(
                [(net[0], "weight"), (net[2], "weight")], pruning_method=prune.L1Unstructured, amount=0.6
            )
            prune.custom_from_mask(net[0], "bias", given)
            state = {k: v.clone() for k, v in net.state_dict().items()}
            for module, name in [(net[0], "weight"), (net[0], "bias"), (net[2], "weight"), (net[2], "bias")]:
                prune.remove(module, name)
            scores = prune.wanda_importance(net, batches)
            prune.wanda(net[2], "weight", amount=0.5, importance_scores=scores[net[2]])
            prune.remove(net[2], "weight")
            prune.sparsegpt(net, batches, 0.5)
        return state, {k: v.clone() for k, v in net.state_dict().items()}

    want = run(contextlib.nullcontext())
    got = run(torch.device("meta"))
    for w, g in zip(want, got, strict=True):
        assert w.keys() == g.keys()
        for key in w:
            assert g[key].device.type == "cpu", key
            torch.testing.assert_close(g[key], w[key], rtol=0, atol=0, msg=key)
