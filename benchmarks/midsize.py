"""Mid-size masks: the exact partition path against the bracket, in passes over the data.

    python -m benchmarks.midsize                  # float32 2^14..2^24, float16/64, ResNet-18
    python -m benchmarks.midsize --quick          # fewer sizes and rounds
    python -m benchmarks.midsize --out benchmarks/results/midsize-cpu-x86_64-2cores.md

For each size, in one process on alternating rounds (:func:`benchmarks.timing.compare`),
``L1Unstructured(0.5).compute_mask(x, ones)`` is timed on the exact path ("partition":
the crossover raised above the size), on the bracket ("bracket": the crossover at 0),
as dispatched ("auto"), and against the floor: one ``np.abs(x) > c`` pass writing a
fresh output over the same bytes. The crossover is every ``SMALL_SIZE`` constant of
``arrayprune.selection`` (:data:`CROSSOVERS`), set around each sample only. NumPy
arrays and CPU tensors (zero-copy views of the same data) take the same host path; a
tensor's mask is also timed with one PyTorch thread ("auto, 1 thread"), as the mask is
combined with the default mask in PyTorch. ``global_unstructured`` over 8 arrays, and
float16 and float64, run at a few sizes. Masks are checked identical on all paths.

Then the ResNet-18 pass of the drop-in against ``torch.nn.utils.prune``: the ``adapter``
case of :mod:`benchmarks.cases`, as ``python -m benchmarks --cases adapter`` runs it.
The ratios to read are "x floor" (time / floor) and the ResNet-18 speedup.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import arrayprune as ap
from arrayprune.selection import bracket, host

from . import cases, data
from .__main__ import FULL, QUICK
from .report import cpu_model, machine_name
from .timing import Bench, Settings, compare

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

#: (module, name) of every crossover up to which the host path selects exactly. Only
#: those that exist are set: the script also runs against older revisions.
CROSSOVERS = ((bracket, "SMALL_SIZE"), (host, "SMALL_SIZE"))
PATHS = ("partition", "bracket", "auto")
#: Targets: the mask in floor passes, per size (float32, NumPy and CPU tensors).
TARGETS = {18: 15.0, 20: 8.0, 22: 4.0}
RESNET_TARGET = 10.0


@contextmanager
def crossover(value: int | None) -> Iterator[None]:
    """Every crossover of :data:`CROSSOVERS` set to `value` (None: left as it is)."""
    saved = [(m, n, getattr(m, n)) for m, n in CROSSOVERS if hasattr(m, n)]
    if value is not None:
        for m, n, _ in saved:
            setattr(m, n, value)
    try:
        yield
    finally:
        for m, n, v in saved:
            setattr(m, n, v)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to `n`."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _within(run: Callable[[], Any], context: Callable[[], AbstractContextManager]) -> Bench:
    """`run` timed inside ``context()``, entered around each sample (not timed)."""
    stack = ExitStack()
    return Bench(run=run, enter=lambda: stack.enter_context(context()), exit=stack.close)


def _path_taken(run: Callable[[], Any]) -> str:
    """The path `run` takes: "bracket" if it reaches the bracket's scan, else "partition"."""
    taken = []
    locate = bracket._BracketSelect._locate

    def spy(self, *args):
        taken.append(True)
        return locate(self, *args)

    bracket._BracketSelect._locate = spy
    try:
        run()
    finally:
        bracket._BracketSelect._locate = locate
    return "bracket" if taken else "partition"


def _as_numpy(mask: Any) -> np.ndarray:
    return mask.numpy() if torch is not None and isinstance(mask, torch.Tensor) else np.asarray(mask)


def _as_list(masks: Any) -> list[Any]:
    return masks if isinstance(masks, list) else [masks]


