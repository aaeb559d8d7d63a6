"""Global L1 on Dask arrays read per block from files, against NumPy in memory.

Usage (from the repository root, with dask installed)::

    python -m benchmarks.dask_row                      # 2^29 float32 (2 GiB) in 4 arrays
    python -m benchmarks.dask_row --log2 24 --chunk-log2 20 --repeats 1   # a quick check

The data (four float32 arrays, 2-D and 1-D, weights-like) is written once as ``.npy``
files in ``--dir``. Each side runs in a fresh subprocess, ``--repeats`` times:

* **numpy**: the files loaded into memory, then ``global_unstructured(arrays,
  L1Unstructured, amount=0.5)``; the masks are saved (bit-packed) for the check;
* **dask**: each block read from its file when a task needs it (so that no file stays
  mapped), the same call, then the masks computed and stored block by block into
  ``.npy`` files (``dask.array.store``, each file mapped only while a block is
  written), the final graph execution. Graph executions
  are counted with a ``dask.callbacks.Callback``; the stored masks are compared with
  NumPy's after the timing.

Peak RSS is the child's ``VmHWM``, reset after imports (and, for NumPy, after the
data is loaded: the figure above the data is reported as well).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .memprobe import _peak, _reset_peak, _status

ROOT = Path(__file__).resolve().parent.parent
AMOUNT = 0.5


def shapes_for(log2: int) -> list[tuple[int, ...]]:
    """Four arrays of 2^(log2-1), 2^(log2-2), 2^(log2-3), 2^(log2-3) entries: 2-D, 2-D, 1-D, 2-D."""
    def square(n: int) -> tuple[int, int]:
        rows = 1 << ((n.bit_length() - 1 + 1) // 2)
        return rows, n // rows

    sizes = [1 << (log2 - 1), 1 << (log2 - 2), 1 << (log2 - 3), 1 << (log2 - 3)]
    return [square(sizes[0]), square(sizes[1]), (sizes[2],), square(sizes[3])]


def chunks_for(shape: tuple[int, ...], chunk_log2: int) -> tuple[int, ...]:
    """Blocks of 2^chunk_log2 entries: square for 2-D (side by side in flat order)."""
    if len(shape) == 1:
        return (1 << chunk_log2,)
    side = 1 << (chunk_log2 // 2)
    return (min(side, shape[0]), min((1 << chunk_log2) // side, shape[1]))


def write_data(directory: Path, shapes: list[tuple[int, ...]]) -> list[Path]:
    """float32 weights-like data (normal, scale 0.02), written once, in slices."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, shape in enumerate(shapes):
        path = directory / f"w{i}-{'x'.join(map(str, shape))}.npy"
        if not path.exists():
            out = np.lib.format.open_memmap(path.with_suffix(".tmp"), mode="w+", dtype=np.float32, shape=shape)
            flat = out.reshape(-1)
            rng = np.random.default_rng(i)
            step = 1 << 22
            for start in range(0, flat.size, step):
                part = rng.standard_normal(min(step, flat.size - start), dtype=np.float32)
                flat[start : start + part.size] = part * np.float32(0.02)
            out.flush()
            del out, flat
            path.with_suffix(".tmp").rename(path)
        paths.append(path)
    return paths


def _load_block(path: str, block_info=None) -> np.ndarray:
    """One block of a ``.npy`` file, copied out of a mapping that is closed at once."""
    where = tuple(slice(lo, hi) for lo, hi in block_info[None]["array-location"])
    mapped = np.load(path, mmap_mode="r")
    block = np.array(mapped[where])
    del mapped
    return block


class _BlockWriter:
    """A ``dask.array.store`` target writing each block into a ``.npy`` file, mapped only meanwhile."""

    def __init__(self, path: Path, shape: tuple[int, ...]):
        self.path = path
        np.lib.format.open_memmap(path, mode="w+", dtype=bool, shape=shape).flush()

    def __setitem__(self, where, block: np.ndarray) -> None:
        mapped = np.load(self.path, mmap_mode="r+")
        mapped[where] = block  # written back by the kernel: no msync in the timed call
        del mapped


