"""Wanda on ONNX models: calibration through onnxruntime, scores along each weight's axes.

Norms are checked against a NumPy forward pass written here (skl2onnx's digits MLP:
MatMul B ``[K, N]``; the example model: Gemm ``transB=1`` ``[N, K]``), masks against
`reference_wanda`, and the ONNX path against the PyTorch path on the same exported model.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from exports import digits_mlp as digits_mlp_export  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_wanda import reference_wanda  # noqa: E402

import arrayprune as ap  # noqa: E402
from arrayprune.adapters import formats  # noqa: E402
from arrayprune.adapters.pipeline.calibration import (  # noqa: E402
    InputNorms,
    onnx_input_norms,
    read_calibration,
    read_input_norms,
    wanda_scores_for,
)
from arrayprune.adapters.plan import file_roles  # noqa: E402
from arrayprune.adapters.roles.onnx_graph import Feed, weight_feeds  # noqa: E402


def _norms(a: np.ndarray, axis: int) -> np.ndarray:
    a = np.moveaxis(np.asarray(a, np.float64), axis, -1)
    return np.sqrt((a.reshape(-1, a.shape[-1]) ** 2).sum(axis=0))


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory):
    clf, path, x = digits_mlp_export(tmp_path_factory.mktemp("digits"))
    return clf, str(path), x


def _weight_names(wf, clf):
    """Initializer names of the MLP's weight matrices, in layer order."""
    names = []
    for w in clf.coefs_:
        (name,) = [k for k, v in wf.params.items() if np.array_equal(v, w.astype(np.float32))]
        names.append(name)
    return names


def test_digits_matmul_norms_equal_a_numpy_forward(digits_mlp):
    clf, path, x = digits_mlp
    wf = formats.load(path)
    names = _weight_names(wf, clf)
    feeds = weight_feeds(wf.context["model"])
    assert all(isinstance(feeds[n], list) and feeds[n][0].feature_axis == -1 for n in names)
    got = onnx_input_norms(wf, {"X": x[:300]}, names, batch_size=64)
    h = x[:300].astype(np.float64)
    for i, name in enumerate(names):
        np.testing.assert_allclose(got[name].norms, _norms(h, -1), rtol=1e-5)
        assert got[name].groups == 1
        h = np.maximum(h @ clf.coefs_[i] + clf.intercepts_[i], 0)


def test_digits_masks_per_output_column(digits_mlp):
    """MatMul B [K, N]: each output column loses half its K entries, by |W| * norm[K]."""
    clf, path, x = digits_mlp
    wf = formats.load(path)
    roles = {str(p[-1]): r for p, r in file_roles(wf).items()}
    names = _weight_names(wf, clf)
    norms = onnx_input_norms(wf, {"X": x[:200]}, names)
    for name in names:
        w = wf.params[name]
        scores = wanda_scores_for(w, roles[name], norms[name], name)
        np.testing.assert_allclose(scores, np.abs(w) * norms[name].norms[:, None], rtol=1e-6)
        assert roles[name].output_axis == 1
        keep = ap.wanda(w, 0.5, dim=roles[name].output_axis, importance_scores=scores)
        np.testing.assert_array_equal(keep, reference_wanda(np.abs(w) * norms[name].norms[:, None], 0.5, 1))
        assert ((~keep).sum(axis=0) == round(0.5 * w.shape[0])).all()


def test_gemm_trans_b_norms_and_batching_do_not_change_the_result():
    """examples/mlp.onnx: Gemm transB=1, weights [N, K]; batches of 1, 7 and all give one norm."""
    wf = formats.load("examples/mlp.onnx")
    w1, b1 = wf.params["fc1.weight"], wf.params["fc1.bias"]
    x = np.random.default_rng(0).standard_normal((50, 64)).astype(np.float32)
    results = [onnx_input_norms(wf, {"input": x}, ["fc1.weight", "fc2.weight"], batch_size=b) for b in (1, 7, 64)]
    want1 = _norms(x, -1)
    want2 = _norms(np.maximum(x.astype(np.float64) @ w1.T.astype(np.float64) + b1, 0), -1)
    for r in results:
        np.testing.assert_allclose(r["fc1.weight"].norms, want1, rtol=1e-12)
        np.testing.assert_allclose(r["fc2.weight"].norms, want2, rtol=1e-5)
    roles = {str(p[-1]): r for p, r in file_roles(wf).items()}
    scores = wanda_scores_for(w1, roles["fc1.weight"], results[0]["fc1.weight"], "fc1.weight")
    np.testing.assert_allclose(scores, np.abs(w1) * want1[None, :], rtol=1e-6)


def _torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3)
            self.grouped = nn.Conv2d(4, 4, 1, groups=2)
            self.fc1 = nn.Linear(4 * 4 * 4, 12)
            self.fc2 = nn.Linear(12, 3)

        def forward(self, x):
            x = torch.relu(self.grouped(torch.relu(self.conv(x))))
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    torch.manual_seed(0)
    return torch, Net().eval()


