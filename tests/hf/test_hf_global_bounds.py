"""Per-tensor bounds, LAMP and allocations on Hugging Face folders, streamed.

A random-init ``LlamaForCausalLM`` (grouped-query attention) saved by ``save_pretrained``
in one file and sharded (``max_shard_size``), with one layer scaled down (global
pruning would empty it: ``--max-sparsity`` binds), one scaled up (``--min-sparsity``
binds) and runs of equal magnitudes at several quantiles (ties at the cut). Every
command writes, byte for byte, the tensors the same command writes from the merged
state dict saved as ``.npz`` (pruned in memory by :func:`arrayprune.global_unstructured`
or the allocation), and never loads the checkpoint whole.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
safetensors_torch = pytest.importorskip("safetensors.torch")

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.pipeline import runner as pipeline  # noqa: E402
from arrayprune.adapters.pipeline import storage, stream_pruning  # noqa: E402
from arrayprune.adapters.pipeline.scan import Curve, ScanResult  # noqa: E402
from arrayprune.adapters.plan import make_plan  # noqa: E402
from arrayprune.adapters.roles.names import tree_roles  # noqa: E402
from hf_models import llama_config  # noqa: E402

TINY = "model.layers.1.mlp.down_proj.weight"  # scaled down: global pruning empties it
LARGE = "model.layers.0.self_attn.o_proj.weight"  # scaled up: global pruning spares it


def _tensors(path):
    out = {}
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else [os.path.basename(path)]:
        file = os.path.join(path, name) if os.path.isdir(path) else str(path)
        if name.endswith(".safetensors"):
            out.update(safetensors_numpy.load_file(file))
        elif name.endswith(".npz"):
            with np.load(file) as z:
                out.update({k: z[k] for k in z.files})
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The one-file folder, the sharded folder, the merged ``.npz``, and the targets' names."""
    root = tmp_path_factory.mktemp("bounds")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():  # on a grid: long runs of equal magnitudes, cut wherever the cut falls
            if "layers" in name and p.ndim == 2:
                p.copy_(torch.round(p / 0.004) * 0.004)
        params[TINY].mul_(0.01)
        params[LARGE].mul_(50.0)
    model.save_pretrained(root / "one")
    model.save_pretrained(root / "sharded", max_shard_size="100KB")
    assert len([n for n in os.listdir(root / "sharded") if n.endswith(".safetensors")]) > 2
    tensors = _tensors(root / "sharded")
    tensors = dict(sorted(tensors.items()))  # the order of a checkpoint's plan (ties between tensors)
    np.savez(root / "merged.npz", **tensors)
    targets = [e for e in make_plan(tensors, tree_roles(tensors)) if e.prune]
    assert TINY in {e.name for e in targets} and LARGE in {e.name for e in targets}
    return root, tensors, targets


@pytest.fixture
def streamed_only(monkeypatch):
    """Loading the checkpoint whole, or a tensor whole to prune it, fails."""

    def whole(*args, **kwargs):
        raise AssertionError("loaded whole")

    monkeypatch.setattr(pipeline, "WholeFile", whole)

    monkeypatch.setattr(storage, "WholeFile", whole)
    monkeypatch.setattr(stream_pruning, "_prune_in_core", whole)


def _reference(root, tmp_path, **options):
    tmp_path.mkdir(exist_ok=True)
    prune_file(root / "merged.npz", tmp_path / "ref.npz", force=True, **options)
    return _tensors(tmp_path / "ref.npz")


def _same_bytes(got, want):
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].tobytes() == want[name].tobytes(), name


def _sparsity(tensors, name):
    return float(np.mean(tensors[name] == 0))


def _split_ties(before, after, targets):
    """Whether some run of equal magnitudes is cut: some of it pruned, some kept."""
    for e in targets:
        w, p = before[e.name].reshape(-1), after[e.name].reshape(-1)
        values, counts = np.unique(np.abs(w[w != 0]), return_counts=True)
        for v in values[counts > 1]:
            run = np.abs(w) == v
            if (p[run] == 0).any() and (p[run] != 0).any():
                return True
    return False


