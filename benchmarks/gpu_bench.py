"""arrayprune's selection on a GPU: exactness against the host, and speed against torch.

``python benchmarks/gpu_bench.py OUTDIR [--quick] [--sections a,b]`` runs, in one process:

* ``exactness``: L1 and global masks on tie-heavy data (zeros, NaN, infinities,
  subnormals; float16, bfloat16, float32, float64; several arrays, eligibility) on CuPy
  against NumPy and on torch's device against torch on the CPU (the host route);
* ``l1``: one float32 tensor of 2^20 .. 2^27 entries: the L1 mask (``l1_unstructured``,
  which takes the portable route on integer keys) against one elementwise pass (``x.abs()``) and
  torch's own mask (``torch.nn.utils.prune.L1Unstructured``: a ``topk`` of ``|x|``);
* ``routes``: on the same tensors, the portable route's selection alone (as it runs, and
  with its sample bracket at every size) against a mask from ``torch.kthvalue`` and
  torch's ``topk`` (run 1 on an H100 also timed a radix select
  by scatter-add histograms and a library sort: 4-15x slower than the portable route,
  ``benchmarks/results/gpu-bench-h100-run1.md``, and removed);
* ``global``: one mask over many tensors (about 0.7 x 10^9 entries; ``--quick`` far fewer)
  against ``torch.nn.utils.prune.global_unstructured``'s concatenation and ``topk``,
  with the peak device memory of each.

Times are medians of repeats, each closed by a device synchronisation. Every section is
independent: an error is recorded in the results and the next one runs. Writes
``OUTDIR/gpu_bench.json`` (every number) and ``OUTDIR/gpu_bench.md`` (tables, naming the
card). Without CUDA or CuPy it runs the torch sections on the CPU (``--quick`` there:
small sizes, a few seconds), and skips CuPy's.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import arrayprune as ap
from arrayprune._namespace import namespace
from arrayprune.selection import bracket, portable

try:
    import torch
    import torch.nn.utils.prune as torch_prune
except ImportError:  # pragma: no cover - torch is a benchmark dependency
    sys.exit("gpu_bench needs PyTorch")

try:
    import cupy

    cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, or no GPU for it
    cupy = None

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
FULL_SIZES = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 27]
QUICK_SIZES = [1 << 20, 1 << 24] if CUDA else [1 << 12, 1 << 16]


class Results:
    """Checks, timing rows and errors, by section."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"env": {}, "checks": [], "rows": {}, "errors": []}

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.data["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        print(("PASS " if ok else "FAIL ") + name + (f"  ({detail})" if detail else ""), flush=True)

    def row(self, section: str, **values: Any) -> None:
        self.data["rows"].setdefault(section, []).append(values)
        print(f"  {section}: " + "  ".join(f"{k}={v}" for k, v in values.items()), flush=True)


def synchronize() -> None:
    """Wait for every queued kernel of torch and CuPy."""
    if CUDA:
        torch.cuda.synchronize()
    if cupy is not None:
        cupy.cuda.Device().synchronize()


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
    """Median seconds of `fn`, each call closed by a device synchronisation."""
    for _ in range(warmup):
        fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def to_numpy(x: Any) -> np.ndarray:
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy.asnumpy(x)
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    return np.asarray(x)


def tie_heavy(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """float64 values that tie often: few levels, signed zeros, NaN, infinities, subnormals."""
    tiny = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 5e-324}[dtype]
    levels = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, tiny, -tiny, 3 * tiny, math.nan, math.inf, -math.inf])
    x = levels[rng.integers(0, levels.size, n)]
    spread = rng.random(n) < 0.3
    x[spread] = rng.standard_normal(int(spread.sum()))
    return x


def torch_topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """torch.nn.utils.prune.L1Unstructured's mask: ``topk`` of ``|x|``, smallest first."""
    return torch_prune.L1Unstructured(amount=k).compute_mask(x, torch.ones_like(x))


def kthvalue_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """A threshold mask from ``torch.kthvalue`` (ties not resolved): a speed reference."""
    magnitude = x.abs()
    return magnitude > magnitude.reshape(-1).kthvalue(k).values


# --------------------------------------------------------------------------------------
# sections


