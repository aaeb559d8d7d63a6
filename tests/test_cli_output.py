"""What the command line says: 2:4 along the reduction axis, node names, warnings, progress, plans."""

from __future__ import annotations

import json

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import cli
from arrayprune.adapters import formats as fmt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _matmul_mlp(path):
    """x [1, 8] @ W1 [8, 16] + b1 -> Relu -> @ W2 [16, 4] + b2: MatMul weights [K, N]."""
    inits = [
        numpy_helper.from_array(_rand((8, 16), 1), "W1"),
        numpy_helper.from_array(_rand((16,), 2), "b1"),
        numpy_helper.from_array(_rand((16, 4), 3), "W2"),
        numpy_helper.from_array(_rand((4,), 4), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="/layer1/MatMul"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="/layer1/Add"),
        helper.make_node("Relu", ["h1"], ["h2"], name="/Relu"),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"], name="/layer2/MatMul"),
        helper.make_node("Add", ["h3", "b2"], ["y"], name="/layer2/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _main(capsys, *args):
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------------------
# report: 2:4 along each weight's reduction axis
# --------------------------------------------------------------------------------------


def test_report_reads_2_4_along_the_reduction_axis_of_matmul_weights(tmp_path, capsys):
    src = _matmul_mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "nm.onnx"
    code, _, err = _main(capsys, "prune", src, "-o", out, "--method", "nm_structured", "--nm", "2:4")
    assert code == 0, err
    pruned = fmt.load(out).params
    for name in ("W1", "W2"):  # 2:4 along K (axis 0), not along N
        assert ap.is_nm_sparse(pruned[name], 2, 4, dim=0)
        assert not ap.is_nm_sparse(pruned[name], 2, 4, dim=1)

    code, text, err = _main(capsys, "report", out, "--json")
    assert code == 0, err
    report = json.loads(text)
    rows = {r["name"]: r for r in report["tensors"]}
    assert {n: rows[n]["nm_2_4"] for n in rows} == {"W1": True, "b1": False, "W2": True, "b2": False}
    # half the values plus 2 bits per kept value for the weights; the biases dense
    assert rows["W1"]["bytes"]["semi_structured_2_4"] == 64 * 4 + 64 * 2 // 8 == 272
    assert rows["W2"]["bytes"]["semi_structured_2_4"] == 32 * 4 + 32 * 2 // 8 == 136
    assert report["total"]["bytes"]["semi_structured_2_4"] == 272 + 136 + 16 * 4 + 4 * 4 == 488

    code, text, err = _main(capsys, "report", out)
    assert code == 0, err
    lines = {line.split()[0]: line.split() for line in text.splitlines()[1:] if line.split()}
    assert lines["W1"][6] == "yes" and lines["W2"][6] == "yes"
    assert lines["b1"][6] == "no"
    assert f"2:4 where it holds {488 / 2**20:.2f} MiB" in text


def test_sparse_nbytes_takes_the_axis_of_the_groups():
    w = np.zeros((8, 4), np.float32)
    w[::4, :] = 1.0
    w[1::4, :] = 2.0  # 2:4 along axis 0 only, 16 non-zeros
    assert "semi_structured_2_4" not in ap.sparse_nbytes(w)
    assert ap.sparse_nbytes(w, dim=0)["semi_structured_2_4"] == 16 * 4 + 16 * 2 // 8
    assert ap.sparse_nbytes(w, dim=-2) == ap.sparse_nbytes(w, dim=0)
    with pytest.raises(IndexError):
        ap.sparse_nbytes(w, dim=2)
