"""Heads of a fused QKV projection split by ``Split``, on graphs built by hand (fast).

``Y = attention(split(X @ W + b)) @ O`` with the heads reshaped out of each part; the
reference is a float64 NumPy attention with the dropped heads' rows of ``O`` zeroed, and
the kept heads a NumPy top-by-L2-norm over the three column blocks of ``W`` and the rows
of ``O``. What the trace cannot prove (unequal parts, the head axis's size read) leaves.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx, zeroed_onnx  # noqa: E402

B, T, H, D = 2, 5, 4, 3
E = H * D


def fused(sizes=(E, E, E), read_heads: bool = False, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """The attention block; `read_heads` adds a ``Shape`` of the query whose head count is read."""
    rng = np.random.default_rng(seed)
    w = {
        "W": rng.standard_normal((E, sum(sizes))).astype(np.float32),
        "b": rng.standard_normal(sum(sizes)).astype(np.float32),
        "O": rng.standard_normal((E, E)).astype(np.float32),
    }
    ints = {
        "sizes": np.array(sizes, np.int64),
        "heads": np.array([B, T, H, D], np.int64),
        "merged": np.array([B, T, E], np.int64),
        "scale": np.array(D**-0.5, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["xw"], name="c_attn"),
        helper.make_node("Add", ["xw", "b"], ["qkv"], name="bias"),
        helper.make_node("Split", ["qkv", "sizes"], ["q0", "k0", "v0"], name="split", axis=2),
    ]
    for p in "qkv":
        nodes.append(helper.make_node("Reshape", [f"{p}0", "heads"], [f"{p}1"], name=f"{p}_heads"))
    nodes += [
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"], name="scores"),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v"], ["c"], name="context"),
        helper.make_node("Transpose", ["c"], ["c1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "merged"], ["c2"], name="merge"),
        helper.make_node("MatMul", ["c2", "O"], ["Y"], name="c_proj"),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [B, T, E])]
    if read_heads:
        ints["one"] = np.array([1], np.int64)
        nodes += [
            helper.make_node("Shape", ["q"], ["qs"]),
            helper.make_node("Gather", ["qs", "one"], ["nh"], axis=0),
        ]
        outputs.append(helper.make_tensor_value_info("nh", TensorProto.INT64, [1]))
    inits = [numpy_helper.from_array(v, k) for k, v in {**w, **ints}.items()]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [B, T, E])],
                              outputs, inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model, w


def attention(w: dict, x: np.ndarray, dropped=()) -> np.ndarray:
    """float64 NumPy reference, with the rows of O of the `dropped` heads zeroed."""
    wq, b, out = (w[k].astype(np.float64) for k in ("W", "b", "O"))
    out = out.copy()
    for h in dropped:
        out[h * D : (h + 1) * D] = 0
    qkv = x.astype(np.float64) @ wq + b
    q, k, v = (qkv[..., i * E : (i + 1) * E].reshape(B, T, H, D).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) * D**-0.5
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return (a @ v).transpose(0, 2, 1, 3).reshape(B, T, E) @ out


def run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


def test_fused_heads_are_removed_in_every_part():
    model, w = fused()
    found = onnx_groups(model, "heads")
    assert len(found.groups) == 1 and not found.left
    g = found.groups[0]
    assert (g.group.channels, g.producers, g.consumers) == (H, ("MatMul 'c_attn'",), ("MatMul 'c_proj'",))
    # the sizes of the Split, the heads' Reshape targets (one shared: a copy each), the merge's
    heads = [(f"heads.{i}", 2, 1) for i in (1, 2, 3)]
    assert sorted(g.shapes) == heads + [("merged", 2, D)] + [("sizes", i, D) for i in range(3)]
    line = found.describe(0.5).splitlines()[0]
    assert "W[1/3], W[1/3 from 12], W[1/3 from 24], b[0/3]*, b[0/3 from 12]*, b[0/3 from 24]*, O[0/3]" in line
    small, report = shrink_onnx(model, 0.5, kind="heads")
    onnx.checker.check_model(small, full_check=True)
    norms = [
        np.sqrt(sum((w["W"][:, p * E + h * D : p * E + (h + 1) * D].astype(np.float64) ** 2).sum() for p in range(3))
                + (w["O"][h * D : (h + 1) * D].astype(np.float64) ** 2).sum())
        for h in range(H)
    ]  # fmt: skip
    kept = np.sort(np.argsort(-np.asarray(norms), kind="stable")[: H // 2])
    assert report.kept[g.group.name] == kept.tolist()
    dropped = sorted(set(range(H)) - set(kept.tolist()))
    x = np.random.default_rng(5).standard_normal((B, T, E)).astype(np.float32)
    got = run(small, x)
    np.testing.assert_allclose(got, attention(w, x, dropped), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, attention(w, x), atol=1e-3)
    np.testing.assert_allclose(run(zeroed_onnx(model, report), x), got, rtol=1e-5, atol=1e-5)
    data = {t.name: numpy_helper.to_array(t) for t in small.graph.initializer}
    cols = [p * E + h * D + j for p in range(3) for h in kept for j in range(D)]
    np.testing.assert_array_equal(data["W"], w["W"][:, cols])
    np.testing.assert_array_equal(data["b"], w["b"][cols])
    assert data["sizes"].tolist() == [E // 2] * 3
    assert [data[f"heads.{i}"].tolist() for i in (1, 2, 3)] == [[B, T, H // 2, D]] * 3
    assert data["merged"].tolist() == [B, T, E // 2] and "heads" not in data


def test_unequal_parts_are_not_heads():
    model, _ = fused(sizes=(E, E + D, E - D))
    assert onnx_groups(model, "heads").groups == []


def test_the_head_count_read_by_shape_leaves_the_block():
    """(A ``Shape`` read only away from the head axis is followed: GPT-2's legacy export.)"""
    model, _ = fused(read_heads=True)
    found = onnx_groups(model, "heads")
    assert found.groups == []
    assert [(lf.name, lf.reason) for lf in found.left] == [("c_attn", "its shape is read (Shape)")]
