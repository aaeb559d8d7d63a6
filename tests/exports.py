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


def digits_mlp_split(folder: Path, hidden: tuple[int, ...] = (64, 32), max_iter: int = 300, seed: int = 0):
    """The digits MLP of ``benchmarks/digits_accuracy.py``: trained on 70% of the images.

    Returns ``(path of the .onnx file, training images, test images, test labels)``; the
    split is ``train_test_split(test_size=0.3, random_state=seed)``, pixels in [0, 1].
    """
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, data.target, test_size=0.3, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=hidden, max_iter=max_iter, random_state=seed).fit(x_train, y_train)
    path = folder / "digits.onnx"
    onx = skl2onnx.to_onnx(clf, x_train[:1], options={id(clf): {"zipmap": False}}, target_opset=17)
    path.write_bytes(onx.SerializeToString())
    return path, x_train, x_test, y_test
