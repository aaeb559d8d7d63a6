"""``arrayprune prune --shrink`` and ``prune_file(..., shrink=True)``: channels removed, not zeroed.

The command writes what :func:`~arrayprune.adapters.shrink.shrink_onnx` returns (every
initializer's bytes and shape, the nodes), atomically, inline or with external data as
the input had it; ``prune_file`` writes the same bytes; ``--dry-run --shrink`` lists the
groups and the producers left; ``--verify`` compares with the dense model whose dropped
channels are zeroed (the same function), so a tight tolerance holds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx  # noqa: E402
from arrayprune.adapters.verify import verify_onnx  # noqa: E402
from cli_helpers import EXAMPLE  # noqa: E402


def residual_mlp(d: int = 32, h: int = 64, out: int = 4) -> onnx.ModelProto:
    """x [N, d] -> relu(x W1 + b1) W2 + x -> W3: one group (the hidden layer), two producers left."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((d, h)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((h, d)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal((d, out)).astype(np.float32), "W3"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["mm1"], name="mm1"),
        helper.make_node("Add", ["mm1", "b1"], ["pre"], name="bias1"),
        helper.make_node("Relu", ["pre"], ["hid"], name="relu"),
        helper.make_node("MatMul", ["hid", "W2"], ["mm2"], name="mm2"),
        helper.make_node("Add", ["mm2", "x"], ["res"], name="residual"),
        helper.make_node("MatMul", ["res", "W3"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "in" / "model.onnx"
    path.parent.mkdir()
    onnx.save(residual_mlp(), path)
    return path


@pytest.fixture
def external(tmp_path):
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save(residual_mlp(), path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def cli(capsys, *args):
    capsys.readouterr()
    code = main(["prune", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def arrays(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], bytes]]:
    return {t.name: (tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in model.graph.initializer}


def checked(path) -> onnx.ModelProto:
    """The model at `path` (external data loaded), after onnx's full check and an onnxruntime session."""
    onnx.checker.check_model(str(path), full_check=True)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


@pytest.mark.parametrize(
    "method, flags, kwargs",
    [
        ("ln_structured", [], {}),
        ("ln_structured", ["--n", "1"], {"n": 1}),
        ("random_structured", ["--seed", "3"], {"seed": 3}),
    ],
    ids=["l2", "l1", "random"],
)
@pytest.mark.parametrize("src", ["model", "example"])
def test_command_writes_what_shrink_onnx_returns(model, tmp_path, capsys, method, flags, kwargs, src):
    src = model if src == "model" else EXAMPLE
    out = tmp_path / "out.onnx"
    code, printed, err = cli(capsys, src, "-o", out, "--method", method, "--amount", "0.5", "--shrink", *flags)
    assert code == 0, err
    assert err == ""
    small, report = shrink_onnx(onnx.load(str(src)), 0.5, method, **kwargs)
    got = checked(out)
    assert arrays(got) == arrays(small)
    assert list(got.graph.node) == list(small.graph.node)
    assert list(got.graph.value_info) == list(small.graph.value_info)
    assert report.params_after < report.params_before
    lines, n = printed.splitlines(), len(report.kept)
    assert lines[0] == (
        f"shrunk {n} channel group{'s' if n > 1 else ''} of {src} ({method}, amount 0.5): "
        f"{report.params_before} -> {report.params_after} parameters "
        f"({100 * report.params_after / report.params_before:.2f}%) -> {out}"
    )
    for line, g in zip(lines[1:], report.groups.groups, strict=False):
        n = g.group.channels
        assert line == f"group {g.group.name}: {n} -> {n - round(0.5 * n)} channels kept"

    # prune_file: the same bytes, and the counts
    api = tmp_path / "api" / "out.onnx"
    api.parent.mkdir()
    result = prune_file(src, api, method=method, amount=0.5, shrink=True, **kwargs)
    assert capsys.readouterr().out == ""
    assert api.read_bytes() == out.read_bytes()
    assert result.shrink.kept == report.kept
    assert (result.shrink.params_before, result.shrink.params_after) == (report.params_before, report.params_after)
    assert result.written.whole.size == report.params_after


def test_dry_run_lists_groups_and_producers_left(model, tmp_path, capsys):
    code, printed, err = cli(capsys, model, "--dry-run", "--shrink", "--method", "ln_structured", "--amount", "0.25")
    assert (code, err) == (0, "")
    assert printed.splitlines() == [
        f"channel groups of {model} (onnx), ln_structured, amount 0.25; nothing is written (--dry-run)",
        "group mm1 (64 -> 48 channels, MatMul 'mm1'): W1[1], b1[0]*, W2[0]",
        "left mm2 (32 channels, MatMul 'mm2'): residual Add: Add 'residual' also reads 'x'",
        "left head (4 channels, MatMul 'head'): 'y' is a graph output",
    ]
    code, printed, err = cli(capsys, model, "--dry-run", "--shrink", "--method", "random_structured")
    assert (code, err) == (0, "")
    assert printed.splitlines()[:2] == [
        f"channel groups of {model} (onnx), random_structured; nothing is written (--dry-run)",
        "group mm1 (64 channels, MatMul 'mm1'): W1[1], b1[0]*, W2[0]",
    ]
    result = prune_file(model, dry_run=True, method="ln_structured", amount=3, shrink=True)
    first = result.shrink.describe().splitlines()[0]
    assert first == "group mm1 (64 -> 61 channels, MatMul 'mm1'): W1[1], b1[0]*, W2[0]"
    assert result.notes == [
        "--amount 3 is a count, not a fraction: 3 channels removed from each channel group; "
        "a fraction has a decimal point (0.5 is half)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


CHANNELS = "random_structured or ln_structured"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--amount", "0.5"],
            f"--shrink removes whole channels: use a method that scores channels ({CHANNELS}), not l1_unstructured",
        ),
        (
            ["--method", "nm_structured"],
            f"--shrink removes whole channels: use a method that scores channels ({CHANNELS}), not nm_structured",
        ),
        (
            ["--method", "ln_structured", "--amount", "0.5", "--keep-masks"],
            "--keep-masks does not go with --shrink: shrinking changes the shapes that masks would keep",
        ),
        (
            ["--method", "ln_structured", "--amount", "0.5", "--dim", "0"],
            "--dim does not apply to --shrink: each tensor of a channel group has its own axis",
        ),
        (
            ["--method", "ln_structured", "--amount", "0.5", "--exclude", "W1"],
            "--include, --exclude and --min-size select tensors; --shrink removes every channel group of the graph "
            "(selecting groups is not supported yet)",
        ),
        (
            ["--method", "ln_structured", "--amount", "0.5", "--groups", "heads"],
            "{src}: --shrink --groups heads: no attention block in the graph (--dry-run --shrink says why)",
        ),
        (
            ["--method", "ln_structured", "--amount", "64"],
            "{src}: --amount 64 would remove every channel of group 'mm1' (64)",
        ),
        (
            ["--method", "ln_structured", "--amount", "0.5", "--out", "out.npz"],
            "{out}: --shrink writes an ONNX model: OUT must be .onnx",
        ),
    ],
)
def test_refusals_are_one_line_and_write_nothing(model, tmp_path, capsys, args, message):
    out = tmp_path / "out.onnx"
    if "--out" in args:
        i = args.index("--out")
        out, args = tmp_path / args[i + 1], args[:i] + args[i + 2 :]
    code, printed, err = cli(capsys, model, "-o", out, "--shrink", *args)
    assert code == 2
    assert err.splitlines() == [f"arrayprune: error: {message.format(src=model, out=out)}"]
    assert printed == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    if "--groups" not in args:  # the same from Python, with the same message
        with pytest.raises(ValueError) as info:
            options = {"method": "l1_unstructured", "amount": 0.5}
            flags = dict(zip(args[::2], args[1::2], strict=False))
            options["method"] = flags.get("--method", options["method"])
            if "--amount" in flags:
                options["amount"] = int(flags["--amount"]) if flags["--amount"].isdigit() else float(flags["--amount"])
            options.update(
                global_="--global" in args,
                keep_masks="--keep-masks" in args,
                dim=int(flags["--dim"]) if "--dim" in flags else None,
                exclude=[flags["--exclude"]] if "--exclude" in flags else [],
            )
            prune_file(model, out, shrink=True, **options)
        assert str(info.value) == message.format(src=model, out=out)


def test_groups_without_shrink_and_non_onnx_inputs(model, tmp_path, capsys):
    code, _, err = cli(capsys, model, "-o", tmp_path / "o.onnx", "--amount", "0.5", "--groups", "channels")
    assert code == 2
    assert err == "arrayprune: error: --groups says what --shrink removes: add --shrink\n"
    npz = tmp_path / "w.npz"
    np.savez(npz, **{"fc.weight": np.ones((4, 4), np.float32)})
    for out in (tmp_path / "o.npz", None):
        where = ["-o", out] if out else ["--dry-run"]
        code, _, err = cli(capsys, npz, *where, "--shrink", "--method", "ln_structured", "--amount", "0.5")
        assert code == 2
        assert err == (
            f"arrayprune: error: {npz}: --shrink reads channel groups from an ONNX graph or a Hugging Face "
            "checkpoint folder (config.json and safetensors), not from a npz file\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "w.npz"]


@pytest.mark.parametrize("tol", [None, "1e-4,1e-5"])
def test_verify_compares_with_the_zeroed_dense_model(model, tmp_path, capsys, tol):
    out = tmp_path / "out.onnx"
    extra = ["--verify-tol", tol] if tol else []
    code, printed, err = cli(
        capsys, model, "-o", out, "--method", "ln_structured", "--amount", "0.5", "--shrink", "--verify", *extra
    )
    assert (code, err) == (0, ""), printed
    (line,) = [x for x in printed.splitlines() if x.startswith("verify: output")]
    assert line.startswith("verify: output 'y': max abs output difference ") and line.endswith(": pass")
    assert float(line.split("difference ")[1].split(",")[0]) < 1e-4
    # against the dense model itself, the tight tolerance fails: the reference matters
    assert not verify_onnx(str(model), str(out), tol=(1e-4, 1e-5))[0].passed


def test_verify_on_a_torch_export_with_batch_norm_and_depthwise_conv(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from test_onnx_shrink import DepthwiseNet, export

    net = DepthwiseNet()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.bias.uniform_(-1, 1)
    src = tmp_path / "dw.onnx"
    onnx.save(export(net, torch.randn(2, 3, 8, 8)), src)
    out = tmp_path / "small.onnx"
    code, printed, err = cli(
        capsys, src, "-o", out, "--method", "ln_structured", "--amount", "0.5", "--shrink", "--verify",
        "--verify-tol", "1e-4,1e-5",
    )  # fmt: skip
    assert (code, err) == (0, ""), printed
    assert "pass" in printed
    small, _ = shrink_onnx(onnx.load(str(src)), 0.5)
    assert arrays(checked(out)) == arrays(small)


@pytest.mark.parametrize(
    "net, dynamo", [("MeanPoolNet", True), ("MeanPoolNet", False), ("PoolNet", True)],
    ids=["mean-dynamo", "mean-torchscript", "adaptive-pool-dynamo"],
)  # fmt: skip
@pytest.mark.slow
def test_every_conv_shrinks_through_a_global_mean_pool(tmp_path, capsys, net, dynamo):
    torch = pytest.importorskip("torch")
    import test_onnx_shrink

    src = tmp_path / "cnn.onnx"
    onnx.save(test_onnx_shrink.export(getattr(test_onnx_shrink, net)(), torch.randn(2, 3, 9, 9), dynamo=dynamo), src)
    convs = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "Conv"]
    code, printed, err = cli(capsys, src, "--dry-run", "--shrink", "--method", "ln_structured", "--amount", "0.5")
    assert (code, err) == (0, "")
    lines = printed.splitlines()
    (gemm,) = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "Gemm"]
    assert [line.split(" (")[0] for line in lines[1:]] == [f"group {convs[0]}", f"group {convs[1]}", f"left {gemm}"]
    assert lines[2].endswith("c2.weight[0], c2.bias[0]*, fc.weight[1]")
    out = tmp_path / "small.onnx"
    code, printed, err = cli(
        capsys, src, "-o", out, "--method", "ln_structured", "--amount", "0.5", "--shrink", "--verify",
        "--verify-tol", "1e-5,1e-5",
    )  # fmt: skip
    assert (code, err) == (0, ""), printed
    assert f"group {convs[0]}: 8 -> 4 channels kept" in printed.splitlines()
    assert f"group {convs[1]}: 12 -> 6 channels kept" in printed.splitlines()
    assert "pass" in printed
    got = checked(out)
    shapes = {name: shape for name, (shape, _) in arrays(got).items()}
    assert (shapes["c1.weight"], shapes["c2.weight"], shapes["fc.weight"]) == ((4, 3, 3, 3), (6, 4, 3, 3), (5, 6))
    small, _ = shrink_onnx(onnx.load(str(src)), 0.5)
    assert arrays(got) == arrays(small)  # the Reshape target too
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 9)).astype(np.float32)
    y = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert y.shape == (2, 5)


