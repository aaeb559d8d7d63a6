"""Shrinking ONNX models: groups read from torch.onnx exports, outputs checked with onnxruntime.

Each model is shrunk, checked (``full_check=True``), run, and compared with the dense
model in which the dropped channels are zeroed where the closing layers read them (the
input channels of the consumers): the same function. Initializers outside the groups
must be bit-identical, members equal the original sliced with the kept indices.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from onnx import numpy_helper  # noqa: E402

from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx  # noqa: E402


def export(module: torch.nn.Module, x: torch.Tensor, dynamo: bool = False, opset: int | None = None) -> onnx.ModelProto:
    torch.manual_seed(0)
    module.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (x,), f, dynamo=dynamo, input_names=["x"], output_names=["y"], opset_version=opset
        )
    return onnx.load_from_string(f.getvalue())


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def consumer_members(model: onnx.ModelProto) -> set[tuple[str, int]]:
    """(initializer, axis) pairs read as input channels by a layer: MatMul B axis 0,
    Gemm B axis 0 (1 with transB), Conv W axis 1 with group=1."""
    out = set()
    for n in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "MatMul":
            out.add((n.input[1], 0))
        elif n.op_type == "Gemm":
            out.add((n.input[1], 1 if attrs.get("transB", 0) else 0))
        elif n.op_type == "Conv" and attrs.get("group", 1) == 1:
            out.add((n.input[1], 1))
    return out


def check(model: onnx.ModelProto, x: np.ndarray, amount, expected_drop: int, **kw):
    """Shrink, and check function, untouched tensors, members and parameter counts."""
    before = model.SerializeToString()
    small, report = shrink_onnx(model, amount, **kw)
    assert model.SerializeToString() == before  # the input is not modified
    onnx.checker.check_model(small, full_check=True)
    onnx.shape_inference.infer_shapes(small, check_type=True, strict_mode=True)

    dense = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers = consumer_members(model)
    zeroed = onnx.ModelProto()
    zeroed.CopyFrom(model)
    zero = {}
    slices: dict[str, np.ndarray] = {}
    for g in report.groups.groups:
        kept = np.array(report.kept[g.group.name])
        dropped = np.setdiff1d(np.arange(g.group.channels), kept)
        drop = amount if isinstance(amount, int) else round(amount * g.group.channels)
        assert kept.size == g.group.channels - drop
        for m in g.group.members:
            slices[m.key] = np.take(slices.get(m.key, dense[m.key]), kept, axis=m.axis)
            if (m.key, m.axis) in consumers:
                a = zero.get(m.key, dense[m.key].copy())
                idx = [slice(None)] * a.ndim
                idx[m.axis] = dropped
                a[tuple(idx)] = 0
                zero[m.key] = a
    assert zero, "no consumer found"
    for t in zeroed.graph.initializer:
        if t.name in zero:
            t.CopyFrom(numpy_helper.from_array(zero[t.name], t.name))

    new = {t.name: t for t in small.graph.initializer}
    assert list(new) == [t.name for t in model.graph.initializer]
    shapes = {
        name: (i, f * len(report.kept[g.group.name])) for g in report.groups.groups for name, i, f in g.shapes
    }
    for t in model.graph.initializer:
        if t.name in shapes:  # a Reshape target: the channel count follows
            i, n = shapes[t.name]
            want = numpy_helper.to_array(t).copy()
            want[i] = n
            np.testing.assert_array_equal(numpy_helper.to_array(new[t.name]), want)
        elif t.name in slices:
            got = numpy_helper.to_array(new[t.name])
            assert got.dtype == slices[t.name].dtype
            np.testing.assert_array_equal(got, slices[t.name])
        else:
            assert new[t.name].SerializeToString() == t.SerializeToString()
    assert [n.op_type for n in small.graph.node] == [n.op_type for n in model.graph.node]

    y_small, y_zero, y_dense = run(small, x), run(zeroed, x), run(model, x)
    np.testing.assert_allclose(y_small, y_zero, rtol=1e-5, atol=1e-5)
    assert not np.allclose(y_small, y_dense, atol=1e-4)  # channels really went
    n_before = sum(a.size for a in dense.values())
    assert report.params_before == n_before
    assert report.params_before - report.params_after == expected_drop
    assert sum(numpy_helper.to_array(t).size for t in small.graph.initializer) == report.params_after
    return small, report


class Block(torch.nn.Module):
    def __init__(self, d: int = 16, h: int = 64):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.l2(torch.relu(self.l1(x)))


@pytest.mark.parametrize(
    "dynamo", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["torchscript", "dynamo"]
)  # the dynamo exporter takes about 2 s
def test_residual_ffn_stack(dynamo):
    torch.manual_seed(0)
    model = export(torch.nn.Sequential(Block(), Block()), torch.randn(2, 5, 16), dynamo=dynamo)
    found = onnx_groups(model)
    assert [g.group.channels for g in found.groups] == [64, 64]
    assert [m.weight for m in found.groups[0].group.members] == [True, False, True]
    assert len(found.left) == 2
    assert all(lf.reason.startswith("residual Add") and lf.channels == 16 for lf in found.left)
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    # each block loses 32 hidden channels: 16 (W1 column) + 1 (bias) + 16 (W2 row)
    small, report = check(model, x, 0.5, expected_drop=2 * 32 * 33)
    # kept channels = the 32 of largest L2 norm over W1 columns and W2 rows together
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    g = found.groups[0].group
    w1, w2 = init[g.members[0].key], init[g.members[2].key]
    norms = np.linalg.norm(np.concatenate([w1.T, w2], axis=1).astype(np.float64), axis=1)
    np.testing.assert_array_equal(report.kept[g.name], np.sort(np.argsort(norms, kind="stable")[32:]))
    assert run(small, x).shape == (2, 5, 16)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3)
        self.scale = torch.nn.Parameter(torch.rand(1, 8, 1, 1) + 0.5)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)) * self.scale)


def test_conv_relu_conv_with_per_channel_constant():
    model = export(ConvNet(), torch.randn(2, 3, 9, 9))
    found = onnx_groups(model)
    (g,) = found.groups
    assert [(m.axis, m.weight) for m in g.group.members] == [(0, True), (0, False), (1, False), (1, True)]
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    # 3 of 8 channels: c1 W 27 + bias 1 + scale 1 + c2 W 4*9 = 65 each
    check(model, x, 3, expected_drop=3 * 65)


class DepthwiseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = torch.nn.Conv2d(8, 6, 1)
        self.grouped = torch.nn.Conv2d(6, 6, 3, groups=2)

    def forward(self, x):
        h = self.bn(torch.relu(self.c1(x)))
        return self.grouped(self.c2(torch.relu(self.dw(h))))


def test_depthwise_and_grouped_conv():
    net = DepthwiseNet()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.weight.uniform_(0.5, 2)
    model = export(net, torch.randn(2, 3, 8, 8))
    found = onnx_groups(model)
    g, c2 = found.groups
    # c1 W, c1 B, BN scale/B/mean/var, depthwise W axis 0 (scores), its B, c2 W axis 1
    assert [(m.axis, m.weight) for m in g.group.members] == [
        (0, True), (0, False), (0, False), (0, False), (0, False), (0, False), (0, True), (0, False), (1, True)
    ]  # fmt: skip
    # the grouped conv reads c2's channels block by block (test_onnx_shrink_grouped.py checks it)
    assert (c2.group.channels, c2.segments, c2.consumers) == (6, 2, ("Conv '/grouped/Conv'",))
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    small, report = shrink_onnx(model, 0.5)
    # 4 of 8: c1 W 3 + B 1 + BN 4 + dw W 9 + dw B 1 = 18 each, c2 W [6, 8] -> [2, 4],
    # c2 B 4, grouped W [6, 3, 3, 3] -> [6, 1, 3, 3] (2 of each block's 3 channels: 0.5 of 3, rounded to even)
    assert report.params_before - report.params_after == 4 * 18 + 40 + 4 + 108
    (dw,) = [n for n in small.graph.node if n.op_type == "Conv" and n.input[1] == g.group.members[6].key]
    assert {a.name: a.i for a in dw.attribute}["group"] == 4
    dense = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zeroed = onnx.ModelProto()
    zeroed.CopyFrom(model)
    w2, wg = dense["c2.weight"].copy(), dense["grouped.weight"].copy()
    w2[:, np.setdiff1d(np.arange(8), report.kept[g.group.name])] = 0
    for c in np.setdiff1d(np.arange(6), report.kept[c2.group.name]):
        wg[3 * (c // 3):3 * (c // 3) + 3, c % 3] = 0
    for t in zeroed.graph.initializer:
        if t.name in ("c2.weight", "grouped.weight"):
            t.CopyFrom(numpy_helper.from_array(w2 if t.name == "c2.weight" else wg, t.name))
    np.testing.assert_allclose(run(small, x), run(zeroed, x), rtol=1e-5, atol=1e-5)


class ConcatNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = torch.nn.Linear(8, 12), torch.nn.Linear(12, 6), torch.nn.Linear(8, 5)
        self.w4 = torch.nn.Linear(11, 3)

    def forward(self, x):
        a = self.w2(torch.nn.functional.gelu(self.w1(x)))
        return self.w4(torch.cat([a, self.w3(x)], dim=-1))


@pytest.mark.parametrize("opset", [17, 20])
def test_concat_offsets_and_gelu_chain(opset):
    from test_onnx_shrink_residual import expected_after, zero_inputs

    model = export(ConcatNet(), torch.randn(4, 8), opset=opset)
    ops = [n.op_type for n in model.graph.node]
    found = onnx_groups(model)
    g, a, b = found.groups
    assert [g.group.channels, a.group.channels, b.group.channels] == [12, 6, 5]
    if opset == 17:  # GELU exported as x * 0.5 * (1 + erf(x / sqrt(2))): Div, Erf, Add, Mul, Mul
        assert "Erf" in ops and "Gelu" not in ops
        assert len(g.values) == 6
    else:
        assert "Gelu" in ops
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    # w4 [3, 11] (Gemm, transB=1) reads w2's 6 channels in columns 0-5, w3's 5 in columns 6-10
    (w4,) = [t.name for t in model.graph.initializer if t.name.startswith("w4.weight")]
    views = {**dict(a.views), **dict(b.views)}
    ranges = sorted((v.start, v.axis) for v in views.values() if v.source == w4)
    assert ranges == [(0, 1), (6, 1)]
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    small, report = shrink_onnx(model, 0.25)
    onnx.checker.check_model(small, full_check=True)
    # round(0.25 * 12) = 3, round(0.25 * 6) = 2, round(0.25 * 5) = 1 channels go
    kept = [np.array(report.kept[h.group.name]) for h in (g, a, b)]
    assert [k.size for k in kept] == [9, 4, 4]
    dropped = [np.setdiff1d(np.arange(h.group.channels), k) for h, k in zip((g, a, b), kept, strict=True)]
    readers = {"/w2/Gemm": dropped[0], "/w4/Gemm": np.concatenate([dropped[1], 6 + dropped[2]])}
    np.testing.assert_allclose(run(small, x), run(zero_inputs(model, readers), x), rtol=1e-5, atol=1e-5)
    assert not np.allclose(run(small, x), run(model, x), atol=1e-4)
    new = {t.name: numpy_helper.to_array(t) for t in small.graph.initializer}
    dense = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    want = np.concatenate([dense[w4][:, :6][:, kept[1]], dense[w4][:, 6:][:, kept[2]]], axis=1)
    np.testing.assert_array_equal(new[w4], want)
    assert report.params_after == expected_after(model, report)


def test_random_structured_seeded_per_group():
    model = export(torch.nn.Sequential(Block(), Block()), torch.randn(2, 5, 16))
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    _, r1 = check(model, x, 0.5, expected_drop=2 * 32 * 33, method="random_structured", seed=4)
    _, r2 = shrink_onnx(model, 0.5, "random_structured", seed=4)
    assert r1.kept == r2.kept
    a, b = r1.kept.values()
    assert a != b  # each group draws from its own stream


def test_bad_input():
    model = export(torch.nn.Sequential(Block()), torch.randn(2, 16))
    before = model.SerializeToString()
    with pytest.raises(ValueError, match="every channel"):
        shrink_onnx(model, 1.0)
    with pytest.raises(ValueError, match="amount"):
        shrink_onnx(model, 1.5)
    with pytest.raises(ValueError, match="smaller than"):
        shrink_onnx(model, 65)
    with pytest.raises(TypeError, match="whole channels"):
        shrink_onnx(model, 0.5, "l1_unstructured")
    with pytest.raises(ValueError, match="unknown method"):
        shrink_onnx(model, 0.5, "nope")
    with pytest.raises(TypeError, match="ModelProto"):
        shrink_onnx(model.SerializeToString(), 0.5)
    assert model.SerializeToString() == before


class PoolNet(torch.nn.Module):
    """Conv -> ReLU -> Conv -> ReLU -> global average pool -> flatten -> Linear, as CNN classifiers end."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 12, 3)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        h = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(torch.flatten(self.pool(h), 1))


