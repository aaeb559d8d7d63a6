"""The file pipeline: open, plan, scores, prune, write, summary; what ``arrayprune prune`` runs.

:func:`prune_file` is the command from Python: the same options under the flags' names,
the same files written byte for byte, the plan and the counts returned. The command line
(:mod:`arrayprune.adapters.cli`) only translates its flags into a
:class:`~arrayprune.adapters.pipeline.request.PruneSpec`, calls :func:`run` and prints the
:class:`PruneResult`.

Stages, in order:

* **open**: the format is detected and the file opened as a storage: a
  :class:`WholeFile` (every format, read into memory) or a :class:`StreamedCheckpoint`
  (safetensors files and sharded checkpoints, headers only, pruned tensor by tensor in
  bounded memory). Each storage says which options it cannot honour
  (:meth:`StreamedCheckpoint.refusal`): a single safetensors file falls back to memory
  then, a sharded checkpoint refuses.
* **job**: the plan (roles and selection, :func:`arrayprune.adapters.plan.make_plan`)
  and its targets, with the checked request and the storage: a
  :class:`~arrayprune.adapters.pipeline.job.Job`, which every later stage takes.
* **calibrate**: the statistic the method needs, from the runner the input and options
  choose (:mod:`arrayprune.adapters.pipeline.calibrate`: a table of runners, given
  files, transformers layer by layer, onnxruntime): the dense model's input norms
  first (:func:`~arrayprune.adapters.pipeline.calibrate.dense_norms`), or the weights
  a runner prunes while it calibrates
  (:func:`~arrayprune.adapters.pipeline.calibrate.compress`: a solver such as
  SparseGPT, or a Hugging Face folder layer by layer).
* **allocate** (``--allocation``): each target's own amount.
* **prune**: per tensor (the method built for each entry by :func:`method_for`) or
  global (one threshold over the selected tensors): the pipeline is the only caller of
  global pruning, in memory (:func:`arrayprune.global_unstructured`, the mapping
  adapter for masks) or by radix selection over stored tensors
  (:mod:`arrayprune.adapters.pipeline.stream_pruning`).
* **write**: atomic (:func:`arrayprune.adapters.formats.save`, or the checkpoint's own
  writer), then ``verify`` (ONNX) on what was written.
* **summary**: the counts of zeros (:mod:`arrayprune.adapters.summary`) and what to
  warn about, in the :class:`PruneResult`.

A new stage is a module of the stages' layer taking the job, which :func:`run` calls in
its place; a new option is a field of
:class:`~arrayprune.adapters.pipeline.request.PruneSpec` (see CONTRIBUTING.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from arrayprune.adapters import provenance
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.arrays import release_pages
from arrayprune.adapters.formats.safetensors_stream import SafetensorsFile, TensorFiles
from arrayprune.adapters.pipeline.allocation import allocate
from arrayprune.adapters.pipeline.calibrate import compress, dense_norms, unit_scores
from arrayprune.adapters.pipeline.devices import Device, device_problem, onnx_device, parse_device
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module, raise_problems
from arrayprune.adapters.pipeline.hf_stage import calibration_problems
from arrayprune.adapters.pipeline.hooks import Hooks
from arrayprune.adapters.pipeline.job import Job, ShrinkJob
from arrayprune.adapters.pipeline.option_files import option_file_problems, problem_of
from arrayprune.adapters.pipeline.outputs import check_not_input, check_output_name, check_whole_output
from arrayprune.adapters.pipeline.prune_result import (
    NEARLY_EMPTY,
    PruneResult,
    count_note,
    nearly_empty_warning,
    nm_warnings,
)
from arrayprune.adapters.pipeline.reconstruct_stage import input_refusal
from arrayprune.adapters.pipeline.request import PruneSpec, method_arguments, spec_from
from arrayprune.adapters.pipeline.scoring import input_norms, method_for, scores_for, target_scores
from arrayprune.adapters.pipeline.shrinking import check_shrink_job, run_shrink
from arrayprune.adapters.pipeline.storage import StreamedCheckpoint, WholeFile, check_arrays, open_storage
from arrayprune.adapters.pipeline.stream_pruning import global_counts, prune_source, streams
from arrayprune.adapters.pipeline.targets import outside_note, plan_for, selected_targets
from arrayprune.adapters.pipeline.verify_stage import compare_outputs, evaluate_output, hf_verify_tokens, verify_inputs
from arrayprune.adapters.plan import PlanEntry, _name, stream_seed
from arrayprune.adapters.summary import PruneSummary, Totals, report_rows, totals
from arrayprune.adapters.trees import lookup

__all__ = [
    "NEARLY_EMPTY",
    "Hooks",
    "PruneError",
    "PruneResult",
    "PruneSpec",
    "StreamedCheckpoint",
    "WholeFile",
    "check_arrays",
    "input_norms",
    "method_for",
    "scores_for",
    "open_storage",
    "prune_checkpoint",
    "prune_file",
    "run",
]

_FAILURES = (ValueError, TypeError, IndexError, KeyError)


# --------------------------------------------------------------------------------------
# open
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# plan, scores, methods
# --------------------------------------------------------------------------------------


def _global_arguments(spec: PruneSpec) -> tuple[type, dict[str, Any]]:
    """The method class and keyword arguments of a ``global_unstructured`` call."""
    kwargs: dict[str, Any] = {
        **method_arguments(spec, stream_seed(spec.seed)),
        "min_sparsity": spec.min_sparsity,
        "max_sparsity": spec.max_sparsity,
        "normalization": "lamp" if spec.lamp else None,
    }
    return spec.method_class(), kwargs


def _shaped(spec: PruneSpec) -> bool:
    """Whether global pruning is bounded per tensor or ranks LAMP scores."""
    return spec.lamp or spec.min_sparsity is not None or spec.max_sparsity is not None


def _lamp_scores(by_magnitude: set[str], target: PlanEntry, value: Any) -> Any:
    """What a target pruned alone to its count of a global LAMP ranking is ranked by:
    its LAMP scores, or None (its magnitudes) where they drop the same entries."""
    return None if target.name in by_magnitude else arrayprune.lamp_scores(value)


def _threshold_stage(targets: list[PlanEntry]) -> str:
    n = sum(math.prod(t.shape) for t in targets)
    return f"global threshold: ranking {n} entries of {len(targets)} tensors"


# --------------------------------------------------------------------------------------
# prune: in memory (folded, or with masks) and tensor by tensor
# --------------------------------------------------------------------------------------


def _prune_params(
    params: Mapping, targets: list[PlanEntry], spec: PruneSpec, src: str, norms: Mapping | None, hooks: Hooks
) -> Mapping:
    """`params` with the targets pruned, as ``name_orig`` + ``name_mask`` entries.

    The other names of a tied tensor get its mask (their ``_orig`` entries stay the one
    shared tensor).
    """
    if spec.global_:
        cls, kwargs = _global_arguments(spec)
        scores = target_scores(targets, norms, src)
        hooks.stage(_threshold_stage(targets))
        if scores is not None:
            kwargs["importance_scores"] = {t.path: s for t, s in zip(targets, scores, strict=True)}
        try:
            params = mp.global_unstructured(params, [t.path for t in targets], cls, **kwargs)
        except _FAILURES as exc:
            raise PruneError(f"global pruning: {error_text(exc)}", src) from None
    else:
        for target in hooks.progress(targets, "pruning"):
            try:
                scores = scores_for(target, norms, target.value)
                params = mp.prune(params, target.path, method_for(target, spec), scores)
            except _FAILURES as exc:
                raise PruneError(f"tensor {_name(target.path)!r}: {error_text(exc)}", src) from None
    for target in targets:
        path = target.path
        for other in target.tied:
            params = mp.custom_from_mask(params, other, lookup(params, (*path[:-1], path[-1] + mp.MASK_SUFFIX)))
    return params


def _prune_folded(
    params: Mapping, targets: list[PlanEntry], spec: PruneSpec, src: str, norms: Mapping | None, hooks: Hooks
) -> Mapping:
    """`params` with the targets pruned and folded, for inputs without masks.

    No mask outlives its tensor's folding: global pruning keeps the core's boolean masks
    (a byte per entry) until each is folded, and tensor by tensor only the current
    tensor's mask exists at a time. Tied names get the same folded array object.
    """
    folded = {}
    if spec.global_:
        masks = _global_masks(targets, spec, src, hooks, target_scores(targets, norms, src))
        for i, target in enumerate(targets):
            folded[target.path] = target.value * masks[i]
            masks[i] = None
            release_pages(target.value)  # memory-mapped external data: read, given back
    else:
        for target in hooks.progress(targets, "pruning"):
            path = target.path
            try:
                scores = scores_for(target, norms, target.value)
                pruned = mp.prune({"t": target.value}, "t", method_for(target, spec), scores)
                folded[path] = mp.remove(pruned, "t")["t"]
            except _FAILURES as exc:
                raise PruneError(f"tensor {_name(path)!r}: {error_text(exc)}", src) from None
            release_pages(target.value)
    for target in targets:
        folded.update(dict.fromkeys(target.tied, folded[target.path]))
    return mp.replace(params, folded)


def _global_masks(targets: list[PlanEntry], spec: PruneSpec, src: str, hooks: Hooks, scores: Any = None) -> Any:
    """The keep masks of one global ranking of the targets (by `scores`, else by their values)."""
    cls, kwargs = _global_arguments(spec)
    hooks.stage(_threshold_stage(targets))
    try:
        return arrayprune.global_unstructured([t.value for t in targets], cls, scores, **kwargs)
    except _FAILURES as exc:
        raise PruneError(f"global pruning: {error_text(exc)}", src) from None


def _write_whole(job: Job, norms: Mapping | None, made: Mapping[str, str] | None = None) -> PruneSummary:
    """Prune in memory, write the job's output atomically (with the provenance record `made`), count the zeros."""
    storage, targets, spec, hooks, src = cast(WholeFile, job.storage), job.targets, job.spec, job.hooks, job.src
    dst, params = cast(str, job.dst), storage.params
    with contextlib.ExitStack() as stack:
        compressed = compress(job, stack, lambda t, s: _global_masks(t, s, src, hooks))  # a solver's weights
        if compressed is not None:
            folded = out_params = compressed
        elif spec.keep_masks or mp.is_pruned(params):
            masked = _prune_params(params, targets, spec, src, norms, hooks)
            folded = mp.apply_masks(masked)
            folded = mp.replace(folded, {other: lookup(folded, t.path) for t in targets for other in t.tied})
            out_params = masked if spec.keep_masks else folded
        else:
            folded = out_params = _prune_folded(params, targets, spec, src, norms, hooks)
        wf = storage.wf
        like = fmt.WeightFile(wf.path, wf.format, wf.params, {**wf.context, "provenance": made}) if made else wf
        fmt.save(dst, out_params, cast(str, job.out_format), like=like)

    rows = report_rows(folded, storage=False, roles=storage.roles)  # one count of zeros per tensor
    selected = {t.name for t in targets}
    pruned, whole = totals([r for r in rows if r["name"] in selected]), totals(rows)
    return PruneSummary(
        pruned=Totals(pruned["tensors"], pruned["size"], pruned["zeros"]),
        whole=Totals(whole["tensors"], whole["size"], whole["zeros"]),
        files=[dst],
        by_tensor={r["name"]: (r["zeros"], r["size"]) for r in rows if r["name"] in selected},
    )


