# ruff: noqa: E501  (the table of cases reads one case a line)
"""Hash every output of a matrix of ``arrayprune prune`` runs: the refactoring check.

    python tools/output_matrix.py OUT.json [--keep DIR]

Builds its inputs from fixed seeds (the bundled ONNX example, the same weights as ONNX
with external data, ``.npz``, ``.pt``, one ``.safetensors`` file, a sharded checkpoint and
a Hugging Face Llama folder), runs each case through the command line's ``main`` and
writes, per case, the SHA-256 of every file written (or the error it printed). Run it on
two commits in the same environment and compare the JSON files: a change of the pipeline
that keeps behaviour keeps every hash. Uses only the command line, so that it runs on any
commit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _inputs(folder: Path) -> dict[str, Path]:
    import onnx
    import torch
    import transformers
    from onnx import numpy_helper

    out: dict[str, Path] = {}
    example = ROOT / "examples" / "mlp.onnx"
    out["onnx"] = Path(shutil.copy(example, folder / "mlp.onnx"))
    model = onnx.load(example)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    external = folder / "external"
    external.mkdir()
    onnx.save_model(model, external / "mlp.onnx", save_as_external_data=True, location="mlp.onnx.data", size_threshold=0)
    out["onnx-external"] = external / "mlp.onnx"
    np.savez(folder / "mlp.npz", **weights)
    out["npz"] = folder / "mlp.npz"
    torch.save({k: torch.from_numpy(v.copy()) for k, v in weights.items()}, folder / "mlp.pt")
    out["pt"] = folder / "mlp.pt"
    rng = np.random.default_rng(0)
    np.savez(folder / "calibration.npz", input=rng.standard_normal((32, 64)).astype(np.float32))
    out["calibration"] = folder / "calibration.npz"

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=128, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()
    llama.save_pretrained(folder / "llama", max_shard_size="100KB")
    out["hf"] = folder / "llama"
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in llama.state_dict().items() if k != "lm_head.weight"}
    save_file(state, folder / "llama.safetensors")
    out["safetensors"] = folder / "llama.safetensors"
    sharded = folder / "sharded"
    sharded.mkdir()
    for name in os.listdir(folder / "llama"):
        if name.endswith(".safetensors") or name.endswith(".index.json"):
            shutil.copy(folder / "llama" / name, sharded / name)
    out["sharded"] = sharded
    np.savez(folder / "tokens.npz", input_ids=rng.integers(0, 128, size=(8, 32)))
    out["tokens"] = folder / "tokens.npz"
    return out


#: (case, input, output name, options); {calibration} and {tokens} are filled in.
CASES = [
    ("onnx l1", "onnx", "out.onnx", ["--amount", "0.5"]),
    ("onnx global", "onnx", "out.onnx", ["--amount", "0.6", "--global"]),
    ("onnx nm", "onnx", "out.onnx", ["--method", "nm_structured", "--nm", "2:4"]),
    ("onnx ln_structured", "onnx", "out.onnx", ["--method", "ln_structured", "--amount", "0.25", "--n", "2", "--dim", "0"]),
    ("onnx random", "onnx", "out.onnx", ["--method", "random_unstructured", "--amount", "0.3", "--seed", "7"]),
    ("onnx shrink", "onnx", "out.onnx", ["--shrink", "--method", "ln_structured", "--amount", "0.5", "--n", "2"]),
    ("onnx wanda", "onnx", "out.onnx", ["--method", "wanda", "--amount", "0.5", "--calibration", "{calibration}"]),
    ("onnx sparsegpt", "onnx", "out.onnx", ["--method", "sparsegpt", "--amount", "0.5", "--calibration", "{calibration}"]),
    ("onnx sparsegpt nm one-pass", "onnx", "out.onnx", ["--method", "sparsegpt", "--nm", "2:4", "--one-pass", "--calibration", "{calibration}"]),
    ("onnx allocation owl", "onnx", "out.onnx", ["--method", "wanda", "--amount", "0.5", "--allocation", "owl", "--calibration", "{calibration}"]),
    ("onnx keep-masks", "onnx", "out.npz", ["--amount", "0.5", "--keep-masks"]),
    ("onnx-external l1", "onnx-external", "out.onnx", ["--amount", "0.5"]),
    ("onnx-external global", "onnx-external", "out.onnx", ["--amount", "0.5", "--global", "--lamp"]),
    ("npz l1", "npz", "out.npz", ["--amount", "0.5"]),
    ("npz global bounds", "npz", "out.npz", ["--amount", "0.5", "--global", "--min-sparsity", "0.2", "--max-sparsity", "0.8"]),
    ("npz block", "npz", "out.npz", ["--method", "block_unstructured", "--amount", "0.5", "--block", "4x4"]),
    ("pt l1", "pt", "out.pt", ["--amount", "0.5"]),
    ("pt global", "pt", "out.pt", ["--amount", "0.5", "--global"]),
    ("safetensors l1", "safetensors", "out.safetensors", ["--amount", "0.5"]),
    ("safetensors global", "safetensors", "out.safetensors", ["--amount", "0.5", "--global"]),
    ("sharded global", "sharded", "out", ["--amount", "0.5", "--global"]),
    ("sharded nm", "sharded", "out", ["--method", "nm_structured", "--nm", "2:4"]),
    ("sharded allocation owl", "sharded", "out", ["--amount", "0.5", "--allocation", "owl"]),
    ("hf l1", "hf", "out", ["--amount", "0.5"]),
    ("hf shrink channels", "hf", "out", ["--shrink", "--method", "ln_structured", "--amount", "0.25", "--n", "2"]),
    ("hf shrink heads", "hf", "out", ["--shrink", "--groups", "heads", "--method", "ln_structured", "--amount", "1", "--n", "2"]),
    ("hf wanda", "hf", "out", ["--method", "wanda", "--amount", "0.5", "--calibration", "{tokens}"]),
    ("hf sparsegpt", "hf", "out", ["--method", "sparsegpt", "--amount", "0.5", "--calibration", "{tokens}"]),
    ("hf sparsegpt allocation", "hf", "out", ["--method", "sparsegpt", "--amount", "0.5", "--allocation", "owl", "--calibration", "{tokens}"]),
    ("hf shrink layers", "hf", "out", ["--shrink", "--groups", "layers", "--amount", "1", "--calibration", "{tokens}"]),
    ("hf shrink layers plain", "hf", "out", ["--shrink", "--groups", "layers", "--amount", "1", "--no-compensate", "--calibration", "{tokens}"]),
]  # fmt: skip


def _hashes(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def main(argv: list[str]) -> int:
    from arrayprune.adapters.cli import main as cli

    target = Path(argv[0])
    keep = Path(argv[argv.index("--keep") + 1]) if "--keep" in argv else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inputs = _inputs(work)
        results = {}
        for case, source, out_name, options in CASES:
            out = work / "runs" / case.replace(" ", "_") / out_name
            out.parent.mkdir(parents=True)
            fill = {"calibration": str(inputs["calibration"]), "tokens": str(inputs["tokens"])}
            args = ["prune", str(inputs[source]), "-o", str(out), *(o.format(**fill) for o in options)]
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                status = cli(args)
            text = err.getvalue().replace(tmp, "TMP").strip().splitlines()[-1:]
            results[case] = _hashes(out) if status == 0 else {"error": text}
            print(f"{case}: {'ok' if status == 0 else results[case]}", flush=True)
        if keep is not None:
            shutil.copytree(work / "runs", keep, dirs_exist_ok=True)
    target.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
