"""``--global --shrink``: channels ranked across the channel groups of an ONNX graph.

Exactly ``round(amount * all channels)`` go; groups lose different counts; each group
keeps its best channel (never ranked). The core's choice is checked on hand-made
scores, the ONNX result against a NumPy reference of the same rule and against the
dense model with the dropped channels zeroed (onnxruntime).
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.groups import choose_channels_global
from conftest import to_numpy


@pytest.mark.parametrize(
    ("scores", "amount", "expected"),
    [
        # 5 channels, 2 go: the best of each group (5.0, 2.0) stay; of the rest (1, 3, 0.5) the two lowest go
        ([[1.0, 5.0, 3.0], [2.0, 0.5]], 0.4, [[1, 2], [0]]),
        # 3 go: all the rest; each group keeps its best
        ([[1.0, 5.0, 3.0], [2.0, 0.5]], 3, [[1], [0]]),
        # ties: the lower index goes first, in each group and across groups (group order)
        ([[1.0, 1.0], [1.0, 1.0]], 0.5, [[1], [1]]),
        ([[1.0, 1.0, 1.0], [1.0, 1.0]], 0.2, [[1, 2], [0, 1]]),
        # magnitudes rank (sign ignored); 0.5 * 7 rounds to 4: the three small ones, then 7.0
        ([[-9.0, 8.0, 7.0], [0.1, 0.3, -0.2, 0.4]], 0.5, [[0, 1], [3]]),
        # a group of large scores loses nothing
        ([[-9.0, 8.0, 7.0], [0.1, 0.3, -0.2, 0.4]], 0.4, [[0, 1, 2], [3]]),
        ([[4.0, 1.0]], 0.0, [[0, 1]]),
    ],
)
def test_choose_channels_global_hand_computed(backend, scores, amount, expected):
    got = choose_channels_global([backend.asarray(np.asarray(s, dtype=np.float32)) for s in scores], amount)
    assert [to_numpy(g).tolist() for g in got] == expected


def test_choose_channels_global_errors():
    two = [np.ones(3), np.ones(2)]
    with pytest.raises(ValueError, match="at most 3 can go"):
        choose_channels_global(two, 4)
    with pytest.raises(ValueError, match="at most 3 can go"):
        choose_channels_global(two, 0.9)  # round(4.5) = 4
    with pytest.raises(ValueError, match="1-D"):
        choose_channels_global([np.ones((2, 2))], 0.5)
    with pytest.raises(ValueError, match="no channel group"):
        choose_channels_global([], 0.5)
    with pytest.raises(TypeError):
        choose_channels_global(two, "half")


onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx  # noqa: E402


def two_group_mlp() -> onnx.ModelProto:
    """x [N, 8] -> relu(x W1 + b1) [6] -> relu(. W2 + b2) [10] -> . W3 [3]; W1 small: its group loses more."""
    rng = np.random.default_rng(7)
    w = {
        "W1": (0.2 * rng.standard_normal((8, 6))).astype(np.float32),
        "b1": rng.standard_normal(6).astype(np.float32),
        "W2": rng.standard_normal((6, 10)).astype(np.float32),
        "b2": rng.standard_normal(10).astype(np.float32),
        "W3": rng.standard_normal((10, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["h1"], name="relu1"),
        helper.make_node("MatMul", ["h1", "W2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="add2"),
        helper.make_node("Relu", ["a2"], ["h2"], name="relu2"),
        helper.make_node("MatMul", ["h2", "W3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_groups",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def reference(w: dict, amount: float) -> tuple[np.ndarray, np.ndarray]:
    """The kept channels of both groups by the rule, in float64."""
    s1 = np.sqrt((w["W1"].astype(np.float64) ** 2).sum(0) + (w["W2"].astype(np.float64) ** 2).sum(1))
    s2 = np.sqrt((w["W2"].astype(np.float64) ** 2).sum(0) + (w["W3"].astype(np.float64) ** 2).sum(1))
    k = round(amount * 16)
    best = {(0, int(np.argmax(s1))), (1, int(np.argmax(s2)))}
    rest = sorted(((s, g, i) for g, s_ in enumerate((s1, s2)) for i, s in enumerate(s_) if (g, i) not in best))
    gone = {(g, i) for _, g, i in rest[:k]}
    return tuple(np.array([i for i in range(n) if (g, i) not in gone]) for g, n in ((0, 6), (1, 10)))


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("amount", [0.25, 0.5, 0.75])
def test_global_shrink_onnx(amount):
    model = two_group_mlp()
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    small, report = shrink_onnx(model, amount, global_=True)
    k1, k2 = reference(w, amount)
    assert report.kept == {"mm1": k1.tolist(), "mm2": k2.tolist()}  # named after the nodes
    assert (6 - len(k1)) + (10 - len(k2)) == round(amount * 16)
    out = {t.name: numpy_helper.to_array(t) for t in small.graph.initializer}
    np.testing.assert_array_equal(out["W1"], w["W1"][:, k1])
    np.testing.assert_array_equal(out["b1"], w["b1"][k1])
    np.testing.assert_array_equal(out["W2"], w["W2"][k1][:, k2])
    np.testing.assert_array_equal(out["b2"], w["b2"][k2])
    np.testing.assert_array_equal(out["W3"], w["W3"][k2])
    onnx.checker.check_model(small, full_check=True)
    zeroed = {**w}
    zeroed["W2"] = w["W2"].copy()
    zeroed["W2"][np.setdiff1d(np.arange(6), k1)] = 0
    zeroed["W3"] = w["W3"].copy()
    zeroed["W3"][np.setdiff1d(np.arange(10), k2)] = 0
    dense = onnx.ModelProto()
    dense.CopyFrom(model)
    for t in dense.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(zeroed[t.name], t.name))
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(run(small, x), run(dense, x), rtol=1e-5, atol=1e-5)


def test_global_shrink_differs_from_per_group():
    model = two_group_mlp()
    _, per_group = shrink_onnx(model, 0.5)
    _, across = shrink_onnx(model, 0.5, global_=True)
    assert [len(v) for v in per_group.kept.values()] == [3, 5]
    assert [len(v) for v in across.kept.values()] != [3, 5]


def test_global_shrink_cli(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(two_group_mlp(), src)
    capsys.readouterr()
    code = main(
        ["prune", str(src), "-o", str(dst), "--shrink", "--global", "--method", "ln_structured", "--amount", "0.5",
         "--verify", "--verify-tol", "1e-5,1e-5"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), out
    k1, k2 = reference({t.name: numpy_helper.to_array(t) for t in two_group_mlp().graph.initializer}, 0.5)
    assert f"group mm1: 6 -> {len(k1)} channels kept" in out and f"group mm2: 10 -> {len(k2)} channels kept" in out
    assert "pass" in out
    code = main(["prune", str(src), "-o", str(tmp_path / "x.onnx"), "--shrink", "--global", "--method",
                 "ln_structured", "--amount", "15"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        f"arrayprune: error: {src}: --amount 15 with --global would remove 15 of the 16 channels of 2 channel "
        "groups; each keeps at least one, so at most 14 can go"
    ]
    assert not (tmp_path / "x.onnx").exists()
