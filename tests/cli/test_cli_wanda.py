"""``arrayprune prune --method wanda``: calibration on ONNX, input norms elsewhere, errors.

Masks are compared with NumPy references written here: input norms from a NumPy
forward pass of the model, scores ``|W| * norm``, then `reference_wanda` (per output
unit), `reference_keep` (global) or a 2:4 selection along K.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from exports import digits_mlp  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from test_wanda import reference_wanda  # noqa: E402

from cli_helpers import EXAMPLE, assert_error, run  # noqa: E402
from conftest import reference_keep  # noqa: E402


def _initializers(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def _norms(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return np.sqrt((a.reshape(-1, a.shape[-1]) ** 2).sum(axis=0))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """skl2onnx's digits MLP (MatMul B [K, N]), its weights by layer, and calibration data."""
    folder = tmp_path_factory.mktemp("digits")
    clf, path, x = digits_mlp(folder)
    calib = folder / "calib.npz"
    np.savez(calib, X=x[:200])
    inits = _initializers(path)
    names = [next(n for n, v in inits.items() if np.array_equal(v, c.astype(np.float32))) for c in clf.coefs_]
    # input norms of each layer from a NumPy forward pass
    norms, h = [], x[:200].astype(np.float64)
    for w, b in zip(clf.coefs_, clf.intercepts_, strict=True):
        norms.append(_norms(h))
        h = np.maximum(h @ w + b, 0)
    return path, calib, names, [inits[n] for n in names], norms


def test_wanda_on_matmul_weights_prunes_each_output_column(digits, tmp_path):
    path, calib, names, weights, norms = digits
    out = tmp_path / "w.onnx"
    proc = run("prune", path, "-o", out, "--method", "wanda", "--amount", "0.6", "--calibration", calib)
    assert proc.returncode == 0, proc.stderr
    after = _initializers(out)
    for name, w, n in zip(names, weights, norms, strict=True):
        keep = reference_wanda(np.abs(w) * n[:, None], 0.6, dim=1)
        np.testing.assert_array_equal(after[name], w * keep)
        assert ((after[name] == 0).sum(axis=0) == round(0.6 * w.shape[0])).all()
    before = _initializers(path)
    for name, arr in after.items():
        if name not in names:
            np.testing.assert_array_equal(arr, before[name])


@pytest.mark.slow
def test_wanda_scores_feed_two_four_and_global(digits, tmp_path):
    path, calib, names, weights, norms = digits
    out = tmp_path / "nm.onnx"
    proc = run("prune", path, "-o", out, "--method", "nm_structured", "--nm", "2:4", "--calibration", calib)
    assert proc.returncode == 0, proc.stderr
    after = _initializers(out)
    for name, w, n in zip(names, weights, norms, strict=True):
        scores = (np.abs(w) * n[:, None]).T.reshape(w.shape[1], -1, 4)  # runs of 4 along K, per column
        keep = np.ones_like(scores, dtype=bool)
        for c in range(scores.shape[0]):
            for g in range(scores.shape[1]):
                keep[c, g, np.argsort(scores[c, g], kind="stable")[:2]] = False
        np.testing.assert_array_equal(after[name] != 0, keep.reshape(w.shape[1], -1).T | (w == 0))
    out = tmp_path / "g.onnx"
    proc = run(
        "prune", path, "-o", out, "--global", "--amount", "0.7", "--calibration", calib, "--calibration-batch", 7
    )
    assert proc.returncode == 0, proc.stderr
    after = _initializers(out)
    keeps = reference_keep(
        [np.abs(w) * n[:, None] for w, n in zip(weights, norms, strict=True)], round(0.7 * sum(w.size for w in weights))
    )
    for name, w, keep in zip(names, weights, keeps, strict=True):
        np.testing.assert_array_equal(after[name], w * keep)


