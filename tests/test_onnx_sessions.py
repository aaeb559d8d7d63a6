"""onnxruntime sessions of ONNX models: calibration by path for external data, and
``--verify`` (real inputs, symbolic sizes, bfloat16 inputs, one-line failures)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from arrayprune.adapters import calibration
from arrayprune.adapters import formats as fmt

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