def _write_streamed(job: Job, norms: Mapping | None, made: Mapping[str, str] | None = None) -> PruneSummary:
    """Prune tensor by tensor in bounded memory while the checkpoint writes the job's output
    atomically, with the provenance record `made`.

    Global pruning with per-tensor bounds or LAMP scores finds each target's count first
    (:func:`~arrayprune.adapters.pipeline.stream_pruning.global_counts`, before anything is
    written); each target is then pruned alone to its count, ranked as the global
    ranking ranks it, which writes the masks of the global ranking.
    """
    storage, targets, spec, hooks = cast(StreamedCheckpoint, job.storage), job.targets, job.spec, job.hooks
    dst = cast(str, job.dst)
    global_method = spec.method_class()(**method_arguments(spec, stream_seed(spec.seed))) if spec.global_ else None
    ranked_by = None if norms is None else lambda target, value: scores_for(target, norms, value)
    if global_method is not None and _shaped(spec):
        hooks.stage(_threshold_stage(targets) + " (per-tensor counts: one pass per 16 bits of the keys)")
        try:
            with TensorFiles() as files:
                counts, by_magnitude = global_counts(
                    targets,
                    files,
                    global_method,
                    lamp=spec.lamp,
                    min_sparsity=spec.min_sparsity,
                    max_sparsity=spec.max_sparsity,
                )
        except _FAILURES as exc:
            raise PruneError(f"global pruning: {error_text(exc)}", storage.src) from None
        if spec.lamp:  # LAMP scores where the magnitudes would drop other entries
            ranked_by = functools.partial(_lamp_scores, by_magnitude)
        job = job.with_spec(global_=False, amount=counts, lamp=False, min_sparsity=None, max_sparsity=None)
        spec, global_method = job.spec, None
    elif global_method is not None:
        hooks.stage(_threshold_stage(targets) + " (one pass per 16 bits of the keys), then writing")
    with contextlib.ExitStack() as stack:
        replaced = compress(job, stack, lambda t, s: _global_masks(t, s, job.src, hooks))  # layer by layer
        try:
            summary = prune_source(
                storage.source,
                dst,
                job.plan,
                method_for=job.method_for,
                scores_for=ranked_by,
                global_method=global_method,
                progress=hooks.progress,
                replaced=replaced,
                made=made,
                replace=spec.force,
            )
        except _FAILURES as exc:
            raise PruneError(f"{'global pruning: ' if spec.global_ else ''}{error_text(exc)}", storage.src) from None
    if storage.sharded and not sharded.writes_one_file(dst):
        summary.files, summary.left = storage.source.written(), list(storage.source.left)
    else:
        summary.files = [dst]
    return summary


