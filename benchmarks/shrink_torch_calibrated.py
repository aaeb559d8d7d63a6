"""``prune.shrink`` with weight scores (L2) against calibrated scores, with and without the refit.

::

    python -m benchmarks.shrink_torch_calibrated [--amounts 0.3,0.5,0.7] [--size 64]
                                                 [--threads 1] [--out FILE]

Two models, each shrunk from the same dense copy by every score at every amount:

* **digits CNN** (trained): ``conv(1->32) bn relu conv(32->64) bn relu maxpool conv(64->64)
  bn relu avgpool flatten linear(64->64) relu linear(64->10)`` trained here on 70% of
  scikit-learn's ``load_digits`` (8 x 8 images; Adam, 40 epochs, ``torch.manual_seed(0)``),
  calibrated on 256 training images (4 batches of 64), evaluated on the held-out 30%:
  test accuracy and the logits' cosine to the dense model's. The evidence that counts.
* **resnet18 layout** (``tests/torchvision_layouts.py``, 1000 classes, random weights and
  BatchNorm statistics, ``size x size`` inputs of random normal values): calibrated on 4
  batches of 8 random images, the output's cosine to the dense model on 2 other batches of
  8. Random weights and random data carry no structure to find: weak evidence, only that
  the scores and refit behave at the scale of a real architecture.

Scores: ``ln_structured`` (L2 over the group's weights, no data), ``activation_structured``
and ``obs_structured`` on the calibration batches, each with ``compensate=False`` (slice
only) and ``compensate=True`` (every consumer refit on its kept columns). The time to
shrink (tracing, the calibration pass, scoring, refit and slicing) is one run on a fresh
copy (the default rounding, ``round(amount * channels)`` per group).
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "shrink-torch-calibrated-cpu-x86_64-2cores.md"
sys.path.insert(0, str(HERE.parent / "tests"))

if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.shrink_torch import _rev, random_batchnorm  # noqa: E402
else:
    from .shrink_torch import _rev, random_batchnorm

SCORES = [
    ("ln_structured", {}),
    ("activation_structured", {"compensate": False}),
    ("activation_structured", {"compensate": True}),
    ("obs_structured", {"compensate": False}),
    ("obs_structured", {"compensate": True}),
]


def _label(method: str, options: dict) -> str:
    if method == "ln_structured":
        return "L2 (weights)"
    return f"{method}" + (" + refit" if options.get("compensate") else "")


def _cos(a: Any, b: Any) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _digits_cnn() -> tuple[Any, list, Any, Any, float]:
    """The trained CNN, its calibration batches, the test images and labels, its test accuracy."""
    import torch
    from torch import nn

    from .digits_accuracy import digits_split

    x_train, x_test, y_train, y_test = digits_split()
    xt = torch.from_numpy(x_train).reshape(-1, 1, 8, 8)
    yt = torch.from_numpy(y_train).long()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        order = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = order[i : i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    calibration = [xt[i : i + 64] for i in range(0, 256, 64)]
    xs = torch.from_numpy(x_test).reshape(-1, 1, 8, 8)
    ys = torch.from_numpy(y_test).long()
    with torch.no_grad():
        acc = float((model(xs).argmax(1) == ys).double().mean())
    return model, calibration, xs, ys, acc


def _resnet18(size: int) -> tuple[Any, list, list]:
    import torch
    import torchvision_layouts as L

    torch.manual_seed(0)
    model = L.resnet18(1000).eval()
    g = torch.Generator().manual_seed(1)
    random_batchnorm(model, g)  # the layout of benchmarks.shrink_torch; g goes on to draw the data
    calibration = [torch.randn(8, 3, size, size, generator=g) for _ in range(4)]
    held_out = [torch.randn(8, 3, size, size, generator=g) for _ in range(2)]
    return model, calibration, held_out


def _shrunk(dense: Any, x: Any, amount: float, method: str, options: dict, calibration: list) -> tuple[Any, float]:
    import arrayprune.adapters.torch as prune

    model = copy.deepcopy(dense)
    data = {} if method == "ln_structured" else {"calibration_batches": calibration}
    start = time.perf_counter()
    prune.shrink(model, x, amount, method, **data, **options)
    return model, time.perf_counter() - start


def bench(amounts: list[float], size: int, log: Any) -> dict:
    import torch

    out: dict = {"digits": [], "resnet18": []}
    dense, calibration, xs, ys, acc = _digits_cnn()
    out["digits_dense"] = acc
    params = sum(p.numel() for p in dense.parameters())
    out["digits_params"] = params
    with torch.no_grad():
        want = dense(xs)
    for amount in amounts:
        for method, options in SCORES:
            model, seconds = _shrunk(dense, xs[:1], amount, method, options, calibration)
            with torch.no_grad():
                got = model(xs)
            row = {
                "amount": amount, "score": _label(method, options), "seconds": seconds,
                "accuracy": float((got.argmax(1) == ys).double().mean()), "cosine": _cos(got, want),
                "params": sum(p.numel() for p in model.parameters()),
            }  # fmt: skip
            out["digits"].append(row)
            log(f"digits {amount} {row['score']}: accuracy {row['accuracy']:.4f} cosine {row['cosine']:.4f}")
    dense, calibration, held_out = _resnet18(size)
    with torch.no_grad():
        wants = [dense(b) for b in held_out]
    for amount in amounts:
        for method, options in SCORES:
            model, seconds = _shrunk(dense, held_out[0][:1], amount, method, options, calibration)
            with torch.no_grad():
                got = [model(b) for b in held_out]
            cos = _cos(torch.cat(got), torch.cat(wants))
            out["resnet18"].append({"amount": amount, "score": _label(method, options), "seconds": seconds,
                                    "cosine": cos, "params": sum(p.numel() for p in model.parameters())})  # fmt: skip
            log(f"resnet18 {amount} {_label(method, options)}: cosine {cos:.4f} ({seconds:.1f} s)")
    return out


def write(results: dict, command: str, out: Path, started: str) -> None:
    import torch

    lines = [
        "# `prune.shrink`: weight scores against calibrated scores, with and without the refit",
        "",
        f"- date: {started}",
        f"- command: `{command}` (revision {_rev()})",
        f"- machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s) (2 cores shared with other jobs)",
        "- method: see the docstring of `benchmarks/shrink_torch_calibrated.py`",
        "",
        f"## digits CNN (trained; dense test accuracy {results['digits_dense']:.4f}, "
        f"{results['digits_params']:,} parameters)",
        "",
        "| amount | score | test accuracy | logits' cosine to dense | parameters | shrink s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["digits"]:
        lines.append(f"| {r['amount']:.0%} | {r['score']} | {r['accuracy']:.4f} | {r['cosine']:.4f} | "
                     f"{r['params']:,} | {r['seconds']:.2f} |")  # fmt: skip
    lines += [
        "",
        "## resnet18 layout (random weights, random data: weak evidence)",
        "",
        "| amount | score | output cosine to dense (held-out) | parameters | shrink s |",
        "|---|---|---|---|---|",
    ]
    for r in results["resnet18"]:
        lines.append(f"| {r['amount']:.0%} | {r['score']} | {r['cosine']:.4f} | {r['params']:,} | {r['seconds']:.2f} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--amounts", default="0.3,0.5,0.7")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = bench([float(a) for a in args.amounts.split(",")], args.size, lambda s: print(s, flush=True))
    command = "python -m benchmarks.shrink_torch_calibrated " + " ".join(argv if argv is not None else sys.argv[1:])
    write(results, command.strip(), args.out, started)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
