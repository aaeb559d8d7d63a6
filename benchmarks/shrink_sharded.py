"""``arrayprune prune --shrink`` on the multi-GB Llama-shaped sharded checkpoint: time and peak memory.

::

    python -m benchmarks.shrink_sharded --dtype bfloat16 --gb 6 [--units channels,heads|layers|experts]
        [--dir /tmp] [--out benchmarks/results]

Writes the synthetic checkpoint of :mod:`benchmarks.sharded` (hidden 4096, intermediate
11008, 32 heads of 128, as many Llama-7B-shaped layers as fit in ``--gb``, shards of
about 2 GB and an index) with a full Llama ``config.json``, then runs, each in a child
process (wall time, CPU time and peak RSS of that process):

* ``cp -r IN OUT`` (the floor: every byte read and written once);
* ``--units channels,heads`` (the default): ``arrayprune prune IN -o OUT --shrink --method
  ln_structured --amount 0.5`` (MLP channels), the same with ``--groups heads`` (16 of 32
  heads per layer);
* ``--units layers``: ``--groups layers --amount 0.25 --calibration tokens.npz`` (2 x 32
  random token ids), the layers run by ``transformers`` one at a time;
* ``--units experts``: a Mixtral-shaped checkpoint instead (8 experts of width 2752 per
  layer, Mixtral's tensor names), ``--groups experts --amount 2 --calibration tokens.npz``.

Checks each output: the new ``config.json`` sizes, every member's shape in the shard
headers, the index's ``total_size`` equal to the bytes of the tensors. Appends a section
to ``benchmarks/results/shrink-cpu-x86_64-2cores.md`` and deletes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from arrayprune.adapters.formats.sharded import open_checkpoint

from .sharded import CODES, EXPERT_INTER, HIDDEN, INTER, TOP_K, VOCAB, child, write_checkpoint

HEADS = 32
EXPERTS = 8


def llama_config(layers: int, dtype: str, experts: int = 0) -> dict:
    """A Llama-2-7B config with `layers` layers (a Mixtral config with `experts`)."""
    if experts:
        return {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "hidden_size": HIDDEN,
            "intermediate_size": EXPERT_INTER,
            "num_attention_heads": HEADS,
            "num_key_value_heads": HEADS,
            "num_hidden_layers": layers,
            "num_local_experts": experts,
            "num_experts_per_tok": TOP_K,
            "vocab_size": VOCAB,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096,
            "torch_dtype": dtype,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "torch_dtype": dtype,
    }


def check(out: Path, layers: int, groups: str) -> str:
    """What the output holds, checked: one line for the results."""
    cfg = json.loads((out / "config.json").read_text())
    ckpt = open_checkpoint(out)
    index = json.loads(Path(ckpt.index).read_text())
    total = sum(t.nbytes for t in ckpt.tensors.values())
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    if groups == "layers":
        kept = layers - round(0.25 * layers)
        assert cfg["num_hidden_layers"] == kept
        assert {n.split(".")[2] for n in ckpt.tensors if n.startswith("model.layers.")} == {str(i) for i in range(kept)}
    for i in range(layers if groups != "layers" else 0):
        p = f"model.layers.{i}."
        if groups == "channels":
            assert cfg["intermediate_size"] == INTER // 2
            assert ckpt.tensors[p + "mlp.gate_proj.weight"].shape == (INTER // 2, HIDDEN)
            assert ckpt.tensors[p + "mlp.down_proj.weight"].shape == (HIDDEN, INTER // 2)
        elif groups == "experts":
            assert cfg["num_local_experts"] == EXPERTS - 2
            assert ckpt.tensors[p + "block_sparse_moe.gate.weight"].shape == (EXPERTS - 2, HIDDEN)
            assert p + f"block_sparse_moe.experts.{EXPERTS - 3}.w1.weight" in ckpt.tensors
            assert p + f"block_sparse_moe.experts.{EXPERTS - 2}.w1.weight" not in ckpt.tensors
        else:
            assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (16, 16, 128)
            assert ckpt.tensors[p + "self_attn.q_proj.weight"].shape == (HIDDEN // 2, HIDDEN)
            assert ckpt.tensors[p + "self_attn.o_proj.weight"].shape == (HIDDEN, HIDDEN // 2)
    params = sum(t.size for t in ckpt.tensors.values())
    return f"{params / 1e9:.2f}B parameters, {total / 1e9:.2f} GB; config, shard headers and index checked"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shrink_sharded", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(CODES), default="bfloat16")
    parser.add_argument("--gb", type=float, default=6.0, help="size of the synthetic checkpoint (default: 6)")
    parser.add_argument("--dir", default=None, help="where to write it (default: a temporary folder)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument(
        "--units", choices=("channels,heads", "layers", "experts"), default="channels,heads", help="what goes"
    )
    args = parser.parse_args(argv)
    experts = EXPERTS if args.units == "experts" else 0

    work = Path(tempfile.mkdtemp(prefix="arrayprune-shrink-", dir=args.dir))
    rows = []
    try:
        src, dst = work / "in", work / "out"
        params, layers = write_checkpoint(src, args.dtype, args.gb, experts)
        (src / "config.json").write_text(json.dumps(llama_config(layers, args.dtype, experts), indent=2))
        tokens = work / "tokens.npz"
        np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, VOCAB, size=(2, 32)))
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        n_shards = len(list(src.glob("*.safetensors")))
        load = os.getloadavg()
        cli = [sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(dst), "--force", "--shrink"]
        cli += ["--method", "ln_structured", "--amount", "0.5"]
        calibrated = [*cli[:-2], "--calibration", str(tokens)]
        runs: tuple[tuple[str, list[str], str | None], ...] = (("`cp -r IN OUT` (floor)", ["cp", "-r", str(src), str(dst)], None),)
        if args.units == "layers":
            cut = round(0.25 * layers)
            label = f"`--shrink --groups layers --amount 0.25 --calibration` ({layers} -> {layers - cut} layers)"
            runs += ((label, [*calibrated, "--groups", "layers", "--amount", "0.25"], "layers"),)
        elif args.units == "experts":
            label = f"`--shrink --groups experts --amount 2 --calibration` ({EXPERTS} -> {EXPERTS - 2} experts per layer)"
            runs += ((label, [*calibrated, "--groups", "experts", "--amount", "2"], "experts"),)
        else:
            runs += (
                ("`--shrink` (MLP channels, 11008 -> 5504)", cli, "channels"),
                ("`--shrink --groups heads` (32 -> 16 heads)", [*cli, "--groups", "heads"], "heads"),
            )
        for label, cmd, groups in runs:
            shutil.rmtree(dst, ignore_errors=True)
            seconds, mib, cpu = child(cmd)
            holds = check(dst, layers, groups) if groups else ""
            rows.append((label, seconds, cpu, mib, holds))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        "",
        f"## Shrinking a sharded {'Mixtral' if experts else 'Llama'}-shaped checkpoint ({args.dtype}, "
        f"{params / 1e9:.2f}B parameters, "
        f"{size / 1e9:.2f} GB in {n_shards} shards, {layers} layers)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, NumPy {np.__version__}; load average {load[0]:.1f} before the runs "
        "(other work shared the cores: wall times are upper bounds)",
        f"- command: `python -m benchmarks.shrink_sharded --dtype {args.dtype} --gb {args.gb:g} --units {args.units}`; "
        "each run in a "
        "child process (wall time, CPU time, peak RSS of that process); the input is warm in the page cache",
        "",
        "| run | wall time | CPU time | peak RSS | output |",
        "|---|---|---|---|---|",
    ]
    for label, seconds, cpu, mib, holds in rows:
        lines.append(f"| {label} | {seconds:.1f} s | {cpu:.1f} s | {mib:.0f} MiB | {holds} |")
    itemsize = 2 if args.dtype == "bfloat16" else 4
    if args.units == "channels,heads":
        per_layer = 3 * INTER * HIDDEN * itemsize / 2**20
        held = f"here the MLP's three tensors, {per_layer:.0f} MiB as stored, widened to float32 for scoring"
    else:
        mlp = EXPERTS * (3 * EXPERT_INTER * HIDDEN + HIDDEN) if experts else 3 * INTER * HIDDEN
        per_layer = (4 * HIDDEN * HIDDEN + mlp) * itemsize / 2**20
        held = (
            f"here one decoder layer's weights, {per_layer:.0f} MiB as stored, run by transformers on the "
            "calibration tokens, and their activations"
        )
    lines += [
        "",
        f"Peak RSS does not grow with the model: one layer is in memory at a time ({held}), every other tensor is "
        "copied in chunks through memory maps whose pages are given back.",
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "shrink-cpu-x86_64-2cores.md"
    with open(target, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
