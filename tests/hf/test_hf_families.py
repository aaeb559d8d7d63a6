"""``--shrink`` on every decoder family of the table: Mistral, Qwen2, Qwen3, Gemma, Phi-3, Mixtral, Qwen-MoE.

Each case saves a tiny random model of the family with ``save_pretrained`` in several
shards, shrinks it (MLP channels where the family has one MLP, KV groups of attention),
and checks that the result loads with ``from_pretrained`` with no missing, unexpected or
mismatched key, equals the dense model with the removed units zeroed where the next
layer reads them (``down_proj`` columns, ``o_proj`` columns), and generates.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

from arrayprune.adapters import formats  # noqa: E402, F401  (formats before the pipeline: an import cycle otherwise)
from arrayprune.adapters.pipeline.shrink_checkpoint import shrink_checkpoint  # noqa: E402
from hf_models import IDS, check_generates, load, save_family, tensors, zeroed  # noqa: E402

CHANNEL_FAMILIES = ["mistral", "qwen2", "qwen3", "gemma", "phi3"]
HEAD_FAMILIES = [*CHANNEL_FAMILIES, "mixtral", "qwen2_moe", "qwen3_moe"]


@pytest.mark.slow
@pytest.mark.parametrize("family", CHANNEL_FAMILIES)
def test_mlp_channels(tmp_path, family):
    cls = save_family(tmp_path / "dense", family)
    done = shrink_checkpoint(tmp_path / "dense", tmp_path / "small", 0.5)
    assert done.groups.family == family and done.config == {"intermediate_size": 12}
    dense, small = tensors(tmp_path / "dense"), tensors(tmp_path / "small")
    cuts = {}
    for i in range(2):
        p = f"model.layers.{i}.mlp."
        kept = np.asarray(done.kept[f"model.layers.{i}.mlp"])
        if family == "phi3":  # gate and up fused: rows kept and kept + 24
            gu, d = dense[p + "gate_up_proj.weight"].astype(np.float64), dense[p + "down_proj.weight"]
            score = (gu[:24] ** 2).sum(1) + (gu[24:] ** 2).sum(1) + (d.astype(np.float64) ** 2).sum(0)
            np.testing.assert_array_equal(kept, np.sort(np.argsort(score, kind="stable")[12:]))
            np.testing.assert_array_equal(
                small[p + "gate_up_proj.weight"], np.concatenate([gu[kept], gu[24 + kept]]).astype(np.float32)
            )
        cuts[p + "down_proj.weight"] = (1, np.setdiff1d(np.arange(24), kept))
    with torch.no_grad():
        got = load(cls, tmp_path / "small")
        want = zeroed(cls, tmp_path / "dense", cuts)
        np.testing.assert_allclose(got(IDS).logits.numpy(), want(IDS).logits.numpy(), rtol=0, atol=1e-5)
        full = cls.from_pretrained(tmp_path / "dense").eval()(IDS).logits.numpy()
    assert not np.allclose(got(IDS).logits.detach().numpy(), full, atol=1e-4)  # the channels did matter
    check_generates(got)


@pytest.mark.slow
@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_kv_groups(tmp_path, family):
    cls = save_family(tmp_path / "dense", family)
    done = shrink_checkpoint(tmp_path / "dense", tmp_path / "small", 0.5, groups="heads")
    cfg = cls.config_class.from_pretrained(tmp_path / "dense")
    hd = getattr(cfg, "head_dim", None) or 32 // 4
    assert done.config == {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hd}
    cuts = {}
    dense, small = tensors(tmp_path / "dense"), tensors(tmp_path / "small")
    for i in range(2):
        (g,) = done.kept[f"model.layers.{i}.self_attn"]
        q_cols = np.arange(g * 2 * hd, (g + 1) * 2 * hd)
        cuts[f"model.layers.{i}.self_attn.o_proj.weight"] = (1, np.setdiff1d(np.arange(4 * hd), q_cols))
        if family == "phi3":  # q rows of the KV group, then its k rows, then its v rows
            qkv = dense[f"model.layers.{i}.self_attn.qkv_proj.weight"]
            kv = np.arange(g * hd, (g + 1) * hd)
            rows = np.concatenate([q_cols, 4 * hd + kv, 6 * hd + kv])
            np.testing.assert_array_equal(small[f"model.layers.{i}.self_attn.qkv_proj.weight"], qkv[rows])
    with torch.no_grad():
        got = load(cls, tmp_path / "small")
        want = zeroed(cls, tmp_path / "dense", cuts)
        np.testing.assert_allclose(got(IDS).logits.numpy(), want(IDS).logits.numpy(), rtol=0, atol=1e-5)
    check_generates(got)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_channels_of_experts_refused(tmp_path, family):
    from arrayprune.adapters.roles.hf_groups import HfGroupsError, hf_groups

    shapes = {"model.layers.0.mlp.gate.weight": (4, 8), "model.layers.0.block_sparse_moe.gate.weight": (4, 8)}
    shapes = {k: v for k, v in shapes.items() if ("block_sparse" in k) == (family == "mixtral")}
    config = {"model_type": family, "num_hidden_layers": 1, "hidden_size": 8}
    with pytest.raises(HfGroupsError, match=r"^--groups channels: .* hold experts, not one MLP"):
        hf_groups(config, shapes)


@pytest.mark.slow
def test_heads_of_moe_with_dense_layers(tmp_path):
    """Qwen2-MoE with ``decoder_sparse_step=2``: layer 0 has a dense MLP, no router; every layer's heads shrink."""
    cls = save_family(tmp_path / "dense", "qwen2_moe", decoder_sparse_step=2)
    done = shrink_checkpoint(tmp_path / "dense", tmp_path / "small", 0.5, groups="heads")
    assert sorted(done.kept) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    cuts = {
        f"model.layers.{i}.self_attn.o_proj.weight": (1, np.setdiff1d(np.arange(32), np.arange(g * 16, g * 16 + 16)))
        for i, (g,) in enumerate(done.kept[f"model.layers.{i}.self_attn"] for i in range(2))
    }
    with torch.no_grad():
        got = load(cls, tmp_path / "small")(IDS).logits.numpy()
        np.testing.assert_allclose(got, zeroed(cls, tmp_path / "dense", cuts)(IDS).logits.numpy(), rtol=0, atol=1e-5)
