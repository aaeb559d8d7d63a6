"""prune.shrink: torch modules lose their pruned channels for real.

The yardsticks: the shrunk model against the dense model with the removed channels zeroed
in every member of their group (float64, atol 1e-5); the kept channels against a NumPy
ranking of the group's L2 norms; the shrunk layout against torchvision's architecture
built at the smaller widths (parameters, multiply-accumulates, a strict state-dict load).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as tprune
import torchvision_layouts as L
from torch import nn
from torchvision_layouts import randomized as _randomize

import arrayprune.adapters.torch as prune

ATOL = 1e-5


def _params(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _numpy_kept(arrays: dict[str, np.ndarray], group: prune._groups.TorchGroup, amount: float) -> np.ndarray:
    """Top channels by the L2 norm over all weight members; ties go to the lower index."""
    rows = []
    for s in group.members:
        if s.weight:
            part = np.take(arrays[s.param], np.arange(s.offset, s.offset + group.channels), axis=s.axis)
            rows.append(np.moveaxis(part, s.axis, 0).reshape(group.channels, -1))
    norms = np.linalg.norm(np.concatenate(rows, axis=1), axis=1)
    drop = round(amount * group.channels)
    order = np.argsort(norms, kind="stable")
    return np.sort(order[drop:])


def _zeroed(dense: nn.Module, groups: list, kept: list[np.ndarray]) -> nn.Module:
    """The dense model with every removed channel zeroed in every member of its group."""
    masked = copy.deepcopy(dense)
    state = masked.state_dict()
    with torch.no_grad():
        for group, keep in zip(groups, kept, strict=True):
            gone = np.setdiff1d(np.arange(group.channels), keep)
            for s in group.members:
                index = torch.as_tensor(gone + s.offset, dtype=torch.long)
                state[s.param].index_fill_(s.axis, index, 0.0)
    return masked


def _expected_tensors(arrays: dict[str, np.ndarray], groups: list, kept: list[np.ndarray]) -> dict[str, np.ndarray]:
    cuts: dict[tuple[str, int], list[np.ndarray]] = {}
    for group, keep in zip(groups, kept, strict=True):
        for s in group.members:
            cuts.setdefault((s.param, s.axis), []).append(keep + s.offset)
    out = dict(arrays)
    for (param, axis), parts in cuts.items():
        out[param] = np.take(out[param], np.sort(np.concatenate(parts)), axis=axis)
    return out


def _check_shrink(dense: nn.Module, x: torch.Tensor, amount: float, reference: nn.Module | None = None) -> nn.Module:
    """Shrink a copy of `dense`; check it against NumPy, the zeroed model and `reference`'s layout."""
    groups = [g for g in prune.channel_groups(dense, x) if g.shrinkable]
    arrays = _params(dense)
    kept = [_numpy_kept(arrays, g, amount) for g in groups]
    model = copy.deepcopy(dense)
    modules_before = dict(model.named_modules())
    assert prune.shrink(model, x, amount) is model
    assert dict(model.named_modules()) == modules_before  # the same module objects
    assert list(model.state_dict()) == list(arrays)  # the same keys, in order
    want = _expected_tensors(arrays, groups, kept)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k], err_msg=k)
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), _zeroed(dense, groups, kept)(x).numpy(), atol=ATOL)
    if reference is not None:
        assert L.parameter_count(model) == L.parameter_count(reference)
        assert L.macs(model, x) == L.macs(reference.double(), x)
        reference.load_state_dict(model.state_dict(), strict=True)  # the attributes fit too
        with torch.no_grad():
            np.testing.assert_allclose(reference.double().eval()(x).numpy(), model(x).numpy(), atol=1e-12)
    return model


# --------------------------------------------------------------------------------------
# torchvision's layouts
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", pytest.param("vit_b_16", marks=pytest.mark.slow)])
def test_layouts_agree_with_the_onnx_tests_layouts(name):
    """Two transcriptions of torchvision, made apart: the same state-dict keys and shapes."""
    vision_layouts = pytest.importorskip("vision_layouts")
    with torch.device("meta"):
        ours, theirs = getattr(L, name)(), getattr(vision_layouts, name)()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("amount", [0.3, 0.5])
