"""Shrinking torch modules: arrayprune's ``prune.shrink`` beside Torch-Pruning 1.6.1.

::

    python -m benchmarks.shrink_torch [--models resnet18,mobilenet_v3_small,vit_b_16]
                                      [--amounts 0.3,0.5] [--size 224] [--threads 1]
                                      [--rounds 11] [--out FILE]

Models: torchvision's ``resnet18``, ``mobilenet_v3_small`` and ``vit_b_16`` as written in
``tests/torchvision_layouts.py`` (torchvision's module names and sizes, 1000 classes),
random weights (``torch.manual_seed(0)``), BatchNorm statistics and affine terms drawn at
random too (so that every channel's norm parameters differ and a BatchNorm shift is not
zero), evaluation mode, one ``1 x 3 x size x size`` input.

For each model and amount, on deep copies of the same dense model:

* arrayprune: ``prune.shrink(model, x, amount)`` (every group loses ``round(amount *
  channels)`` channels, lowest L2 norm over all weight members of the group first);
* Torch-Pruning 1.6.1: ``MetaPruner(model, x, importance=GroupMagnitudeImportance(p=2),
  pruning_ratio=amount, ignored_layers=[classifier], num_heads={mha: heads})`` and one
  ``step()`` (its group L2 magnitude; it keeps ``int((1 - amount) * channels)``);
* arrayprune with Torch-Pruning's rounding: ``prune.shrink(model, x, amount,
  rounding="keep_floor")``, each group keeping ``int((1 - amount) * channels)`` (the
  same counts as Torch-Pruning: this row separates the rounding rule from the rest).

Reported: parameters, multiply-accumulates of the convolutions and linear layers, torch
CPU latency (``torch.set_num_threads(threads)``, ``torch.inference_mode``; rounds that
run every model once in a rotating order, medians), the output's cosine to the *masked
model* (the dense model with that tool's removed channels zeroed in every member of their
group: producer rows and bias, norm scale, shift and statistics, depthwise filters,
consumer columns; the removed channels are read off the shrunk model's 1-D members) and
to the dense model, the overlap of the channels both tools kept, and the time to shrink
(from the dense model to the smaller one, tracing included; medians of rounds on fresh
copies made outside the timed region).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import warnings
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "shrink-torch-cpu-x86_64-2cores.md"
sys.path.insert(0, str(HERE.parent / "tests"))

if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.timing import Settings, compare  # noqa: E402
else:
    from .timing import Settings, compare

LAYOUTS = ("resnet18", "mobilenet_v3_small", "vit_b_16")


def random_batchnorm(model: Any, generator: Any) -> None:
    """Statistics and affine parameters of every ``BatchNorm2d`` drawn from `generator`, away
    from their initial values (so that folding and slicing them shows)."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                m.weight.copy_(torch.randn(n, generator=generator) * 0.5 + 1)
                m.bias.copy_(torch.randn(n, generator=generator) * 0.1)


def _model(name: str) -> tuple[Any, Any]:
    import torch
    import torchvision_layouts as L

    torch.manual_seed(0)
    model = getattr(L, name)(1000).eval()
    random_batchnorm(model, torch.Generator().manual_seed(1))
    head = {"resnet18": "fc", "mobilenet_v3_small": "classifier.3", "vit_b_16": "heads.head"}[name]
    return model, model.get_submodule(head)


def _torch_pruning(model: Any, x: Any, amount: float, head_name: str) -> Any:
    import torch
    import torch_pruning as tp

    heads = {m: m.num_heads for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)}
    pruner = tp.pruner.MetaPruner(
        model,
        x,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=amount,
        ignored_layers=[model.get_submodule(head_name)],
        num_heads=heads,
    )
    pruner.step()
    return model


def _kept(dense: dict, small: dict, group: Any) -> np.ndarray | None:
    """The channels of `group` a shrunk model kept, read off its 1-D members (None: not found)."""
    ones = [s for s in group.members if dense[s.param].ndim == 1 and s.offset == 0]
    if not ones:
        return None
    d = np.stack([dense[s.param] for s in ones], axis=1)
    q = np.stack([small[s.param] for s in ones], axis=1)
    where = {row.tobytes(): i for i, row in enumerate(d)}
    idx = [where.get(row.tobytes()) for row in q]
    if any(i is None for i in idx):
        return None
    return np.array(sorted(idx))


def _masked(dense: Any, groups: list, kept: list) -> Any:
    import torch

    masked = copy.deepcopy(dense)
    state = masked.state_dict()
    with torch.no_grad():
        for group, keep in zip(groups, kept, strict=True):
            gone = np.setdiff1d(np.arange(group.channels), keep)
            for s in group.members:
                state[s.param].index_fill_(s.axis, torch.as_tensor(gone + s.offset, dtype=torch.long), 0.0)
    return masked


