"""SparseGPT on a Hugging Face folder computes nothing twice, and writes the same bytes.

The folder's layers are calibrated sequentially inside each decoder layer; the outputs of
the layers already pruned are kept and reused by the later steps' runs, the layer's
outputs come from its last run, the layers a step calibrates give zeros while the run
only goes on to see which layers share their input, and float32 inputs' ``X^T X`` comes
from its upper panels. Checked against the same call with all of that turned off (every
output computed, the layer run once more for its outputs, the full products): every file
written is equal byte for byte, on a Llama with grouped-query attention (separate q, k, v
of two widths) and on GPT-2 (one fused ``Conv1D`` for q, k and v, stored ``[in, out]``).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.torch import reconstruction  # noqa: E402
from hf_models import VOCAB, save_sharded_llama  # noqa: E402


def _llama(root):
    return save_sharded_llama(root / "llama")


def _gpt2(root):
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=32)
    torch.manual_seed(3)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(root / "gpt2")
    return root / "gpt2"


def _files(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def _everything_computed(monkeypatch):
    """The call as it was: no output kept, no zeros, full products, the layer run again for its outputs."""
    monkeypatch.setattr(reconstruction, "REUSE_BYTES", 0)
    monkeypatch.setattr(reconstruction._SharedCapture, "skipping", lambda self, layers: contextlib.nullcontext())
    monkeypatch.setattr(reconstruction, "_gram", lambda x: x.T @ x)
    prune_layers = reconstruction.reconstruct
    monkeypatch.setattr(reconstruction, "reconstruct", lambda *a, outputs=None, **k: prune_layers(*a, **k))


@pytest.mark.slow
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_the_folder_path_writes_the_bytes_of_computing_everything(tmp_path, monkeypatch, build):
    folder = build(tmp_path)
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=np.random.default_rng(4).integers(0, VOCAB, (12, 10)))
    products = []
    original = torch.nn.functional.linear

    def counted(*args, **kwargs):
        products.append(1)
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.nn.functional, "linear", counted)
        prune_file(folder, tmp_path / "fast", method="sparsegpt", amount=0.5, calibration=tokens, calibration_batch=4)
        fast = len(products)
        _everything_computed(patch)
        prune_file(folder, tmp_path / "slow", method="sparsegpt", amount=0.5, calibration=tokens, calibration_batch=4)
        slow = len(products) - fast
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow")
    written = {}
    for name in os.listdir(tmp_path / "fast"):
        if name.endswith(".safetensors"):
            written.update(safetensors_numpy.load_file(tmp_path / "fast" / name))
    second = (".layers.1.", ".h.1.")  # the second decoder layer's weights: pruned on the first's outputs
    pruned = [n for n in written if any(s in n for s in second) and n.endswith(("proj.weight", "c_attn.weight"))]
    assert len(pruned) >= 2
    for name in pruned:
        assert int((written[name] == 0).sum()) == written[name].size // 2, name
    if build is _llama:  # GPT-2's Conv1D is no F.linear
        assert fast < 0.6 * slow, (fast, slow)