BOUNDS = {
    "max": {"max_sparsity": 0.6},
    "min": {"min_sparsity": 0.45},
    "both": {"min_sparsity": 0.45, "max_sparsity": 0.6},
    "lamp": {"lamp": True},
    "lamp-max": {"lamp": True, "max_sparsity": 0.53},
}


@pytest.mark.parametrize("layout", ["one", "sharded"])
@pytest.mark.parametrize("case", list(BOUNDS))
def test_global_bounds_and_lamp_equal_the_in_memory_path(llama, tmp_path, layout, case, monkeypatch):
    root, tensors, targets = llama
    options = {"amount": 0.5, "global_": True, **BOUNDS[case]}
    want = _reference(root, tmp_path, **options)
    plain = _reference(root, tmp_path / "plain", amount=0.5, global_=True)
    assert _sparsity(plain, TINY) > 0.99 and _sparsity(plain, LARGE) < 0.1  # what the bounds change
    sparsities = [_sparsity(want, e.name) for e in targets]
    if "max_sparsity" in options:  # it binds
        assert max(sparsities) == pytest.approx(options["max_sparsity"], abs=1e-3)
    if "min_sparsity" in options:
        assert min(sparsities) == pytest.approx(options["min_sparsity"], abs=1e-3)
    if case in ("max", "both"):
        assert _sparsity(want, TINY) == pytest.approx(0.6, abs=1e-3)
    assert _split_ties(tensors, want, targets)  # ties are cut: their order by position matters
    pruned = sum(int((want[e.name] == 0).sum()) for e in targets)
    assert pruned == round(0.5 * sum(e.value.size for e in targets))

    def whole(*args, **kwargs):
        raise AssertionError("loaded whole")

    monkeypatch.setattr(pipeline, "WholeFile", whole)

    monkeypatch.setattr(storage, "WholeFile", whole)
    if not options.get("lamp"):  # LAMP ranks each tensor by scores of the whole tensor: one at a time
        monkeypatch.setattr(stream_pruning, "_prune_in_core", whole)
    argv = ["prune", str(root / layout), "-o", str(tmp_path / "out"), "--amount", "0.5", "--global"]
    for flag, value in BOUNDS[case].items():
        argv += [f"--{flag.replace('_', '-')}"] + ([] if value is True else [str(value)])
    assert main(argv) == 0
    _same_bytes(_tensors(tmp_path / "out"), want)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(root / layout))


@pytest.mark.slow
def test_lamp_reads_one_tensor_at_a_time(llama, tmp_path, monkeypatch):
    import gc
    import weakref

    root, _, targets = llama
    read, alive = [], []
    real = stream_pruning.read_whole

    def counted(files, entry):
        gc.collect()
        alive.append(sum(r() is not None for r in read))  # tensors read before, still held
        value = real(files, entry)
        read.append(weakref.ref(value))
        return value

    monkeypatch.setattr(stream_pruning, "read_whole", counted)
    prune_file(root / "sharded", tmp_path / "out", amount=0.5, global_=True, lamp=True)
    assert len(read) >= 2 * len(targets) and max(alive) == 0


def test_bounds_and_lamp_on_one_safetensors_file_are_streamed_and_equal(llama, tmp_path, monkeypatch):
    root, _, _ = llama
    for options in ({"min_sparsity": 0.45, "max_sparsity": 0.6}, {"lamp": True}):
        options = {"amount": 0.5, "global_": True, **options}
        want = _reference(root, tmp_path, **options)
        with monkeypatch.context() as patched:

            def whole(*args, **kwargs):
                raise AssertionError("loaded whole")

            patched.setattr(pipeline, "WholeFile", whole)

            patched.setattr(storage, "WholeFile", whole)
            prune_file(root / "one" / "model.safetensors", tmp_path / "out.safetensors", force=True, **options)
        _same_bytes(_tensors(tmp_path / "out.safetensors"), want)


