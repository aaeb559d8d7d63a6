"""``arrayprune scan`` and ``prune --allocation``: curves against a NumPy forward, rankings, shares, errors.

The model is ``Y = relu(X @ W1) @ W2`` (ONNX ``MatMul`` B ``[K, N]``), built here. Two of
its hidden units carry activations 50 times the others while their rows of ``W2`` are
5 times smaller: they carry most of the output, and magnitude pruning of ``W2`` removes
them first, so ``W2`` is the fragile layer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402
from onnx_builders import two_layer_relu  # noqa: E402

import arrayprune as ap  # noqa: E402
from arrayprune.adapters import formats, prune_file  # noqa: E402
from arrayprune.adapters.pipeline.scan import ScanResult, scan_arrays, scan_onnx  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from conftest import reference_keep  # noqa: E402

SPARSITIES = (0.1, 0.3, 0.5, 0.7, 0.9)


def _weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    w1[:, :2] *= 50  # large activations in hidden units 0 and 1 ...
    w2[:2, :] /= 5  # ... read by the smallest weights of W2, which carry most of the output
    x = rng.standard_normal((96, 8)).astype(np.float32)
    return w1, w2, x


def _forward(w1: np.ndarray, w2: np.ndarray, x: np.ndarray) -> np.ndarray:
    x, w1, w2 = (np.asarray(a, np.float64) for a in (x, w1, w2))
    return np.maximum(x @ w1, 0) @ w2


def _l1(w: np.ndarray, s: float) -> np.ndarray:
    return w * reference_keep([w], round(s * w.size))[0]


def _rse(y: np.ndarray, y0: np.ndarray) -> float:
    return float(((y - y0) ** 2).sum() / (y0**2).sum())


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two")
    w1, w2, x = _weights()
    path = folder / "two.onnx"
    two_layer_relu(path, w1, w2)
    calib = folder / "calib.npz"
    np.savez(calib, X=x)
    return path, calib, w1, w2, x


def test_curves_equal_a_numpy_forward_and_rank_the_fragile_layer_first(two):
    path, calib, w1, w2, x = two
    result = scan_onnx(formats.load(str(path)), {"X": x}, sparsities=SPARSITIES, calibration_batch=40)
    assert [c.name for c in result.curves] == ["W1", "W2"]
    assert [c.name for c in result.ranked()] == ["W2", "W1"]
    y0 = _forward(w1, w2, x)
    for i in (1, 3):  # 30% and 70%
        s = SPARSITIES[i]
        assert result.curve("W1").errors[i] == pytest.approx(_rse(_forward(_l1(w1, s), w2, x), y0), rel=1e-4)
        assert result.curve("W2").errors[i] == pytest.approx(_rse(_forward(w1, _l1(w2, s), x), y0), rel=1e-4)
    assert all(a > b for a, b in zip(result.curve("W2").errors, result.curve("W1").errors, strict=True))
    assert result.outputs == ["Y"] and result.samples == 96 and result.sparsities == SPARSITIES
    # any value of the graph can be compared: the hidden activations see W1 only
    hidden = scan_onnx(formats.load(str(path)), {"X": x}, sparsities=SPARSITIES, outputs=["R"], include=["W1"])
    r0 = np.maximum(x.astype(np.float64) @ w1, 0)
    expected = _rse(np.maximum(x.astype(np.float64) @ _l1(w1, 0.5), 0), r0)
    assert hidden.outputs == ["R"] and hidden.curve("W1").errors[2] == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="'nope' is no value"):
        scan_onnx(formats.load(str(path)), {"X": x}, sparsities=SPARSITIES, outputs=["nope"])


def test_wanda_and_sparsegpt_curves_equal_a_numpy_forward(two):
    path, _, w1, w2, x = two
    y0 = _forward(w1, w2, x)
    wf = formats.load(str(path))
    wanda = scan_onnx(wf, {"X": x}, method="wanda", sparsities=SPARSITIES)
    norms = np.sqrt((np.maximum(x.astype(np.float64) @ w1, 0) ** 2).sum(axis=0))  # W2's input features
    scores = np.abs(w2) * norms[:, None]
    keep = np.ones_like(w2, bool)
    for j in range(w2.shape[1]):  # each output unit (column of MatMul B) loses round(0.5 * 16) = 8
        keep[np.argsort(scores[:, j], kind="stable")[:8], j] = False
    assert wanda.curve("W2").errors[2] == pytest.approx(_rse(_forward(w1, w2 * keep, x), y0), rel=1e-4)
    gpt = scan_onnx(wf, {"X": x}, method="sparsegpt", sparsities=SPARSITIES)
    r = np.maximum(x.astype(np.float64) @ w1, 0)
    new, _ = ap.sparsegpt(w2, r.T @ r / len(r), 0.5, reduction_axis=0)
    assert gpt.curve("W2").errors[2] == pytest.approx(_rse(_forward(w1, np.asarray(new), x), y0), rel=1e-3)
    # SparseGPT updates what it keeps: less error than magnitude on the fragile layer
    magnitude = scan_onnx(wf, {"X": x}, sparsities=SPARSITIES)
    assert gpt.curve("W2").errors[2] < magnitude.curve("W2").errors[2]


def test_scan_arrays_with_a_numpy_forward_matches_onnx(two):
    path, _, w1, w2, x = two
    params = {"fc1.weight": w1.T.copy(), "fc2.weight": w2.T.copy()}  # PyTorch layout [out, in]

    def forward(w):
        return _forward(w["fc1.weight"].T, w["fc2.weight"].T, x)

    ours = scan_arrays(params, forward, sparsities=SPARSITIES)
    theirs = scan_onnx(formats.load(str(path)), {"X": x}, sparsities=SPARSITIES)
    assert [c.name for c in ours.ranked()] == ["fc2.weight", "fc1.weight"]
    for a, b in (("fc1.weight", "W1"), ("fc2.weight", "W2")):
        np.testing.assert_allclose(ours.curve(a).errors, theirs.curve(b).errors, rtol=1e-4)
    with pytest.raises(ValueError, match="input_norms"):
        scan_arrays(params, forward, method="wanda", sparsities=SPARSITIES)
    with pytest.raises(ValueError, match="at least 5"):
        scan_arrays(params, forward, sparsities=(0.1, 0.5))
    zero = {name: np.zeros((w.shape[1], w.shape[1])) for name, w in params.items()}
    with pytest.raises(ValueError, match=r"^'fc1.weight': the Hessian is all zero"):
        scan_arrays(params, forward, method="sparsegpt", hessians=zero, sparsities=SPARSITIES)


@pytest.mark.slow
def test_cli_scan_writes_the_curves_and_allocation_follows_them(two, tmp_path):
    path, calib, w1, w2, _ = two
    out = tmp_path / "scan.json"
    proc = run("scan", path, "--calibration", calib, "-o", out, "--sparsities", "0.1,0.3,0.5,0.7,0.9")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    data = json.loads(out.read_text())
    assert data["method"] == "l1_unstructured" and data["sparsities"] == list(SPARSITIES)
    result = ScanResult.load(out)
    lines = proc.stdout.splitlines()
    assert lines[2].startswith("W2") and lines[3].startswith("W1")  # most fragile first
    theirs = scan_onnx(formats.load(str(path)), {"X": np.load(calib)["X"]}, sparsities=SPARSITIES)
    assert result.curves == theirs.curves

    pruned = tmp_path / "pruned.onnx"
    proc = run("prune", path, "-o", pruned, "--amount", "0.6", "--allocation", out, "--max-sparsity", "0.9")
    assert proc.returncode == 0, proc.stderr
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(pruned)).graph.initializer}
    zeros = {n: int((w == 0).sum()) for n, w in weights.items()}
    assert zeros["W1"] + zeros["W2"] == round(0.6 * (128 + 64))  # exact total
    assert zeros["W1"] <= 0.9 * 128 and zeros["W2"] / 64 < zeros["W1"] / 128  # bound; fragile layer gets less
    counts = ap.allocate_from_curves(
        [c.errors for c in result.curves], [128, 64], 0.6, sparsities=SPARSITIES, max_sparsity=0.9
    )
    assert [zeros["W1"], zeros["W2"]] == counts
    # magnitude within each layer: the entries kept are the largest
    np.testing.assert_array_equal(weights["W2"], _l1(w2, counts[1] / 64))

    proc = run("prune", path, "--dry-run", "--amount", "0.6", "--allocation", out, "--max-sparsity", "0.9")
    assert proc.returncode == 0, proc.stderr
    shares = [line.split() for line in proc.stdout.splitlines() if line.startswith(("W1 ", "W2 "))]
    assert [s[-1] for s in shares[-2:]] == [f"{counts[0]}/128", f"{counts[1]}/64"]


def test_prune_file_allocation_owl_and_sparsegpt(two, tmp_path):
    path, calib, w1, w2, x = two
    result = prune_file(path, tmp_path / "owl.onnx", amount=0.5, allocation="owl")
    # magnitudes: W1 has 2 of 16 columns 50x larger (outliers), W2 none above 5 means -> W1 pruned less
    assert result.allocation.counts == dict(zip(["W1", "W2"], ap.owl_allocation([w1, w2], 0.5), strict=True))
    assert sum(result.allocation.counts.values()) == 96
    assert result.allocation.sparsity("W1") < result.allocation.sparsity("W2")
    scan = tmp_path / "scan.json"
    scan_onnx(formats.load(str(path)), {"X": x}, sparsities=SPARSITIES).save(scan)
    checked = prune_file(path, tmp_path / "c.onnx", amount=0.6, method="sparsegpt", calibration=calib, allocation=scan)
    assert checked.allocation.counts == checked.allocation.candidates[checked.allocation.chosen]
    # allocation_check=False: the scan's own allocation, not checked jointly
    result = prune_file(
        path, tmp_path / "gpt.onnx", amount=0.6, method="sparsegpt", calibration=calib, allocation=scan,
        allocation_check=False,
    )
    assert result.allocation.checked == {} and result.allocation.chosen == "scan"
    assert result.allocation.counts == checked.allocation.candidates["scan"]
    assert sum(result.allocation.counts.values()) == round(0.6 * 192)
    assert result.allocation.amounts == result.allocation.counts  # SparseGPT takes entry counts
    zeros = result.written.by_tensor
    assert zeros["W1"][0] == result.allocation.counts["W1"]
    # W2 loses its count, and the rows of hidden units W1's pruning left dead (SparseGPT zeroes those)
    assert zeros["W2"][0] >= result.allocation.counts["W2"]
    assert result.allocation.sparsity("W2") < result.allocation.sparsity("W1")
    # wanda moves in whole steps of its output units (16 columns of W1, 4 of W2)
    result = prune_file(
        path, tmp_path / "w.onnx", amount=0.5, method="wanda", calibration=calib, allocation=scan, force=True
    )
    assert result.allocation.counts["W1"] % 16 == 0 and result.allocation.counts["W2"] % 4 == 0
    assert result.written.pruned.zeros == sum(result.allocation.counts.values())


@pytest.mark.slow
def test_errors_are_one_line_and_nothing_is_written(two, tmp_path):
    path, calib, w1, w2, _ = two
    out = tmp_path / "scan.json"
    npz = tmp_path / "w.npz"
    np.savez(npz, **{"fc.weight": w1})
    assert_error(run("scan", npz, "--calibration", calib, "-o", out), "IN must be an ONNX model", "scan_arrays")
    assert_error(run("scan", path, "--calibration", calib, "-o", out, "--sparsities", "0.1,0.5"), "at least 5")
    assert_error(run("scan", path, "--calibration", calib, "-o", out, "--sparsities", "0.1,0.3,0.2,0.5,0.9"), "ascend")
    bad = tmp_path / "bad.npz"
    np.savez(bad, Z=np.zeros((4, 8), np.float32))
    assert_error(run("scan", path, "--calibration", bad, "-o", out), "lacks graph input 'X'")
    assert not out.exists()
    out.write_text("{}")
    assert_error(run("scan", path, "--calibration", calib, "-o", out), "exists; use --force")
    assert_error(run("prune", path, "-o", tmp_path / "p.onnx", "--amount", "0.5", "--allocation", out), "not a scan")
    assert_error(
        run("prune", path, "-o", tmp_path / "p.onnx", "--amount", "0.5", "--allocation", "owl", "--global"),
        "--allocation",
        "--global",
    )
    assert_error(run("prune", path, "-o", tmp_path / "p.onnx", "--allocation", "owl"), "give --amount")
    scan = tmp_path / "one.json"
    scan_onnx(formats.load(str(path)), {"X": np.load(calib)["X"]}, sparsities=SPARSITIES, include=["W1"]).save(scan)
    assert_error(
        run("prune", path, "-o", tmp_path / "p.onnx", "--amount", "0.5", "--allocation", scan), "no curve for 'W2'"
    )
    assert_error(
        run(
            "prune", path, "-o", tmp_path / "p.onnx", "--amount", "0.9", "--allocation", scan,
            "--include", "W1", "--max-sparsity", "0.5",
        ),
        "cannot prune",
    )
    assert not (tmp_path / "p.onnx").exists()
