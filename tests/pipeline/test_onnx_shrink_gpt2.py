"""GPT-2 exports (transformers, random weights): the MLP's channels shrink through
``gelu_new`` (its ``Pow``), checked against the torch module with the dropped channels'
rows of ``c_proj`` zeroed. With ``--groups heads``, the heads of GPT-2's fused ``c_attn``
(one Conv1D whose output is ``Split`` into Q, K and V) go: the three column blocks of each
head in ``c_attn``'s weight and bias, its rows of ``c_proj``, checked against the torch
module with those rows zeroed.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_onnx_shrink_residual import LastHidden, export, run  # noqa: E402

from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx, zeroed_onnx  # noqa: E402


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=50, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():  # biases away from their zero init, so that they count
        for layer in model.h:
            layer.mlp.c_fc.bias.normal_()
            layer.mlp.c_proj.bias.normal_()
    return model


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_gpt2_mlp_channels_shrink_through_gelu_new(dynamo):
    model = _gpt2()
    module = LastHidden(model).eval()
    ids = torch.randint(0, 50, (2, 7))
    dense = export(module, ids, dynamo=dynamo)
    found = onnx_groups(dense)
    assert [g.group.channels for g in found.groups] == [128, 128]
    assert all("Split" in lf.reason for lf in found.left if lf.channels == 96)  # c_attn stays
    small, report = shrink_onnx(dense, 0.25)
    kept = []
    for layer in model.h:  # NumPy reference: L2 over c_fc columns and c_proj rows (Conv1D is [in, out])
        fc, proj = layer.mlp.c_fc.weight.detach().double().numpy(), layer.mlp.c_proj.weight.detach().double().numpy()
        norms = np.sqrt((fc**2).sum(0) + (proj**2).sum(1))
        kept.append(np.sort(np.argsort(-norms, kind="stable")[:96]))
    assert [report.kept[g.group.name] for g in found.groups] == [k.tolist() for k in kept]
    with torch.no_grad():
        for layer, keep in zip(model.h, kept, strict=True):
            gone = np.setdiff1d(np.arange(128), keep)
            layer.mlp.c_proj.weight[torch.as_tensor(gone)] = 0
        want = module(ids).numpy()
    got = run(small, ids.numpy(), "x")
    np.testing.assert_allclose(got, want, atol=1e-5)
    shapes = {t.name: list(t.dims) for t in small.graph.initializer}
    for i in range(2):
        assert shapes[f"model.h.{i}.mlp.c_fc.weight"] == [32, 96]
        assert shapes[f"model.h.{i}.mlp.c_proj.weight"] == [96, 32]
    if not dynamo:  # (dynamo's shared Reshape targets are copied per group: a few entries more)
        assert report.params_before - report.params_after == 2 * 32 * (32 + 1 + 32)


HEADS, SIZE, HIDDEN = 4, 8, 32


def _gpt2_heads(lm_head: bool = False):
    """A GPT-2 whose attention biases are away from zero (so that the exporter keeps them)."""
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        n_embd=HIDDEN, n_layer=2, n_head=HEADS, n_positions=16, vocab_size=50, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = (transformers.GPT2LMHeadModel if lm_head else transformers.GPT2Model)(config).eval()
    with torch.no_grad():
        for layer in model.transformer.h if lm_head else model.h:
            layer.attn.c_attn.bias.normal_()
            layer.attn.c_proj.bias.normal_()
    return model


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits


def _kept_heads(attn, keep: int) -> np.ndarray:
    """NumPy reference: the heads of largest L2 norm over c_attn's Q, K and V column blocks
    (Conv1D stores [in, out]) and c_proj's rows, ties to the lower index."""
    qkv = attn.c_attn.weight.detach().double().numpy()
    proj = attn.c_proj.weight.detach().double().numpy()
    norms = []
    for h in range(HEADS):
        cols = [p * HIDDEN + h * SIZE + j for p in range(3) for j in range(SIZE)]
        norms.append(np.sqrt((qkv[:, cols] ** 2).sum() + (proj[h * SIZE : (h + 1) * SIZE] ** 2).sum()))
    return np.sort(np.argsort(-np.asarray(norms), kind="stable")[:keep])


def _heads_zeroed(module, layers, kept, ids) -> np.ndarray:
    """The torch module's output with c_proj's rows of every dropped head zeroed (restored after)."""
    saved = [layer.attn.c_proj.weight.detach().clone() for layer in layers]
    with torch.no_grad():
        for layer, keep in zip(layers, kept, strict=True):
            for h in sorted(set(range(HEADS)) - set(keep.tolist())):
                layer.attn.c_proj.weight[h * SIZE : (h + 1) * SIZE] = 0
        y = module(ids).numpy()
        for layer, w in zip(layers, saved, strict=True):
            layer.attn.c_proj.weight.copy_(w)
    return y


