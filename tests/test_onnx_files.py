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
