"""The pipeline from Python: ``prune_file`` writes what the command writes, says what it says.

And the request (``PruneSpec``) is validated once: its errors are checked here, for every
entry point at once (the command line and ``prune_file``).
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from test_sharded import llama_tensors, save_torch, write_checkpoint  # noqa: E402

from arrayprune.adapters import prune_file
from arrayprune.adapters.cli import main
from arrayprune.adapters.pipeline import PruneResult, prune_checkpoint
from arrayprune.adapters.pipeline.request import PruneError, PruneSpec
from cli_helpers import EXAMPLE, flags  # noqa: E402

COUNTS = re.compile(r"^pruned (\d+) tensors.*: (\d+) of (\d+) entries zero .*\nwhole file: (\d+) of (\d+) entries zero")


def _files(path):
    """Every file of an output (a file, with its ONNX external data, or a folder): name -> bytes."""
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def _same(tmp_path, capsys, src, suffix, **options):
    """The command and ``prune_file`` on `src`: identical outputs, identical counts."""
    (tmp_path / "cli").mkdir(parents=True)
    (tmp_path / "api").mkdir()
    out_cli, out_api = tmp_path / "cli" / f"out{suffix}", tmp_path / "api" / f"out{suffix}"
    capsys.readouterr()
    assert main(["prune", str(src), "-o", str(out_cli), *flags(options)]) == 0
    printed = capsys.readouterr().out
    result = prune_file(src, out_api, **options)
    assert isinstance(result, PruneResult)
    assert capsys.readouterr().out == "", "prune_file prints nothing"
    cli_files, api_files = _files(out_cli), _files(out_api)
    assert cli_files and cli_files == api_files, "byte-identical outputs"
    n, zeros, size, all_zeros, all_size = map(int, COUNTS.match(printed).groups())
    w = result.written
    assert (len(result.targets), w.pruned.zeros, w.pruned.size, w.whole.zeros, w.whole.size) == (
        n, zeros, size, all_zeros, all_size
    )
    return result


def _onnx_external(tmp_path):
    onnx = pytest.importorskip("onnx")
    model = onnx.load(EXAMPLE)
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    return path


def _calibration(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    graph_input = onnx.load(EXAMPLE).graph.input[0]
    width = graph_input.type.tensor_type.shape.dim[-1].dim_value
    path = tmp_path / "calib.npz"
    np.savez(path, **{graph_input.name: np.random.default_rng(0).standard_normal((20, width)).astype(np.float32)})
    return path


def _state_dict_file(tmp_path, suffix):
    tensors = llama_tensors(layers=1, seed=3)
    path = tmp_path / f"model{suffix}"
    if suffix == ".safetensors":
        path.write_bytes(save_torch(tensors))
    elif suffix == ".npz":
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})
    else:
        import torch

        torch.save(tensors, path)
    return path


MODES = {
    "per tensor": {"amount": 0.3},
    "global": {"amount": 0.5, "global_": True},
    "n:m": {"method": "nm_structured", "nm": (2, 4)},
    "structured": {"method": "ln_structured", "amount": 0.25, "n": 1},
    "random": {"method": "random_unstructured", "amount": 0.4, "seed": 7},
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["onnx", "onnx external data", ".npz", ".pt", ".safetensors", "sharded"])
def test_prune_file_writes_what_the_command_writes(tmp_path, capsys, kind, mode):
    pytest.importorskip("torch")
    if kind == "onnx":
        pytest.importorskip("onnx")
        src, suffix = tmp_path / "in.onnx", ".onnx"
        shutil.copy(EXAMPLE, src)
    elif kind == "onnx external data":
        src, suffix = _onnx_external(tmp_path), ".onnx"
    elif kind == "sharded":
        src, suffix = write_checkpoint(tmp_path / "in", llama_tensors(layers=2, seed=5), 3), ""
    else:
        src, suffix = _state_dict_file(tmp_path, kind), kind
    _same(tmp_path, capsys, src, suffix, **MODES[mode])


@pytest.mark.parametrize("suffix", [".npz", ".pt", ".safetensors"])
def test_keep_masks(tmp_path, capsys, suffix):
    pytest.importorskip("torch")
    src = _state_dict_file(tmp_path, suffix)
    _same(tmp_path, capsys, src, suffix, amount=0.5, keep_masks=True)
    _same(tmp_path / "g", capsys, src, suffix, amount=0.5, global_=True, keep_masks=True)


@pytest.mark.parametrize("options", [{"method": "wanda", "amount": 0.5}, {"amount": 0.5, "global_": True}])
def test_wanda_with_calibration(tmp_path, capsys, options):
    calib = _calibration(tmp_path)
    _same(tmp_path, capsys, EXAMPLE, ".onnx", calibration=str(calib), **options)


def _source(tmp_path, suffix):
    if suffix == ".onnx":
        return EXAMPLE
    if suffix == "":
        return write_checkpoint(tmp_path / "in", llama_tensors(layers=2, seed=5), 3)
    return _state_dict_file(tmp_path, suffix)


@pytest.mark.parametrize("suffix", [".onnx", ".npz", ".safetensors", ""])  # "": sharded
def test_allocation(tmp_path, capsys, suffix):
    _same(tmp_path, capsys, _source(tmp_path, suffix), suffix, amount=0.7, allocation="owl", max_sparsity=0.9)


@pytest.mark.parametrize("suffix", [".safetensors", ""])  # streamed: per-tensor counts, then tensor by tensor
@pytest.mark.parametrize("options", [{"min_sparsity": 0.3, "max_sparsity": 0.7}, {"lamp": True}])
def test_bounds_and_lamp_streamed(tmp_path, capsys, suffix, options):
    pytest.importorskip("torch")
    _same(tmp_path, capsys, _source(tmp_path, suffix), suffix, amount=0.5, global_=True, **options)


def test_one_safetensors_file_from_a_sharded_checkpoint_and_prune_checkpoint(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=2, seed=5), 3)
    _same(tmp_path, capsys, src, ".safetensors", amount=0.5, global_=True)
    summary = prune_checkpoint(src, tmp_path / "alias.safetensors", amount=0.5, global_=True)
    assert (tmp_path / "alias.safetensors").read_bytes() == (tmp_path / "api" / "out.safetensors").read_bytes()
    assert summary.files == [str(tmp_path / "alias.safetensors")]


def test_dry_run_returns_the_plan_and_writes_nothing(tmp_path, capsys):
    result = prune_file(EXAMPLE, amount=0.5, global_=True, dry_run=True)
    assert result.written is None and result.dst is None
    assert [e.name for e in result.targets] == [e.name for e in result.plan if e.prune] and result.targets
    assert main(["prune", EXAMPLE, "--dry-run", "--amount", "0.5", "--global"]) == 0
    printed = capsys.readouterr().out
    assert all(e.name in printed for e in result.plan)
    plan_only = prune_file(EXAMPLE, dry_run=True)
    assert [e.prune for e in plan_only.plan] == [e.prune for e in result.plan]


def test_notes_and_warnings_are_returned_not_printed(tmp_path, capsys):
    result = prune_file(EXAMPLE, tmp_path / "o.npz", amount=100, global_=True)
    assert result.notes and "is a count, not a fraction" in result.notes[0]
    result = prune_file(EXAMPLE, tmp_path / "o.npz", amount=0.999, global_=True, force=True)
    assert result.warnings and "--max-sparsity" in result.warnings[0]
    assert capsys.readouterr() == ("", "")


# --------------------------------------------------------------------------------------
# The request's validation: once, for every entry point
# --------------------------------------------------------------------------------------

INVALID = [
    ({"amount": 0.5, "global_": True, "method": "ln_structured"}, "--global needs an unstructured method"),
    ({"amount": 0.5, "lamp": True}, "shape global pruning: add --global"),
    ({"amount": 0.5, "global_": True, "lamp": True, "method": "random_unstructured"}, "--lamp ranks magnitudes"),
    ({"amount": 0.5, "nm": (2, 4)}, "--nm does not apply to l1_unstructured"),
    ({"amount": 0.5, "dim": 0}, "--dim does not apply"),
    ({"method": "nm_structured", "amount": 0.5}, "prunes a pattern (--nm N:M), not an --amount"),
    ({}, "--amount is required for l1_unstructured"),
    ({"amount": 0.5, "seed": 1}, "--seed does not apply to l1_unstructured"),
    ({"amount": 0.5, "verify_tol": (0.1, 0.0)}, "--verify-tol needs --verify"),
    ({"amount": 0.5, "verify_data": "x.npz"}, "--verify-data needs --verify"),
    ({"amount": 0.5, "calibration": "c.npz", "input_norms": "n.npz"}, "both give input norms"),
    ({"amount": 0.5, "method": "random_unstructured", "input_norms": "n.npz"}, "makes Wanda's scores"),
    ({"amount": 0.5, "method": "wanda"}, "--method wanda needs input norms"),
    ({"amount": 0.5, "calibration_batch": 4}, "--calibration-batch needs --calibration"),
    ({"amount": 0.5, "shrink": True}, "--shrink removes whole channels"),
    ({"amount": 0.5, "method": "ln_structured", "shrink": True, "keep_masks": True}, "--keep-masks does not go"),
    ({"amount": 0.5, "groups": "channels"}, "--groups says what --shrink removes"),
    ({"amount": 2.5}, "--amount:"),
    ({"method": "nm_structured", "nm": (5, 4)}, "--nm:"),
    ({"amount": 0.5, "allocation": "owl", "global_": True}, "--allocation sets each weight's sparsity"),
    ({"allocation": "owl"}, "--allocation shares an --amount among weights: give --amount"),
    ({"amount": 0.5, "allocation": "owl", "method": "random_unstructured"}, "--allocation applies to"),
    ({"amount": 0.5, "allocation": "owl", "method": "ln_structured"}, "--allocation owl counts outlier entries"),
    ({"amount": 0.5, "owl_m": 3.0}, "--owl-m applies to --allocation owl"),
    ({"amount": 0.5, "allocation_check_data": "c.npz"}, "--allocation-check-data: samples to check a scan's"),
]


@pytest.mark.parametrize(("options", "fragment"), INVALID)
def test_request_errors(tmp_path, capsys, options, fragment):
    with pytest.raises(PruneError, match=re.escape(fragment)):
        PruneSpec(**options).checked()
    with pytest.raises(PruneError, match=re.escape(fragment)):
        prune_file(EXAMPLE, tmp_path / "o.onnx", **options)
    assert main(["prune", EXAMPLE, "-o", str(tmp_path / "o.onnx"), *flags(options)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("arrayprune: error: ") and fragment in err[0]
    assert not (tmp_path / "o.onnx").exists()


def test_python_values_the_parser_would_refuse(tmp_path):
    for options, fragment in [
        ({"method": "identity", "amount": 0.5}, "invalid choice for --method"),
        ({"amount": "half"}, "invalid amount"),
        ({"amount": 0.5, "min_size": -1}, "--min-size"),
        ({"amount": 0.5, "global_": True, "max_sparsity": 1.5}, "--max-sparsity"),
        ({"amount": 0.5, "colour": "red"}, "unknown option 'colour'"),
    ]:
        with pytest.raises(PruneError, match=re.escape(fragment)):
            prune_file(EXAMPLE, tmp_path / "o.onnx", **options)
    assert issubclass(PruneError, ValueError)
    assert PruneSpec(include="*.weight").include == ("*.weight",)
    assert PruneSpec(method="nm_structured").checked().nm == (2, 4)


# --------------------------------------------------------------------------------------
# A method object instead of a name
# --------------------------------------------------------------------------------------


def _method_objects():
    import arrayprune as ap

    return [
        (ap.L1Unstructured(0.3), {"method": "l1_unstructured", "amount": 0.3}),
        (ap.LnStructured(0.5, n=1, dim=0), {"method": "ln_structured", "amount": 0.5, "n": 1, "dim": 0}),
        (ap.NMStructured(2, 4, dim=0), {"method": "nm_structured", "nm": (2, 4), "dim": 0}),
        (ap.BlockUnstructured(0.5, (2, 4)), {"method": "block_unstructured", "amount": 0.5, "block": (2, 4), "n": 1}),
        (ap.RandomUnstructured(0.25, seed=7), {"method": "random_unstructured", "amount": 0.25, "seed": 7}),
    ]


@pytest.mark.parametrize("index", range(5))
def test_a_method_object_prunes_as_its_name_and_arguments(tmp_path, index):
    """``method=ap.LnStructured(0.5, n=1, dim=0)`` writes what the same name and options write."""
    obj, options = _method_objects()[index]
    by_object = prune_file(EXAMPLE, tmp_path / "object.onnx", method=obj)
    by_name = prune_file(EXAMPLE, tmp_path / "name.onnx", **options)
    assert _files(tmp_path / "object.onnx") == {"object.onnx": (tmp_path / "name.onnx").read_bytes()}
    assert by_object.written.pruned.zeros == by_name.written.pruned.zeros > 0
    spec = PruneSpec(method=obj)
    assert {k: getattr(spec, k) for k in options} == options


def test_a_method_object_global_is_the_global_threshold(tmp_path):
    import arrayprune as ap

    prune_file(EXAMPLE, tmp_path / "object.onnx", method=ap.L1Unstructured(0.6), global_=True)
    prune_file(EXAMPLE, tmp_path / "name.onnx", method="l1_unstructured", amount=0.6, global_=True)
    assert (tmp_path / "object.onnx").read_bytes() == (tmp_path / "name.onnx").read_bytes()


def test_method_objects_that_a_request_cannot_take(tmp_path):
    import arrayprune as ap

    class Mine(ap.L1Unstructured):
        pass

    with pytest.raises(TypeError, match=r"not Mine \(add a new method to the table: see CONTRIBUTING\)"):
        PruneSpec(method=Mine(0.5))
    with pytest.raises(TypeError, match="RandomUnstructured with a generator: give it a seed"):
        PruneSpec(method=ap.RandomUnstructured(0.5, generator=np.random.default_rng(0)))
    with pytest.raises(PruneError, match="^the method object carries its own arguments: do not give amount, dim too$"):
        prune_file(EXAMPLE, tmp_path / "x.onnx", method=ap.LnStructured(0.5, n=2, dim=0), amount=0.3, dim=1)
    with pytest.raises(PruneError, match="^identity cannot be run on a file"):
        PruneSpec(method=ap.Identity())
    assert not (tmp_path / "x.onnx").exists()


def test_every_prune_flag_is_a_prune_file_option():
    """Each flag of ``arrayprune prune`` (but IN and -o) is an option of ``prune_file``, under its dest's name."""
    import dataclasses

    from arrayprune.adapters.cli.options import build_parser

    prune = build_parser()._subparsers._group_actions[0].choices["prune"]
    dests = {a.dest for a in prune._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(PruneSpec)}
    assert dests - fields == {"input", "output"}
    assert {"allocation", "allocation_check", "hessians", "shrink", "groups", "calibration"} <= dests