# --------------------------------------------------------------------------------------
# the run, and what it returns
# --------------------------------------------------------------------------------------


def _notes(spec: PruneSpec, plan: Sequence[PlanEntry] = ()) -> list[str]:
    notes = [count_note(spec), outside_note(list(plan))]
    return [note for note in notes if note is not None]


def _dry_run(src: str, spec: PruneSpec, hooks: Hooks) -> PruneResult:
    """The plan, nothing written (safetensors from their headers alone)."""
    spec = spec.checked()
    storage = open_storage(src, hooks)
    plan = storage.shown(plan_for(storage, spec))
    notes, warnings = _notes(spec, plan), nm_warnings(spec, plan)
    result = PruneResult(src, None, storage.kind, spec, plan, notes=notes, warnings=warnings)
    if spec.allocation and not spec.plan_only:
        _allocate(Job(spec, storage, plan, selected_targets(plan, src), hooks), result)
    return result


def _allocate(job: Job, result: PruneResult, norms: Mapping | None = None) -> Job:
    """The allocation stage: the job with each target's own amount; the shares into `result`.

    `norms`: the dense input norms the masks rank by, if the calibrate stage gave them;
    otherwise those it gives for an allocation (OWL's outliers), or none.
    """
    if norms is None:
        norms = dense_norms(job, allocation=True)
    result.allocation = allocate(job, norms)
    result.notes.extend(result.allocation.notes)
    return job.with_amounts(result.allocation.amounts)