def test_resnet18_shrinks_every_group_and_its_trunks(amount):
    torch.manual_seed(0)
    dense = _randomize(L.resnet18(10))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    groups = prune.channel_groups(dense, x)
    trunk = next(g for g in groups if g.name == "conv1")
    members = {s.param for s in trunk.members}
    # the stem and layer1's two blocks are one group, read by layer2's first block
    assert {"conv1.weight", "bn1.running_var", "layer1.0.conv2.weight", "layer1.1.bn2.bias"} <= members
    assert {"layer2.0.conv1.weight", "layer2.0.downsample.0.weight"} <= members
    assert [g.name for g in groups if not g.shrinkable] == ["x", "fc"]
    model = _check_shrink(dense, x, amount, L.resnet18(10, width=L.kept_width(amount)))
    assert model.layer2[0].downsample[0].in_channels == 64 - round(amount * 64)
    assert model.fc.in_features == 512 - round(amount * 512)


@pytest.mark.slow
@pytest.mark.parametrize("amount", [0.3])
def test_mobilenet_v3_small_depthwise_and_squeeze_excite(amount):
    torch.manual_seed(1)
    dense = _randomize(L.mobilenet_v3_small(10))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    groups = prune.channel_groups(dense, x)
    first = next(g for g in groups if g.name == "features.0.0")
    members = {(s.param, s.axis) for s in first.members}
    # depthwise filters and the squeeze-excite's expanding conv are members of the stem's group
    assert {("features.1.block.0.0.weight", 0), ("features.1.block.1.fc2.weight", 0)} <= members
    assert {("features.1.block.1.fc1.weight", 1), ("features.1.block.2.0.weight", 1)} <= members
    model = _check_shrink(dense, x, amount, L.mobilenet_v3_small(10, width=L.kept_width(amount)))
    dw = model.features[1].block[0][0]
    assert dw.groups == dw.in_channels == dw.out_channels == 16 - round(amount * 16)


@pytest.mark.slow
def test_vit_mlp_shrinks_attention_stays():
    torch.manual_seed(2)
    dense = _randomize(L.vit())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    groups = prune.channel_groups(dense, x)
    assert [g.name for g in groups if g.shrinkable] == [
        "encoder.layers.encoder_layer_0.mlp.0",
        "encoder.layers.encoder_layer_1.mlp.0",
    ]
    heads = next(g for g in groups if g.name == "encoder.layers.encoder_layer_0.self_attention")
    assert "MultiheadAttention" in heads.reason and "heads" in heads.reason
    for g in groups:
        assert g.shrinkable or "\n" not in g.reason
    model = _check_shrink(dense, x, 0.5, L.vit(width=L.kept_width(0.5)))
    assert model.encoder.layers.encoder_layer_0.self_attention.embed_dim == 64


@pytest.mark.slow
def test_vit_b_16_layout_groups():
    x = torch.randn(1, 3, 224, 224)
    groups = prune.channel_groups(L.vit_b_16(), x)
    assert [g.channels for g in groups if g.shrinkable] == [3072] * 12


@pytest.mark.slow
def test_unet_concat_offsets():
    torch.manual_seed(3)
    dense = _randomize(L.unet())
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    groups = {g.name: g for g in prune.channel_groups(dense, x)}
    # the decoder reads the upsampled channels at 0 and the skip at their width
    assert prune._groups.Slot("dec2.0.weight", 1, 0) in groups["up2"].members
    assert prune._groups.Slot("dec2.0.weight", 1, 16) in groups["enc2.0"].members
    assert prune._groups.Slot("dec1.0.weight", 1, 16) in groups["enc1.0"].members
    assert prune._groups.Slot("dec1.0.weight", 1, 0) in groups["dec2.0"].members
    _check_shrink(dense, x, 0.5, L.unet(width=L.kept_width(0.5)))


# --------------------------------------------------------------------------------------
# what is left, and why
# --------------------------------------------------------------------------------------


