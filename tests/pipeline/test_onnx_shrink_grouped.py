"""Shrinking grouped (non-depthwise) convolutions in ONNX exports.

A small CNN with two grouped convolutions, exported by ``torch.onnx.export``. The
references are independent of the library's ONNX code: the channels each group keeps,
ranked in NumPy (float64) within each convolution group; the dense export with those
channels zeroed in the input channels of every reader (a grouped ``Conv`` W zeroed block
by block), run by onnxruntime; and the torch adapter's own shrink of the same module.
"""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from onnx import numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx, zeroed_onnx  # noqa: E402


def _net() -> nn.Sequential:
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, groups=4), nn.ReLU(),
        nn.Conv2d(16, 8, 1, groups=2), nn.ReLU(),
        nn.Conv2d(8, 5, 1),
    ).eval()  # fmt: skip


def _export(module: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=dynamo, input_names=["x"], output_names=["y"])
    return onnx.load_from_string(f.getvalue())


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _columns(w: np.ndarray, groups: int) -> np.ndarray:
    """``[in, -1]``: every entry of a (grouped) conv weight that reads each input channel."""
    rows, local = w.shape[:2]
    return w.reshape(groups, rows // groups, local, -1).transpose(0, 2, 1, 3).reshape(groups * local, -1)


def _kept(rows: list[np.ndarray], segments: int, drop: int) -> np.ndarray:
    norms = np.linalg.norm(np.concatenate([r.astype(np.float64) for r in rows], axis=1), axis=1)
    width = norms.size // segments
    return np.concatenate([
        np.sort(np.argsort(norms[j * width:(j + 1) * width], kind="stable")[drop // segments:]) + j * width
        for j in range(segments)
    ])  # fmt: skip


def _convs(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.op_type == "Conv"]


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_grouped_convs_shrink_evenly_and_match_the_zeroed_model(dynamo):
    net = _net()
    x = torch.randn(2, 3, 6, 6)
    model = _export(net, x, dynamo)
    found = onnx_groups(model)
    assert [g.segments for g in found.groups] == [4, 4, 2]
    assert [lf.reason for lf in found.left] == ["'y' is a graph output"]
    assert "16 -> 12 channels in 4 convolution groups" in found.describe(0.3)
    data = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = [data[n.input[1]] for n in _convs(model)]
    kept = [
        _kept([w[0].reshape(8, -1), _columns(w[1], 4)], 4, 4),
        _kept([w[1].reshape(16, -1), _columns(w[2], 2)], 4, 8),
        _kept([w[2].reshape(8, -1), _columns(w[3], 1)], 2, 4),
    ]
    small, report = shrink_onnx(model, 0.5)
    assert [report.kept[g.group.name] for g in found.groups] == [k.tolist() for k in kept]
    onnx.checker.check_model(small, full_check=True)
    groups = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("group", 1) for n in _convs(small)]
    assert groups == [1, 4, 2, 1]
    (w1,) = [t for t in small.graph.initializer if t.name == _convs(small)[1].input[1]]
    assert list(w1.dims) == [8, 1, 3, 3]
    # the dense export with the dropped channels zeroed where they are read
    zeroed = onnx.ModelProto()
    zeroed.CopyFrom(model)
    for node, keep, g in zip(_convs(zeroed)[1:], kept, (4, 2, 1), strict=True):
        a = data[node.input[1]].copy()
        rows, local = a.shape[:2]
        for c in np.setdiff1d(np.arange(local * g), keep):
            j, i = divmod(int(c), local)
            a[j * (rows // g):(j + 1) * (rows // g), i] = 0
        node.input[1] += ".zeroed"
        zeroed.graph.initializer.append(numpy_helper.from_array(a, node.input[1]))
    xs = x.numpy()
    np.testing.assert_allclose(_run(small, xs), _run(zeroed, xs), atol=1e-5)
    np.testing.assert_allclose(_run(small, xs), _run(zeroed_onnx(model, report), xs), atol=1e-5)
    # the torch adapter on the same module keeps the same channels and computes the same
    shrunk = prune.shrink(copy.deepcopy(net), x, 0.5)
    with torch.no_grad():
        np.testing.assert_allclose(_run(small, xs), shrunk(x).numpy(), atol=1e-5)


def test_uneven_amounts_are_refused():
    model = _export(_net(), torch.randn(1, 3, 4, 4), False)
    with pytest.raises(ValueError, match=r"^group '.*': 2 of its 8 channels cannot be removed evenly from its 4 "):
        shrink_onnx(model, 2)
    with pytest.raises(ValueError, match="^a global ranking cannot keep the groups of a grouped convolution even"):
        shrink_onnx(model, 0.5, global_=True)


def test_keep_floor_rounding():
    model = _export(_net(), torch.randn(1, 3, 4, 4), False)
    small, report = shrink_onnx(model, 0.3, rounding="keep_floor")
    # per convolution group: int(0.7 * 2) = 1 of 2, int(0.7 * 4) = 2 of 4, int(0.7 * 4) = 2 of 4 stay
    assert [len(k) for k in report.kept.values()] == [4, 8, 4]
    _, nearest = shrink_onnx(model, 0.3)  # round(0.3 * 2) = 1, round(1.2) = 1, round(1.2) = 1 go
    assert [len(k) for k in nearest.kept.values()] == [4, 12, 6]
    with pytest.raises(ValueError, match="^rounding must be one of"):
        shrink_onnx(model, 0.3, rounding="up")
