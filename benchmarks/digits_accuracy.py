"""Accuracy of a pruned scikit-learn MLP exported to ONNX, through the command line.

A scikit-learn ``MLPClassifier`` (64-64-32-10) is trained on scikit-learn's digits
(8x8 images, bundled, no download) and exported with skl2onnx. That export stores the
hidden-layer coefficients as ``MatMul`` weights ``[K, N]`` and the intercepts as 2-D
``[1, N]`` initializers fed to ``Add``. Each configuration is run with the real command
line, ``arrayprune prune model.onnx -o out.onnx ...``, and the pruned model is evaluated
with onnxruntime on the held-out images.

Configurations: the default selection (the layer weights, read from the graph) and, for
comparison, every floating initializer of two or more dimensions (the rank-and-dtype rule
that pruned the intercepts too), at 50%, 70% and 90% with one global threshold.

Usage::

    pip install -e ".[test,all]"        # scikit-learn, skl2onnx, onnxruntime
    python -m benchmarks.digits_accuracy   # writes benchmarks/results/digits-accuracy.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

AMOUNTS = (0.5, 0.7, 0.9)


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits scaled to [0, 1] as float32, split 70/30: ``x_train, x_test, y_train, y_test``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return tuple(train_test_split(x, data.target, test_size=0.3, random_state=seed))


def train_and_export(
    folder: Path, seed: int = 0, hidden: tuple[int, ...] = (64, 32)
) -> tuple[Path, np.ndarray, np.ndarray, float]:
    """Train the MLP (64-`hidden`-10), export it, and return the ONNX path, the test split and its accuracy."""
    from skl2onnx import to_onnx
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    x_train, x_test, y_train, y_test = digits_split(seed)
    clf = MLPClassifier(hidden_layer_sizes=hidden, max_iter=300, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train, y_train)
    path = folder / "digits.onnx"
    onx = to_onnx(clf, x_train[:1], options={id(clf): {"zipmap": False}}, target_opset=17)
    path.write_bytes(onx.SerializeToString())
    return path, x_test, y_test, float(clf.score(x_test, y_test))


def accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of an ONNX classifier (its first output: the labels)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    labels = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return float(np.mean(np.asarray(labels).reshape(-1) == y))


def initializers(path: Path) -> dict[str, np.ndarray]:
    """The initializers of an ONNX model, by name."""
    import onnx
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def prune(src: Path, out: Path, amount: float, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(out), "--global", "--force"]
    subprocess.run([*cmd, "--amount", str(amount), *extra], check=True, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for digits-accuracy.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model, x_test, y_test, sk_acc = train_and_export(folder)
        dense = accuracy(model, x_test, y_test)
        inits = initializers(model)
        rank_rule = [name for name, a in inits.items() if a.dtype.kind == "f" and a.ndim >= 2]
        dry = subprocess.run(
            [sys.executable, "-m", "arrayprune", "prune", str(model), "--dry-run", "--global", "--amount", "0.5"],
            capture_output=True,
            text=True,
        )
        rows = []
        for label, extra in (
            ("default selection (layer weights)", []),
            ("every float tensor of 2+ dims", ["--include", *rank_rule]),
        ):
            for amount in AMOUNTS:
                out = folder / f"p{len(rows)}.onnx"
                prune(model, out, amount, extra)
                after = initializers(out)
                changed = [n for n in inits if not np.array_equal(inits[n], after[n])]
                zeros = sum(int((after[n] == 0).sum()) for n in changed)
                rows.append((label, amount, accuracy(out, x_test, y_test), ", ".join(changed), zeros))
    lines = [
        "# Digits MLP (scikit-learn, exported by skl2onnx): accuracy after `arrayprune prune --global`",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- command: `python -m benchmarks.digits_accuracy`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}",
        "- model: `MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0)` on 70% of"
        " `load_digits()`, test on the other 30%",
        f"- dense accuracy: {dense:.4f} (onnxruntime; scikit-learn says {sk_acc:.4f})",
        "",
        "| selection | amount | test accuracy | tensors changed | zeros |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {s} | {a:.0%} | {acc:.4f} | {ch} | {z} |" for s, a, acc, ch, z in rows]
    lines += [
        "",
        "The plan (`arrayprune prune digits.onnx --dry-run --global --amount 0.5`):",
        "",
        "```text",
        dry.stdout.rstrip(),
        "```",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    target = Path(args.out) / "digits-accuracy.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
