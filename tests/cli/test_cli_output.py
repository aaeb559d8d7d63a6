"""What the command line says: 2:4 along the reduction axis, node names, warnings, progress, plans."""

from __future__ import annotations

import json

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import cli
from arrayprune.adapters import formats as fmt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _matmul_mlp(path):
    """x [n, 8] @ W1 [8, 16] + b1 -> Relu -> @ W2 [16, 4] + b2: MatMul weights [K, N]."""
    inits = [
        numpy_helper.from_array(_rand((8, 16), 1), "W1"),
        numpy_helper.from_array(_rand((16,), 2), "b1"),
        numpy_helper.from_array(_rand((16, 4), 3), "W2"),
        numpy_helper.from_array(_rand((4,), 4), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="/layer1/MatMul"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="/layer1/Add"),
        helper.make_node("Relu", ["h1"], ["h2"], name="/Relu"),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"], name="/layer2/MatMul"),
        helper.make_node("Add", ["h3", "b2"], ["y"], name="/layer2/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _main(capsys, *args):
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------------------
# report: 2:4 along each weight's reduction axis
# --------------------------------------------------------------------------------------


def test_report_reads_2_4_along_the_reduction_axis_of_matmul_weights(tmp_path, capsys):
    src = _matmul_mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "nm.onnx"
    code, _, err = _main(capsys, "prune", src, "-o", out, "--method", "nm_structured", "--nm", "2:4")
    assert code == 0, err
    pruned = fmt.load(out).params
    for name in ("W1", "W2"):  # 2:4 along K (axis 0), not along N
        assert ap.is_nm_sparse(pruned[name], 2, 4, dim=0)
        assert not ap.is_nm_sparse(pruned[name], 2, 4, dim=1)

    code, text, err = _main(capsys, "report", out, "--json")
    assert code == 0, err
    report = json.loads(text)
    rows = {r["name"]: r for r in report["tensors"]}
    assert {n: rows[n]["nm_2_4"] for n in rows} == {"W1": True, "b1": False, "W2": True, "b2": False}
    # half the values plus 2 bits per kept value for the weights; the biases dense
    assert rows["W1"]["bytes"]["semi_structured_2_4"] == 64 * 4 + 64 * 2 // 8 == 272
    assert rows["W2"]["bytes"]["semi_structured_2_4"] == 32 * 4 + 32 * 2 // 8 == 136
    assert report["total"]["bytes"]["semi_structured_2_4"] == 272 + 136 + 16 * 4 + 4 * 4 == 488

    code, text, err = _main(capsys, "report", out)
    assert code == 0, err
    header = text.splitlines()[1].replace("read by", "read_by").split()
    cells = [line.split() for line in text.splitlines()[2:] if line.split()]
    lines = {c[0]: dict(zip(header, c, strict=False)) for c in cells}
    assert lines["W1"]["2:4"] == "yes" and lines["W2"]["2:4"] == "yes"
    assert lines["b1"]["2:4"] == "no"
    assert lines["W1"]["read_by"] == "/layer1/MatMul"
    assert f"2:4 where it holds {488 / 2**20:.2f} MiB" in text


def test_sparse_nbytes_takes_the_axis_of_the_groups():
    w = np.zeros((8, 4), np.float32)
    w[::4, :] = 1.0
    w[1::4, :] = 2.0  # 2:4 along axis 0 only, 16 non-zeros
    assert "semi_structured_2_4" not in ap.sparse_nbytes(w)
    assert ap.sparse_nbytes(w, dim=0)["semi_structured_2_4"] == 16 * 4 + 16 * 2 // 8
    assert ap.sparse_nbytes(w, dim=-2) == ap.sparse_nbytes(w, dim=0)
    with pytest.raises(IndexError):
        ap.sparse_nbytes(w, dim=2)


# --------------------------------------------------------------------------------------
# node names: shown by the plan and the report, matched by --include and --exclude
# --------------------------------------------------------------------------------------


def _nested_export(path):
    """A torch.onnx.export of nested submodules: weights become ``onnx::MatMul_<n>``."""
    import io
    import warnings

    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.query(x) * self.key(x)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.out = Attention(), nn.Linear(8, 8)

        def forward(self, x):
            return self.out(self.attention(x))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList([Layer(), Layer()])

        def forward(self, x):
            for layer in self.layer:
                x = layer(x)
            return x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = Encoder()

        def forward(self, x):
            return self.encoder(x)

    torch.manual_seed(0)
    net = Net().eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 3, 8),), f, dynamo=False)
    path.write_bytes(f.getvalue())
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}

    def stored(linear):  # the initializer holding linear.weight (transposed: MatMul B [K, N])
        w = linear.weight.detach().numpy().T
        (name,) = [n for n, a in inits.items() if a.shape == w.shape and np.array_equal(a, w)]
        return name

    return {
        f"{i}.{part}": stored(getattr(layer.attention, part) if part != "out" else layer.out)
        for i, layer in enumerate(net.encoder.layer)
        for part in ("query", "key", "out")
    }


