"""The command line on a synthetic sharded checkpoint of several GB: time, peak memory, throughput.

::

    python -m benchmarks.sharded --dtype bfloat16 --gb 6 [--dir /tmp] [--out benchmarks/results]
    python -m benchmarks.sharded --dtype float32 --gb 6 --append

Writes a Llama-like checkpoint (hidden 4096, intermediate 11008, vocabulary 32000;
``embed_tokens``, ``lm_head``, norms and as many layers as fit in ``--gb``), in shards
of about 2 GB with a Hugging Face index and a ``config.json``, runs
``arrayprune prune IN -o OUT --amount 0.5`` with and without ``--global`` in a child
process (wall time and peak RSS of that process), checks the exact number of zeros,
measures the disk's direct (uncached) read speed on one shard, and deletes everything.
From the measured throughput it estimates a 70B bfloat16 checkpoint on this machine.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from arrayprune.adapters.formats import files
from arrayprune.adapters.formats.safetensors_stream import (
    CHUNK,
    StoredTensor,
    TensorFiles,
    TensorWriter,
    zero_count,
)
from arrayprune.adapters.formats.sharded import open_checkpoint

from .cli_model import _run

HIDDEN, INTER, VOCAB = 4096, 11008, 32000
CODES = {"bfloat16": "BF16", "float32": "F32"}
SHARD_BYTES = 2 << 30


#: The experts of the mixture-of-experts checkpoint (:func:`write_checkpoint` with `experts`),
#: each an MLP of this width (a quarter of Llama-7B's), and the experts each token runs.
EXPERT_INTER, TOP_K = INTER // 4, 2


def _shapes(layers: int, experts: int = 0) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (HIDDEN, HIDDEN)
        if experts:  # Mixtral's names: a router, then w1 (gate), w2 (down), w3 (up) per expert
            shapes[p + "block_sparse_moe.gate.weight"] = (experts, HIDDEN)
            for e in range(experts):
                q = p + f"block_sparse_moe.experts.{e}."
                shapes[q + "w1.weight"] = (EXPERT_INTER, HIDDEN)
                shapes[q + "w2.weight"] = (HIDDEN, EXPERT_INTER)
                shapes[q + "w3.weight"] = (EXPERT_INTER, HIDDEN)
        else:
            shapes[p + "mlp.gate_proj.weight"] = (INTER, HIDDEN)
            shapes[p + "mlp.up_proj.weight"] = (INTER, HIDDEN)
            shapes[p + "mlp.down_proj.weight"] = (HIDDEN, INTER)
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def _fill(rng: np.random.Generator, n: int, code: str) -> np.ndarray:
    x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
    return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16) if code == "BF16" else x


def write_checkpoint(folder: Path, dtype: str, gb: float, experts: int = 0) -> tuple[int, int]:
    """A sharded checkpoint of about `gb` GB; its number of parameters and of layers.

    With `experts`, each layer's MLP is that many experts of width :data:`EXPERT_INTER`
    and a router (Mixtral's tensor names), instead of Llama's.
    """
    code = CODES[dtype]
    itemsize = 2 if code == "BF16" else 4
    mlp = experts * (3 * EXPERT_INTER * HIDDEN + HIDDEN) if experts else 3 * INTER * HIDDEN
    per_layer = (4 * HIDDEN * HIDDEN + mlp) * itemsize
    layers = max(1, int((gb * 1e9 - 2 * VOCAB * HIDDEN * itemsize) // per_layer))
    shapes = _shapes(layers, experts)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * itemsize
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        shard = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        stored = [StoredTensor("", n, code, shapes[n], 0, int(np.prod(shapes[n])) * itemsize) for n in names]

        def write(f, stored=stored):
            writer = TensorWriter(f, {"format": "pt"}, stored)
            for t in stored:
                for start in range(0, t.size, CHUNK):
                    writer.write(t.name, _fill(rng, min(CHUNK, t.size - start), code))
            writer.finish()

        files.atomic_write(folder / shard, write)
        weight_map.update(dict.fromkeys(names, shard))
        total += sum(t.nbytes for t in stored)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "num_hidden_layers": layers}))
    return sum(int(np.prod(s)) for s in shapes.values()), layers


def direct_read_speed(path: Path, limit: int = 1 << 30) -> float | None:
    """Bytes per second read from disk, bypassing the page cache (O_DIRECT), or None."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return None
    buf = mmap.mmap(-1, 8 << 20)
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    try:
        done, start = 0, time.perf_counter()
        while done < limit and (n := os.readv(fd, [buf])):
            done += n
        return done / (time.perf_counter() - start)
    except OSError:
        return None
    finally:
        os.close(fd)


def buffered_write_speed(folder: Path, size: int = 1 << 30) -> float:
    """Bytes per second written through the page cache and synced (``fsync``), as OUT is."""
    block = bytes(8 << 20)
    path = folder / "write-speed.tmp"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return size / seconds


def child(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, mib = _run(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, mib, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def zeros_of_selected(folder: Path) -> tuple[int, int]:
    """Zeros and entries of the layer weights of a written checkpoint."""
    source = open_checkpoint(folder)
    zeros = total = 0
    with TensorFiles() as tf:
        for name, t in source.tensors.items():
            if ".layers." in name and name.endswith("proj.weight"):
                total += t.size
                zeros += sum(zero_count(raw, t.code) for raw in tf.chunks(t))
    return zeros, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(CODES), default="bfloat16")
    parser.add_argument("--gb", type=float, default=6.0, help="size of the synthetic checkpoint (default: 6)")
    parser.add_argument("--dir", default=None, help="where to write it (default: a temporary folder)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--append", action="store_true", help="add to the results file instead of starting it")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="arrayprune-sharded-", dir=args.dir))
    try:
        src, dst = work / "in", work / "out"
        t0 = time.perf_counter()
        params, layers = write_checkpoint(src, args.dtype, args.gb)
        made = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        n_shards = len(list(src.glob("*.safetensors")))
        disk = direct_read_speed(next(iter(sorted(src.glob("*.safetensors")))))
        written = buffered_write_speed(work)
        load = os.getloadavg()
        cli = [sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(dst), "--amount", "0.5", "--force"]
        runs = {}
        for label, extra in (("--global", ["--global"]), ("per tensor", [])):
            seconds, mib, cpu = child([*cli, *extra])
            zeros, selected = zeros_of_selected(dst)
            runs[label] = (seconds, mib, cpu, zeros, selected)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    itemsize = 2 if args.dtype == "bfloat16" else 4
    g_cpu = runs["--global"][2]
    rate = params / g_cpu
    lines = []
    if not args.append:
        lines += [
            "# `arrayprune prune` on synthetic sharded checkpoints (tensor by tensor, bounded memory)",
            "",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
            f"Python {platform.python_version()}, NumPy {np.__version__}",
            "- commands: `python -m benchmarks.sharded --dtype bfloat16 --gb 6` then "
            "`python -m benchmarks.sharded --dtype float32 --gb 6 --append`",
            "- each run: `arrayprune prune IN -o OUT --amount 0.5 --force [--global]` in a child process; wall time",
            "  and peak RSS of that process; the input was just written, so it is in the page cache (warm reads);",
            "  the synthetic data is deleted afterwards.",
            "",
        ]
    lines += [
        f"## {args.dtype}: {params / 1e9:.2f}B parameters, {size / 1e9:.2f} GB in {n_shards} shards "
        f"({layers} Llama-7B-shaped layers, embeddings, lm_head)",
        "",
        "| run | wall time | CPU time | peak RSS | bytes of peak RSS per parameter | throughput (wall) |"
        " zeros in the layer weights |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, (seconds, mib, cpu, zeros, selected) in runs.items():
        lines.append(
            f"| `{label}` | {seconds:.1f} s | {cpu:.1f} s | {mib:.0f} MiB | {mib * 2**20 / params:.3f} | "
            f"{params / seconds / 1e6:.0f} M params/s, {size / seconds / 1e9:.2f} GB/s | "
            f"{zeros:,} of {selected:,} ({'exact' if zeros == round(0.5 * selected) else 'NOT EXACT'}) |"
        )
    lines += [
        "",
        f"Writing the synthetic checkpoint took {made:.0f} s. Disk: direct (uncached) read of one shard "
        + (f"{disk / 1e9:.2f} GB/s" if disk else "not measured")
        + f", 1 GiB written through the page cache and synced {written / 1e9:.2f} GB/s (what OUT's writes get)."
        f" Load average during the runs: {load[0]:.1f} (other work shared the 2 cores): wall times are upper bounds.",
        "",
    ]
    if args.dtype == "bfloat16":
        b70 = 70e9 * itemsize
        cpu = 70e9 / rate
        reads = 2 * b70 / disk if disk else 0.0  # the histogram pass and the write pass
        writes = b70 / written
        lines += [
            f"Estimate for a 70B bfloat16 checkpoint (140 GB) with `--global` on this machine: {cpu / 60:.0f} min of"
            f" computation (the CPU time measured here, {rate / 1e6:.0f} M params per CPU second, scaled), and I/O: a"
            f" 140 GB model does not stay in a 24 GiB page cache, so both passes read it from disk ({reads / 60:.0f} min"
            f" at the direct read speed) and OUT is written at the synced write speed ({writes / 60:.0f} min): about"
            f" {max(cpu, reads + writes) / 60:.0f} to {(cpu + reads + writes) / 60:.0f} min, depending on how much"
            f" the kernel overlaps them. Peak RSS stays as above: it does not grow with the model (the largest tensor"
            f" here is {VOCAB * HIDDEN / 1e6:.0f}M entries, a 70B model's 8192 x 28672 = 235M; the passes read chunks"
            f" of {CHUNK / 2**20:.0f} Mi entries).",
            "",
        ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "sharded-cpu-x86_64-2cores.md"
    with open(target, "a" if args.append else "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {target}")
    return 0 if all(z == round(0.5 * s) for *_, z, s in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
