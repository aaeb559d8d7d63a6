"""Which decoder layers to remove: every choice measured, against the ones arrayprune makes.

    python -m benchmarks.layer_choice [--models llama,mixtral] [--counts 1,2] [--out DIR]

On the trained byte-level models of :mod:`benchmarks.llm_models` (cached), calibrated on
the first sequences of their training tokens as in :mod:`benchmarks.llm_structure`, every set of
`count` layers is removed with ``shrink_layers`` (scores forced to that set), refit into the
layer before (the default) and as it is (``--no-compensate``), and the held-out perplexity
of each result is measured (``arrayprune eval``). Beside the table, the sets arrayprune
chooses: from the dense model's ``1 - cos(input, output)`` per layer (``score_layers``,
what ``--no-compensate`` ranks by) and one at a time as they would be refit
(``choose_layers``, the default). Writes ``layer-choice-<machine>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from arrayprune.adapters.pipeline.layer_choice import choose_layers, score_layers
from arrayprune.adapters.pipeline.shrink_folder import UnitScores
from arrayprune.adapters.pipeline.shrink_structure import shrink_layers

from .llm_models import trained
from .llm_structure import CALIBRATION_ROWS, _machine


def perplexity(folder: Path, tokens: Path) -> float:
    """Held-out perplexity by ``arrayprune eval``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        argv = [sys.executable, "-m", "arrayprune", "eval", str(folder), "--tokens", str(tokens), "--json", str(out)]
        subprocess.run(argv, check=True, capture_output=True)
        return float(json.loads(out.read_text())["perplexity"])


def bench(name: str, counts: list[int], work: Path, log: Any = print) -> dict[str, Any]:
    model = trained(name, log=log)
    dense, held = model.model, model.heldout_tokens
    train = work / f"{name}-calibration.npz"  # as benchmarks.llm_structure calibrates
    np.savez(train, input_ids=np.load(model.train_tokens)["input_ids"][:CALIBRATION_ROWS])
    layers, dense_scores = score_layers(str(dense), str(train))
    result: dict[str, Any] = {
        "model": name, "dense": perplexity(dense, held), "dense_scores": dense_scores.tolist(), "rows": [],
        "chosen": {},
    }  # fmt: skip
    for count in counts:
        plain = sorted(int(i) for i in np.argsort(dense_scores, kind="stable")[:count])
        t = time.perf_counter()
        refit = choose_layers(str(dense), count, str(train))
        seconds = time.perf_counter() - t
        result["chosen"][count] = {
            "dense_scores": plain, "one_at_a_time": sorted(i for i, _ in refit.order),
            "order": refit.order, "choose_seconds": seconds,
        }  # fmt: skip
        for removed in itertools.combinations(range(layers.units), count):
            forced = np.ones(layers.units)
            forced[list(removed)] = 0.0
            row: dict[str, Any] = {"removed": list(removed)}
            for compensated in (True, False):
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "small"
                    scores = UnitScores("residual_change", layers, forced)
                    shrink_layers(str(dense), str(out), count, str(train), scores=scores, compensated=compensated)
                    row["refit" if compensated else "as_is"] = perplexity(out, held)
            log(f"{name} {removed}: refit {row['refit']:.3f}, as is {row['as_is']:.3f}")
            result["rows"].append(row)
    return result


def report(results: list[dict[str, Any]], argv: list[str]) -> str:
    lines = [
        f"# Which layers to remove: every choice against arrayprune's ({_machine()})",
        "",
        f"Command: `python -m benchmarks.layer_choice {' '.join(argv)}`".rstrip() + "; "
        + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) + ".",
        "",
        "Held-out perplexity per byte of the trained byte-level models of `benchmarks/llm_models.py` with each set "
        f"of layers removed, refit into the layer before (the default) or as they are (`--no-compensate`), on "
        f"{CALIBRATION_ROWS} calibration sequences as in `benchmarks/llm_structure.py`. "
        "**dense scores**: the set the dense model's `1 - cos(input, output)` per layer picks (what "
        "`--no-compensate` removes); **one at a time**: the set `choose_layers` picks (the default).",
        "",
    ]
    for r in results:
        lines += [f"## {r['model']} (dense perplexity {r['dense']:.3f})", ""]
        lines += ["| removed | refit | as is | chosen by |", "|---|---|---|---|"]
        for row in r["rows"]:
            removed = row["removed"]
            by = [label for key, label in (("dense_scores", "dense scores"), ("one_at_a_time", "one at a time"))
                  if r["chosen"][len(removed)][key] == removed]  # fmt: skip
            lines.append(f"| {', '.join(map(str, removed))} | {row['refit']:.3f} | {row['as_is']:.3f} | "
                         f"{', '.join(by)} |")  # fmt: skip
        for count, c in r["chosen"].items():
            order = ", ".join(f"{i} ({s:.4f})" for i, s in c["order"])
            lines.append(f"\n{count} removed: one at a time chose {order} in {c['choose_seconds']:.1f} s.")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.layer_choice", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,mixtral")
    parser.add_argument("--counts", default="1,2")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as work:
        results = [bench(name, counts, Path(work)) for name in args.models.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"layer-choice-{_machine()}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    stem.with_suffix(".md").write_text(report(results, sys.argv[1:] if argv is None else argv))
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
