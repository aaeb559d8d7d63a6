"""``--groups heads`` on ONNX exports of transformers BERT and ViT (random weights).

Each attention block's heads are one group: the query, key and value projections'
column blocks (and biases), the output projection's row blocks, and the ``Reshape``
targets that state a head count. The reference is computed in torch, independently of
the ONNX graph: the dense module with the output projection's input columns of the
dropped heads set to zero; the dropped heads are those of least L2 norm over the four
projections' blocks, from the module's own parameters in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_onnx_shrink_residual import LastHidden, expected_after, export, run  # noqa: E402

from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx  # noqa: E402

HEADS, SIZE, HIDDEN = 4, 8, 32


def build(family: str):
    """(module, input, attention modules) with random weights, zero biases as initialized."""
    torch.manual_seed(0)
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=60, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
            intermediate_size=64, max_position_embeddings=20,
        )  # fmt: skip
        model = transformers.BertModel(config, add_pooling_layer=False)
        attention = [layer.attention for layer in model.encoder.layer]
        blocks = [(a.self.query, a.self.key, a.self.value, a.output.dense) for a in attention]
        x = torch.randint(0, 60, (2, 7))
    else:
        config = transformers.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=2,
            num_attention_heads=HEADS, intermediate_size=64,
        )  # fmt: skip
        model = transformers.ViTModel(config, add_pooling_layer=False)
        blocks = []
        for layer in model.encoder.layer if hasattr(model, "encoder") else model.layers:
            a = layer.attention
            if hasattr(a, "attention"):
                blocks.append((a.attention.query, a.attention.key, a.attention.value, a.output.dense))
            else:
                blocks.append((a.q_proj, a.k_proj, a.v_proj, a.o_proj))
        x = torch.randn(2, 3, 16, 16)
    return LastHidden(model).eval(), x, blocks


def kept_heads(block, keep: int) -> np.ndarray:
    q, k, v, o = (m.weight.detach().double().numpy() for m in block)
    norms = [
        sum((w[h * SIZE : (h + 1) * SIZE] ** 2).sum() for w in (q, k, v)) + (o[:, h * SIZE : (h + 1) * SIZE] ** 2).sum()
        for h in range(HEADS)
    ]
    return np.sort(np.argsort(-np.sqrt(norms), kind="stable")[:keep])


def heads_zeroed(module, blocks, kept: list[np.ndarray], x) -> np.ndarray:
    """The torch module's output with the dropped heads' columns of each output projection zeroed."""
    saved = [b[3].weight.detach().clone() for b in blocks]
    with torch.no_grad():
        for b, k in zip(blocks, kept, strict=True):
            for h in set(range(HEADS)) - set(k.tolist()):
                b[3].weight[:, h * SIZE : (h + 1) * SIZE] = 0
        y = module(x).numpy()
        for b, w in zip(blocks, saved, strict=True):
            b[3].weight.copy_(w)
    return y


@pytest.mark.parametrize("family", ["bert", "vit"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.slow
def test_heads_are_removed_whole(family, dynamo):
    module, x, blocks = build(family)
    model = export(module, x, dynamo=dynamo)
    found = onnx_groups(model, "heads")
    assert [g.group.channels for g in found.groups] == [HEADS, HEADS]
    assert all(len(g.producers) == 3 and len(g.consumers) == 1 for g in found.groups)
    assert all(g.unit == "heads" for g in found.groups)
    small, report = shrink_onnx(model, 0.5, kind="heads")
    onnx.checker.check_model(small, full_check=True)
    want = [kept_heads(b, HEADS // 2) for b in blocks]
    assert [report.kept[g.group.name] for g in found.groups] == [w.tolist() for w in want]
    xn = x.numpy()
    y = run(small, xn)
    np.testing.assert_allclose(y, heads_zeroed(module, blocks, want, x), rtol=1e-4, atol=2e-5)
    with torch.no_grad():
        assert not np.allclose(y, module(x).numpy(), atol=1e-3)
    assert report.params_after == expected_after(model, report)
    # the projections really are narrower: Q/K/V [32, 16], O [16, 32]
    narrow = sorted(tuple(t.dims) for t in small.graph.initializer if tuple(t.dims) in ((32, 16), (16, 32)))
    assert narrow == [(16, 32)] * 2 + [(32, 16)] * 6


@pytest.mark.slow
def test_heads_on_the_command_line(tmp_path, capsys):
    module, x, blocks = build("bert")
    src, out = tmp_path / "bert.onnx", tmp_path / "small.onnx"
    onnx.save(export(module, x), src)
    base = ["prune", str(src), "--method", "ln_structured", "--amount", "0.25", "--shrink", "--groups", "heads"]
    capsys.readouterr()
    assert main([*base, "--dry-run"]) == 0
    printed, err = capsys.readouterr()
    assert err == ""
    groups = [line for line in printed.splitlines() if line.startswith("group ")]
    assert len(groups) == 2 and all("(4 -> 3 heads, MatMul '" in g and " + 2 more)" in g for g in groups)
    assert main([*base, "-o", str(out), "--verify", "--verify-tol", "1e-4,1e-5"]) == 0
    printed, err = capsys.readouterr()
    assert err == ""
    assert any(line.startswith("verify: output") and line.endswith(": pass") for line in printed.splitlines())
    assert [line for line in printed.splitlines() if line.startswith("group ")][0].endswith("4 -> 3 heads kept")
    want = [kept_heads(b, 3) for b in blocks]
    np.testing.assert_allclose(
        run(onnx.load(str(out)), x.numpy()), heads_zeroed(module, blocks, want, x), rtol=1e-4, atol=2e-5
    )
