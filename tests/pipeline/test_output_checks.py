"""Outputs checked against the input before anything is read or written: an empty OUT,
an OUT that is one of IN's files or a folder holding IN (refused, ``--force`` or not)."""

from __future__ import annotations

import os

import pytest
from test_sharded import OTHER_FILES, cli, llama_tensors, one_line_error, write_checkpoint

from arrayprune.adapters import prune_file
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.pipeline.request import PruneError

onnx = pytest.importorskip("onnx")


def contents(folder):
    return {p: (folder / p).read_bytes() for p in sorted(os.listdir(folder))}


@pytest.fixture
def ck(tmp_path):
    return write_checkpoint(tmp_path / "ck", llama_tensors(layers=2), 3)


@pytest.mark.parametrize("out", ["", "   "])
@pytest.mark.parametrize("extra", [[], ["--force"], ["--shrink"], ["--method", "sparsegpt", "--calibration", "t.npz"]])
def test_an_empty_output_is_refused_and_the_working_folder_kept(ck, tmp_path, monkeypatch, capsys, out, extra):
    work = tmp_path / "w"
    work.mkdir()
    (work / "model-00001-of-00003.safetensors").write_text("mine")
    monkeypatch.chdir(work)
    assert cli("prune", ck, "-o", out, "--amount", "0.5", *extra) == 2
    one_line_error(capsys, "-o/--output is empty")
    assert contents(work) == {"model-00001-of-00003.safetensors": b"mine"}
    with pytest.raises(PruneError, match="is empty"):
        prune_file(ck, out, amount=0.5)
    assert contents(work) == {"model-00001-of-00003.safetensors": b"mine"}


def test_an_empty_scan_or_plot_output_is_refused(tmp_path, monkeypatch, capsys):
    from cli_helpers import EXAMPLE

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cal.npz").write_bytes(b"")
    assert cli("scan", EXAMPLE, "--calibration", "cal.npz", "-o", "") == 2
    one_line_error(capsys, "-o is empty")
    assert cli("scan", EXAMPLE, "--calibration", "cal.npz", "-o", "s.json", "--plot", " ") == 2
    one_line_error(capsys, "--plot is empty")
    assert cli("report", EXAMPLE, "--plot", "") == 2
    one_line_error(capsys, "--plot is empty")
    assert sorted(os.listdir(tmp_path)) == ["cal.npz"]


@pytest.mark.parametrize(
    "out",
    [
        "ck/model-00001-of-00003.safetensors",
        "ck/model-00003-of-00003.safetensors",
        "ck/model.safetensors.index.json",
        "ck/config.json",
        "link.safetensors",  # a symlink to a shard
        ".",  # the folder holding IN
    ],
)
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_an_output_that_is_a_file_of_the_input_is_refused(ck, tmp_path, monkeypatch, capsys, out, force):
    monkeypatch.chdir(tmp_path)
    os.symlink("ck/model-00002-of-00003.safetensors", "link.safetensors")
    before = contents(ck)
    assert cli("prune", "ck", "-o", out, "--amount", "0.5", *force) == 2
    line = one_line_error(capsys, out)
    assert ("a file of the input" in line) or ("a folder holding the input" in line), line
    assert contents(ck) == before
    assert len(sharded.open_checkpoint(ck).tensors) == len(llama_tensors(layers=2))
    with pytest.raises(PruneError, match="--force or not"):
        prune_file("ck", out, amount=0.5, force=True)
    assert contents(ck) == before


def test_pruning_a_checkpoint_in_place_still_takes_force(ck, capsys):
    assert cli("prune", ck, "-o", ck, "--amount", "0.5", "--force") == 0
    assert set(os.listdir(ck)) >= set(OTHER_FILES)


def test_an_output_that_is_the_external_data_of_the_input_is_refused(tmp_path, capsys):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w],
    )
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), src, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    data = (tmp_path / "m.onnx.data").read_bytes()
    assert cli("prune", src, "-o", tmp_path / "m.onnx.data", "--amount", "0.5", "--force") == 2
    one_line_error(capsys, "'m.onnx.data', a file of the input")
    assert (tmp_path / "m.onnx.data").read_bytes() == data
    assert cli("scan", src, "--calibration", src, "-o", src, "--force") == 2
    one_line_error(capsys, "-o is the input")
    assert cli("report", src, "--plot", tmp_path / "m.onnx.data") == 2
    one_line_error(capsys, "--plot is 'm.onnx.data', a file of the input")
    assert (tmp_path / "m.onnx.data").read_bytes() == data
