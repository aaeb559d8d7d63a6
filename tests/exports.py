"""Models exported by tools nobody here wrote, built once per test module that asks."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest


def digits_mlp(folder: Path, hidden: tuple[int, ...] = (32, 16), max_iter: int = 50):
    """A scikit-learn MLP on the digits (pixels scaled to [0, 1]), exported by skl2onnx.

    Returns ``(classifier, path of the .onnx file, images)``; the export stores the
    layer weights as ``MatMul`` B ``[K, N]`` and the graph input is named ``X``.
    """
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    onnx = pytest.importorskip("onnx")
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=hidden, max_iter=max_iter, random_state=0).fit(x, y)
    path = folder / "mlp.onnx"
    onnx.save_model(skl2onnx.to_onnx(clf, x[:1], options={"zipmap": False}), str(path))
    return clf, path, x
