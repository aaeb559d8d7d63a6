"""``arrayprune prune --method sparsegpt``: the ONNX engine behind the file pipeline.

What the command writes is what :func:`onnx_sparsegpt` returns when called directly on
the same file and calibration data (bit for bit, per tensor, N:M, global, one pass),
``prune_file`` writes the same bytes, and each option that cannot apply is one line,
exit status 2, nothing written.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import arrayprune as ap  # noqa: E402
from arrayprune.adapters import formats, prune_file  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.pipeline.reconstruction import amounts_from_masks, onnx_sparsegpt  # noqa: E402
from arrayprune.adapters.pipeline.request import METHODS, PruneError, PruneSpec  # noqa: E402
from cli_helpers import flags  # noqa: E402

NAMES = ["W1", "W2", "W3"]


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _mlp(folder, name="m.onnx", **save):
    """x [B, 12] -> MatMul W1 [12, 16] + b1, Relu -> Gemm W2 (transB, [8, 16]) -> MatMul W3 [8, 6]."""
    inits = {"W1": _rand((12, 16), 1), "b1": _rand((16,), 2), "W2": _rand((8, 16), 3), "W3": _rand((8, 6), 4)}
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Gemm", ["r", "W2"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["r2"]),
        helper.make_node("MatMul", ["r2", "W3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 6])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / name
    onnx.save_model(model, str(path), **save)
    return path


def _calibration(folder, samples=40, **arrays):
    path = folder / "calib.npz"
    np.savez(path, **(arrays or {"x": _rand((samples, 12), 9)}))
    return path


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def _command_and_prune_file(tmp_path, capsys, src, **options):
    """Run the command and ``prune_file``: the same bytes; the written weights and the printed text."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "api").mkdir()
    out_cli, out_api = tmp_path / "cli" / "out.onnx", tmp_path / "api" / "out.onnx"
    capsys.readouterr()
    assert main(["prune", str(src), "-o", str(out_cli), *flags(options)]) == 0
    printed = capsys.readouterr()
    result = prune_file(src, out_api, **options)
    assert capsys.readouterr().out == ""
    cli_files = _files(out_cli)
    assert cli_files and cli_files == _files(out_api), "byte-identical outputs"
    return formats.load(str(out_cli)).params, printed, result


def _direct(src, calib, names=NAMES, **kwargs):
    return onnx_sparsegpt(formats.load(str(src)), names, dict(np.load(calib)), **kwargs)


def _assert_written(params, want, src):
    dense = formats.load(str(src)).params
    for name in dense:
        if name in want:
            assert params[name].dtype == want[name].weight.dtype
            np.testing.assert_array_equal(params[name], want[name].weight, err_msg=name)  # bit-equal
        else:
            np.testing.assert_array_equal(params[name], dense[name], err_msg=name)  # b1 untouched


def test_sparsegpt_is_a_method_choice_of_the_command():
    assert "sparsegpt" in METHODS
    from arrayprune.adapters.cli.options import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["prune"].format_help()
    assert "sparsegpt" in re.search(r"--method \{[^}]*\}", text).group(0)
    assert "--one-pass" in text


