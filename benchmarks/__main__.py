"""Entry point: ``python -m benchmarks [--quick] [--out DIR] [--cases l1,global,...]``.

Each case runs in a fresh child process (``python -m benchmarks --worker CASE``) so
that none inherits the heap of another: after PyTorch's 100M-parameter global pruning
has allocated and freed ~5 GB, glibc's adaptive malloc thresholds slow every later
allocation-heavy call in the same process by 2-30x.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import arrayprune

from .cases import CASES, Context, load_adapter
from .report import cpu_model, machine_name, write_all
from .timing import Settings

QUICK = Settings(min_sample_s=0.005, repeats=5, min_repeats=3, max_bench_s=0.6)
FULL = Settings(min_sample_s=0.02, repeats=11, min_repeats=3, max_bench_s=4.0)
ROOT = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(msg, flush=True)


def _worker(case: str, quick: bool, records_path: str) -> int:
    """Run one case in this (fresh) process and write its rows as JSON."""
    gc.collect()
    gc.freeze()  # the libraries' own objects: out of every later collection, which stays fast
    ctx = Context(quick=quick, settings=QUICK if quick else FULL, log=_log)
    load_adapter(ctx)
    CASES[case](ctx)
    with open(records_path, "w") as f:
        json.dump(ctx.records, f, default=_plain)
    return 0


def _plain(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


def _run_case(case: str, quick: bool) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.json")
        cmd = [sys.executable, "-m", "benchmarks", "--worker", case, "--records", path] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, cwd=ROOT, env=env)
        if proc.returncode != 0 or not os.path.exists(path):
            _log(f"[{case}] FAILED (exit {proc.returncode})")
            return [{"case": case, "label": f"{case}: run failed", "size": 0, "times": {}, "skipped": True,
                     "note": f"failed: the case's process exited with {proc.returncode}"}]
        with open(path) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="arrayprune vs torch.nn.utils.prune")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about a minute)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="results folder")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated subset of: {', '.join(CASES)} (default: all)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.worker, args.quick, args.records)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")

    try:
        import torch

        torch_version, threads = torch.__version__, torch.get_num_threads()
    except ImportError:  # pragma: no cover
        torch_version, threads = "not installed", 0
    probe = Context(quick=args.quick, settings=QUICK)
    load_adapter(probe)
    _log(f"arrayprune {arrayprune.__version__}, numpy {np.__version__}, torch {torch_version}; "
         f"{'quick' if args.quick else 'full'} run of {', '.join(chosen)} (one process per case)")
    if probe.adapter is None:
        _log(f"adapter: not available ({probe.adapter_error})")

    load_start = os.getloadavg()
    start = time.perf_counter()
    records: list[dict] = []
    for name in chosen:
        t0 = time.perf_counter()
        _log(f"[{name}]")
        records += _run_case(name, args.quick)
        _log(f"[{name}] done in {time.perf_counter() - t0:.1f} s")
    elapsed = time.perf_counter() - start
    load_end = os.getloadavg()

    settings = QUICK if args.quick else FULL
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "quick": args.quick,
        "cases": chosen,
        "elapsed_s": elapsed,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch_version,
        "torch_threads": threads,
        "arrayprune": arrayprune.__version__,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "settings": vars(settings),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "adapter": "available" if probe.adapter is not None else f"not available ({probe.adapter_error})",
    }
    stem = machine_name() + ("-quick" if args.quick else "")
    paths = write_all(meta, records, Path(args.out), stem)
    _log(f"done in {elapsed:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
