"""Small random-init Hugging Face models for the tests, built by ``transformers`` itself.

One place for the Llama configuration the Hugging Face tests share (grouped-query
attention: 4 query heads over 2 KV heads), so that their folders are the same model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import transformers

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
