"""Small ONNX graphs built by hand for tests (``from onnx_builders import ...``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def two_layer_relu(path: Path | str, w1: np.ndarray, w2: np.ndarray) -> None:
    """Save ``Y = relu(X @ W1) @ W2`` (``X`` ``[n, 8]``, ``Y`` ``[n, 4]``, opset 17) at `path`."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W1"], ["H"], name="fc1"),
            helper.make_node("Relu", ["H"], ["R"], name="relu"),
            helper.make_node("MatMul", ["R", "W2"], ["Y"], name="fc2"),
        ],
        "two",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