def test_the_global_warnings_advice_works_on_the_folder_it_is_printed_for(llama, tmp_path, capsys):
    root, _, _ = llama
    for layout in ("one", "sharded"):
        argv = ["prune", str(root / layout), "-o", str(tmp_path / layout), "--global", "--amount", "0.5"]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"--global pruned 1 tensor to 99% or more: {TINY}" in err
        assert "cap every tensor with --max-sparsity (e.g. --max-sparsity 0.9)" in err
        assert main([*argv[:3], str(tmp_path / f"{layout}-capped"), *argv[4:], "--max-sparsity", "0.9"]) == 0
        assert "warning" not in capsys.readouterr().err
        capped = _tensors(tmp_path / f"{layout}-capped")
        assert int((capped[TINY] == 0).sum()) == int(0.9 * capped[TINY].size)  # at most 90%


def test_bounds_that_cannot_hold_the_amount_are_one_line_and_write_nothing(llama, tmp_path, capsys):
    root, _, _ = llama
    refused = (["--max-sparsity", "0.3"], ["--min-sparsity", "0.7"], ["--min-sparsity", "0.6", "--max-sparsity", "0.4"])
    for options in refused:
        argv = ["prune", str(root / "sharded"), "-o", str(tmp_path / "out"), "--global", "--amount", "0.5", *options]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("arrayprune: error: ") and err.count("\n") == 1 and "Traceback" not in err
        assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------
# allocations
# --------------------------------------------------------------------------------------


def _scan(path, targets):
    sparsities = (0.2, 0.4, 0.6, 0.8, 0.95)
    rng = np.random.default_rng(1)
    curves = []
    for e in targets:
        steep = float(rng.uniform(0.1, 3.0))
        curves.append(Curve(e.name, tuple(e.shape), tuple(steep * s**2 for s in sparsities)))
    ScanResult("l1_unstructured", sparsities, curves, model="llama").save(path)
    return path


def _norms(path, targets):
    rng = np.random.default_rng(2)
    np.savez(path, **{e.name: rng.uniform(0.1, 10.0, e.shape[1]) for e in targets})
    return path


@pytest.mark.parametrize("layout", ["one", "sharded"])
@pytest.mark.parametrize("how", ["scan", "scan-bounded", "owl", "owl-norms", "owl-norms-wanda"])
def test_allocations_equal_the_in_memory_path(llama, tmp_path, layout, how, monkeypatch):
    root, tensors, targets = llama
    options: dict = {"amount": 0.5}
    if how.startswith("scan"):
        options["allocation"] = str(_scan(tmp_path / "scan.json", targets))
    else:
        options["allocation"] = "owl"
    if how == "scan-bounded":
        options.update(min_sparsity=0.3, max_sparsity=0.7)
    if how.startswith("owl-norms"):
        options["input_norms"] = str(_norms(tmp_path / "norms.npz", targets))
    if how == "owl-norms-wanda":
        options["method"] = "wanda"
    reference = prune_file(root / "merged.npz", tmp_path / "ref.npz", **options)
    want = _tensors(tmp_path / "ref.npz")
    counts = reference.allocation.counts
    assert len(set(counts.values())) > 2  # the weights get different shares
    if how == "scan-bounded":
        assert min(counts[e.name] / e.value.size for e in targets) == pytest.approx(0.3, abs=0.01)
    if how != "owl-norms-wanda":
        assert _split_ties(tensors, want, targets)

    def whole(*args, **kwargs):
        raise AssertionError("loaded whole")

    monkeypatch.setattr(pipeline, "WholeFile", whole)

    monkeypatch.setattr(storage, "WholeFile", whole)
    if "norms" not in how:  # Wanda's scores need the whole tensor (one at a time)
        monkeypatch.setattr(stream_pruning, "_prune_in_core", whole)
    result = prune_file(root / layout, tmp_path / "out", **options)
    assert result.allocation.counts == counts
    _same_bytes(_tensors(tmp_path / "out"), want)
    # the command, and its dry run, say the same
    argv = ["prune", str(root / layout), "-o", str(tmp_path / "cli"), "--amount", "0.5"]
    argv += ["--allocation", options["allocation"]]
    for flag in ("min_sparsity", "max_sparsity", "input_norms", "method"):
        if flag in options:
            argv += [f"--{flag.replace('_', '-')}", str(options[flag])]
    assert main(argv) == 0
    _same_bytes(_tensors(tmp_path / "cli"), want)
    dry = prune_file(root / layout, dry_run=True, **options)
    assert dry.allocation.counts == counts


