"""``prune --allocation scan.json`` with calibration data: candidates checked jointly, against a NumPy forward."""

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
from arrayprune.adapters.pipeline.allocation import CANDIDATES, measure_allocations, refine_counts  # noqa: E402
from cli_helpers import run  # noqa: E402

SPARSITIES = [0.1, 0.3, 0.5, 0.7, 0.9]
AMOUNT, LOW, HIGH = 0.6, 0.1, 0.9
TOTAL = round(AMOUNT * (128 + 64))  # 115


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """``Y = relu(X @ W1) @ W2``; W2's small rows read W1's large hidden units (W2 is fragile)."""
    folder = tmp_path_factory.mktemp("joint")
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    w1[:, :2] *= 50
    w2[:2, :] /= 5
    x = rng.standard_normal((96, 8)).astype(np.float32)
    path = folder / "two.onnx"
    two_layer_relu(path, w1, w2)
    calib = folder / "calib.npz"
    np.savez(calib, X=x)
    # A misleading scan: it says W2 costs almost nothing and W1 a lot (one weight at a time
    # the truth is the other way round), so its allocation prunes W2 as far as allowed.
    scan = folder / "scan.json"
    curves = {"W1": [0.01, 0.05, 0.2, 0.5, 1.0], "W2": [1e-6, 2e-6, 3e-6, 4e-6, 5e-6]}
    scan.write_text(json.dumps({
        "format": "arrayprune scan", "version": 1, "method": "l1_unstructured", "sparsities": SPARSITIES,
        "outputs": ["Y"], "samples": 96,
        "curves": [{"name": n, "shape": list(w.shape), "errors": curves[n]} for n, w in (("W1", w1), ("W2", w2))],
    }))
    return path, calib, scan, w1, w2, x, curves


def _numpy(w1, w2, x, counts):
    """The relative squared error of ``Y`` with each weight's `counts` lowest Wanda scores zeroed."""
    x64 = x.astype(np.float64)
    h = np.maximum(x64 @ w1, 0)
    norms = [np.linalg.norm(x64, axis=0), np.linalg.norm(h, axis=0)]  # one per input feature (row of [K, N])
    pruned = []
    for w, n, k in zip((w1, w2), norms, counts, strict=True):
        scores = (np.abs(w.astype(np.float64)) * n[:, None]).ravel()
        flat = w.astype(np.float64).ravel().copy()
        flat[np.argsort(scores, kind="stable")[:k]] = 0
        pruned.append(flat.reshape(w.shape))
    y0 = h @ w2
    y = np.maximum(x64 @ pruned[0], 0) @ pruned[1]
    return float(((y - y0) ** 2).sum() / (y0**2).sum()), norms


def test_the_joint_check_replaces_a_misleading_scan(model, tmp_path):
    path, calib, scan, w1, w2, x, curves = model
    out = tmp_path / "out.onnx"
    bounds = {"min_sparsity": LOW, "max_sparsity": HIGH}
    result = prune_file(path, out, amount=AMOUNT, calibration=calib, allocation=scan, **bounds)
    a = result.allocation
    # the candidates, hand-computed: the scan's; uniform (76.8 and 38.4 -> 77 and 38, largest remainder first)
    expected_scan = ap.allocate_from_curves(list(curves.values()), [128, 64], AMOUNT, sparsities=SPARSITIES,
                                            min_sparsity=LOW, max_sparsity=HIGH)
    assert expected_scan == [TOTAL - 57, 57]  # W2 at its 90% bound (57 of 64)
    assert [a.candidates["scan"]["W1"], a.candidates["scan"]["W2"]] == expected_scan
    assert a.candidates["uniform"] == {"W1": 77, "W2": 38}
    # global: the 115 lowest Wanda scores of both weights at once
    _, norms = _numpy(w1, w2, x, [0, 0])
    s1, s2 = (np.abs(w.astype(np.float64)) * n[:, None] for w, n in zip((w1, w2), norms, strict=True))
    lowest = np.argsort(np.concatenate([s1.ravel(), s2.ravel()]), kind="stable")[:TOTAL]
    by_threshold = [int((lowest < 128).sum()), int((lowest >= 128).sum())]
    assert a.candidates["global"] == {"W1": by_threshold[0], "W2": by_threshold[1]}
    # every candidate: the exact total, within the bounds
    for counts in a.candidates.values():
        assert sum(counts.values()) == TOTAL
        assert LOW * 128 <= counts["W1"] <= HIGH * 128 and LOW * 64 <= counts["W2"] <= HIGH * 64
    # each measured error equals the NumPy forward's; the least one is chosen
    numpy_errors = {how: _numpy(w1, w2, x, [c["W1"], c["W2"]])[0] for how, c in a.candidates.items()}
    assert list(a.checked) == [*CANDIDATES, *(["refined"] if "refined" in a.checked else [])]
    for how, e in a.checked.items():
        assert e == pytest.approx(numpy_errors[how], rel=1e-4)
    assert a.chosen == min(a.checked, key=a.checked.get)
    assert a.chosen != "scan" and a.checked[a.chosen] < a.checked["scan"] / 2
    # the file holds the chosen counts
    assert a.counts == a.candidates[a.chosen]
    assert {n: z for n, (z, _) in result.written.by_tensor.items()} == a.counts
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    assert int((weights["W1"] == 0).sum()) + int((weights["W2"] == 0).sum()) == TOTAL

    # the dry run prints the same figures
    proc = run("prune", path, "--dry-run", "--amount", AMOUNT, "--calibration", calib, "--allocation", scan,
               "--min-sparsity", LOW, "--max-sparsity", HIGH)
    assert proc.returncode == 0, proc.stderr
    line = next(li for li in proc.stdout.splitlines() if li.startswith("checked jointly"))
    assert line.startswith("checked jointly on 96 calibration samples")
    figures = dict(part.split() for part in line.split(": ", 1)[1].split(";")[0].split(", "))
    assert set(figures) == set(a.checked)
    for how, text in figures.items():
        assert float(text) == pytest.approx(numpy_errors[how], rel=1e-4)
    assert line.endswith(f"chosen: {a.chosen}")
    shares = [li.split()[-1] for li in proc.stdout.splitlines() if li.startswith(("W1 ", "W2 "))]
    assert shares[-2:] == [f"{a.counts['W1']}/128", f"{a.counts['W2']}/64"]