def _inputs(lib: str, dtype: Any, e: int) -> dict[str, Callable[[], Any]]:
    """The mask to time on about ``2^e`` standard normal entries ("run"), its "floor".

    `lib` "numpy" and "torch": ``L1Unstructured(0.5).compute_mask(x, ones)`` on one
    array, and for a tensor also ``torch.abs(t) > c`` ("torch floor") on the same bytes;
    "global": ``global_unstructured`` (L1, amount 0.5) over 8 NumPy arrays of
    ``(rows, 64)``, the floor one pass over each.
    """
    c = dtype(cases.C_HALF)
    if lib == "global":
        arrays = [a.astype(dtype, copy=False) for a in data.global_arrays(data.global_shapes(1 << e, 8, 64))]
        return {
            "run": lambda: ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5),
            "floor": lambda: [np.abs(a) > c for a in arrays],
        }
    x = data.vector(1 << e, seed=e).astype(dtype, copy=False)
    ones = np.ones(x.size, dtype=bool)
    out = {"floor": lambda: np.abs(x) > c}
    if lib == "numpy":
        out["run"] = lambda: ap.L1Unstructured(0.5).compute_mask(x, ones)
    else:
        t, m = torch.from_numpy(x), torch.from_numpy(ones)
        out["run"] = lambda: ap.L1Unstructured(0.5).compute_mask(t, m)
        out["torch floor"] = lambda: torch.abs(t) > float(c)
    return out


def measure_size(lib: str, dtype: Any, e: int, settings: Settings) -> dict[str, Any]:
    """One row: the three paths, the floor and, for tensors, PyTorch on one thread."""
    inputs = _inputs(lib, dtype, e)
    run = inputs.pop("run")
    limits = {"partition": sys.maxsize, "bracket": 0, "auto": None}
    benches: dict[str, Any] = {p: _within(run, lambda v=limits[p]: crossover(v)) for p in PATHS}
    if lib == "torch":
        # The mask combines with the default mask in PyTorch: on a loaded 2-core machine
        # its two threads can wait on each other for a time slice. Also timed on one.
        benches["auto, 1 thread"] = _within(run, lambda: torch_threads(1))
    benches.update(inputs)
    masks = {}
    for p in PATHS:
        with crossover(limits[p]):
            masks[p] = np.concatenate([_as_numpy(m).ravel() for m in _as_list(run())])
    with crossover(limits["auto"]):
        taken = _path_taken(run)
    t = compare(benches, settings)
    return {
        "lib": lib,
        "dtype": np.dtype(dtype).name,
        "exp": e,
        "times": {k: v.median for k, v in t.items()},
        "auto_path": taken,
        "identical": all(np.array_equal(masks[p], masks["partition"]) for p in PATHS),
        "pruned": int(masks["auto"].size - np.count_nonzero(masks["auto"])),
    }


