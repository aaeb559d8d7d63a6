"""Wanda in the PyTorch drop-in: calibration hooks, scores, and the usual reparametrization.

Norms are checked against activations captured separately and reduced in NumPy; masks
against `reference_wanda` of tests/core/test_wanda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from test_wanda import reference_wanda  # noqa: E402
from torch import nn  # noqa: E402

import arrayprune.adapters.torch as prune  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.grouped = nn.Conv2d(4, 6, 1, groups=2)
        self.fc1 = nn.Linear(6 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        x = torch.relu(self.grouped(torch.relu(self.conv(x))))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def _net_and_batches(seed=0):
    torch.manual_seed(seed)
    net = Net().eval()
    batches = [torch.randn(n, 3, 6, 6) for n in (2, 3, 1)]
    return net, batches


def _captured_inputs(net, batches):
    """Every layer's inputs, by name, stored in full (what calibration must not do)."""
    seen: dict[str, list[np.ndarray]] = {}
    handles = [
        m.register_forward_pre_hook(lambda m, a, name=name: seen.setdefault(name, []).append(a[0].detach().numpy()))
        for name, m in net.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
    ]
    with torch.no_grad():
        for b in batches:
            net(b)
    for h in handles:
        h.remove()
    return seen


def test_norms_equal_activations_reduced_by_hand():
    net, batches = _net_and_batches()
    norms = prune.input_norms(net, batches)
    assert list(norms) == ["conv.weight", "grouped.weight", "fc1.weight", "fc2.weight"]
    for name, xs in _captured_inputs(net, batches).items():
        axis = 1 if name in ("conv", "grouped") else -1
        stacked = np.concatenate([np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis]) for x in xs]).astype(np.float64)
        want = np.sqrt((stacked**2).sum(axis=0))
        np.testing.assert_allclose(norms[f"{name}.weight"].numpy(), want, rtol=1e-12)
        assert norms[f"{name}.weight"].dtype == torch.float64


def test_batches_as_tuples_and_mappings_and_chosen_modules():
    net, batches = _net_and_batches()
    by_tensor = prune.input_norms(net, batches, modules=["fc2"])
    by_tuple = prune.input_norms(net, [(b,) for b in batches], modules=[net.fc2])
    by_mapping = prune.input_norms(net, [{"x": b} for b in batches], modules=[net.fc2])
    by_weight_name = prune.input_norms(net, batches, modules=["fc2.weight"])
    assert list(by_tensor) == list(by_weight_name) == ["fc2.weight"]
    torch.testing.assert_close(by_tensor["fc2.weight"], by_tuple["fc2.weight"], rtol=0, atol=0)
    torch.testing.assert_close(by_tensor["fc2.weight"], by_mapping["fc2.weight"], rtol=0, atol=0)
    torch.testing.assert_close(by_tensor["fc2.weight"], by_weight_name["fc2.weight"], rtol=0, atol=0)


def test_scores_and_masks_per_output_unit():
    net, batches = _net_and_batches()
    norms = prune.input_norms(net, batches)
    scores = prune.wanda_importance(net, batches)
    # Linear [out, in]: |W| * norm[in]
    w = net.fc1.weight.detach().numpy().astype(np.float64)
    np.testing.assert_allclose(scores[net.fc1].numpy(), np.abs(w) * norms["fc1.weight"].numpy()[None, :], rtol=1e-6)
    # Grouped convolution: output channel o reads input channels of its group only
    g = net.grouped.weight.detach().numpy().astype(np.float64)  # [6, 2, 1, 1], 2 groups
    n = norms["grouped.weight"].numpy()
    want = np.abs(g) * np.stack([n[0:2]] * 3 + [n[2:4]] * 3)[:, :, None, None]
    np.testing.assert_allclose(scores[net.grouped].numpy(), want, rtol=1e-6)
    for module, s in scores.items():
        prune.wanda(module, "weight", amount=0.5, importance_scores=s)
        np.testing.assert_array_equal(module.weight_mask.numpy() != 0, reference_wanda(s.numpy(), 0.5, 0))
        assert hasattr(module, "weight_orig") and prune.is_pruned(module)
        np.testing.assert_array_equal((module.weight == 0).numpy(), module.weight_mask.numpy() == 0)
    state = net.state_dict()
    assert {"fc1.weight_orig", "fc1.weight_mask"} <= set(state)
    prune.remove(net.fc1, "weight")
    assert "fc1.weight_orig" not in net.state_dict()
    assert int((net.fc1.weight == 0).sum()) == 16 * 48