def test_measure_allocations_from_python(model):
    path, calib, _, w1, w2, x, _ = model
    candidates = {"a": {"W1": 77, "W2": 38}, "b": {"W1": 100, "W2": 15}, "c": {"W1": 77, "W2": 38}}
    errors = measure_allocations(formats.load(str(path)), {"X": x}, candidates)
    x64 = x.astype(np.float64)
    y0 = np.maximum(x64 @ w1, 0) @ w2
    for how, c in candidates.items():  # magnitude masks without norms
        p1, p2 = (w.astype(np.float64).ravel() for w in (w1, w2))
        p1[np.argsort(np.abs(p1), kind="stable")[: c["W1"]]] = 0
        p2[np.argsort(np.abs(p2), kind="stable")[: c["W2"]]] = 0
        p1, p2 = p1.reshape(w1.shape), p2.reshape(w2.shape)
        y = np.maximum(x64 @ p1, 0) @ p2
        assert errors[how] == pytest.approx(((y - y0) ** 2).sum() / (y0**2).sum(), rel=1e-4)
    assert errors["a"] == errors["c"]  # the same counts are measured once


def test_refine_moves_entries_from_the_fragile_array_keeping_total_and_bounds():
    # error: 1 * s0^2 + 4 * s1^2 with s = count / 100; the optimum of 100 entries is 80 / 20
    def error(c):
        return (c[0] / 100) ** 2 + 4 * (c[1] / 100) ** 2

    start = [20, 80]
    counts, e = refine_counts(error, start, error(start), [0, 0], [100, 100], [1, 1], rounds=6, step=0.2)
    assert sum(counts) == 100 and e == error(counts) and e < error(start)
    assert counts[0] > 20  # the cheap array takes more
    # first round: slopes (error(21,80) - e0) / 20 ... the move is 20 entries -> 40 / 60, then 60 / 40, 80 / 20
    assert counts == [80, 20]
    # steps of 10 and 4 move by multiples of 20; a bound of 50 on the cheap array holds
    counts, e = refine_counts(error, start, error(start), [0, 0], [50, 100], [10, 4], rounds=6, step=0.2)
    assert counts == [40, 60] or counts == [50, 50]
    assert sum(counts) == 100 and counts[0] <= 50 and counts[0] % 10 == 0 and counts[1] % 4 == 0
    # nothing helps at the optimum: the start comes back
    assert refine_counts(error, [80, 20], error([80, 20]), [0, 0], [100, 100], [1, 1]) == ([80, 20], error([80, 20]))


def test_no_allocation_check_keeps_the_scans_counts(model):
    path, calib, scan, _, _, _, curves = model
    proc = run("prune", path, "--dry-run", "--amount", AMOUNT, "--calibration", calib, "--allocation", scan,
               "--min-sparsity", LOW, "--max-sparsity", HIGH, "--no-allocation-check")
    assert proc.returncode == 0, proc.stderr
    assert "checked jointly" not in proc.stdout
    shares = [li.split()[-1] for li in proc.stdout.splitlines() if li.startswith(("W1 ", "W2 "))]
    assert shares[-2:] == [f"{TOTAL - 57}/128", "57/64"]  # the misleading scan's own: W2 at its bound


