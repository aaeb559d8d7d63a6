"""``arrayprune scan FOLDER --calibration tokens.npz``: a Hugging Face folder scanned layer by layer.

The reference is the dense model loaded whole by ``transformers``: each weight pruned
alone by hand (its ``round(s * size)`` smallest magnitudes zeroed, or its rows of least
L2 norm), the whole model run on the token ids, and the decoder layer's output taken from
a forward hook; the curve value is ``sum((h - h0)^2) / sum(h0^2)`` in float64. An
allocation from the scan must give each weight the count
:func:`arrayprune.allocate_from_curves` gives from the same curves.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

import arrayprune  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.formats import sharded  # noqa: E402
from arrayprune.adapters.pipeline.hf_scan import HF_METRIC, hf_scan_methods, scan_hf  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from hf_models import VOCAB, save_family, save_sharded_llama, tensors  # noqa: E402

SPARSITIES = (0.2, 0.4, 0.6, 0.8, 0.9)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_sharded_llama(tmp_path_factory.mktemp("llama") / "dense", shard="60KB")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.npz"
    ids = np.random.default_rng(3).integers(0, VOCAB, size=(5, 12))
    mask = np.ones_like(ids)
    mask[4, 9:] = 0  # padding at the end of the last sequence: those positions do not count
    np.savez(path, input_ids=ids, attention_mask=mask)
    return path


def _pruned(w, s, method):
    w = w.clone()
    if method == "l1_unstructured":
        k = round(s * w.numel())
        flat = w.view(-1)
        flat[torch.argsort(flat.abs(), stable=True)[:k]] = 0
    else:  # ln_structured along the output axis: the rows of least L2 norm
        k = round(s * w.shape[0])
        w[torch.argsort(w.norm(dim=1), stable=True)[:k]] = 0
    return w


def direct_curves(folder, tokens_path, method):
    """Each weight pruned alone in the whole in-memory model; the layer's output error."""
    model = tr.LlamaForCausalLM.from_pretrained(folder).eval()
    data = np.load(tokens_path)
    ids, mask = torch.from_numpy(data["input_ids"]), torch.from_numpy(data["attention_mask"])
    outs = {}
    hooks = [
        layer.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, (o[0] if isinstance(o, tuple) else o)))
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        dense = {i: h.double().clone() for i, h in outs.items()}
        curves = {}
        for name, p in model.named_parameters():
            if not name.startswith("model.layers.") or p.ndim != 2:
                continue
            i = int(name.split(".")[2])
            original = p.detach().clone()
            errors = []
            for s in SPARSITIES:
                p.copy_(_pruned(original, s, method))
                model(input_ids=ids, attention_mask=mask)
                diff = ((outs[i].double() - dense[i]) ** 2).sum(-1) * mask
                errors.append(float(diff.sum() / ((dense[i] ** 2).sum(-1) * mask).sum()))
            p.copy_(original)
            curves[name] = errors
    for h in hooks:
        h.remove()
    return curves


@pytest.mark.slow
@pytest.mark.parametrize("method", ["l1_unstructured", "ln_structured"])
def test_curves_equal_the_in_memory_model(llama, tokens, method):
    ckpt = sharded.open_checkpoint(str(llama))
    result = scan_hf(ckpt, str(llama), str(tokens), method=method, sparsities=SPARSITIES, calibration_batch=2)
    want = direct_curves(llama, tokens, method)
    assert [c.name for c in result.curves] == sorted(want, key=lambda n: (int(n.split(".")[2]), n))
    assert result.metric == HF_METRIC and result.samples == 5 and result.sparsities == SPARSITIES
    for c in result.curves:
        assert c.shape == tuple(ckpt.tensors[c.name].shape)
        np.testing.assert_allclose(c.errors, want[c.name], rtol=1e-4, atol=1e-12)
        assert all(b > a for a, b in zip(c.errors, c.errors[1:], strict=False)), c  # more pruned, more error