def test_include_matches_the_nodes_reading_a_weight(tmp_path, capsys):
    src = tmp_path / "net.onnx"
    names = _nested_export(src)
    assert all(n.startswith("onnx::MatMul_") for n in names.values()), names
    query = {names["0.query"], names["1.query"]}

    pattern = "/encoder/*/query/MatMul"
    code, text, err = _main(capsys, "prune", src, "--dry-run", "--amount", "0.5", "--include", pattern)
    assert code == 0, err
    chosen = {line.split()[0] for line in text.splitlines() if "  prune" in line}
    assert chosen == query
    line = next(ln for ln in text.splitlines() if ln.startswith(names["1.query"] + " "))
    assert line.split()[1] == "/encoder/layer.1/attention/query/MatMul"
    assert "2 of 12 tensors would be pruned (128 entries)" in text

    out = tmp_path / "q.onnx"
    code, _, err = _main(capsys, "prune", src, "-o", out, "--amount", "0.5", "--include", pattern)
    assert code == 0, err
    before, after = fmt.load(src).params, fmt.load(out).params
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed == query
    assert all(int((after[n] == 0).sum()) == 32 for n in query)

    # exclude by node name: the key and out projections of layer 0 stay
    leave = ("/encoder/layer.0/attention/key/*", "*out/MatMul")
    code, text, err = _main(capsys, "prune", src, "--dry-run", "--amount", "0.5", "--exclude", *leave)
    assert code == 0, err
    chosen = {line.split()[0] for line in text.splitlines() if "  prune" in line}
    assert chosen == {names["0.query"], names["1.query"], names["1.key"]}

    code, text, err = _main(capsys, "report", src, "--json")
    rows = {r["name"]: r for r in json.loads(text)["tensors"]}
    assert rows[names["0.key"]]["nodes"] == ["/encoder/layer.0/attention/key/MatMul"]
    assert rows["encoder.layer.0.out.bias"]["nodes"] == ["/encoder/layer.0/out/Add"]


