"""Held-out perplexity of a small trained Mistral-style model after structured pruning: weight norm vs calibrated vs compensated.

``python -m benchmarks.structured_quality [--steps 800] [--cache DIR] [--out FILE]``

Trains (once, cached in ``--cache``) a byte-level Mistral-style model (4 layers, hidden
128, 4 heads, MLP 384; 0.85 M parameters; Llama's layers, but ``LlamaConfig`` would
refuse 3 heads of a hidden size of 128) on the Python standard library's own sources, the last 5%
held out; then removes MLP channels, KV heads or whole layers with
:func:`~arrayprune.adapters.pipeline.shrink_checkpoint.shrink_checkpoint` (``ln_structured``,
the weights' L2 norm) and
:mod:`~arrayprune.adapters.pipeline.shrink_structure` (calibrated scores on 32 training
sequences, with and without the consumer's refit; layers by their residual-stream
change), and reports the held-out perplexity of each (``transformers`` forward, 64
sequences of 96 bytes). A quick check of the shrink paths on a trained model; the full
benchmark (latency, Torch-Pruning, MoE) is ``arrayprune eval``'s.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

SEQ = 96


def _corpus() -> tuple[np.ndarray, np.ndarray]:
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    data = np.frombuffer(b"".join(open(f, "rb").read() for f in files), dtype=np.uint8).astype(np.int64)
    split = int(len(data) * 0.95)
    return data[:split], data[split:]


def train(folder: str, steps: int) -> None:
    """Train the model and write it with its calibration and evaluation token files."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    train_ids, held = _corpus()
    cfg = tr.MistralConfig(
        vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=SEQ, tie_word_embeddings=False, sliding_window=None,
    )  # fmt: skip
    model = tr.MistralForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)
    for step in range(steps):
        idx = rng.integers(0, len(train_ids) - SEQ - 1, size=16)
        x = torch.from_numpy(np.stack([train_ids[i : i + SEQ] for i in idx]))
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        for g in opt.param_groups:
            g["lr"] = 3e-3 * min(1.0, (step + 1) / 30) * (1 - step / steps)
    model.save_pretrained(os.path.join(folder, "dense"), max_shard_size="500KB")
    cal = np.stack([train_ids[i : i + SEQ] for i in rng.integers(0, len(train_ids) - SEQ, size=32)])
    np.savez(os.path.join(folder, "calibration.npz"), input_ids=cal)
    held_out = np.stack([held[i : i + SEQ] for i in range(0, 64 * SEQ, SEQ)])
    np.savez(os.path.join(folder, "held_out.npz"), input_ids=held_out)


def perplexity(folder: str, held_out: str) -> tuple[float, int]:
    import torch
    import transformers as tr

    model = tr.MistralForCausalLM.from_pretrained(folder).eval()
    ids = torch.from_numpy(np.load(held_out)["input_ids"])
    with torch.no_grad():
        losses = [model(ids[i : i + 16], labels=ids[i : i + 16]).loss.item() for i in range(0, len(ids), 16)]
    return float(np.exp(np.mean(losses))), sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "arrayprune-structured-quality"))
    p.add_argument("--out", default=None, help="write the table (markdown) here")
    args = p.parse_args(argv)

    import torch

    import arrayprune.adapters.cli  # noqa: F401  (the adapters in their order)
    from arrayprune.adapters.pipeline.shrink_checkpoint import shrink_checkpoint
    from arrayprune.adapters.pipeline.shrink_structure import shrink_calibrated, shrink_layers

    torch.set_num_threads(2)
    dense = os.path.join(args.cache, "dense")
    start = time.perf_counter()
    if not os.path.isdir(dense):
        os.makedirs(args.cache, exist_ok=True)
        train(args.cache, args.steps)
    trained = time.perf_counter() - start
    cal, held = os.path.join(args.cache, "calibration.npz"), os.path.join(args.cache, "held_out.npz")
    out = os.path.join(args.cache, "pruned")
    base, total = perplexity(dense, held)
    rows = [("dense", "-", "-", base, total)]

    def add(kind: str, amount: float, name: str, shrink: Any, *shrink_args: Any, **shrink_kwargs: Any) -> None:
        shutil.rmtree(out, ignore_errors=True)
        shrink(dense, out, *shrink_args, **shrink_kwargs)
        ppl, params = perplexity(out, held)
        rows.append((kind, f"{amount:g}", name, ppl, params))

    for kind in ("channels", "heads"):
        for amount in (0.25, 0.5):
            add(kind, amount, "ln_structured (a)", shrink_checkpoint, amount, groups=kind)
            for method in ("activation_structured", "obs_structured"):
                for comp in (False, True):
                    label = f"{method} ({'c' if comp else 'b'})"
                    add(kind, amount, label, shrink_calibrated, amount, method, cal, groups=kind, compensated=comp)
    for count in (1, 2):
        add("layers", count / 4, "residual_change", shrink_layers, count, cal)
    lines = [
        "# Structured pruning of a small trained Mistral-style model: held-out perplexity",
        "",
        f"`python -m benchmarks.structured_quality --steps {args.steps}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, torch {torch.__version__}; "
        f"training {trained:.0f} s (0 when cached). Byte-level Mistral-style model, 4 layers, hidden 128, 4 heads (4 KV), "
        "MLP 384, trained on the standard library's sources; perplexity on 64 held-out sequences of 96 bytes. "
        "(a) weight norm, (b) calibrated score, (c) calibrated score + the consumer's refit; 32 calibration "
        "sequences.",
        "",
        "| removed | amount | method | perplexity | parameters |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {k} | {a} | {m} | {ppl:.3f} | {n:,} ({n / total:.0%}) |" for k, a, m, ppl, n in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