def test_global_pool_flatten_into_the_classifier():
    model = export(PoolNet(), torch.randn(2, 3, 9, 9))
    ops = [n.op_type for n in model.graph.node]
    assert "GlobalAveragePool" in ops and "Flatten" in ops
    found = onnx_groups(model)
    assert [g.group.channels for g in found.groups] == [8, 12]
    (fc,) = [t.name for t in model.graph.initializer if t.name.startswith("fc.weight")]
    last = found.groups[1].group
    # c2's output channels: its W rows and bias, and the classifier's input features (Gemm transB=1: axis 1)
    assert [(m.axis, m.weight) for m in last.members] == [(0, True), (0, False), (1, True)]
    assert last.members[2].key == fc
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    x = np.random.default_rng(2).standard_normal((2, 3, 9, 9)).astype(np.float32)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # c1 W 8x3x3x3 + b 8 -> 4x27 + 4; c2 W 12x8x3x3 + b 12 -> 6x4x9 + 6; fc W 5x12 -> 5x6 (b 5 stays)
    before, after = 216 + 8 + 864 + 12 + 60 + 5, 108 + 4 + 216 + 6 + 30 + 5
    small, report = check(model, x, 0.5, expected_drop=before - after)
    w2, wf = init[last.members[0].key], init[fc]
    norms = np.sqrt((w2.reshape(12, -1).astype(np.float64) ** 2).sum(1) + (wf.astype(np.float64) ** 2).sum(0))
    np.testing.assert_array_equal(report.kept[last.name], np.sort(np.argsort(norms, kind="stable")[6:]))
    assert run(small, x).shape == (2, 5)


