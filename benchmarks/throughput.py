"""Whole files against the speed of copying them: arrayprune and the floor on the same files.

::

    python -m benchmarks.throughput [--runs 5] [--scale 1.0] [--cases sharded,single,...] [--dir /tmp]
                                    [--out benchmarks/results]

Each case writes its files once (in a temporary folder under ``--dir``), reads them once
to warm the page cache, then times the floor and arrayprune alternately, ``--runs`` times
each, every run in a fresh child process (wall time and that child's peak RSS) after a
``sync``, and reports medians and the ratio arrayprune / floor. Every safetensors case
has a second floor, copy + fsync (:data:`COPY_FSYNC`: the durability arrayprune's
output has when it is renamed into place, which ``cp`` does not wait for):

==============  ==========================================================  ===========================
case            arrayprune                                                  floor
==============  ==========================================================  ===========================
sharded-global  ``prune DIR -o OUT --amount 0.5 --global``, 16 float32      ``cp -r DIR OUT``
                tensors of 4096 x 8192 in 4 shards (2.1 GB)
sharded         the same without ``--global``                               ``cp -r``
single          ``prune one.safetensors`` (4 of those tensors, 537 MB)      ``cp``
onnx            ``prune ffn.onnx`` (8 MatMul weights 768 x 3072, 75 MB)     ``onnx.load`` + ``onnx.save``
onnx-external   ``prune big.onnx`` (40 weights 3072 x 3072 in external      the same, external data
                data, 1.5 GB)
report-bf16     ``report`` of a bfloat16 checkpoint (20 tensors of          ``cp -r``
                4096 x 8192, 1.3 GB, 2 shards)
nm-bf16         ``prune --method nm_structured --nm 2:4`` on it             ``cp -r``; and the global
                                                                            path on the same file
dropin          ``l1_unstructured`` + ``remove`` on 20 ``Linear(16, 16)``   ``torch.nn.utils.prune``
                (per tensor) and on a ResNet-18 (whole pass), in process,
                alternating
==============  ==========================================================  ===========================

``--scale`` multiplies the number of tensors of the file cases (0.25 for a quick look;
the committed results use 1). Outputs are checked (the exact number of zeros of the
selected tensors) so a fast wrong run cannot pass.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .cli_model import _run
from .report import cpu_model, machine_name

CASES = ("sharded-global", "sharded", "single", "onnx", "onnx-external", "report-bf16", "nm-bf16", "dropin")
CLI = [sys.executable, "-m", "arrayprune"]
PY = [sys.executable, "-c"]

#: The fairer floor: a Python copy (``shutil.copyfile``: an in-kernel copy on Linux, as
#: ``cp``) that then flushes every file written to disk (``fsync``) and its folder, as
#: arrayprune does before it renames its output into place. ``cp`` leaves the data dirty
#: in the page cache, to be written after it exits.
COPY_FSYNC = (
    "import os, shutil, sys\n"
    "src, dst = sys.argv[1:3]\n"
    "pairs = [(src, dst)]\n"
    "if os.path.isdir(src):\n"
    "    os.mkdir(dst)\n"
    "    pairs = [(os.path.join(src, n), os.path.join(dst, n)) for n in sorted(os.listdir(src))]\n"
    "for a, b in pairs:\n"
    "    shutil.copyfile(a, b)\n"
    "    fd = os.open(b, os.O_RDONLY)\n"
    "    os.fsync(fd)\n"
    "    os.close(fd)\n"
    "fd = os.open(os.path.dirname(os.path.abspath(dst)), os.O_RDONLY)\n"
    "os.fsync(fd)\n"
    "os.close(fd)\n"
)


def copy_fsync(src: Path, dst: Path) -> list[str]:
    """The command of the copy + fsync floor."""
    return [*PY, COPY_FSYNC, str(src), str(dst)]


# --- files -----------------------------------------------------------------------------------


def _weights(count: int, shape: tuple[int, int], dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        if dtype == "bfloat16":
            x = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        out[f"model.layers.{i}.mlp.up_proj.weight"] = x
    return out


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """One safetensors file, header and raw data, without any framework."""
    import json

    code = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    header: dict[str, Any] = {}
    offset = 0
    for name, x in tensors.items():
        header[name] = {"dtype": code, "shape": list(x.shape), "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for x in tensors.values():
            f.write(memoryview(np.ascontiguousarray(x)).cast("B"))


def write_sharded(folder: Path, count: int, shards: int, shape: tuple[int, int], dtype: str) -> Path:
    """A Hugging Face-style sharded checkpoint with an index and a config.json."""
    import json

    folder.mkdir(parents=True)
    tensors = _weights(count, shape, dtype)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        _write_safetensors(folder / shard, {n: tensors[n] for n in part}, dtype)
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(x.nbytes for x in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def write_onnx(path: Path, count: int, shape: tuple[int, int], external: bool) -> Path:
    """A chain of MatMuls (each weight ``shape``, alternating orientation) with ReLUs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    k, n = shape
    inits, nodes, x = [], [], "x"
    for i in range(count):
        w = rng.standard_normal((k, n) if i % 2 == 0 else (n, k), dtype=np.float32) * np.float32(0.02)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"/layer.{i}/MatMul"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"/layer.{i}/Relu"))
        x = f"r{i}"
    width = k if count % 2 == 0 else n
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(model, path)
    return path