def test_torch_path_equals_onnx_path_on_the_same_exported_model():
    torch, net = _torch_net()
    import arrayprune.adapters.torch as prune

    x = torch.randn(40, 2, 6, 6)
    buf = io.BytesIO()
    torch.onnx.export(net, (x[:1],), buf, dynamo=False, input_names=["img"], dynamic_axes={"img": {0: "n"}})
    model = onnx.load_from_string(buf.getvalue())
    wf = formats.WeightFile(
        "net.onnx",
        "onnx",
        {t.name: numpy_helper.to_array(t) for t in model.graph.initializer},
        {"model": model, "external": {}},
    )
    roles = {str(p[-1]): r for p, r in file_roles(wf).items()}
    layers = {"conv.weight": net.conv, "grouped.weight": net.grouped, "fc1.weight": net.fc1, "fc2.weight": net.fc2}
    onnx_norms = onnx_input_norms(wf, {"img": x.numpy()}, list(layers), batch_size=16)
    torch_norms = prune.input_norms(net, [x[i : i + 16] for i in range(0, 40, 16)])
    torch_scores = prune.wanda_importance(net, [x[i : i + 16] for i in range(0, 40, 16)])
    assert onnx_norms["grouped.weight"].groups == 2
    for name, module in layers.items():
        np.testing.assert_allclose(onnx_norms[name].norms, torch_norms[name].numpy(), rtol=1e-5)
        w = wf.params[name]
        onnx_scores = wanda_scores_for(w, roles[name], onnx_norms[name], name)
        np.testing.assert_allclose(onnx_scores, torch_scores[module].numpy(), rtol=1e-5)
        onnx_keep = ap.wanda(w, 0.5, dim=roles[name].output_axis, importance_scores=onnx_scores)
        prune.wanda(module, "weight", 0.5, importance_scores=torch_scores[module])
        np.testing.assert_array_equal(onnx_keep, module.weight_mask.numpy() != 0)


def _tiny_model(extra_nodes=(), extra_inits=()):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), *extra_nodes],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        initializer=[w, *extra_inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return formats.WeightFile("m.onnx", "onnx", {"W": numpy_helper.to_array(w)}, {"model": model, "external": {}})


def test_calibration_data_must_match_the_graph_inputs():
    wf = _tiny_model()
    ok = np.ones((5, 4), np.float64)  # float64 is cast to the input's float32
    assert onnx_input_norms(wf, {"x": ok}, ["W"])["W"].norms.tolist() == [np.sqrt(5.0)] * 4
    with pytest.raises(ValueError, match="lacks graph input 'x'"):
        onnx_input_norms(wf, {"z": ok}, ["W"])
    with pytest.raises(ValueError, match="'z', not a graph input"):
        onnx_input_norms(wf, {"x": ok, "z": ok}, ["W"])
    with pytest.raises(ValueError, match="onnxruntime cannot run"):
        onnx_input_norms(wf, {"x": np.ones((5, 6), np.float32)}, ["W"])
    with pytest.raises(ValueError, match="not a weight"):
        onnx_input_norms(wf, {"x": ok}, ["nope"])


def test_weights_used_inside_subgraphs_cannot_be_calibrated():
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "V"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    wf = _tiny_model(
        [helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "V"), numpy_helper.from_array(np.array(True), "c")],
    )
    feeds = weight_feeds(wf.context["model"])
    assert feeds["W"] == [Feed("x", -1, 1, "MatMul B [K, N]")]
    assert "inside a subgraph" in feeds["V"]
    with pytest.raises(ValueError, match="cannot be calibrated.*--exclude"):
        onnx_input_norms(wf, {"x": np.ones((2, 4), np.float32)}, ["V"])


def test_scores_need_a_known_reduction_axis_and_fitting_norms():
    w = np.ones((4, 3))
    from arrayprune.adapters.roles import Role

    with pytest.raises(ValueError, match="reduction axis is unknown"):
        wanda_scores_for(w, Role("weight", None, None, "used with different axes"), np.ones(4), "w")
    with pytest.raises(ValueError, match="'w': input_norms"):
        wanda_scores_for(w, Role("weight", 1, 0, "MatMul B"), InputNorms(np.ones(3)), "w")


def test_norm_and_calibration_files(tmp_path):
    np.savez(tmp_path / "norms.npz", W=np.array([1.0, 2.0, 3.0, 4.0]))
    assert read_input_norms(str(tmp_path / "norms.npz"))["W"].dtype == np.float64
    np.savez(tmp_path / "bad.npz", W=np.array([[1.0]]))
    with pytest.raises(ValueError, match="1-D vector"):
        read_input_norms(str(tmp_path / "bad.npz"))
    np.savez(tmp_path / "neg.npz", W=np.array([-1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        read_input_norms(str(tmp_path / "neg.npz"))
    np.savez(tmp_path / "calib.npz", a=np.ones((3, 2)), b=np.ones((4, 2)))
    with pytest.raises(ValueError, match="common"):
        read_calibration(str(tmp_path / "calib.npz"))
    np.savez(tmp_path / "calib.npz", a=np.ones((3, 2)), b=np.ones((3,)))
    assert set(read_calibration(str(tmp_path / "calib.npz"))) == {"a", "b"}
