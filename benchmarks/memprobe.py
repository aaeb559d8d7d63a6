"""Child process of :func:`benchmarks.memory.rss_probe`: one call, its peak RSS.

Usage: ``python -m benchmarks.memprobe '{"op": "l1", "lib": "torch", "n": 16777216}'``.
Prints one JSON line. Ops: ``l1`` (``n``), ``global`` (``total``), ``structured``
(``shape``); libs: ``arrayprune`` (NumPy arrays), ``torch`` (torch.nn.utils.prune),
``adapter`` (arrayprune.adapters.torch, global only), ``partition`` (l1 only).
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time
from typing import Any

from . import data


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset the peak RSS (VmHWM) to the current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    """Peak RSS of this process: VmHWM, else ru_maxrss (which a child inherits at fork)."""
    try:
        return _status("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _prepare(spec: dict[str, Any], small: bool):
    """Return ``(params, call)`` for the spec, on tiny inputs when `small`."""
    op, lib = spec["op"], spec["lib"]
    if op == "l1":
        n = 1024 if small else int(spec["n"])
        x = data.vector(n)
        if lib == "torch":
            import torch
            import torch.nn.utils.prune as tprune

            t = torch.from_numpy(x)
            m = torch.ones_like(t)
            return n, lambda: tprune.L1Unstructured(0.5).compute_mask(t, m)
        import numpy as np

        if lib == "partition":
            k = round(0.5 * n)
            return n, lambda: np.abs(x) > np.partition(np.abs(x), k - 1)[k - 1]
        import arrayprune as ap

        m = np.ones(n, dtype=bool)
        return n, lambda: ap.L1Unstructured(0.5).compute_mask(x, m)
    if op == "structured":
        shape = (4, 4, 3, 3) if small else tuple(spec["shape"])
        x = data.tensor(shape)
        if lib == "torch":
            import torch
            import torch.nn.utils.prune as tprune

            t = torch.from_numpy(x)
            m = torch.ones_like(t)
            return x.size, lambda: tprune.LnStructured(0.5, n=2, dim=0).compute_mask(t, m)
        import numpy as np

        import arrayprune as ap

        m = np.ones(shape, dtype=np.float32)
        return x.size, lambda: ap.LnStructured(0.5, n=2, dim=0).compute_mask(x, m)
    if op == "global":
        shapes = data.global_shapes(20_000 if small else int(spec["total"]))
        arrays = data.global_arrays(shapes)
        params = sum(a.size for a in arrays)
        amount = spec.get("amount", 0.8)
        if lib == "arrayprune":
            import arrayprune as ap

            return params, lambda: ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount)
        mods = data.holders(arrays)
        pairs = [(m, "weight") for m in mods]
        if lib == "torch":
            import torch.nn.utils.prune as tprune

            return params, lambda: tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=amount)
        if lib == "adapter":
            import arrayprune.adapters.torch as adapter

            method = adapter.L1Unstructured
            return params, lambda: adapter.global_unstructured(pairs, method, amount=amount)
    raise ValueError(f"unknown probe {spec}")


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    _, warm = _prepare(spec, small=True)
    warm()
    del warm
    params, call = _prepare(spec, small=False)
    gc.collect()
    reset = _reset_peak()
    before_peak = _peak()
    modules_before = set(sys.modules)
    base = _status("VmRSS")
    t0 = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - t0
    peak = _peak()
    del result
    imported = sorted({m.split(".")[0] for m in set(sys.modules) - modules_before})
    extra = peak - base
    print(
        json.dumps(
            {
                "spec": spec,
                "params": params,
                "baseline_rss": base,
                "peak_rss": peak,
                "extra_bytes": extra,
                "bytes_per_param": extra / params,
                "time_s": elapsed,
                "peak_reset": reset,
                "upper_bound": before_peak >= peak and before_peak > base,
                "imported_during_call": imported,
                "method": "peak RSS (VmHWM, reset just before the call) minus VmRSS after allocating inputs, fresh subprocess",
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