def _fmt(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: times, and each path in floor passes."""
    out = [
        "| array | size | floor | partition | bracket | auto (path) | partition / floor | bracket / floor "
        "| **auto / floor** | auto, 1 torch thread / floor | bracket / partition | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["times"]
        fl = t["floor"]
        extra = f" (torch pass {_fmt(t['torch floor'])})" if "torch floor" in t else ""
        one = f"{t['auto, 1 thread'] / fl:.1f}x" if "auto, 1 thread" in t else "-"
        out.append(
            f"| {r['lib']} {r['dtype']} | 2^{r['exp']} | {_fmt(fl)}{extra} | {_fmt(t['partition'])} | "
            f"{_fmt(t['bracket'])} | {_fmt(t['auto'])} ({r['auto_path']}) | {t['partition'] / fl:.1f}x | "
            f"{t['bracket'] / fl:.1f}x | **{t['auto'] / fl:.1f}x** | {one} | {t['bracket'] / t['partition']:.2f} | "
            f"{r['identical']} |"
        )
    return out


def targets(rows: list[dict[str, Any]], resnet: dict[str, Any] | None) -> list[str]:
    """The targets, PASS or MISS, from the "auto" column and the ResNet-18 row."""
    out = ["| target | measured | status |", "|---|---|---|"]
    for e, limit in TARGETS.items():
        for r in rows:
            if r["exp"] == e and r["dtype"] == "float32" and r["lib"] != "global":
                t = r["times"]
                ratio = t["auto"] / t["floor"]
                status = "PASS" if ratio <= limit else "MISS"
                one = f" ({t['auto, 1 thread'] / t['floor']:.1f}x with 1 torch thread)" if "auto, 1 thread" in t else ""
                out.append(f"| {r['lib']} float32 2^{e}: <= {limit:g}x a pass | {ratio:.1f}x{one} | {status} |")
    if resnet is not None and "torch" in resnet["times"]:
        t = resnet["times"]
        sp = t["torch"] / t["arrayprune"]
        status = "PASS" if sp >= RESNET_TARGET else "MISS"
        out.append(
            f"| ResNet-18 drop-in >= {RESNET_TARGET:g}x faster than torch.nn.utils.prune | {sp:.1f}x "
            f"({_fmt(t['arrayprune'])} vs {_fmt(t['torch'])}; core masks alone {_fmt(t['core'])}) | {status} |"
        )
    return out


def adapter_rows(settings: Settings, quick: bool) -> list[dict[str, Any]]:
    """The ``adapter`` case of :mod:`benchmarks.cases` (ResNet-18 and a small MLP)."""
    ctx = cases.Context(quick=quick, settings=settings, log=lambda msg: print(msg, flush=True))
    cases.load_adapter(ctx)
    cases.case_adapter(ctx)
    return ctx.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.midsize", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    parser.add_argument("--exps", help="float32 sizes as powers of two, e.g. 15,16,17 (default 14..24)")
    parser.add_argument("--no-adapter", action="store_true", help="skip the ResNet-18 drop-in pass")
    parser.add_argument("--out", help="also write the Markdown report here")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    exps = (14, 16, 18, 20, 22, 24) if args.quick else tuple(range(14, 25))
    if args.exps:
        exps = tuple(int(e) for e in args.exps.split(","))
    plan = [("numpy", np.float32, e) for e in exps]
    if torch is not None:
        plan += [("torch", np.float32, e) for e in exps]
    plan += [("global", np.float32, e) for e in (16, 18, 20, 22)]
    plan += [("numpy", d, e) for d in (np.float16, np.float64) for e in (16, 20, 22)]
    gc.collect()
    gc.freeze()  # the libraries' own objects: out of every later collection
    load_start = os.getloadavg()
    rows = []
    for lib, dtype, e in plan:
        rows.append(measure_size(lib, dtype, e, settings))
        print(table(rows[-1:])[-1], flush=True)
        gc.collect()
    records = [] if args.no_adapter or torch is None else adapter_rows(settings, args.quick)
    resnet = next((r for r in records if r["label"] == "ResNet-18" and not r.get("skipped")), None)
    lines = [
        f"- date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- command: `python -m benchmarks.midsize " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])) + "`",
        f"- versions: Python {platform.python_version()}, NumPy {np.__version__}, "
        f"PyTorch {torch.__version__ if torch else '-'}, arrayprune {ap.__version__}",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores ({machine_name()}); load average "
        f"{'/'.join(f'{v:.1f}' for v in load_start)} at start, {'/'.join(f'{v:.1f}' for v in os.getloadavg())} at end",
        f"- crossovers as dispatched: {', '.join(f'{m.__name__}.{n} = {getattr(m, n)}' for m, n in CROSSOVERS if hasattr(m, n))}",
        "",
        *table(rows),
        "",
    ]
    for r in records:
        if not r.get("skipped"):
            t = r["times"]
            lines.append(
                f"- adapter, {r['label']} ({r['tensors']} tensors): drop-in {_fmt(t['arrayprune'])}, "
                f"torch.nn.utils.prune {_fmt(t['torch'])} ({t['torch'] / t['arrayprune']:.1f}x), "
                f"core masks alone {_fmt(t['core'])}; {r['checks']}"
            )
    lines += ["", *targets(rows, resnet)]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
