"""SparseGPT (or Wanda) on the CPU beside llmcompressor: the same BERT, the same calibration tokens, one process.

The model is a random-init ``transformers`` ``BertModel`` (hidden 512, 6 layers, 8 heads,
FFN 2048: 35 M parameters, 36 encoder ``Linear`` weights), saved by ``save_pretrained``
and exported to ONNX (``torch.onnx.export``, TorchScript). Calibration: 64 sequences of
128 random token ids; held out: 16 more. Each round runs, in this order and then
reversed in the next round (alternating):

* **llmcompressor** 0.14: ``oneshot`` with ``SparseGPTModifier(sparsity=0.5,
  block_size=128, dampening_frac=0.01)`` on the ``Linear`` layers of the encoder,
  ``pipeline="sequential"`` over ``BertLayer`` (the model is read from the folder);
* **arrayprune, Hugging Face folder**: ``prune_file(folder, out, method="sparsegpt",
  amount=0.5, calibration=tokens)`` (transformers layer by layer, sequential);
* **arrayprune, ONNX** (``--onnx``): the same on the export (onnxruntime, sequential).

``--method wanda`` runs Wanda instead: llmcompressor's ``WandaPruningModifier(sparsity=0.5)``
(sequential: each layer's input norms taken on the model whose earlier layers are pruned)
beside arrayprune's ``prune_file(..., method="wanda")`` (the input norms of the dense
model, one pass; results in ``wanda-llmcompressor-cpu.md``).

Reported: wall time of the whole call (reading and writing included for arrayprune;
the in-memory model for llmcompressor), and the cosine of the last hidden state to the
dense model's on the held-out tokens (mean over positions). Every weight ends 50% zero.

llmcompressor pins its own ``transformers``; install both in one virtual environment::

    python -m venv /tmp/venv_llmc && /tmp/venv_llmc/bin/pip install torch==2.13.0
    /tmp/venv_llmc/bin/pip install "llmcompressor==0.14.*" onnx onnxruntime safetensors
    /tmp/venv_llmc/bin/pip install -e .
    /tmp/venv_llmc/bin/python -m benchmarks.sparsegpt_llmcompressor --rounds 2 [--onnx]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIG = {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048}
VOCAB = 30522
CALIBRATION, HELD_OUT, SEQ = 64, 16, 128


def _build(folder: Path) -> dict[str, Path]:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, **CONFIG)).eval()
    model.save_pretrained(folder / "bert")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                + [f"t{i}" for i in range(VOCAB - 5)]) + "\n")

    class Hidden(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids).last_hidden_state

    example = torch.zeros(1, SEQ, dtype=torch.int64)
    torch.onnx.export(Hidden(model), (example,), str(folder / "bert.onnx"), input_names=["input_ids"],
                      output_names=["hidden"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"}},
                      opset_version=17, dynamo=False)
    rng = np.random.default_rng(0)
    np.savez(folder / "calibration.npz", input_ids=rng.integers(5, VOCAB, (CALIBRATION, SEQ)).astype(np.int64))
    np.savez(folder / "held_out.npz", input_ids=rng.integers(5, VOCAB, (HELD_OUT, SEQ)).astype(np.int64))
    return {"folder": folder / "bert", "onnx": folder / "bert.onnx", "tokens": folder / "calibration.npz"}


def _hidden(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)).last_hidden_state.double().numpy()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float(np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def _llmcompressor(paths: dict[str, Path], work: Path, method: str) -> tuple[float, object]:
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier

    ids = np.load(paths["tokens"])["input_ids"]
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
    tokenizer = transformers.BertTokenizer(str(work / "vocab.txt"))
    start = time.perf_counter()
    model = transformers.BertModel.from_pretrained(paths["folder"]).eval()
    if method == "wanda":
        recipe = WandaPruningModifier(sparsity=0.5, targets=["Linear"], ignore=["re:.*pooler.*"])
    else:
        recipe = SparseGPTModifier(sparsity=0.5, targets=["Linear"], ignore=["re:.*pooler.*"], block_size=128,
                                   dampening_frac=0.01)
    oneshot(model=model, processor=tokenizer, dataset=data, recipe=recipe, num_calibration_samples=CALIBRATION,
            max_seq_length=SEQ, pipeline="sequential", sequential_targets=["BertLayer"])
    return time.perf_counter() - start, model


def _arrayprune(source: Path, out: Path, tokens: Path, method: str) -> float:
    from arrayprune.adapters.pipeline import prune_file

    start = time.perf_counter()
    prune_file(source, out, method=method, amount=0.5, calibration=tokens, force=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sparsegpt_llmcompressor")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--onnx", action="store_true", help="also the ONNX export through onnxruntime")
    parser.add_argument("--method", choices=["sparsegpt", "wanda"], default="sparsegpt")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    import onnxruntime as ort
    import transformers

    work = Path(tempfile.mkdtemp(prefix="sgpt-llmc-"))
    paths = _build(work)
    held = np.load(work / "held_out.npz")["input_ids"]
    dense = _hidden(transformers.BertModel.from_pretrained(paths["folder"]).eval(), held)
    runs = ["llmcompressor", "arrayprune-folder"] + (["arrayprune-onnx"] if args.onnx else [])
    times: dict[str, list[float]] = {r: [] for r in runs}
    loads: dict[str, list[float]] = {r: [] for r in runs}  # 1-minute load average when each call ended
    cosine: dict[str, float] = {}
    for round_ in range(args.rounds):
        for run in runs if round_ % 2 == 0 else runs[::-1]:
            if run == "llmcompressor":
                seconds, model = _llmcompressor(paths, work, args.method)
                cosine[run] = _cosine(_hidden(model, held), dense)
            elif run == "arrayprune-folder":
                seconds = _arrayprune(paths["folder"], work / "out-folder", paths["tokens"], args.method)
                pruned = transformers.BertModel.from_pretrained(work / "out-folder").eval()
                cosine[run] = _cosine(_hidden(pruned, held), dense)
            else:
                seconds = _arrayprune(paths["onnx"], work / "out.onnx", paths["tokens"], args.method)
                session = ort.InferenceSession(str(work / "out.onnx"), providers=["CPUExecutionProvider"])
                cosine[run] = _cosine(session.run(None, {"input_ids": held})[0].astype(np.float64), dense)
            times[run].append(seconds)
            loads[run].append(os.getloadavg()[0])
            print(f"round {round_ + 1}: {run} {seconds:.1f} s, cosine {cosine[run]:.4f}, load {loads[run][-1]:.2f}",
                  flush=True)

    import torch

    title = "Wanda" if args.method == "wanda" else "SparseGPT"
    how = ("llmcompressor sequential, arrayprune from the dense model's input norms" if args.method == "wanda"
           else "sequential")
    lines = [
        f"# {title} on the CPU beside llmcompressor 0.14 (one process, alternating)",
        "",
        f"{platform.machine()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}. Command: "
        f"`python -m benchmarks.sparsegpt_llmcompressor --rounds {args.rounds}{' --onnx' if args.onnx else ''}"
        f"{' --method wanda' if args.method == 'wanda' else ''}`.",
        "",
        f"BERT (random init, 35 M parameters, 36 encoder Linear weights), {CALIBRATION} x {SEQ} calibration tokens, "
        f"50% of every weight, {how}; cosine of the last hidden state to the dense model on "
        f"{HELD_OUT} x {SEQ} held-out tokens.",
        "",
        "| run | wall time, median (all) | 1-min load average after each | cosine to dense |",
        "| --- | --- | --- | --- |",
    ]
    for run in runs:
        every = ", ".join(f"{t:.1f}" for t in times[run])
        load = ", ".join(f"{x:.2f}" for x in loads[run])
        lines.append(f"| {run} | {statistics.median(times[run]):.1f} s ({every}) | {load} | {cosine[run]:.4f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.method}-llmcompressor-cpu.md").write_text("\n".join(lines) + "\n")
    (out / f"{args.method}-llmcompressor-cpu.json").write_text(json.dumps({"times": times, "load": loads, "cosine": cosine}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