def _warm(path: Path) -> None:
    """Read every file once so that every run starts from a warm page cache."""
    for p in [path] if path.is_file() else sorted(path.iterdir()):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    for extra in path.parent.glob(path.name + "*.data"):
        extra.unlink()


# --- timing ----------------------------------------------------------------------------------


def _alternate(runs: int, commands: dict[str, list[str]], out: Path) -> dict[str, Any]:
    """``runs`` rounds of child runs of every command in turn, each into a fresh ``out``.

    Before each run (untimed) the output of the last is removed and ``sync`` writes
    every dirty page to disk, so that no run pays for the writeback of another's
    output (``cp`` leaves its copy dirty in the page cache when it exits).
    """
    samples: dict[str, list[tuple[float, float]]] = {key: [] for key in commands}
    for _ in range(runs):
        for key, cmd in commands.items():
            _remove(out)
            os.sync()
            samples[key].append(_run(cmd))
    _remove(out)
    result: dict[str, Any] = {}
    for key, pairs in samples.items():
        result[key] = {
            "seconds": statistics.median(s for s, _ in pairs),
            "peak_mib": max(m for _, m in pairs),
            "samples": [s for s, _ in pairs],
        }
    ours = result["arrayprune"]
    for key in [k for k in commands if k != "arrayprune"]:
        base = result[key]
        base["ratio"] = ours["seconds"] / base["seconds"]
        base["ratios"] = [a / f for a, f in zip(ours["samples"], base["samples"], strict=True)]
    result["ratio"], result["ratios"] = result["floor"]["ratio"], result["floor"]["ratios"]
    return result


def _zeros(path: Path) -> tuple[int, int]:
    """Zeros and entries of the floating tensors of a written file or sharded folder."""
    if path.is_dir():
        from arrayprune.adapters.formats.safetensors_stream import TensorFiles, zero_count
        from arrayprune.adapters.formats.sharded import open_checkpoint

        zeros = total = 0
        with TensorFiles() as tf:
            for t in open_checkpoint(path).tensors.values():
                total += t.size
                zeros += sum(zero_count(raw, t.code) for raw in tf.chunks(t))
        return zeros, total
    from arrayprune.adapters import formats

    arrays = [np.asarray(x) for x in formats.load(str(path)).params.values()]
    floats = [a for a in arrays if a.dtype.kind == "f"]
    return sum(int(np.count_nonzero(a == 0)) for a in floats), sum(a.size for a in floats)


