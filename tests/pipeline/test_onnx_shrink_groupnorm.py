"""GroupNorm in ONNX exports loses whole groups (``torch.onnx.export``'s ``Reshape`` to
``[N, G, -1]``, ``InstanceNormalization``, ``Reshape`` back; legacy and dynamo).

A channel of such a group is a norm group: the producer's rows, the affine ``Mul``/``Add``
and the next layer's input channels lose ``C/G`` consecutive channels at a time, the
``InstanceNormalization`` scale and bias one entry, the first ``Reshape``'s group count
follows. The reference is the torch module with the dropped groups' input channels of the
next convolution zeroed; the kept groups are a NumPy top-by-L2-norm over the producer's
rows and the consumer's columns of each group.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from test_onnx_shrink_residual import export, run  # noqa: E402
from torch import nn  # noqa: E402

from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx, zeroed_onnx  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.g1 = nn.Conv2d(3, 8, 3), nn.GroupNorm(4, 8)
        self.c2, self.g2 = nn.Conv2d(8, 6, 3, padding=1), nn.GroupNorm(3, 6)
        self.c3 = nn.Conv2d(6, 5, 1)
        self.pool = nn.MaxPool2d(2)
        with torch.no_grad():  # affine parameters away from their init, so that they count
            for g in (self.g1, self.g2):
                g.weight.normal_()
                g.bias.normal_()

    def forward(self, x):
        x = torch.relu(self.g1(self.c1(x)))
        x = self.pool(torch.relu(self.g2(self.c2(x))))
        return self.c3(x)


def kept_groups(producer: nn.Conv2d, consumer: nn.Conv2d, groups: int, keep: int) -> np.ndarray:
    w, v = producer.weight.detach().double().numpy(), consumer.weight.detach().double().numpy()
    per = w.shape[0] // groups
    norms = [np.sqrt((w[g * per : (g + 1) * per] ** 2).sum() + (v[:, g * per : (g + 1) * per] ** 2).sum())
             for g in range(groups)]  # fmt: skip
    return np.sort(np.argsort(-np.asarray(norms), kind="stable")[:keep])


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_group_norm_loses_whole_groups(dynamo):
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 10, 10)
    dense = export(net, x, dynamo=dynamo)
    found = onnx_groups(dense)
    assert [(g.group.channels, g.per) for g in found.groups] == [(4, 2), (3, 2)]
    assert "4 -> 2 GroupNorm groups of 2 channels" in found.describe(0.5)
    small, report = shrink_onnx(dense, 0.5)
    onnx.checker.check_model(small, full_check=True)
    want = [kept_groups(net.c1, net.c2, 4, 2), kept_groups(net.c2, net.c3, 3, 1)]
    assert [report.kept[g.group.name] for g in found.groups] == [w.tolist() for w in want]
    with torch.no_grad():
        saved = [net.c2.weight.clone(), net.c3.weight.clone()]
        for conv, keep, groups in ((net.c2, want[0], 4), (net.c3, want[1], 3)):
            per = conv.weight.shape[1] // groups
            for g in sorted(set(range(groups)) - set(keep.tolist())):
                conv.weight[:, g * per : (g + 1) * per] = 0
        expected = net(x).numpy()
        net.c2.weight.copy_(saved[0])
        net.c3.weight.copy_(saved[1])
        assert not np.allclose(expected, net(x).numpy(), atol=1e-3)
    got = run(small, x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(zeroed_onnx(dense, report), x.numpy()), got, rtol=1e-4, atol=1e-5)
    shapes = {t.name: list(t.dims) for t in small.graph.initializer}
    assert shapes["c1.weight"] == [4, 3, 3, 3] and shapes["c2.weight"] == [2, 4, 3, 3]
    assert shapes["c3.weight"] == [5, 2, 1, 1]
    norms = [n for n in small.graph.node if n.op_type == "InstanceNormalization"]
    scales = [run_const(small, n.input[1]) for n in norms]
    assert [s.shape for s in scales] == [(2,), (1,)]


def run_const(model, name: str) -> np.ndarray:
    for t in model.graph.initializer:
        if t.name == name:
            return onnx.numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            return onnx.numpy_helper.to_array(n.attribute[0].t)
    raise KeyError(name)


def _gn_graph(opset: int, seed: int = 0):
    """``Y = conv2(relu(GroupNormalization(conv1(X), 4 groups)))`` with 1x1 convolutions."""
    rng = np.random.default_rng(seed)
    per_group = opset < 21  # opset 18: one scale per group; 21: one per channel
    n = 4 if per_group else 8
    w = {
        "W1": rng.standard_normal((8, 3, 1, 1)), "B1": rng.standard_normal(8),
        "S": rng.standard_normal(n) + 1, "T": rng.standard_normal(n),
        "W2": rng.standard_normal((5, 8, 1, 1)),
    }  # fmt: skip
    w = {k: v.astype(np.float32) for k, v in w.items()}
    nodes = [
        onnx.helper.make_node("Conv", ["X", "W1", "B1"], ["a"], name="conv1"),
        onnx.helper.make_node("GroupNormalization", ["a", "S", "T"], ["b"], name="gn", num_groups=4, epsilon=1e-5),
        onnx.helper.make_node("Relu", ["b"], ["c"]),
        onnx.helper.make_node("Conv", ["c", "W2"], ["d"], name="conv2"),
        onnx.helper.make_node("Identity", ["d"], ["Y"]),
    ]
    f = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        nodes, "gn", [onnx.helper.make_tensor_value_info("X", f, [2, 3, 4, 4])],
        [onnx.helper.make_tensor_value_info("Y", f, [2, 5, 4, 4])],
        [onnx.numpy_helper.from_array(v, k) for k, v in w.items()],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, w


def _gn_reference(w: dict, x: np.ndarray, dropped=()) -> np.ndarray:
    """float64 NumPy: the graph above with W2's input channels of the `dropped` groups zeroed."""
    a = np.einsum("oc,nchw->nohw", w["W1"][:, :, 0, 0].astype(np.float64), x) + w["B1"][None, :, None, None]
    g = a.reshape(2, 4, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    s, t = (np.repeat(w[k], 2) if w[k].size == 4 else w[k] for k in ("S", "T"))
    b = g.reshape(a.shape) * s[None, :, None, None] + t[None, :, None, None]
    w2 = w["W2"][:, :, 0, 0].astype(np.float64).copy()
    for d in dropped:
        w2[:, 2 * d : 2 * d + 2] = 0
    return np.einsum("oc,nchw->nohw", w2, np.maximum(b, 0))


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_loses_whole_groups(opset):
    model, w = _gn_graph(opset)
    found = onnx_groups(model)
    (g,) = found.groups
    assert (g.group.channels, g.per, g.consumers) == (4, 2, ("Conv 'conv2'",))
    small, report = shrink_onnx(model, 0.5)
    if opset >= 21:  # (the checker refuses opset 18's GroupNormalization as deprecated; onnxruntime runs it)
        onnx.checker.check_model(small, full_check=True)
    w1, w2 = w["W1"].astype(np.float64), w["W2"].astype(np.float64)
    norms = [np.sqrt((w1[2 * k : 2 * k + 2] ** 2).sum() + (w2[:, 2 * k : 2 * k + 2] ** 2).sum()) for k in range(4)]
    kept = np.sort(np.argsort(-np.asarray(norms), kind="stable")[:2])
    assert report.kept[g.group.name] == kept.tolist()
    x = np.random.default_rng(3).standard_normal((2, 3, 4, 4)).astype(np.float32)
    got = run(small, x, "X")
    dropped = sorted(set(range(4)) - set(kept.tolist()))
    np.testing.assert_allclose(got, _gn_reference(w, x.astype(np.float64), dropped), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, _gn_reference(w, x.astype(np.float64)), atol=1e-3)
    (gn,) = [n for n in small.graph.node if n.op_type == "GroupNormalization"]
    assert onnx.helper.get_attribute_value(gn.attribute[0] if gn.attribute[0].name == "num_groups" else
                                           gn.attribute[1]) == 2  # fmt: skip
    data = {t.name: onnx.numpy_helper.to_array(t) for t in small.graph.initializer}
    assert data["S"].shape == ((2,) if opset < 21 else (4,)) and data["W1"].shape == (4, 3, 1, 1)


def test_a_group_norm_of_one_group_is_left():
    model, _ = _gn_graph(18)
    for a in model.graph.node[1].attribute:
        if a.name == "num_groups":
            a.i = 1
    for t in model.graph.initializer:
        if t.name in ("S", "T"):
            t.CopyFrom(onnx.numpy_helper.from_array(np.ones(1, np.float32), t.name))
    found = onnx_groups(model)
    assert found.groups == []
    assert "a GroupNorm of one group" in found.left[0].reason


def test_group_norm_on_the_command_line(tmp_path, capsys):
    from arrayprune.adapters.cli import main

    model, w = _gn_graph(21)
    src, out = tmp_path / "gn.onnx", tmp_path / "small.onnx"
    onnx.save(model, src)
    base = ["prune", str(src), "--method", "ln_structured", "--amount", "0.25", "--shrink"]
    capsys.readouterr()
    assert main([*base, "--dry-run"]) == 0
    printed, err = capsys.readouterr()
    assert err == "" and "group conv1 (4 -> 3 GroupNorm groups of 2 channels, Conv 'conv1'): W1[0/2]" in printed
    assert main([*base, "-o", str(out), "--verify"]) == 0
    printed, err = capsys.readouterr()
    assert err == "" and "group conv1: 4 -> 3 GroupNorm groups kept" in printed.splitlines()
    assert any(line.startswith("verify: output") and line.endswith(": pass") for line in printed.splitlines())


class ResidualNet(nn.Module):
    """A stem and one residual block, GroupNorm after every convolution (4 groups of 2)."""

    def __init__(self):
        super().__init__()
        self.stem, self.g0 = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.c1, self.g1 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.c2, self.g2 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.head = nn.Conv2d(8, 5, 1)
        with torch.no_grad():
            for g in (self.g0, self.g1, self.g2):
                g.weight.normal_()
                g.bias.normal_()

    def forward(self, x):
        x = torch.relu(self.g0(self.stem(x)))
        y = self.g2(self.c2(torch.relu(self.g1(self.c1(x)))))
        return self.head(torch.relu(x + y))


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_group_norm_groups_through_a_residual_block(dynamo):
    torch.manual_seed(2)
    net = ResidualNet().eval()
    x = torch.randn(2, 3, 6, 6)
    dense = export(net, x, dynamo=dynamo)
    found = onnx_groups(dense)
    assert [(g.group.channels, g.per, len(g.producers)) for g in found.groups] == [(4, 2, 2), (4, 2, 1)]
    small, report = shrink_onnx(dense, 0.5)
    onnx.checker.check_model(small, full_check=True)
    trunk, inner = (np.asarray(report.kept[g.group.name]) for g in found.groups)
    # NumPy reference for the trunk: the stem's and c2's rows, c1's and the head's columns, per norm group
    w = {k: getattr(net, k).weight.detach().double().numpy() for k in ("stem", "c1", "c2", "head")}
    rows = [sum((w[k][2 * g : 2 * g + 2] ** 2).sum() for k in ("stem", "c2")) for g in range(4)]
    cols = [sum((w[k][:, 2 * g : 2 * g + 2] ** 2).sum() for k in ("c1", "head")) for g in range(4)]
    norms = np.sqrt(np.asarray(rows) + np.asarray(cols))
    assert trunk.tolist() == np.sort(np.argsort(-norms, kind="stable")[:2]).tolist()
    with torch.no_grad():
        saved = {k: getattr(net, k).weight.clone() for k in ("c1", "c2", "head")}
        for conv, keep in (("c1", trunk), ("head", trunk), ("c2", inner)):
            for g in sorted(set(range(4)) - set(keep.tolist())):
                getattr(net, conv).weight[:, 2 * g : 2 * g + 2] = 0
        expected = net(x).numpy()
        for k, v in saved.items():
            getattr(net, k).weight.copy_(v)
    got = run(small, x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    shapes = {t.name: list(t.dims) for t in small.graph.initializer}
    assert shapes["stem.weight"] == [4, 3, 3, 3] and shapes["c1.weight"] == [4, 4, 3, 3]
    assert shapes["c2.weight"] == [4, 4, 3, 3] and shapes["head.weight"] == [5, 4, 1, 1]


def test_a_global_ranking_is_refused_before_anything_is_done():
    model, _ = _gn_graph(21)
    before = model.SerializeToString()
    with pytest.raises(ValueError, match="^a global ranking cannot weigh GroupNorm groups against single channels"):
        shrink_onnx(model, 0.5, global_=True)
    assert model.SerializeToString() == before


def test_a_group_left_after_its_group_norm_counts_its_channels():
    """The channels reach a graph output after the GroupNorm: left, and described with
    conv1's 8 channels, not the 4 norm groups the second trace counted in."""
    model, _ = _gn_graph(18)
    model.graph.node[4].input[0] = "c"  # Y = relu(GroupNormalization(conv1(X)))
    del model.graph.node[3]
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [2, 8, 4, 4]))
    found = onnx_groups(model)
    assert found.groups == []
    (left,) = found.left
    assert left.channels == 8 and "graph output" in left.reason
