"""onnxruntime sessions of ONNX models: calibration by path for external data, and
``--verify`` (real inputs, symbolic sizes, bfloat16 inputs, one-line failures)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.cli import main
from arrayprune.adapters.pipeline import calibration

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _two_layers(k=32, h=16, n=4):
    """x[B, k] -> MatMul(W1 [k, h]) -> Relu -> MatMul(W2 [h, n]) -> y, B symbolic."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "W2"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", n])],
        initializer=[numpy_helper.from_array(_rand((k, h), 1), "W1"), numpy_helper.from_array(_rand((h, n), 2), "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# --------------------------------------------------------------------------------------
# Calibration of models with external data: by path
# --------------------------------------------------------------------------------------


def test_calibration_of_an_external_data_model_goes_by_path(tmp_path, monkeypatch):
    folder = tmp_path / "ext"
    folder.mkdir()
    path = str(folder / "m.onnx")
    onnx.save_model(_two_layers(), path, save_as_external_data=True, location="m.bin", size_threshold=0)
    wf = fmt.load(folder / "m.onnx")
    assert set(wf.context["external"]) == {"W1", "W2"}
    before = sorted(os.listdir(folder))
    x = _rand((10, 32), 3)

    given = []
    real = ort.InferenceSession

    def recording(model, *args, **kwargs):
        given.append(model if isinstance(model, str) else type(model).__name__)
        if isinstance(model, str):
            assert os.path.isfile(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    norms = calibration.onnx_input_norms(wf, {"x": x}, ["W1", "W2"], batch_size=4)
    monkeypatch.undo()
    (path,) = given
    assert isinstance(path, str) and os.path.dirname(path) == str(folder) and path.endswith(".onnx"), given
    assert sorted(os.listdir(folder)) == before, "the temporary graph is removed"
    # the norms of a NumPy forward with the same weights
    a = x @ _rand((32, 16), 1)
    np.testing.assert_allclose(norms["W1"].norms, np.sqrt((x.astype(np.float64) ** 2).sum(0)), rtol=1e-6)
    np.testing.assert_allclose(norms["W2"].norms, np.sqrt((np.maximum(a, 0).astype(np.float64) ** 2).sum(0)), rtol=1e-5)

    # an inline model is still handed over in memory
    onnx.save_model(_two_layers(), str(tmp_path / "inline.onnx"))
    given.clear()
    monkeypatch.setattr(ort, "InferenceSession", recording)
    inline = calibration.onnx_input_norms(fmt.load(tmp_path / "inline.onnx"), {"x": x}, ["W1", "W2"])
    monkeypatch.undo()
    assert given == ["bytes"]
    np.testing.assert_allclose(inline["W2"].norms, norms["W2"].norms, rtol=1e-6)


# --------------------------------------------------------------------------------------
# --verify: real inputs, symbolic sizes, bfloat16 inputs, one-line failures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A torch.onnx.export of a small nn.TransformerEncoder (dynamic batch and sequence),
    traced at batch 2, sequence 5: the exporter bakes those into its Reshape nodes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    path = tmp_path_factory.mktemp("encoder") / "enc.onnx"
    with pytest.warns(DeprecationWarning):
        torch.onnx.export(
            model,
            (torch.randn(2, 5, 16),),
            str(path),
            input_names=["src"],
            output_names=["out"],
            dynamic_axes={"src": {0: "batch", 1: "seq"}, "out": {0: "batch", 1: "seq"}},
            dynamo=False,
        )
    return path


@pytest.mark.slow
def test_verify_of_a_torch_transformer_encoder_export(encoder, tmp_path):
    from cli_helpers import run

    # all-ones sizes do not run the original (its Reshape wants the traced sizes)
    session = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="Reshape"):
        session.run(None, {"src": np.zeros((1, 1, 16), np.float32)})

    out = tmp_path / "out.onnx"
    proc = run("prune", encoder, "-o", out, "--amount", "0.3", "--verify")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[2] == "verify: random inputs, symbolic dimensions batch=1, seq=5"
    assert lines[3].startswith("verify: output 'out': max abs output difference ") and lines[3].endswith(": pass")

    # real inputs: the traced sizes; the same comparison from Python
    data = tmp_path / "inputs.npz"
    x = _rand((2, 5, 16), 4)
    np.savez(data, src=x)
    proc = run("prune", encoder, "-o", out, "--amount", "0.3", "--verify", "--verify-data", data, "--force")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "symbolic dimensions" not in proc.stdout
    from arrayprune.adapters import verify

    (check,) = verify.verify_onnx(str(encoder), str(out), data={"src": x})
    ref = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"]).run(None, {"src": x})[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"src": x})[0]
    assert check.name == "out" and check.passed
    assert check.difference == float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
    assert f"max abs output difference {check.difference:.6g}," in proc.stdout


@pytest.mark.slow
def test_verify_failures_are_one_line_before_anything_is_written(tmp_path):
    from cli_helpers import assert_error, run

    # x [N] reshaped to [9, 11]: no size tried for N (1..8) runs it
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [9, 4])],
        initializer=[
            numpy_helper.from_array(np.array([9, 11], np.int64), "shape"),
            numpy_helper.from_array(_rand((11, 4), 5), "W"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "fixed.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "out.onnx"
    line = assert_error(run("prune", src, "-o", out, "--amount", "0.5", "--verify"), src)
    assert "symbolic dimensions 'N' (axis 0 of 'x') set to sizes 1..8" in line
    assert line.endswith("give real inputs with --verify-data inputs.npz")
    assert not out.exists()
    bad = tmp_path / "bad.npz"
    np.savez(bad, y=np.zeros(99, np.float32))
    line = assert_error(run("prune", src, "-o", out, "--amount", "0.5", "--verify", "--verify-data", bad), bad)
    assert "lacks graph input 'x'" in line and not out.exists()
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones(99, np.float32))
    proc = run("prune", src, "-o", out, "--amount", "0.5", "--verify", "--verify-data", good)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert_error(run("prune", src, "-o", tmp_path / "o2.onnx", "--amount", "0.5", "--verify-data", good), "--verify")


def test_verify_feeds_bfloat16_inputs(tmp_path, capsys):
    from arrayprune.adapters import verify
    from arrayprune.adapters.formats.onnx import _narrow_bfloat16, _widen_bfloat16

    # x bfloat16 [B, 8] -> Cast -> MatMul(W [8, 4]) -> y float
    w = _rand((8, 4), 6)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT), helper.make_node("MatMul", ["xf", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["B", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, out = tmp_path / "bf.onnx", tmp_path / "out.onnx"
    onnx.save_model(model, str(src))
    assert main(["prune", str(src), "-o", str(out), "--amount", "0.5", "--verify"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[2] == "verify: random inputs, symbolic dimensions B=1"
    assert printed[3].endswith(": pass")

    x = _rand((3, 8), 7)
    xb = _widen_bfloat16(_narrow_bfloat16(x))  # the values onnxruntime is fed
    (check,) = verify.verify_onnx(str(src), str(out), data={"x": x}, tol=(0.0, 0.0))
    pruned_w = fmt.load(out).params["W"]
    expected = float(np.max(np.abs(xb.astype(np.float64) @ w - xb.astype(np.float64) @ pruned_w)))
    assert check.name == "y" and not check.passed
    np.testing.assert_allclose(check.difference, expected, rtol=1e-5)
