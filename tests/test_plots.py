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
from arrayprune.adapters.plots import plot_scan, plot_sparsity  # noqa: E402
from arrayprune.adapters.scan import Curve, ScanResult  # noqa: E402
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


def test_scan_plot_is_a_line_plot_of_the_expected_size(two, tmp_path):
    path, calib = two
    png = tmp_path / "scan.png"
    proc = run("scan", path, "--calibration", calib, "-o", tmp_path / "s.json", "--plot", png)
    assert proc.returncode == 0, proc.stderr
    width, height, pixels = _png(png)
    assert (width, height) == (900, 520)
    assert pixels.shape[:2] == (520, 900)
    _not_blank(pixels)


def test_many_weights_make_a_heat_map(tmp_path):
    rng = np.random.default_rng(0)
    curves = [Curve(f"layer{i}.weight", (8, 8), tuple(np.sort(rng.random(5)) * 10.0 ** -i)) for i in range(20)]
    png = tmp_path / "heat.png"
    plot_scan(ScanResult("l1_unstructured", SPARSITIES, curves, model="m"), png)
    width, height, pixels = _png(png)
    assert (width, height) == (900, 200 + 18 * 20)
    _not_blank(pixels)


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