def _file_case(name: str, work: Path, runs: int, scale: float) -> dict[str, Any]:
    n = max(1, round(16 * scale))
    amount = ["--amount", "0.5"]
    if name in ("sharded-global", "sharded"):
        src = write_sharded(work / "in", n, 4 if n >= 4 else 1, (4096, 8192), "float32")
        out = work / "out"
        ours = [*CLI, "prune", str(src), "-o", str(out), *amount] + (["--global"] if name == "sharded-global" else [])
        floor = ["cp", "-r", str(src), str(out)]
        check = out
    elif name == "single":
        m = max(1, round(4 * scale))
        src = work / "one.safetensors"
        work.mkdir(parents=True, exist_ok=True)
        _write_safetensors(src, _weights(m, (4096, 8192), "float32"), "float32")
        out = work / "out.safetensors"
        ours = [*CLI, "prune", str(src), "-o", str(out), *amount]
        floor = ["cp", str(src), str(out)]
        check = out
    elif name in ("onnx", "onnx-external"):
        work.mkdir(parents=True, exist_ok=True)
        external = name == "onnx-external"
        count, shape = (max(2, round(40 * scale)), (3072, 3072)) if external else (8, (768, 3072))
        src = write_onnx(work / "model.onnx", count, shape, external)
        out = work / "out.onnx"
        save = (
            f"onnx.save(m, {str(out)!r}, save_as_external_data=True, location='out.onnx.data')"
            if external
            else f"onnx.save(m, {str(out)!r})"
        )
        floor = [*PY, f"import onnx; m = onnx.load({str(src)!r}); {save}"]
        ours = [*CLI, "prune", str(src), "-o", str(out), *amount]
        check = out
        _warm(work)
    else:  # report-bf16, nm-bf16
        m = max(2, round(20 * scale))
        src = write_sharded(work / "in", m, 2, (4096, 8192), "bfloat16")
        out = work / "out"
        floor = ["cp", "-r", str(src), str(out)]
        if name == "report-bf16":
            ours = [*CLI, "report", str(src)]
            check = None
        else:
            ours = [*CLI, "prune", str(src), "-o", str(out), "--method", "nm_structured", "--nm", "2:4"]
            check = out
    commands = {"floor": floor}
    if name not in ("onnx", "onnx-external"):
        _warm(src)
        commands["copy_fsync"] = copy_fsync(src, out)
    if name in ("sharded-global", "sharded", "single"):  # the same run written through the page cache
        commands["buffered"] = ["env", "ARRAYPRUNE_DIRECT_WRITES=0", *ours]
    if name == "nm-bf16":  # the global path on the same file: the 2:4 target is within 2x of it
        commands["global"] = [*CLI, "prune", str(src), "-o", str(out), "--amount", "0.5", "--global"]
    commands["arrayprune"] = ours
    result = _alternate(runs, commands, out)
    def shown(cmd: list[str]) -> str:
        return " ".join(cmd[1:] if cmd[0] == sys.executable else cmd).replace(f"{work}/", "")

    result["command"], result["floor_command"] = shown(ours), shown(floor)
    if "global" in commands:
        result["global_command"] = shown(commands["global"])
    result["bytes"] = sum(
        p.stat().st_size
        for p in work.rglob("*")
        if p.is_file() and not p.name.startswith(out.name) and out not in p.parents
    )
    if check is not None:
        _remove(out)
        subprocess.run(ours, check=True, capture_output=True)
        zeros, total = _zeros(check)
        result["zeros"], result["entries"] = zeros, total
    return result


def _dropin(runs: int) -> dict[str, Any]:
    """The drop-in against ``torch.nn.utils.prune``: small layers per tensor, and a ResNet-18."""
    import torch
    import torch.nn.utils.prune as torch_prune
    from torch import nn

    import arrayprune.adapters.torch as ours

    from .data import prunable_modules, resnet18

    def small() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(16, 16) for _ in range(20)])

    def one_pass(lib: Any, model: nn.Module, with_bias: bool) -> float:
        targets = prunable_modules(model, with_bias=with_bias)
        start = time.perf_counter()
        for module, name in targets:
            lib.l1_unstructured(module, name, amount=0.5)
            lib.remove(module, name)
        return time.perf_counter() - start

    result: dict[str, Any] = {}
    for label, make, with_bias, repeat in (("dropin-small", small, False, 50), ("dropin-resnet18", resnet18, False, 1)):
        base = make()
        per: dict[str, list[float]] = {"torch": [], "arrayprune": []}
        for _ in range(runs):
            for key, lib in (("torch", torch_prune), ("arrayprune", ours)):
                models = [copy.deepcopy(base) for _ in range(repeat)]
                seconds = sum(one_pass(lib, m, with_bias) for m in models) / repeat
                per[key].append(seconds)
        tensors = len(prunable_modules(base, with_bias=with_bias))
        med = {k: statistics.median(v) for k, v in per.items()}
        result[label] = {
            "tensors": tensors,
            "torch": med["torch"],
            "arrayprune": med["arrayprune"],
            "ratio": med["arrayprune"] / med["torch"],
            "speedups": [t / a for t, a in zip(per["torch"], per["arrayprune"], strict=True)],
        }
    return result