def _cos(a: Any, b: Any) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _state(model: Any) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def bench_model(name: str, amounts: list[float], size: int, threads: int, rounds: int, log: Any) -> dict:
    import torch
    import torchvision_layouts as L

    import arrayprune.adapters.torch as prune

    dense, head = _model(name)
    head_name = next(n for n, m in dense.named_modules() if m is head)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(2))
    groups = [g for g in prune.channel_groups(dense, x) if g.shrinkable]
    left = [g for g in prune.channel_groups(dense, x) if not g.shrinkable]
    dense_state = _state(dense)
    with torch.inference_mode():
        y_dense = dense(x)
    out: dict[str, Any] = {
        "model": name,
        "groups": len(groups),
        "left": [f"{g.name} ({g.channels}): {g.reason}" for g in left],
        "dense": {"params": L.parameter_count(dense), "macs": L.macs(dense, x)},
        "rows": [],
    }
    for amount in amounts:
        log(f"{name} amount={amount}")
        ours = prune.shrink(copy.deepcopy(dense), x, amount)
        theirs = _torch_pruning(copy.deepcopy(dense), x, amount, head_name)
        ours_kept = [_kept(dense_state, _state(ours), g) for g in groups]
        their_kept = [_kept(dense_state, _state(theirs), g) for g in groups]
        floor = prune.shrink(copy.deepcopy(dense), x, amount, rounding="keep_floor")
        floor_kept = [_kept(dense_state, _state(floor), g) for g in groups]
        models = {"arrayprune": ours, "torch-pruning": theirs, "arrayprune keep_floor": floor}
        with torch.inference_mode():
            ys = {k: m(x) for k, m in models.items()}
        masked_cos: dict[str, float | None] = {}
        for k, kept in (("arrayprune", ours_kept), ("torch-pruning", their_kept), ("arrayprune keep_floor", floor_kept)):
            if all(kk is not None for kk in kept):
                with torch.inference_mode():
                    masked_cos[k] = _cos(ys[k], _masked(dense, groups, kept)(x))
            else:
                masked_cos[k] = None
        overlap = [
            len(np.intersect1d(a, b)) / max(len(a), 1)
            for a, b in zip(ours_kept, their_kept, strict=True)
            if a is not None and b is not None
        ]

        def forward(m: Any) -> Any:
            def run() -> None:
                with torch.inference_mode():
                    m(x)

            return run

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            latency = compare(
                {"dense": forward(dense), **{k: forward(m) for k, m in models.items()}},
                Settings(min_sample_s=0.05, repeats=rounds, min_repeats=5, max_bench_s=20.0),
            )
        finally:
            torch.set_num_threads(before)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shrink_time = compare(
                {
                    "arrayprune": (lambda: copy.deepcopy(dense), lambda m, a=amount: prune.shrink(m, x, a)),
                    "torch-pruning": (
                        lambda: copy.deepcopy(dense),
                        lambda m, a=amount: _torch_pruning(m, x, a, head_name),
                    ),
                },
                Settings(min_sample_s=0.0, repeats=5, min_repeats=3, max_bench_s=20.0),
            )
        row: dict[str, Any] = {"amount": amount, "overlap": float(np.mean(overlap)) if overlap else None, "models": {}}
        for k, m in models.items():
            row["models"][k] = {
                "params": L.parameter_count(m),
                "macs": L.macs(m, x),
                "latency_ms": latency[k].median * 1e3,
                "latency": latency[k].as_dict(),
                "cos_masked": masked_cos.get(k),
                "cos_dense": _cos(ys[k], y_dense),
                "shrink_s": shrink_time[k].median if k in shrink_time else None,
                "shrink": shrink_time[k].as_dict() if k in shrink_time else None,
            }
        row["dense_latency_ms"] = latency["dense"].median * 1e3
        row["dense_latency"] = latency["dense"].as_dict()
        out["rows"].append(row)
        log(
            "  "
            + "; ".join(
                f"{k}: {v['params']} params, {v['latency_ms']:.1f} ms, shrink {v['shrink_s'] or 0:.2f} s"
                for k, v in row["models"].items()
            )
        )
    return out


