"""Peak extra memory of one call, in bytes per parameter.

Two methods, each used where it is sound:

* **tracemalloc** (NumPy, in process): NumPy reports every array allocation to
  :mod:`tracemalloc`. The inputs are allocated first; the figure is the traced peak
  during the call minus the traced size just before it, so it counts every temporary
  and the result (the masks), and nothing else. PyTorch's allocator is invisible to it.
* **peak RSS in a fresh subprocess** (PyTorch, and NumPy as a cross-check): the child
  (``python -m benchmarks.memprobe``) imports the libraries, builds the inputs (drawn
  directly in float32, without temporaries), makes one tiny warm-up call, resets the
  kernel's peak-RSS counter (writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM``
  to the current RSS), reads its current resident size (``VmRSS``), makes the call once
  and reads the peak (``VmHWM``). The figure is peak minus that baseline: every page the
  call touched at its peak, whichever allocator it came from. ``ru_maxrss`` is not used
  where ``VmHWM`` exists: a child inherits its parent's value at fork, and it cannot be
  reset. Where the reset is refused the figure is flagged as an upper bound.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["traced_peak_bytes", "rss_probe"]

ROOT = Path(__file__).resolve().parent.parent


def traced_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated (and traced) during ``fn()``, above what was live before."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del result
    gc.collect()
    return peak - before


def rss_probe(spec: dict[str, Any], timeout: float = 900.0) -> dict[str, Any]:
    """Run ``python -m benchmarks.memprobe SPEC`` in a fresh process; return its report.

    The report has ``extra_bytes``, ``params``, ``bytes_per_param``, ``time_s`` (the one
    call, in that process), ``upper_bound`` and, on failure, ``error``.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.memprobe", json.dumps(spec)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])
