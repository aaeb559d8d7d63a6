"""Structured pruning of trained language models: held-out perplexity and latency against the dense model.

::

    python -m benchmarks.llm_structure [--models llama,mixtral] [--kinds channels,heads,layers,experts]
        [--targets 0.25,0.5] [--methods a,b,c,d] [--command NAME=TEMPLATE ...] [--tp-timeout S]
        [--out benchmarks/results]

For each model of :mod:`benchmarks.llm_models` (trained and cached on first use), each kind
of unit (MLP channels, attention KV groups, decoder layers, experts) and each **target
fraction of the model's parameters** removed, the harness computes from ``config.json``
and the checkpoint's tensor shapes how many parameters one unit holds, and picks the count
of units (per layer for channels, KV groups and experts; of the model for layers) whose
parameters removed come closest to the target. Counts the command refuses (``--dry-run``
first: a head count ``transformers`` cannot describe, fewer experts than
``num_experts_per_tok``) are never chosen; where no count reaches a target (heads alone),
the largest reachable point is run and the table says so. Every method writes a pruned
Hugging Face folder, which is measured against the dense one:

* held-out **perplexity** (and KL to the dense model, cosine of the final hidden states)
  by :func:`arrayprune.adapters.pipeline.evaluate.evaluate` (``arrayprune eval``), on
  the model's ``heldout.npz`` (files of the standard library it never saw);
* **latency**: ``transformers`` forward of the loaded model (float32, ``torch.no_grad``)
  on 4 held-out sequences of 128 tokens, one thread, dense and pruned alternating in one
  process, medians (:func:`benchmarks.timing.compare`); the ratio pruned / dense, with the
  1-minute load average when it was measured;
* **parameters removed**: the fraction of the dense model's parameters (all of them,
  embeddings included) that the output no longer has (measured on the output).

Methods (a name, a label, and per kind a command template, an in-process function, or
the reason it does not apply):

* ``a``: weight-norm selection, ``arrayprune prune DENSE -o OUT --shrink --groups KIND
  --method ln_structured --amount N`` (no calibration, no compensation); for experts the
  same command without ``--calibration`` ranks experts by their weights' L2 norm; layers
  have no weight-only ranking in the command (``--groups layers`` needs calibration data),
  so ``a`` does not apply to layers;
* ``b``: calibrated importance: for channels and heads the OBS score of a removed unit on
  the model's ``train.npz`` without compensation (``--method obs_structured --calibration
  CAL --no-compensate``); for layers and experts their own calibrated score
  (``--groups layers|experts --calibration CAL``: a layer's residual-stream change, an
  expert's routing weight; layers with ``--no-compensate``);
* ``c``: ``b`` with the compensation (``--method obs_structured --calibration CAL``: the
  layer reading removed channels or heads refit; layers: each run of removed layers refit
  into the layer before it, the command's default); removed experts have no refit, so
  ``c`` does not apply to experts;
* ``d``: Torch-Pruning 1.6.1's retraining-free LLM pruning (``MetaPruner``,
  ``GroupMagnitudeImportance(p=2)``, one ratio per layer, ``lm_head`` left) on the model
  loaded by ``from_pretrained``, the same count of units, written with ``save_pretrained``
  and its ``config.json`` sizes updated; run in a subprocess with a timeout
  (``--tp-timeout``, default 90 s): on the heads of transformers 5 Llama and Mixtral its
  dependency graph does not finish, and the row says where it was (the innermost
  Torch-Pruning frames, from :mod:`faulthandler`). Its LLM recipe removes channels and
  heads, not layers or experts.

Any method can be given or replaced for channels and heads with ``--command
NAME="arrayprune prune {dense} -o {out} --shrink --groups {kind} --method M --calibration
{calibration} --amount {amount}"`` (placeholders: ``dense``, ``out``, ``kind``,
``amount``: the count of units, ``calibration``: the first 32 sequences of the model's
``train.npz``). A kind the model does not have (experts of a Llama, dense MLP channels of
a Mixtral) is one row with the command's refusal. Writes ``llm-structure-<machine>.md``,
``.json`` and ``.png`` (perplexity against parameters removed, one panel per model and
kind of unit, one line per method; matplotlib) to ``--out``; ``--replot JSON`` draws the
PNG of a saved run again.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import re
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
TP_TIMEOUT = 90.0  # seconds a Torch-Pruning subprocess may run
REACH = 0.025  # a target is unreachable when the largest count falls this far short of it

_PRUNE = "arrayprune prune {dense} -o {out} --shrink --groups {kind} --amount {amount}"
_NO_LAYER_NORM = (
    "not applicable: the command ranks layers on calibration data only (--groups layers needs --calibration); "
    "it has no weight-norm ranking of layers"
)
_NO_REFIT = "not applicable: the command refits the consumers of removed channels and heads; removed {kind} have none"
_TP_KINDS = "not applicable: Torch-Pruning's LLM recipe removes channels and heads, not {kind}"


@dataclass
class Method:
    """A method of the benchmark: per kind a command template, or a function ``(dense, out, kind, count)``.

    ``commands`` maps a kind to a template; ``skip`` maps a kind to why the method does not
    apply to it; ``run`` serves the kinds neither names.
    """

    name: str
    label: str
    commands: dict[str, str] = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)
    run: Callable[..., str | None] | None = None


def methods(extra: dict[str, str]) -> dict[str, Method]:
    """The methods a, b, c, d; `extra` (name -> template) replaces or adds one for channels and heads."""
    norm = _PRUNE + " --method ln_structured"
    obs = _PRUNE + " --method obs_structured --calibration {calibration}"
    own = _PRUNE + " --calibration {calibration}"  # layers and experts: their own calibrated score
    table = {
        "a": Method("a", "(a) weight norm (`ln_structured`)",
                    commands={"channels": norm, "heads": norm, "experts": norm}, skip={"layers": _NO_LAYER_NORM}),
        "b": Method("b", "(b) calibrated (`obs_structured --no-compensate`; layers, experts: own score)",
                    commands={"channels": obs + " --no-compensate", "heads": obs + " --no-compensate",
                              "layers": own + " --no-compensate", "experts": own}),
        "c": Method("c", "(c) calibrated + compensation (`obs_structured`; layers: refit, chosen one by one)",
                    commands={"channels": obs, "heads": obs, "layers": own},
                    skip={"experts": _NO_REFIT.format(kind="experts")}),
        "d": Method("d", "(d) Torch-Pruning 1.6.1 (`MetaPruner`, group L2 norm)", run=torch_pruning,
                    skip={k: _TP_KINDS.format(kind=k) for k in ("layers", "experts")}),
    }  # fmt: skip
    for name, template in extra.items():
        old = table.get(name)
        table[name] = Method(
            name, old.label if old else name, commands={"channels": template, "heads": template},
            skip=old.skip if old else {k: "no command given for this kind" for k in ("layers", "experts")},
        )  # fmt: skip
    return table


# -- how many units make a target fraction of the parameters ------------------------------


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def parameters(folder: Path) -> int:
    return sum(int(np.prod(t.shape)) for t in open_checkpoint(folder).tensors.values())


def unit_parameters(folder: Path, kind: str) -> tuple[int, int]:
    """Parameters one unit of `kind` holds over the whole model, and how many units there are (per layer, or layers).

    Channels: a row of ``gate_proj`` and ``up_proj`` and a column of ``down_proj`` in every
    layer; heads: one KV group (its query heads' rows of ``q_proj`` and columns of
    ``o_proj``, its rows of ``k_proj`` and ``v_proj``, biases too) in every layer; experts:
    one expert's three matrices and its router row in every MoE layer; layers: the mean
    size of a decoder layer's tensors.
    """
    config = _config(folder)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    if kind == "layers":
        sizes = [0] * layers
        for name, t in open_checkpoint(folder).tensors.items():
            found = re.match(r"model\.layers\.(\d+)\.", name)
            if found:
                sizes[int(found.group(1))] += int(np.prod(t.shape))
        return round(sum(sizes) / layers), layers
    if kind == "channels":
        bias = 2 + 1 / hidden if config.get("mlp_bias") else 0  # gate, up biases per channel
        return round(layers * hidden * (3 + bias)), config["intermediate_size"]
    if kind == "heads":
        heads, groups = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
        head_dim = config.get("head_dim") or hidden // heads
        per_group = heads // groups  # query heads sharing a KV head
        size = head_dim * hidden * (2 * per_group + 2)
        if config.get("attention_bias"):
            size += head_dim * (per_group + 2)
        return layers * size, groups
    if kind == "experts":
        experts = config.get("num_local_experts") or config.get("num_experts") or 0
        inner = config.get("moe_intermediate_size") or config["intermediate_size"]
        return layers * (3 * hidden * inner + hidden), experts
    raise ValueError(f"unknown kind of unit {kind!r}")


def _probe(dense: Path, kind: str, count: int) -> str | None:
    """Whether ``--shrink --groups KIND --amount COUNT`` is accepted (``--dry-run``): None, else the refusal."""
    if kind == "layers":
        return None  # every count below the model's layers; the dry run would need calibration
    return _run_command(_PRUNE.replace("-o {out}", "--dry-run") + " --method ln_structured",
                        {"dense": dense, "kind": kind, "amount": count})  # fmt: skip


@dataclass
class Point:
    """A count of units to remove, the targets it serves and what the table says about it."""

    count: int
    targets: list[float]
    expected: float  # fraction of the parameters, from the config
    note: str = ""


def points(dense: Path, kind: str, targets: list[float], log: Callable[[str], None]) -> tuple[list[Point], str | None]:
    """The counts of `kind` that come closest to each target (merged when equal), or why the kind does not apply."""
    if kind in ("channels", "experts"):  # does the model have them at all
        refused = _probe(dense, kind, 1)
        if refused is not None:
            return [], refused
    size, units = unit_parameters(dense, kind)
    total = parameters(dense)
    lowest = 1
    if kind == "experts":
        lowest = _config(dense).get("num_experts_per_tok") or 1  # experts kept
    candidates = list(range(1, units - (lowest if kind == "experts" else 1) + 1))
    why = f"no count of {kind} can be removed"
    if kind == "heads":  # only the counts transformers can describe
        valid = []
        for n in candidates:
            refused = _probe(dense, kind, n)
            log(f"  heads: removing {n} of {units} KV groups: {'accepted' if refused is None else refused}")
            if refused is None:
                valid.append(n)
            else:
                why = refused
        candidates = valid
    if not candidates:
        return [], why
    chosen: list[Point] = []
    for target in targets:
        n = min(candidates, key=lambda c: (abs(c * size / total - target), c))
        if chosen and chosen[-1].count == n:
            chosen[-1].targets.append(target)
        else:
            chosen.append(Point(n, [target], n * size / total))
    for point in chosen:
        short = [t for t in point.targets if point.expected < t - REACH]
        if point.count == max(candidates) and short:
            point.note = (f"{'/'.join(f'{100 * t:g}%' for t in short)} unreachable by {kind} alone: the largest count "
                          f"the command accepts ({point.count} of {units}) removes {100 * point.expected:.1f}%")  # fmt: skip
    return chosen, None


# -- Torch-Pruning (d) --------------------------------------------------------------------


def torch_pruning(dense: Path, out: Path, kind: str, count: int, timeout: float = TP_TIMEOUT) -> str | None:
    """Torch-Pruning 1.6.1 in a subprocess (:func:`_tp_worker`) with a timeout; None when done, else why not."""
    argv = [sys.executable, "-m", "benchmarks.llm_structure", "--tp-worker", str(dense), str(out), kind, str(count),
            "--tp-timeout", str(timeout)]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30,
                              cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout + 30:g} s (killed)"
    if "Timeout (" in proc.stderr:  # faulthandler's dump: where Torch-Pruning was
        frames = re.findall(r'torch_pruning/([\w/]+\.py)", line (\d+) in (\w+)', proc.stderr)
        calls = [f"{fn} ({path.rsplit('/', 1)[-1]}:{line})" for path, line, fn in frames]  # innermost first
        where = " > ".join(reversed(calls[:5])) or "code outside Torch-Pruning"
        return f"did not finish in {timeout:g} s; it was in {where}"
    lines = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if line.startswith("refused: ")]
    if lines:
        return lines[-1].removeprefix("refused: ")
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        return errors[-1] if errors else f"exit status {proc.returncode}"
    return None


def _tp_prune(dense: Path, out: Path, kind: str, count: int) -> str | None:
    """Torch-Pruning 1.6.1 on the loaded model: `count` MLP channels or KV groups per layer; None, else why not."""
    import torch
    import transformers

    try:
        import torch_pruning as tp
    except ImportError:
        return "torch-pruning is not installed (pip install torch-pruning==1.6.1)"
    if kind not in ("channels", "heads"):
        return _TP_KINDS.format(kind=kind)
    model = transformers.AutoModelForCausalLM.from_pretrained(dense).eval()
    config = model.config
    layers = model.model.layers
    if not hasattr(layers[0].mlp, "gate_proj"):
        if kind == "channels":
            return "no gate_proj/up_proj/down_proj MLP (experts): Torch-Pruning's recipe prunes dense MLPs"
    ignored: list[Any] = [model.lm_head]
    options: dict[str, Any] = {}
    if kind == "channels":  # only the MLP's inner channels, as the other methods do
        inner = config.intermediate_size
        options["pruning_ratio"] = count / inner
        for layer in layers:
            attn = layer.self_attn
            ignored += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp.down_proj]
    else:  # whole heads, the recipe of its examples/LLMs (num_heads for q, k, v; GQA aware)
        groups = config.num_key_value_heads
        num_heads: dict[Any, int] = {}
        for layer in layers:
            attn = layer.self_attn
            num_heads[attn.q_proj] = config.num_attention_heads
            num_heads[attn.k_proj] = num_heads[attn.v_proj] = groups
            ignored.append(layer.mlp)
        options.update(pruning_ratio=0.0, num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
                       head_pruning_ratio=count / groups)  # fmt: skip
    torch.manual_seed(0)
    pruner = tp.pruner.MetaPruner(
        model,
        example_inputs=torch.randint(0, config.vocab_size, (1, 16)),
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False,
        ignored_layers=ignored,
        output_transform=lambda output: output.logits,
        **options,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    if kind == "channels":
        sizes = {layer.mlp.gate_proj.out_features for layer in layers}
        if sizes != {config.intermediate_size - count}:
            return f"Torch-Pruning left MLP sizes {sorted(sizes)}, not {config.intermediate_size - count}"
        config.intermediate_size = sizes.pop()
    else:
        head_dim = config.head_dim
        q = {layer.self_attn.q_proj.out_features // head_dim for layer in layers}
        kv = {layer.self_attn.k_proj.out_features // head_dim for layer in layers}
        if len(q) != 1 or len(kv) != 1:
            return f"Torch-Pruning left layers with different head counts {sorted(q)} / {sorted(kv)}"
        config.num_attention_heads, config.num_key_value_heads = q.pop(), kv.pop()
    model.save_pretrained(out, max_shard_size="4MB")
    return None


def _tp_worker(argv: list[str], timeout: float) -> int:
    dense, out, kind, count = Path(argv[0]), Path(argv[1]), argv[2], int(argv[3])
    faulthandler.dump_traceback_later(timeout, exit=True)  # a hang ends with the stack, read by the parent
    refused = _tp_prune(dense, out, kind, count)
    faulthandler.cancel_dump_traceback_later()
    if refused is not None:
        print(f"refused: {refused}")
    return 0


# -- measuring ----------------------------------------------------------------------------


def latency(dense: Path, pruned: Path, tokens: Path) -> dict[str, float]:
    """Median forward time of both models on the same batch, alternating; the ratio and the load average."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars in the log
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

    load = os.getloadavg()[0]
    timings = compare({k: forward(m) for k, m in models.items()}, Settings(min_sample_s=0.05, repeats=7, max_bench_s=2.0))
    torch.set_num_threads(threads)
    dense_s, pruned_s = timings["dense"].median, timings["pruned"].median
    return {"dense_ms": 1e3 * dense_s, "pruned_ms": 1e3 * pruned_s, "ratio": pruned_s / dense_s,
            "load": max(load, os.getloadavg()[0])}  # fmt: skip