def _open_sharded(
    src: str, dst: str | None, spec: PruneSpec, early: Sequence[Exception] = ()
) -> tuple[StreamedCheckpoint, PruneSpec]:
    """Open a sharded checkpoint for pruning into `dst`, after the checks nothing is written
    without; the storage and the checked request (an option refused is told with OUT's problems,
    `early` before them)."""
    if dst is None:
        raise_problems([*early, PruneError("the following arguments are required: -o/--output (or --dry-run)")])
    try:
        storage = StreamedCheckpoint(sharded.open_checkpoint(src), src)  # IN first: a folder that is no checkpoint
    except (PruneError, fmt.FormatError) as exc:
        raise_problems([*early, exc])
        raise
    problems: list[Exception] = list(early)  # every one the headers, config.json, tokens tell, before a framework
    if fmt.format_from_suffix(dst) not in (None, "safetensors"):
        problems.append(PruneError("a sharded checkpoint is written to a folder or to one .safetensors file", dst))
    else:
        try:
            sharded.check_destination(dst, storage.source, spec.force)
        except fmt.FormatError as exc:
            problems.append(exc)
    try:
        spec = spec.checked()
    except PruneError as exc:  # no plan without a valid request; the tokens need none
        raise_problems([*problems, exc, *calibration_problems(spec, src)])
    if mp.is_pruned(storage.params):
        problems.append(PruneError("tensors pruned before (name_orig + name_mask) are not pruned further here", src))
    else:
        plan: list[PlanEntry] = []
        try:
            plan = plan_for(storage, spec, reach=False)
            selected_targets(plan, src)
        except PruneError as exc:
            problems.append(exc)
        problems.extend(option_file_problems(spec, plan, calibration=False))
    problems.extend(calibration_problems(spec, src))
    raise_problems(problems)
    return storage, spec