def test_gemm_trans_b_weights_prune_each_row(tmp_path):
    inits = _initializers(EXAMPLE)
    x = np.random.default_rng(1).standard_normal((30, 64)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", input=x)
    out = tmp_path / "w.onnx"
    proc = run(
        "prune", EXAMPLE, "-o", out, "--method", "wanda", "--amount", "0.25", "--calibration", tmp_path / "calib.npz"
    )
    assert proc.returncode == 0, proc.stderr
    w1 = inits["fc1.weight"]  # [N, K]: Gemm transB=1
    keep = reference_wanda(np.abs(w1) * _norms(x)[None, :], 0.25, dim=0)
    np.testing.assert_array_equal(_initializers(out)["fc1.weight"], w1 * keep)


def _safetensors_model(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(2)
    tensors = {
        "encoder.layer.0.attention.self.query.weight": rng.standard_normal((8, 12)).astype(np.float32),
        "encoder.layer.0.attention.self.query.bias": rng.standard_normal(8).astype(np.float32),
        "encoder.layer.0.output.dense.weight": np.round(rng.standard_normal((12, 8)), 1).astype(np.float32),
    }
    path = tmp_path / "model.safetensors"
    st.save_file(tensors, str(path))
    norms = {
        "encoder.layer.0.attention.self.query.weight": rng.random(12) * 4,
        "encoder.layer.0.output.dense.weight": np.ones(8),  # ties: magnitude per row, by position
    }
    np.savez(tmp_path / "norms.npz", **norms)
    return path, tensors, norms


@pytest.mark.slow
def test_input_norms_on_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path, tensors, norms = _safetensors_model(tmp_path)
    out = tmp_path / "out.safetensors"
    proc = run(
        "prune", path, "-o", out, "--method", "wanda", "--amount", "0.5", "--input-norms", tmp_path / "norms.npz"
    )
    assert proc.returncode == 0, proc.stderr
    after = st.load_file(str(out))
    for name, n in norms.items():
        w = tensors[name]  # [out, in]: per row, norms along axis 1
        np.testing.assert_array_equal(after[name], w * reference_wanda(np.abs(w) * n[None, :], 0.5, dim=0))
    bias = "encoder.layer.0.attention.self.query.bias"
    np.testing.assert_array_equal(after[bias], tensors[bias])
    out = tmp_path / "global.safetensors"
    proc = run("prune", path, "-o", out, "--global", "--amount", 30, "--input-norms", tmp_path / "norms.npz")
    assert proc.returncode == 0, proc.stderr
    after = st.load_file(str(out))
    names = list(norms)
    keeps = reference_keep([np.abs(tensors[k]) * norms[k][None, :] for k in names], 30)
    for name, keep in zip(names, keeps, strict=True):
        np.testing.assert_array_equal(after[name], tensors[name] * keep)


@pytest.mark.slow
def test_errors_are_one_line(digits, tmp_path):
    path, calib, *_ = digits
    out = tmp_path / "o.onnx"
    assert_error(
        run("prune", path, "-o", out, "--method", "wanda", "--amount", "0.5"), "needs input norms", "--calibration"
    )
    assert_error(
        run("prune", path, "-o", out, "--method", "ln_structured", "--amount", "0.5", "--calibration", calib),
        "not for ln_structured",
    )
    assert_error(
        run("prune", path, "-o", out, "--amount", "0.5", "--calibration", calib, "--input-norms", calib), "pass one"
    )
    assert_error(run("prune", path, "-o", out, "--amount", "0.5", "--calibration-batch", 4), "needs --calibration")
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.ones((4, 64), np.float32))
    assert_error(
        run("prune", path, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration", bad),
        "lacks graph input 'X'",
    )
    np.savez(bad, X=np.ones((4, 63), np.float32))
    assert_error(
        run("prune", path, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration", bad),
        "onnxruntime cannot run",
    )
    assert not out.exists()
    st_path, _, _ = _safetensors_model(tmp_path)
    assert_error(
        run(
            "prune",
            st_path,
            "-o",
            tmp_path / "o.safetensors",
            "--method",
            "wanda",
            "--amount",
            "0.5",
            "--calibration",
            calib,
        ),
        "IN must be an ONNX model",
    )
    np.savez(bad, other=np.ones(3))
    assert_error(
        run(
            "prune",
            st_path,
            "-o",
            tmp_path / "o.safetensors",
            "--method",
            "wanda",
            "--amount",
            "0.5",
            "--input-norms",
            bad,
        ),
        "no input norms for",
    )
    np.savez(
        bad,
        **{
            "encoder.layer.0.attention.self.query.weight": np.ones(5),
            "encoder.layer.0.output.dense.weight": np.ones(8),
        },
    )
    assert_error(
        run(
            "prune",
            st_path,
            "-o",
            tmp_path / "o.safetensors",
            "--method",
            "wanda",
            "--amount",
            "0.5",
            "--input-norms",
            bad,
        ),
        "one norm per input feature",
    )
    assert not (tmp_path / "o.safetensors").exists()


def _gather_model(path):
    """ids (int64 [N, 3]) -> Gather from E [10, 8] -> MatMul W [8, 4]."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4])],
        [
            numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "E"),
            numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.parametrize("method", [["--method", "wanda", "--amount", "0.5"], ["--method", "nm_structured"]])
@pytest.mark.slow
def test_calibration_values_are_checked_in_one_line(tmp_path, method):
    out = tmp_path / "w.onnx"
    x = np.ones((4, 64), np.float32)
    x[1, 3], x[2, 5], x[3, 7] = np.nan, np.inf, -np.inf
    np.savez(tmp_path / "nan.npz", input=x)
    line = assert_error(run("prune", EXAMPLE, "-o", out, *method, "--calibration", tmp_path / "nan.npz"))
    assert line.endswith("--calibration: calibration input 'input': 3 of 256 values are not finite (NaN or infinity)")
    wide = np.ones((4, 64))
    wide[0, 0], wide[3, 1] = 1e300, -4e38  # float32 holds up to 3.4e38
    np.savez(tmp_path / "wide.npz", input=wide)
    line = assert_error(run("prune", EXAMPLE, "-o", out, *method, "--calibration", tmp_path / "wide.npz"))
    assert line.endswith(
        "--calibration: calibration input 'input': 2 float64 values lie beyond float32's range "
        "(the model takes float32)"
    )
    assert not out.exists()


@pytest.mark.slow
def test_out_of_range_token_ids_are_one_line(tmp_path):
    model = tmp_path / "gather.onnx"
    _gather_model(model)
    np.savez(tmp_path / "ids.npz", ids=np.array([[1, 2, 100]], np.int64))
    out = tmp_path / "o.onnx"
    line = assert_error(
        run("prune", model, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration", tmp_path / "ids.npz"),
        "onnxruntime cannot run the calibration data",
        "idx=100",
    )
    assert "Gather" in line
    assert not out.exists()
    np.savez(tmp_path / "ids.npz", ids=np.array([[1, 2, 9]], np.int64))  # in range: calibrates
    assert run(
        "prune", model, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration", tmp_path / "ids.npz"
    ).returncode == 0