@dataclass
class Row:
    model: str
    kind: str
    targets: list[float]
    count: int | None
    units: int | None
    method: str
    status: str = "ok"
    removed: float | None = None
    expected: float | None = None
    note: str = ""
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


def _measure(row: Row, method: Method, dense: Path, out: Path, values: dict[str, Any], tp_timeout: float) -> str | None:
    kind = row.kind
    if kind in method.skip:
        return method.skip[kind]
    if kind in method.commands:
        return _run_command(method.commands[kind], values)
    if method.run is not None:
        return method.run(dense, out, kind, row.count, tp_timeout)
    return "no command for this kind"


def bench_model(name: str, kinds: list[str], targets: list[float], table: dict[str, Method], work: Path,
                log: Callable[[str], None], steps: int | None = None,
                tp_timeout: float = TP_TIMEOUT) -> tuple[dict[str, Any], list[Row]]:  # fmt: skip
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
        chosen, refused = points(dense, kind, targets, log)
        if refused is not None:
            rows.append(Row(name, kind, targets, None, None, "-", status=f"not applicable: {refused}"))
            log(f"  {kind}: {refused}")
            continue
        units = unit_parameters(dense, kind)[1]
        for point in chosen:
            for method in table.values():
                row = Row(name, kind, point.targets, point.count, units, method.name, expected=point.expected,
                          note=point.note)  # fmt: skip
                rows.append(row)
                out = work / f"{name}-{kind}-{point.count}-{method.name}"
                shutil.rmtree(out, ignore_errors=True)
                values = {"dense": dense, "out": out, "kind": kind, "amount": point.count, "calibration": calibration}
                start = time.perf_counter()
                try:
                    refused = _measure(row, method, dense, out, values, tp_timeout)
                except Exception as exc:  # a peer's failure is a result, shown as one line
                    refused = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                row.figures["prune_s"] = time.perf_counter() - start
                if refused is not None:
                    row.status = refused
                    log(f"  {kind} {point.count} {method.name}: {refused}")
                    continue
                row.removed = 1 - parameters(out) / dense_params
                try:
                    got = evaluate(out, model.heldout_tokens, compare=dense)
                    row.figures.update(
                        perplexity=got.perplexity, kl_to_dense=got.kl_to_dense, cosine_to_dense=got.cosine_to_dense,
                        **latency(dense, out, model.heldout_tokens),
                    )
                except (ValueError, RuntimeError) as exc:  # written, but transformers cannot run it
                    row.status = f"written ({100 * row.removed:.1f}% removed), not loadable: {str(exc).splitlines()[0]}"
                    log(f"  {kind} {point.count} {method.name}: {row.status}")
                    continue
                log(f"  {kind} {point.count} {method.name}: removed {100 * row.removed:.1f}% of parameters, "
                    f"perplexity {got.perplexity:.3f}, latency x{row.figures['ratio']:.2f}")  # fmt: skip
                shutil.rmtree(out, ignore_errors=True)
    return info, rows


