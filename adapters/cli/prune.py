"""``arrayprune prune``: prune the selected tensors of a file, write the result, verify it."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.calibration import (
    BATCH_SIZE,
    ScoredMethod,
    onnx_input_norms,
    read_calibration,
    read_input_norms,
    wanda_scores_for,
)
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.safetensors_stream import SafetensorsFile
from arrayprune.adapters.formats.stream_pruning import prune_source
from arrayprune.adapters.plan import PlanEntry, _name, file_roles, format_plan, make_plan, stream_seed
from arrayprune.adapters.roles.names import tree_roles
from arrayprune.adapters.trees import lookup

from .errors import CliError, _error, _message, _optional, _warn
from .options import _check_options, method_arguments, method_flags
from .report import _totals, report_rows
from .tensors import _check_arrays, _progress, _stage

__all__ = ["run_prune"]


def _global_arguments(args: argparse.Namespace) -> tuple[type, dict[str, Any]]:
    """The method class and keyword arguments of a ``global_unstructured`` call."""
    kwargs: dict[str, Any] = {
        **method_arguments(args, stream_seed(args.seed)),
        "min_sparsity": args.min_sparsity,
        "max_sparsity": args.max_sparsity,
        "normalization": "lamp" if args.lamp else None,
    }
    return arrayprune.METHODS[args.method], kwargs


def _method_for(target: PlanEntry, args: argparse.Namespace, norms: Mapping | None = None) -> Any:
    """The method instance that prunes `target` on its own: its axis, a seed from its name.

    With input norms, it ranks by Wanda's scores of the weight it is given.
    """
    kwargs = method_arguments(args, stream_seed(args.seed, target.name), dim=target.dim)
    method = arrayprune.METHODS[args.method](**kwargs)
    if norms is None:
        return method
    return ScoredMethod(method, lambda t: wanda_scores_for(t, target.role, norms[target.name], target.name))


def _prune_entry(
    params: Mapping, key: Any, target: PlanEntry, args: argparse.Namespace, norms: Mapping | None
) -> Mapping:
    """`params` with `key` pruned by ``args.method`` along the target's axis; seeds follow its name."""
    return mp.prune(params, key, _method_for(target, args, norms))


def _input_norms(args: argparse.Namespace, wf: Any, targets: list[PlanEntry], src: str) -> dict[str, Any] | None:
    """Wanda's input norms of every target, from ``--calibration`` or ``--input-norms``; None without."""
    if args.calibration:
        if wf is None or wf.format != "onnx":
            raise CliError(
                "--calibration runs the model with onnxruntime: IN must be an ONNX model (or use --input-norms)", src
            )
        _optional("onnxruntime", "onnx", "--calibration")
        try:
            calibration = read_calibration(args.calibration)
        except ValueError as exc:
            raise CliError(_message(exc), args.calibration) from None
        samples = len(next(iter(calibration.values())))
        _stage(f"calibration: {samples} samples through onnxruntime, {args.calibration_batch or BATCH_SIZE} at a time")
        try:
            return onnx_input_norms(
                wf,
                calibration,
                [t.name for t in targets],
                batch_size=args.calibration_batch,
                progress=lambda items, desc: _progress(items, desc, "batch"),
            )
        except ValueError as exc:
            raise CliError(f"--calibration: {_message(exc)}", src) from None
    if args.input_norms:
        try:
            norms = read_input_norms(args.input_norms)
        except ValueError as exc:
            raise CliError(_message(exc), args.input_norms) from None
        missing = [t.name for t in targets if t.name not in norms]
        if missing:
            raise CliError(f"no input norms for {missing[0]!r} (selected for pruning)", args.input_norms)
        return norms
    return None


def _scores(targets: list[PlanEntry], norms: Mapping | None, src: str) -> list[Any] | None:
    """Wanda's scores of every target (for global pruning); None without input norms."""
    if norms is None:
        return None
    try:
        return [wanda_scores_for(t.value, t.role, norms[t.name], t.name) for t in targets]
    except ValueError as exc:
        raise CliError(_message(exc), src) from None


