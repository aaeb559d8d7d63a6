"""Shrinking ONNX exports through residual connections, pools and shared initializers.

Models written here with torchvision's layouts and names (``tests/vision_layouts.py``)
and a transformers BERT with random weights, exported by ``torch.onnx.export``. Each
shrunk model is checked by onnx (``full_check``) and run by onnxruntime against a
reference built here, independently of the library's own: the dense model with the
dropped channels zeroed in the input channels of every layer that reads them (found by
node name), computed through ``numpy``.
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
from vision_layouts import mobilenet_v3_small, resnet18  # noqa: E402

from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx, zeroed_onnx  # noqa: E402


def export(module, x, dynamo: bool = False, names=("x", "y")) -> onnx.ModelProto:
    module.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=dynamo, input_names=[names[0]], output_names=[names[1]])
    return onnx.load_from_string(f.getvalue())


def run(model: onnx.ModelProto, x: np.ndarray, name: str = "x") -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {name: x})[0]


def inits(model) -> dict[str, np.ndarray]:
    """Initializers by name, and ``Identity`` outputs of initializers under their own names."""
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Identity" and n.input[0] in out:
            out[n.output[0]] = out[n.input[0]]
    return out


def weight_of(model, node_name: str) -> str:
    (node,) = [n for n in model.graph.node if n.name == node_name]
    return node.input[1]


def zero_inputs(model, readers: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` in which each named layer (Conv W axis 1, MatMul B axis 0, Gemm B
    axis 1 with transB) reads zeros on the given input channels; shared weights are copied."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    data = inits(model)
    for node in out.graph.node:
        if node.name not in readers:
            continue
        w = data[node.input[1]].copy()
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = 1 if node.op_type == "Conv" or attrs.get("transB", 0) else 0
        index = [slice(None)] * w.ndim
        index[axis] = readers[node.name]
        w[tuple(index)] = 0
        name = node.input[1] + ".zeroed"
        out.graph.initializer.append(numpy_helper.from_array(w, name))
        node.input[1] = name
    return out


def top_by_norm(arrays: list[tuple[np.ndarray, int]], keep: int) -> np.ndarray:
    """The `keep` channels of largest L2 norm over all (array, axis) pairs, float64, ties to the lower index."""
    sq = sum((np.moveaxis(a.astype(np.float64), ax, 0).reshape(a.shape[ax], -1) ** 2).sum(1) for a, ax in arrays)
    order = np.argsort(-np.sqrt(sq), kind="stable")
    return np.sort(order[:keep])


def expected_after(model, report) -> int:
    """Initializer entries once every member lost its dropped channels (a tensor in two
    groups loses them on both axes; a private copy is a tensor of its own, but copies of a
    constant-valued source, such as a shared zero bias, that end with one shape are one)."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    views = {k: v for g in report.groups.groups for k, v in g.views}
    for g in report.groups.groups:
        dropped = g.group.channels - len(report.kept[g.group.name])
        for m in g.group.members:
            view = views.get(m.key)
            if view is None:
                shapes[m.key][m.axis] -= dropped
                continue
            name = view.copy or view.source
            shapes.setdefault(name, list(shapes[view.source]))
            shapes[name][view.axis] -= dropped * view.block
    constants = {n.output[0]: onnx.helper.get_attribute_value(n.attribute[0]) for n in model.graph.node
                 if n.op_type == "Constant" and n.attribute[0].name == "value"}  # fmt: skip
    for g in report.groups.groups:
        for name, _, _ in g.shapes:  # a private copy of a shared Reshape target: an initializer of its own
            if name in views:
                source = views[name].source
                shapes[name] = list(shapes[source]) if source in shapes else list(constants[source].dims)
    data, seen = inits(model), set()
    for v in views.values():
        if v.copy is None or v.copy not in shapes or v.copy == v.source or shapes[v.copy] == list(data[v.source].shape):
            continue
        source = data[v.source]
        if source.size and np.all(source == source.reshape(-1)[0]):
            key = (source.dtype.str, source.reshape(-1)[0].item(), tuple(shapes[v.copy]))
            if key in seen:
                shapes.pop(v.copy)
            seen.add(key)
    for name in report.removed:
        shapes.pop(name, None)
    return sum(int(np.prod(s)) for s in shapes.values())


