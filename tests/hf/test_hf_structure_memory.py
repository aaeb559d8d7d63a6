"""Bounded memory of ``--groups layers`` and ``--groups experts`` on a multi-shard checkpoint.

A child process (so that its peak resident memory is its own) removes half the layers of
a 16-layer Llama, or half the experts of an 8-layer Mixtral, each about 200 MB of float32
in 10+ shards, on calibration token ids. Its peak resident memory above what it held
once the libraries were imported must stay well under the checkpoint's size: one
layer's weights at a time (13 MB and 25 MB here), not the model. Removed layers refit
into the layer before them (the default) add the refit's float64 ``X^T X`` of that
layer's ``down_proj`` inputs (intermediate size squared, 19 MB here) and the solve's
copy of it, allowed for as four such matrices (the allocator keeps what it freed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

CHILD = textwrap.dedent(
    """
    import json, sys
    import transformers
    from arrayprune.adapters import formats  # noqa: F401
    from arrayprune.adapters.pipeline import shrink_structure as ss

    kind, src, tokens, dst = sys.argv[1:5]
    getattr(transformers, "MixtralForCausalLM" if kind == "experts" else "LlamaForCausalLM")  # the model's module

    def rss(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    before = rss("VmRSS")
    if kind == "experts":
        done = ss.shrink_experts(src, dst, 0.5, tokens)
    else:
        done = ss.shrink_layers(src, dst, 0.5, tokens, compensated=kind == "layers-refit")
    print(json.dumps({"before": before, "peak": rss("VmHWM"), "after": done.params_after}))
    """
)

_COMMON = dict(
    vocab_size=128, hidden_size=512, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64
)  # fmt: skip


INTERMEDIATE = 1536


def _checkpoint(folder, kind):
    torch.manual_seed(0)
    if kind != "experts":
        model = tr.LlamaForCausalLM(tr.LlamaConfig(intermediate_size=INTERMEDIATE, num_hidden_layers=16, **_COMMON))
    else:
        cfg = tr.MixtralConfig(intermediate_size=512, num_hidden_layers=8, num_local_experts=8, num_experts_per_tok=2,
                               **_COMMON)  # fmt: skip
        model = tr.MixtralForCausalLM(cfg)
    model.save_pretrained(folder, max_shard_size="20MB")
    del model
    return sum(os.path.getsize(folder / n) for n in os.listdir(folder) if n.endswith(".safetensors"))


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["layers", "layers-refit", "experts"])
def test_peak_memory_is_one_layer_not_the_model(tmp_path, kind):
    size = _checkpoint(tmp_path / "dense", kind)
    assert size > 190 * 2**20 and len([n for n in os.listdir(tmp_path / "dense") if n.endswith(".safetensors")]) > 9
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, 128, size=(8, 32)))
    # glibc's allocator is pinned (one arena, a fixed mmap threshold): by default, how much
    # freed memory it keeps varies with the threads and the order of frees, by 100 MB from
    # run to run once the layers are chosen one at a time (dozens of K x K solves).
    env = dict(os.environ, MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(tmp_path / "dense"), str(tokens), str(tmp_path / "small")],
        check=False, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    grew = got["peak"] - got["before"]
    print(f"{kind}: checkpoint {size / 2**20:.0f} MB, peak RSS {got['peak'] / 2**20:.0f} MB, "
          f"{grew / 2**20:.0f} MB above the imports")  # fmt: skip
    # The model in float32 is the size; one layer is 7% (13%) of it. Above it: torch's first forward
    # (thread pools), 55-75 MB; the refit's sums and solves, about 90 MB more (the layers chosen
    # one at a time: 8 walks, each refitting every layer into the one before).
    refit = 4 * INTERMEDIATE**2 * 8 if kind == "layers-refit" else 0
    assert grew < 0.75 * size + refit, (grew, size, refit)