def test_two_four_and_global_with_wanda_scores():
    net, batches = _net_and_batches(1)
    scores = prune.wanda_importance(net, batches, modules=[net.fc1, net.fc2])
    prune.nm_structured(net.fc2, "weight", 2, 4, dim=1, importance_scores=scores[net.fc2])
    s = scores[net.fc2].numpy().reshape(5, 4, 4)
    want = np.ones_like(s, dtype=bool)
    for i in range(5):
        for j in range(4):
            want[i, j, np.argsort(s[i, j], kind="stable")[:2]] = False
    np.testing.assert_array_equal(net.fc2.weight_mask.numpy().reshape(5, 4, 4) != 0, want)
    prune.global_unstructured(
        [(net.fc1, "weight")],
        prune.L1Unstructured,
        importance_scores={(net.fc1, "weight"): scores[net.fc1]},
        amount=100,
    )
    flat = scores[net.fc1].numpy().reshape(-1)
    dropped = np.flatnonzero(net.fc1.weight_mask.numpy().reshape(-1) == 0)
    np.testing.assert_array_equal(np.sort(dropped), np.sort(np.argsort(flat, kind="stable")[:100]))


def test_calibration_does_not_track_gradients_or_keep_hooks():
    net, batches = _net_and_batches()
    norms = prune.input_norms(net, batches)
    assert not any(n.requires_grad for n in norms.values())
    assert all(not m._forward_pre_hooks for m in net.modules())


def test_errors():
    net, batches = _net_and_batches()
    with pytest.raises(ValueError, match="no calibration batch"):
        prune.input_norms(net, [])
    with pytest.raises(ValueError, match="not a submodule"):
        prune.input_norms(net, batches, modules=[nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="Linear and Conv"):
        prune.input_norms(net, batches, modules=[""])
    extra = nn.Sequential(net, nn.Linear(5, 5))
    extra.forward = lambda x: net(x)  # the second layer is never run
    with pytest.raises(ValueError, match="never reached"):
        prune.input_norms(extra, batches)


def test_saved_norms_prune_a_safetensors_file_as_the_drop_in_prunes_the_module(tmp_path):
    """input_norms -> save_input_norms -> ``arrayprune prune --method wanda --input-norms``: same masks."""
    from arrayprune.adapters import cli
    from arrayprune.adapters import formats as fmt

    net, batches = _net_and_batches(2)
    norms = prune.input_norms(net, batches)
    prune.save_input_norms(norms, tmp_path / "norms.npz")
    saved = dict(np.load(tmp_path / "norms.npz", allow_pickle=False))
    assert list(saved) == ["conv.weight", "grouped.weight", "fc1.weight", "fc2.weight"]
    assert {k: v.shape for k, v in saved.items()} == {
        "conv.weight": (3,),
        "grouped.weight": (4,),  # every input channel of the grouped convolution
        "fc1.weight": (96,),
        "fc2.weight": (16,),
    }
    np.testing.assert_array_equal(saved["fc1.weight"], norms["fc1.weight"].numpy())

    fmt.save(tmp_path / "model.safetensors", {k: v.detach().numpy() for k, v in net.state_dict().items()})
    out = tmp_path / "pruned.safetensors"
    code = cli.main(
        [
            "prune",
            str(tmp_path / "model.safetensors"),
            "-o",
            str(out),
            "--method",
            "wanda",
            "--amount",
            "0.5",
            "--input-norms",
            str(tmp_path / "norms.npz"),
        ]
    )
    assert code == 0
    pruned = fmt.load(out).params

    scores = prune.wanda_importance(net, batches)
    for module, s in scores.items():
        prune.wanda(module, "weight", amount=0.5, importance_scores=s)
    for name, module in (("conv", net.conv), ("grouped", net.grouped), ("fc1", net.fc1), ("fc2", net.fc2)):
        kept = pruned[f"{name}.weight"] != 0
        np.testing.assert_array_equal(kept, module.weight_mask.numpy() != 0, err_msg=name)
        np.testing.assert_array_equal(pruned[f"{name}.weight"], module.weight.detach().numpy())
        np.testing.assert_array_equal(pruned[f"{name}.bias"], module.bias.detach().numpy())


def test_save_input_norms_refuses_what_the_command_line_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="keyed by weight name"):
        prune.save_input_norms({nn.Linear(2, 2): torch.ones(2)}, tmp_path / "n.npz")
    with pytest.raises(ValueError, match="'fc.weight': expected a 1-D vector of non-negative numbers"):
        prune.save_input_norms({"fc.weight": torch.tensor([1.0, -1.0])}, tmp_path / "n.npz")
    assert list(tmp_path.iterdir()) == []