@pytest.mark.slow
def test_cli_scan_then_allocation(llama, tokens, tmp_path, capsys):
    scan = tmp_path / "scan.json"
    args = ["scan", str(llama), "--calibration", str(tokens), "-o", str(scan), "--sparsities", "0.2,0.4,0.6,0.8,0.9",
            "--include", "*mlp*", "*o_proj*", "*v_proj*"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "scanned 10 weights" in out and "decoder layer's output" in out
    with open(scan) as f:
        data = json.load(f)
    assert data["format"] == "arrayprune scan" and len(data["curves"]) == 10
    prune = ["prune", str(llama), "-o", str(tmp_path / "small"), "--amount", "0.5", "--include", "*mlp*", "*o_proj*",
             "*v_proj*", "--allocation", str(scan)]  # fmt: skip
    assert main(prune) == 0, capsys.readouterr().err
    curves = [c["errors"] for c in data["curves"]]
    sizes = [math.prod(c["shape"]) for c in data["curves"]]
    counts = arrayprune.allocate_from_curves(curves, sizes, 0.5, sparsities=tuple(data["sparsities"]))
    small = tensors(tmp_path / "small")
    zeros = [int((small[c["name"]] == 0).sum()) for c in data["curves"]]
    assert zeros == [int(k) for k in counts]
    assert sum(zeros) == sum(sizes) // 2
    assert len({round(z / n, 2) for z, n in zip(zeros, sizes, strict=True)}) > 1  # not uniform


@pytest.mark.slow
def test_mixtral_experts_stored_one_by_one(tmp_path):
    """Per-expert tensors of the checkpoint are rows of transformers' fused parameters."""
    cls = save_family(tmp_path / "dense", "mixtral")
    path = tmp_path / "tokens.npz"
    ids = np.random.default_rng(4).integers(0, 64, size=(3, 10))
    np.savez(path, input_ids=ids)
    ckpt = sharded.open_checkpoint(str(tmp_path / "dense"))
    result = scan_hf(ckpt, str(tmp_path / "dense"), str(path), sparsities=SPARSITIES)
    model = cls.from_pretrained(tmp_path / "dense").eval()
    inter = model.config.intermediate_size
    cases = {  # stored name -> (layer, the tensor in the model it is a view of)
        "model.layers.0.block_sparse_moe.experts.1.w1.weight": (0, lambda m: m.experts.gate_up_proj[1, :inter]),
        "model.layers.1.block_sparse_moe.experts.2.w3.weight": (1, lambda m: m.experts.gate_up_proj[2, inter:]),
        "model.layers.1.block_sparse_moe.experts.0.w2.weight": (1, lambda m: m.experts.down_proj[0]),
        "model.layers.0.block_sparse_moe.gate.weight": (0, lambda m: m.gate.weight),
    }
    outs = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, (o[0] if isinstance(o, tuple) else o)))
    with torch.no_grad():
        model(torch.from_numpy(ids))
        dense = {i: h.double().clone() for i, h in outs.items()}
        for name, (i, view) in cases.items():
            w = view(model.model.layers[i].mlp)
            assert tuple(w.shape) == tuple(ckpt.tensors[name].shape)
            original = w.clone()
            want = []
            for s in SPARSITIES:
                w.copy_(_pruned(original, s, "l1_unstructured"))
                model(torch.from_numpy(ids))
                want.append(float(((outs[i].double() - dense[i]) ** 2).sum() / (dense[i] ** 2).sum()))
            w.copy_(original)
            np.testing.assert_allclose(result.curve(name).errors, want, rtol=1e-4, atol=1e-12)
    assert len(result.curves) == 2 * (4 + 1 + 4 * 3)  # attention, the router, 4 experts x 3 weights


def test_methods():
    assert "l1_unstructured" in hf_scan_methods() and "ln_structured" in hf_scan_methods()
    assert "wanda" not in hf_scan_methods() and "sparsegpt" not in hf_scan_methods()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--method", "wanda"], ["a scan of a Hugging Face folder prunes with l1_unstructured"]),
        (["--outputs", "logits"], ["--outputs names values of an ONNX graph"]),
        (["--include", "lm_head*"], ["'lm_head.weight' is outside the decoder layers"]),
        (["--calibration", "{big}"], ["token ids must be in [0, 128)"]),
        (["--device", "tpu"], ["--device: expected cpu, cuda or cuda:N, got 'tpu'"]),
    ]
    + ([] if torch.cuda.is_available() else [(["--device", "cuda"], ["PyTorch sees no CUDA device here"])]),
)
def test_refused(llama, tokens, tmp_path, extra, fragments):
    big = tmp_path / "big.npz"
    np.savez(big, input_ids=np.full((2, 4), 500))
    extra = [str(a).format(big=big) for a in extra]
    proc = run("scan", llama, "--calibration", tokens, "-o", tmp_path / "scan.json", *extra)
    assert_error(proc, *fragments)
    assert not os.path.exists(tmp_path / "scan.json")


@pytest.mark.slow
def test_device_cpu_writes_the_same_scan(llama, tokens, tmp_path, capsys):
    common = ["--calibration", str(tokens), "--sparsities", "0.2,0.4,0.6,0.8,0.9", "--include", "*mlp.down_proj*"]
    assert main(["scan", str(llama), "-o", str(tmp_path / "a.json"), *common]) == 0, capsys.readouterr().err
    assert main(["scan", str(llama), "-o", str(tmp_path / "b.json"), *common, "--device", "cpu"]) == 0
    with open(tmp_path / "a.json") as a, open(tmp_path / "b.json") as b:
        assert json.load(a)["curves"] == json.load(b)["curves"]


def test_device_is_for_a_folder(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])], initializer=[w],
    )  # fmt: skip
    onnx.save_model(helper.make_model(graph), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "c.npz", x=np.ones((8, 4), np.float32))
    proc = run("scan", tmp_path / "m.onnx", "--calibration", tmp_path / "c.npz", "-o", tmp_path / "s.json",
               "--device", "cpu")  # fmt: skip
    assert_error(proc, "--device: a scan of an ONNX model runs onnxruntime on the CPU")
    assert not os.path.exists(tmp_path / "s.json")
