"""Hostile or mistaken inputs refused in one line: a scan's JSON, ``--dim``, a folder as
IN, input norms that are not finite."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from arrayprune.adapters.pipeline.scan import Curve, ScanResult
from cli_helpers import EXAMPLE, assert_error, run

SPARSITIES = (0.25, 0.5, 0.75)


def scan_dict():
    curves = [Curve("fc1.weight", (16, 32), (0.1, 0.2, 0.4)), Curve("fc2.weight", (32, 8), (0.2, 0.3, 0.5))]
    return ScanResult(method="l1_unstructured", sparsities=SPARSITIES, curves=curves, samples=4).to_dict()


def test_allocation_given_a_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "scan.json"
    os.mkfifo(fifo)
    proc = run("prune", EXAMPLE, "--dry-run", "--amount", "0.5", "--allocation", fifo, timeout=60)
    assert_error(proc, fifo, "not a regular file")


@pytest.mark.parametrize(
    "edit, fragments",
    [
        (lambda d: d["curves"][0].update(errors=[10**400, 0.2, 0.3]), ["'errors'", "finite"]),
        (lambda d: d.update(samples=1e400), ["'samples'", "whole numbers", "inf"]),
        (lambda d: d.update(samples=10**400), ["'samples'", "whole numbers"]),
        (lambda d: d["curves"][0].update(shape=[16.5, 32]), ["'shape'", "whole numbers", "16.5"]),
        (lambda d: d["curves"][0].update(shape=[True, 32]), ["'shape'", "whole numbers"]),
        (lambda d: d.update(sparsities=[0.25, 1e400, 0.75]), ["'sparsities'", "finite"]),
        (lambda d: d.update(sparsities=["0.25", 0.5, 0.75]), ["'sparsities'", "numbers", "'0.25'"]),
        (lambda d: d["curves"][0].update(name=["fc1"]), ["'name'", "string"]),
        (lambda d: d["curves"][0].update(nodes=[3]), ["'nodes'", "string"]),
        (lambda d: d.update(curves={"a": 1}), ["'curves'", "list"]),
        (lambda d: d.update(curves=[[]]), ["curve 0"]),
        (lambda d: d.pop("method"), ["no 'method'"]),
        (lambda d: d.update(model="[" * 100_000 + "]" * 100_000), None),  # a string: fine
    ],
)
def test_a_tampered_scan_is_refused_in_one_line(tmp_path, edit, fragments):
    data = scan_dict()
    edit(data)
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(data))
    if fragments is None:
        assert ScanResult.load(path).curve("fc1.weight").shape == (16, 32)
        return
    with pytest.raises(ValueError) as info:
        ScanResult.load(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.slow
def test_a_scan_nested_100000_deep_is_one_line_from_the_command(tmp_path):
    path = tmp_path / "scan.json"
    deep = json.dumps(scan_dict())[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text(deep)
    with pytest.raises(ValueError, match="nested too deeply"):
        ScanResult.load(path)
    ten400 = json.dumps(scan_dict()).replace("0.1, 0.2, 0.4", "1" + "0" * 400 + ", 0.2, 0.4")
    (tmp_path / "big.json").write_text(ten400)
    for scan in (path, tmp_path / "big.json"):
        proc = run("prune", EXAMPLE, "--dry-run", "--amount", "0.5", "--allocation", scan)
        assert_error(proc, scan)
        assert "Traceback" not in proc.stderr


def test_a_scan_with_nodes_still_reads(tmp_path):
    data = scan_dict()
    data["curves"][0]["nodes"] = ["MatMul_0"]
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(data))
    scan = ScanResult.load(path)
    assert scan.curve("fc1.weight").nodes == ("MatMul_0",)
    assert scan.curve("fc2.weight").shape == (32, 8) and scan.samples == 4


@pytest.fixture
def weights(tmp_path):
    rng = np.random.default_rng(0)
    params = {"fc.weight": rng.standard_normal((8, 16)).astype(np.float32), "fc.bias": np.ones(8, np.float32)}
    np.savez(tmp_path / "w.npz", **params)
    from safetensors.numpy import save_file

    save_file(params, str(tmp_path / "w.safetensors"))
    return params


@pytest.mark.parametrize("dim", ["5", "3", "-7", "2", "-3"])
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.slow
def test_nm_dim_out_of_range_is_refused(weights, tmp_path, dim, suffix):
    src, out = tmp_path / f"w{suffix}", tmp_path / f"out{suffix}"
    for extra in ([], ["--dry-run"]):
        proc = run(
            "prune",
            src,
            *(["-o", out] if not extra else extra),
            "--method",
            "nm_structured",
            "--nm",
            "2:4",
            "--dim",
            dim,
        )
        assert_error(proc, src, "'fc.weight'", f"Invalid index {dim} for tensor of size (8, 16)")
        assert not out.exists()
    proc = run("prune", src, "-o", out, "--method", "nm_structured", "--nm", "2:4", "--dim", "-1")
    assert proc.returncode == 0, proc.stderr
    from arrayprune.adapters import formats

    kept = formats.to_numpy(formats.load(str(out)).params["fc.weight"]) != 0
    assert (kept.reshape(8, 4, 4).sum(-1) == 2).all()


def test_a_folder_named_like_a_file_is_blamed_as_the_input(tmp_path):
    (tmp_path / "in.npz").mkdir()
    for extra in ([], ["--dry-run"]):
        line = assert_error(run("prune", "in.npz", "-o", "out.npz", "--amount", "0.5", *extra, cwd=tmp_path))
        assert line.startswith("arrayprune: error: in.npz: is a directory without"), line
    assert sorted(os.listdir(tmp_path)) == ["in.npz"]


@pytest.mark.parametrize(
    "norm, found", [(np.inf, "1 infinite of 16"), (np.nan, "1 NaN of 16"), (-1.0, "1 negative of 16")]
)
def test_input_norms_that_are_not_finite_are_refused_naming_the_tensor(weights, tmp_path, norm, found):
    norms = np.ones(16)
    norms[3] = norm
    np.savez(tmp_path / "norms.npz", **{"fc.weight": norms})
    out = tmp_path / "out.npz"
    proc = run(
        "prune",
        tmp_path / "w.npz",
        "-o",
        out,
        "--method",
        "wanda",
        "--amount",
        "0.5",
        "--input-norms",
        tmp_path / "norms.npz",
    )
    assert_error(proc, "'fc.weight'", "non-negative numbers, all finite", found)
    assert not out.exists()
