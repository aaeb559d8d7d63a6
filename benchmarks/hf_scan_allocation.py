"""Held-out perplexity of a small trained language model pruned with a Hugging Face scan's allocation.

``python -m benchmarks.hf_scan_allocation [--cache DIR] [--out FILE]``

Takes the byte-level Mistral-style model of :mod:`benchmarks.structured_quality` (trained
once and cached in ``--cache``, the same default folder), scans its folder with
``arrayprune scan FOLDER --calibration calibration.npz``
(:func:`arrayprune.adapters.pipeline.hf_scan.scan_hf`, magnitude, layer by layer), then
prunes it by magnitude (``l1_unstructured``) at several amounts with each weight's share
from the scan (``--allocation scan.json``), uniform, global, and OWL, and reports the
held-out perplexity of each and the scan's time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

from benchmarks.structured_quality import perplexity, train


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800, help="training steps, when the model is not cached")
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "arrayprune-structured-quality"))
    p.add_argument("--amounts", default="0.5,0.6,0.7")
    p.add_argument("--out", default=None, help="write the table (markdown) here")
    args = p.parse_args(argv)

    import torch

    from arrayprune.adapters import prune_file
    from arrayprune.adapters.formats import sharded
    from arrayprune.adapters.pipeline.hf_scan import scan_hf

    torch.set_num_threads(2)
    dense = os.path.join(args.cache, "dense")
    if not os.path.isdir(dense):
        os.makedirs(args.cache, exist_ok=True)
        train(args.cache, args.steps)
    cal, held = os.path.join(args.cache, "calibration.npz"), os.path.join(args.cache, "held_out.npz")
    base, _ = perplexity(dense, held)
    rows = [("dense", "-", base)]
    with tempfile.TemporaryDirectory() as tmp:
        scan_path, out = os.path.join(tmp, "scan.json"), os.path.join(tmp, "pruned")
        start = time.perf_counter()
        result = scan_hf(sharded.open_checkpoint(dense), dense, cal)
        scanned = time.perf_counter() - start
        result.save(scan_path)
        for amount in (float(a) for a in args.amounts.split(",")):
            for label, options in (
                ("uniform", {}),
                ("global", {"global_": True}),
                ("OWL", {"allocation": "owl", "calibration": cal}),
                ("scan", {"allocation": scan_path}),
                ("scan, max 0.9", {"allocation": scan_path, "max_sparsity": 0.9}),
            ):
                shutil.rmtree(out, ignore_errors=True)
                prune_file(dense, out, amount=amount, method="l1_unstructured", **options)
                rows.append((label, f"{amount:g}", perplexity(out, held)[0]))
    lines = [
        "# Magnitude pruning of a small trained Mistral-style model with a Hugging Face scan's allocation",
        "",
        f"`python -m benchmarks.hf_scan_allocation --amounts {args.amounts}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, torch {torch.__version__}. The model and data "
        "of `benchmarks.structured_quality` (byte-level, 4 layers, hidden 128, trained on the standard library's "
        f"sources; 64 held-out sequences of 96 bytes). Scan: {len(result.curves)} weights x "
        f"{len(result.sparsities)} sparsities on {result.samples} calibration sequences, {scanned:.1f} s. "
        "`l1_unstructured` over the layer weights, each weight's share uniform, global, OWL's, or the scan's "
        "(`--allocation scan.json`, optionally `--max-sparsity 0.9`).",
        "",
        "| allocation | amount | perplexity |",
        "|---|---|---|",
    ]
    lines += [f"| {label} | {amount} | {ppl:.3f} |" for label, amount, ppl in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
