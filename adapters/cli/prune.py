"""``arrayprune prune``: the flags as a request, the pipeline run, its result printed.

Everything else (formats, plan, scores, pruning, writing, verifying) is the pipeline's:
:func:`arrayprune.adapters.pipeline.run`, which :func:`arrayprune.adapters.prune_file`
runs from Python.
"""

from __future__ import annotations

import argparse
import dataclasses

from arrayprune.adapters.formats.sharded import INDEX_SUFFIX
from arrayprune.adapters.pipeline import Hooks, PruneResult, run
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.runner import nm_warnings
from arrayprune.adapters.pipeline.verify_stage import evaluation_failed
from arrayprune.adapters.plan import format_plan

from .errors import _error, _warn
from .tensors import _progress, _stage

__all__ = ["run_prune", "spec_of"]

#: The pipeline's stage announcements and progress bars, on a terminal only.
HOOKS = Hooks(stage=_stage, progress=_progress)


def spec_of(args: argparse.Namespace) -> PruneSpec:
    """The request of the parsed ``prune`` options (every field of :class:`PruneSpec` is a flag's)."""
    return PruneSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PruneSpec)})


def run_prune(args: argparse.Namespace) -> int:
    """Run ``arrayprune prune``; the exit status (1 if ``--verify`` fails)."""
    result = run(args.input, args.output, spec_of(args), HOOKS)
    if result.shrink is not None:
        _print_shrink(result)
    elif result.written is None:
        _print_plan(result)
    else:
        _print_pruned(result)
    if result.allocation is not None:
        print(f"allocation ({result.allocation.source}):")
        print(result.allocation.describe())
    for note in result.notes:
        _warn(note, "note")
    for warning in result.warnings:
        _warn(warning)
    if result.written is not None and result.shards:
        _print_files(result)
    if result.verify is not None:
        return _print_verify(result)
    if result.evaluation is not None:
        print(f"verify: {result.evaluation.summary()}")
        if evaluation_failed(result.evaluation):
            _error(f"{result.dst}: verify failed: perplexity or KL to {result.src} is not finite")
            return 1
    return 0


def _print_plan(result: PruneResult) -> None:
    spec = result.spec
    print(f"plan for {result.src} ({result.kind}), {spec.method}; nothing is written (--dry-run)")
    print(format_plan(result.plan, amount=not spec.plan_only))


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole if whole else 0.0:.2f}%"


def _print_pruned(result: PruneResult) -> None:
    """What was pruned (zeros, entries) and the whole output (zeros, entries, tensors)."""
    spec, pruned, whole = result.spec, result.written.pruned, result.written.whole
    detail = f"amount {spec.amount}" if spec.amount is not None else f"{spec.nm[0]}:{spec.nm[1]}"
    partial = len(nm_warnings(spec, result.targets))
    detail += f"; {partial} of them cannot hold it, see the warnings" if partial else ""
    how = f"{spec.method}{', global' if spec.global_ else ''}, {detail}"
    how += f", allocation {spec.allocation}" if spec.allocation else ""
    names = f"{len(result.targets)} tensors" + (f" (and {result.tied} tied names)" if result.tied else "")
    print(
        f"pruned {names} of {result.src} ({how}): {pruned.zeros} of {pruned.size} entries zero "
        f"({_pct(pruned.zeros, pruned.size)}) -> {result.dst}"
    )
    print(
        f"whole file: {whole.zeros} of {whole.size} entries zero ({_pct(whole.zeros, whole.size)}) "
        f"in {whole.tensors} tensors"
    )


def _print_shrink(result: PruneResult) -> None:
    """The groups (dry run), or the parameters before and after and the channels kept per group."""
    spec, shrink = result.spec, result.shrink
    amount = ("" if spec.amount is None else f", amount {spec.amount}") + (", global" if spec.global_ else "")
    kind = getattr(shrink.groups, "kind", "channels")
    method = shrink.score or spec.method  # layers and experts: their own score, not --method
    if result.written is None:
        what = "channel groups" if kind in ("channels", "heads") else kind
        print(f"{what} of {result.src} ({result.kind}), {method}{amount}; nothing is written (--dry-run)")
        print(shrink.describe() or "no layer whose output channels could be removed")
        return
    before, after, n = shrink.params_before, shrink.params_after, len(shrink.kept)
    what = f"{n} channel group{'s' if n > 1 else ''}" if kind in ("channels", "heads") else f"the {kind}"
    print(
        f"shrunk {what} of {result.src} ({method}{amount}): "
        f"{before} -> {after} parameters ({_pct(after, before)}) -> {result.dst}"
    )
    for g in shrink.groups.groups:
        unit = getattr(g, "unit", "channels")
        print(f"group {g.group.name}: {g.group.channels} -> {len(shrink.kept[g.group.name])} {unit} kept")
    if shrink.groups.left:
        n = len(shrink.groups.left)
        print(f"left as they are: the channels of {n} producer{'s' if n > 1 else ''} (--dry-run --shrink says why)")


def _count(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _print_files(result: PruneResult) -> None:
    """What a sharded checkpoint's output holds."""
    written = result.written
    if written.files == [result.dst]:
        print(f"wrote one safetensors file holding the tensors of {result.shards} shards; other files not copied")
        return
    indexed = any(f.endswith(INDEX_SUFFIX) for f in written.files)  # a folder of one safetensors file has none
    parts = [_count(result.shards, "shard" if indexed else "weights file")]
    if result.copied:
        parts.append(f"{_count(result.copied, 'other file')} copied")
    last = ", the index last" if indexed else ""
    print(f"wrote {_count(len(written.files), 'file')} to {result.dst}: {', '.join(parts)}{last}")
    if written.left:
        print(f"not copied: {'; '.join(written.left)}")


def _print_verify(result: PruneResult) -> int:
    """Each compared output's difference; 0 if every float output is within tolerance, else 1."""
    if result.verify_sizes:
        sizes = ", ".join(f"{k}={v}" for k, v in result.verify_sizes.items())
        print(f"verify: random inputs, symbolic dimensions {sizes}")
    skipped = [c.name for c in result.verify if c.difference is None]
    for c in result.verify:
        if c.difference is not None:
            verdict = "pass" if c.passed else "FAIL"
            print(
                f"verify: output {c.name!r}: max abs output difference {c.difference:.6g}, "
                f"tolerance {c.tolerance:.6g}: {verdict}"
            )
    if skipped:
        print(f"verify: not compared (not floating point): {', '.join(map(repr, skipped))}")
    failed = result.verify_failed
    if failed:
        rtol, atol = result.spec.verify_tol
        _error(
            f"{result.dst}: verify failed: output {failed[0]!r} differs from the original by more than "
            f"{atol:g} + {rtol:g} x its largest magnitude (see --verify-tol)"
        )
        return 1
    return 0
