"""The shrink stage of the file pipeline: ``arrayprune prune --shrink``, ``prune_file(..., shrink=True)``.

A structured method that removes whole channels (one that scores channels:
``ln_structured``, ``random_structured``) drops ``amount`` of the channels of every
channel group of an ONNX graph, and the channels go: every tensor holding them is
sliced (:func:`arrayprune.adapters.shrink.shrink_onnx`; groups from
:func:`arrayprune.adapters.roles.onnx_groups.onnx_groups`). A calibrated structured method
(``obs_structured``, ``activation_structured``) scores each group on the layers reading it
instead, from the Hessians the calibrate stage measured (its ``consumer_hessians`` row),
and refits them (``--no-compensate``: not). :func:`arrayprune.adapters.pipeline.run`
hands a request with ``shrink`` to :func:`run_shrink`, which runs in its place:

* **request**: :func:`arrayprune.adapters.pipeline.shrink_request.check_shrink` (through
  ``PruneSpec.checked``) refuses the options that cannot go with it;
* **job**: the runner resolves a :class:`~arrayprune.adapters.pipeline.job.ShrinkJob`, whose
  :func:`~arrayprune.adapters.pipeline.shrink_request.format_refusal` says what the
  input's format cannot do (channel groups come from an ONNX graph, or from a Hugging
  Face checkpoint folder, which :func:`arrayprune.adapters.pipeline.shrink_structure.run_hf_shrink`
  shrinks tensor by tensor: MLP channels, heads, layers, experts);
* **groups**: the dry run lists each group (members, channels before and after) and each
  producer left, with its reason;
* **shrink**, then **write**: through the ONNX writer (:func:`arrayprune.adapters.formats.save`),
  atomically, inline or with external data as the input had it;
* **verify**: the shrunk model against the dense model with the dropped channels zeroed
  where the next layers read them, built in memory: the same function, so any tolerance
  holds up to rounding;
* **summary**: parameters before and after, the channels kept per group
  (:class:`ShrinkResult`, ``PruneResult.shrink``).
"""

from __future__ import annotations

from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import provenance
from arrayprune.adapters.formats.onnx import _PROTOBUF_LIMIT, inline_tensor, iter_initializers
from arrayprune.adapters.formats.weightfile import WeightFile
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.job import ShrinkJob
from arrayprune.adapters.pipeline.outputs import check_whole_output
from arrayprune.adapters.pipeline.prune_result import PruneResult, ShrinkResult, shrink_notes
from arrayprune.adapters.pipeline.shrink_request import check_group_amount
from arrayprune.adapters.pipeline.shrink_structure import UnitScores, check_hf_shrink, run_hf_shrink
from arrayprune.adapters.pipeline.storage import WholeFile
from arrayprune.adapters.pipeline.targets import plan_for
from arrayprune.adapters.pipeline.verify_stage import compare_outputs, verify_inputs
from arrayprune.adapters.roles.onnx_groups import OnnxGroups, onnx_groups
from arrayprune.adapters.shrink import ShrinkReport, shrink_onnx, source_names, zeroed_onnx
from arrayprune.adapters.summary import PruneSummary, Totals, report_rows, totals

__all__ = ["ShrinkResult", "check_shrink_job", "run_shrink", "zeroed_reference"]



def _members_inline(wf: WeightFile, found: OnnxGroups) -> Any:
    """A copy of the model whose group members hold their data (external data read in)."""
    onnx = optional_module("onnx", "onnx", "--shrink")
    model = onnx.ModelProto()
    model.CopyFrom(wf.context["model"])
    names = source_names(found)
    external = wf.context.get("external", {})
    for t in model.graph.initializer:
        if t.name in names and t.data_location == onnx.TensorProto.EXTERNAL:
            t.CopyFrom(inline_tensor(t, external[t.name]))
    return model


def zeroed_reference(wf: WeightFile, report: ShrinkReport) -> Any:
    """The dense model with the dropped channels zeroed where the next layers read them, in memory.

    The input channels of each group's closing layers (``MatMul``/``Gemm`` B rows,
    ``Conv`` W input channels, the output projection's rows of a dropped head) are
    zeroed (:func:`arrayprune.adapters.shrink.zeroed_onnx`): the dense model then
    computes what the shrunk one computes (a dropped channel's activation, whatever it
    is after biases, norms and residual additions, is multiplied by zero). Every
    initializer holds its data (external data read in), so that onnxruntime can run it
    from memory.

    Raises
    ------
    PruneError
        If the model does not fit in one protobuf (2 GB).
    """
    onnx = optional_module("onnx", "onnx", "--verify")
    model = onnx.ModelProto()
    model.CopyFrom(wf.context["model"])
    external = wf.context.get("external", {})
    seen: set[str] = set()
    for t in iter_initializers(model):
        if t.name in seen:
            continue
        seen.add(t.name)
        if t.data_location == onnx.TensorProto.EXTERNAL and t.name in external:
            t.CopyFrom(inline_tensor(t, external[t.name]))
    model = zeroed_onnx(model, report)
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise PruneError(
            "--verify with --shrink runs the zeroed dense model from memory: models over 2 GB are not supported yet",
            wf.path,
        )
    return model


def _summary(params: dict, members: set[str], roles: Any, dst: str) -> PruneSummary:
    rows = report_rows(params, storage=False, roles=roles)
    pruned, whole = totals([r for r in rows if r["name"] in members]), totals(rows)
    return PruneSummary(
        pruned=Totals(pruned["tensors"], pruned["size"], pruned["zeros"]),
        whole=Totals(whole["tensors"], whole["size"], whole["zeros"]),
        files=[dst],
        by_tensor={r["name"]: (r["zeros"], r["size"]) for r in rows if r["name"] in members},
    )


