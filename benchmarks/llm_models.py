"""Small trained language models for the structured-pruning benchmarks, cached.

::

    python -m benchmarks.llm_models [--models llama,mixtral] [--cache DIR] [--steps N] [--out benchmarks/results]

Trains, on the CPU, two byte-level causal language models on text shipped with Python,
the standard library's ``.py`` sources (``sysconfig.get_paths()["stdlib"]``; test suites
left out; every tenth file in sorted order held out for evaluation):

* ``llama``: Llama-style (RMSNorm, rotary positions, grouped-query attention 8 heads over
  4 KV heads, SwiGLU MLP), hidden 256, 4 layers, intermediate 704: 3.1M parameters;
* ``mixtral``: Mixtral-style, hidden 192, 4 layers, 6 heads over 2 KV heads, 8 experts of
  intermediate 192, 2 per token: 4.1M parameters.

500 steps of 8 sequences of 128 bytes (AdamW, warm-up then cosine decay): 0.5M tokens,
one thread, a few minutes each.

The vocabulary is the 256 byte values plus ``<bos>`` (256), ``<eos>`` (257, between
files) and ``<pad>`` (258), 260 ids. Each model is saved by ``save_pretrained`` in shards
into ``DIR/<name>-<key>/model`` (``DIR`` defaults to ``~/.cache/arrayprune/llm``; ``key`` a
hash of the recipe and of the Python version, whose sources are the data) with
``train.npz`` (calibration: 128 sequences of 128 tokens drawn from the training files)
and ``heldout.npz`` (64 sequences of 128 tokens from the held-out files), ``input_ids``
as ``arrayprune prune --calibration`` and ``arrayprune eval --tokens`` read them. A model
already in the cache is not trained again. Held-out perplexity (``arrayprune eval``) is
written to ``--out/llm-models-<machine>.md``.

From Python: :func:`trained` returns a model's folder and token files, training it first
if needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BOS, EOS, PAD = 256, 257, 258
VOCAB = 260
SEQ = 128
CALIBRATION = 128  # train.npz sequences
HELD_OUT = 64  # heldout.npz sequences
RECIPE_VERSION = 1  # bump when the data or the training changes: a new cache key


@dataclass(frozen=True)
class Recipe:
    """A model's architecture and its training (what the cache key hashes)."""

    name: str
    config: dict[str, Any]
    steps: int = 500
    batch: int = 8
    lr: float = 3e-3
    warmup: int = 30
    seed: int = 0

    def key(self) -> str:
        text = json.dumps(
            [RECIPE_VERSION, self.name, self.config, self.steps, self.batch, self.lr, self.warmup, self.seed,
             sys.version_info[:2]], sort_keys=True,
        )  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:10]


_COMMON = {
    "vocab_size": VOCAB,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}

RECIPES = {
    "llama": Recipe(
        "llama",
        {"architecture": "LlamaForCausalLM", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, **_COMMON},
    ),  # fmt: skip
    "llama8": Recipe(  # deeper and narrower, about the same size: which layers to remove (layer_choice)
        "llama8",
        {"architecture": "LlamaForCausalLM", "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 8,
         "num_attention_heads": 6, "num_key_value_heads": 3, **_COMMON},
    ),  # fmt: skip
    "mixtral": Recipe(
        "mixtral",
        {"architecture": "MixtralForCausalLM", "hidden_size": 192, "intermediate_size": 192, "num_hidden_layers": 4,
         "num_attention_heads": 6, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
         **_COMMON},
    ),  # fmt: skip
}


