"""Per-layer sparsity: uniform, global magnitude, a sensitivity scan's allocation and OWL, on two models.

* **digits MLP** (64-256-256-10, skl2onnx export, dense test accuracy 0.978), through the
  command line and :func:`arrayprune.adapters.prune_file`: ``arrayprune scan`` with each
  method (512 training images as calibration), then ``prune --amount A`` with one
  amount per layer (uniform), ``--global`` (one magnitude threshold; for Wanda, one
  threshold on Wanda's scores: ``--global --calibration``; for SparseGPT, global
  magnitude's per-layer counts), ``--allocation scan.json`` and ``--allocation owl``;
  test accuracy with onnxruntime.
* **MiniLM-L6** (all-MiniLM-L6-v2, its 36 encoder weights), through the Python API:
  :func:`arrayprune.adapters.scan.scan_arrays` with the NumPy forward of
  :mod:`benchmarks.minilm_quality` on 64 calibration sentences, then
  :func:`arrayprune.allocate_from_curves` and :func:`arrayprune.owl_allocation`; the
  mean cosine of the mean-pooled sentence embeddings of 200 other sentences to the
  dense model's. Magnitude and Wanda (input norms from PyTorch hooks on the same 64
  sentences); SparseGPT is left out here (its PyTorch path takes one amount for all
  layers).

Scans run to 98% (``--sparsities 0.1,...,0.9,0.95,0.98``): an allocation at 90% needs
curves beyond 90%, where the default scan stops.

Usage::

    pip install -e ".[test,all,bench]"
    python -m benchmarks.allocation_quality    # writes benchmarks/results/allocation.md and the scan plots
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

AMOUNTS = (0.7, 0.8, 0.9)
SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
MINILM_SPARSITIES = (0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
CALIBRATION_IMAGES = 512
ALLOCATIONS = ("uniform", "global", "scan", "owl")
#: Wanda's extra row: per-layer counts from the scan, ranked within each layer by Wanda's
#: scores over the whole layer (the mask family of the global row), not per output unit.
LAYER_WIDE = "scan, layer-wide scores"
#: The scan's allocation checked jointly on the calibration data (``--calibration --allocation``,
#: the default there): the scan's, uniform and global counts, then coordinate moves, measured
#: with every layer pruned at once; the least error wins.
CHECKED = "scan, checked jointly"
LAYER_WIDE_CHECKED = "scan, layer-wide scores, checked jointly"
ROWS = (*ALLOCATIONS, CHECKED, LAYER_WIDE, LAYER_WIDE_CHECKED)


def _cli(*args: object) -> str:
    cmd = [sys.executable, "-m", "arrayprune", *map(str, args)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def digits(folder: Path, out: Path) -> dict:
    """The digits MLP: scans through the command line, pruning through ``prune_file``, test accuracy."""
    from arrayprune.adapters import prune_file

    from .digits_accuracy import accuracy, digits_split, train_and_export

    path, x_test, y_test, dense = train_and_export(folder, hidden=(256, 256))
    calib = folder / "calib.npz"
    np.savez(calib, X=digits_split()[0][:CALIBRATION_IMAGES])
    sparsities = ",".join(f"{s:g}" for s in SPARSITIES)
    scans, seconds = {}, {}
    for method in ("l1_unstructured", "wanda", "sparsegpt"):
        scan = folder / f"scan-{method}.json"
        plot = ["--plot", out / "allocation-digits-scan.png"] if method == "l1_unstructured" else []
        t0 = time.perf_counter()
        _cli("scan", path, "--calibration", calib, "-o", scan, "--method", method, "--sparsities", sparsities,
             "--force", *plot)
        seconds[method] = time.perf_counter() - t0
        scans[method] = json.loads(scan.read_text())
    methods = {
        "magnitude": ({}, {"global_": True}, "l1_unstructured"),
        "Wanda": ({"method": "wanda", "calibration": calib}, {"global_": True, "calibration": calib}, "wanda"),
        "SparseGPT": (
            {"method": "sparsegpt", "calibration": calib},
            {"method": "sparsegpt", "calibration": calib, "global_": True},
            "sparsegpt",
        ),
    }
    results: dict[str, dict[str, dict[float, float]]] = {}
    shares: dict[str, dict[str, list[float]]] = {}
    checks: dict[str, dict[str, dict[float, dict]]] = {}
    pruned = folder / "pruned.onnx"
    for label, (base, global_, method) in methods.items():
        for amount in AMOUNTS:
            options = {
                "uniform": base,
                "global": global_,
                "scan": {**base, "allocation": folder / f"scan-{method}.json", "allocation_check": False},
                "owl": {**base, "allocation": "owl"},
            }
            if "calibration" in base:
                options[CHECKED] = {**base, "allocation": folder / f"scan-{method}.json"}
            if method == "wanda":
                wide = {"calibration": calib, "allocation": folder / "scan-wanda.json"}
                options[LAYER_WIDE] = {**wide, "allocation_check": False}
                options[LAYER_WIDE_CHECKED] = wide
            for how, opts in options.items():
                result = prune_file(path, pruned, amount=amount, force=True, **opts)
                results.setdefault(label, {}).setdefault(how, {})[amount] = accuracy(pruned, x_test, y_test)
                if result.allocation is not None and result.allocation.checked:
                    checks.setdefault(label, {}).setdefault(how, {})[amount] = {
                        "errors": result.allocation.checked,
                        "chosen": result.allocation.chosen,
                    }
                if amount == 0.9:
                    shares.setdefault(label, {})[how] = [
                        z / n for z, n in (result.written.by_tensor[t.name] for t in result.targets)
                    ]
    return {
        "dense": dense,
        "results": results,
        "shares": shares,
        "checks": checks,
        "scans": scans,
        "scan_seconds": seconds,
    }


def minilm(folder: Path, out: Path) -> dict:
    """MiniLM-L6 through the Python API: scans with the NumPy forward, allocations, embedding cosine."""
    import torch
    from safetensors.numpy import load_file
    from transformers import BertConfig, BertModel

    import arrayprune as ap
    from arrayprune.adapters.plots import plot_scan
    from arrayprune.adapters.scan import scan_arrays
    from arrayprune.adapters.torch.calibration import input_norms

    from .minilm_quality import check_modules, cosines, encode, extract, load_sentences, tokenize
    from .sparsegpt_quality import CALIBRATION_SENTENCES

    extract(folder)
    check_modules(folder)
    config = json.loads((folder / "config.json").read_text())
    original = load_file(str(folder / "model.safetensors"))
    sentences = load_sentences()
    if set(sentences) & set(CALIBRATION_SENTENCES):
        raise RuntimeError("calibration sentences among the evaluation ones")
    batches = tokenize(folder, sentences)
    base = encode(original, config, batches)
    calib_batches = tokenize(folder, list(CALIBRATION_SENTENCES))
    targets = [k for k in original if k.startswith("encoder.") and k.endswith(".weight") and "LayerNorm" not in k]
    weights = {k: original[k] for k in targets}
    sizes = [weights[k].size for k in targets]
    rows = [weights[k].shape[0] for k in targets]  # Wanda prunes each output unit (row of [out, in])

    torch.set_num_threads(2)
    bert = BertModel(BertConfig.from_pretrained(str(folder)), add_pooling_layer=True).eval()
    bert.load_state_dict({k: torch.from_numpy(v) for k, v in original.items()}, strict=False)
    torch_batches = [
        {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        for ids, mask, _ in tokenize(folder, list(CALIBRATION_SENTENCES), batch=1)
    ]
    with torch.no_grad():
        norms = {k: v.numpy() for k, v in input_norms(bert, torch_batches, modules=targets).items()}
    scores = {k: np.asarray(ap.wanda_scores(weights[k], norms[k], reduction_axis=1)) for k in targets}

    def forward(w: dict) -> np.ndarray:
        return encode({**original, **w}, config, calib_batches)

    t0 = time.perf_counter()
    scan_l1 = scan_arrays(weights, forward, sparsities=MINILM_SPARSITIES)
    seconds = {"magnitude": time.perf_counter() - t0}
    t0 = time.perf_counter()
    scan_wanda = scan_arrays(weights, forward, method="wanda", sparsities=MINILM_SPARSITIES, input_norms=norms)
    seconds["Wanda"] = time.perf_counter() - t0
    scan_l1.model = "MiniLM-L6 (NumPy forward, 64 sentences)"
    plot_scan(scan_l1, out / "allocation-minilm-scan.png")

    def cosine(new: dict) -> float:
        return float(cosines(encode({**original, **new}, config, batches), base).mean())

    def magnitude(counts: list[int]) -> dict:
        return {
            k: weights[k] * ap.L1Unstructured(int(c)).compute_mask(weights[k], None)
            for k, c in zip(targets, counts, strict=True)
        }

    def wanda(per_row: list[int | float]) -> dict:
        return {
            k: weights[k] * ap.Wanda(a, dim=0).compute_mask(scores[k], None) for k, a in zip(targets, per_row, strict=True)
        }

    results: dict[str, dict[str, dict[float, float]]] = {"magnitude": {}, "Wanda": {}}
    shares: dict[str, dict[str, list[float]]] = {"magnitude": {}, "Wanda": {}}
    for amount in AMOUNTS:
        curves_l1 = [list(scan_l1.curve(k).errors) for k in targets]
        curves_w = [list(scan_wanda.curve(k).errors) for k in targets]
        global_l1 = ap.global_unstructured(weights, ap.L1Unstructured, amount=amount)
        global_w = ap.global_unstructured(weights, ap.L1Unstructured, scores, amount=amount)
        counts = {
            "magnitude": {
                "uniform": [round(amount * n) for n in sizes],
                "global": [int(np.size(global_l1[k]) - np.count_nonzero(global_l1[k])) for k in targets],
                "scan": ap.allocate_from_curves(curves_l1, sizes, amount, sparsities=MINILM_SPARSITIES),
                "owl": ap.owl_allocation([np.abs(weights[k]) for k in targets], amount),
            },
            "Wanda": {
                "scan": ap.allocate_from_curves(curves_w, sizes, amount, sparsities=MINILM_SPARSITIES, steps=rows),
                "owl": ap.owl_allocation([scores[k] for k in targets], amount, steps=rows),
            },
        }
        for how, c in counts["magnitude"].items():
            results["magnitude"].setdefault(how, {})[amount] = cosine(magnitude(c))
            if amount == 0.9:
                shares["magnitude"][how] = [k / n for k, n in zip(c, sizes, strict=True)]
        results["Wanda"].setdefault("uniform", {})[amount] = cosine(wanda([amount] * len(targets)))
        results["Wanda"].setdefault("global", {})[amount] = cosine({k: weights[k] * global_w[k] for k in targets})
        wide = ap.allocate_from_curves(curves_w, sizes, amount, sparsities=MINILM_SPARSITIES)
        results["Wanda"].setdefault(LAYER_WIDE, {})[amount] = cosine(
            {k: weights[k] * ap.L1Unstructured(int(c)).compute_mask(scores[k], None) for k, c in zip(targets, wide, strict=True)}
        )
        for how in ("scan", "owl"):
            c = counts["Wanda"][how]
            results["Wanda"].setdefault(how, {})[amount] = cosine(wanda([k // r for k, r in zip(c, rows, strict=True)]))
            if amount == 0.9:
                shares["Wanda"][how] = [k / n for k, n in zip(c, sizes, strict=True)]
    return {
        "results": results,
        "shares": shares,
        "targets": targets,
        "scan": scan_l1.to_dict(),
        "scan_seconds": seconds,
        "sentences": len(sentences),
    }


def _judged(rows: dict[str, dict[float, float]]) -> list[str]:
    """The scan rows the target is judged on: those checked jointly where they exist (the default with
    calibration data), else the scan's own; Wanda's per-unit and layer-wide masks, the better of the two."""
    checked = [h for h in (CHECKED, LAYER_WIDE_CHECKED) if h in rows]
    return checked or [h for h in ("scan", LAYER_WIDE) if h in rows]


def _best_verdict(rows: dict[str, dict[float, float]], amount: float) -> tuple[str, bool]:
    best = max(rows["uniform"][amount], rows["global"][amount])
    row = max(_judged(rows), key=lambda h: rows[h][amount])
    ours = rows[row][amount]
    return f"{row} {ours:.3f} vs {best:.3f}", ours >= best - 1e-9


def _kept_minilm(out: Path) -> tuple[list[str], list[str]] | None:
    """The MiniLM-L6 section and verdicts of the report in `out`, for a run of the digits part alone."""
    try:
        old = (out / "allocation.md").read_text().splitlines()
    except OSError:
        return None
    if "## MiniLM-L6, mean embedding cosine to the dense model" not in old:
        return None
    start = old.index("## MiniLM-L6, mean embedding cosine to the dense model")
    end = old.index("## Verdict") if "## Verdict" in old else len(old)
    when = next((line for line in old if line.startswith("(20")), "(an earlier run)").split(",")[0].lstrip("(")
    section = [line for line in old[start:end] if not line.startswith("Not rerun:")]
    if section[1:3] == ["", ""]:
        del section[1]
    section[1:1] = ["", f"Not rerun: these rows are those of the run of {when} (`--parts minilm` reruns them)."]
    while section and not section[-1].strip():
        section.pop()
    verdicts = [line[2:] for line in old[end:] if line.startswith("* MiniLM-L6")]
    return section, verdicts


def report(d: dict | None, mini: dict | None, seconds: float, argv: list[str], out: Path | None = None) -> str:
    lines = [
        "# Per-layer sparsity: uniform, global, a scan's allocation, OWL",
        "",
        f"`python -m benchmarks.allocation_quality {' '.join(argv)}`".replace("  ", " ").replace(" `", "`"),
        f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cores shared with other jobs, load average {_load_average()}, {seconds:.0f} s in all)",
        "",
        "Allocations: **uniform**, one amount per layer; **global**, one threshold over all layers (magnitudes;",
        "for Wanda its scores `|W| * ||X||`; for SparseGPT, global magnitude's per-layer counts, then SparseGPT);",
        "**scan**, `--allocation scan.json` (each layer's count from the scan's curves made with the same method,",
        "least summed predicted error); **owl**, `--allocation owl` (Yin et al. 2024, M = 5, lambda = 0.08;",
        "outliers among Wanda's scores for Wanda and SparseGPT, among magnitudes for magnitude). Wanda prunes",
        "each output unit alike (uniform, scan, owl); its global row ranks the scores over all layers at once,",
        f"so a fourth Wanda row, **{LAYER_WIDE}**, ranks them over each layer (`--calibration --allocation`,",
        "no `--method wanda`) with the scan's per-layer counts: the same kind of mask as the global row.",
        f"**{CHECKED}** (and **{LAYER_WIDE_CHECKED}**): the same request with the calibration data",
        "checking the allocation jointly, the default of `--allocation scan.json --calibration` (the other scan",
        "rows pass `--no-allocation-check`): the scan's counts, uniform and global (clipped to the bounds, the",
        "total repaired) and coordinate moves from the best of them are measured with every layer pruned at once",
        "(the scan's output error on the calibration data), and the least error is used. Magnitude has no such",
        "row: `--calibration` would rank its entries by Wanda's scores.",
        "",
        "Target: the scan allocation at least matches the best of uniform and global at 80% and 90%.",
    ]
    verdicts = []
    if d is not None:
        lines += [
            "",
            f"## Digits MLP (64-256-256-10), test accuracy (dense {d['dense']:.3f})",
            "",
            f"Through the command line (`arrayprune scan ... --sparsities {','.join(f'{s:g}' for s in SPARSITIES)}`,"
            f" {CALIBRATION_IMAGES} training images) and `prune_file` (`allocation=`).",
            "",
            "| method | allocation | " + " | ".join(f"{int(100 * a)}%" for a in AMOUNTS) + " |",
            "|---|---|" + "---|" * len(AMOUNTS),
        ]
        for method, rows in d["results"].items():
            for how in [h for h in ROWS if h in rows]:
                best = {a: max(r[a] for r in rows.values()) for a in AMOUNTS}
                cells = [
                    f"**{rows[how][a]:.3f}**" if rows[how][a] == best[a] else f"{rows[how][a]:.3f}" for a in AMOUNTS
                ]
                lines.append(f"| {method} | {how} | " + " | ".join(cells) + " |")
            for a in (0.8, 0.9):
                text, ok = _best_verdict(rows, a)
                verdicts.append(f"digits, {method}, {int(100 * a)}%: {text} (best of uniform and global): "
                                f"{'met' if ok else 'MISSED'}")
        names = [c["name"] for c in d["scans"]["l1_unstructured"]["curves"]]
        lines += ["", "Each layer's sparsity at 90% (" + ", ".join(names) + "):", ""]
        lines += ["| method | " + " | ".join(ALLOCATIONS) + " |", "|---|" + "---|" * len(ALLOCATIONS)]
        for method, by in d["shares"].items():
            lines.append(
                f"| {method} | " + " | ".join(" / ".join(f"{100 * s:.1f}" for s in by[h]) for h in ALLOCATIONS) + " |"
            )
        extra = [(m, h, by[h]) for m, by in d["shares"].items() for h in by if h not in ALLOCATIONS]
        if extra:
            lines += ["", "The other scan rows at 90%:", "", "| method | row | sparsities |", "|---|---|---|"]
            lines += [f"| {m} | {h} | " + " / ".join(f"{100 * x:.1f}" for x in share) + " |" for m, h, share in extra]
        lines += ["", "The joint checks (calibration output error of each candidate, the one chosen in bold; no refined"
                  " figure where no coordinate move lowered the error):", ""]
        lines += ["| method | row | amount | scan | uniform | global | refined | chosen |", "|---|---|---|---|---|---|---|---|"]
        for method, by_row in d.get("checks", {}).items():
            for how, by_amount in by_row.items():
                for a, c in by_amount.items():
                    cells = []
                    for cand in ("scan", "uniform", "global", "refined"):
                        e = c["errors"].get(cand)
                        text = "" if e is None else f"{e:.3g}"
                        cells.append(f"**{text}**" if cand == c["chosen"] else text)
                    lines.append(f"| {method} | {how} | {int(100 * a)}% | " + " | ".join(cells) + f" | {c['chosen']} |")
        scan_time = ", ".join(f"{m} {s:.1f} s" for m, s in d["scan_seconds"].items())
        lines += ["", f"Scan time (command line, fresh process each): {scan_time}.", "",
                  "![digits scan](allocation-digits-scan.png)"]
    kept = _kept_minilm(out) if mini is None and d is not None and out is not None else None
    if kept is not None:
        section, old_verdicts = kept
        lines += ["", *section]
        verdicts += old_verdicts
    if mini is not None:
        lines += [
            "",
            "## MiniLM-L6, mean embedding cosine to the dense model",
            "",
            f"{len(mini['targets'])} encoder weights, {mini['sentences']} evaluation sentences, 64 calibration"
            f" sentences; scans at {', '.join(f'{s:g}' for s in MINILM_SPARSITIES)} through `scan_arrays` with the"
            " NumPy forward.",
            "",
            "| method | allocation | " + " | ".join(f"{int(100 * a)}%" for a in AMOUNTS) + " |",
            "|---|---|" + "---|" * len(AMOUNTS),
        ]
        for method, rows in mini["results"].items():
            for how in [h for h in ROWS if h in rows]:
                best = {a: max(r[a] for r in rows.values()) for a in AMOUNTS}
                cells = [
                    f"**{rows[how][a]:.3f}**" if rows[how][a] == best[a] else f"{rows[how][a]:.3f}" for a in AMOUNTS
                ]
                lines.append(f"| {method} | {how} | " + " | ".join(cells) + " |")
            for a in (0.8, 0.9):
                text, ok = _best_verdict(rows, a)
                scan = "scan (the better of its two rows)" if LAYER_WIDE in rows else "scan"
                verdicts.append(f"MiniLM-L6, {method}, {int(100 * a)}%: {scan} {text} (best of uniform and global): "
                                f"{'met' if ok else 'MISSED'}")
        lines += ["", "Sparsity at 90% by layer type (mean over the 6 layers), magnitude:", ""]
        kinds = ("query", "key", "value", "attention.output", "intermediate", "output.dense")
        lines += ["| allocation | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
        for how, share in mini["shares"]["magnitude"].items():
            cells = []
            for kind in kinds:
                picked = [s for t, s in zip(mini["targets"], share, strict=True) if _kind(t) == kind]
                cells.append(f"{100 * np.mean(picked):.1f}")
            lines.append(f"| {how} | " + " | ".join(cells) + " |")
        scan_time = ", ".join(f"{m} {s:.0f} s" for m, s in mini["scan_seconds"].items())
        lines += ["", f"Scan time (NumPy forward, in process): {scan_time}.", "",
                  "![MiniLM scan](allocation-minilm-scan.png)"]
    lines += [
        "",
        "## Verdict",
        "",
        f"Judged on the scan rows a user gets by default: **{CHECKED}** where calibration data are given",
        f"(Wanda: the better of it and **{LAYER_WIDE_CHECKED}**, whose masks are of the global row's kind),",
        "the scan's own allocation otherwise (magnitude; MiniLM-L6, through the Python API).",
        "",
    ] + [f"* {v}" for v in verdicts] + [""]
    return "\n".join(lines)


def _kind(name: str) -> str:
    for kind in ("query", "key", "value", "attention.output", "intermediate"):
        if kind in name:
            return kind
    return "output.dense"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.allocation_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the report and plots")
    parser.add_argument(
        "--parts",
        default="all",
        help="comma-separated: digits, minilm (default: all); without minilm, the MiniLM-L6 rows of the report "
        "already in --out are kept",
    )
    args = parser.parse_args(argv)
    parts = {"digits", "minilm"} if args.parts == "all" else set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    d = mini = None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "digits" in parts:
            d = digits(folder, out)
            print(json.dumps(d["results"], indent=1))
        if "minilm" in parts:
            (folder / "minilm").mkdir()
            mini = minilm(folder / "minilm", out)
            print(json.dumps(mini["results"], indent=1))
    text = report(d, mini, time.perf_counter() - start, list(argv or sys.argv[1:]), out)
    print(text)
    (out / "allocation.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
