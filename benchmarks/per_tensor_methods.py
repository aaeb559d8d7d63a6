"""Per-tensor methods on a stored checkpoint against the global path on the same files.

Every method that prunes tensors one at a time on the streaming path, run on the
throughput benchmark's float32 checkpoint (4 shards of 4096 x 8192 tensors) alternating
with ``--global --amount 0.5`` on the same files: medians of the wall times, their ratio,
and each one's peak RSS. The issue's target: every per-tensor method within 2x the
global path's time, in its memory.

Run::

    python -m benchmarks.per_tensor_methods --runs 3
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .report import cpu_model, machine_name
from .throughput import CLI, _alternate, _fmt, _warm, write_sharded

METHODS = {
    "l1_unstructured": ["--amount", "0.5"],
    "nm_structured 2:4": ["--method", "nm_structured", "--nm", "2:4"],
    "ln_structured, rows (dim 0)": ["--method", "ln_structured", "--amount", "0.5", "--n", "2", "--dim", "0"],
    "ln_structured, columns (dim 1)": ["--method", "ln_structured", "--amount", "0.5", "--n", "1", "--dim", "1"],
    "random_structured": ["--method", "random_structured", "--amount", "0.5", "--dim", "0", "--seed", "1"],
    "random_unstructured": ["--method", "random_unstructured", "--amount", "0.5", "--seed", "1"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.per_tensor_methods", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled modules, as an installed package's
    root = Path(__file__).parents[1]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "arrayprune"), str(root / "adapters")], check=False)
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    start = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = "/".join(f"{v:.1f}" for v in os.getloadavg())
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="arrayprune-methods-") as tmp:
        src = write_sharded(Path(tmp) / "in", 16, 4, (4096, 8192), "float32")
        out = Path(tmp) / "out"
        _warm(src)
        global_ = [*CLI, "prune", str(src), "-o", str(out), "--amount", "0.5", "--global"]
        for label, options in METHODS.items():
            result = _alternate(args.runs, {"floor": global_, "arrayprune": [*CLI, "prune", str(src), "-o", str(out), *options]}, out)
            g = result["floor"]  # the global path
            rows.append(
                f"| {label} | `{' '.join(options)}` | {_fmt(result['arrayprune']['seconds'])} | {_fmt(g['seconds'])} | "
                f"**{g['ratio']:.2f}x** ({min(g['ratios']):.2f}-{max(g['ratios']):.2f}) | "
                f"{result['arrayprune']['peak_mib']:.0f} MiB | {g['peak_mib']:.0f} MiB |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        f"# Per-tensor methods against the global path ({machine_name()})",
        "",
        f"- date: {start}",
        f"- command: `python -m benchmarks.per_tensor_methods {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; load average at start {load_start}, at end "
        + "/".join(f"{v:.1f}" for v in os.getloadavg()),
        "",
        "2.15 GB of float32 (16 tensors of 4096 x 8192 in 4 safetensors shards), each method alternating",
        "with `--global --amount 0.5` on the same files, each run a fresh child process after a `sync`;",
        "medians, their ratio (the range of the per-run ratios) and the largest peak RSS of each.",
        "Target: within 2x the global path's time, in its memory.",
        "",
        "| method | options | time | global | / global (per run) | peak RSS | global peak RSS |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    path = Path(args.out) / f"per-tensor-methods-{machine_name()}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