def _measured(call) -> dict:
    """Time one call; its peak RSS (VmHWM, reset first) and that peak above the RSS before it."""
    _reset_peak()
    base = _status("VmRSS")
    t0 = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - t0
    peak = _peak()
    return {"time_s": elapsed, "peak_rss": peak, "above_start": peak - base, "result": result}


def run_numpy(paths: list[Path], out: Path) -> dict:
    import arrayprune as ap

    ap.global_unstructured([np.ones(8, np.float32)], ap.L1Unstructured, amount=AMOUNT)  # warm-up
    arrays = [np.load(p) for p in paths]
    run = _measured(lambda: ap.global_unstructured(arrays, ap.L1Unstructured, amount=AMOUNT))
    for i, m in enumerate(run.pop("result")):
        np.save(out / f"numpy-mask{i}.npy", np.packbits(m.reshape(-1)))
    return run


def _lazy_arrays(paths: list[Path], chunk_log2: int) -> list:
    """Dask arrays whose blocks are read from the files when a task needs them."""
    import dask.array as da

    arrays = []
    for p in paths:
        shape = np.load(p, mmap_mode="r").shape
        chunks = da.core.normalize_chunks(chunks_for(shape, chunk_log2), shape)
        meta = np.empty((0,) * len(shape), np.float32)
        arrays.append(da.map_blocks(_load_block, str(p), chunks=chunks, dtype=np.float32, meta=meta))
    return arrays


def run_dask(paths: list[Path], out: Path, chunk_log2: int) -> dict:
    import dask
    import dask.array as da
    from dask.callbacks import Callback

    import arrayprune as ap

    class Executions(Callback):
        def __init__(self):
            super().__init__()
            self.count = 0

        def _start(self, dsk):
            self.count += 1

    arrays = _lazy_arrays(paths, chunk_log2)
    # For scale: one plain pass over the same blocks (a sum), one graph execution.
    one_pass = _measured(lambda: dask.compute(*[a.sum() for a in arrays]))
    targets = [_BlockWriter(out / f"dask-mask{i}.npy", a.shape) for i, a in enumerate(arrays)]
    runs = Executions()

    def prune_and_store() -> int:
        with runs:
            masks = ap.global_unstructured(arrays, ap.L1Unstructured, amount=AMOUNT)
            selection = runs.count
            da.store(masks, targets, lock=False)
        return selection

    run = _measured(prune_and_store)
    selection = run.pop("result")
    identical = all(
        np.array_equal(
            np.packbits(np.load(out / f"dask-mask{i}.npy", mmap_mode="r").reshape(-1)),
            np.load(out / f"numpy-mask{i}.npy"),
        )
        for i in range(len(arrays))
    )
    return {
        **run,
        "selection_executions": selection,
        "executions": runs.count,
        "identical": identical,
        "one_pass": {k: v for k, v in one_pass.items() if k != "result"},
        "dask": dask.__version__,
    }


