"""Entry point: ``python -m benchmarks [--quick] [--out DIR] [--cases l1,global,...]``."""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

import arrayprune

from .cases import CASES, Context, load_adapter
from .report import cpu_model, machine_name, write_all
from .timing import Settings

QUICK = Settings(min_sample_s=0.005, repeats=5, min_repeats=3, max_bench_s=0.6)
FULL = Settings(min_sample_s=0.02, repeats=11, min_repeats=3, max_bench_s=4.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about a minute)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="results folder")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated subset of: {', '.join(CASES)} (default: all)",
    )
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")

    try:
        import torch

        torch_version, threads = torch.__version__, torch.get_num_threads()
    except ImportError:  # pragma: no cover
        torch_version, threads = "not installed", 0

    def log(msg: str) -> None:
        print(msg, flush=True)

    import gc

    gc.collect()
    gc.freeze()  # the libraries' own objects: out of every later collection, which stays fast
    ctx = Context(quick=args.quick, settings=QUICK if args.quick else FULL, log=log)
    load_adapter(ctx)
    log(f"arrayprune {arrayprune.__version__}, numpy {np.__version__}, torch {torch_version}; "
        f"{'quick' if args.quick else 'full'} run of {', '.join(chosen)}")
    if ctx.adapter is None:
        log(f"adapter: not available ({ctx.adapter_error})")
    import os

    load_start = os.getloadavg()
    start = time.perf_counter()
    for name in chosen:
        t0 = time.perf_counter()
        log(f"[{name}]")
        CASES[name](ctx)
        log(f"[{name}] done in {time.perf_counter() - t0:.1f} s")
    elapsed = time.perf_counter() - start
    load_end = os.getloadavg()

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
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
        "settings": vars(ctx.settings) if hasattr(ctx.settings, "__dict__") else str(ctx.settings),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "adapter": "available" if ctx.adapter is not None else f"not available ({ctx.adapter_error})",
    }
    stem = machine_name() + ("-quick" if args.quick else "")
    paths = write_all(meta, ctx.records, Path(args.out), stem)
    log(f"done in {elapsed:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
