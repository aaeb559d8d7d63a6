"""Small random-init Hugging Face models for the tests, built by ``transformers`` itself.

One place for the Llama configuration the Hugging Face tests share (grouped-query
attention: 4 query heads over 2 KV heads), so that their folders are the same model, and
for one tiny model of each decoder family of the shrinking table (:data:`FAMILY_MODELS`,
:func:`save_family`) with the checks their tests share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

tr = transformers

#: Token ids of the tests run in ``[0, VOCAB)``.
VOCAB = 128


def llama_config(hidden: int = 64, inner: int = 128, positions: int = 64, **overrides: Any) -> Any:
    """A two-layer Llama with grouped-query attention and a :data:`VOCAB`-token vocabulary."""
    return transformers.LlamaConfig(
        hidden_size=hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=inner,
        vocab_size=VOCAB,
        max_position_embeddings=positions,
        **overrides,
    )


def save_sharded_llama(folder: Path, config: Any = None, *, seed: int = 0, shard: str = "100KB") -> Path:
    """``save_pretrained`` of a random-init Llama (``torch.manual_seed(seed)``) in several shards."""
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config or llama_config()).eval().save_pretrained(folder, max_shard_size=shard)
    assert len([n for n in os.listdir(folder) if n.endswith(".safetensors")]) > 2  # sharded
    return folder


_COMMON = dict(
    vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip

#: family -> (config class, model class, overrides)
FAMILY_MODELS = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 20},
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "head_dim": 8},
    ),
}  # fmt: skip

IDS = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 32, 38, 46, 26]])


def save_family(folder, family, seed=0, shard="12KB", **overrides):
    """``save_pretrained`` of a random-init model of `family` in several shards; the model class."""
    config_cls, model_cls, extra = FAMILY_MODELS[family]
    torch.manual_seed(seed)
    cfg = getattr(tr, config_cls)(**{**_COMMON, **extra, **overrides})
    model = getattr(tr, model_cls)(cfg).eval()
    with torch.no_grad():  # norms and biases away from their initial values, so that slicing them shows
        g = torch.Generator().manual_seed(seed + 1)
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(folder, max_shard_size=shard)
    assert len([n for n in os.listdir(folder) if n.endswith(".safetensors")]) > 2  # sharded
    return getattr(tr, model_cls)


def load(cls, folder):
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and not info["error_msgs"], info
    return model.eval()


def zeroed(cls, folder, cuts):
    """The dense model with `cuts` ({param name: (axis, dropped indices)}) set to zero."""
    model = cls.from_pretrained(folder).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, (axis, dropped) in cuts.items():
            index = [slice(None)] * params[name].ndim
            index[axis] = torch.as_tensor(np.asarray(dropped), dtype=torch.long)
            params[name][tuple(index)] = 0
    return model


def tensors(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def check_generates(model, vocab=64):
    with torch.no_grad():
        out = model.generate(IDS[:, :4], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8) and int(out.max()) < vocab