def _whole_file_problems(src: str, spec: PruneSpec, *, calibration: bool = True) -> list[Exception]:
    """What a single file's headers and the option files tell before the file is loaded:
    a safetensors file's plan (an ``--include`` matching nothing, a ``--dim`` out of
    range) from its header; the option files (:func:`option_file_problems`; `calibration`:
    whether to check ``spec.calibration`` there)."""
    plan: list[PlanEntry] = []
    problems: list[Exception] = []
    try:
        if fmt.detect_format(src) == "safetensors":
            source = SafetensorsFile(src)
            if not mp.is_pruned(source.tensors):
                plan = plan_for(StreamedCheckpoint(source, src), spec, reach=False)
                selected_targets(plan, src)
    except (PruneError, fmt.FormatError) as exc:
        problems.append(exc)
    return problems + option_file_problems(spec, plan, calibration=calibration)


def _open_file(src: str, dst: str, spec: PruneSpec, hooks: Hooks) -> tuple[WholeFile | StreamedCheckpoint, str]:
    """Open one file for pruning into `dst`: tensor by tensor where the storage honours every option."""
    in_format = fmt.detect_format(src)
    out_format = fmt.format_from_suffix(dst) or in_format
    if out_format == "onnx" and in_format != "onnx":
        raise PruneError(f"an ONNX model can only be written from an ONNX model, and {src} is {in_format}", dst)
    if spec.keep_masks and out_format == "onnx":
        raise PruneError(
            "--keep-masks needs an .npz, .safetensors or PyTorch output: an ONNX graph uses the effective weights", dst
        )
    if spec.verify and not (in_format == "onnx" and out_format == "onnx"):
        raise PruneError("--verify runs ONNX models: IN and OUT must both be .onnx")
    if spec.verify:
        optional_module("onnxruntime", "onnx", "--verify")  # before anything is written
    if in_format == out_format == "safetensors" and StreamedCheckpoint.refusal(spec) is None:
        source = SafetensorsFile(src)
        if not mp.is_pruned(source.tensors):
            return StreamedCheckpoint(source, src), out_format  # the file is never held whole
    return WholeFile(src, in_format, hooks), out_format


def run(src: Any, dst: Any, spec: PruneSpec, hooks: Hooks = Hooks()) -> PruneResult:
    """Run the pipeline: open, plan, scores, prune, write (then verify), summary.

    Parameters
    ----------
    src : str or os.PathLike
        The input: a model file, a sharded checkpoint's folder or its index.
    dst : str or os.PathLike or None
        The output (None only for a dry run).
    spec : PruneSpec
        The request (checked here, at the point the command checks it).
    hooks : Hooks, optional
        Stage announcements and progress bars.

    Returns
    -------
    PruneResult

    Raises
    ------
    PruneError
        For options that do not apply, inputs and outputs that cannot be used, a method
        that fails on a tensor; nothing is written then.
    FormatError
        For files that cannot be read or written.
    """
    src, dst = os.fspath(src), None if dst is None else os.fspath(dst)
    check_output_name(dst)
    device, device_problems = _device(spec, src)  # before anything is read
    if not os.path.exists(src):
        raise_problems([PruneError("no such file", src), *device_problems])
    if dst is not None and not spec.dry_run:
        check_not_input(src, dst)
    if refused := input_refusal(spec, src):
        raise PruneError(refused, src)
    # --verify on a Hugging Face folder: arrayprune eval of OUT against IN, once OUT is written
    tokens = hf_verify_tokens(spec, src)
    if tokens is not None:
        spec = dataclasses.replace(spec, verify=False, verify_data=None)
    # a device that is not here is told with the other problems found before anything runs
    # (a misspelt one is the request's: PruneSpec.checked tells it there)
    with onnx_device(device):
        result = _run(src, dst, spec, hooks, device_problems if device is not None else [])
    if tokens is not None and result.dst is not None and (result.written is not None or result.shrink is not None):
        hooks.stage(f"--verify: arrayprune eval {result.dst} --tokens {tokens} --compare {src}")
        result.evaluation = evaluate_output(result.dst, src, tokens, spec.device)
    return result


