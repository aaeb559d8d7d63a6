"""Structured pruning of trained language models: held-out perplexity and latency against the dense model.

::

    python -m benchmarks.llm_structure [--models llama,mixtral] [--kinds channels,heads,layers,experts]
        [--amounts 0.25,0.5] [--methods a,b,c,d] [--command NAME=TEMPLATE ...] [--out benchmarks/results]

For each model of :mod:`benchmarks.llm_models` (trained and cached on first use), each kind
of unit and each amount (the fraction of the units of that kind removed: MLP channels,
attention heads / KV groups, decoder layers, experts per layer), every method writes a
pruned Hugging Face folder, which is measured against the dense one:

* held-out **perplexity** (and KL to the dense model, cosine of the final hidden states)
  by :func:`arrayprune.adapters.pipeline.evaluate.evaluate` (``arrayprune eval``), on
  the model's ``heldout.npz`` (files of the standard library it never saw);
* **latency**: ``transformers`` forward of the loaded model (float32, ``torch.no_grad``)
  on 4 held-out sequences of 128 tokens, one thread, dense and pruned alternating in one process,
  medians (:func:`benchmarks.timing.compare`); the ratio pruned / dense;
* **parameters removed**: the fraction of the dense model's parameters (all of them,
  embeddings included) that the output no longer has.

Methods (a name, a label, and a command template or an in-process function):

* ``a``: weight-norm selection, today's ``arrayprune prune DENSE -o OUT --shrink --groups
  KIND --method ln_structured --amount A`` (no calibration, no compensation);
* ``b``, ``c``: calibrated importance (the OBS score of a removed unit on the model's
  ``train.npz``), without and with compensation of the consumers:
  ``--method obs_structured --calibration train.npz [--no-compensate]``; any method can be
  given or replaced with ``--command NAME="arrayprune prune {dense} -o {out} --shrink
  --groups {kind} --method M --calibration {calibration} --amount {amount}"``
  (placeholders: ``dense``, ``out``, ``kind``, ``amount``, ``calibration``: the first 32
  sequences of the model's ``train.npz``);
* ``d``: Torch-Pruning 1.6.1's retraining-free LLM pruning (``MetaPruner``,
  ``GroupMagnitudeImportance(p=2)``, one ratio per layer, ``lm_head`` left) on the model
  loaded by ``from_pretrained``, removing the same number of units as ``a`` did (so the
  same parameter count), written with ``save_pretrained`` and its ``config.json`` sizes
  updated. For MLP channels the other layers are left out of its groups (``ignored_layers``);
  for heads, grouping a ``q_proj``'s output channels did not finish (its index mappings
  loop, minutes on the 3M-parameter Llama), so ``d`` runs channels only and says so.

A method that refuses (a kind it does not have yet, a family it does not know) is a row
with its one-line reason. Writes ``llm-structure-<machine>.md``, ``.json`` and ``.png``
(perplexity against parameters removed; matplotlib) to ``--out``; ``--replot JSON``
draws the PNG of a saved run again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from arrayprune.adapters.formats.sharded import open_checkpoint
from arrayprune.adapters.pipeline.evaluate import evaluate

from . import llm_models
from .timing import Settings, compare

KINDS = ("channels", "heads", "layers", "experts")
LATENCY_ROWS = 4
CALIBRATION_ROWS = 32  # sequences of 128 tokens the calibrated methods see


@dataclass
class Method:
    """A pruning method of the benchmark: a shell command template or a function ``(dense, out, kind, amount, ref)``."""

    name: str
    label: str
    command: str | None = None
    run: Callable[..., str | None] | None = None
    note: str = ""


def _a_command() -> str:
    return "arrayprune prune {dense} -o {out} --shrink --groups {kind} --method ln_structured --amount {amount}"


def _calibrated(compensate: bool) -> str:
    return (
        "arrayprune prune {dense} -o {out} --shrink --groups {kind} --method obs_structured "
        "--calibration {calibration} --amount {amount}" + ("" if compensate else " --no-compensate")
    )


# -- Torch-Pruning (d) ---------------------------------------------------------------------


def torch_pruning_channels(dense: Path, out: Path, kind: str, amount: float, reference: Path | None) -> str | None:
    """Torch-Pruning 1.6.1 on the loaded model: as many MLP channels per layer as `reference` (a's output) removed.

    Returns None when done, else why it does not run (one line).
    """
    import torch
    import transformers

    try:
        import torch_pruning as tp
    except ImportError:
        return "torch-pruning is not installed (pip install torch-pruning==1.6.1)"
    if kind == "heads":
        return (
            "with num_heads, Torch-Pruning 1.6.1 does not finish grouping a q_proj's output channels "
            "(get_pruning_group loops in _fix_dependency_graph_non_recursive for minutes; transformers 5 Llama): "
            "run for MLP channels only"
        )
    if kind != "channels":
        return f"Torch-Pruning's LLM recipe removes channels and heads, not {kind}"
    model = transformers.AutoModelForCausalLM.from_pretrained(dense).eval()
    config = model.config
    if not hasattr(model.model.layers[0].mlp, "gate_proj"):
        return "no gate_proj/up_proj/down_proj MLP (experts): Torch-Pruning's recipe prunes dense MLPs"
    target = json.loads((reference / "config.json").read_text())["intermediate_size"] if reference else None
    inner = config.intermediate_size
    removed = inner - target if target is not None else round(amount * inner)
    ignored: list[Any] = [model.lm_head]
    for layer in model.model.layers:  # only the MLP's inner channels are pruned, as the other methods do
        attn = layer.self_attn
        ignored += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp.down_proj]
    torch.manual_seed(0)
    example = torch.randint(0, config.vocab_size, (1, 16))
    pruner = tp.pruner.MetaPruner(
        model,
        example_inputs=example,
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False,
        pruning_ratio=removed / inner,
        ignored_layers=ignored,
        output_transform=lambda output: output.logits,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    sizes = {layer.mlp.gate_proj.out_features for layer in model.model.layers}
    if len(sizes) != 1:
        return f"Torch-Pruning left layers of different sizes {sorted(sizes)}: config.json cannot say it"
    config.intermediate_size = sizes.pop()
    model.save_pretrained(out, max_shard_size="4MB")
    return None


def methods(extra: dict[str, str]) -> dict[str, Method]:
    table = {
        "a": Method("a", "(a) weight norm, `--shrink` (`ln_structured`)", command=_a_command()),
        "b": Method("b", "(b) calibrated (`obs_structured --no-compensate`)", command=_calibrated(False)),
        "c": Method("c", "(c) calibrated + compensation (`obs_structured`)", command=_calibrated(True)),
        "d": Method("d", "(d) Torch-Pruning 1.6.1 (`MetaPruner`, group L2 norm)", run=torch_pruning_channels),
    }
    for name, template in extra.items():
        old = table.get(name)
        table[name] = Method(name, old.label if old else name, command=template)
    return table


# -- measuring -----------------------------------------------------------------------------


def parameters(folder: Path) -> int:
    return sum(int(np.prod(t.shape)) for t in open_checkpoint(folder).tensors.values())


def latency(dense: Path, pruned: Path, tokens: Path) -> dict[str, float]:
    """Median forward time of both models on the same batch, alternating; and the ratio."""
    import torch
    import transformers

    ids = torch.from_numpy(np.load(tokens)["input_ids"][:LATENCY_ROWS])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: steadier on a shared machine
    models = {
        "dense": transformers.AutoModelForCausalLM.from_pretrained(dense).eval(),
        "pruned": transformers.AutoModelForCausalLM.from_pretrained(pruned).eval(),
    }

    def forward(model: Any) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False).logits

        return run

    timings = compare({k: forward(m) for k, m in models.items()}, Settings(min_sample_s=0.05, repeats=7, max_bench_s=2.0))
    torch.set_num_threads(threads)
    dense_s, pruned_s = timings["dense"].median, timings["pruned"].median
    return {"dense_ms": 1e3 * dense_s, "pruned_ms": 1e3 * pruned_s, "ratio": pruned_s / dense_s}


@dataclass
class Row:
    model: str
    kind: str
    amount: float
    method: str
    status: str = "ok"
    removed: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def _run_command(template: str, values: dict[str, Any]) -> str | None:
    argv = [a.format(**values) for a in shlex.split(template)]
    if argv[0] == "arrayprune":
        argv = [sys.executable, "-m", "arrayprune", *argv[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {proc.returncode}"
    return None


def bench_model(name: str, kinds: list[str], amounts: list[float], table: dict[str, Method], work: Path,
                log: Callable[[str], None], steps: int | None = None) -> tuple[dict[str, Any], list[Row]]:  # fmt: skip
    model = llm_models.trained(name, steps=steps, log=log)
    dense = model.model
    base = evaluate(dense, model.heldout_tokens)
    dense_params = parameters(dense)
    log(f"{name}: dense {base.summary()}")
    calibration = work / f"{name}-calibration.npz"  # the first CALIBRATION_ROWS sequences of train.npz
    np.savez(calibration, input_ids=np.load(model.train_tokens)["input_ids"][:CALIBRATION_ROWS])
    info = {"model": name, "parameters": dense_params, "perplexity": base.perplexity, "loss": base.loss,
            "tokens": base.tokens, "folder": str(dense), "calibration_sequences": CALIBRATION_ROWS}  # fmt: skip
    rows = []
    for kind in kinds:
        for amount in amounts:
            reference = None
            for method in table.values():
                row = Row(name, kind, amount, method.name)
                rows.append(row)
                out = work / f"{name}-{kind}-{amount}-{method.name}"
                shutil.rmtree(out, ignore_errors=True)
                start = time.perf_counter()
                if method.command is not None:
                    values = {"dense": dense, "out": out, "kind": kind, "amount": amount,
                              "calibration": calibration}  # fmt: skip
                    refused = _run_command(method.command, values)
                elif method.run is not None:
                    try:
                        refused = method.run(dense, out, kind, amount, reference)
                    except Exception as exc:  # a peer's failure is a result, shown as one line
                        refused = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                else:
                    refused = method.note or "no command"
                row.figures["prune_s"] = time.perf_counter() - start
                if refused is not None:
                    row.status = refused
                    log(f"  {kind} {amount} {method.name}: {refused}")
                    continue
                if method.name == "a":
                    reference = out
                row.removed = 1 - parameters(out) / dense_params
                try:
                    got = evaluate(out, model.heldout_tokens, compare=dense)
                    row.figures.update(
                        perplexity=got.perplexity, kl_to_dense=got.kl_to_dense, cosine_to_dense=got.cosine_to_dense,
                        **latency(dense, out, model.heldout_tokens),
                    )
                except (ValueError, RuntimeError) as exc:  # written, but transformers cannot run it
                    row.status = f"written ({100 * row.removed:.1f}% removed), not loadable: {str(exc).splitlines()[0]}"
                    log(f"  {kind} {amount} {method.name}: {row.status}")
                    continue
                log(f"  {kind} {amount} {method.name}: removed {100 * row.removed:.1f}% of parameters, "
                    f"perplexity {got.perplexity:.3f}, latency x{row.figures['ratio']:.2f}")  # fmt: skip
    return info, rows


def report(models: list[dict[str, Any]], rows: list[Row], table: dict[str, Method], argv: list[str]) -> str:
    import torch
    import transformers

    import arrayprune

    lines = [
        f"# Structured pruning of trained language models ({_machine()})",
        "",
        f"Command: `{' '.join(['python -m benchmarks.llm_structure', *argv])}`",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python {platform.python_version()}, "
        f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
        f"arrayprune {arrayprune.__version__}; load average {', '.join(f'{v:.1f}' for v in os.getloadavg())} "
        "(a shared machine: latency ratios are alternating medians, still noisy).",
        "",
        "Models (`python -m benchmarks.llm_models`): byte-level, trained on the standard library's sources; "
        "held-out perplexity per byte on files they never saw.",
        "",
        "| model | parameters | held-out perplexity |",
        "|---|---|---|",
        *[f"| {m['model']} | {m['parameters'] / 1e6:.2f}M | {m['perplexity']:.3f} |" for m in models],
        "",
        "Amount: the fraction of the units of that kind removed (per layer); parameters removed: of the whole "
        "model. Latency: pruned / dense forward time, 4 x 128 tokens, one thread, medians of alternating runs.",
        "",
        "| model | units | amount | method | parameters removed | perplexity | KL to dense | cosine | latency | "
        "dense ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        label = table[r.method].label
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.kind} | {r.amount:g} | {label} | not run: {r.status} | | | | | |")
            continue
        f = r.figures
        lines.append(
            f"| {r.model} | {r.kind} | {r.amount:g} | {label} | {100 * (r.removed or 0):.1f}% | "
            f"{f['perplexity']:.3f} | {f['kl_to_dense']:.4f} | {f['cosine_to_dense']:.4f} | "
            f"x{f['ratio']:.2f} | {f['dense_ms']:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


def plot(models: list[dict[str, Any]], rows: list[dict[str, Any]], labels: dict[str, str], path: Path) -> bool:
    """Held-out perplexity against the fraction of parameters removed: one line per model, units and method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    dense = {m["model"]: m["perplexity"] for m in models}
    lines: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r["status"] == "ok":
            lines.setdefault((r["model"], r["kind"], r["method"]), []).append((100 * r["removed"], r["figures"]["perplexity"]))
    colours = plt.get_cmap("tab20").colors
    for i, ((model, kind, method), points) in enumerate(sorted(lines.items())):
        xs, ys = zip(*sorted([(0.0, dense[model]), *points]), strict=True)
        style = "--" if method == "d" else "-"
        ax.plot(xs, ys, style, marker="o", color=colours[i % len(colours)], label=f"{model}, {kind}: {labels.get(method, method)}")
    for value in dense.values():
        ax.axhline(value, color="grey", lw=0.5)
    ax.set_xlabel("parameters removed (% of the model)")
    ax.set_ylabel("held-out perplexity (per byte)")
    ax.set_title("Structured pruning of the trained byte-level models")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _machine() -> str:
    return f"cpu-{platform.machine()}-{os.cpu_count()}cores"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,mixtral")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--amounts", default="0.25,0.5")
    parser.add_argument("--methods", default="a,b,c,d")
    parser.add_argument("--command", action="append", default=[], metavar="NAME=TEMPLATE")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--steps", type=int, default=None, help="train the models this long (a smoke test)")
    parser.add_argument("--replot", type=Path, default=None, metavar="JSON", help="only draw the PNG of a run's JSON")
    args = parser.parse_args(argv)
    labels = {k: m.label.replace("`", "") for k, m in methods({}).items()}
    if args.replot is not None:
        saved = json.loads(args.replot.read_text())
        plot(saved["models"], saved["rows"], labels, args.replot.with_suffix(".png"))
        return 0
    extra = dict(c.split("=", 1) for c in args.command)
    table = {k: v for k, v in methods(extra).items() if k in args.methods.split(",") or k in extra}
    amounts = [float(a) for a in args.amounts.split(",")]
    infos, rows = [], []
    with tempfile.TemporaryDirectory(prefix="llm-structure-") as work:
        for name in args.models.split(","):
            info, got = bench_model(name, args.kinds.split(","), amounts, table, Path(work), print, args.steps)
            infos.append(info)
            rows.extend(got)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"llm-structure-{_machine()}"
    stem.with_suffix(".md").write_text(report(infos, rows, table, argv))
    stem.with_suffix(".json").write_text(json.dumps(
        {"command": ["python", "-m", "benchmarks.llm_structure", *argv], "models": infos,
         "rows": [r.__dict__ for r in rows]}, indent=2, default=str) + "\n")  # fmt: skip
    plot(infos, [r.__dict__ for r in rows], labels, stem.with_suffix(".png"))
    print(f"-> {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
