"""What a pruned model buys at inference: zeros against removed channels, on the CPU.

::

    python -m benchmarks.deployment_speed [--rounds 41] [--threads 2] [--out FILE]

Two stacks, each timed on the same data in one process, the variants run in a rotating
order in every round (medians, ratios over the dense median):

* **onnxruntime** (CPUExecutionProvider), on the ``ffn`` model of
  :mod:`benchmarks.shrink_onnx` (four residual FFN blocks 768 -> 3072 -> 768, batch 64,
  torch's default exporter): the dense model; 50% of the weights zeroed by one global L1
  threshold (``prune_file(amount=0.5, global_=True)``); 2:4 along each weight's reduction
  axis (``method="nm_structured"``); and 50% of each FFN's hidden channels removed
  (``prune_file(amount=0.5, shrink=True)``).
* **PyTorch** (CPU), one ``Linear`` 4096 -> 4096 at batch 64: the dense layer; the same
  layer with 50% of its weights zeroed (a dense matmul over zeros); that weight as a CSR
  tensor (``torch.sparse.mm``), at 50% and at 90% zeros; and the layer with half its input
  channels removed (4096 -> 2048 columns).

Nothing here needs a GPU; the figures measured on an H100 (semi-structured 2:4 matmuls)
are quoted in the README from the team's run, not from this script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .shrink_onnx import _cpu, _load, _params, _rev, _session, _time, _versions, export

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "deployment-speed-cpu-x86_64-2cores.md"


def _onnx_variants() -> tuple[dict, np.ndarray]:
    """The ``ffn`` model dense, pruned three ways by arrayprune's file pipeline."""
    import onnx

    from arrayprune.adapters import prune_file

    dense, x = export("ffn")
    variants = {"dense": dense}
    options = {
        "50% unstructured (global L1)": {"amount": 0.5, "global_": True},
        "2:4 (nm_structured)": {"method": "nm_structured", "nm": (2, 4)},
        "50% channels removed (--shrink)": {"method": "ln_structured", "amount": 0.5, "shrink": True},
    }
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "dense.onnx")
        onnx.save(dense, src)
        for name, kw in options.items():
            dst = Path(tmp, f"{len(variants)}.onnx")
            prune_file(src, dst, **kw)
            variants[name] = onnx.load(dst)
    return variants, x


def _zeros(model) -> float:
    from onnx import numpy_helper

    arrays = [numpy_helper.to_array(t) for t in model.graph.initializer]
    return sum(int((a == 0).sum()) for a in arrays) / sum(a.size for a in arrays)


def _torch_rows(rounds: int, threads: int) -> list[tuple[str, float, float, str]]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    w = torch.randn(4096, 4096)
    x = torch.randn(64, 4096)
    cut = w.abs().flatten().kthvalue(w.numel() // 2).values
    w50 = torch.where(w.abs() > cut, w, 0.0)
    cut90 = w.abs().flatten().kthvalue(int(w.numel() * 0.9)).values
    w90 = torch.where(w.abs() > cut90, w, 0.0)
    csr50, csr90 = w50.to_sparse_csr(), w90.to_sparse_csr()
    w_half = w[:, :2048].contiguous()
    x_half = x[:, :2048].contiguous()
    calls = {
        "dense": lambda: x @ w.T,
        "50% zeros, dense matmul": lambda: x @ w50.T,
        "50% zeros, CSR (torch.sparse.mm)": lambda: torch.sparse.mm(csr50, x.T),
        "90% zeros, CSR (torch.sparse.mm)": lambda: torch.sparse.mm(csr90, x.T),
        "50% input channels removed": lambda: x_half @ w_half.T,
    }
    notes = {
        "dense": "4096x4096",
        "50% zeros, dense matmul": "same shape",
        "50% zeros, CSR (torch.sparse.mm)": f"{csr50.values().numel():,} stored values",
        "90% zeros, CSR (torch.sparse.mm)": f"{csr90.values().numel():,} stored values",
        "50% input channels removed": "4096x2048",
    }
    with torch.inference_mode():
        for f in calls.values():
            f()
        samples: dict[str, list[float]] = {n: [] for n in calls}
        names = list(calls)
        for r in range(rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                calls[n]()
                samples[n].append(time.perf_counter() - t0)
    base = statistics.median(samples["dense"])
    return [(n, statistics.median(s) * 1e3, statistics.median(s) / base, notes[n]) for n, s in samples.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)

    variants, x = _onnx_variants()
    sessions = {n: _session(m, a.threads) for n, m in variants.items()}
    reference = sessions["dense"].run(None, {"x": x})[0]
    samples = _time(sessions, x, a.rounds, warmup=3)
    base = statistics.median(samples["dense"])
    lines = [
        "# What pruning buys at inference (CPU): zeros against removed channels",
        "",
        f"- command: `python -m benchmarks.deployment_speed --rounds {a.rounds} --threads {a.threads}`",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} (UTC); revision {_rev()}",
        f"- versions: {_versions()}",
        f"- CPU: {_cpu()}, {a.threads} threads; load average at start: {_load()}",
        "- timing: warm-up, then rounds running every variant once in a rotating order; median per variant, "
        "ratio = median / dense median",
        "",
        "## onnxruntime: 4 x residual FFN 768->3072->768, batch 64 (torch dynamo export)",
        "",
        "| variant | parameters | zeros | ms (median) | / dense | max abs difference to the dense output |",
        "|---|---|---|---|---|---|",
    ]
    for n, m in variants.items():
        med = statistics.median(samples[n])
        out = sessions[n].run(None, {"x": x})[0]
        diff = float(np.abs(out - reference).max())
        lines.append(f"| {n} | {_params(m):,} | {_zeros(m):.1%} | {med * 1e3:.1f} | {med / base:.2f}x | {diff:.3g} |")
    lines += [
        "",
        "## PyTorch CPU: one Linear 4096 -> 4096, batch 64",
        "",
        "| variant | weight | ms (median) | / dense |",
        "|---|---|---|---|",
    ]
    for n, ms, ratio, note in _torch_rows(a.rounds, a.threads):
        lines.append(f"| {n} | {note} | {ms:.2f} | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    a.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