# --- report ----------------------------------------------------------------------------------


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


TARGETS = {
    "sharded-global": 2.0,
    "sharded": 2.0,
    "single": 2.0,
    "onnx": 2.0,
    "onnx-external": 2.0,
    "report-bf16": 2.0,
    "nm-bf16": 2.0,
}


def render(meta: dict[str, Any], results: dict[str, Any]) -> str:
    lines = [
        f"# Throughput: whole files against a copy ({meta['machine']})",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- versions: Python {meta['python']}, NumPy {meta['numpy']}, arrayprune {meta['arrayprune']}",
        f"- CPU: {meta['cpu']}, {meta['cores']} cores; load average at start {meta['load_start']}, at end "
        f"{meta['load_end']}",
        "",
        "Each row: the floors and arrayprune in turn, each run a fresh child process on a warm page cache",
        "(its modules compiled once beforehand, as an installed package's are),",
        "every run after a `sync` (untimed) so that none pays for writing back another's output; medians",
        "of the runs, the ratio of the medians, the range of the per-run ratios, and the largest peak RSS",
        "of arrayprune's runs. Two floors: `cp` (an in-kernel copy that leaves its output dirty in the",
        "page cache when it exits) and copy + fsync (`shutil.copyfile` of each file, then `fsync` of it",
        "and of the folder: the durability arrayprune gives its output before renaming it into place).",
        "The target for every file case is at most 2x its floor.",
        "",
        "| case | files | floor | floor time | copy + fsync | arrayprune | arrayprune time | / floor (per run) "
        "| / copy + fsync (per run) | peak RSS | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if name.startswith("dropin"):
            continue
        check = f"{r['zeros']:,} zeros of {r['entries']:,}" if "zeros" in r else "-"
        fs = r.get("copy_fsync")
        fs_time = _fmt(fs["seconds"]) if fs else "-"
        fs_ratio = f"**{fs['ratio']:.2f}x** ({min(fs['ratios']):.2f}-{max(fs['ratios']):.2f})" if fs else "-"
        lines.append(
            f"| {name} | {r['bytes'] / 1e9:.2f} GB | `{r['floor_command']}` | {_fmt(r['floor']['seconds'])} | "
            f"{fs_time} | `{r['command']}` | {_fmt(r['arrayprune']['seconds'])} | **{r['ratio']:.2f}x** "
            f"({min(r['ratios']):.2f}-{max(r['ratios']):.2f}) | {fs_ratio} | {r['arrayprune']['peak_mib']:.0f} MiB "
            f"| {check} |"
        )
    for name, r in results.items():
        if "global" in r:
            g = r["global"]
            lines += [
                "",
                f"{name} against the global path on the same file (`{r['global_command']}`, alternating with it): "
                f"{_fmt(r['arrayprune']['seconds'])} against {_fmt(g['seconds'])}, **{g['ratio']:.2f}x** "
                f"(per run {min(g['ratios']):.2f}-{max(g['ratios']):.2f}); the global path's peak RSS "
                f"{g['peak_mib']:.0f} MiB.",
            ]
    buffered = [(name, r) for name, r in results.items() if "buffered" in r]
    if buffered:
        lines += [
            "",
            "The same runs with direct writes turned off (`ARRAYPRUNE_DIRECT_WRITES=0`: every output byte",
            "through the page cache), alternating with them:",
            "",
            "| case | direct writes | through the page cache | direct / page cache (per run) | page cache peak RSS |",
            "|---|---|---|---|---|",
        ]
        for name, r in buffered:
            b = r["buffered"]
            lines.append(
                f"| {name} | {_fmt(r['arrayprune']['seconds'])} | {_fmt(b['seconds'])} | **{b['ratio']:.2f}x** "
                f"({min(b['ratios']):.2f}-{max(b['ratios']):.2f}) | {b['peak_mib']:.0f} MiB |"
            )
    drop = {k: v for k, v in results.items() if k.startswith("dropin")}
    if drop:
        lines += [
            "",
            "| drop-in | tensors | `torch.nn.utils.prune` | arrayprune | arrayprune / PyTorch | PyTorch / arrayprune per run |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in drop.items():
            per = ", ".join(f"{s:.1f}x" for s in r["speedups"])
            t, a = r["torch"], r["arrayprune"]
            lines.append(
                f"| {name} (`l1_unstructured` + `remove`) | {r['tensors']} | {_fmt(t)} ({_fmt(t / r['tensors'])} "
                f"per tensor) | {_fmt(a)} ({_fmt(a / r['tensors'])} per tensor) | {r['ratio']:.2f}x | {per} |"
            )
    lines += ["", "## Targets (issue: prune a checkpoint at the speed of copying it)", ""]
    lines += ["| target | measured | status |", "|---|---|---|"]
    for name, limit in TARGETS.items():
        if name in results:
            r = results[name]
            ratio = r["ratio"]
            lines.append(f"| {name} <= {limit:g}x its floor | {ratio:.2f}x | {'PASS' if ratio <= limit else 'MISS'} |")
            if "copy_fsync" in r:
                ratio = r["copy_fsync"]["ratio"]
                lines.append(
                    f"| {name} <= {limit:g}x copy + fsync | {ratio:.2f}x | {'PASS' if ratio <= limit else 'MISS'} |"
                )
            if "global" in r:
                ratio = r["global"]["ratio"]
                lines.append(
                    f"| {name} <= 2x the global path on the same file | {ratio:.2f}x | "
                    f"{'PASS' if ratio <= 2 else 'MISS'} |"
                )
    if "dropin-small" in results:
        r = results["dropin-small"]
        lines.append(f"| drop-in small <= 0.8x PyTorch | {r['ratio']:.2f}x | {'PASS' if r['ratio'] <= 0.8 else 'MISS'} |")
    if "dropin-resnet18" in results:
        low = min(results["dropin-resnet18"]["speedups"])
        lines.append(f"| ResNet-18 pass >= 10x PyTorch in every run | slowest run {low:.1f}x | "
                     f"{'PASS' if low >= 10 else 'MISS'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the number of tensors (default 1)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of: {', '.join(CASES)}")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    # Children import compiled modules, as a user's installed package does: an
    # environment that turns bytecode caching off (PYTHONDONTWRITEBYTECODE) would have
    # every run compile arrayprune's sources again (0.08 s of each run here).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    root = Path(__file__).parents[1]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "arrayprune"), str(root / "adapters")], check=False)

    import arrayprune

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.throughput " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_name(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "arrayprune": arrayprune.__version__,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_start": "/".join(f"{v:.1f}" for v in os.getloadavg()),
    }
    results: dict[str, Any] = {}
    runner: dict[str, Callable[[Path], dict[str, Any]]] = {
        name: (lambda work, name=name: _file_case(name, work, args.runs, args.scale)) for name in CASES[:-1]
    }
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    for name in chosen:
        start = time.perf_counter()
        if name == "dropin":
            results.update(_dropin(args.runs))
        else:
            with tempfile.TemporaryDirectory(dir=args.dir, prefix=f"arrayprune-{name}-") as tmp:
                results[name] = runner[name](Path(tmp) / "work")
        print(f"[{name}] {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    meta["load_end"] = "/".join(f"{v:.1f}" for v in os.getloadavg())
    text = render(meta, results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.scale == 1 and args.runs >= 5 else "-quick"
    path = out / f"throughput-{meta['machine']}{suffix}.md"
    path.write_text(text)
    print(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
