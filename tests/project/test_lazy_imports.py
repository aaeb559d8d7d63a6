"""Commands import only what they use: no PyTorch, onnxruntime, Dask or JAX for ONNX files or ``--help``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

HEAVY = ("torch", "onnxruntime", "dask", "jax")

PROBE = """
import json, sys
from arrayprune.adapters.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def imported(*args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout.splitlines()[-1])
    return out["rc"], set(out["modules"])


@pytest.mark.slow
def test_help_imports_no_framework():
    for args in (["prune", "--help"], ["--help"], ["report", "--help"]):
        rc, modules = imported(*args)
        assert rc == 0
        assert not modules & set(HEAVY), (args, sorted(modules & set(HEAVY)))


@pytest.mark.slow
def test_pruning_an_onnx_file_imports_no_framework(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    rc, modules = imported("prune", tmp_path / "m.onnx", "-o", tmp_path / "out.onnx", "--amount", "0.5")
    assert rc == 0 and (tmp_path / "out.onnx").exists()
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    rc, modules = imported("report", tmp_path / "out.onnx")
    assert rc == 0 and not modules & set(HEAVY), sorted(modules & set(HEAVY))