def test_flatten_without_a_global_pool_is_left():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4 * 3 * 3, 2)

        def forward(self, x):
            return self.fc(torch.flatten(torch.relu(self.c(x)), 1))

    found = onnx_groups(export(Flat(), torch.randn(1, 3, 5, 5)))
    assert found.groups == []
    assert any("mixes the channels with other axes" in lf.reason for lf in found.left)


class MeanPoolNet(torch.nn.Module):
    """Conv -> ReLU -> Conv -> ReLU -> global mean pool (``x.mean((2, 3))``) -> Linear."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 12, 3)
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        h = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(h.mean(dim=(2, 3)))


@pytest.mark.parametrize(
    "net, dynamo, after_pool",
    [(MeanPoolNet, True, "Gemm"), (MeanPoolNet, False, "Gemm"), (PoolNet, True, "Reshape")],
    ids=["mean-dynamo", "mean-torchscript", "adaptive-pool-dynamo"],
)
@pytest.mark.slow
def test_reduce_mean_into_the_classifier(net, dynamo, after_pool):
    model = export(net(), torch.randn(2, 3, 9, 9), dynamo=dynamo)
    ops = [n.op_type for n in model.graph.node]
    assert ops[ops.index("ReduceMean") + 1] == after_pool
    found = onnx_groups(model)
    # every conv is shrunk, the last through ReduceMean (and Reshape) into the classifier
    assert [g.group.channels for g in found.groups] == [8, 12]
    assert [g.group.name for g in found.groups] == [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    (fc,) = [t.name for t in model.graph.initializer if t.name.startswith("fc.weight")]
    last = found.groups[1].group
    assert [(m.key, m.axis, m.weight) for m in last.members][2] == (fc, 1, True)
    if after_pool == "Reshape":  # [2, 12, 1, 1] -> [2, 12]: the target shape follows the channels
        (shape,) = found.groups[1].shapes
        assert shape[1] == 1
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 9)).astype(np.float32)
    before, after = 216 + 8 + 864 + 12 + 60 + 5, 108 + 4 + 216 + 6 + 30 + 5
    small, report = check(model, x, 0.5, expected_drop=before - after)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w2, wf = init[last.members[0].key], init[fc]
    norms = np.sqrt((w2.reshape(12, -1).astype(np.float64) ** 2).sum(1) + (wf.astype(np.float64) ** 2).sum(0))
    np.testing.assert_array_equal(report.kept[last.name], np.sort(np.argsort(norms, kind="stable")[6:]))
    assert run(small, x).shape == (2, 5)


def test_reduce_over_the_channel_axis_is_left():
    class ChannelMean(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.c(x)).mean(dim=(1, 2)))

    found = onnx_groups(export(ChannelMean(), torch.randn(1, 3, 5, 5), dynamo=True))
    assert found.groups == []
    assert found.left[0].reason == "ReduceMean 'node_mean' reduces the channel axis"


def test_every_op_type_has_one_handler():
    """The op table is built from disjoint sets: no op type's handler silently replaces another's."""
    from arrayprune.adapters.roles import onnx_group_trace as og

    named = {"Reshape", "Flatten", "Transpose", "MatMul", "Gemm", "Conv", "Concat", "Shape", "Size"}
    named |= {"GroupNormalization"}
    families = [og._UNARY, og._SOFTMAX, og._BINARY, og._SELECT, og._GLOBAL_POOLS, og._POOLS, og._RESIZE, og._REDUCE]
    families += [og._CHANNEL_NORMS, named]
    assert sum(len(f) for f in families) == len(og._STEPS) == len(set().union(*families))
    assert og._STEPS["Add"] == (og._Trace.elementwise, False) and og._STEPS["Relu"] == (og._Trace.unary, True)
    back = [og._UNARY, og._SOFTMAX, og._BINARY, og._SELECT, og._POOLS, og._CHANNEL_NORMS]
    back += [{"Conv", "Transpose", "Reshape", "Concat", "MatMul", "GroupNormalization"}]
    assert sum(len(f) for f in back) == len(og._BACK) == len(set().union(*back))