@pytest.mark.parametrize(("layout", "allocation"), [("one", "owl"), ("sharded", "owl"), ("sharded", "scan")])
def test_allocations_with_calibration_tokens_prune_layer_by_layer(llama, tmp_path, layout, allocation):
    """OWL's statistics from the dense model run layer by layer on tokens (as ONNX calibration
    gives them), or a scan's curves; then Wanda layer by layer, each weight to its share."""
    import arrayprune.adapters.torch as prune

    root, _, targets = llama
    ids = np.random.default_rng(3).integers(0, 128, (16, 12))
    np.savez(tmp_path / "tokens.npz", input_ids=ids)
    scan = str(_scan(tmp_path / "scan.json", targets)) if allocation == "scan" else "owl"
    options = {"method": "wanda", "amount": 0.5, "allocation": scan}
    result = prune_file(root / layout, tmp_path / "out", calibration=str(tmp_path / "tokens.npz"), **options)
    model = transformers.LlamaForCausalLM.from_pretrained(root / "sharded").eval()
    batches = [{"input_ids": torch.from_numpy(ids[i : i + 8]), "use_cache": False} for i in range(0, len(ids), 8)]
    names = [e.name.removesuffix(".weight") for e in targets]
    dense = prune.input_norms(model, batches, modules=names)
    np.savez(tmp_path / "norms.npz", **{k: v.to(torch.float64).numpy() for k, v in dense.items()})
    reference = prune_file(
        root / "merged.npz", tmp_path / "ref.npz", input_norms=str(tmp_path / "norms.npz"), **options
    )
    assert result.allocation.counts == reference.allocation.counts
    assert len(set(result.allocation.counts.values())) > 2
    got = _tensors(tmp_path / "out")
    for layer in range(2):  # Wanda layer by layer: each layer's norms from the layers before it pruned
        chosen = [n for n in names if f".layers.{layer}." in n]
        norms = prune.input_norms(model, batches, modules=chosen)
        for name in chosen:
            weight = model.get_submodule(name).weight
            scores = weight.detach().abs() * norms[f"{name}.weight"][None, :]
            keep = torch.ones_like(weight, dtype=torch.bool)
            keep.scatter_(
                1, torch.argsort(scores, dim=1, stable=True)[:, : result.allocation.amounts[f"{name}.weight"]], False
            )
            with torch.no_grad():
                weight.mul_(keep)
            np.testing.assert_array_equal(got[f"{name}.weight"], weight.detach().numpy(), err_msg=name)
    # its dry run shows the same shares
    assert prune_file(
        root / "one", dry_run=True, calibration=str(tmp_path / "tokens.npz"), **options
    ).allocation.counts == (result.allocation.counts)


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "allocation"), [("sharded", "owl"), ("one", "scan")])
def test_sparsegpt_allocations_with_calibration_tokens_equal_the_torch_drop_in(llama, tmp_path, layout, allocation):
    """SparseGPT layer by layer, each weight to its share: the drop-in's ``prune.sparsegpt``
    given the same per-layer amounts on the same model and tokens. OWL's shares come from
    the dense model's input norms (as for Wanda), a scan's from its curves."""
    import arrayprune.adapters.torch as prune

    root, _, targets = llama
    ids = np.random.default_rng(4).integers(0, 128, (16, 12))
    np.savez(tmp_path / "tokens.npz", input_ids=ids)
    scan = str(_scan(tmp_path / "scan.json", targets)) if allocation == "scan" else "owl"
    options = {"method": "sparsegpt", "amount": 0.5, "allocation": scan, "calibration": str(tmp_path / "tokens.npz")}
    options["max_sparsity"] = 0.8  # a layer emptied leaves the next an all-zero Hessian: refused, not guessed
    result = prune_file(root / layout, tmp_path / "out", **options)
    sizes = {e.name: int(np.prod(e.shape)) for e in targets}
    assert sum(result.allocation.counts.values()) == round(0.5 * sum(sizes.values()))  # the amount, exactly
    assert len({count / sizes[name] for name, count in result.allocation.counts.items()}) > 2  # shares differ

    model = transformers.LlamaForCausalLM.from_pretrained(root / "sharded").eval()
    batches = [{"input_ids": torch.from_numpy(ids[i : i + 8]), "use_cache": False} for i in range(0, len(ids), 8)]
    amounts = {e.name.removesuffix(".weight"): result.allocation.amounts[e.name] for e in targets}
    prune.sparsegpt(model, batches, amounts)
    got = _tensors(tmp_path / "out")
    for name in amounts:
        weight = model.get_submodule(name).weight.detach().numpy()
        assert int((got[f"{name}.weight"] == 0).sum()) >= result.allocation.counts[f"{name}.weight"], name  # +grid 0s
        np.testing.assert_allclose(got[f"{name}.weight"], weight, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("options", [{"min_sparsity": 0.45, "max_sparsity": 0.6}, {"lamp": True, "max_sparsity": 0.53}])
def test_bfloat16_folders_equal_the_in_memory_state_dict(tmp_path, options, monkeypatch):
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name and p.ndim == 2:
                p.copy_(torch.round(p / 0.004) * 0.004)  # ties
        dict(model.named_parameters())[TINY].mul_(0.01)
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    state: dict = {}
    for name in sorted(os.listdir(tmp_path / "sharded")):
        if name.endswith(".safetensors"):
            state.update(safetensors_torch.load_file(str(tmp_path / "sharded" / name)))
    torch.save(dict(sorted(state.items())), tmp_path / "merged.pt")
    options = {"amount": 0.5, "global_": True, **options}
    prune_file(tmp_path / "merged.pt", tmp_path / "ref.pt", **options)
    want = torch.load(tmp_path / "ref.pt", weights_only=True)

    def whole(*args, **kwargs):
        raise AssertionError("loaded whole")

    monkeypatch.setattr(pipeline, "WholeFile", whole)

    monkeypatch.setattr(storage, "WholeFile", whole)
    prune_file(tmp_path / "sharded", tmp_path / "out", **options)
    got = {}
    for name in sorted(os.listdir(tmp_path / "out")):
        if name.endswith(".safetensors"):
            got.update(safetensors_torch.load_file(str(tmp_path / "out" / name)))
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name].view(torch.int16), want[name].view(torch.int16)), name
    if "min_sparsity" in options:
        assert float((got[TINY] == 0).float().mean()) == pytest.approx(0.6, abs=1e-3)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc/self/status")
