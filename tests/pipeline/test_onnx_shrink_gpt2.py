"""GPT-2 exports (transformers, random weights): the MLP's channels shrink through
``gelu_new`` (its ``Pow``), checked against the torch module with the dropped channels'
rows of ``c_proj`` zeroed. The attention heads of GPT-2's fused ``c_attn`` (one Conv1D
split into Q, K and V) are left: see docs/shrink.md.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_onnx_shrink_residual import LastHidden, export, run  # noqa: E402

from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import shrink_onnx  # noqa: E402


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