def _device(spec: PruneSpec, src: str) -> tuple[Device | None, list[Exception]]:
    """The device calibration runs on (None: the CPU) and why it cannot, checked without
    reading `src` (its suffix says ONNX or PyTorch); PyTorch or onnxruntime is imported
    only for a device other than the CPU."""
    if spec.device is None:
        return None, []
    try:
        device = parse_device(spec.device)
    except ValueError as exc:
        return None, [PruneError(str(exc))]
    runner = "onnxruntime" if fmt.format_from_suffix(src) == "onnx" else "torch"
    problem = device_problem(device, runner)
    return device, [] if problem is None else [PruneError(problem)]


def _run(src: str, dst: Any, spec: PruneSpec, hooks: Hooks, early: list[Exception]) -> PruneResult:
    """The stages after the checks of `run`; `early`: the problems found there (the device's),
    told with those the up-front checks find."""
    if spec.shrink or spec.dry_run:
        raise_problems(early)
    if spec.shrink:  # a stage of its own, in place of plan and prune: channel groups, sliced away
        shrink_job = ShrinkJob.resolve(spec, src, dst, hooks)
        check_shrink_job(shrink_job)  # before the calibrate stage runs the model
        with contextlib.ExitStack() as stack:
            return run_shrink(shrink_job, unit_scores(shrink_job, stack))
    out_format = None
    if sharded.is_sharded(src):
        refused = StreamedCheckpoint.refusal(spec)
        if refused:
            raise PruneError(
                f"{refused} is not supported for sharded checkpoints, which are pruned tensor by tensor", src
            )
        if spec.dry_run:
            return _dry_run(src, spec, hooks)
        storage: WholeFile | StreamedCheckpoint
        storage, spec = _open_sharded(src, dst, spec, early)
    elif spec.dry_run:
        return _dry_run(src, spec, hooks)
    else:
        problems = early + problem_of(lambda: check_whole_output(src, dst, spec))
        hf_tokens = bool(spec.calibration) and fmt.detect_format(src) == "safetensors"
        if hf_tokens:  # the tokens of a Hugging Face file, told with OUT
            problems.extend(calibration_problems(spec, src))
        try:
            spec = spec.checked()
        except PruneError as exc:
            raise_problems([*problems, exc])
        raise_problems(problems + _whole_file_problems(src, spec, calibration=not hf_tokens))
        if dst is None:  # _check_output refused it
            raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
        storage, out_format = _open_file(src, dst, spec, hooks)

    plan = plan_for(storage, spec)
    job = Job.resolve(spec, storage, plan, hooks, dst, out_format)
    norms = dense_norms(job)  # the calibrate stage: what the masks rank by, if the runner gives it first
    prepared = verify_inputs(spec, src) if spec.verify else None  # the original runs before OUT is written
    notes, warnings = _notes(spec, plan), nm_warnings(spec, job.targets)
    result = PruneResult(src, dst, storage.kind, spec, plan, notes=notes, warnings=warnings)
    if spec.allocation:
        job = _allocate(job, result, norms)
    made = provenance.record(spec)
    if job.streamed:
        written = _write_streamed(job, norms, made)
        tied = 0
    else:
        if out_format is None:  # a whole file has one: _open_file chose it
            raise PruneError("no output format for OUT", dst)
        written = _write_whole(job, norms, made)
        tied = sum(len(t.tied) for t in job.targets)
    result.written, result.tied = written, tied
    warning = nearly_empty_warning(spec, written.by_tensor)
    if warning:
        result.warnings.append(warning)
    if isinstance(storage, StreamedCheckpoint) and storage.sharded:
        result.shards, result.copied = len(storage.source.shards), len(storage.source.files)
    if prepared is not None:
        result.verify, result.verify_sizes = compare_outputs(prepared, dst, spec.verify_tol), dict(prepared.sizes)
    return result


# --------------------------------------------------------------------------------------
# the Python entry points
# --------------------------------------------------------------------------------------