def _magnitude_error(w1, w2, x, counts):
    """The relative squared error of ``Y`` on `x` with each weight's `counts` smallest magnitudes zeroed."""
    x64 = x.astype(np.float64)
    y0 = np.maximum(x64 @ w1, 0) @ w2
    pruned = []
    for w, k in zip((w1, w2), counts, strict=True):
        flat = w.astype(np.float64).ravel().copy()
        flat[np.argsort(np.abs(flat), kind="stable")[:k]] = 0
        pruned.append(flat.reshape(w.shape))
    y = np.maximum(x64 @ pruned[0], 0) @ pruned[1]
    return float(((y - y0) ** 2).sum() / (y0**2).sum())


def test_allocation_check_data_checks_magnitude_masks_from_the_command_line(model, tmp_path):
    # --calibration with l1_unstructured ranks by Wanda's scores; --allocation-check-data gives the
    # joint check its samples and makes no scores: magnitude masks, checked jointly.
    path, calib, scan, w1, w2, x, _ = model
    other = np.random.default_rng(7).standard_normal((40, 8)).astype(np.float32)
    check = tmp_path / "check.npz"
    np.savez(check, X=other)
    out = tmp_path / "out.onnx"
    bounds = {"min_sparsity": LOW, "max_sparsity": HIGH}
    result = prune_file(path, out, amount=AMOUNT, allocation=scan, allocation_check_data=check, **bounds)
    a = result.allocation
    assert a.samples == 40 and a.check_data == str(check)
    # global: one magnitude threshold over both weights
    lowest = np.argsort(np.abs(np.concatenate([w1.ravel(), w2.ravel()])), kind="stable")[:TOTAL]
    assert a.candidates["global"] == {"W1": int((lowest < 128).sum()), "W2": int((lowest >= 128).sum())}
    for how, e in a.checked.items():  # magnitude masks, measured on the check samples
        counts = [a.candidates[how]["W1"], a.candidates[how]["W2"]]
        assert e == pytest.approx(_magnitude_error(w1, w2, other, counts), rel=1e-4)
    assert a.chosen == min(a.checked, key=a.checked.get) and a.counts == a.candidates[a.chosen]
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for name, w in (("W1", w1), ("W2", w2)):  # the file: each weight's smallest magnitudes zeroed
        flat = w.ravel()
        want = np.ones(flat.size, bool)
        want[np.argsort(np.abs(flat), kind="stable")[: a.counts[name]]] = False
        np.testing.assert_array_equal(weights[name].ravel() != 0, want)

    proc = run("prune", path, "--dry-run", "--amount", AMOUNT, "--allocation", scan, "--allocation-check-data", check,
               "--min-sparsity", LOW, "--max-sparsity", HIGH)
    assert proc.returncode == 0, proc.stderr
    line = next(li for li in proc.stdout.splitlines() if li.startswith("checked jointly"))
    assert line.startswith(f"checked jointly on 40 samples of {check} (output error")
    assert line.endswith(f"chosen: {a.chosen}")


def test_allocation_check_data_with_calibration_measures_on_the_check_samples(model, tmp_path):
    # Wanda: norms (and SparseGPT's Hessians) from --calibration, the errors on the other samples
    path, calib, scan, w1, w2, x, _ = model
    other = np.random.default_rng(8).standard_normal((32, 8)).astype(np.float32)
    check = tmp_path / "check.npz"
    np.savez(check, X=other)
    result = prune_file(path, tmp_path / "o.onnx", amount=AMOUNT, calibration=calib, allocation=scan,
                        allocation_check_data=check, min_sparsity=LOW, max_sparsity=HIGH)
    a = result.allocation
    _, norms = _numpy(w1, w2, x, [0, 0])  # Wanda's norms from the calibration samples
    x64, y0 = other.astype(np.float64), np.maximum(other.astype(np.float64) @ w1, 0) @ w2
    for how, e in a.checked.items():
        pruned = []
        for w, n, k in zip((w1, w2), norms, (a.candidates[how]["W1"], a.candidates[how]["W2"]), strict=True):
            flat = w.astype(np.float64).ravel().copy()
            flat[np.argsort((np.abs(w.astype(np.float64)) * n[:, None]).ravel(), kind="stable")[:k]] = 0
            pruned.append(flat.reshape(w.shape))
        y = np.maximum(x64 @ pruned[0], 0) @ pruned[1]
        assert e == pytest.approx(float(((y - y0) ** 2).sum() / (y0**2).sum()), rel=1e-4)
    # SparseGPT: the Hessians from --calibration, the error on the check samples
    gpt = prune_file(path, tmp_path / "g.onnx", amount=AMOUNT, method="sparsegpt", calibration=calib,
                     allocation=scan, allocation_check_data=check)
    errors = measure_allocations(formats.load(str(path)), {"X": x}, gpt.allocation.candidates, method="sparsegpt",
                                 check_data={"X": other})
    assert errors == pytest.approx(gpt.allocation.checked)
    assert gpt.allocation.samples == 32


