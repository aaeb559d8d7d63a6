"""A/B timing of the selection: another revision's core against this checkout's.

    python -m benchmarks.ab_selection                 # against main
    python -m benchmarks.ab_selection --rev HEAD~3 --quick --out /tmp/ab.md
    python -m benchmarks.ab_selection --only "torch CPU" --repeats 31

The other revision's ``arrayprune/`` core is extracted with ``git archive`` into a
temporary folder and imported from there under another package name (the core imports
only relatively), so both versions run in this one process, on the same arrays, on
alternating rounds (:func:`benchmarks.timing.compare`): ratios are new time / old time
of the medians. Before timing, every case checks that both return identical masks
(and equal values for ``kth_smallest``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

import arrayprune

from .timing import Settings, compare

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

ROOT = Path(__file__).resolve().parent.parent


def load_revision(rev: str, into: Path) -> Any:
    """The ``arrayprune`` core of git revision `rev`, imported as ``arrayprune_ab``."""
    archive = subprocess.run(["git", "archive", rev, "arrayprune"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        # Our own archive; the "data" filter where this Python has it (3.10.12+, 3.11.4+).
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    init = into / "arrayprune" / "__init__.py"
    spec = importlib.util.spec_from_file_location("arrayprune_ab", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _normal(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def cases(quick: bool) -> list[tuple[str, str, Callable[[Any], Callable[[], Any]]]]:
    """(label, what is compared, bench factory given a module): the factory binds the data."""
    out = []
    exps = (14, 18, 20, 22, 24) if not quick else (14, 20, 22)
    for e in exps:
        x = _normal(1 << e, e)
        out.append((f"numpy 1-D 2^{e}", "keep", lambda m, x=x: lambda: m.smallest_magnitude_keep([x], x.size // 2)))
    for e in (6, 20, 24) if not quick else (6, 20):
        x = _normal(1 << e, e + 100).reshape(1 << (e // 2), -1)
        out.append((f"numpy 2-D 2^{e}", "keep", lambda m, x=x: lambda: m.smallest_magnitude_keep([x], x.size // 2)))
    x = _normal(1 << 24, 7)
    x[np.random.default_rng(8).random(x.size) < 0.5] = 0.0
    out.append(("numpy 2^24, half zeros", "keep", lambda m, x=x: lambda: m.smallest_magnitude_keep([x], 3 * x.size // 4)))
    xs = [_normal(64, 1), _normal(64, 2).reshape(8, 8)]
    out.append(("numpy 2 arrays 2^6", "keep", lambda m, xs=xs: lambda: m.smallest_magnitude_keep(xs, 64)))
    for e in (20, 24) if not quick else (20,):
        g = np.random.default_rng(e)
        sizes = [(1 << e) // 8] * 8
        xs = [_normal(s, i).reshape(-1, 256) for i, s in enumerate(sizes)]
        el = [g.random(a.shape) < 0.9 for a in xs]
        k = sum(int(m.sum()) for m in el) // 2
        out.append(
            (
                f"numpy 8 arrays 2^{e}, eligibility",
                "keep",
                lambda m, xs=xs, el=el, k=k: lambda: m.smallest_magnitude_keep(xs, k, el),
            )
        )
    if torch is not None:
        for e in (14, 20, 24) if not quick else (14, 20):
            t = torch.from_numpy(_normal(1 << e, e + 200))
            out.append((f"torch CPU 2^{e}", "keep", lambda m, t=t: lambda: m.smallest_magnitude_keep([t], t.numel() // 2)))
        for e in (20, 24) if not quick else (20,):
            t = torch.from_numpy(_normal(1 << e, e + 500))
            out.append((f"GPU route on CPU tensors 2^{e}", "keep", lambda m, t=t: _accelerator_route(m, [t], [None])))
        ts = [torch.from_numpy(_normal(1 << 21, i)) for i in range(8)]
        el = [torch.from_numpy(np.random.default_rng(i).random(1 << 21) < 0.9) for i in range(8)]
        out.append(("GPU route on CPU tensors 8 x 2^21, eligibility", "keep", lambda m: _accelerator_route(m, ts, el)))
    for e in (14, 20, 24) if not quick else (14, 20):
        x = _normal(1 << e, e + 300)
        out.append((f"kth_smallest numpy 2^{e}", "kth", lambda m, x=x: lambda: m.kth_smallest(x, x.size // 2)))
    if torch is not None:
        t = torch.from_numpy(_normal(1 << 20, 400))
        out.append(("kth_smallest torch CPU 2^20", "kth", lambda m, t=t: lambda: m.kth_smallest(t, t.numel() // 2)))
    return out


def _accelerator_route(m: Any, tensors: list[Any], eligible: list[Any]) -> Callable[[], Any]:
    """The route of CUDA tensors and CuPy (portable, on integer bit keys), run on CPU
    tensors: a proxy for its passes over the data where no GPU is at hand."""
    xp = m.namespace(tensors[0])
    k = sum(t.numel() if e is None else int(e.sum()) for t, e in zip(tensors, eligible, strict=True)) // 2

    def run() -> Any:
        on_accelerator = m.keys.on_accelerator
        m.keys.on_accelerator = lambda x: True
        try:
            return m.portable.keep_masks(xp, tensors, eligible, k)
        finally:
            m.keys.on_accelerator = on_accelerator

    return run


def _same(a: Any, b: Any, what: str) -> bool:
    if what == "kth":
        return type(a) is type(b) and np.asarray(a).tolist() == np.asarray(b).tolist()
    return len(a) == len(b) and all(np.array_equal(np.asarray(p), np.asarray(q)) for p, q in zip(a, b, strict=True))


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_selection", description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="main", help="the revision to compare against (default: main)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, 7 rounds")
    parser.add_argument("--only", help="only the cases whose label contains this text")
    parser.add_argument("--repeats", type=int, help="rounds per case (default 11, quick 7; never under 7)")
    parser.add_argument("--out", help="also write the Markdown table here")
    args = parser.parse_args(argv)
    repeats = max(7, args.repeats or (7 if args.quick else 11))
    settings = Settings(repeats=repeats, min_repeats=repeats, max_bench_s=60.0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old = load_revision(args.rev, Path(tmp)).selection
        new = arrayprune.selection
        for label, what, bench in cases(args.quick):
            if args.only and args.only not in label:
                continue
            run_old, run_new = bench(old), bench(new)
            same = _same(run_old(), run_new(), what)
            t = compare({"old": run_old, "new": run_new}, settings)
            ratio = t["new"].median / t["old"].median
            rows.append(f"| {label} | {_fmt(t['old'].median)} | {_fmt(t['new'].median)} | {ratio:.3f} | {same} |")
            print(rows[-1], flush=True)
    table = "\n".join(
        [f"| case ({args.rev} -> checkout) | old | new | new / old | identical |", "|---|---|---|---|---|", *rows]
    )
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
