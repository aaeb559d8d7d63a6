"""ONNX files: the same command writes the same bytes, subgraph initializers, integer and
bfloat16 initializers as ``report`` and ``--dry-run`` list them."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.cli import main
from arrayprune.adapters.formats import files as fmt_files

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _mlp(k=64, n=32):
    """x[1, k] -> MatMul(W [k, n]) -> Add(b [n]) -> y."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=[numpy_helper.from_array(_rand((k, n), 1), "W"), numpy_helper.from_array(_rand(n, 2), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ext(tmp_path):
    """ext.onnx in its own folder, W in ext.bin (onnx's writer)."""
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save_model(_mlp(), str(folder / "ext.onnx"), save_as_external_data=True, location="ext.bin", size_threshold=0)
    return folder / "ext.onnx"


def _files(folder):
    """Name -> bytes of every file in `folder`."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --------------------------------------------------------------------------------------
# The same command, the same bytes
# --------------------------------------------------------------------------------------


def test_rerun_over_an_existing_output_writes_the_same_bytes(tmp_path, capsys):
    src = _ext(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    cmd = ["prune", str(src), "-o", str(out), "--amount", "0.5", "--force"]
    assert main(cmd) == 0
    first = _files(out_dir)
    data_names = [n for n in first if n.endswith(".data")]
    assert len(first) == 2 and len(data_names) == 1, sorted(first)
    # the name is the start of the SHA-256 of the data file's bytes
    digest = hashlib.sha256(first[data_names[0]]).hexdigest()[:16]
    assert data_names == [f"out.onnx.{digest}.data"]
    for _ in range(2):  # over the output of the same command: byte for byte the same pair
        assert main(cmd) == 0
        assert _files(out_dir) == first
    # a different amount: a new data file, the old one removed; then back to the first bytes
    assert main([*cmd[:-2], "0.25", "--force"]) == 0
    other = _files(out_dir)
    assert len(other) == 2 and other.keys() != first.keys()
    assert main(cmd) == 0
    assert _files(out_dir) == first
    capsys.readouterr()


def test_interrupted_rerun_leaves_the_old_pair(tmp_path, monkeypatch, capsys):
    src = _ext(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    assert main(["prune", str(src), "-o", str(out), "--amount", "0.5"]) == 0
    old = _files(out_dir)
    real_write = fmt_files.atomic_write

    def interrupted(path, write):
        if os.fspath(path) == str(out):
            raise KeyboardInterrupt  # after the new data file is in place, before the model
        return real_write(path, write)

    for amount in ("0.5", "0.25"):  # the same data (the old pair's own file) and new data
        monkeypatch.setattr(fmt_files, "atomic_write", interrupted)
        assert main(["prune", str(src), "-o", str(out), "--amount", amount, "--force"]) == 130
        monkeypatch.undo()
        assert _files(out_dir) == old, "the old model and its data file, byte for byte, nothing else"
    back = fmt.load(out)
    assert int(np.count_nonzero(back.params["W"] == 0)) == 64 * 32 // 2
    capsys.readouterr()


# --------------------------------------------------------------------------------------
# Initializers inside If / Loop / Scan bodies
# --------------------------------------------------------------------------------------

K, N = 16, 32  # 2 KiB: over the size that stays inline in a model with external data


def _if_model():
    """y = If(cond, then: x @ Wt (Wt [K, N] inside the branch), else: x @ We (main graph))."""
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "Wt"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, N])],
        initializer=[numpy_helper.from_array(_rand((K, N), 11), "Wt")],
    )
    else_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "We"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, N])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, N])],
        initializer=[numpy_helper.from_array(_rand((K, N), 12), "We")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _stored(path):
    """Name -> array of every initializer of the model at `path`, subgraphs included."""
    model = onnx.load(str(path))  # with its external data
    from arrayprune.adapters.formats.onnx import iter_initializers

    return {t.name: numpy_helper.to_array(t) for t in iter_initializers(model)}


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_weight_inside_an_if_branch_is_pruned_and_written_back(tmp_path, external, capsys):
    ort = pytest.importorskip("onnxruntime")
    src = tmp_path / "in" / "if.onnx"
    src.parent.mkdir()
    if external:
        onnx.save_model(_if_model(), str(src), save_as_external_data=True, location="if.bin", size_threshold=0)
    else:
        onnx.save_model(_if_model(), str(src))
    wf = fmt.load(src)
    assert sorted(wf.params) == ["We", "Wt"]
    np.testing.assert_array_equal(wf.params["Wt"], _rand((K, N), 11))

    out = tmp_path / "out" / "if.onnx"
    out.parent.mkdir()
    assert main(["prune", str(src), "-o", str(out), "--amount", "0.5"]) == 0
    assert "pruned 2 tensors" in capsys.readouterr().out
    stored = _stored(out)
    wt = _rand((K, N), 11)
    # exactly round(0.5 * 512) = 256 zeros, at the 256 entries of smallest magnitude
    expected = np.where(np.abs(wt) > np.sort(np.abs(wt).ravel())[255], wt, np.float32(0))
    assert int(np.count_nonzero(stored["Wt"] == 0)) == 256
    np.testing.assert_array_equal(stored["Wt"], expected)
    assert int(np.count_nonzero(stored["We"] == 0)) == 256
    if external:
        proto = onnx.load_model(str(out), load_external_data=False)
        (then_g,) = [a.g for a in proto.graph.node[0].attribute if a.name == "then_branch"]
        (then_w,) = then_g.initializer
        assert then_w.name == "Wt" and then_w.data_location == TensorProto.EXTERNAL, "stays external, beside OUT"

    x = _rand((2, K), 13)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x, "cond": np.array(True)})
    np.testing.assert_allclose(y, x @ expected, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# Integer and bfloat16 initializers as report and --dry-run list them
# --------------------------------------------------------------------------------------


def _typed_model(tmp_path):
    """x[2, 4] -> MatMul(W bfloat16 [4, 4] cast to float) -> Reshape(shape int64) -> + idx int32 (cast)."""
    w = _rand((4, 4), 21)
    w_bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # exact bfloat16 values
    w_bf16 = helper.make_tensor("W", TensorProto.BFLOAT16, (4, 4), w_bits.tobytes(), raw=True)
    nodes = [
        helper.make_node("Cast", ["W"], ["Wf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "Wf"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["r"]),
        helper.make_node("Cast", ["idx"], ["idxf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["r", "idxf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        initializer=[
            w_bf16,
            numpy_helper.from_array(np.array([8], np.int64), "shape"),
            numpy_helper.from_array(np.array([0, 1, 0, 2, 0, 0, 3, 0], np.int32), "idx"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "typed.onnx"
    onnx.save_model(model, str(path))
    return path


def test_report_lists_integer_and_bfloat16_initializers(tmp_path, capsys):
    import json

    path = _typed_model(tmp_path)
    wf = fmt.load(path)
    np.testing.assert_array_equal(wf.params["shape"], np.array([8], np.int64))
    np.testing.assert_array_equal(wf.params["idx"], np.array([0, 1, 0, 2, 0, 0, 3, 0], np.int32))
    assert main(["report", str(path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert [(n, r["dtype"], r["shape"], r["zeros"], r["prunable"]) for n, r in rows.items()] == [
        ("W", "bfloat16", [4, 4], 0, True),
        ("shape", "int64", [1], 0, False),
        ("idx", "int32", [8], 5, False),
    ]
    assert rows["idx"]["reason"] == "int32, not floating point"
    assert main(["report", str(path)]) == 0
    table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:6]}
    assert [table[n][2] for n in ("W", "shape", "idx")] == ["bfloat16", "int64", "int32"]


def test_dry_run_shows_bfloat16_and_pruning_keeps_integers(tmp_path, capsys):
    path = _typed_model(tmp_path)
    assert main(["prune", str(path), "--dry-run", "--amount", "0.5"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:5]}
    assert lines["W"][1:4] == ["weight", "4x4", "bfloat16"]
    assert lines["shape"][1:] == ["other", "1", "int64", "leave:", "int64,", "not", "floating", "point"]
    assert lines["idx"][3] == "int32"
    out = tmp_path / "out.onnx"
    assert main(["prune", str(path), "-o", str(out), "--amount", "0.5"]) == 0
    stored = _stored(out)
    assert stored["shape"].dtype == np.int64 and stored["shape"].tolist() == [8]
    assert stored["idx"].dtype == np.int32 and stored["idx"].tolist() == [0, 1, 0, 2, 0, 0, 3, 0]
    assert int(np.count_nonzero(fmt.load(out).params["W"] == 0)) == 8
    capsys.readouterr()