def test_external_data_stays_external(external, tmp_path, capsys):
    out = tmp_path / "out" / "small.onnx"
    out.parent.mkdir()
    flags = ["--method", "ln_structured", "--amount", "0.5", "--shrink", "--verify"]
    code, _, err = cli(capsys, external, "-o", out, *flags)
    assert (code, err) == (0, "")
    (data,) = [p.name for p in out.parent.iterdir() if p.name != "small.onnx"]
    assert data.startswith("small.onnx.") and data.endswith(".data")
    bare = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in bare.graph.initializer if t.name in ("W1", "W2"))
    small, _ = shrink_onnx(onnx.load(str(external)), 0.5)
    assert arrays(checked(out)) == arrays(small)
    # prune_file writes the same bytes, data file included
    api = tmp_path / "api" / "small.onnx"
    api.parent.mkdir()
    prune_file(external, api, method="ln_structured", amount=0.5, shrink=True, verify=True)
    assert {p.name: p.read_bytes() for p in api.parent.iterdir()} == {
        p.name: p.read_bytes() for p in out.parent.iterdir()
    }


def test_report_shows_the_new_shapes(model, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert cli(capsys, model, "-o", out, "--method", "ln_structured", "--amount", "0.5", "--shrink")[0] == 0
    assert main(["report", str(out), "--json"]) == 0
    rows = {r["name"]: r["shape"] for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows == {"W1": [32, 32], "b1": [32], "W2": [32, 32], "W3": [32, 4]}


def test_a_count_of_one_is_told_in_the_singular():
    from arrayprune.adapters.pipeline.prune_result import shrink_notes
    from arrayprune.adapters.pipeline.request import PruneSpec

    (one,) = shrink_notes(PruneSpec("ln_structured", amount=1, shrink=True))
    (layer,) = shrink_notes(PruneSpec("ln_structured", amount=1, shrink=True), "layers", "the model")
    (kv,) = shrink_notes(PruneSpec("ln_structured", amount=2, shrink=True), "KV groups", "each layer")
    assert ": 1 channel removed from each channel group;" in one
    assert ": 1 layer removed from the model;" in layer and ": 2 KV groups removed from each layer;" in kv


def test_rounding_keep_floor_keeps_torch_pruning_counts(model, tmp_path, capsys):
    """``--rounding keep_floor``: each group keeps ``int((1 - amount) * C)``, the bytes of
    ``shrink_onnx(..., rounding="keep_floor")``; the dry run counts the same way."""
    out = tmp_path / "out.onnx"
    code, printed, err = cli(capsys, model, "-o", out, "--amount", "0.3", "--shrink", "--rounding", "keep_floor",
                             "--method", "ln_structured")  # fmt: skip
    assert code == 0, err
    small, report = shrink_onnx(onnx.load(str(model)), 0.3, "ln_structured", rounding="keep_floor")
    assert arrays(checked(out)) == arrays(small)
    nearest, _ = shrink_onnx(onnx.load(str(model)), 0.3, "ln_structured")
    for g in report.groups.groups:
        n = g.group.channels
        assert len(report.kept[g.group.name]) == int(0.7 * n) < n - round(0.3 * n)  # 64: 44 kept, not 45
        assert f"group {g.group.name}: {n} -> {int(0.7 * n)} channels kept" in printed
    assert arrays(small) != arrays(nearest)
    code, dry, err = cli(capsys, model, "--dry-run", "--amount", "0.3", "--shrink", "--rounding", "keep_floor",
                         "--method", "ln_structured")  # fmt: skip
    assert code == 0, err
    assert f"({report.groups.groups[0].group.channels} -> {int(0.7 * report.groups.groups[0].group.channels)}" in dry
    (made,) = [json.loads(p.value) for p in checked(out).metadata_props if p.key == "arrayprune"]
    assert made["rounding"] == "keep_floor" and made["shrink"] == "channels"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--amount", "0.3", "--rounding", "keep_floor"], "--rounding says how --shrink counts"),
        (["--amount", "0.3", "--shrink", "--global", "--rounding", "keep_floor"], "--global ranks all channels"),
        (["--amount", "0.3", "--shrink", "--rounding", "up"], "invalid choice"),
    ],
)
def test_rounding_refusals(model, tmp_path, capsys, args, message):
    code, _, err = cli(capsys, model, "-o", tmp_path / "out.onnx", "--method", "ln_structured", *args)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "out.onnx").exists()