def _prune_params(
    params: Mapping, targets: list[PlanEntry], args: argparse.Namespace, src: str, norms: Mapping | None
) -> Mapping:
    """`params` with the targets pruned, as ``name_orig`` + ``name_mask`` entries.

    The other names of a tied tensor get its mask (their ``_orig`` entries stay the one
    shared tensor).
    """
    if args.global_:
        cls, kwargs = _global_arguments(args)
        scores = _scores(targets, norms, src)
        _stage(_threshold_stage(targets))
        if scores is not None:
            kwargs["importance_scores"] = {t.path: s for t, s in zip(targets, scores, strict=True)}
        try:
            params = mp.global_unstructured(params, [t.path for t in targets], cls, **kwargs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"global pruning: {_message(exc)}", src) from None
    else:
        for target in _progress(targets, "pruning"):
            try:
                params = _prune_entry(params, target.path, target, args, norms)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise CliError(f"tensor {_name(target.path)!r}: {_message(exc)}", src) from None
    for target in targets:
        path = target.path
        for other in target.tied:
            params = mp.custom_from_mask(params, other, lookup(params, (*path[:-1], path[-1] + mp.MASK_SUFFIX)))
    return params


def _prune_folded(
    params: Mapping, targets: list[PlanEntry], args: argparse.Namespace, src: str, norms: Mapping | None
) -> Mapping:
    """`params` with the targets pruned and folded, for inputs without masks.

    No mask outlives its tensor's folding: global pruning keeps the core's boolean masks
    (a byte per entry) until each is folded, and tensor by tensor only the current
    tensor's mask exists at a time. Tied names get the same folded array object.
    """
    folded = {}
    if args.global_:
        cls, kwargs = _global_arguments(args)
        scores = _scores(targets, norms, src)
        _stage(_threshold_stage(targets))
        try:
            masks = arrayprune.global_unstructured([t.value for t in targets], cls, scores, **kwargs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"global pruning: {_message(exc)}", src) from None
        for i, target in enumerate(targets):
            folded[target.path] = target.value * masks[i]
            masks[i] = None
    else:
        for target in _progress(targets, "pruning"):
            path = target.path
            try:
                folded[path] = mp.remove(_prune_entry({"t": target.value}, "t", target, args, norms), "t")["t"]
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise CliError(f"tensor {_name(path)!r}: {_message(exc)}", src) from None
    for target in targets:
        folded.update(dict.fromkeys(target.tied, folded[target.path]))
    return mp.replace(params, folded)


def _threshold_stage(targets: list[PlanEntry]) -> str:
    n = sum(math.prod(t.shape) for t in targets)
    return f"global threshold: ranking {n} entries of {len(targets)} tensors"


def _plan(params: Mapping, roles: Mapping, args: argparse.Namespace) -> list[PlanEntry]:
    return make_plan(
        params,
        roles,
        method=args.method,
        include=args.include,
        exclude=args.exclude,
        min_size=args.min_size,
        dim=args.dim,
    )


def _dry_run(args: argparse.Namespace, src: str) -> int:
    """Print the plan and write nothing (safetensors from their headers alone)."""
    _check_options(args)
    if sharded.is_sharded(src) or fmt.detect_format(src) == "safetensors":
        source = sharded.open_checkpoint(src)
        params, roles, kind = source.tensors, tree_roles(source.tensors), source.kind
    else:
        _stage(f"loading {src}")
        wf = fmt.load(src)
        _check_arrays(wf.params, src)
        params, roles, kind = wf.params, file_roles(wf), wf.format
    plan = _plan(params, roles, args)
    if kind == "onnx":  # bfloat16 read as float32: shown as stored
        stored = wf.context.get("stored_dtypes", {})
        plan = [dataclasses.replace(e, dtype=stored.get(e.name, e.dtype)) for e in plan]
    print(f"plan for {src} ({kind}), {args.method}; nothing is written (--dry-run)")
    takes_amount = "--amount" in method_flags(args.method).values()
    print(format_plan(plan, amount=args.amount is not None or not takes_amount))
    _note_count(args)
    return 0


