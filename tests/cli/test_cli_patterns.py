"""The command line's N:M, block and bounded/LAMP global options, and the report's new columns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import arrayprune as ap


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arrayprune", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture()
def weights(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "w.npz"
    np.savez(
        path,
        **{
            "big.weight": rng.standard_normal((64, 32)).astype(np.float32),
            "tiny.weight": (0.01 * rng.standard_normal((4, 8))).astype(np.float32),
            "big.bias": rng.standard_normal(64).astype(np.float32),
        },
    )
    return path


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
def test_nm_structured_writes_the_pattern(weights, tmp_path):
    out = tmp_path / "nm.npz"
    proc = run("prune", weights, "-o", out, "--method", "nm_structured", "--nm", "2:4")
    assert proc.returncode == 0, proc.stderr
    got, src = load(out), load(weights)
    for name in ("big.weight", "tiny.weight"):
        expected = src[name] * ap.nm_structured(src[name], 2, 4, -1)
        np.testing.assert_array_equal(got[name], expected)
        assert ap.is_nm_sparse(got[name], 2, 4)
    np.testing.assert_array_equal(got["big.bias"], src["big.bias"])
    report = json.loads(run("report", out, "--json").stdout)
    flags = {t["name"]: t["nm_2_4"] for t in report["tensors"]}
    assert flags == {"big.weight": True, "tiny.weight": True, "big.bias": False}
    dense = {t["name"]: t["bytes"]["dense"] for t in report["tensors"]}
    assert dense == {"big.weight": 64 * 32 * 4, "tiny.weight": 4 * 8 * 4, "big.bias": 64 * 4}
    assert (
        report["total"]["bytes"]["semi_structured_2_4"] == 64 * 32 * 2 + 64 * 32 // 8 + 4 * 8 * 2 + 4 * 8 // 8 + 64 * 4
    )
    text = run("report", out).stdout
    assert "2:4" in text and "storage: dense" in text


def test_block_unstructured_matches_the_core(weights, tmp_path):
    out = tmp_path / "block.npz"
    proc = run("prune", weights, "-o", out, "--method", "block_unstructured", "--amount", "0.5", "--block", "4x4")
    assert proc.returncode == 0, proc.stderr
    got, src = load(out), load(weights)
    for name in ("big.weight", "tiny.weight"):
        expected = src[name] * ap.block_unstructured(src[name], 0.5, (4, 4))
        np.testing.assert_array_equal(got[name], expected)


@pytest.mark.slow
def test_global_bounds_and_lamp_match_the_core(weights, tmp_path):
    src = load(weights)
    names = ["big.weight", "tiny.weight"]
    for extra, kwargs in (
        (["--max-sparsity", "0.7"], {"max_sparsity": 0.7}),
        (["--lamp"], {"normalization": "lamp"}),
    ):
        out = tmp_path / f"g{len(extra)}.npz"
        proc = run("prune", weights, "-o", out, "--amount", "0.6", "--global", *extra)
        assert proc.returncode == 0, proc.stderr
        expected = ap.global_unstructured([src[n] for n in names], ap.L1Unstructured, amount=0.6, **kwargs)
        got = load(out)
        for name, mask in zip(names, expected, strict=True):
            np.testing.assert_array_equal(got[name], src[name] * mask)
        assert (got["tiny.weight"] != 0).any()  # the small layer survives


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "nm_structured", "--amount", "0.5"], "not an --amount"),
        (["--method", "nm_structured", "--nm", "5:4"], "--nm"),
        (["--method", "block_unstructured"], "--amount is required"),
        (["--amount", "0.5", "--lamp"], "add --global"),
        (["--amount", "0.5", "--global", "--lamp", "--method", "random_unstructured"], "--lamp"),
        (["--method", "nm_structured", "--nm", "two:four"], "invalid pattern"),
    ],
)
def test_bad_pattern_options_are_one_line_errors(weights, tmp_path, args, message):
    out = tmp_path / "bad.npz"
    proc = run("prune", weights, "-o", out, *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 or "usage" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_block_larger_than_the_tensor_is_the_whole_tensor(tmp_path):
    src = tmp_path / "w.npz"
    w = np.arange(1, 257, dtype=np.float32).reshape(16, 16)
    np.savez(src, **{"a.weight": w, "b.weight": w[:4, :6]})
    # One block per tensor, the whole tensor: amount 1 prunes each of them entirely.
    out = tmp_path / "huge.npz"
    proc = run("prune", src, "-o", out, "--method", "block_unstructured", "--amount", "1", "--block", "100000x100000")
    assert proc.returncode == 0, proc.stderr
    got = load(out)
    np.testing.assert_array_equal(got["a.weight"], np.zeros((16, 16), np.float32))
    np.testing.assert_array_equal(got["b.weight"], np.zeros((4, 6), np.float32))
    # All rows by 3 columns: b.weight has two blocks, its first three columns the weaker.
    out = tmp_path / "columns.npz"
    proc = run("prune", src, "-o", out, "--method", "block_unstructured", "--amount", "1", "--block", "100000x3")
    assert proc.returncode == 0, proc.stderr
    expected = w[:4, :6].copy()
    expected[:, :3] = 0
    np.testing.assert_array_equal(load(out)["b.weight"], expected)


def test_nm_names_every_tensor_that_cannot_hold_the_pattern(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper
    from test_onnx_shrink import export

    from arrayprune.adapters.cli import main

    class Net(torch.nn.Module):
        """A 3-input-channel stem, a depthwise conv, a pointwise conv and a classifier."""

        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.c2 = torch.nn.Conv2d(8, 16, 1)
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            h = torch.relu(self.c2(torch.relu(self.dw(torch.relu(self.c1(x))))))
            return self.fc(h.mean(dim=(2, 3)))

    src, out = tmp_path / "cnn.onnx", tmp_path / "out.onnx"
    onnx.save(export(Net(), torch.randn(1, 3, 8, 8)), src)
    expected = [
        "arrayprune: warning: cannot hold 2:4: c1.weight: reduction axis (dim 1) of length 3 is not a multiple "
        "of 4: 2:4 leaves it 33.33% zero, not 50%",
        "arrayprune: warning: cannot hold 2:4: dw.weight: depthwise: reduction axis (dim 1) of length 1 is not a "
        "multiple of 4: 2:4 leaves it 0.00% zero, not 50%",
    ]
    capsys.readouterr()
    assert main(["prune", str(src), "--method", "nm_structured", "--dry-run"]) == 0
    printed, err = capsys.readouterr()
    assert err.splitlines() == expected
    assert "c1.weight  /c1/Conv  weight  8x3x3x3" in printed

    assert main(["prune", str(src), "-o", str(out), "--method", "nm_structured"]) == 0
    printed, err = capsys.readouterr()
    assert err.splitlines() == expected
    assert printed.splitlines()[0].startswith(
        f"pruned 4 tensors of {src} (nm_structured, 2:4; 2 of them cannot hold it, see the warnings): "
    )
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    sparsity = {k: float(np.mean(written[k] == 0)) for k in ("c1.weight", "dw.weight", "c2.weight", "fc.weight")}
    assert sparsity == {"c1.weight": 1 / 3, "dw.weight": 0.0, "c2.weight": 0.5, "fc.weight": 0.5}