def default_cache() -> Path:
    """``$ARRAYPRUNE_CACHE/llm`` or ``~/.cache/arrayprune/llm``."""
    root = os.environ.get("ARRAYPRUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "arrayprune")
    return Path(root) / "llm"


# -- data ---------------------------------------------------------------------------------


def source_files() -> tuple[list[Path], list[Path]]:
    """The standard library's ``.py`` files (no test suites), split: training, held out (every tenth)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = sorted(
        p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts) and p.stat().st_size > 0
    )
    held = files[::10]
    chosen = set(held)
    return [p for p in files if p not in chosen], held


def byte_stream(files: list[Path]) -> np.ndarray:
    """The files' bytes, each file followed by ``<eos>``, as int64 ids."""
    parts = []
    for path in files:
        parts.append(np.frombuffer(path.read_bytes(), np.uint8).astype(np.int64))
        parts.append(np.array([EOS], np.int64))
    return np.concatenate(parts)


def windows(stream: np.ndarray, count: int, seq: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """`count` windows of `seq` ids, each starting with ``<bos>``: at random starts (`rng`), else evenly spread."""
    body = seq - 1
    if rng is not None:
        starts = rng.integers(0, len(stream) - body, count)
    else:
        starts = np.linspace(0, len(stream) - body, count, endpoint=False).astype(np.int64)
    rows = np.stack([stream[s : s + body] for s in starts])
    return np.concatenate([np.full((count, 1), BOS, np.int64), rows], axis=1)


# -- training -----------------------------------------------------------------------------


def _model(recipe: Recipe) -> Any:
    import transformers

    config = dict(recipe.config)
    cls = getattr(transformers, config.pop("architecture"))
    return cls(cls.config_class(**config))


def train(recipe: Recipe, folder: Path, log: Any = print) -> dict[str, Any]:
    """Train `recipe` on the standard library and save it, with its token files, into `folder`."""
    import torch

    train_files, held_files = source_files()
    stream, held = byte_stream(train_files), byte_stream(held_files)
    torch.set_num_threads(1)  # several times faster than 2 threads on 2 shared cores, measured
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    model = _model(recipe).train()
    params = sum(p.numel() for p in model.parameters())
    log(f"{recipe.name}: {params / 1e6:.2f}M parameters, {len(stream) / 1e6:.1f}M training bytes "
        f"({len(train_files)} files), {len(held) / 1e6:.2f}M held out ({len(held_files)} files)")  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.1, betas=(0.9, 0.95))

    def rate(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    start, losses = time.perf_counter(), []
    for step in range(recipe.steps):
        ids = torch.from_numpy(windows(stream, recipe.batch, SEQ, rng))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if step % 50 == 0 or step == recipe.steps - 1:
            log(f"  step {step:4d}  loss {np.mean(losses[-50:]):.3f}  {time.perf_counter() - start:6.0f} s")
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder / "model", max_shard_size="4MB")
    np.savez(folder / "train.npz", input_ids=windows(stream, CALIBRATION, SEQ, np.random.default_rng(1)))
    np.savez(folder / "heldout.npz", input_ids=windows(held, HELD_OUT, SEQ))
    info = {
        "name": recipe.name, "key": recipe.key(), "parameters": params, "steps": recipe.steps,
        "tokens_seen": recipe.steps * recipe.batch * SEQ, "train_seconds": seconds,
        "final_train_loss": float(np.mean(losses[-50:])), "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
    }  # fmt: skip
    (folder / "info.json").write_text(json.dumps(info, indent=2) + "\n")  # last: its presence means done
    return info


@dataclass(frozen=True)
class Trained:
    """A cached model: its folder (``save_pretrained``), token files and training record."""

    name: str
    folder: Path
    model: Path
    train_tokens: Path
    heldout_tokens: Path
    info: dict[str, Any]


def trained(name: str, cache: Path | None = None, steps: int | None = None, log: Any = print) -> Trained:
    """The model `name` of :data:`RECIPES` from the cache, trained first if it is not there."""
    recipe = RECIPES[name]
    if steps is not None:
        recipe = Recipe(recipe.name, recipe.config, steps=steps, batch=recipe.batch, lr=recipe.lr,
                        warmup=min(recipe.warmup, max(1, steps // 10)), seed=recipe.seed)  # fmt: skip
    folder = (cache or default_cache()) / f"{name}-{recipe.key()}"
    done = folder / "info.json"
    if done.exists():
        info = json.loads(done.read_text())
        log(f"{name}: cached in {folder}")
    else:
        info = train(recipe, folder, log)
    return Trained(name, folder, folder / "model", folder / "train.npz", folder / "heldout.npz", info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,mixtral")
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: each recipe's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    from arrayprune.adapters.pipeline.evaluate import evaluate

    rows = []
    for name in args.models.split(","):
        model = trained(name, args.cache, args.steps)
        result = evaluate(model.model, model.heldout_tokens)
        print(f"{name}: held-out {result.summary()}")
        info = model.info
        rows.append(
            f"| {name} | {info['parameters'] / 1e6:.2f}M | {info['steps']} | {info['tokens_seen'] / 1e6:.2f}M | "
            f"{info['train_seconds']:.0f} | {info['final_train_loss']:.3f} | {result.loss:.3f} | "
            f"{result.perplexity:.3f} | {result.tokens} |"
        )
    machine = f"cpu-{platform.machine()}-{os.cpu_count()}cores"
    text = "\n".join([
        f"# Trained benchmark language models ({machine})",
        "",
        f"Command: `python -m benchmarks.llm_models --models {args.models}"
        + (f" --steps {args.steps}" if args.steps else "") + "`",
        "",
        "Byte-level (260 ids), trained on the CPU on the Python "
        f"{platform.python_version()} standard library's sources (every tenth file held out); "
        "held-out loss and perplexity per byte by `arrayprune eval` (layer by layer).",
        "",
        "| model | parameters | steps | tokens seen | train s | train loss | held-out loss | held-out perplexity | tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"llm-models-{machine}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