# --------------------------------------------------------------------------------------
# --dry-run without --amount: roles and axes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "plan"),
    [
        ("ln_structured", "prune, dim 1 (MatMul B [K, N])"),  # output axis: N
        ("l1_unstructured", "prune (MatMul B [K, N])"),
        ("nm_structured", "prune, dim 0 (MatMul B [K, N])"),  # reduction axis: K (no amount anyway)
    ],
)
def test_dry_run_without_amount_lists_roles_and_axes(tmp_path, capsys, method, plan):
    src = _matmul_mlp(tmp_path / "mlp.onnx")
    code, text, err = _main(capsys, "prune", src, "--dry-run", "--method", method)
    assert (code, err) == (0, "")
    lines = text.splitlines()
    rows = {line.split()[0]: line for line in lines[2:-1]}
    for name in ("W1", "W2"):
        assert rows[name].endswith("  " + plan), rows[name]
    assert rows["b1"].endswith("leave: not a layer weight (Add input)")
    last = "2 of 4 tensors would be pruned (192 entries)"
    if method != "nm_structured":
        last = "2 of 4 tensors selected (192 entries); no --amount: roles and axes only"
    assert lines[-1] == last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_prune_without_amount_still_needs_one(tmp_path, capsys):
    src = _matmul_mlp(tmp_path / "mlp.onnx")
    code, _, err = _main(capsys, "prune", src, "-o", tmp_path / "out.onnx", "--method", "ln_structured")
    assert code == 2
    assert err == (
        "arrayprune: error: --amount is required for ln_structured (--dry-run alone shows the roles and axes)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


# --------------------------------------------------------------------------------------
# warnings and notes on stderr
# --------------------------------------------------------------------------------------


def _two_layers():
    """A large layer of large weights and a small one of tiny weights (a pooler, say)."""
    big = _rand((64, 64), 5) + np.where(_rand((64, 64), 6) >= 0, 1.0, -1.0).astype(np.float32)
    small = (_rand((8, 16), 7) * 1e-3).astype(np.float32)
    return {"encoder.weight": big, "pooler.weight": small}


@pytest.mark.parametrize("suffix", ["npz", "safetensors"])  # in memory; tensor by tensor (radix passes)
def test_global_warns_about_a_tensor_pruned_to_99_percent(tmp_path, capsys, suffix):
    src, out = tmp_path / f"m.{suffix}", tmp_path / f"out.{suffix}"
    fmt.save(src, _two_layers())
    code, text, err = _main(capsys, "prune", src, "-o", out, "--global", "--amount", "0.3")
    assert code == 0, err
    assert fmt.load(out).params["pooler.weight"].tolist() == np.zeros((8, 16)).tolist()  # the smallest
    assert err == (
        "arrayprune: warning: --global pruned 1 tensor to 99% or more: pooler.weight (100.00%); such a layer "
        "passes almost nothing on: cap every tensor with --max-sparsity (e.g. --max-sparsity 0.9) or leave it "
        "with --exclude\n"
    )
    # the fix it names: no tensor above 90%, no warning
    capped = ("--global", "--amount", "0.3", "--max-sparsity", "0.9")
    code, _, err = _main(capsys, "prune", src, "-o", out, "--force", *capped)
    assert (code, err) == (0, "")
    assert int((fmt.load(out).params["pooler.weight"] == 0).sum()) == round(0.9 * 128)


def test_no_warning_without_global_or_below_99_percent(tmp_path, capsys):
    src, out = tmp_path / "m.npz", tmp_path / "out.npz"
    fmt.save(src, _two_layers())
    for extra in ([], ["--global"]):
        code, _, err = _main(capsys, "prune", src, "-o", out, "--force", "--amount", "0.02", *extra)
        assert (code, err) == (0, ""), extra


@pytest.mark.parametrize(
    ("extra", "note"),
    [
        ([], "50 entries pruned in each tensor"),
        (["--global"], "50 entries pruned in total over the selected tensors (--global)"),
        (["--method", "ln_structured"], "50 channels pruned in each tensor"),
    ],
)
def test_an_integer_amount_is_noted_as_a_count(tmp_path, capsys, extra, note):
    src, out = tmp_path / "m.npz", tmp_path / "out.npz"
    fmt.save(src, _two_layers())
    amount = "5" if "ln_structured" in extra else "50"
    code, _, err = _main(capsys, "prune", src, "-o", out, "--amount", amount, *extra)
    assert code == 0, err
    expected = note.replace("50", amount)
    assert err == (
        f"arrayprune: note: --amount {amount} is a count, not a fraction: {expected}; "
        "a fraction has a decimal point (0.5 is half)\n"
    )
    if not extra:
        pruned = fmt.load(out).params
        assert [int((pruned[k] == 0).sum()) for k in ("encoder.weight", "pooler.weight")] == [50, 50]
    code, _, err = _main(capsys, "prune", src, "--dry-run", "--amount", "0.5", *extra)
    assert (code, err) == (0, ""), "a fraction: no note"


# --------------------------------------------------------------------------------------
# progress on a terminal: loading, calibration, the global threshold, the tensors
# --------------------------------------------------------------------------------------


def test_a_terminal_is_told_every_stage(tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    from arrayprune.adapters.cli import tensors

    src = _matmul_mlp(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", x=_rand((10, 8), 9))
    calib = tmp_path / "calib.npz"
    calibrated = ("--global", "--amount", "0.5", "--calibration", calib, "--calibration-batch", "4")
    code, _, err = _main(capsys, "prune", src, "-o", tmp_path / "a.onnx", *calibrated)
    assert (code, err) == (0, ""), "no progress when stderr is not a terminal"

    monkeypatch.setattr(tensors, "_interactive", lambda: True)
    code, _, err = _main(capsys, "prune", src, "-o", tmp_path / "b.onnx", *calibrated)
    assert code == 0, err
    stages = [line for line in err.splitlines() if line.startswith("arrayprune: ")]
    assert stages == [
        f"arrayprune: loading {src}",
        "arrayprune: calibration: 10 samples through onnxruntime, 4 at a time",
        "arrayprune: global threshold: ranking 192 entries of 2 tensors",
    ]
    assert "calibration" in err.replace(stages[1], "")  # the bar over the 3 batches (tqdm)
    quiet, told = fmt.load(tmp_path / "a.onnx").params, fmt.load(tmp_path / "b.onnx").params
    np.testing.assert_array_equal(quiet["W1"], told["W1"])

    # tensor by tensor (safetensors): the radix passes are announced
    fmt.save(tmp_path / "m.safetensors", {"a.weight": _rand((8, 8), 1), "b.weight": _rand((4, 8), 2)})
    stored = (tmp_path / "m.safetensors", "-o", tmp_path / "o.safetensors", "--global", "--amount", "0.5")
    code, _, err = _main(capsys, "prune", *stored)
    assert code == 0, err
    radix = "global threshold: ranking 96 entries of 2 tensors (one pass per 16 bits of the keys), then writing"
    assert f"arrayprune: {radix}\n" in err
    assert "pruning" in err  # the bar over the tensors

    code, _, err = _main(capsys, "report", src)
    assert code == 0 and err.splitlines() == [f"arrayprune: loading {src}"]
