"""SparseGPT on a Hugging Face Llama of a billion parameters, on a GPU: the command line's path.

::

    python -m benchmarks.gpu_llama_sparsegpt OUTDIR [--device cuda] [--layers 16] [--samples 16]
        [--seqlen 256] [--tiny]

Builds a random-init ``LlamaForCausalLM`` from a config (hidden 2048, MLP 8192, 32 heads
over 8 KV heads, 32000 tokens; 16 layers: 1.01 B parameters), saves it with
``save_pretrained`` in bfloat16 shards of 2 GB, writes random calibration tokens, then
runs what ``arrayprune prune FOLDER -o OUT --method sparsegpt --amount 0.5 --calibration
tokens.npz --device DEVICE`` runs (:func:`arrayprune.adapters.prune_file`), timing it and
reading the device's peak memory (``torch.cuda.max_memory_allocated``). Checks that
every layer weight lost half its entries. Writes ``OUTDIR/gpu_llama_sparsegpt.json`` and
``.md``. ``--tiny`` (2 small layers) runs anywhere, ``--device cpu`` included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def _model(args: argparse.Namespace, folder: str) -> int:
    import torch
    import transformers

    size = (
        {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "vocab_size": 256}
        if args.tiny
        else {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": args.layers, "vocab_size": 32000}
    )  # fmt: skip
    config = transformers.LlamaConfig(max_position_embeddings=max(args.seqlen, 64), **size)
    torch.manual_seed(0)
    with torch.device("cuda" if args.device.startswith("cuda") else "cpu"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()  # random init on the GPU: fast
    count = sum(p.numel() for p in model.parameters())
    args.layer_parameters = sum(p.numel() for p in model.model.layers[0].parameters())
    model.save_pretrained(folder, max_shard_size="2GB")
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 16: 1.10 B parameters)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    layers_given, args.layers = args.layers, args.layers or 16  # a smaller --layers is a smaller model, asked for
    import torch
    from safetensors import safe_open

    from arrayprune.adapters import prune_file

    os.makedirs(args.outdir, exist_ok=True)
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        folder, out = os.path.join(tmp, "llama"), os.path.join(tmp, "pruned")
        t0 = time.perf_counter()
        params = _model(args, folder)
        built = time.perf_counter() - t0
        if not args.tiny and layers_given is None and params < 1e9:
            raise SystemExit(f"{params} parameters: give more --layers for a billion")
        tokens = os.path.join(tmp, "tokens.npz")
        vocab = 256 if args.tiny else 32000
        np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, vocab, (args.samples, args.seqlen)))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = prune_file(folder, out, method="sparsegpt", amount=0.5, calibration=tokens, device=args.device)
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        sparsity = []
        for name in sorted(os.listdir(out)):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(out, name), framework="pt") as stored:
                    for key in stored.keys():  # noqa: SIM118 (safe_open is no mapping)
                        if ".layers." in key and key.endswith("proj.weight"):
                            sparsity.append(float((stored.get_tensor(key) == 0).float().mean()))
    record = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "parameters": params,
        "layers": 2 if args.tiny else args.layers,
        "calibration": f"{args.samples} x {args.seqlen} tokens",
        "build_and_save_s": round(built, 1),
        "prune_s": round(seconds, 1),
        "peak_gpu_memory_gib": None if peak is None else round(peak, 2),
        "one_layer_float32_gib": round(args.layer_parameters * 4 / 2**30, 3),
        "model_float32_gib": round(params * 4 / 2**30, 2),
        "weights_pruned": len(sparsity),
        "sparsity_min": min(sparsity),
        "sparsity_max": max(sparsity),
        "pruned_tensors": len(result.targets),
    }
    with open(os.path.join(args.outdir, "gpu_llama_sparsegpt.json"), "w") as f:
        json.dump(record, f, indent=1)
    lines = [
        f"# SparseGPT on a {params / 1e9:.2f} B-parameter Llama, `--device {args.device}` ({record['device']})",
        "",
        "`python -m benchmarks.gpu_llama_sparsegpt OUT " + " ".join(argv[1:]) + "`",
        "",
        "| parameters | calibration | prune (s) | peak GPU memory (GiB) | one layer / model in float32 (GiB) "
        "| weights at 50% |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {params:,} | {record['calibration']} | {record['prune_s']} | {record['peak_gpu_memory_gib']} "
        f"| {record['one_layer_float32_gib']} / {record['model_float32_gib']} "
        f"| {len(sparsity)}, sparsity {min(sparsity):.4f}-{max(sparsity):.4f} |",
    ]
    with open(os.path.join(args.outdir, "gpu_llama_sparsegpt.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
