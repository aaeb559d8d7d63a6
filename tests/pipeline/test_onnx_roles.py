"""Tests of arrayprune.adapters.roles.onnx_graph: the role of each initializer, from the graph.

Real exports first (skl2onnx's MLP, PyTorch's exporters: files nobody here wrote, mapped
back to the model's parameters by value), then hand-built graphs for each rule.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from cli_helpers import run

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import arrayprune as ap  # noqa: E402
from arrayprune.adapters.roles import Role  # noqa: E402
from arrayprune.adapters.roles.onnx_graph import onnx_roles  # noqa: E402


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _init(name, shape_or_array, seed=0):
    arr = shape_or_array if isinstance(shape_or_array, np.ndarray) else _rand(shape_or_array, seed)
    return numpy_helper.from_array(arr, name)


def _model(nodes, inits, inputs=("x",), outputs=("y",), opset=17, check=True, domains=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", "d"]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", "d"]) for n in outputs],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    return model


def _axes(role):
    return role.kind, role.output_axis, role.reduction_axis


# --------------------------------------------------------------------------------------
# scikit-learn's MLPClassifier, exported by skl2onnx
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sklearn_mlp(tmp_path_factory):
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=5, random_state=0).fit(x, y)
    model = skl2onnx.to_onnx(clf, x[:1], options={"zipmap": False})
    path = tmp_path_factory.mktemp("sklearn") / "mlp.onnx"
    onnx.save_model(model, str(path))
    return clf, model, path, x


def _find(model, arr):
    """Names of the initializers of `model` whose values equal `arr`."""
    return [t.name for t in model.graph.initializer if np.array_equal(numpy_helper.to_array(t), arr)]


def test_sklearn_mlp_weights_biases_and_the_rest(sklearn_mlp):
    clf, model, _, _ = sklearn_mlp
    roles = onnx_roles(model)
    assert set(roles) == {t.name for t in model.graph.initializer}
    weights, biases = set(), set()
    for coef, intercept in zip(clf.coefs_, clf.intercepts_, strict=True):
        (w,) = _find(model, coef.astype(np.float32))  # stored as [K, N], the MatMul's B
        (b,) = _find(model, intercept.astype(np.float32).reshape(1, -1))  # stored as [1, N]
        weights.add(w)
        biases.add(b)
    for name, role in roles.items():
        if name in weights:
            assert role == Role("weight", 1, 0, "MatMul B [K, N]"), name
        elif name in biases:
            assert role == Role("bias", why="Add input"), name
        else:
            assert role.kind == "other", (name, role)
    assert len(weights) == 3 and len(biases) == 3
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    assert sorted(dims[b] for b in biases) == [[1, 10], [1, 32], [1, 64]]
    assert roles["classes"].why == "ArrayFeatureExtractor input"


@pytest.mark.slow
def test_sklearn_mlp_prune_leaves_the_biases_and_runs_nm_along_k(sklearn_mlp, tmp_path):
    clf, model, path, x = sklearn_mlp
    weights = {n for c in clf.coefs_ for n in _find(model, c.astype(np.float32))}
    out = tmp_path / "o.onnx"
    proc = run("prune", path, "-o", out, "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for name, arr in after.items():
        if name in weights:
            assert np.count_nonzero(arr == 0) == arr.size // 2, name
        else:
            assert np.array_equal(arr, before[name]), f"{name} is not a weight and must be left alone"

    out = tmp_path / "nm.onnx"
    proc = run("prune", path, "-o", out, "--method", "nm_structured", "--nm", "2:4")
    assert proc.returncode == 0, proc.stderr
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for name in weights:
        k, n = after[name].shape
        groups = (after[name] == 0).reshape(k // 4, 4, n)  # runs of 4 along K (axis 0), per column
        assert (groups.sum(axis=1) == 2).all(), name
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    sess.run(None, {sess.get_inputs()[0].name: x[:4]})


# --------------------------------------------------------------------------------------
# PyTorch's exporters: a CNN + MLP with Conv, Gemm, MatMul, BatchNorm, LayerNorm, Embedding
# --------------------------------------------------------------------------------------


def _torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 8 * 8, 16)  # 2-D input: Gemm (transB=1)
            self.ln = nn.LayerNorm(16)
            self.emb = nn.Embedding(20, 8)
            self.proj = nn.Linear(8, 16)  # 3-D input: MatMul with the weight transposed
            self.w = nn.Parameter(torch.randn(16, 12))  # x @ w: MatMul B [K, N]
            self.head = nn.Linear(12, 5)

        def forward(self, img, ids):
            h = self.bn(torch.relu(self.conv(img)))
            h = self.ln(self.fc(h.flatten(1))) + self.proj(self.emb(ids)).sum(1)
            return self.head(h @ self.w)

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # distinct values everywhere, so that every initializer maps to one parameter
        for p in net.parameters():
            p.copy_(torch.randn(p.shape))
        net.bn.running_mean.copy_(torch.randn(4))
        net.bn.running_var.copy_(torch.rand(4) + 0.5)
    return net.eval(), (torch.randn(2, 1, 8, 8), torch.randint(0, 20, (2, 3)))


_EXPECTED = {  # parameter -> (kind, output axis, reduction axis), in the parameter's own layout
    "conv.weight": ("weight", 0, 1),
    "conv.bias": ("bias", None, None),
    "bn.weight": ("norm", None, None),
    "bn.bias": ("norm", None, None),
    "bn.running_mean": ("norm", None, None),
    "bn.running_var": ("norm", None, None),
    "fc.weight": ("weight", 0, 1),
    "fc.bias": ("bias", None, None),
    "ln.weight": ("norm", None, None),
    "ln.bias": ("norm", None, None),
    "emb.weight": ("embedding", None, None),
    "proj.weight": ("weight", 0, 1),
    "proj.bias": ("bias", None, None),
    "w": ("weight", 1, 0),
    "head.weight": ("weight", 0, 1),
    "head.bias": ("bias", None, None),
}


@pytest.mark.parametrize("exporter", ["legacy", "legacy-unfolded", "dynamo"])
@pytest.mark.slow
def test_torch_export_roles_match_the_modules_parameters(exporter):
    torch = pytest.importorskip("torch")
    net, args = _torch_net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            pytest.importorskip("onnxscript")
            model = torch.onnx.export(net, args, dynamo=True, verbose=False).model_proto
        else:
            f = io.BytesIO()
            torch.onnx.export(net, args, f, dynamo=False, do_constant_folding=exporter == "legacy")
            model = onnx.load_from_string(f.getvalue())
    state = {k: v.detach().numpy() for k, v in net.state_dict().items() if v.dtype.is_floating_point}
    roles = onnx_roles(model)
    assert set(roles) == {t.name for t in model.graph.initializer}
    found = {}
    for t in model.graph.initializer:
        arr, role = numpy_helper.to_array(t), roles[t.name]
        same = [k for k, v in state.items() if v.shape == arr.shape and np.array_equal(v, arr)]
        flipped = [k for k, v in state.items() if v.ndim == 2 and v.T.shape == arr.shape and np.array_equal(v.T, arr)]
        if not same and not flipped:
            assert role.kind == "other", (t.name, list(t.dims), role)  # shapes, axes: integer constants
            continue
        (param,) = same or flipped
        kind, out, red = _axes(role)
        if flipped and kind == "weight":  # the exporter stored the transpose: back to the parameter's axes
            out, red = 1 - out, 1 - red
        found[param] = (kind, out, red)
        if exporter == "legacy-unfolded" and param == "proj.weight":
            assert role.why == "Transpose -> MatMul B [K, N]"
    assert found == _EXPECTED


# --------------------------------------------------------------------------------------
# hand-built graphs: each rule
# --------------------------------------------------------------------------------------


def test_matmul_b_and_a_and_batched_b():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "B"], ["h"]),
            helper.make_node("MatMul", ["A", "h"], ["g"]),
            helper.make_node("MatMul", ["g", "B3"], ["y"]),
        ],
        [_init("B", (8, 6)), _init("A", (5, 4)), _init("B3", (2, 6, 3))],
    )
    roles = onnx_roles(model)
    assert roles["B"] == Role("weight", 1, 0, "MatMul B [K, N]")
    assert roles["A"] == Role("weight", 0, 1, "MatMul A [M, K]")
    assert roles["B3"] == Role("weight", 2, 1, "MatMul B [..., K, N]")


def test_transpose_chains_map_the_axes_back():
    model = _model(
        [
            helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "Wt"], ["h"]),
            helper.make_node("Transpose", ["V"], ["Vt"]),  # no perm: reversed
            helper.make_node("MatMul", ["h", "Vt"], ["g"]),
            helper.make_node("Transpose", ["U"], ["Ut"], perm=[1, 2, 0]),  # U [K, N, B] -> [N, B, K]
            helper.make_node("Transpose", ["Ut"], ["Utt"], perm=[1, 2, 0]),  # -> [B, K, N]
            helper.make_node("MatMul", ["g", "Utt"], ["y"]),
        ],
        [_init("W", (6, 8)), _init("V", (6, 6)), _init("U", (6, 4, 2))],
    )
    roles = onnx_roles(model)
    assert roles["W"] == Role("weight", 0, 1, "Transpose -> MatMul B [K, N]")
    assert _axes(roles["V"]) == ("weight", 0, 1)
    assert roles["U"] == Role("weight", 1, 0, "Transpose -> Transpose -> MatMul B [..., K, N]")


def test_cast_identity_and_dequantize_chains():
    w_q = np.arange(-24, 24, dtype=np.int8).reshape(8, 6)
    model = _model(
        [
            helper.make_node("Cast", ["W16"], ["W32"], to=TensorProto.FLOAT),
            helper.make_node("Identity", ["W32"], ["W"]),
            helper.make_node("Gemm", ["x", "W", "c"], ["h"], transB=1),
            helper.make_node("DequantizeLinear", ["Wq", "scale", "zp"], ["Wd"]),
            helper.make_node("MatMul", ["h", "Wd"], ["y"]),
        ],
        [
            _init("W16", _rand((8, 4), 1, np.float16)),
            _init("c", (8,)),
            _init("Wq", w_q),
            _init("scale", np.array(0.1, np.float32)),
            _init("zp", np.array(0, np.int8)),
        ],
    )
    roles = onnx_roles(model)
    assert roles["W16"] == Role("weight", 0, 1, "Cast -> Identity -> Gemm B (transB=1) [N, K]")
    assert roles["c"] == Role("bias", why="Gemm C")
    assert roles["Wq"] == Role("weight", 1, 0, "DequantizeLinear -> MatMul B [K, N]")
    assert roles["scale"] == Role("other", why="DequantizeLinear x_scale")
    assert roles["zp"] == Role("other", why="DequantizeLinear x_zero_point")


def test_reshape_squeeze_unsqueeze_flatten_when_they_only_add_or_drop_size_one_axes():
    i64 = np.int64
    model = _model(
        [
            helper.make_node("Unsqueeze", ["A", "ax0"], ["A3"]),  # [K, N] -> [1, K, N]
            helper.make_node("MatMul", ["x", "A3"], ["h1"]),
            helper.make_node("Reshape", ["B", "shapeKN"], ["B2"]),  # [K, 1, N] -> [K, N]
            helper.make_node("MatMul", ["h1", "B2"], ["h2"]),
            helper.make_node("Squeeze", ["C", "ax0"], ["C2"]),  # [1, K, N] -> [K, N]
            helper.make_node("MatMul", ["h2", "C2"], ["h3"]),
            helper.make_node("Reshape", ["D", "shapeKN"], ["D2"]),  # [2, 4, 6] -> [8, 6]: merged
            helper.make_node("MatMul", ["h3", "D2"], ["h4"]),
            helper.make_node("Flatten", ["E"], ["E2"], axis=1),  # [K, N]: unchanged
            helper.make_node("MatMul", ["h4", "E2"], ["h5"]),
            helper.make_node("Reshape", ["F", "runtime_shape"], ["F2"]),  # shape not a constant
            helper.make_node("MatMul", ["h5", "F2"], ["y"]),
        ],
        [
            _init("A", (8, 6)),
            _init("B", (6, 1, 8)),
            _init("C", (1, 8, 6)),
            _init("D", (2, 4, 6)),
            _init("E", (6, 8)),
            _init("F", (8, 6)),
            numpy_helper.from_array(np.array([0], i64), "ax0"),
            numpy_helper.from_array(np.array([-1, 8], i64), "shapeKN"),
        ],
        inputs=("x", "runtime_shape"),
    )
    roles = onnx_roles(model)
    assert roles["A"] == Role("weight", 1, 0, "Unsqueeze -> MatMul B [..., K, N]")
    assert roles["B"] == Role("weight", 2, 0, "Reshape -> MatMul B [K, N]")
    assert roles["C"] == Role("weight", 2, 1, "Squeeze -> MatMul B [K, N]")
    assert roles["D"].kind == "other" and "merges or splits axes" in roles["D"].why, roles["D"]
    assert roles["E"] == Role("weight", 1, 0, "Flatten -> MatMul B [K, N]")
    assert roles["F"] == Role("other", why="Reshape shape not a constant")
    assert roles["ax0"].kind == "other"  # read by Unsqueeze and Squeeze as axes
    assert roles["shapeKN"] == Role("other", why="Reshape shape (2 uses)")


def test_gemm_honours_trans_a_and_trans_b():
    model = _model(
        [
            helper.make_node("Gemm", ["A0", "x", "C"], ["h1"]),  # A [M, K]
            helper.make_node("Gemm", ["A1", "h1"], ["h2"], transA=1),  # A [K, M]
            helper.make_node("Gemm", ["h2", "B0"], ["h3"]),  # B [K, N]
            helper.make_node("Gemm", ["h3", "B1"], ["y"], transB=1),  # B [N, K]
        ],
        [_init("A0", (4, 8)), _init("C", (4, 1)), _init("A1", (4, 5)), _init("B0", (1, 3)), _init("B1", (2, 3))],
    )
    roles = onnx_roles(model)
    assert roles["A0"] == Role("weight", 0, 1, "Gemm A (transA=0) [M, K]")
    assert roles["A1"] == Role("weight", 1, 0, "Gemm A (transA=1) [K, M]")
    assert roles["B0"] == Role("weight", 1, 0, "Gemm B (transB=0) [K, N]")
    assert roles["B1"] == Role("weight", 0, 1, "Gemm B (transB=1) [N, K]")
    assert roles["C"] == Role("bias", why="Gemm C")


def test_conv_and_conv_transpose():
    model = _model(
        [
            helper.make_node("Conv", ["x", "W", "b"], ["h"], group=2),
            helper.make_node("ConvTranspose", ["h", "Wt", "bt"], ["g"]),
            helper.make_node("Conv", ["g", "W1"], ["y"]),
        ],
        [
            _init("W", (6, 2, 3, 3)),
            _init("b", (6,)),
            _init("Wt", (6, 3, 2, 2)),
            _init("bt", (3,)),
            _init("W1", (5, 3, 3)),
        ],
    )
    roles = onnx_roles(model)
    assert roles["W"] == Role("weight", 0, 1, "Conv W [out, in/groups, kH, kW]")
    assert roles["b"] == Role("bias", why="Conv B")
    assert roles["Wt"] == Role("weight", 1, 0, "ConvTranspose W [in, out/groups, kH, kW]")
    assert roles["bt"] == Role("bias", why="ConvTranspose B")
    assert roles["W1"] == Role("weight", 0, 1, "Conv W [out, in/groups, kW]")


def test_quantized_operators():
    i8 = np.int8
    q = np.arange(24, dtype=i8).reshape(4, 6)
    model = _model(
        [
            helper.make_node("MatMulInteger", ["xq", "Bq", "azp", "bzp"], ["h"]),
            helper.make_node("QLinearMatMul", ["xq", "s", "azp", "Bq2", "s", "bzp", "s", "azp"], ["g"]),
            helper.make_node("QLinearConv", ["img", "s", "azp", "Wq", "s", "bzp", "s", "azp", "bq"], ["c"]),
        ],
        [
            _init("Bq", q),
            _init("Bq2", q.copy()),
            _init("Wq", np.ones((3, 2, 3, 3), i8)),
            _init("bq", np.zeros(3, np.int32)),
            _init("s", np.array(0.5, np.float32)),
            _init("azp", np.array(0, i8)),
            _init("bzp", np.array(0, i8)),
        ],
        inputs=(),
        outputs=("h", "g", "c"),
        check=False,
    )
    roles = onnx_roles(model)
    assert roles["Bq"] == Role("weight", 1, 0, "MatMulInteger B [K, N]")
    assert roles["Bq2"] == Role("weight", 1, 0, "QLinearMatMul b [K, N]")
    assert roles["Wq"] == Role("weight", 0, 1, "QLinearConv w [out, in/groups, kH, kW]")
    assert roles["bq"] == Role("bias", why="QLinearConv B")
    assert roles["s"].kind == "other" and "QLinearMatMul a_scale" in roles["s"].why
    assert roles["azp"].kind == "other" and roles["bzp"].kind == "other"


def _branch(name, nodes, out, inits=(), inputs=()):
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        initializer=list(inits),
    )


def test_if_loop_and_scan_bodies_read_outer_initializers():
    then_g = _branch("then", [helper.make_node("MatMul", ["x", "Wthen"], ["t"])], "t")
    else_g = _branch(
        "else",
        [
            helper.make_node("Transpose", ["Welse"], ["We"]),
            helper.make_node("Gemm", ["x", "We", "c"], ["e"]),
        ],
        "e",
    )
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["h_in", "Wloop"], ["h_out"]),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None),
        ],
    )
    scan_body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "row"], ["s_out"]),
            helper.make_node("Conv", ["row", "Wscan"], ["scan_out"]),
        ],
        "scan_body",
        [
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, None),
        ],
    )
    model = _model(
        [
            helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
            helper.make_node("Loop", ["trips", "cond"], ["h"], body=loop_body, name="loop"),
            helper.make_node("Loop", ["trips", "cond", "x"], ["h2"], body=loop_body),
            helper.make_node("Scan", ["x", "x"], ["s", "scanned"], body=scan_body, num_scan_inputs=1),
        ],
        [
            _init("Wthen", (8, 4)),
            _init("Welse", (4, 8)),
            _init("c", (4,)),
            _init("Wloop", (8, 8)),
            _init("Wscan", (2, 3, 3)),
            numpy_helper.from_array(np.array(3, np.int64), "trips"),
        ],
        inputs=("x", "cond"),
        check=False,
    )
    roles = onnx_roles(model)
    assert roles["Wthen"] == Role("weight", 1, 0, "MatMul B [K, N] (in If 'branch' then_branch)")
    assert roles["Welse"] == Role("weight", 0, 1, "Transpose -> Gemm B (transB=0) [K, N] (in If 'branch' else_branch)")
    assert roles["c"] == Role("bias", why="Gemm C (in If 'branch' else_branch)")
    assert roles["Wloop"] == Role(
        "weight", 1, 0, "MatMul B [K, N] (in Loop 'loop' body); MatMul B [K, N] (in Loop body)"
    )
    assert roles["Wscan"] == Role("weight", 0, 1, "Conv W [out, in/groups, kW] (in Scan body)")
    assert roles["trips"] == Role("other", why="Loop input (2 uses)")


def test_subgraph_names_shadow_outer_initializers():
    inner = _branch(
        "then",
        [
            helper.make_node("MatMul", ["x", "W"], ["t0"]),  # W: the branch's own initializer
            helper.make_node("MatMul", ["t0", "V"], ["t"]),  # V: the outer one
        ],
        "t",
        inits=[_init("W", (8, 8), 3), _init("inner", (2,), 4)],
    )
    body = helper.make_graph(
        [helper.make_node("MatMul", ["V", "V"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("V", TensorProto.FLOAT, None),  # hides the outer V
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
        ],
    )
    else_g = _branch("else", [helper.make_node("Identity", ["x"], ["e"])], "e")
    model = _model(
        [
            helper.make_node("If", ["cond"], ["y"], then_branch=inner, else_branch=else_g),
            helper.make_node("Loop", ["", "cond", "x"], ["z"], body=body),
        ],
        [_init("W", (8, 8)), _init("V", (8, 8), 1)],
        inputs=("x", "cond"),
        outputs=("y", "z"),
        check=False,
    )
    roles = onnx_roles(model)
    assert roles["W"] == Role("other", why="unused")  # the branch reads its own W
    assert roles["V"] == Role("weight", 1, 0, "MatMul B [K, N] (in If then_branch)")  # not the Loop's V
    assert roles["inner"] == Role("other", why="unused")  # read in its own graph, which does not use it


def test_initializer_used_with_different_axes_is_a_weight_without_axes():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Gemm", ["h", "W"], ["y"], transB=1),
        ],
        [_init("W", (8, 8))],
    )
    role = onnx_roles(model)["W"]
    assert _axes(role) == ("weight", None, None)
    assert role.why == (
        "used with different axes: MatMul B [K, N] (output axis 1, reduction axis 0); "
        "Gemm B (transB=1) [N, K] (output axis 0, reduction axis 1)"
    )


def test_uses_that_agree_keep_their_role():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("MatMul", ["h", "W"], ["g"]),
            helper.make_node("Transpose", ["W"], ["Wt"]),
            helper.make_node("Gemm", ["g", "Wt"], ["y"], transB=1),  # Wt [N, K] is W [K, N]
        ],
        [_init("W", (8, 8))],
    )
    assert onnx_roles(model)["W"] == Role(
        "weight", 1, 0, "MatMul B [K, N] (2 uses); Transpose -> Gemm B (transB=1) [N, K]"
    )


def test_weight_tied_to_an_embedding_is_an_embedding_and_says_so():
    model = _model(
        [
            helper.make_node("Gather", ["E", "ids"], ["h"]),
            helper.make_node("Transpose", ["E"], ["Et"]),
            helper.make_node("MatMul", ["h", "Et"], ["y"]),
        ],
        [_init("E", (10, 4))],
        inputs=(),
        check=False,
    )
    model.graph.input.append(helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"]))
    onnx.checker.check_model(model)
    assert onnx_roles(model)["E"] == Role("embedding", why="Gather data; also Transpose -> MatMul B [K, N]")


def test_two_non_weight_roles_are_other():
    model = _model(
        [
            helper.make_node("Add", ["x", "s"], ["h"]),
            helper.make_node("LayerNormalization", ["h", "s"], ["y"]),
        ],
        [_init("s", (4,))],
    )
    assert onnx_roles(model)["s"] == Role("other", why="used as bias (Add input); norm (LayerNormalization scale)")


def test_bias_2d_gather_table_unused_shape_only_graph_output():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["g"]),  # b [1, N], as skl2onnx writes it
            helper.make_node("Gather", ["T", "idx"], ["e"]),
            helper.make_node("Gather", ["T2", "idx"], ["e2"], axis=1),
            helper.make_node("Shape", ["S"], ["s"]),
            helper.make_node("Shape", ["W"], ["ws"]),
            helper.make_node("Mul", ["g", "m"], ["y"]),
            helper.make_node("Einsum", ["x", "Q"], ["q"], equation="ij,jk->ik"),
        ],
        [
            _init("W", (8, 4)),
            _init("b", (1, 4)),
            _init("T", (10, 4)),
            _init("T2", (10, 4)),
            numpy_helper.from_array(np.array([1, 2], np.int64), "idx"),
            _init("S", (3, 3)),
            _init("m", (4,)),
            _init("Q", (8, 2)),
            _init("unused", (5, 5)),
            _init("out", (2,)),
        ],
        outputs=("y", "out"),
        check=False,
    )
    roles = onnx_roles(model)
    assert roles["W"] == Role("weight", 1, 0, "MatMul B [K, N]")  # its Shape use does not count
    assert roles["b"] == Role("bias", why="Add input")
    assert roles["T"] == Role("embedding", why="Gather data")
    assert roles["T2"] == Role("other", why="Gather data (axis=1)")
    assert roles["idx"] == Role("other", why="Gather indices (2 uses)")
    assert roles["S"] == Role("other", why="only its shape is read: Shape input")
    assert roles["m"] == Role("other", why="Mul input")
    assert roles["Q"] == Role("other", why="Einsum input (equation not read)")
    assert roles["unused"] == Role("other", why="unused")
    assert roles["out"] == Role("other", why="graph output")


def test_norm_operators():
    ms = "com.microsoft"
    model = _model(
        [
            helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["a"]),
            helper.make_node("BatchNormalization", ["a", "bn_s", "bn_b", "bn_m", "bn_v"], ["b"]),
            helper.make_node("InstanceNormalization", ["b", "in_s", "in_b"], ["c"]),
            helper.make_node("GroupNormalization", ["c", "gn_s", "gn_b"], ["d"], num_groups=2),
            helper.make_node("SimplifiedLayerNormalization", ["d", "sln_s"], ["e"], domain=ms),
            helper.make_node("SkipLayerNormalization", ["e", "x", "skip_g", "skip_b", "skip_bias"], ["y"], domain=ms),
        ],
        [
            _init(n, (4,), i)
            for i, n in enumerate(
                ["ln_s", "ln_b", "bn_s", "bn_b", "bn_m", "bn_v", "in_s", "in_b", "gn_s", "gn_b", "sln_s"]
                + ["skip_g", "skip_b", "skip_bias"]
            )
        ],
        opset=21,
        domains=(ms,),
        check=False,
    )
    roles = onnx_roles(model)
    assert {r.kind for r in roles.values()} == {"norm"}
    assert roles["ln_s"].why == "LayerNormalization scale"
    assert roles["bn_v"].why == "BatchNormalization var"
    assert roles["gn_b"].why == "GroupNormalization bias"
    assert roles["sln_s"].why == "SimplifiedLayerNormalization scale"
    assert roles["skip_bias"].why == "SkipLayerNormalization bias"


def test_sparse_initializers_are_listed_as_other():
    model = _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [_init("W", (4, 4))])
    values = numpy_helper.from_array(np.array([1.0], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0], np.int64), "sp_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    roles = onnx_roles(model)
    assert roles["W"].kind == "weight"
    assert roles["sp"] == Role("other", why="sparse initializer: not loaded")


def test_roles_of_the_example_model():
    import os

    path = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "mlp.onnx")
    roles = onnx_roles(onnx.load(path))
    assert {n: _axes(r) for n, r in roles.items()} == {
        **{f"fc{i}.weight": ("weight", 0, 1) for i in (1, 2, 3)},
        **{f"fc{i}.bias": ("bias", None, None) for i in (1, 2, 3)},
    }


@pytest.mark.slow
def test_torch_export_pruned_by_the_command_line(tmp_path):
    """2:4 along each weight's reduction axis; global L1 on the weights only, exact count."""
    torch = pytest.importorskip("torch")
    net, args = _torch_net()
    src = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, str(src), dynamo=False, do_constant_folding=False)
    model = onnx.load(str(src))
    roles = onnx_roles(model)
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    floats = {n for n, a in before.items() if a.dtype.kind == "f"}
    weights = {n for n in floats if roles[n].kind == "weight"}
    assert {"conv.weight", "fc.weight", "proj.weight", "w", "head.weight"} <= weights

    out = tmp_path / "nm.onnx"
    proc = run("prune", src, "-o", out, "--method", "nm_structured")
    assert proc.returncode == 0, proc.stderr
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for name in floats:
        if name in weights:
            k = roles[name].reduction_axis
            assert ap.is_nm_sparse(after[name], 2, 4, dim=k), name
            np.testing.assert_array_equal(after[name], before[name] * ap.nm_structured(before[name], dim=k))
        else:
            np.testing.assert_array_equal(after[name], before[name])

    out = tmp_path / "g.onnx"
    proc = run("prune", src, "-o", out, "--global", "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    names = [t.name for t in model.graph.initializer if t.name in weights]
    masks = ap.global_unstructured([before[n] for n in names], ap.L1Unstructured, amount=0.5)
    for name, mask in zip(names, masks, strict=True):
        np.testing.assert_array_equal(after[name], before[name] * mask)
    assert sum(int((after[n] == 0).sum()) for n in names) == round(0.5 * sum(before[n].size for n in names))
    assert all(np.array_equal(after[n], before[n]) for n in floats - weights)
