"""``arrayprune prune --shrink`` on the multi-GB Llama-shaped sharded checkpoint: time and peak memory.

::

    python -m benchmarks.shrink_sharded --dtype bfloat16 --gb 6 [--dir /tmp] [--out benchmarks/results]

Writes the synthetic checkpoint of :mod:`benchmarks.sharded` (hidden 4096, intermediate
11008, 32 heads of 128, as many Llama-7B-shaped layers as fit in ``--gb``, shards of
about 2 GB and an index) with a full Llama ``config.json``, then runs, each in a child
process (wall time, CPU time and peak RSS of that process):

* ``cp -r IN OUT`` (the floor: every byte read and written once);
* ``arrayprune prune IN -o OUT --shrink --method ln_structured --amount 0.5`` (MLP channels);
* the same with ``--groups heads`` (16 of 32 heads per layer).

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

from .sharded import CODES, HIDDEN, INTER, VOCAB, child, write_checkpoint

HEADS = 32


def llama_config(layers: int, dtype: str) -> dict:
    """A Llama-2-7B config with `layers` layers."""
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
    for i in range(layers):
        p = f"model.layers.{i}."
        if groups == "channels":
            assert cfg["intermediate_size"] == INTER // 2
            assert ckpt.tensors[p + "mlp.gate_proj.weight"].shape == (INTER // 2, HIDDEN)
            assert ckpt.tensors[p + "mlp.down_proj.weight"].shape == (HIDDEN, INTER // 2)
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
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="arrayprune-shrink-", dir=args.dir))
    rows = []
    try:
        src, dst = work / "in", work / "out"
        params, layers = write_checkpoint(src, args.dtype, args.gb)
        (src / "config.json").write_text(json.dumps(llama_config(layers, args.dtype), indent=2))
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        n_shards = len(list(src.glob("*.safetensors")))
        load = os.getloadavg()
        cli = [sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(dst), "--force", "--shrink"]
        cli += ["--method", "ln_structured", "--amount", "0.5"]
        runs = (
            ("`cp -r IN OUT` (floor)", ["cp", "-r", str(src), str(dst)], None),
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
        f"## Shrinking a sharded Llama-shaped checkpoint ({args.dtype}, {params / 1e9:.2f}B parameters, "
        f"{size / 1e9:.2f} GB in {n_shards} shards, {layers} layers)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, NumPy {np.__version__}; load average {load[0]:.1f} before the runs "
        "(other work shared the cores: wall times are upper bounds)",
        f"- command: `python -m benchmarks.shrink_sharded --dtype {args.dtype} --gb {args.gb:g}`; each run in a "
        "child process (wall time, CPU time, peak RSS of that process); the input is warm in the page cache",
        "",
        "| run | wall time | CPU time | peak RSS | output |",
        "|---|---|---|---|---|",
    ]
    for label, seconds, cpu, mib, holds in rows:
        lines.append(f"| {label} | {seconds:.1f} s | {cpu:.1f} s | {mib:.0f} MiB | {holds} |")
    per_layer = 3 * INTER * HIDDEN * (2 if args.dtype == "bfloat16" else 4) / 2**20
    lines += [
        "",
        f"Peak RSS does not grow with the model: one layer's group is in memory at a time (here the MLP's three "
        f"tensors, {per_layer:.0f} MiB as stored, widened to float32 for scoring), every other tensor is copied in "
        "chunks through memory maps whose pages are given back.",
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
