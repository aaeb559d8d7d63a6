"""The torch adapter's verbs beyond torch.nn.utils.prune: N:M, blocks, bounded/LAMP global."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
tprune = pytest.importorskip("torch.nn.utils.prune")

import arrayprune as ap  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402


def seeded_linear(i: int, o: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(i, o)


def test_nm_structured_reparametrizes_and_combines():
    m = seeded_linear(16, 8)
    w = m.weight.detach().clone()
    prune.l1_unstructured(m, "weight", amount=0.2)
    first = m.weight_mask.clone()
    prune.nm_structured(m, "weight", n=2, m=4)
    assert isinstance(m._forward_pre_hooks[next(iter(m._forward_pre_hooks))], prune.PruningContainer)
    assert m.weight_mask.dtype == torch.float32
    assert not ((m.weight_mask != 0) & (first == 0)).any()  # pruned stays pruned
    expected = ap.NMStructured(2, 4).compute_mask(w, first)
    torch.testing.assert_close(m.weight_mask, expected)
    assert ap.is_nm_sparse(m.weight, 2, 4)
    assert tprune.is_pruned(m)  # PyTorch recognises the hook
    x = torch.randn(3, 16)
    torch.testing.assert_close(m(x), x @ (w * m.weight_mask).T + m.bias)
    prune.remove(m, "weight")
    assert ap.is_nm_sparse(m.weight.detach(), 2, 4) and "weight_orig" not in dict(m.named_parameters())


def test_block_unstructured_matches_the_core():
    m = seeded_linear(12, 9, seed=1)
    w = m.weight.detach().clone()
    prune.block_unstructured(m, "weight", amount=0.5, block_shape=(2, 4), n=2)
    expected = ap.block_unstructured(w.numpy(), 0.5, (2, 4), 2)
    np.testing.assert_array_equal(m.weight_mask.numpy() != 0, expected)
    assert m.weight_mask.dtype == torch.float32


def test_pattern_errors_leave_the_module_untouched():
    m = seeded_linear(8, 4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError):
        prune.nm_structured(m, "weight", n=5, m=4)
    with pytest.raises(ValueError):
        prune.block_unstructured(m, "bias", amount=0.5, block_shape=(2, 2))  # 1-D bias, 2-D block
    assert not prune.is_pruned(m)
    assert set(m.state_dict()) == set(before)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])


@pytest.mark.parametrize(
    "kwargs", [{"max_sparsity": 0.7}, {"normalization": "lamp"}, {"min_sparsity": 0.3, "max_sparsity": 0.9}]
)
def test_bounded_and_lamp_global_match_the_core(kwargs):
    mods = [seeded_linear(32, 32, 1), seeded_linear(32, 4, 2)]
    with torch.no_grad():
        mods[1].weight.mul_(0.01)  # a small layer, wiped out by plain global pruning
    weights = [m.weight.detach().clone() for m in mods]
    prune.global_unstructured([(m, "weight") for m in mods], prune.L1Unstructured, amount=0.6, **kwargs)
    expected = ap.global_unstructured(weights, ap.L1Unstructured, amount=0.6, **kwargs)
    for m, e in zip(mods, expected, strict=True):
        torch.testing.assert_close(m.weight_mask, e.to(torch.float32))
    assert (mods[1].weight_mask != 0).any()
    total = sum(int((m.weight_mask == 0).sum()) for m in mods)
    assert total == round(0.6 * (32 * 32 + 4 * 32))


def test_bounds_need_a_builtin_method():
    class Custom(tprune.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def __init__(self, amount):
            self.amount = amount

        def compute_mask(self, t, default_mask):
            return default_mask

    m = seeded_linear(4, 4)
    with pytest.raises(TypeError):
        prune.global_unstructured([(m, "weight")], Custom, amount=0.5, max_sparsity=0.5)
    assert not prune.is_pruned(m)


def test_prune_to_sparsity_follows_a_schedule():
    m = seeded_linear(10, 10, seed=3)
    w = m.weight.detach().clone()
    schedule = ap.PolynomialDecay(0.1, 0.9, begin_step=0, end_step=50)
    mask = None
    for step in range(0, 60, 10):
        prune.prune_to_sparsity(m, "weight", schedule(step))
        assert int((m.weight_mask == 0).sum()) == round(schedule(step) * 100)
        if mask is not None:
            assert not ((m.weight_mask != 0) & (mask == 0)).any()
        mask = m.weight_mask.clone()
    expected = None
    for step in range(0, 60, 10):
        expected = ap.prune_to_schedule(w, schedule, step, default_mask=expected)
    np.testing.assert_array_equal(m.weight_mask.numpy() != 0, expected.numpy())


def test_prune_to_sparsity_structured_counts_channels():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)
    for target in (0.25, 0.5, 0.75):
        prune.prune_to_sparsity(conv, "weight", target, prune.LnStructured, n=2, dim=0)
        assert int((conv.weight_mask.sum(dim=(1, 2, 3)) == 0).sum()) == round(target * 8)
