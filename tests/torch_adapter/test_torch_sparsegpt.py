"""SparseGPT in the PyTorch drop-in: calibration, reconstruction, the usual reparametrization.

Reference values: layer inputs are recomputed here in NumPy float64 (or captured from the
dense model and unfolded by the test), Hessians ``X^T X / n`` formed in NumPy, and the
weights pruned by the core's :func:`arrayprune.sparsegpt` on NumPy arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.utils.prune as tprune  # noqa: E402
from torch import nn  # noqa: E402

import arrayprune  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402


def _correlated(rows: int, k: int, seed: int) -> np.ndarray:
    """Inputs whose features are strongly correlated (a rank-4 signal plus a little noise)."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(4, k))
    return rng.normal(size=(rows, 4)) @ mixing + 0.1 * rng.normal(size=(rows, k)) + 0.5


def _mlp(seed: int = 0, dtype=torch.float64) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8)).to(dtype)


def _batches(dtype=torch.float64, seed: int = 1, sizes=(20, 30, 14)) -> list[torch.Tensor]:
    x = _correlated(sum(sizes), 12, seed)
    out, at = [], 0
    for size in sizes:
        out.append(torch.tensor(x[at : at + size], dtype=dtype))
        at += size
    return out


def _hessian(x: np.ndarray) -> np.ndarray:
    return x.T @ x / x.shape[0]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().astype(np.float64)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


# --------------------------------------------------------------------------------------
# Equality with the core
# --------------------------------------------------------------------------------------


def test_one_pass_equals_core_on_dense_hessians():
    net, batches = _mlp(), _batches()
    w1, b1, w2 = _np(net[0].weight), _np(net[0].bias), _np(net[2].weight)
    x = np.concatenate([_np(b) for b in batches])
    want1 = arrayprune.sparsegpt(w1, _hessian(x), 0.5, block_size=8, reduction_axis=1)
    want2 = arrayprune.sparsegpt(w2, _hessian(_relu(x @ w1.T + b1)), 0.5, block_size=8, reduction_axis=1)

    prune.sparsegpt(net, batches, 0.5, block_size=8, sequential=False)
    for layer, (new, keep) in zip((net[0], net[2]), (want1, want2), strict=True):
        np.testing.assert_array_equal(layer.weight_mask.numpy(), keep.astype(np.float64))
        np.testing.assert_allclose(layer.weight_orig.detach().numpy(), new, rtol=1e-9, atol=1e-12)
        assert int((layer.weight_mask == 0).sum()) == layer.weight.numel() // 2