# ---------------------------------------------------------------- resnet18


RESNET_TRUNKS = {  # trunk group -> (producers, readers), by torch.onnx's node names (legacy exporter)
    "layer1": (
        ["/conv1/Conv", "/layer1/layer1.0/conv2/Conv", "/layer1/layer1.1/conv2/Conv"],
        ["/layer1/layer1.0/conv1/Conv", "/layer1/layer1.1/conv1/Conv", "/layer2/layer2.0/conv1/Conv",
         "/layer2/layer2.0/downsample/downsample.0/Conv"],
    ),
    "layer4": (
        ["/layer4/layer4.0/downsample/downsample.0/Conv", "/layer4/layer4.0/conv2/Conv", "/layer4/layer4.1/conv2/Conv"],
        ["/layer4/layer4.1/conv1/Conv", "/fc/Gemm"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return export(resnet18(width=8, num_classes=10), torch.randn(2, 3, 32, 32))


@pytest.mark.slow
def test_resnet18_trunks_are_one_group_each(resnet):
    found = onnx_groups(resnet)
    # 4 trunks (one per stage) + 8 inner groups (each block's conv1 -> conv2); only the classifier is left
    assert len(found.groups) == 12
    assert [lf.name for lf in found.left] == ["/fc/Gemm"]
    trunks = [g for g in found.groups if len(g.producers) > 1]
    assert [len(g.producers) for g in trunks] == [3, 3, 3, 3]
    assert [g.group.channels for g in trunks] == [8, 16, 32, 64]
    for g, (producers, readers) in zip([trunks[0], trunks[3]], RESNET_TRUNKS.values(), strict=True):
        want = {(weight_of(resnet, p), 0) for p in producers}
        want |= {(weight_of(resnet, r), 1) for r in readers}
        assert {(m.key, m.axis) for m in g.group.members if m.weight} == want
        assert sorted(g.producers) == sorted(f"Conv {p!r}" for p in producers)

    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    small, report = shrink_onnx(resnet, 0.5)
    onnx.checker.check_model(small, full_check=True)
    data = inits(resnet)
    readers: dict[str, np.ndarray] = {}
    for g in found.groups:
        kept = np.array(report.kept[g.group.name])
        want = top_by_norm([(data[m.key], m.axis) for m in g.group.members if m.weight], g.group.channels // 2)
        np.testing.assert_array_equal(kept, want)
        dropped = np.setdiff1d(np.arange(g.group.channels), kept)
        for n in resnet.graph.node:
            if n.op_type in ("Conv", "Gemm") and f"{n.op_type} {n.name!r}" in g.consumers:
                readers[n.name] = dropped
    assert len(readers) == 19 + 1  # the 19 convs after the stem read a shrunk group, and fc
    np.testing.assert_allclose(run(small, x), run(zero_inputs(resnet, readers), x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(small, x), run(zeroed_onnx(resnet, report), x), rtol=1e-4, atol=1e-5)
    assert report.params_after == expected_after(resnet, report)
    # every conv is halved: only the stem's input channels, the classifier's outputs and its bias stay whole
    assert report.params_after < 0.27 * report.params_before


@pytest.mark.slow
def test_resnet18_dry_run_lists_the_trunks(resnet, tmp_path, capsys):
    src = tmp_path / "resnet18.onnx"
    onnx.save(resnet, src)
    capsys.readouterr()
    code = main(["prune", str(src), "--method", "ln_structured", "--amount", "0.5", "--shrink", "--dry-run"])
    printed, err = capsys.readouterr()
    assert (code, err) == (0, "")
    lines = printed.splitlines()
    trunk = [x for x in lines if x.startswith("group /conv1/Conv ")]
    assert trunk == [x for x in lines if "(8 -> 4 channels, Conv '/conv1/Conv' + 2 more)" in x]
    assert len([x for x in lines if x.startswith("group ") and " + 2 more)" in x]) == 4
    assert lines[-1] == "left /fc/Gemm (10 channels, Gemm '/fc/Gemm'): 'y' is a graph output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resnet18.onnx"]


@pytest.mark.slow
def test_resnet18_dynamo_export_shrinks_through_batch_norm(resnet):
    torch.manual_seed(0)
    model = export(resnet18(width=8, num_classes=10), torch.randn(2, 3, 32, 32), dynamo=True)
    ops = {n.op_type for n in model.graph.node}
    assert "BatchNormalization" in ops or "MaxPool" in ops
    found = onnx_groups(model)
    assert len(found.groups) == 12 and len(found.left) == 1
    small, report = shrink_onnx(model, 3)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run(small, x), run(zeroed_onnx(model, report), x), rtol=1e-4, atol=1e-5)
    assert report.params_after == expected_after(model, report)


# ---------------------------------------------------------------- a CNN with max-pooling


class PoolCNN(torch.nn.Module):
    """Four convolutions with max-pooling in between, a spatial mean, a two-layer classifier."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.c3, self.c4 = nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x):
        f = torch.nn.functional
        x = f.max_pool2d(torch.relu(self.c1(x)), 2)
        x = f.max_pool2d(torch.relu(self.c2(x)), 2)
        x = f.avg_pool2d(torch.relu(self.c3(x)), 2)
        x = torch.relu(self.c4(x)).mean((2, 3))
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.slow
def test_max_pool_cnn_shrinks_every_conv(dynamo):
    torch.manual_seed(0)
    model = export(PoolCNN(), torch.randn(2, 3, 16, 16), dynamo=dynamo)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MaxPool") == 2 and "AveragePool" in ops and "ReduceMean" in ops
    found = onnx_groups(model)
    assert [g.group.channels for g in found.groups] == [16, 32, 32, 64, 32]
    assert len(found.left) == 1 and found.left[0].reason == "'y' is a graph output"
    small, report = shrink_onnx(model, 0.5)
    onnx.checker.check_model(small, full_check=True)
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    names = [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    readers = {}
    for g, reader in zip(found.groups, names[1:], strict=True):
        readers[reader] = np.setdiff1d(np.arange(g.group.channels), report.kept[g.group.name])
    np.testing.assert_allclose(run(small, x), run(zero_inputs(model, readers), x), rtol=1e-4, atol=1e-5)
    # conv k: 9 * in * out + out; halved everywhere but the input's 3 channels and the 10 outputs
    before = 9 * 3 * 16 + 16 + 9 * 16 * 32 + 32 + 9 * 32 * 32 + 32 + 9 * 32 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10
    after = 9 * 3 * 8 + 8 + 9 * 8 * 16 + 16 + 9 * 16 * 16 + 16 + 9 * 16 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    floats = [t for t in small.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert sum(int(np.prod(t.dims)) for t in floats) == after
    assert report.params_before - report.params_after == before - after


# ---------------------------------------------------------------- mobilenet_v3_small


@pytest.mark.slow
def test_mobilenet_v3_small_squeeze_excite_and_depthwise():
    torch.manual_seed(0)
    model = export(mobilenet_v3_small(width=0.5, num_classes=10, last_channel=32), torch.randn(2, 3, 32, 32))
    found = onnx_groups(model)
    # every expansion joins its depthwise conv and its squeeze-excite's fc2 (the scale it multiplies by)
    se = [g for g in found.groups if any("fc2" in p for p in g.producers)]
    assert len(se) == 9 and all(len(g.producers) == 2 and g.depthwise for g in se)
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    small, report = shrink_onnx(model, 0.25)
    onnx.checker.check_model(small, full_check=True)
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run(small, x), run(zeroed_onnx(model, report), x), rtol=1e-4, atol=1e-5)
    assert not np.allclose(run(small, x), run(model, x), atol=1e-4)
    assert report.params_after == expected_after(model, report)


# ---------------------------------------------------------------- BERT: shared zero biases


class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def bert(layers: int = 2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16,
    )  # fmt: skip
    return LastHidden(transformers.BertModel(config, add_pooling_layer=False)), torch.randint(0, 60, (2, 7))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.slow
def test_bert_with_shared_zero_biases_shrinks_its_ffns(dynamo):
    module, ids = bert()
    model = export(module, ids, dynamo=dynamo)
    # freshly initialized: every bias is zero, and the exporter keeps one tensor per shape for them
    shared = [t.name for t in model.graph.initializer if t.dims == [64]]
    assert len(shared) == 1
    found = onnx_groups(model)
    assert [g.group.channels for g in found.groups] == [64, 64]
    for g in found.groups:
        (bias,) = [m for m in g.group.members if not m.weight]
        assert dict(g.views)[bias.key].source == shared[0] and dict(g.views)[bias.key].rewire
    small, report = shrink_onnx(model, 0.5)
    onnx.checker.check_model(small, full_check=True)
    assert shared[0] in report.removed  # both layers read their own copies now
    # the two layers' copies, both 32 zeros, are one initializer again
    assert [t.dims for t in small.graph.initializer if t.name.startswith(shared[0])] == [[32]]
    outputs = [n.name for n in model.graph.node if n.op_type == "MatMul" and weight_of(model, n.name) in
               {m.key for g in found.groups for m in g.group.members if m.axis == 0 and m.weight}]  # fmt: skip
    readers = {
        name: np.setdiff1d(np.arange(64), report.kept[g.group.name])
        for name, g in zip(outputs, found.groups, strict=True)
    }
    x = ids.numpy()
    np.testing.assert_allclose(run(small, x), run(zero_inputs(model, readers), x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        dense = module(ids).numpy()
    np.testing.assert_allclose(run(model, x), dense, rtol=1e-4, atol=1e-5)
    # per layer: 32 of 64 channels, each 32 (W1 column) + 1 (bias copy) + 32 (W2 row); the shared
    # 64-entry bias goes, one 32-entry copy comes (the two layers' copies are equal zeros: one)
    assert report.params_before - report.params_after == 2 * 32 * 65 - 32 * 2 + 64 - 64 + 32


# ---------------------------------------------------------------- a U-Net with Concat skips


class UNet(torch.nn.Module):
    """Two encoder levels, an upsampled decoder level joined to the skip by ``torch.cat``."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.enc1, self.enc2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(24)
        self.dec, self.out = nn.Conv2d(24, 8, 3, padding=1), nn.Conv2d(8, 2, 1)

    def forward(self, x):
        f = torch.nn.functional
        e1 = torch.relu(self.enc1(x))
        e2 = torch.relu(self.enc2(f.max_pool2d(e1, 2)))
        up = f.interpolate(e2, scale_factor=2.0, mode="nearest")
        return self.out(torch.relu(self.dec(self.bn(torch.cat([up, e1], dim=1)))))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.slow
def test_unet_concat_skips(dynamo):
    torch.manual_seed(0)
    net = UNet()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.bias.uniform_(-1, 1)
    model = export(net.eval(), torch.randn(2, 3, 16, 16), dynamo=dynamo)
    found = onnx_groups(model)
    # enc1 (into enc2, and the Concat's channels 16-23), enc2 (the Concat's 0-15), dec; out is a graph output
    assert [g.group.channels for g in found.groups] == [8, 16, 8]
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    starts = {g.group.channels: sorted({v.start for v in dict(g.views).values()}) for g in found.groups[:2]}
    assert starts == {8: [16], 16: [0]}  # the BatchNormalization's 24 statistics and dec's input channels
    small, report = shrink_onnx(model, 0.5)
    onnx.checker.check_model(small, full_check=True)
    d1, d2, d3 = (np.setdiff1d(np.arange(g.group.channels), report.kept[g.group.name]) for g in found.groups)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    readers = {convs[1]: d1, convs[2]: np.concatenate([d2, 16 + d1]), convs[3]: d3}
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    # dropped channels still carry the BatchNorm shift into dec: zeroing dec's input columns removes it
    np.testing.assert_allclose(run(small, x), run(zero_inputs(model, readers), x), rtol=1e-4, atol=1e-5)
    assert report.params_after == expected_after(model, report)
    (bn,) = [n for n in small.graph.node if n.op_type == "BatchNormalization"] or [None]
    if bn is not None:
        assert [int(np.prod(t.dims)) for t in small.graph.initializer if t.name == bn.input[1]] == [12]