def _stream_refusal(args: argparse.Namespace) -> str | None:
    """The option that tensor-by-tensor pruning cannot honour, or None."""
    if args.keep_masks:
        return "--keep-masks"
    if args.lamp:
        return "--lamp"
    if args.min_sparsity is not None or args.max_sparsity is not None:
        return "--min-sparsity and --max-sparsity"
    if args.global_ and args.method != "l1_unstructured":
        return f"--global with {args.method}"
    if args.global_ and (args.calibration or args.input_norms):
        return "--global with input norms"
    if args.verify:
        return "--verify (ONNX only)"
    return None


def _run_sharded(args: argparse.Namespace) -> int:
    """Prune a sharded safetensors checkpoint (folder or index) into a folder, or one ``.safetensors`` file."""
    src, dst = args.input, args.output
    refused = _stream_refusal(args)
    if refused:
        raise CliError(f"{refused} is not supported for sharded checkpoints, which are pruned tensor by tensor", src)
    if dst is not None and fmt.format_from_suffix(dst) not in (None, "safetensors"):
        raise CliError("a sharded checkpoint is written to a folder or to one .safetensors file", dst)
    if args.dry_run:
        return _dry_run(args, src)
    _check_options(args)
    if dst is None:
        raise CliError("the following arguments are required: -o/--output (or --dry-run)")
    source = sharded.open_checkpoint(src)
    sharded.check_destination(dst, source, args.force)
    if mp.is_pruned(source.tensors):
        raise CliError("tensors pruned before (name_orig + name_mask) are not pruned further here", src)
    return _prune_stored(args, source, dst)


def _prune_stored(args: argparse.Namespace, source: Any, dst: str) -> int:
    """Prune a safetensors checkpoint tensor by tensor, in bounded memory, and say what was done."""
    src = args.input
    plan = _plan(source.tensors, tree_roles(source.tensors), args)
    targets = [e for e in plan if e.prune]
    if not targets:
        raise CliError("no tensor selected for pruning (see --include, --exclude, --min-size)", src)
    norms = _input_norms(args, None, targets, src)
    cls = arrayprune.METHODS[args.method]
    global_method = cls(**method_arguments(args, stream_seed(args.seed))) if args.global_ else None
    if global_method is not None:
        _stage(_threshold_stage(targets) + " (one pass per 16 bits of the keys), then writing")
    try:
        summary = prune_source(
            source,
            dst,
            plan,
            method_for=lambda target: _method_for(target, args, norms),
            global_method=global_method,
            progress=_progress,
        )
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise CliError(f"{'global pruning: ' if args.global_ else ''}{_message(exc)}", src) from None
    pruned, whole = summary.pruned, summary.whole
    _say_pruned(args, src, dst, len(targets), 0, (pruned.zeros, pruned.size), (whole.zeros, whole.size, whole.tensors))
    _warn_nearly_empty(args, summary.by_tensor)
    if isinstance(source, sharded.ShardedCheckpoint) and sharded.writes_one_file(dst):
        print(f"wrote one safetensors file holding the tensors of {len(source.shards)} shards; other files not copied")
    elif isinstance(source, sharded.ShardedCheckpoint):
        written = source.written()
        print(
            f"wrote {len(written)} files to {dst}: {len(source.shards)} shards, {len(source.files)} other files"
            " copied, the index last"
        )
        if source.left:
            print(f"not copied: {'; '.join(source.left)}")
    return 0