def child(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    paths = [Path(p) for p in spec["paths"]]
    out = Path(spec["out"])
    if spec["lib"] == "numpy":
        result = run_numpy(paths, out)
    else:
        result = run_dask(paths, out, spec["chunk_log2"])
    print(json.dumps(result))


def _run_child(spec: dict) -> dict:
    command = [sys.executable, "-m", "benchmarks.dask_row", "--child", json.dumps(spec)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2", type=int, default=29, help="total entries, 2^log2 (default 29: 2 GiB of float32)")
    parser.add_argument("--chunk-log2", type=int, default=24, help="entries per block, 2^n (default 24)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/arrayprune-dask-row"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/dask-cpu-x86_64-2cores.md")
    args = parser.parse_args()

    shapes = shapes_for(args.log2)
    paths = write_data(args.dir, shapes)
    spec = {"paths": [str(p) for p in paths], "out": str(args.dir), "chunk_log2": args.chunk_log2}
    runs: dict[str, list[dict]] = {"numpy": [], "dask": []}
    args.load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for lib in ("numpy", "dask"):  # NumPy first: its masks are the reference
            runs[lib].append(_run_child({**spec, "lib": lib}))
            print(lib, runs[lib][-1], flush=True)
    write_report(args, shapes, runs)


def write_report(args: argparse.Namespace, shapes: list[tuple[int, ...]], runs: dict[str, list[dict]]) -> None:
    import arrayprune

    total = sum(math.prod(s) for s in shapes)
    blocks = sum(
        math.prod(math.ceil(n / c) for n, c in zip(s, chunks_for(s, args.chunk_log2), strict=True)) for s in shapes
    )
    dask_version = runs["dask"][0]["dask"]
    options = [("--log2", args.log2, 29), ("--chunk-log2", args.chunk_log2, 24), ("--repeats", args.repeats, 3)]
    command = " ".join(["python -m benchmarks.dask_row", *(f"{o} {v}" for o, v, default in options if v != default)])
    lines = [
        "# Global L1 on Dask arrays, against NumPy in memory",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, NumPy {np.__version__}, Dask {dask_version}, arrayprune"
        f" {arrayprune.__version__}; load average {args.load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
        f"- command: `{command}`",
        f"- data: {len(shapes)} float32 arrays, {', '.join('x'.join(map(str, s)) for s in shapes)}: 2^{args.log2} ="
        f" {total:,} entries, {_gib(4 * total)}, normal (scale 0.02); `global_unstructured(arrays, L1Unstructured,"
        f" amount={AMOUNT})`",
        f"- Dask: blocks of 2^{args.chunk_log2} entries ({blocks} blocks; 2-D blocks square, side by side in flat"
        " order), each read from its `.npy` file when a task needs it (the files sit in the page cache), threaded"
        " scheduler; the masks are stored block by block into `.npy` files (`dask.array.store`), which is the last"
        " graph execution and is timed. NumPy: the arrays loaded in memory first (not timed), one thread",
        "- peak RSS: the child process's VmHWM, reset just before the timed call (NumPy: with the data loaded);"
        " 'above the start' is the peak minus the resident size then",
        f"- {args.repeats} fresh processes per side; median time, largest peak",
        "",
        "| run | time (median) | times | peak RSS | above the start | graph executions (selection + store) |"
        " masks identical to NumPy's |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [
        ("numpy", runs["numpy"]),
        ("dask", runs["dask"]),
        ("dask: one pass (sum), for scale", [r["one_pass"] for r in runs["dask"]]),
    ]
    for name, rs in rows:
        times = [r["time_s"] for r in rs]
        if name == "dask":
            ex = sorted({(r["selection_executions"], r["executions"]) for r in rs})
            executions = ", ".join(f"{s} + {e - s} = {e}" for s, e in ex)
            same = "yes" if all(r["identical"] for r in rs) else "**no**"
        else:
            executions, same = ("-", "(reference)") if name == "numpy" else ("1", "-")
        lines.append(
            f"| {name} | {statistics.median(times):.2f} s | {', '.join(f'{t:.2f}' for t in times)} |"
            f" {_gib(max(r['peak_rss'] for r in rs))} | {_gib(max(r['above_start'] for r in rs))} | {executions} |"
            f" {same} |"
        )
    median = {name: statistics.median(r["time_s"] for r in rs) for name, rs in rows}
    lines += [
        "",
        f"Dask takes {median['dask'] / median['numpy']:.1f}x NumPy's time (whose data must fit in memory) and"
        f" {median['dask'] / median[rows[2][0]]:.1f}x one plain Dask pass over the same blocks, with a peak RSS"
        f" {max(r['peak_rss'] for r in runs['numpy']) / max(r['peak_rss'] for r in runs['dask']):.1f}x lower; its"
        " working memory is that of a plain pass (blocks in flight), whatever the size of the data.",
    ]
    if args.load_before > (os.cpu_count() or 1):
        lines.append("The machine was shared with other jobs (load averages above): times vary from run to run.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
