"""Pictures: ``scan --plot`` and ``report --plot`` write valid PNGs of the expected size, with something drawn."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_builders import two_layer_relu  # noqa: E402
from test_scan import SPARSITIES, _weights  # noqa: E402

from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.pipeline.scan import Curve, ScanResult  # noqa: E402
from arrayprune.adapters.plots import (  # noqa: E402
    EMPTY_COLOR,
    NM_COLOR,
    OTHER_COLOR,
    percent_text,
    plot_scan,
    plot_sparsity,
    scan_picture,
    sparsity_bars,
)
from cli_helpers import assert_error, run  # noqa: E402


def _png(path) -> tuple[int, int, np.ndarray]:
    """Width, height (from the PNG header) and pixels of a PNG file."""
    from matplotlib import image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height, image.imread(str(path))


def _not_blank(pixels: np.ndarray) -> None:
    rgb = pixels[..., :3]
    assert rgb.std() > 0.05  # a blank (or one-colour) image has none
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plots")
    w1, w2, x = _weights()
    path = folder / "two.onnx"
    two_layer_relu(path, w1, w2)
    calib = folder / "calib.npz"
    np.savez(calib, X=x)
    return path, calib


@pytest.mark.slow
def test_scan_plot_is_a_line_plot_of_the_expected_size(two, tmp_path):
    path, calib = two
    png = tmp_path / "scan.png"
    proc = run("scan", path, "--calibration", calib, "-o", tmp_path / "s.json", "--plot", png)
    assert proc.returncode == 0, proc.stderr
    width, height, pixels = _png(png)
    assert (width, height) == (900, 520)
    assert pixels.shape[:2] == (520, 900)
    _not_blank(pixels)


@pytest.mark.slow
def test_many_weights_make_a_heat_map(tmp_path):
    rng = np.random.default_rng(0)
    curves = [Curve(f"layer{i}.weight", (8, 8), tuple(np.sort(rng.random(5)) * 10.0 ** -i)) for i in range(20)]
    png = tmp_path / "heat.png"
    plot_scan(ScanResult("l1_unstructured", SPARSITIES, curves, model="m"), png)
    width, height, pixels = _png(png)
    assert (width, height) == (900, 200 + 18 * 20)
    _not_blank(pixels)


@pytest.mark.slow
def test_report_plot_draws_a_bar_per_tensor(two, tmp_path):
    path, _ = two
    pruned = tmp_path / "p.onnx"
    assert run("prune", path, "-o", pruned, "--method", "nm_structured").returncode == 0
    png = tmp_path / "bars.png"
    proc = run("report", pruned, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    width, height, pixels = _png(png)
    assert (width, height) == (900, 180 + 22 * 2)
    _not_blank(pixels)
    # the 2:4 bars are green (#2a9d8f): some pixels of that colour
    green = np.all(np.abs(pixels[..., :3] - np.array([0x2A, 0x9D, 0x8F]) / 255) < 0.02, axis=-1)
    assert green.sum() > 1000
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_sparsity([{"name": "b", "prunable": False, "zeros": 0, "tied_to": None}], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_missing_matplotlib_is_one_line_naming_the_extra(two, tmp_path, capsys, monkeypatch):
    path, calib = two
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "s.json"
    args = ["scan", str(path), "--calibration", str(calib), "-o", str(out), "--plot", str(tmp_path / "a.png")]
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'pip install "arrayprune[plot]"' in err[0]
    assert not out.exists()  # checked before the scan
    assert main(["report", str(path), "--plot", str(tmp_path / "b.png")]) == 2
    assert "arrayprune[plot]" in capsys.readouterr().err
    assert_error(run("report", path, "--plot", tmp_path / "no" / "b.png"), "folder does not exist")


@pytest.fixture(scope="module")
def exported_mlp(tmp_path_factory):
    """A torch MLP on [N, 5, 16] exported by the legacy exporter: weights named
    ``onnx::MatMul_<n>``, read by ``/0/MatMul`` ... ``/8/MatMul``; initializers stored
    in reverse, so that file order and graph order differ."""
    torch = pytest.importorskip("torch")
    from test_onnx_shrink import export

    torch.manual_seed(0)
    layers: list = []
    for _ in range(4):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    model = export(torch.nn.Sequential(*layers, torch.nn.Linear(16, 3)), torch.randn(2, 5, 16))
    inits = list(model.graph.initializer)[::-1]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    folder = tmp_path_factory.mktemp("mlp")
    onnx.save(model, folder / "mlp.onnx")
    np.savez(folder / "calib.npz", x=np.random.default_rng(0).standard_normal((8, 5, 16)).astype(np.float32))
    return folder / "mlp.onnx", folder / "calib.npz", model


@pytest.mark.slow
def test_scan_plot_names_reading_nodes_in_graph_order(exported_mlp, tmp_path):
    path, calib, model = exported_mlp
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert all(n.input[1].startswith("onnx::MatMul_") for n in matmuls)
    png, out = tmp_path / "scan.png", tmp_path / "scan.json"
    proc = run("scan", path, "--calibration", calib, "--calibration-batch", "2", "-o", out, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    result = ScanResult.load(out)
    assert [c.name for c in result.curves] == [n.input[1] for n in matmuls]  # graph order, not file order
    picture = scan_picture(result)
    assert picture.labels == [n.name for n in matmuls] == [f"/{i}/MatMul" for i in (0, 2, 4, 6, 8)]
    values = [float(np.mean(c.errors)) for c in result.curves]
    expected = [i for i, v in enumerate(values) if v >= 10 * np.median(values[:i] + values[i + 1 :])]
    assert picture.fragile == expected == [4]  # the classifier, far above the others
    assert not picture.heat_map
    _not_blank(_png(png)[2])


def _curves(means: list[float]) -> list[Curve]:
    shape = (0.2, 0.6, 1.0, 1.4, 1.8)
    return [Curve(f"w{i}", (4, 4), tuple(m * f for f in shape), (f"/l{i}/MatMul",)) for i, m in enumerate(means)]


@pytest.mark.slow
def test_only_weights_well_above_the_median_are_fragile(tmp_path):
    alike = ScanResult("l1_unstructured", SPARSITIES, _curves([1.0, 1.3, 0.8, 1.1, 2.0]), model="m")
    picture = scan_picture(alike)
    assert picture.fragile == []  # the top 3 of alike weights are not fragile
    assert picture.legend.endswith("(none)") and "10x the median" in picture.legend
    one = ScanResult("l1_unstructured", SPARSITIES, _curves([1.0, 1.3, 40.0, 1.1, 2.0]), model="m")
    assert scan_picture(one).fragile == [2]
    assert scan_picture(one).labels == [f"/l{i}/MatMul" for i in range(5)]
    plot_scan(one, tmp_path / "one.png")
    plot_scan(alike, tmp_path / "alike.png")
    many = ScanResult("l1_unstructured", SPARSITIES, _curves([1.0 + 0.01 * i for i in range(20)]), model="m")
    assert scan_picture(many).heat_map and scan_picture(many).fragile == []
    heavy = _curves([1.0 + 0.01 * i for i in range(20)])
    heavy[7] = Curve("w7", (4, 4), tuple(30 * f for f in heavy[7].errors), heavy[7].nodes)
    heat = ScanResult("l1_unstructured", SPARSITIES, heavy, model="m")
    assert scan_picture(heat).fragile == [7]
    plot_scan(heat, tmp_path / "heat.png")
    for name in ("one", "alike", "heat"):
        _not_blank(_png(tmp_path / f"{name}.png")[2])


def test_nearly_empty_tensors_are_a_warning_not_2_4(tmp_path):
    rows = [
        {"name": "a", "prunable": True, "tied_to": None, "zeros": 512, "size": 1024, "sparsity": 0.5, "nm_2_4": True},
        {"name": "b", "prunable": True, "tied_to": None, "zeros": 9999, "size": 10000, "sparsity": 0.9999,
         "nm_2_4": True},
        {"name": "c", "prunable": True, "tied_to": None, "zeros": 300, "size": 1000, "sparsity": 0.3, "nm_2_4": False},
        {"name": "d", "prunable": True, "tied_to": None, "zeros": 64, "size": 64, "sparsity": 1.0, "nm_2_4": True},
    ]  # fmt: skip
    bars = sparsity_bars(rows)
    assert [(b.label, b.kind, b.color, b.text) for b in bars] == [
        ("a", "2:4", NM_COLOR, "50.0%"),
        ("b", "nearly empty", EMPTY_COLOR, "99.99%"),
        ("c", "other", OTHER_COLOR, "30.0%"),
        ("d", "nearly empty", EMPTY_COLOR, "100.0%"),
    ]
    assert (percent_text(0.99999), percent_text(0.00001), percent_text(0.999)) == ("99.999%", "0.001%", "99.9%")
    plot_sparsity(rows, tmp_path / "bars.png")
    pixels = _png(tmp_path / "bars.png")[2]
    red = np.all(np.abs(pixels[..., :3] - np.array([0xD6, 0x28, 0x28]) / 255) < 0.02, axis=-1)
    assert red.sum() > 1000