@pytest.mark.slow
def test_allocation_check_data_refusals(model, tmp_path):
    from cli_helpers import assert_error

    path, calib, scan, w1, w2, x, _ = model
    out = tmp_path / "p.onnx"
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation-check-data", calib),
                 "--allocation-check-data", "add --allocation SCAN.json")
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation", "owl", "--allocation-check-data",
                     calib), "add --allocation SCAN.json")
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation", scan, "--allocation-check-data",
                     calib, "--no-allocation-check"), "--no-allocation-check skips it: pass one")
    npz = tmp_path / "w.npz"
    np.savez(npz, W1=w1, W2=w2)
    assert_error(run("prune", npz, "-o", tmp_path / "p.npz", "--amount", "0.5", "--include", "W*", "--allocation",
                     scan, "--allocation-check-data", calib), "the joint check runs ONNX models only")
    bad = tmp_path / "bad.npz"
    np.savez(bad, Z=np.zeros((4, 8), np.float32))
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation", scan, "--allocation-check-data",
                     bad), "lacks graph input 'X'")
    assert not out.exists() and not (tmp_path / "p.npz").exists()


@pytest.mark.slow
def test_owl_m_and_lambda_flags(model, tmp_path):
    from cli_helpers import assert_error

    path, calib, scan, w1, w2, x, _ = model
    default = prune_file(path, tmp_path / "d.onnx", amount=0.5, allocation="owl")
    assert list(default.allocation.counts.values()) == ap.owl_allocation([w1, w2], 0.5)  # M = 5, lambda = 0.08
    assert prune_file(path, tmp_path / "d5.onnx", amount=0.5, allocation="owl", owl_m=5.0,
                      owl_lambda=0.08).allocation.counts == default.allocation.counts
    result = prune_file(path, tmp_path / "o.onnx", amount=0.5, allocation="owl", owl_m=2.0, owl_lambda=0.3)
    want = ap.owl_allocation([w1, w2], 0.5, m=2.0, lam=0.3)
    assert list(result.allocation.counts.values()) == want != list(default.allocation.counts.values())
    proc = run("prune", path, "--dry-run", "--amount", "0.5", "--allocation", "owl", "--owl-m", "2", "--owl-lambda",
               "0.3")
    assert proc.returncode == 0, proc.stderr
    shares = [li.split()[-1] for li in proc.stdout.splitlines() if li.startswith(("W1 ", "W2 "))]
    assert shares[-2:] == [f"{want[0]}/128", f"{want[1]}/64"]
    # with Wanda's scores (--method wanda --calibration): the flags reach the outliers among them
    wanda = prune_file(path, tmp_path / "w.onnx", amount=0.5, method="wanda", calibration=calib, allocation="owl",
                       owl_lambda=0.0)
    assert [k / n for k, n in zip(wanda.allocation.counts.values(), (128, 64), strict=True)] == [0.5, 0.5]

    out = tmp_path / "p.onnx"
    for args, fragment in (
        (["--owl-m", "0"], "invalid number '0': must be finite and > 0"),
        (["--owl-m", "-1"], "invalid number '-1'"),
        (["--owl-m", "nan"], "invalid number 'nan'"),
        (["--owl-m", "x"], "invalid number 'x'"),
        (["--owl-lambda", "1.5"], "invalid fraction '1.5': must be in [0, 1]"),
        (["--owl-lambda", "-0.1"], "invalid fraction '-0.1'"),
    ):
        assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation", "owl", *args), fragment)
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--owl-m", "3"),
                 "--owl-m applies to --allocation owl")
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--allocation", scan, "--owl-lambda", "0.1"),
                 "--owl-lambda applies to --allocation owl")
    from arrayprune.adapters.pipeline.request import PruneError

    for options, message in (
        ({"owl_m": 0}, "--owl-m: invalid value 0: must be a finite number > 0"),
        ({"owl_m": float("inf")}, "--owl-m: invalid value inf"),
        ({"owl_m": "5"}, "--owl-m: invalid value '5'"),
        ({"owl_lambda": 1.5}, r"--owl-lambda: invalid value 1.5: must be a fraction in \[0, 1\]"),
        ({"owl_lambda": True}, "--owl-lambda: invalid value True"),
    ):
        with pytest.raises(PruneError, match=message):
            prune_file(path, out, amount=0.5, allocation="owl", **options)
    assert not out.exists()