def env(results: Results, args: argparse.Namespace) -> None:
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "arrayprune": getattr(ap, "__version__", "?"),
        "device": torch.cuda.get_device_name(0) if CUDA else f"CPU ({platform.machine()})",
        "cupy": None if cupy is None else cupy.__version__,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results.data["env"] = info
    print("ENV", info, flush=True)


def exactness(results: Results, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(20260501)
    sizes = [1, 7, 1000, 1 << 16] if args.quick else [1, 7, 1000, 1 << 16, 1 << 20]
    torch_dtypes = ["float16", "bfloat16", "float32", "float64"]
    bad: dict[str, list[str]] = {"torch": [], "cupy": []}
    cases = 0
    for dtype in torch_dtypes:
        for n in sizes:
            values = tie_heavy(rng, n, dtype)
            cpu = torch.from_numpy(values).to(getattr(torch, dtype))
            gpu = cpu.to(DEVICE)
            for k in sorted({0, 1, n // 3, n // 2, n}):
                cases += 1
                want = to_numpy(ap.smallest_magnitude_keep([cpu], k)[0])
                got = to_numpy(ap.smallest_magnitude_keep([gpu], k)[0])
                if not np.array_equal(got, want):
                    bad["torch"].append(f"{dtype} n={n} k={k}")
                if cupy is not None and dtype != "bfloat16":
                    host = values.astype(dtype)
                    got_c = to_numpy(ap.smallest_magnitude_keep([cupy.asarray(host)], k)[0])
                    if not np.array_equal(got_c, to_numpy(ap.smallest_magnitude_keep([host], k)[0])):
                        bad["cupy"].append(f"{dtype} n={n} k={k}")
    # several arrays with eligibility, as global pruning ranks them
    shapes = [(64, 33), (1000,), (16, 8, 3, 3), (512, 256)]
    for dtype in torch_dtypes:
        host = [tie_heavy(rng, math.prod(s), dtype).reshape(s) for s in shapes]
        cpu = [torch.from_numpy(h).to(getattr(torch, dtype)) for h in host]
        elig = [torch.from_numpy(rng.random(s) < 0.6) for s in shapes]
        n_elig = sum(int(e.sum()) for e in elig)
        for k in [1, n_elig // 2, n_elig]:
            cases += 1
            want = [to_numpy(m) for m in ap.smallest_magnitude_keep(cpu, k, elig)]
            got = ap.smallest_magnitude_keep([t.to(DEVICE) for t in cpu], k, [e.to(DEVICE) for e in elig])
            if not all(np.array_equal(to_numpy(g), w) for g, w in zip(got, want, strict=True)):
                bad["torch"].append(f"several {dtype} k={k}")
            if cupy is not None and dtype != "bfloat16":
                arrays = [h.astype(dtype) for h in host]
                want_c = ap.smallest_magnitude_keep(arrays, k, [e.numpy() for e in elig])
                got_c = ap.smallest_magnitude_keep(
                    [cupy.asarray(a) for a in arrays], k, [cupy.asarray(e.numpy()) for e in elig]
                )
                if not all(np.array_equal(to_numpy(g), w) for g, w in zip(got_c, want_c, strict=True)):
                    bad["cupy"].append(f"several {dtype} k={k}")
    results.check(
        f"masks: torch {DEVICE} == torch CPU (host route)",
        not bad["torch"],
        f"{len(bad['torch'])} of {cases} differ: {bad['torch'][:5]}",
    )
    if cupy is not None:
        results.check("masks: CuPy == NumPy", not bad["cupy"], f"{len(bad['cupy'])} differ: {bad['cupy'][:5]}")
    tiny = np.finfo(np.float32).smallest_subnormal
    w = np.array([3 * tiny, 0.0, tiny, -2 * tiny, 5 * tiny, -tiny, 0.0, 4 * tiny], dtype=np.float32)
    want = [True, False, False, True, True, False, False, True]
    results.check(
        f"subnormals rank by value: torch {DEVICE}",
        np.array_equal(to_numpy(ap.l1_unstructured(torch.from_numpy(w).to(DEVICE), 4)), want),
    )
    if cupy is not None:
        results.check(
            "subnormals rank by value: CuPy", np.array_equal(to_numpy(ap.l1_unstructured(cupy.asarray(w), 4)), want)
        )
        wanda = ap.wanda(cupy.asarray(w.reshape(2, 4)), 2, dim=0)
        results.check(
            "subnormals rank by value: Wanda on CuPy",
            np.array_equal(to_numpy(wanda), np.reshape(ap.wanda(w.reshape(2, 4), 2, dim=0), (2, 4))),
        )


def _sizes(args: argparse.Namespace) -> list[int]:
    return QUICK_SIZES if args.quick or not CUDA else FULL_SIZES


def l1(results: Results, args: argparse.Namespace) -> None:
    repeats = 5 if args.quick else 15
    for n in _sizes(args):
        x = torch.randn(n, device=DEVICE)
        k = n // 2
        floor = median_time(lambda x=x: x.abs(), repeats)
        ours = median_time(lambda x=x: ap.l1_unstructured(x, 0.5), repeats)
        peer = median_time(lambda x=x, k=k: torch_topk_mask(x, k), repeats)
        same = np.array_equal(to_numpy(ap.l1_unstructured(x, 0.5)), to_numpy(torch_topk_mask(x, k)))
        row = {
            "lib": f"torch {DEVICE}",
            "n": f"2^{int(math.log2(n))}",
            "pass_ms": round(floor * 1e3, 4),
            "arrayprune_ms": round(ours * 1e3, 4),
            "torch_topk_ms": round(peer * 1e3, 4),
            "x_pass": round(ours / floor, 2),
            "speedup_vs_torch": round(peer / ours, 2),
            "same_as_torch": same,
        }
        results.row("l1", **row)
        if cupy is not None:
            xc = cupy.asarray(x)
            floor_c = median_time(lambda xc=xc: cupy.abs(xc), repeats)
            ours_c = median_time(lambda xc=xc: ap.l1_unstructured(xc, 0.5), repeats)
            results.row(
                "l1",
                lib="cupy",
                n=row["n"],
                pass_ms=round(floor_c * 1e3, 4),
                arrayprune_ms=round(ours_c * 1e3, 4),
                torch_topk_ms=row["torch_topk_ms"],
                x_pass=round(ours_c / floor_c, 2),
                speedup_vs_torch=round(peer / ours_c, 2),
                same_as_torch=np.array_equal(to_numpy(ap.l1_unstructured(xc, 0.5)), to_numpy(torch_topk_mask(x, k))),
            )
            del xc
        del x


def bracket_everywhere(x: Any, k: int) -> Any:
    """The portable route with the sample bracket at every size (below
    ``bracket.SMALL_SIZE`` it sorts every key): where should a GPU cross over?"""
    small = bracket.SMALL_SIZE
    bracket.SMALL_SIZE = 1 << 12
    try:
        return portable.keep_masks(namespace(x), [x], [None], k)
    finally:
        bracket.SMALL_SIZE = small


def routes(results: Results, args: argparse.Namespace) -> None:
    repeats = 5 if args.quick else 11
    candidates: dict[str, Callable[[Any, int], Any]] = {
        "portable": lambda x, k: portable.keep_masks(namespace(x), [x], [None], k),
        "portable_bracket": bracket_everywhere,
    }
    for n in _sizes(args):
        for lib in ["torch"] + (["cupy"] if cupy is not None else []):
            x = torch.randn(n, device=DEVICE)
            peers = {"pass": lambda x, k: x.abs()}
            if lib == "torch":
                peers["torch_kthvalue"] = kthvalue_mask
                peers["torch_topk"] = torch_topk_mask
            else:
                x = cupy.asarray(x)
                peers = {"pass": lambda x, k: cupy.abs(x)}
            k = n // 2
            row: dict[str, Any] = {"lib": lib if lib == "cupy" else f"torch {DEVICE}", "n": f"2^{int(math.log2(n))}"}
            for name, fn in {**peers, **candidates}.items():
                try:
                    row[f"{name}_ms"] = round(median_time(lambda fn=fn, x=x, k=k: fn(x, k), repeats) * 1e3, 4)
                except Exception as exc:  # a route that fails here is reported, not fatal
                    row[f"{name}_ms"] = f"error: {exc!r}"[:80]
            results.row("routes", **row)
            del x


def global_masks(results: Results, args: argparse.Namespace) -> None:
    if args.quick or not CUDA:
        shapes = [(256, 256)] * 8 + [(64, 64, 3, 3)] * 4
    else:
        shapes = [(4096, 4096)] * 24 + [(4096, 11008)] * 4 + [(32000, 4096)]  # about 0.71e9 entries
    torch.manual_seed(0)
    params = [torch.randn(s, device=DEVICE) for s in shapes]
    total = sum(p.numel() for p in params)

    def torch_global() -> list[torch.Tensor]:
        modules = []
        for p in params:
            m = torch.nn.Module()
            m.weight = torch.nn.Parameter(p, requires_grad=False)
            modules.append((m, "weight"))
        torch_prune.global_unstructured(modules, pruning_method=torch_prune.L1Unstructured, amount=0.5)
        return [m.weight_mask for m, _ in modules]

    def ours() -> list[Any]:
        return ap.global_unstructured(params, ap.L1Unstructured, amount=0.5)

    def peak(fn: Callable[[], Any]) -> tuple[Any, float | None]:
        synchronize()
        if not CUDA:
            return fn(), None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        synchronize()
        return out, (torch.cuda.max_memory_allocated() - base) / total

    repeats = 3
    row: dict[str, Any] = {"tensors": len(params), "entries": total}
    masks, row["arrayprune_extra_bytes_per_entry"] = peak(ours)
    row["arrayprune_s"] = round(median_time(ours, repeats, warmup=1), 4)
    try:
        want, row["torch_extra_bytes_per_entry"] = peak(torch_global)
        row["torch_s"] = round(median_time(torch_global, repeats, warmup=0), 4)
        row["speedup_vs_torch"] = round(row["torch_s"] / row["arrayprune_s"], 2)
        row["same_as_torch"] = all(torch.equal(a, b.bool()) for a, b in zip(masks, want, strict=True))
        del want
    except Exception as exc:  # out of memory, say
        row["torch_s"] = f"error: {exc!r}"[:80]
    del masks
    pass_s = median_time(lambda: [p.abs() for p in params], repeats)
    row["x_pass"] = round(row["arrayprune_s"] / pass_s, 2)
    results.row("global", lib=f"torch {DEVICE}", **row)
    if cupy is not None:
        arrays = [cupy.asarray(p) for p in params]
        del params
        t = median_time(lambda: ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.5), repeats, warmup=1)
        results.row("global", lib="cupy", tensors=len(arrays), entries=total, arrayprune_s=round(t, 4))


SECTIONS = {"env": env, "exactness": exactness, "l1": l1, "routes": routes, "global": global_masks}


def write_markdown(results: Results, path: Path) -> None:
    env_info = results.data["env"]
    lines = [
        f"# arrayprune selection on {env_info.get('device', '?')}",
        "",
        f"`{env_info.get('command', '')}` on {env_info.get('date', '')}: torch {env_info.get('torch')}, "
        f"CuPy {env_info.get('cupy')}, NumPy {env_info.get('numpy')}, "
        "Times are medians of synchronised repeats; x_pass is the time over one `abs` pass.",
        "",
        "## Checks",
        "",
    ]
    lines += [f"- {'PASS' if c['ok'] else 'FAIL'} {c['name']} {c['detail']}" for c in results.data["checks"]]
    for section, rows in results.data["rows"].items():
        keys = list(dict.fromkeys(key for row in rows for key in row))
        lines += ["", f"## {section}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(row.get(key, "")) for key in keys) + " |" for row in rows]
    if results.data["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e['section']}: {e['error']}" for e in results.data["errors"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for gpu_bench.json and gpu_bench.md")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of " + ", ".join(SECTIONS))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = Results()
    for name in ["env", *(s for s in args.sections.split(",") if s and s != "env")]:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            SECTIONS[name](results, args)
        except Exception as exc:  # record it and go on with the next section
            results.data["errors"].append({"section": name, "error": repr(exc), "traceback": traceback.format_exc()})
            print(f"ERROR in {name}: {exc!r}", flush=True)
        results.data.setdefault("section_s", {})[name] = round(time.perf_counter() - start, 2)
        if CUDA:
            torch.cuda.empty_cache()
        # after every section: a run stopped at its time limit keeps what it measured
        (args.out / "gpu_bench.json").write_text(json.dumps(results.data, indent=1, default=str))
        write_markdown(results, args.out / "gpu_bench.md")
    failed = [c["name"] for c in results.data["checks"] if not c["ok"]]
    print(f"checks failed: {failed}; sections with errors: {[e['section'] for e in results.data['errors']]}")
    return 1 if failed or results.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
