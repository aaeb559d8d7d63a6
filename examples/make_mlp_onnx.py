"""Build the example model ``examples/mlp.onnx``: a small MLP, 64-256-256-10 with Relu.

Weights are drawn from a seeded NumPy generator (He-uniform, as ``torch.nn.Linear``
would draw them), so running this script again reproduces the committed file byte for
byte. Layers are ``Gemm`` nodes with ``transB=1``: each weight is stored as
``(out_features, in_features)``, the layout of PyTorch's ``Linear``, and initializers
are named like a PyTorch state dict (``fc1.weight``, ``fc1.bias``, ...).

Usage::

    python examples/make_mlp_onnx.py [OUT]   # default: examples/mlp.onnx
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["make_mlp", "main"]

SIZES = (64, 256, 256, 10)
OPSET = 17
IR_VERSION = 8


def make_mlp(sizes: tuple[int, ...] = SIZES, seed: int = 0) -> onnx.ModelProto:
    """The MLP as an ONNX model.

    Parameters
    ----------
    sizes : tuple of int
        Input width, hidden widths, output width.
    seed : int
        Seed of the NumPy generator drawing the weights.

    Returns
    -------
    onnx.ModelProto
        A checked model with input ``input`` of shape ``(batch, sizes[0])`` and output
        ``logits`` of shape ``(batch, sizes[-1])``.
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "input"
    n_layers = len(sizes) - 1
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        bound = 1.0 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i}.weight"), numpy_helper.from_array(b, f"fc{i}.bias")]
        y = "logits" if i == n_layers else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"fc{i}", transB=1))
        if i < n_layers:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"relu{i}"))
            x = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, producer_name="arrayprune-example", opset_imports=[helper.make_opsetid("", OPSET)]
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    """Write the model to the path given (default ``mlp.onnx`` beside this script)."""
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.onnx")
    onnx.save_model(make_mlp(), out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
