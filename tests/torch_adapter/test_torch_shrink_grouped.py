"""Shrinking grouped (non-depthwise) convolutions: every convolution group keeps one size.

The references are written here in NumPy: a channel's score is the L2 norm of every
weight entry that reads or writes it (a grouped convolution's input channel ``c`` is
column ``c % (in/g)`` of the rows of block ``c // (in/g)``); each convolution group loses
as many channels, its lowest, ties to the lower index; the shrunk model must compute
what the float64 dense model computes with those channels zeroed everywhere.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import arrayprune.adapters.torch as prune

ATOL = 1e-5


def _net() -> nn.Sequential:
    torch.manual_seed(3)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, groups=4), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 8, 1, groups=2), nn.ReLU(),
        nn.Conv2d(8, 5, 1),
    ).double().eval()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g, dtype=torch.float64) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64))
                m.bias.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64) * 0.1)
    return net


def _columns(w: np.ndarray, groups: int) -> np.ndarray:
    """``[in, -1]``: every weight entry reading each input channel of a (grouped) conv."""
    rows, local = w.shape[:2]
    blocks = w.reshape(groups, rows // groups, local, -1)  # [g, rows/g, in/g, k]
    return blocks.transpose(0, 2, 1, 3).reshape(groups * local, -1)


def _kept(norm_rows: list[np.ndarray], segments: int, drop: int) -> np.ndarray:
    norms = np.linalg.norm(np.concatenate(norm_rows, axis=1), axis=1)
    width = norms.size // segments
    kept = []
    for j in range(segments):
        order = np.argsort(norms[j * width:(j + 1) * width], kind="stable")
        kept.append(np.sort(order[drop // segments:]) + j * width)
    return np.concatenate(kept)


def _zero(w: np.ndarray, gone: np.ndarray, groups: int) -> None:
    """Zero input channels `gone` of a (grouped) conv weight in place."""
    rows, local = w.shape[:2]
    for c in gone:
        j, i = divmod(int(c), local)
        w[j * (rows // groups):(j + 1) * (rows // groups), i] = 0


def _take_columns(w: np.ndarray, kept: np.ndarray, groups: int) -> np.ndarray:
    rows, local = w.shape[:2]
    per = rows // groups
    return np.concatenate(
        [w[j * per:(j + 1) * per][:, kept[(kept >= j * local) & (kept < (j + 1) * local)] - j * local]
         for j in range(groups)]
    )  # fmt: skip


def test_grouped_convolutions_keep_their_groups_even():
    net = _net()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    groups = {g.name: g for g in prune.channel_groups(net, x)}
    assert (groups["0"].segments, groups["3"].segments, groups["6"].segments) == (4, 4, 2)
    assert all(groups[n].shrinkable for n in ("0", "3", "6"))
    w = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    # the NumPy reference: which channels go
    k0 = _kept([w["0.weight"].reshape(8, -1), _columns(w["3.weight"], 4)], 4, 4)
    k3 = _kept([w["3.weight"].reshape(16, -1), _columns(w["6.weight"], 2)], 4, 8)
    k6 = _kept([w["6.weight"].reshape(8, -1), _columns(w["8.weight"], 1)], 2, 4)
    # the dense model with those channels zeroed in every member
    zeroed = copy.deepcopy(net)
    z = {k: v.detach().numpy().copy() for k, v in zeroed.state_dict().items()}
    for kept, producer, norm, consumer, g in ((k0, "0", "1", "3", 4), (k3, "3", "4", "6", 2), (k6, "6", None, "8", 1)):
        gone = np.setdiff1d(np.arange(z[f"{producer}.weight"].shape[0]), kept)
        z[f"{producer}.weight"][gone] = 0
        z[f"{producer}.bias"][gone] = 0
        if norm is not None:
            z[f"{norm}.weight"][gone] = 0
            z[f"{norm}.bias"][gone] = 0
        _zero(z[f"{consumer}.weight"], gone, g)
    zeroed.load_state_dict({k: torch.from_numpy(v) for k, v in z.items()})
    prune.shrink(net, x, 0.5)
    assert (net[3].in_channels, net[3].out_channels, net[3].groups) == (4, 8, 4)
    assert (net[6].in_channels, net[6].out_channels, net[6].groups) == (8, 4, 2)
    assert net[8].in_channels == 4 and tuple(net[3].weight.shape) == (8, 1, 3, 3)
    np.testing.assert_array_equal(net[0].weight.detach().numpy(), w["0.weight"][k0])
    np.testing.assert_array_equal(net[3].weight.detach().numpy(), _take_columns(w["3.weight"][k3], k0, 4))
    np.testing.assert_array_equal(net[6].weight.detach().numpy(), _take_columns(w["6.weight"][k6], k3, 2))
    np.testing.assert_array_equal(net[8].weight.detach().numpy(), w["8.weight"][:, k6])
    with torch.no_grad():
        np.testing.assert_allclose(net(x).numpy(), zeroed(x).numpy(), atol=ATOL)


@pytest.mark.slow
def test_torch_export_of_a_shrunk_grouped_convolution():
    net = _net()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    prune.shrink(net, x, 0.5)
    exported = torch.export.export(net, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(exported.module()(x).numpy(), net(x).numpy(), atol=1e-12)


def test_masks_on_a_grouped_convolution():
    net = _net()
    x = torch.randn(1, 3, 5, 5, dtype=torch.float64)
    # two channels from each of the 4 blocks of 3's output, as the masks say
    rows = torch.ones(16, dtype=torch.float64)
    gone = [0, 3, 5, 6, 8, 9, 14, 15]
    rows[gone] = 0
    prune.custom_from_mask(net[3], "weight", rows[:, None, None, None].expand_as(net[3].weight))
    masked = copy.deepcopy(net)
    with torch.no_grad():
        for t in (masked[4].weight, masked[4].bias, masked[3].bias):
            t[gone] = 0
    prune.shrink(net, x)
    assert (net[3].out_channels, net[4].num_features, net[6].in_channels, net[6].groups) == (8, 8, 8, 2)
    with torch.no_grad():
        np.testing.assert_allclose(net(x).numpy(), masked(x).numpy(), atol=ATOL)


def test_uneven_removal_is_refused_before_anything_changes():
    net = _net()
    x = torch.randn(1, 3, 5, 5, dtype=torch.float64)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError, match=r"^group '3': 6 of its 16 channels cannot be removed evenly from its 4 "):
        prune.shrink(net, x, {"3": 6})
    rows = torch.ones(16, dtype=torch.float64)
    rows[[0, 1]] = 0  # both from block 0
    prune.custom_from_mask(net[3], "weight", rows[:, None, None, None].expand_as(net[3].weight))
    with pytest.raises(ValueError, match=r"^group '3': the masks remove 2, 0, 0, 0 channels from its 4 convolution"):
        prune.shrink(net, x)
    prune.remove(net[3], "weight")
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k] * (rows[:, None, None, None] if k == "3.weight" else 1)), k


def test_a_fraction_is_taken_of_each_convolution_group():
    net = _net()
    x = torch.randn(1, 3, 5, 5, dtype=torch.float64)
    # 0.3 of 16 channels in 4 groups: round(0.3 * 4) = 1 from each (not round(4.8) = 5 in all);
    # 0.3 of 8 in 4 groups: round(0.6) = 1 each; 0.3 of 8 in 2 groups: round(1.2) = 1 each
    prune.shrink(net, x, 0.3)
    assert (net[3].out_channels, net[3].in_channels, net[6].out_channels) == (12, 4, 6)
    assert (net[3].groups, net[6].groups, tuple(net[6].weight.shape[:2])) == (4, 2, (6, 6))


def test_transposed_grouped_convolution_is_left():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ConvTranspose2d(4, 4, 2, groups=2), nn.Conv2d(4, 2, 1))
    groups = {g.name: g for g in prune.channel_groups(net, torch.randn(1, 3, 4, 4))}
    assert groups["0"].reason == "1 is a transposed grouped convolution (groups=2): its channels go in blocks"


def test_keep_floor_rounding_counts_as_torch_pruning():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 64, 1), nn.ReLU(), nn.Conv2d(64, 12, 1), nn.ReLU(), nn.Conv2d(12, 2, 1))
    x = torch.randn(1, 3, 4, 4)
    nearest = prune.shrink(copy.deepcopy(net), x, 0.3)
    floor = prune.shrink(copy.deepcopy(net), x, 0.3, rounding="keep_floor")
    # 64 channels: round(19.2) = 19 go, or int(0.7 * 64) = 44 stay; 12: round(3.6) = 4 go, int(8.4) = 8 stay
    assert (nearest[0].out_channels, nearest[2].out_channels) == (45, 8)
    assert (floor[0].out_channels, floor[2].out_channels) == (44, 8)
    # the 44 kept are the 45 kept less the weakest of them
    norms = torch.cat([net[0].weight.flatten(1), net[2].weight.transpose(0, 1).flatten(1)], 1).norm(dim=1)
    kept = np.sort(np.argsort(-norms.detach().numpy(), kind="stable")[:44])
    np.testing.assert_array_equal(floor[0].weight.detach().numpy(), net[0].weight.detach().numpy()[kept])
    grouped = prune.shrink(_net(), torch.randn(1, 3, 5, 5, dtype=torch.float64), 0.3, rounding="keep_floor")
    assert (grouped[3].out_channels, grouped[6].out_channels) == (8, 4)  # int(0.7 * 4) = 2 of each 4 stay
    with pytest.raises(ValueError, match=r"^rounding must be one of \('nearest', 'keep_floor'\), got 'up'$"):
        prune.shrink(copy.deepcopy(net), x, 0.3, rounding="up")