@pytest.mark.parametrize(
    ("options", "engine"),
    [
        ({"amount": 0.5}, {"amount": 0.5}),
        ({"amount": 0.7, "calibration_batch": 7}, {"amount": 0.7, "batch_size": 7}),
        ({"amount": 0.5, "one_pass": True}, {"amount": 0.5, "sequential": False}),
        ({"nm": (2, 4)}, {"n": 2, "m": 4}),
        ({"amount": 30}, {"amount": 30}),
    ],
    ids=["amount", "batch", "one pass", "2:4", "count"],
)
def test_the_command_writes_what_onnx_sparsegpt_returns(tmp_path, capsys, options, engine):
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    params, printed, result = _command_and_prune_file(
        tmp_path, capsys, src, method="sparsegpt", calibration=calib, **options
    )
    want = _direct(src, calib, **engine)
    _assert_written(params, want, src)
    sizes = [want[n].weight.size for n in NAMES]
    if "nm" in options:
        expected = sum(s // 2 for s in sizes)
    elif isinstance(options["amount"], int):
        expected = 30 * len(NAMES)
    else:
        expected = sum(round(options["amount"] * s) for s in sizes)
    assert result.written.pruned.zeros == expected and result.written.pruned.size == sum(sizes)
    detail = "2:4" if "nm" in options else f"amount {options['amount']}"
    assert f"pruned 3 tensors of {src} (sparsegpt, {detail}): {expected} of {sum(sizes)} entries zero" in printed.out


def test_one_pass_is_not_the_sequential_result(tmp_path):
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    one, seq = _direct(src, calib, amount=0.5, sequential=False), _direct(src, calib, amount=0.5)
    assert np.array_equal(one["W1"].weight, seq["W1"].weight)  # the first layer sees the dense model either way
    assert not np.array_equal(one["W3"].weight, seq["W3"].weight)


@pytest.mark.parametrize("bounds", [{}, {"max_sparsity": 0.8}, {"lamp": True}])
def test_global_ranks_by_magnitude_then_reconstructs_those_counts(tmp_path, capsys, bounds):
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    params, _, result = _command_and_prune_file(
        tmp_path, capsys, src, method="sparsegpt", amount=0.7, global_=True, calibration=calib, **bounds
    )
    dense = formats.load(str(src)).params
    kwargs = {"max_sparsity": bounds.get("max_sparsity"), "normalization": "lamp" if bounds.get("lamp") else None}
    masks = ap.global_unstructured([dense[n] for n in NAMES], ap.L1Unstructured, amount=0.7, **kwargs)
    counts = amounts_from_masks(dict(zip(NAMES, masks, strict=True)))
    assert len(set(counts.values())) > 1 or bounds, "layers get different counts"
    want = _direct(src, calib, amount=counts)
    _assert_written(params, want, src)
    assert {n: result.written.by_tensor[n][0] for n in NAMES} == counts
    assert result.written.pruned.zeros == round(0.7 * sum(dense[n].size for n in NAMES))


def test_external_data_model(tmp_path, capsys):
    src = _mlp(tmp_path, "ext.onnx", save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    calib = _calibration(tmp_path)
    params, _, _ = _command_and_prune_file(tmp_path, capsys, src, method="sparsegpt", amount=0.5, calibration=calib)
    _assert_written(params, _direct(src, calib, amount=0.5), src)
    assert list((tmp_path / "cli").glob("out.onnx.*.data")), "written with its external data"


def test_digits_mlp_global_and_verify(tmp_path, capsys):
    from exports import digits_mlp

    _, src, images = digits_mlp(tmp_path)
    calib = tmp_path / "digits.npz"
    np.savez(calib, X=images[:128])
    params, printed, result = _command_and_prune_file(
        tmp_path, capsys, src, method="sparsegpt", amount=0.5, global_=True, calibration=calib, verify=True
    )
    names = [t.name for t in result.targets]
    dense = formats.load(str(src)).params
    masks = ap.global_unstructured([dense[n] for n in names], ap.L1Unstructured, amount=0.5)
    want = _direct(src, calib, names, amount=amounts_from_masks(dict(zip(names, masks, strict=True))))
    _assert_written(params, want, src)
    assert "verify: output" in printed.out and result.verify and not result.verify_failed


def test_dry_run_shows_the_targets_and_writes_nothing(tmp_path, capsys):
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    out = tmp_path / "o.onnx"
    for extra in (["--amount", "0.5"], ["--nm", "2:4"], []):
        argv = ["prune", str(src), "--dry-run", "--method", "sparsegpt", "--calibration", str(calib), *extra]
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"plan for {src} (onnx), sparsegpt; nothing is written (--dry-run)")
        for name in NAMES:
            assert re.search(rf"^{name} .* prune", text, re.M), (name, text)
        assert re.search(r"^b1 .* leave", text, re.M)
    nm_plan = prune_file(src, method="sparsegpt", nm=(2, 4), calibration=calib, dry_run=True).plan
    assert [(e.name, e.dim) for e in nm_plan if e.prune] == [("W1", 0), ("W2", 1), ("W3", 0)]  # 2:4 along K
    plan = prune_file(src, method="sparsegpt", amount=0.5, calibration=calib, dry_run=True).plan
    assert [e.name for e in plan if e.prune] == NAMES
    assert not out.exists() and not list(tmp_path.glob("*.data"))


NOT_ONNX = (
    "--method sparsegpt runs the model on calibration data: IN must be an ONNX model (npz files hold no graph to "
    "run); a Hugging Face folder runs with --calibration tokens.npz; for a PyTorch model, use "
    "arrayprune.adapters.torch.sparsegpt(model, batches, amount)"
)

REFUSED = [
    ({"amount": 0.5}, "--method sparsegpt needs --calibration calib.npz: samples of the model's inputs "
     "(graph input name -> array, samples along axis 0; token ids for a Hugging Face folder), "
     "or --hessians hessians.npz for safetensors"),
    ({"amount": 0.5, "keep_masks": True, "calibration": "C"}, "--keep-masks does not apply to sparsegpt: it updates "
     "the weights it keeps, so name_orig would not be the original"),
    ({"amount": 0.5, "seed": 3, "calibration": "C"}, "--seed does not apply to sparsegpt, which is deterministic "
     "(--verify runs on the --calibration samples)"),
    ({"amount": 0.5, "dim": 1, "calibration": "C"}, "--dim does not apply to sparsegpt: it prunes each weight along "
     "its reduction axis"),
    ({"amount": 0.5, "lamp": True, "calibration": "C"}, "--min-sparsity, --max-sparsity and --lamp shape global "
     "pruning: add --global"),
    ({"amount": 0.5, "max_sparsity": 0.9, "calibration": "C"}, "--min-sparsity, --max-sparsity and --lamp shape "
     "global pruning: add --global"),
    ({"amount": 0.5, "nm": (2, 4), "calibration": "C"}, "--method sparsegpt takes --amount A or --nm N:M, not both"),
    ({"calibration": "C"}, "--method sparsegpt needs --amount A or --nm N:M"),
    ({"nm": (2, 4), "global_": True, "calibration": "C"}, "--global ranks entries for an --amount; with --nm N:M "
     "every weight of sparsegpt gets the pattern"),
    ({"amount": 0.5, "input_norms": "N", "calibration": "C"}, "--input-norms makes Wanda's scores; sparsegpt takes "
     "its Hessians from --calibration"),
    ({"amount": 0.5, "n": 1, "calibration": "C"}, "--n does not apply to sparsegpt"),
    ({"amount": 1.5, "calibration": "C"}, "--amount: amount=1.5 should either be a float in the range [0, 1] or a "
     "non-negative integer"),
]


def _refused(tmp_path, capsys, src, options, message, out="o.onnx"):
    """The request's one-line error from PruneSpec, prune_file and the command; nothing written."""
    dst = tmp_path / out
    with pytest.raises(PruneError) as info:
        prune_file(src, dst, method="sparsegpt", **options)
    assert str(info.value) == message
    capsys.readouterr()
    assert main(["prune", str(src), "-o", str(dst), "--method", "sparsegpt", *flags(options)]) == 2
    err = capsys.readouterr().err
    assert err == f"arrayprune: error: {message}\n"
    assert list(tmp_path.glob(out + "*")) == []


@pytest.mark.parametrize(("options", "message"), REFUSED)
def test_refused_options(tmp_path, capsys, options, message):
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    options = {k: str(calib) if v == "C" else str(tmp_path / "n.npz") if v == "N" else v for k, v in options.items()}
    with pytest.raises(PruneError, match=re.escape(message)):
        PruneSpec(method="sparsegpt", **options).checked()
    _refused(tmp_path, capsys, src, options, message, out="o.npz" if options.get("keep_masks") else "o.onnx")


def test_one_pass_needs_a_reconstruction_method(tmp_path, capsys):
    src = _mlp(tmp_path)
    with pytest.raises(PruneError, match="^--one-pass applies to sparsegpt only$"):
        prune_file(src, tmp_path / "o.onnx", amount=0.5, one_pass=True)
    assert main(["prune", str(src), "-o", str(tmp_path / "o.onnx"), "--amount", "0.5", "--one-pass"]) == 2
    assert capsys.readouterr().err == "arrayprune: error: --one-pass applies to sparsegpt only\n"


def test_inputs_without_a_graph_are_refused(tmp_path, capsys):
    src = tmp_path / "w.npz"
    np.savez(src, W1=_rand((12, 16), 1))
    calib = _calibration(tmp_path)
    _refused(tmp_path, capsys, src, {"amount": 0.5, "calibration": str(calib)}, f"{src}: {NOT_ONNX}", "o.npz")
    with pytest.raises(PruneError, match=re.escape(NOT_ONNX)):  # a plan too
        prune_file(src, method="sparsegpt", amount=0.5, calibration=calib, dry_run=True)


def test_engine_errors_are_one_line(tmp_path, capsys):
    src = _mlp(tmp_path)
    wrong = _calibration(tmp_path, z=_rand((10, 12), 1))
    _refused(
        tmp_path,
        capsys,
        src,
        {"amount": 0.5, "calibration": str(wrong)},
        f"{src}: --method sparsegpt: the calibration data lacks graph input 'x' (graph inputs: 'x')",
    )
    bad = _rand((10, 12), 1)
    bad[3, 4] = np.nan
    nan = _calibration(tmp_path, x=bad)
    _refused(tmp_path, capsys, src, {"amount": 0.5, "calibration": str(nan)}, _message_of(src, nan))
    calib = _calibration(tmp_path)
    _refused(
        tmp_path,
        capsys,
        src,
        {"amount": 0.5, "calibration": str(calib), "include": "b1"},
        f"{src}: --method sparsegpt: 'b1' is not a MatMul, Gemm or Conv weight (Add input): SparseGPT cannot "
        "reconstruct it",
    )


def _message_of(src, calib):
    try:
        _direct(src, calib, amount=0.5)
    except ValueError as exc:
        assert "finite" in str(exc), exc
        return f"{src}: --method sparsegpt: {' '.join(str(exc).split())}"
    raise AssertionError("non-finite calibration samples were accepted")


def test_all_zero_calibration_samples_are_refused_naming_the_layer(tmp_path, capsys):
    src = _mlp(tmp_path)
    zeros = _calibration(tmp_path, x=np.zeros((40, 12), np.float32))
    message = (
        f"{src}: --method sparsegpt: 'W1': the Hessian is all zero: every input of the layer was 0 on the "
        "calibration data, so it says nothing about which weights matter"
    )
    _refused(tmp_path, capsys, src, {"amount": 0.5, "calibration": str(zeros)}, message)


@pytest.mark.parametrize("dead", [4, 10])  # fewer, then more dead entries of W1 than its amount
def test_dead_inputs_count_toward_the_amount(tmp_path, capsys, dead):
    """Inputs that never fire are pruned first, within the amount: each weight loses exactly round(0.5 * size)."""
    src = _mlp(tmp_path)
    x = _rand((40, 12), 9)
    x[:, :dead] = 0
    params, _, result = _command_and_prune_file(
        tmp_path, capsys, src, method="sparsegpt", amount=0.5, calibration=str(_calibration(tmp_path, x=x))
    )
    for name in NAMES:
        assert int((params[name] == 0).sum()) == params[name].size // 2 == result.written.by_tensor[name][0], name
    w1 = formats.load(str(src)).params["W1"]  # [12, 16]: inputs along axis 0
    if dead == 4:
        assert not params["W1"][:dead].any()  # every dead entry pruned, and 32 live ones
    else:
        assert int((params["W1"][:dead] == 0).sum()) == 96  # only the amount: the other dead entries kept
        np.testing.assert_array_equal(params["W1"][dead:], w1[dead:])


def test_a_sparsegpt_object_prunes_with_its_own_settings(tmp_path):
    """``prune_file(method=ap.SparseGPT(0.5, block_size=4, damp=0.1))``: the settings without a flag are
    taken from the object, and write what the solver with those settings returns."""
    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    prune_file(src, tmp_path / "obj.onnx", method=ap.SparseGPT(0.5, block_size=4, damp=0.1), calibration=calib)
    prune_file(src, tmp_path / "name.onnx", method="sparsegpt", amount=0.5, calibration=calib)
    want = _direct(src, calib, amount=0.5, block_size=4, damp=0.1)
    _assert_written(formats.load(str(tmp_path / "obj.onnx")).params, want, src)
    assert (tmp_path / "obj.onnx").read_bytes() != (tmp_path / "name.onnx").read_bytes()  # the defaults differ
    spec = PruneSpec(method=ap.SparseGPT(n=2, m=4))
    assert (spec.nm, spec.amount, dict(spec.method_options)) == ((2, 4), None, {})
    unit = PruneSpec(method=ap.ObsStructured(0.25, compensate=False))
    assert (unit.method, unit.amount, unit.compensate) == ("obs_structured", 0.25, False)
    with pytest.raises(PruneError, match="^--extra does not apply to sparsegpt$"):
        prune_file(src, tmp_path / "x.onnx", method="sparsegpt", amount=0.5, calibration=calib,
                   method_options={"extra": 1})  # fmt: skip


def test_a_setting_the_graph_engine_cannot_pass_on_is_refused(tmp_path):
    from arrayprune.method_parts import NO_FLAG
    from arrayprune.registry import register_method, unregister_method

    class Ridged(ap.SparseGPT):
        FLAGS = {"ridge": NO_FLAG}

        def __init__(self, amount=None, n=None, m=None, block_size=128, damp=0.01, ridge=0.0):
            super().__init__(amount, n, m, block_size, damp)
            self.ridge = ridge

    src, calib = _mlp(tmp_path), _calibration(tmp_path)
    register_method("ridged", Ridged)
    try:
        with pytest.raises(PruneError, match="through an ONNX graph takes block_size and damp of a method object, "
                                             "not ridge"):  # fmt: skip
            prune_file(src, tmp_path / "x.onnx", method=Ridged(0.5, ridge=1.0), calibration=calib)
    finally:
        unregister_method("ridged")
    assert not (tmp_path / "x.onnx").exists()