def check_shrink_job(job: ShrinkJob) -> None:
    """What the shrink stage refuses before the calibrate stage runs anything (a folder's
    amounts, units and output: :func:`~arrayprune.adapters.pipeline.shrink_structure.check_hf_shrink`;
    the output of an ONNX graph shrunk with a calibrated method).

    Raises
    ------
    PruneError
        One line; nothing has run or been written.
    """
    if job.kind == "sharded safetensors":
        check_hf_shrink(job)
    elif job.calibrated and not job.spec.dry_run:  # the output, before the calibration runs the model
        _check_onnx_output(job)


def _check_onnx_output(job: ShrinkJob) -> str:
    """OUT of an ONNX shrink: a whole file that can be written, with the ``.onnx`` suffix."""
    dst = check_whole_output(job.src, job.dst, job.spec)
    if (fmt.format_from_suffix(dst) or job.kind) != "onnx":
        raise PruneError("--shrink writes an ONNX model: OUT must be .onnx", dst)
    return dst


def run_shrink(job: ShrinkJob, scores: UnitScores | None = None) -> PruneResult:
    """Run the pipeline with the shrink stage: open, groups, shrink, write (then verify), summary.

    Parameters
    ----------
    job : ShrinkJob
        The checked request with ``shrink`` on its input (an ONNX model or a Hugging Face
        folder; :meth:`ShrinkJob.resolve <arrayprune.adapters.pipeline.job.ShrinkJob.resolve>`),
        checked by :func:`check_shrink_job`.
    scores : UnitScores, optional
        What the calibrate stage measured of the units
        (:func:`arrayprune.adapters.pipeline.calibrate.unit_scores`); None where the units
        are scored by their weights.

    Returns
    -------
    PruneResult
        With ``shrink`` (:class:`ShrinkResult`); ``written`` counts the member tensors
        (``pruned``) and the whole output.

    Raises
    ------
    PruneError
        For an input that cannot be shrunk, an amount a group cannot lose; nothing is
        written then.
    """
    if job.kind == "sharded safetensors":
        return run_hf_shrink(job, scores)
    return _shrink_onnx(job, scores)


def _calibrated_note(job: ShrinkJob) -> list[str]:
    """What the dry run of a calibrated method tells of its scores."""
    if not job.calibrated:
        return []
    refit = "each consumer's kept columns refit" if job.spec.compensate else "no refit (--no-compensate)"
    return [
        f"--method {job.spec.method}: each group scored on calibration data by the layers reading its channels "
        f"({refit}); the dry run does not run the calibration"
    ]


def _shrink_onnx(job: ShrinkJob, scores: UnitScores | None = None) -> PruneResult:
    """The shrink stage on an ONNX model: channel groups or heads traced, scored (on their
    consumers' Hessians, a calibrated method's: `scores`), sliced, written."""
    spec, src, kind, hooks = job.spec, job.src, job.kind, job.hooks
    dst = job.dst
    if not spec.dry_run:
        dst = _check_onnx_output(job)
        if spec.verify:
            optional_module("onnxruntime", "onnx", "--verify")  # before anything is written
    storage = WholeFile(src, "onnx", hooks)
    wf = storage.wf
    plan = storage.shown(plan_for(storage, spec))
    found = onnx_groups(wf.context["model"], job.groups)
    if spec.amount is not None:
        check_group_amount(found, spec.amount, src, spec.global_, spec.rounding)
    if spec.dry_run:  # with --global, the counts per group come from the scores: not shown
        shown = None if spec.global_ else spec.amount
        dry = ShrinkResult(found, shown, rounding=spec.rounding)
        notes = shrink_notes(spec) + _calibrated_note(job)
        return PruneResult(src, None, kind, spec, plan, notes=notes, shrink=dry)
    if not found.groups:
        if found.kind == "heads":
            raise PruneError(
                "--shrink --groups heads: no attention block in the graph (--dry-run --shrink says why)", src
            )
        raise PruneError("--shrink: no channel group in the graph (--dry-run --shrink says why)", src)

    hessians = None
    if job.calibrated:
        if scores is None or scores.statistic != "consumer_hessians":
            raise PruneError(f"--method {spec.method} scores channels on calibration data: add --calibration", src)
        hessians = scores.scores
    hooks.stage(f"shrinking {len(found.groups)} channel groups")
    try:
        small, report = shrink_onnx(
            _members_inline(wf, found), spec.amount, spec.method, global_=spec.global_, kind=found.kind,
            rounding=spec.rounding, hessians=hessians, **job.channel_arguments(),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        raise PruneError(f"--shrink: {error_text(exc)}", src) from None
    # the dense model runs before OUT is written
    prepared = verify_inputs(spec, src, zeroed_reference(wf, report)) if spec.verify else None

    numpy_helper = optional_module("onnx.numpy_helper", "onnx", "--shrink")
    changed = set(report.changed)  # sliced members, Reshape targets, private copies of shared initializers
    params = {
        t.name: numpy_helper.to_array(t) if t.name in changed else wf.params[t.name] for t in small.graph.initializer
    }
    context = {**wf.context, "model": small, "provenance": provenance.record(spec)}
    fmt.save(dst, params, "onnx", like=WeightFile(src, "onnx", params, context))

    shrunk = ShrinkResult(found, spec.amount, report.kept, report.params_before, report.params_after, spec.rounding)
    if dst is None:  # dry runs returned above
        raise PruneError("--shrink: give -o OUT, or --dry-run", src)
    written = _summary(params, changed, storage.roles, dst)
    result = PruneResult(src, dst, kind, spec, plan, written, notes=shrink_notes(spec), shrink=shrunk)
    if prepared is not None:
        result.verify, result.verify_sizes = compare_outputs(prepared, dst, spec.verify_tol), dict(prepared.sizes)
    return result