# -- report -------------------------------------------------------------------------------

_UNIT_NAMES = {"channels": "MLP channels per layer", "heads": "KV groups per layer", "layers": "layers",
               "experts": "experts per layer"}  # fmt: skip


def _targets(r: dict[str, Any]) -> str:
    return "/".join(f"{100 * t:g}%" for t in r["targets"])


def checks(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, point by point: (c) better than (a), (c) at least (d), latency at 25% <= 0.8x."""
    by: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            by.setdefault((r["model"], r["kind"], r["count"]), {})[r["method"]] = r
    lines = []
    for (model, kind, count), got in by.items():
        ppl = {m: r["figures"]["perplexity"] for m, r in got.items()}
        where = f"{model}, {count} {_UNIT_NAMES[kind]} removed ({100 * next(iter(got.values()))['removed']:.1f}%)"
        if "c" in ppl and "a" in ppl:
            lines.append(f"- {where}: (c) {ppl['c']:.3f} vs (a) {ppl['a']:.3f}: "
                         f"{'met' if ppl['c'] < ppl['a'] else 'NOT met'}")  # fmt: skip
        if "c" in ppl and "d" in ppl:
            lines.append(f"- {where}: (c) {ppl['c']:.3f} vs (d) {ppl['d']:.3f}: "
                         f"{'met' if ppl['c'] <= ppl['d'] else 'NOT met'}")  # fmt: skip
        if 0.25 in next(iter(got.values()))["targets"]:
            best = min(got, key=lambda m: ppl[m])
            ratio = got[best]["figures"]["ratio"]
            lines.append(f"- {where}: latency of the best method ({best}) x{ratio:.2f}: "
                         f"{'met' if ratio <= 0.8 else 'NOT met'} (<= 0.8x dense at the 25% target)")  # fmt: skip
    return lines


def report(models: list[dict[str, Any]], rows: list[Row], table: dict[str, Method], argv: list[str]) -> str:
    import torch
    import transformers

    import arrayprune

    loads = [r.figures["load"] for r in rows if "load" in r.figures]
    lines = [
        f"# Structured pruning of trained language models ({_machine()})",
        "",
        f"Command: `{' '.join(['python -m benchmarks.llm_structure', *argv])}`",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python {platform.python_version()}, "
        f"PyTorch {torch.__version__}, transformers {transformers.__version__}, arrayprune {arrayprune.__version__}; "
        + (f"1-minute load average during the latency runs {min(loads):.1f} to {max(loads):.1f} " if loads else "")
        + "(a shared machine of 2 cores: latency ratios are medians of alternating runs, still noisy).",
        "",
        "Models (`python -m benchmarks.llm_models`): byte-level, trained on the standard library's sources; "
        "held-out perplexity per byte on files they never saw.",
        "",
        "| model | parameters | held-out perplexity |",
        "|---|---|---|",
        *[f"| {m['model']} | {m['parameters'] / 1e6:.2f}M | {m['perplexity']:.3f} |" for m in models],
        "",
        "Target: the fraction of the model's parameters (embeddings included) to remove; the count of units is "
        "the one whose parameters (from config.json) come closest. Parameters removed: measured on the output. "
        "Latency: pruned / dense transformers forward, 4 x 128 tokens, one thread, medians of alternating runs; "
        "load: the 1-minute load average then.",
        "",
        "| model | units | target | removed units | method | parameters removed | perplexity | KL to dense | "
        "cosine | latency | dense ms | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    notes = []
    for r in rows:
        if r.method == "-":
            lines.append(f"| {r.model} | {r.kind} | | | all | {r.status} | | | | | | |")
            continue
        label = table[r.method].label
        target = "/".join(f"{100 * t:g}%" for t in r.targets) + (" *" if r.note else "")
        if r.note and f"{r.model} {r.kind}: {r.note}" not in notes:
            notes.append(f"{r.model} {r.kind}: {r.note}")
        units = f"{r.count} of {r.units} {_UNIT_NAMES[r.kind]}"
        if r.status != "ok":
            status = r.status if r.status.startswith("not applicable") else f"not run: {r.status}"
            lines.append(f"| {r.model} | {r.kind} | {target} | {units} | {label} | {status} | | | | | | |")
            continue
        f = r.figures
        lines.append(
            f"| {r.model} | {r.kind} | {target} | {units} | {label} | {100 * (r.removed or 0):.1f}% | "
            f"{f['perplexity']:.3f} | {f['kl_to_dense']:.4f} | {f['cosine_to_dense']:.4f} | "
            f"x{f['ratio']:.2f} | {f['dense_ms']:.1f} | {f['load']:.1f} |"
        )
    lines += ["", *[f"\\* {n}." for n in notes], ""]
    lines += ["## Targets of issue 33, point by point (computed)", "", *checks([r.__dict__ for r in rows]), ""]
    return "\n".join(lines)


def plot(models: list[dict[str, Any]], rows: list[dict[str, Any]], labels: dict[str, str], path: Path) -> bool:
    """Held-out perplexity against the fraction of parameters removed: a panel per model and kind, a line per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    dense = {m["model"]: m["perplexity"] for m in models}
    panels: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        if r["status"] == "ok":
            lines = panels.setdefault((r["model"], r["kind"]), {})
            lines.setdefault(r["method"], []).append((100 * r["removed"], r["figures"]["perplexity"]))
    if not panels:
        return False
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows), squeeze=False)
    colours = {"a": "tab:blue", "b": "tab:orange", "c": "tab:green", "d": "tab:red"}
    for ax, ((model, kind), lines) in zip(axes.flat, panels.items(), strict=False):
        for method, pts in sorted(lines.items()):
            xs, ys = zip(*sorted([(0.0, dense[model]), *pts]), strict=True)
            ax.plot(xs, ys, "--" if method == "d" else "-", marker="o", color=colours.get(method),
                    label=labels.get(method, method))  # fmt: skip
        ax.axhline(dense[model], color="grey", lw=0.5)
        ax.set_title(f"{model}: {kind}", fontsize=10)
        ax.set_xlabel("parameters removed (% of the model)")
        ax.set_ylabel("held-out perplexity (per byte)")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Structured pruning of the trained byte-level models")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _machine() -> str:
    return f"cpu-{platform.machine()}-{os.cpu_count()}cores"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,mixtral")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--targets", default="0.25,0.5", help="fractions of the model's parameters to remove")
    parser.add_argument("--methods", default="a,b,c,d")
    parser.add_argument("--command", action="append", default=[], metavar="NAME=TEMPLATE")
    parser.add_argument("--tp-timeout", type=float, default=TP_TIMEOUT, help="seconds Torch-Pruning may run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--steps", type=int, default=None, help="train the models this long (a smoke test)")
    parser.add_argument("--replot", type=Path, default=None, metavar="JSON", help="only draw the PNG of a run's JSON")
    parser.add_argument("--tp-worker", nargs=4, default=None, metavar=("DENSE", "OUT", "KIND", "COUNT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.tp_worker is not None:
        return _tp_worker(args.tp_worker, args.tp_timeout)
    labels = {k: m.label.replace("`", "") for k, m in methods({}).items()}
    if args.replot is not None:
        saved = json.loads(args.replot.read_text())
        plot(saved["models"], saved["rows"], labels, args.replot.with_suffix(".png"))
        return 0
    extra = dict(c.split("=", 1) for c in args.command)
    table = {k: v for k, v in methods(extra).items() if k in args.methods.split(",") or k in extra}
    targets = [float(a) for a in args.targets.split(",")]
    infos, rows = [], []
    with tempfile.TemporaryDirectory(prefix="llm-structure-") as work:
        for name in args.models.split(","):
            info, got = bench_model(name, args.kinds.split(","), targets, table, Path(work), print, args.steps,
                                    args.tp_timeout)  # fmt: skip
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