def _say_pruned(
    args: argparse.Namespace,
    src: str,
    dst: str,
    n_targets: int,
    n_tied: int,
    pruned: tuple[int, int],
    whole: tuple[int, int, int],
) -> None:
    """Print what was pruned (zeros, entries) and the whole output (zeros, entries, tensors)."""
    zeros, total = pruned
    detail = f"amount {args.amount}" if args.amount is not None else f"{args.nm[0]}:{args.nm[1]}"
    how = f"{args.method}{', global' if args.global_ else ''}, {detail}"
    names = f"{n_targets} tensors" + (f" (and {n_tied} tied names)" if n_tied else "")
    print(f"pruned {names} of {src} ({how}): {zeros} of {total} entries zero ({_pct(zeros, total)}) -> {dst}")
    print(f"whole file: {whole[0]} of {whole[1]} entries zero ({_pct(whole[0], whole[1])}) in {whole[2]} tensors")
    _note_count(args)


#: Sparsity from which ``--global`` warns that it emptied a tensor.
NEARLY_EMPTY = 0.99

_COUNTED = {"block_unstructured": "blocks", "wanda": "entries of each output unit"}


def _note_count(args: argparse.Namespace) -> None:
    """Say that an integer ``--amount`` is a count (of what, and per what), not a fraction."""
    amount = args.amount
    if not isinstance(amount, int) or isinstance(amount, bool) or amount == 0:
        return
    cls = arrayprune.METHODS[args.method]
    unit = _COUNTED.get(args.method, "channels" if cls.PRUNING_TYPE == "structured" else "entries")
    where = "in total over the selected tensors (--global)" if args.global_ else "in each tensor"
    _warn(
        f"--amount {amount} is a count, not a fraction: {amount} {unit} pruned {where}; "
        "a fraction has a decimal point (0.5 is half)",
        "note",
    )


def _warn_nearly_empty(args: argparse.Namespace, counts: Mapping[str, tuple[int, int]]) -> None:
    """Warn when ``--global`` left a tensor with :data:`NEARLY_EMPTY` of its entries zero or more."""
    if not args.global_:
        return
    empty = [(name, z / n) for name, (z, n) in counts.items() if n and z / n >= NEARLY_EMPTY]
    if not empty:
        return
    shown = ", ".join(f"{name} ({100 * f:.2f}%)" for name, f in empty[:5])
    more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
    _warn(
        f"--global pruned {len(empty)} tensor{'s' if len(empty) > 1 else ''} to {100 * NEARLY_EMPTY:g}% or more: "
        f"{shown}{more}; such a layer passes almost nothing on: cap every tensor with --max-sparsity "
        "(e.g. --max-sparsity 0.9) or leave it with --exclude"
    )