def _versions() -> str:
    import torch

    def v(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return (
        f"Python {platform.python_version()}, NumPy {np.__version__}, torch {torch.__version__}, "
        f"torch-pruning {v('torch-pruning')}, arrayprune {v('arrayprune')}"
    )


def _rev() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:  # noqa: BLE001 - no git: no revision shown
        return "?"


def _targets(results: list[dict]) -> list[str]:
    lines = []
    for res in results:
        for row in res["rows"]:
            a, t = row["models"]["arrayprune"], row["models"]["torch-pruning"]
            m = row["models"]["arrayprune keep_floor"]
            lines.append(
                f"- {res['model']} {row['amount']:.0%}: parameters {a['params'] / t['params']:.4f}x Torch-Pruning's "
                f"({'met' if a['params'] <= t['params'] else 'NOT met'}; keep_floor "
                f"{m['params'] / t['params']:.4f}x), latency {a['latency_ms'] / t['latency_ms']:.3f}x "
                f"({'met' if a['latency_ms'] <= 1.05 * t['latency_ms'] else 'NOT met'}; keep_floor "
                f"{m['latency_ms'] / t['latency_ms']:.3f}x; fastest samples "
                f"{a['latency']['min_s'] / t['latency']['min_s']:.3f}x), time to shrink {a['shrink_s'] / t['shrink_s']:.2f}x "
                f"({'met' if a['shrink_s'] <= t['shrink_s'] else 'NOT met'})"
            )
    return lines


def _f(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def write(results: list[dict], args: Any, out: Path, started: str, revision: str | None = None) -> None:
    revision = revision or _rev()
    lines = [
        "# Shrinking torch modules: arrayprune `prune.shrink` beside Torch-Pruning 1.6.1",
        "",
        f"- command: `python -m benchmarks.shrink_torch --models {args.models} --amounts {args.amounts} "
        f"--size {args.size} --threads {args.threads} --rounds {args.rounds}`",
        f"- date: {started} (UTC); revision {revision}",
        f"- versions: {_versions()}",
        f"- CPU: {platform.machine()}, {os.cpu_count()} cores (shared with other jobs); torch intra-op threads "
        f"{args.threads} for latency; load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        "- models: `tests/torchvision_layouts.py` (torchvision's names and sizes), random weights and BatchNorm "
        f"statistics, eval mode, one 1x3x{args.size}x{args.size} input",
        "- arrayprune: `prune.shrink(model, x, amount)` (each group loses `round(amount * channels)`, L2 over all "
        "its weight members); TP: `MetaPruner(..., GroupMagnitudeImportance(p=2), pruning_ratio=amount, "
        "ignored_layers=[classifier], num_heads=...)`, `step()` (keeps `int((1 - amount) * channels)`); "
        "`arrayprune keep_floor`: `prune.shrink(model, x, amount, rounding=\"keep_floor\")` (TP's rounding)",
        "- latency: medians of rounds running every model once in a rotating order (`benchmarks/timing.py`); "
        "cos masked: output cosine to the dense model with that tool's removed channels zeroed in every member "
        "of their group; cos dense: to the dense model (random weights, no fine-tuning); overlap: share of "
        "arrayprune's kept channels TP kept too; shrink: dense -> small, tracing included, medians",
        "",
        "## Targets",
        "",
        *_targets(results),
        "",
    ]
    for res in results:
        d = res["dense"]
        lines += [
            f"## {res['model']}",
            "",
            f"{res['groups']} groups shrink; dense: {d['params']:,} parameters, {d['macs']:,} MACs. Left:",
            "",
            *[f"- {s}" for s in res["left"][:8]],
            *([f"- ... and {len(res['left']) - 8} more"] if len(res["left"]) > 8 else []),
            "",
            "| amount | model | params | ratio | MACs | latency ms median (min) | vs TP | cos masked | cos dense "
            "| overlap | shrink s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in res["rows"]:
            tp_ms = row["models"]["torch-pruning"]["latency_ms"]
            lines.append(
                f"| {row['amount']:.0%} | dense | {d['params']:,} | 1 | {d['macs']:,} | "
                f"{row['dense_latency_ms']:.1f} | {row['dense_latency_ms'] / tp_ms:.3f} | | | | |"
            )
            for k, v in row["models"].items():
                lines.append(
                    f"| {row['amount']:.0%} | {k} | {v['params']:,} | {v['params'] / d['params']:.4f} | "
                    f"{v['macs']:,} | {v['latency_ms']:.1f} ({v['latency']['min_s'] * 1e3:.1f}) | "
                    f"{v['latency_ms'] / tp_ms:.3f} | "
                    f"{_f(v['cos_masked'], '.6f')} | {v['cos_dense']:.4f} | "
                    f"{_f(row['overlap'] if k == 'arrayprune' else None, '.3f')} | {_f(v['shrink_s'], '.2f')} |"
                )
        lines.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(out)
    tmp_json = out.with_suffix(".json.tmp")
    saved_args = {k: v for k, v in vars(args).items() if k not in ("rewrite", "revision")} | {"out": str(out)}
    saved = {"started": started, "revision": revision, "args": saved_args, "results": results}
    tmp_json.write_text(json.dumps(saved, indent=1))
    tmp_json.replace(out.with_suffix(".json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", default=",".join(LAYOUTS))
    p.add_argument("--amounts", default="0.3,0.5")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--rewrite", action="store_true", help="write the markdown again from the JSON beside --out")
    p.add_argument("--revision", help="with --rewrite: the revision the results were measured at")
    args = p.parse_args(argv)
    if args.rewrite:
        saved = json.loads(args.out.with_suffix(".json").read_text())
        revision = args.revision or saved.get("revision")
        write(saved["results"], argparse.Namespace(**saved["args"]), args.out, saved["started"], revision)
        return 0
    warnings.filterwarnings("ignore", module="torch_pruning")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    amounts = [float(a) for a in args.amounts.split(",")]
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name, amounts, args.size, args.threads, args.rounds, lambda s: print(s, flush=True)))
        write(results, args, args.out, started)  # partial results survive an interruption
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