class Gate(nn.Module):
    """Custom: data-dependent control flow, so torch.fx cannot trace into it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(channels) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * self.scale.view(1, -1, 1, 1)
        return x


class WithCustom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.gate = nn.Conv2d(3, 8, 3, padding=1), Gate(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 12, 3, padding=1), nn.BatchNorm2d(12)
        self.conv3, self.head = nn.Conv2d(12, 6, 1), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(self.gate(self.conv1(x)))
        x = self.conv3(torch.relu(self.bn2(x)))
        return self.head(x.mean(dim=(2, 3)))


def test_custom_module_channels_left_with_reason():
    torch.manual_seed(4)
    dense = _randomize(WithCustom())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    groups = {g.name: g for g in prune.channel_groups(dense, x)}
    assert groups["conv1"].reason.startswith("they reach gate (Gate): torch.fx cannot trace into it")
    assert "\n" not in groups["conv1"].reason
    assert groups["conv2"].shrinkable and groups["conv3"].shrinkable  # a mean over H, W keeps channels
    model = _check_shrink(dense, x, 0.5)
    assert (model.conv1.out_channels, model.conv2.out_channels, model.head.in_features) == (8, 6, 3)


def test_leaf_modules_are_kept_whole():
    dense = _randomize(WithCustom())
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    groups = {g.name: g for g in prune.channel_groups(dense, x, leaf_modules=[nn.BatchNorm2d])}
    assert groups["conv2"].reason == "they reach bn2 (BatchNorm2d): it is one of leaf_modules"


def test_layer_norm_is_left_grouped_conv_is_not():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, groups=2), nn.Flatten(), nn.LayerNorm(8 * 16), nn.Linear(128, 2)
    )
    x = torch.randn(1, 3, 6, 6)
    groups = prune.channel_groups(net, x)
    assert groups[1].name == "0" and groups[1].shrinkable and groups[1].segments == 2
    assert groups[2].name == "1" and not groups[2].shrinkable
    line = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3), nn.ReLU(), nn.Linear(3, 2))
    groups = prune.channel_groups(line, torch.randn(2, 4))
    assert [g.name for g in groups] == ["input_1", "0", "_1", "2", "4"]
    assert groups[0].reason == "they are an input of the model"
    assert groups[1].reason == "1 (LayerNorm) normalizes over the channels: removing some changes the others"
    assert groups[3].shrinkable and groups[4].reason == "they are an output of the model"


def test_group_norm_groups_go_whole():
    torch.manual_seed(8)
    net = nn.Sequential(
        nn.Conv2d(3, 12, 3), nn.GroupNorm(4, 12), nn.ReLU(), nn.Conv2d(12, 6, 3), nn.GroupNorm(6, 6), nn.Conv2d(6, 2, 1)
    ).double()
    with torch.no_grad():
        for gn in (net[1], net[4]):
            gn.weight.normal_()
            gn.bias.normal_()
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    groups = prune.channel_groups(net, x)
    assert [(g.name, g.block) for g in groups] == [("input_1", 1), ("0", 3), ("3", 1), ("5", 1)]
    dense = copy.deepcopy(net)
    prune.shrink(net, x, 0.5)
    assert (net[1].num_groups, net[1].num_channels, net[3].in_channels) == (2, 6, 6)
    assert (net[4].num_groups, net[4].num_channels, net[3].out_channels) == (3, 3, 3)
    # the kept blocks: the two of largest L2 norm over the conv rows and columns
    rows = torch.cat([dense[0].weight.flatten(1), dense[3].weight.transpose(0, 1).flatten(1)], dim=1)
    blocks = rows.detach().norm(dim=1).reshape(4, 3).norm(dim=1)
    top = np.sort(np.argsort(blocks.numpy(), kind="stable")[2:])
    kept = (top[:, None] * 3 + np.arange(3)).flatten()
    np.testing.assert_array_equal(net[0].weight.detach().numpy(), dense[0].weight.detach().numpy()[kept])
    zeroed = _zeroed(dense, [g for g in groups if g.shrinkable], [kept, _numpy_kept(_params(dense), groups[2], 0.5)])
    with torch.no_grad():
        np.testing.assert_allclose(net(x).numpy(), zeroed(x).numpy(), atol=ATOL)


def test_group_norm_refuses_masks_splitting_its_groups():
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(2, 8), nn.Conv2d(8, 2, 1))
    rows = torch.tensor([0, 1, 1, 1, 1, 1, 1, 1.0])[:, None, None, None]
    prune.custom_from_mask(net[0], "weight", rows.expand(8, 3, 1, 1))
    with pytest.raises(ValueError, match=r"^group '0': the masks remove part of GroupNorm group 0 \(4 channels each\)"):
        prune.shrink(net, torch.randn(1, 3, 4, 4))


def test_residual_mul_and_functional_ops_join_groups():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 6, 1), nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.relu(self.a(x)) * torch.sigmoid(self.b(x))
            return self.c(torch.nn.functional.max_pool2d(y, 2)).flatten(1)

    net = Net().double()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    (_, g, out) = prune.channel_groups(net, x)
    assert {s.param for s in g.members} == {"a.weight", "a.bias", "b.weight", "b.bias", "c.weight"}
    assert g.shrinkable and not out.shrinkable
    _check_shrink(net, x, 0.5)


def test_reshape_with_a_constant_channel_count_is_left():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 1), nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).view(x.shape[0], 4, -1).mean(-1))

    groups = prune.channel_groups(Net(), torch.randn(2, 3, 5, 5))
    assert [g.name for g in groups] == ["x", "conv", "mean", "fc"]
    assert groups[1].reason == ".view() (view) names their count as the constant 4"
    assert groups[2].reason == "they come from mean, which is not followed"


# --------------------------------------------------------------------------------------
# masks already on the model
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["drop-in", "torch"])
def test_masks_of_ln_structured_say_what_goes(verb):
    torch.manual_seed(5)
    dense = _randomize(L.resnet18(10))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    model = copy.deepcopy(dense)
    blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
    lib = prune if verb == "drop-in" else tprune
    for b in blocks:  # inner groups: conv1 -> bn1 -> conv2
        lib.ln_structured(b.conv1, "weight", amount=0.5, n=2, dim=0)
    zero_rows = [torch.nonzero(b.conv1.weight_mask.flatten(1).sum(1) == 0).flatten().tolist() for b in blocks]
    # the drop-in's masks are PyTorch's
    reference = copy.deepcopy(dense)
    ref_blocks = [b for layer in (reference.layer1, reference.layer2, reference.layer3, reference.layer4)
                  for b in layer]  # fmt: skip
    for b, rows in zip(ref_blocks, zero_rows, strict=True):
        tprune.ln_structured(b.conv1, "weight", amount=0.5, n=2, dim=0)
        assert torch.nonzero(b.conv1.weight_mask.flatten(1).sum(1) == 0).flatten().tolist() == rows
    groups = [g for g in prune.channel_groups(model, x) if g.shrinkable]
    kept = []
    for g in groups:
        block = next((b for b, rows in zip(blocks, zero_rows, strict=True) if g.name == _name(model, b.conv1)), None)
        removed = zero_rows[blocks.index(block)] if block is not None else []
        kept.append(np.setdiff1d(np.arange(g.channels), removed))
    expected = _zeroed(dense, groups, kept)
    prune.shrink(model, x)
    assert not prune.is_pruned(model)
    assert list(model.state_dict()) == list(dense.state_dict())
    assert [b.conv1.out_channels for b in blocks] == [b.bn1.num_features for b in blocks]
    assert [b.conv1.out_channels for b in blocks] == [b.conv2.in_channels for b in blocks]
    assert [b.conv1.out_channels + len(rows) for b, rows in zip(blocks, zero_rows, strict=True)] == [
        b.conv2.out_channels for b in blocks
    ]
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), expected(x).numpy(), atol=ATOL)


def _name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


def test_masks_on_every_member_equal_the_masked_model():
    """Masks on the conv rows and the BatchNorm: the shrunk model is the masked model itself."""
    torch.manual_seed(6)
    net = _randomize(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)))
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    prune.ln_structured(net[0], "weight", amount=0.5, n=1, dim=0)
    rows = (net[0].weight_mask.flatten(1).sum(1) != 0).double()
    for name in ("bias",):
        prune.custom_from_mask(net[0], name, rows)
    prune.custom_from_mask(net[1], "weight", rows)
    prune.custom_from_mask(net[1], "bias", rows)
    with torch.no_grad():
        want = net(x)
    prune.shrink(net, x)
    assert (net[0].out_channels, net[1].num_features, net[3].in_channels) == (4, 4, 4)
    with torch.no_grad():
        np.testing.assert_allclose(net(x).numpy(), want.numpy(), atol=ATOL)


def test_partial_mask_is_refused_naming_the_group():
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    prune.l1_unstructured(net[0], "weight", amount=0.3)
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match=r"^group '0': the mask of 0.weight zeroes part of channel \d+") as err:
        prune.shrink(net, torch.randn(1, 3, 8, 8))
    assert "\n" not in str(err.value)
    assert prune.is_pruned(net) and all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


# --------------------------------------------------------------------------------------
# amounts, scores, refusals
# --------------------------------------------------------------------------------------


def test_an_amount_on_a_pruned_model_scores_the_masked_weights():
    torch.manual_seed(9)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    w = net[0].weight.detach().clone()
    prune.custom_from_mask(net[0], "weight", torch.tensor([0, 1, 1, 1, 1, 1.0])[:, None].expand(6, 4))
    prune.l1_unstructured(net[2], "weight", amount=2)  # baked, not refused: an amount decides
    masked2 = net[2].weight.detach().clone()
    prune.shrink(net, torch.randn(3, 4), 1, importance_scores={"2.weight": torch.ones(2, 6)})
    assert not prune.is_pruned(net) and sorted(net.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    kept = [i for i in range(6) if i != 0]  # row 0 is masked: the lowest norm
    assert torch.equal(net[0].weight, w[kept]) and torch.equal(net[2].weight, masked2[:, kept])


def test_importance_scores_choose_the_channels():
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    scores = {"0.weight": torch.arange(24.0).reshape(6, 4).flip(0), "2.weight": torch.zeros(2, 6)}
    w = net[0].weight.detach().clone()
    prune.shrink(net, torch.randn(3, 4), 0.5, importance_scores=scores)
    assert torch.equal(net[0].weight, w[:3])


def test_amounts_by_group_name():
    net = nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 2))
    prune.shrink(net, torch.randn(3, 4), {"0": 3})
    assert (net[0].out_features, net[2].in_features, net[2].out_features) == (7, 7, 6)
    with pytest.raises(ValueError, match=r"^amount names '4', which is not a group that can shrink$"):
        prune.shrink(net, torch.randn(3, 4), {"4": 1})


def test_random_structured_is_seeded():
    nets = [nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Linear(10, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    for net in nets:
        prune.shrink(net, torch.randn(3, 4), 0.4, "random_structured", seed=7)
    assert torch.equal(nets[0][0].weight, nets[1][0].weight) and nets[0][0].out_features == 6


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "pattern"),
    [
        (("net", "x"), {}, ValueError, r"needs an amount, or pruning masks"),
        (("net", "x", 1.0), {}, ValueError, r"every one of its 8 channels would go"),
        (("net", "x", 1.5), {}, ValueError, r"amount"),
        (("net", "x", "half"), {}, TypeError, r"amount"),
        (("net", "x", 0.5, "l1_unstructured"), {}, TypeError, r"does not remove whole channels"),
        (("net", "x", 0.5, "nope"), {}, ValueError, r"unknown method 'nope'"),
        (("net", "x", 0.5, "obs_structured"), {}, TypeError, r"scores units on calibration data .*prune\.shrink_llm"),
        (("net", [1, 2], 0.5), {}, TypeError, r"example_inputs must be a tensor"),
        (("net", "wrong", 0.5), {}, RuntimeError, r"does not run on example_inputs"),
        (("notmodule", "x", 0.5), {}, TypeError, r"model must be a torch.nn.Module"),
        (("net", "x", 0.5), {"importance_scores": {"0.weight": torch.ones(2)}}, ValueError, r"has shape \(2,\)"),
    ],
)
def test_refusals_are_one_line_and_change_nothing(args, kwargs, error, pattern):
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    before = copy.deepcopy(net.state_dict())
    given = {"net": net, "x": torch.randn(1, 3, 8, 8), "wrong": torch.randn(1, 5, 8, 8), "notmodule": object()}
    with pytest.raises(error, match=pattern) as err:
        prune.shrink(*[given.get(a, a) if isinstance(a, str) else a for a in args], **kwargs)
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert net[0].out_channels == 8


def test_untraceable_model_is_one_line():
    with pytest.raises(RuntimeError, match=r"^torch.fx cannot trace Gate: ") as err:
        prune.shrink(Gate(3), torch.randn(1, 3, 2, 2), 0.5)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_an_untraceable_transformers_model_is_pointed_to_shrink_llm():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = transformers.BertModel(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"^torch.fx cannot trace BertModel: .*prune\.shrink_llm\(model") as err:
        prune.shrink(model, torch.randint(0, 50, (1, 8)), 0.5)
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError) as err:  # a plain module: no such hint
        prune.shrink(Gate(3), torch.randn(1, 3, 2, 2), 0.5)
    assert "shrink_llm" not in str(err.value)


def test_training_mode_and_buffers_untouched_by_tracing():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1)).train()
    stats = net[1].running_mean.clone()
    prune.channel_groups(net, torch.randn(2, 3, 4, 4))
    assert net.training and net[1].training and torch.equal(net[1].running_mean, stats)


def test_tied_producers_share_one_group():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.out = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.conv(torch.relu(self.conv(x))))

    groups = prune.channel_groups(Twice(), torch.randn(1, 4, 3, 3))
    assert not groups[0].shrinkable  # its input is the model's input, its output feeds itself


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["resnet18", "vit"])
def test_torch_export_of_the_shrunk_model(layout):
    torch.manual_seed(7)
    model = _randomize({"resnet18": lambda: L.resnet18(10), "mobilenet_v3_small": lambda: L.mobilenet_v3_small(10),
                        "vit": L.vit}[layout]()).float()  # fmt: skip
    x = torch.randn(2, 3, 32, 32)
    prune.shrink(model, x, 0.5)
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(exported.module()(x).numpy(), model(x).numpy(), atol=1e-5)