@pytest.mark.slow
def test_peak_memory_of_bounds_lamp_and_owl_does_not_grow_with_the_model(tmp_path):
    from test_sharded_memory import checkpoint, peak

    small, _, small_size = checkpoint(tmp_path / "two", 2)
    large, _, large_size = checkpoint(tmp_path / "eight", 8)
    growth = large_size - small_size  # 82 MB
    for options in (["--global", "--max-sparsity", "0.6"], ["--global", "--lamp"], ["--allocation", "owl"]):
        a, b = (
            peak("prune", c, "-o", tmp_path / f"{c.name}-{options[-1]}", "--amount", "0.5", *options)
            for c in (small, large)
        )
        assert b - a < growth / 4, f"{options}: peak grew {b - a} bytes for {growth} more bytes of model"


@pytest.mark.parametrize("bracket", [True, False])
def test_lamp_counts_by_either_route_and_ranking(llama, tmp_path, monkeypatch, bracket):
    """LAMP's counts from the two-pass bracket or the digit passes; tensors ranked by
    magnitude where that drops the same entries, else by their LAMP scores."""
    from arrayprune.selection import radix

    root, _, targets = llama
    options = {"amount": 0.5, "global_": True, "lamp": True, "max_sparsity": 0.53}
    want = _reference(root, tmp_path, **options)
    if not bracket:
        monkeypatch.setattr(radix, "bounded_counts_of_sorted", lambda *args, **kwargs: None)
    scored = []
    real = pipeline._lamp_scores

    def recorded(by_magnitude, target, value):
        scores = real(by_magnitude, target, value)
        scored.append(scores is not None)
        return scores

    monkeypatch.setattr(pipeline, "_lamp_scores", recorded)
    prune_file(root / "sharded", tmp_path / "out", **options)
    _same_bytes(_tensors(tmp_path / "out"), want)
    assert len(scored) == len(targets)
    assert all(scored) if not bracket else any(scored) and not all(scored)  # both rankings, with the bracket