def prune_file(src: Any, dst: Any = None, *, hooks: Hooks = Hooks(), **options: Any) -> PruneResult:
    """Prune a model file as ``arrayprune prune SRC -o DST`` does, with the same options.

    Every option of the command is a keyword under its flag's name (``--global`` is
    ``global_``, ``--nm 2:4`` is ``nm=(2, 4)``, ``--block 4x4`` is ``block=(4, 4)``,
    ``--verify-tol 0.1`` is ``verify_tol=(0.1, 1e-6)``); the output is the command's,
    byte for byte, and the errors are its messages (:class:`PruneError`, a
    ``ValueError``, or :class:`~arrayprune.adapters.formats.FormatError`).

    Parameters
    ----------
    src : str or os.PathLike
        ``.onnx`` (external data included), ``.npz``, ``.safetensors``, a PyTorch state
        dict or checkpoint, or a sharded safetensors checkpoint (folder or index).
    dst : str or os.PathLike, optional
        The output; its suffix gives its format. Not needed with ``dry_run=True``.
    hooks : Hooks, optional
        Stage announcements and progress bars (none by default).
    **options
        ``method``, ``amount``, ``global_``, ``nm``, ``block``, ``n``, ``dim``,
        ``include``, ``exclude``, ``min_size``, ``min_sparsity``, ``max_sparsity``,
        ``lamp``, ``calibration``, ``calibration_batch``, ``input_norms``, ``seed``,
        ``keep_masks``, ``force``, ``dry_run``, ``verify``, ``verify_data``,
        ``verify_tol``, ``one_pass``, ``hessians``, ``shrink``, ``groups``, ``allocation``, ``device``: see
        :class:`~arrayprune.adapters.pipeline.request.PruneSpec`.

    Returns
    -------
    PruneResult
        The plan; for a run that writes, the counts (``result.written.pruned``,
        ``result.written.whole``), what to warn about, and the ``verify`` checks.

    Raises
    ------
    PruneError
        An option that does not apply, an output that exists without ``force``, a
        method that fails on a tensor (nothing is written then).
    FormatError
        A file that cannot be read or written.

    Examples
    --------
    >>> from arrayprune.adapters import prune_file
    >>> plan = prune_file("examples/mlp.onnx", dry_run=True, amount=0.5, global_=True).plan  # doctest: +SKIP
    >>> result = prune_file("examples/mlp.onnx", "mlp-pruned.onnx", amount=0.5, global_=True)  # doctest: +SKIP
    >>> result.written.pruned.zeros, result.written.pruned.size  # doctest: +SKIP
    (42240, 84480)
    >>> prune_file("model.onnx", "model-24.onnx", method="nm_structured", nm=(2, 4))  # doctest: +SKIP
    >>> prune_file("Llama-3-8B", "Llama-3-8B-50", amount=0.5, global_=True)  # doctest: +SKIP
    """
    return run(src, dst, spec_from(options.items()), hooks)


def prune_checkpoint(
    src: Any,
    dst: Any,
    *,
    method: str = "l1_unstructured",
    amount: int | float | None = None,
    global_: bool = False,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    min_size: int = 0,
    dim: int | None = None,
    seed: int | None = None,
    force: bool = False,
    progress: Callable[[Any, str], Iterable[Any]] | None = None,
    **method_args: Any,
) -> PruneSummary:
    """Prune a safetensors checkpoint, sharded or not, in bounded memory: :func:`prune_file`.

    The options are :func:`prune_file`'s; the method's other arguments are its
    constructor's names (``n`` and ``m`` of an N:M pattern, ``block_shape``).

    Returns
    -------
    PruneSummary
        Counts of the pruned tensors and of the whole checkpoint, and the files.

    Raises
    ------
    ValueError
        For a method, amount or option that cannot apply (``PruneError``).
    FormatError
        For a missing, damaged or hostile checkpoint, or a destination that exists
        without `force`; nothing is written then.

    Examples
    --------
    >>> from arrayprune.adapters.formats import sharded
    >>> summary = sharded.prune_checkpoint("Llama-3-8B", "Llama-3-8B-50", amount=0.5, global_=True)
    ... # doctest: +SKIP
    """
    if method not in arrayprune.METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(arrayprune.METHODS)}")
    if global_ and not streams(arrayprune.METHODS[method]):
        streamed = " or ".join(name for name, cls in arrayprune.METHODS.items() if streams(cls))
        raise ValueError(f"global pruning of a checkpoint ranks an elementwise score: use {streamed}, not {method}")
    options = dict(method=method, amount=amount, global_=global_, include=include, exclude=exclude)
    options.update(min_size=min_size, dim=dim, seed=seed, force=force)
    if "n" in method_args and "m" in method_args:
        options["nm"] = (method_args.pop("n"), method_args.pop("m"))
    if "block_shape" in method_args:
        options["block"] = tuple(method_args.pop("block_shape"))
    options.update(method_args)
    hooks = Hooks() if progress is None else Hooks(progress=lambda items, desc, unit="tensor": progress(items, desc))
    result = prune_file(src, dst, hooks=hooks, **options)
    return result.written if result.written is not None else PruneSummary()