@pytest.mark.slow
@pytest.mark.parametrize("lm_head", [False, True], ids=["GPT2Model", "GPT2LMHeadModel"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_gpt2_heads_of_the_fused_c_attn_shrink(dynamo, lm_head):
    model = _gpt2_heads(lm_head)
    module = (_Logits(model) if lm_head else LastHidden(model)).eval()
    layers = list(model.transformer.h if lm_head else model.h)
    ids = torch.randint(0, 50, (2, 7))
    dense = export(module, ids, dynamo=dynamo)
    found = onnx_groups(dense, "heads")
    assert [g.group.channels for g in found.groups] == [HEADS, HEADS]
    assert all(len(g.producers) == 1 and len(g.consumers) == 1 for g in found.groups)
    # c_attn's weight is three members (Q, K and V column blocks), c_proj's one
    prefix = "model.transformer.h" if lm_head else "model.h"
    for g, i in zip(found.groups, range(2), strict=True):
        weights = [dict(g.views).get(m.key) for m in g.group.members if m.weight]
        qkv = [v for v in weights if v is not None and v.source == f"{prefix}.{i}.attn.c_attn.weight"]
        assert sorted(v.start for v in qkv) == [0, HIDDEN, 2 * HIDDEN] and all(v.block == SIZE for v in qkv)
    small, report = shrink_onnx(dense, 0.5, kind="heads")
    onnx.checker.check_model(small, full_check=True)
    want = [_kept_heads(layer.attn, HEADS // 2) for layer in layers]
    assert [report.kept[g.group.name] for g in found.groups] == [w.tolist() for w in want]
    got = run(small, ids.numpy(), "x")
    np.testing.assert_allclose(got, _heads_zeroed(module, layers, want, ids), rtol=1e-4, atol=2e-5)
    with torch.no_grad():
        assert not np.allclose(got, module(ids).numpy(), atol=1e-3)
    np.testing.assert_allclose(got, run(zeroed_onnx(dense, report), ids.numpy(), "x"), rtol=1e-5, atol=1e-6)
    shapes = {t.name: list(t.dims) for t in small.graph.initializer}
    for i in range(2):
        assert shapes[f"{prefix}.{i}.attn.c_attn.weight"] == [HIDDEN, 3 * HIDDEN // 2]
        assert shapes[f"{prefix}.{i}.attn.c_proj.weight"] == [HIDDEN // 2, HIDDEN]
    # every bias column of a dropped head went too, in Q, K and V
    assert sorted(d for name, d in shapes.items() if "c_attn.bias" in name) == [[3 * HIDDEN // 2]] * 2


@pytest.mark.slow
def test_gpt2_heads_on_the_command_line(tmp_path, capsys):
    model = _gpt2_heads()
    module = LastHidden(model).eval()
    ids = torch.randint(0, 50, (2, 7))
    src, out = tmp_path / "gpt2.onnx", tmp_path / "small.onnx"
    onnx.save(export(module, ids), src)
    base = ["prune", str(src), "--method", "ln_structured", "--amount", "0.25", "--shrink", "--groups", "heads"]
    capsys.readouterr()
    assert main([*base, "--dry-run"]) == 0
    printed, err = capsys.readouterr()
    assert err == ""
    groups = [line for line in printed.splitlines() if line.startswith("group ")]
    assert len(groups) == 2 and all("(4 -> 3 heads, Gemm '" in g for g in groups)
    for i, g in enumerate(groups):  # Q, K and V column blocks of c_attn, c_proj's rows
        blocks = [f"model.h.{i}.attn.c_attn.weight[1/8{at}]" for at in ("", " from 32", " from 64")]
        assert all(b in g for b in blocks) and g.endswith(f"model.h.{i}.attn.c_proj.weight[0/8]")
    assert not out.exists()
    assert main([*base, "-o", str(out), "--verify", "--verify-tol", "1e-4,1e-5"]) == 0
    printed, err = capsys.readouterr()
    assert err == ""
    assert any(line.startswith("verify: output") and line.endswith(": pass") for line in printed.splitlines())
    want = [_kept_heads(layer.attn, 3) for layer in model.h]
    want_y = _heads_zeroed(module, list(model.h), want, ids)
    np.testing.assert_allclose(run(onnx.load(str(out)), ids.numpy(), "x"), want_y, rtol=1e-4, atol=2e-5)