def run_prune(args: argparse.Namespace) -> int:
    src, dst = args.input, args.output
    if not os.path.exists(src):
        raise CliError("no such file", src)
    if sharded.is_sharded(src):
        return _run_sharded(args)
    if args.dry_run:
        return _dry_run(args, src)
    if dst is None:
        raise CliError("the following arguments are required: -o/--output (or --dry-run)")
    if os.path.isdir(dst):
        raise CliError("is a directory", dst)
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise CliError("folder does not exist", dst)
    if os.path.exists(dst):
        if os.path.samefile(src, dst) and not args.force:
            raise CliError("is the input file; refusing to overwrite it without --force", dst)
        if not args.force:
            raise CliError("exists; use --force to overwrite it", dst)
    _check_options(args)

    in_format = fmt.detect_format(src)
    out_format = fmt.format_from_suffix(dst) or in_format
    if out_format == "onnx" and in_format != "onnx":
        raise CliError(f"an ONNX model can only be written from an ONNX model, and {src} is {in_format}", dst)
    if args.keep_masks and out_format == "onnx":
        raise CliError(
            "--keep-masks needs an .npz, .safetensors or PyTorch output: an ONNX graph uses the effective weights", dst
        )
    if args.verify and not (in_format == "onnx" and out_format == "onnx"):
        raise CliError("--verify runs ONNX models: IN and OUT must both be .onnx")
    if args.verify:
        _optional("onnxruntime", "onnx", "--verify")  # before anything is written

    if in_format == out_format == "safetensors" and _stream_refusal(args) is None:
        source = SafetensorsFile(src)
        if not mp.is_pruned(source.tensors):
            return _prune_stored(args, source, dst)  # tensor by tensor: the file is never held whole

    _stage(f"loading {src}")
    wf = fmt.load(src, in_format)
    _check_arrays(wf.params, src)

    roles = file_roles(wf)
    targets = [e for e in _plan(wf.params, roles, args) if e.prune]
    if not targets:
        raise CliError("no tensor selected for pruning (see --include, --exclude, --min-size)", src)
    norms = _input_norms(args, wf, targets, src)
    prepared = _verify_inputs(args, src) if args.verify else None  # the original runs before OUT is written
    if args.keep_masks or mp.is_pruned(wf.params):
        params = _prune_params(wf.params, targets, args, src, norms)
        folded = mp.apply_masks(params)
        folded = mp.replace(folded, {other: lookup(folded, t.path) for t in targets for other in t.tied})
        out_params = params if args.keep_masks else folded
    else:
        folded = out_params = _prune_folded(wf.params, targets, args, src, norms)
    fmt.save(dst, out_params, out_format, like=wf)

    rows = report_rows(folded, storage=False, roles=roles)  # one count of zeros per tensor
    selected = {t.name for t in targets}
    pruned = _totals([r for r in rows if r["name"] in selected])
    everything = _totals(rows)
    n_tied = sum(len(t.tied) for t in targets)
    _say_pruned(
        args,
        src,
        dst,
        len(targets),
        n_tied,
        (pruned["zeros"], pruned["size"]),
        (everything["zeros"], everything["size"], everything["tensors"]),
    )
    _warn_nearly_empty(args, {r["name"]: (r["zeros"], r["size"]) for r in rows if r["name"] in selected})
    if prepared is not None:
        return _verify(prepared, dst, args.verify_tol)
    return 0


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole if whole else 0.0:.2f}%"


def _verify_inputs(args: argparse.Namespace, src: str) -> Any:
    """Run the original model on the ``--verify`` inputs, before anything is written."""
    from arrayprune.adapters import verify
    from arrayprune.adapters.calibration import BATCH_SIZE, _read_npz

    data = None
    if args.verify_data:
        try:
            data = _read_npz(args.verify_data)
        except ValueError as exc:
            raise CliError(_message(exc), args.verify_data) from None
    elif args.calibration:
        data = {k: v[:BATCH_SIZE] for k, v in read_calibration(args.calibration).items()}
    try:
        return verify.prepare(src, data=data, seed=args.seed)
    except ValueError as exc:
        raise CliError(f"--verify: {_message(exc)}", args.verify_data or src) from None


def _verify(prepared: Any, dst: str, tol: tuple[float, float]) -> int:
    """Run the pruned model on the prepared inputs; 0 if every float output is within `tol`, else 1."""
    from arrayprune.adapters import verify

    try:
        checks = verify.compare(dst, prepared, tol)
    except ValueError as exc:
        raise CliError(f"--verify: {_message(exc)}", dst) from None
    if prepared.sizes:
        print(f"verify: random inputs, symbolic dimensions {', '.join(f'{k}={v}' for k, v in prepared.sizes.items())}")
    skipped = [c.name for c in checks if c.difference is None]
    for c in checks:
        if c.difference is not None:
            verdict = "pass" if c.passed else "FAIL"
            print(
                f"verify: output {c.name!r}: max abs output difference {c.difference:.6g}, "
                f"tolerance {c.tolerance:.6g}: {verdict}"
            )
    if skipped:
        print(f"verify: not compared (not floating point): {', '.join(map(repr, skipped))}")
    failed = [c.name for c in checks if not c.passed]
    if failed:
        rtol, atol = tol
        _error(
            f"{dst}: verify failed: output {failed[0]!r} differs from the original by more than "
            f"{atol:g} + {rtol:g} x its largest magnitude (see --verify-tol)"
        )
        return 1
    return 0
