"""Wanda against magnitude on a scikit-learn MLP exported to ONNX, through the command line.

The digits MLP of :mod:`benchmarks.digits_accuracy` (64-64-32-10, skl2onnx export:
``MatMul`` weights ``[K, N]``) is pruned with the real command line at 50%, 70% and 90%
of its layer weights, and evaluated with onnxruntime on the held-out images:

* magnitude, per layer: ``--method l1_unstructured``;
* magnitude, global: ``--method l1_unstructured --global``;
* magnitude per output unit: ``--method wanda --input-norms ones.npz`` (norms of 1:
  Wanda's grouping without its activations);
* Wanda: ``--method wanda --calibration calib.npz`` (256 training images);
* Wanda, global: ``--method l1_unstructured --global --calibration calib.npz``;
* 2:4 (50% only), by magnitude and by Wanda's scores: ``--method nm_structured --nm 2:4``
  without and with ``--calibration``.

The calibration cost (one onnxruntime pass over the calibration images, reduced to
norms) is measured in process: median time over repeats, and the peak resident memory
it adds (``VmHWM`` after a reset, as :mod:`benchmarks.memprobe` measures).

Usage::

    pip install -e ".[test,all,bench]"
    python -m benchmarks.wanda_digits    # writes benchmarks/results/wanda-digits.{md,png}
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .digits_accuracy import accuracy, digits_split, train_and_export
from .memprobe import _peak, _reset_peak, _status

AMOUNTS = (0.5, 0.7, 0.9)
CALIBRATION_SAMPLES = 256


def prune(src: Path, out: Path, extra: list[str]) -> None:
    """Run ``arrayprune prune SRC -o OUT --force EXTRA``."""
    cmd = [sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(out), "--force", *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def calibration_cost(model: Path, calib: dict[str, np.ndarray], repeats: int = 5) -> tuple[float, int]:
    """Median seconds and peak extra RSS (bytes) of computing every weight's input norms."""
    from arrayprune.adapters import formats
    from arrayprune.adapters.pipeline.calibration import onnx_input_norms
    from arrayprune.adapters.plan import file_roles

    wf = formats.load(str(model))
    weights = [str(p[-1]) for p, r in file_roles(wf).items() if r.kind == "weight"]
    onnx_input_norms(wf, calib, weights)  # warm-up: onnxruntime's first session
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        onnx_input_norms(wf, calib, weights)
        times.append(time.perf_counter() - t0)
    reset = _reset_peak()
    base = _status("VmRSS")
    onnx_input_norms(wf, calib, weights)
    extra = _peak() - base
    return statistics.median(times), extra if reset else -extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for wanda-digits.md and .png")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model, x_test, y_test, _ = train_and_export(folder)
        x_train = _training_images()
        calib_arrays = {"X": x_train[:CALIBRATION_SAMPLES]}
        calib = folder / "calib.npz"
        np.savez(calib, **calib_arrays)
        ones = folder / "ones.npz"
        from arrayprune.adapters import formats
        from arrayprune.adapters.plan import file_roles

        wf = formats.load(str(model))
        weights = {str(p[-1]): wf.params[str(p[-1])] for p, r in file_roles(wf).items() if r.kind == "weight"}
        np.savez(ones, **{n: np.ones(w.shape[0]) for n, w in weights.items()})  # [K, N]: one per K
        dense = accuracy(model, x_test, y_test)
        configs = [
            ("magnitude, per layer", ["--method", "l1_unstructured"], AMOUNTS),
            ("magnitude, global", ["--method", "l1_unstructured", "--global"], AMOUNTS),
            ("magnitude per output", ["--method", "wanda", "--input-norms", str(ones)], AMOUNTS),
            ("Wanda", ["--method", "wanda", "--calibration", str(calib)], AMOUNTS),
            ("Wanda, global", ["--method", "l1_unstructured", "--global", "--calibration", str(calib)], AMOUNTS),
            ("magnitude 2:4", ["--method", "nm_structured", "--nm", "2:4"], (None,)),
            ("Wanda 2:4", ["--method", "nm_structured", "--nm", "2:4", "--calibration", str(calib)], (None,)),
        ]
        results: dict[str, dict[float, float]] = {}
        for label, extra, amounts in configs:
            for amount in amounts:
                out = folder / "pruned.onnx"
                prune(model, out, extra + ([] if amount is None else ["--amount", str(amount)]))
                results.setdefault(label, {})[0.5 if amount is None else amount] = accuracy(out, x_test, y_test)
        seconds, extra_rss = calibration_cost(model, calib_arrays)
    lines = [
        "# Wanda against magnitude: digits MLP (scikit-learn, skl2onnx), through `arrayprune prune`",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- command: `python -m benchmarks.wanda_digits`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}",
        "- model: `MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0)` on 70% of"
        " `load_digits()`, test on the other 30%; the layer weights (`MatMul` B `[K, N]`) are pruned,"
        " the intercepts left",
        f"- calibration: the first {CALIBRATION_SAMPLES} training images, one pass over the dense model",
        f"- dense accuracy: {dense:.4f}",
        "",
        "| method | " + " | ".join(f"{a:.0%}" for a in AMOUNTS) + " |",
        "|---|" + "---|" * len(AMOUNTS),
    ]
    for label, accs in results.items():
        cells = [f"{accs[a]:.4f}" if a in accs else "" for a in AMOUNTS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    memory = f"{extra_rss / 2**20:.1f} MiB" if extra_rss >= 0 else f"at most {-extra_rss / 2**20:.1f} MiB"
    lines += [
        "",
        f"Calibration cost ({CALIBRATION_SAMPLES} images, batches of 64, all three weights): "
        f"{seconds * 1e3:.1f} ms (median of 5), peak extra resident memory {memory}.",
        "",
        "2:4 prunes exactly half of every weight, so its rows fill the 50% column only.",
        "",
        "Best at each sparsity: "
        + "; ".join(
            f"{a:.0%}: {max((accs[a], label) for label, accs in results.items() if a in accs)[1]}" for a in AMOUNTS
        )
        + ". Per-output methods (Wanda's comparison group) keep every output unit equally dense; on this small"
        " MLP, whose layers differ a lot in how much they can lose, a global ranking does better, and Wanda's"
        " scores help most there. The paper's gains are on large language models with outlier features,"
        " which this model does not have.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    target = Path(args.out)
    target.mkdir(parents=True, exist_ok=True)
    (target / "wanda-digits.md").write_text(text)
    _plot(results, dense, target / "wanda-digits.png")
    return 0


def _training_images() -> np.ndarray:
    """The training split of :func:`train_and_export`, in the same order."""
    return digits_split()[0]


def _plot(results: dict[str, dict[float, float]], dense: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, accs in results.items():
        xs = sorted(accs)
        style = "o" if len(xs) == 1 else "o-"
        ax.plot([100 * x for x in xs], [accs[x] for x in xs], style, label=label)
    ax.axhline(dense, color="gray", linestyle="--", label=f"dense ({dense:.3f})")
    ax.set_xlabel("sparsity of the layer weights (%)")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits MLP (ONNX): Wanda vs magnitude")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