def test_sequential_second_layer_sees_the_pruned_first_layer():
    batches = _batches()
    one_pass = prune.sparsegpt(_mlp(), batches, 0.5, block_size=8, sequential=False)
    net = _mlp()
    w1, b1, w2 = _np(net[0].weight), _np(net[0].bias), _np(net[2].weight)
    x = np.concatenate([_np(b) for b in batches])
    new1, keep1 = arrayprune.sparsegpt(w1, _hessian(x), 0.5, block_size=8, reduction_axis=1)
    h2 = _hessian(_relu(x @ new1.T + b1))  # through the pruned, updated first layer
    new2, keep2 = arrayprune.sparsegpt(w2, h2, 0.5, block_size=8, reduction_axis=1)

    prune.sparsegpt(net, batches, 0.5, block_size=8)  # sequential by default
    np.testing.assert_array_equal(net[0].weight_mask.numpy(), keep1.astype(np.float64))
    np.testing.assert_allclose(net[0].weight_orig.detach().numpy(), new1, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(net[2].weight_mask.numpy(), keep2.astype(np.float64))
    np.testing.assert_allclose(net[2].weight_orig.detach().numpy(), new2, rtol=1e-9, atol=1e-12)
    # The first layer is the same either way; the second differs from the one-pass result.
    torch.testing.assert_close(net[0].weight, one_pass[0].weight, rtol=0, atol=0)
    assert float((net[2].weight - one_pass[2].weight).abs().max()) > 1e-3


def test_exact_counts_int_amount_and_two_four():
    batches = _batches(torch.float32)
    net = prune.sparsegpt(_mlp(dtype=torch.float32), batches, 0.3)
    assert [int((net[i].weight_mask == 0).sum()) for i in (0, 2)] == [round(0.3 * 192), round(0.3 * 128)]
    assert [int((net[i].weight == 0).sum()) for i in (0, 2)] == [58, 38]
    net = prune.sparsegpt(_mlp(dtype=torch.float32), batches, 7)
    assert [int((net[i].weight_mask == 0).sum()) for i in (0, 2)] == [7, 7]
    net = prune.sparsegpt(_mlp(dtype=torch.float32), batches, n=2, m=4, block_size=8)
    for i, (out, k) in ((0, (16, 12)), (2, (8, 16))):
        zeros = (net[i].weight_mask == 0).reshape(out, k // 4, 4).sum(dim=-1)
        assert zeros.tolist() == [[2] * (k // 4)] * out
        assert net[i].weight.dtype == torch.float32 and net[i].weight_mask.dtype == torch.float32
        assert arrayprune.is_nm_sparse(net[i].weight.detach(), 2, 4, dim=1)


# --------------------------------------------------------------------------------------
# Reconstruction pays: output error below Wanda's and magnitude's
# --------------------------------------------------------------------------------------


def _output_error(net: nn.Module, dense: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float(((net(x) - dense(x)) ** 2).sum() / (dense(x) ** 2).sum())


def _layer_error(net: nn.Module, dense: nn.Module, x: torch.Tensor) -> float:
    """Relative squared error of the first layer's output on the calibration inputs."""
    with torch.no_grad():
        return float(((net[0](x) - dense[0](x)) ** 2).sum() / (dense[0](x) ** 2).sum())


@pytest.mark.parametrize("pattern", [{"amount": 0.5}, {"n": 2, "m": 4}], ids=["50%", "2:4"])
def test_output_error_below_wanda_and_magnitude(pattern):
    # Calibrate on 192 correlated rows, evaluate on them and on 200 held-out rows of the same law.
    rows = torch.tensor(_correlated(392, 12, seed=1), dtype=torch.float32)
    batches, held_out = list(rows[:192].split(64)), rows[192:]
    x = torch.cat(batches)
    dense = _mlp(dtype=torch.float32)
    gpt = prune.sparsegpt(_mlp(dtype=torch.float32), batches, **pattern)
    wanda, magnitude = _mlp(dtype=torch.float32), _mlp(dtype=torch.float32)
    scores = prune.wanda_importance(wanda, batches)
    for layer in (wanda[0], wanda[2]):
        if "amount" in pattern:
            prune.wanda(layer, "weight", 0.5, importance_scores=scores[layer])
        else:
            prune.nm_structured(layer, "weight", 2, 4, dim=1, importance_scores=scores[layer])
    for layer in (magnitude[0], magnitude[2]):
        if "amount" in pattern:
            prune.l1_unstructured(layer, "weight", 0.5)
        else:
            prune.nm_structured(layer, "weight", 2, 4, dim=1)
    for net in (gpt, wanda, magnitude):  # the same number of zeros in every method
        assert [int((net[i].weight_mask == 0).sum()) for i in (0, 2)] == [96, 64]
    # Relative squared errors measured (SparseGPT / Wanda / magnitude), calibration rows:
    # 50%: layer 0.014 / 0.085 / 0.179, model 0.063 / 0.181 / 0.263;
    # 2:4: layer 0.027 / 0.096 / 0.253, model 0.094 / 0.225 / 0.380 (held out: 0.112 / 0.200 / 0.360).
    for data in (x, held_out):
        layer = [_layer_error(net, dense, data) for net in (gpt, wanda, magnitude)]
        model = [_output_error(net, dense, data) for net in (gpt, wanda, magnitude)]
        assert layer[0] < 0.5 * min(layer[1:]), layer
        assert model[0] < 0.75 * min(model[1:]), model


# --------------------------------------------------------------------------------------
# Convolutions against the core with unfold_patches Hessians
# --------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.grouped = nn.Conv2d(4, 6, 3, stride=2, groups=2)

    def forward(self, x):
        return self.grouped(torch.relu(self.conv(x)))


def _conv_inputs(net: nn.Module, batches: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """Each layer's whole input, captured from the dense model (what the adapter must not do)."""
    seen: dict[str, list[np.ndarray]] = {}
    handles = [
        m.register_forward_pre_hook(lambda m, a, name=name: seen.setdefault(name, []).append(_np(a[0])))
        for name, m in net.named_modules()
        if isinstance(m, (nn.Conv1d, nn.Conv2d))
    ]
    with torch.no_grad():
        for b in batches:
            net(b)
    for h in handles:
        h.remove()
    return {name: np.concatenate(xs) for name, xs in seen.items()}


def test_conv2d_groups_one_and_two_equal_core_with_unfolded_hessians():
    torch.manual_seed(3)
    net = ConvNet().double()
    batches = [torch.randn(n, 3, 7, 7, dtype=torch.float64) for n in (2, 3)]
    inputs = _conv_inputs(net, batches)
    padded = np.pad(inputs["conv"], [(0, 0), (0, 0), (1, 1), (1, 1)], mode="reflect")
    p_conv = arrayprune.unfold_patches(padded, 3)
    p_grouped = arrayprune.unfold_patches(inputs["grouped"], 3, stride=2, groups=2)
    assert p_conv.shape == (1, 5 * 49, 27) and p_grouped.shape == (2, 5 * 9, 18)
    # The unfolded products are the layers' outputs (so the reference Hessians are right).
    with torch.no_grad():
        out = net.conv(torch.tensor(inputs["conv"])).numpy()
    w = _np(net.conv.weight)
    unfolded = p_conv[0] @ w.reshape(4, -1).T + _np(net.conv.bias)
    np.testing.assert_allclose(unfolded, out.transpose(0, 2, 3, 1).reshape(-1, 4), rtol=1e-12, atol=1e-12)

    w_conv, w_grouped = _np(net.conv.weight), _np(net.grouped.weight)
    want_conv = arrayprune.sparsegpt(w_conv, _hessian(p_conv[0]), 0.4, block_size=16, reduction_axis=1)
    total = round(0.4 * w_grouped.size)  # 43 of 108: the groups prune 22 and 21
    assert total == 43
    want_groups = [
        arrayprune.sparsegpt(w_grouped[3 * g : 3 * g + 3], _hessian(p_grouped[g]), count, block_size=16)
        for g, count in enumerate((22, 21))
    ]
    prune.sparsegpt(net, batches, 0.4, block_size=16, sequential=False)
    np.testing.assert_array_equal(net.conv.weight_mask.numpy(), want_conv[1].astype(np.float64))
    np.testing.assert_allclose(net.conv.weight_orig.detach().numpy(), want_conv[0], rtol=1e-9, atol=1e-12)
    keep = np.concatenate([k for _, k in want_groups]).astype(np.float64)
    np.testing.assert_array_equal(net.grouped.weight_mask.numpy(), keep)
    new = np.concatenate([w for w, _ in want_groups])
    np.testing.assert_allclose(net.grouped.weight_orig.detach().numpy(), new, rtol=1e-9, atol=1e-12)
    assert [int((net.grouped.weight_mask[3 * g : 3 * g + 3] == 0).sum()) for g in (0, 1)] == [22, 21]


def test_conv1d_same_padding_and_sequential_conv():
    torch.manual_seed(4)
    net = nn.Sequential(nn.Conv1d(2, 4, 3, padding="same"), nn.ReLU(), nn.Conv1d(4, 4, 2, groups=2)).double()
    batches = [torch.randn(n, 2, 9, dtype=torch.float64) for n in (3, 2)]
    x = np.concatenate([_np(b) for b in batches])
    p1 = arrayprune.unfold_patches(np.pad(x, [(0, 0), (0, 0), (1, 1)])[:, :, None, :], (1, 3))[0]
    w1, b1 = _np(net[0].weight), _np(net[0].bias)
    new1, keep1 = arrayprune.sparsegpt(w1, _hessian(p1), n=2, m=4, block_size=4)
    hidden = _relu(p1 @ new1.reshape(4, -1).T + b1).reshape(5, 9, 4).transpose(0, 2, 1)  # pruned first layer
    p2 = arrayprune.unfold_patches(hidden[:, :, None, :], (1, 2), groups=2)
    w2 = _np(net[2].weight)
    want2 = [arrayprune.sparsegpt(w2[2 * g : 2 * g + 2], _hessian(p2[g]), n=2, m=4, block_size=4) for g in (0, 1)]

    prune.sparsegpt(net, batches, n=2, m=4, block_size=4)
    np.testing.assert_array_equal(net[0].weight_mask.numpy(), keep1.astype(np.float64))
    np.testing.assert_allclose(net[0].weight_orig.detach().numpy(), new1, rtol=1e-9, atol=1e-12)
    keep2 = np.concatenate([k for _, k in want2]).astype(np.float64)
    np.testing.assert_array_equal(net[2].weight_mask.numpy(), keep2)
    np.testing.assert_allclose(
        net[2].weight_orig.detach().numpy(), np.concatenate([w for w, _ in want2]), rtol=1e-9, atol=1e-12
    )


# --------------------------------------------------------------------------------------
# The reparametrization, interop, modes, batches, early stop
# --------------------------------------------------------------------------------------


def test_reparametrization_remove_state_dict_and_torch_interop():
    batches = _batches()
    net = prune.sparsegpt(_mlp(), batches, 0.5)
    assert prune.is_pruned(net) and tprune.is_pruned(net)
    assert sorted(net.state_dict()) == [
        "0.bias",
        "0.weight_mask",
        "0.weight_orig",
        "2.bias",
        "2.weight_mask",
        "2.weight_orig",
    ]
    assert all(isinstance(h, tprune.BasePruningMethod) for h in net[0]._forward_pre_hooks.values())
    updated = [net[i].weight_orig.detach().clone() for i in (0, 2)]
    masks = [net[i].weight_mask.clone() for i in (0, 2)]
    x = batches[0]
    with torch.no_grad():
        out = net(x)
        ref = torch.relu(x @ (updated[0] * masks[0]).T + net[0].bias) @ (updated[1] * masks[1]).T + net[2].bias
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    prune.remove(net[0], "weight")
    tprune.remove(net[2], "weight")  # PyTorch's own remove
    for i, u, mk in zip((0, 2), updated, masks, strict=True):
        assert torch.equal(net[i].weight.detach(), u * mk)
        assert isinstance(net[i].weight, nn.Parameter)
    assert not prune.is_pruned(net)
    assert sorted(net.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_generator_batches_tuples_and_names_match_a_list():
    want = prune.sparsegpt(_mlp(), _batches(), 0.5, )
    by_gen = prune.sparsegpt(_mlp(), (b for b in _batches()), 0.5)
    by_tuple = prune.sparsegpt(_mlp(), [(b,) for b in _batches()], 0.5)
    by_mapping = prune.sparsegpt(_mlp(), [{"input": b} for b in _batches()], 0.5)
    for net in (by_gen, by_tuple, by_mapping):
        for i in (0, 2):
            torch.testing.assert_close(net[i].weight, want[i].weight, rtol=0, atol=0)
    only_second = prune.sparsegpt(_mlp(), _batches(), 0.5, modules=["2"])
    assert not hasattr(only_second[0], "weight_orig") and hasattr(only_second[2], "weight_orig")
    by_module = _mlp()
    prune.sparsegpt(by_module, _batches(), 0.5, modules=[by_module[2]])
    torch.testing.assert_close(by_module[2].weight, only_second[2].weight, rtol=0, atol=0)
    # Alone, the second layer is calibrated on the dense first layer: the one-pass result.
    one_pass = prune.sparsegpt(_mlp(), _batches(), 0.5, sequential=False)
    torch.testing.assert_close(only_second[2].weight, one_pass[2].weight, rtol=0, atol=0)


def test_train_mode_restored_and_dropout_off_while_calibrating():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 16), nn.Dropout(0.5), nn.Linear(16, 8)).double()
    twin = nn.Sequential(nn.Linear(12, 16), nn.Identity(), nn.Linear(16, 8)).double()
    twin.load_state_dict(net.state_dict())
    net.train()
    net[1].eval()  # a mixed state, restored as it was
    prune.sparsegpt(net, _batches(), 0.5)
    prune.sparsegpt(twin, _batches(), 0.5)
    assert [m.training for m in net.modules()] == [True, True, False, True]
    for i in (0, 2):
        torch.testing.assert_close(net[i].weight, twin[i].weight, rtol=0, atol=0)


def test_each_step_runs_only_the_prefix_of_the_model():
    net = _mlp()
    tail_calls = []
    net[2].register_forward_hook(lambda m, a, out: tail_calls.append(a[0].shape[0]))
    prune.sparsegpt(net, _batches(), 0.5)
    # One full forward (the first batch, to find the order); the first layer's step stops
    # before the second layer; the second layer's step stops before running it.
    assert tail_calls == [20]


def test_hessians_on_device_in_float64_and_weights_keep_dtype(monkeypatch):
    seen = []
    original = arrayprune.sparsegpt

    def spy(weight, hessian, *args, **kwargs):
        seen.append((weight.dtype, hessian.dtype, hessian.device.type, tuple(hessian.shape)))
        return original(weight, hessian, *args, **kwargs)

    monkeypatch.setattr(arrayprune.SparseGPT, "SOLVE", staticmethod(spy))  # the solver the layers get
    net = prune.sparsegpt(_mlp(dtype=torch.float32), _batches(torch.float32), 0.5)
    assert seen == [(torch.float32, torch.float64, "cpu", (12, 12)), (torch.float32, torch.float64, "cpu", (16, 16))]
    assert net[0].weight_orig.dtype == torch.float32 and net[0].weight_mask.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu():
    cpu = prune.sparsegpt(_mlp(), _batches(), 0.5, block_size=8)
    gpu = prune.sparsegpt(_mlp().cuda(), [b.cuda() for b in _batches()], 0.5, block_size=8)
    for i in (0, 2):
        assert gpu[i].weight_orig.device.type == "cuda" and gpu[i].weight_mask.device.type == "cuda"
        torch.testing.assert_close(gpu[i].weight_mask.cpu(), cpu[i].weight_mask, rtol=0, atol=0)
        torch.testing.assert_close(gpu[i].weight_orig.cpu(), cpu[i].weight_orig, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------------------
# Bad input: a clear error, and the model as it was
# --------------------------------------------------------------------------------------


def _snapshot(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def _unchanged(net: nn.Module, snap: dict[str, torch.Tensor]) -> None:
    assert not any(hasattr(m, "weight_orig") or hasattr(m, "weight_mask") for m in net.modules())
    assert not prune.is_pruned(net)
    state = net.state_dict()
    assert state.keys() == snap.keys()
    for k, v in snap.items():
        assert torch.equal(state[k], v), k
    assert all(isinstance(m.weight, nn.Parameter) for m in net.modules() if isinstance(m, nn.Linear))


class _Bomb(nn.Module):
    """Identity that raises on its `at`-th call."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("boom")
        return x


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"calibration_batches": []}, ValueError, "no calibration batch was given"),
        ({"calibration_batches": iter([])}, ValueError, "no calibration batch was given"),
        ({"calibration_batches": torch.ones(2, 12)}, TypeError, "calibration_batches must be an iterable of batches"),
        ({"amount": 1.5}, ValueError, r"amount=1.5 should either be a float in the range \[0, 1\]"),
        ({"amount": -1}, ValueError, "amount=-1 should either be a float"),
        ({"amount": 129}, ValueError, "amount=129 should be smaller than the number of parameters to prune=128"),
        ({"amount": "half"}, TypeError, "Invalid type for amount: 'half'. Must be int or float."),
        ({"amount": 0.5, "n": 2, "m": 4}, ValueError, "give either amount or n and m, not both"),
        ({"amount": None}, ValueError, "sparsegpt needs an amount, or n and m for an N:M pattern"),
        ({"amount": None, "n": 2, "m": 4, "block_size": 6}, ValueError, "block_size=6 must be a multiple of m=4"),
        ({"damp": -0.1}, ValueError, "damp must be a finite non-negative number, got -0.1"),
        ({"modules": ["nope"]}, ValueError, "'nope' is not a submodule of the model"),
        ({"modules": [nn.Linear(12, 16)]}, ValueError, "Linear is not a submodule of the model"),
        ({"modules": ["1"]}, TypeError, "'1' is a ReLU: sparsegpt prunes Linear, Conv1d, Conv2d and"),
    ],
)
def test_bad_input_raises_before_any_change(kwargs, error, message):
    net = _mlp()
    snap = _snapshot(net)
    arguments = {"calibration_batches": _batches(), "amount": 0.5, **kwargs}
    with pytest.raises(error, match=message):
        prune.sparsegpt(net, **arguments)
    _unchanged(net, snap)


def test_already_pruned_layer_refused_and_others_untouched():
    net = _mlp()
    prune.l1_unstructured(net[2], "weight", 0.25)
    snap = _snapshot(net)
    with pytest.raises(ValueError, match="the weight of '2' is already pruned: sparsegpt prunes dense weights"):
        prune.sparsegpt(net, _batches(), 0.5)
    assert not hasattr(net[0], "weight_orig")
    assert net.state_dict().keys() == snap.keys()
    assert all(torch.equal(net.state_dict()[k], v) for k, v in snap.items())
    prune.sparsegpt(net, _batches(), 0.5, modules=[net[0]])  # leaving it out works
    assert int((net[0].weight_mask == 0).sum()) == 96 and int((net[2].weight_mask == 0).sum()) == 32


def test_failure_midway_restores_the_updated_layers():
    torch.manual_seed(0)
    # Calls of the bomb: 1 (order pass), none while the first layer is calibrated (the
    # forward stops there), 2 at the second layer's first batch: by then the first layer
    # has been pruned and its weight overwritten with the updated values.
    net = nn.Sequential(nn.Linear(12, 16), _Bomb(at=2), nn.Linear(16, 8)).double()
    snap = _snapshot(net)
    with pytest.raises(RuntimeError, match="boom"):
        prune.sparsegpt(net, _batches(), 0.5)
    assert net[1].calls == 2
    _unchanged(net, snap)


def test_singular_hessian_fails_and_restores():
    net = _mlp()
    with torch.no_grad():
        net[0].weight[1] = net[0].weight[0]
        net[0].bias[1] = net[0].bias[0]  # two equal hidden units: the second Hessian is singular
    snap = _snapshot(net)
    with pytest.raises(ValueError, match="the damped Hessian is not positive definite"):
        prune.sparsegpt(net, _batches(), 0.0, damp=0.0, sequential=False)
    _unchanged(net, snap)


def test_unreached_layer_refused():
    net = nn.ModuleDict({"used": nn.Linear(12, 4), "unused": nn.Linear(4, 4)}).double()
    net.forward = lambda x: net["used"](x)
    for sequential, what in ((True, "the first calibration batch"), (False, "the calibration batches")):
        with pytest.raises(ValueError, match=f"{what} never reached 'unused'"):
            prune.sparsegpt(net, _batches(), 0.5, sequential=sequential)
        assert not prune.is_pruned(net)


class _Twice(nn.Module):
    """One square layer applied twice: its Hessian holds both calls' inputs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


@pytest.mark.parametrize("sequential", [True, False])
def test_layer_called_twice_accumulates_both_inputs(sequential):
    torch.manual_seed(5)
    net = _Twice().double()
    batches = _batches()
    w, b = _np(net.fc.weight), _np(net.fc.bias)
    x = np.concatenate([_np(t) for t in batches])
    both = np.concatenate([x, _relu(x @ w.T + b)])  # 2 x 64 rows
    new, keep = arrayprune.sparsegpt(w, _hessian(both), 0.5, block_size=8, reduction_axis=1)
    prune.sparsegpt(net, batches, 0.5, block_size=8, sequential=sequential)
    np.testing.assert_array_equal(net.fc.weight_mask.numpy(), keep.astype(np.float64))
    np.testing.assert_allclose(net.fc.weight_orig.detach().numpy(), new, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------------------
# Per-layer amounts: a mapping of layers to amounts
# --------------------------------------------------------------------------------------


def _mlp3(seed: int = 3) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8)).double()


#: Layer -> amount for :func:`_mlp3`: a float, a count, another float.
_AMOUNTS = {"0": 0.75, "2": 40, "4": 0.25}


@pytest.mark.parametrize("sequential", [True, False])
def test_per_layer_amounts_equal_sparsegpt_by_hand_layer_by_layer(sequential):
    batches = _batches()
    net = _mlp3()
    dense = [(_np(net[i].weight), _np(net[i].bias)) for i in (0, 2, 4)]
    # By hand: each layer's Hessian from its inputs (through the pruned, updated earlier
    # layers when sequential, through the dense ones otherwise), the core's sparsegpt with
    # that layer's amount.
    x = np.concatenate([_np(b) for b in batches])
    inputs = x
    want = []
    for (w, b), amount in zip(dense, _AMOUNTS.values(), strict=True):
        new, keep = arrayprune.sparsegpt(w, _hessian(inputs), amount, block_size=8, reduction_axis=1)
        want.append((new, keep))
        inputs = _relu(inputs @ (new if sequential else w).T + b)

    keys = {net[0]: 0.75, "2": 40, net[4]: 0.25}  # modules and qualified names alike
    prune.sparsegpt(net, batches, keys, block_size=8, sequential=sequential)
    for i, (new, keep) in zip((0, 2, 4), want, strict=True):
        np.testing.assert_array_equal(net[i].weight_mask.numpy(), keep.astype(np.float64))
        np.testing.assert_allclose(net[i].weight_orig.detach().numpy(), new, rtol=1e-9, atol=1e-12)
    zeros = [int((net[i].weight_mask == 0).sum()) for i in (0, 2, 4)]
    assert zeros == [round(0.75 * 192), 40, round(0.25 * 128)]

    # The same as one call per layer with its single amount, in the order data flows.
    by_layer = _mlp3()
    if sequential:
        for name, amount in _AMOUNTS.items():
            prune.sparsegpt(by_layer, batches, amount, modules=[name], block_size=8)
    else:  # every Hessian from the dense model: prune copies of it, one layer each
        for name, amount in _AMOUNTS.items():
            one = prune.sparsegpt(_mlp3(), batches, amount, modules=[name], block_size=8)
            prune.custom_from_mask(by_layer.get_submodule(name), "weight", one.get_submodule(name).weight_mask)
            with torch.no_grad():
                by_layer.get_submodule(name).weight_orig.copy_(one.get_submodule(name).weight_orig)
    for i in (0, 2, 4):
        torch.testing.assert_close(net[i].weight_mask, by_layer[i].weight_mask, rtol=0, atol=0)
        torch.testing.assert_close(net[i].weight_orig, by_layer[i].weight_orig, rtol=0, atol=0)


def test_per_layer_amounts_prune_only_their_layers_and_agree_with_modules():
    batches = _batches()
    net = _mlp3()
    prune.l1_unstructured(net[4], "weight", 0.5)  # not in the mapping: left alone, not refused
    before = net[4].weight_orig.detach().clone()
    prune.sparsegpt(net, batches, {"2": 0.5, "0": 0.25}, block_size=8)
    assert [int((net[i].weight_mask == 0).sum()) for i in (0, 2)] == [48, 128]
    assert torch.equal(net[4].weight_orig, before) and int((net[4].weight_mask == 0).sum()) == 64

    same = _mlp3()
    prune.sparsegpt(same, batches, {"0": 0.25, "2": 0.5}, modules=[same[2], "0"], block_size=8)
    for i in (0, 2):
        torch.testing.assert_close(same[i].weight_orig, net[i].weight_orig, rtol=0, atol=0)
    untouched = _mlp3()
    assert prune.sparsegpt(untouched, batches, {}) is untouched and not prune.is_pruned(untouched)


@pytest.mark.parametrize(
    ("amount", "kwargs", "error", "message"),
    [
        ({"0": "half"}, {}, TypeError, "amount for '0': Invalid type for amount: 'half'. Must be int or float."),
        ({"0": None}, {}, TypeError, "amount for '0': Invalid type for amount: None"),
        ({"2": 1.5}, {}, ValueError, r"amount for '2': amount=1.5 should either be a float in the range \[0, 1\]"),
        ({"0": 0.5, "2": -1}, {}, ValueError, "amount for '2': amount=-1 should either be a float"),
        (
            {"0": 0.5, "2": 129},
            {},
            ValueError,
            "amount for '2': amount=129 should be smaller than the number of parameters to prune=128",
        ),
        ({0: 0.5}, {}, TypeError, "the keys of amount must be modules or qualified names of the model's layers"),
        ({"nope": 0.5}, {}, ValueError, "'nope' is not a submodule of the model"),
        ({nn.Linear(12, 16): 0.5}, {}, ValueError, "Linear is not a submodule of the model"),
        ({"1": 0.5}, {}, TypeError, "'1' is a ReLU: sparsegpt prunes Linear, Conv1d, Conv2d and"),
        ({"0": 0.5}, {"n": 2, "m": 4}, ValueError, "give either amount or n and m, not both"),
        ({"0": 0.5}, {"modules": ["0", "2"]}, ValueError, "'2' is in modules but has no amount"),
        ({"0": 0.5, "2": 0.5}, {"modules": ["0"]}, ValueError, "amount gives '2' an amount, but it is not in modules"),
    ],
)
def test_bad_per_layer_amounts_raise_before_any_change(amount, kwargs, error, message):
    net = _mlp()
    snap = _snapshot(net)
    with pytest.raises(error, match=message):
        prune.sparsegpt(net, _batches(), amount, **kwargs)
    _unchanged(net, snap)


def test_a_layer_given_twice_in_the_mapping_is_refused():
    net = _mlp()
    snap = _snapshot(net)
    with pytest.raises(ValueError, match=r"amount gives '0' twice \(as a module and by its name\)"):
        prune.sparsegpt(net, _batches(), {net[0]: 0.5, "0": 0.25})
    _unchanged(net, snap)


def test_degenerate_statistics_are_refused_naming_the_layer_and_change_nothing():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"^'0': the Hessian is all zero: every input of the layer was 0"):
        prune.sparsegpt(net, [torch.zeros(10, 6)], 0.5)
    x = torch.randn(10, 6)
    x[3, 2] = float("inf")
    with pytest.raises(ValueError, match=r"^'0': the Hessian has NaN or infinite entries"):
        prune.sparsegpt(net, [x], 0.5)
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before, strict=True))
    assert not any(prune.is_pruned(m) for m in net)


def test_dead_inputs_count_toward_each_layers_amount():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(20, 6)
    x[:, :4] = 0  # 32 dead entries of the first layer's 48: more than its 24
    dense = net[0].weight.detach().clone()
    prune.sparsegpt(net, [x], 0.5)
    assert int((net[0].weight == 0).sum()) == 24 and int((net[2].weight == 0).sum()) == 12
    assert torch.equal(net[0].weight[:, 4:], dense[:, 4:])  # the live inputs: nothing pruned, nothing spread
