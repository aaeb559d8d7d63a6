"""The reconstruct stage: ``arrayprune prune MODEL.onnx --method sparsegpt --calibration ...``.

A method of :data:`arrayprune.METHODS` that carries a solver (SparseGPT; see
:func:`~arrayprune.adapters.pipeline.method_names.reconstructs`) prunes each weight *and
updates the entries it keeps* from the Hessians of calibration data run through the
model's graph. The request checks its options as every method's, and with
:func:`refusal`; the plan and, with ``--global``, the ranking take the method as any
other (by magnitude, its rank without a Hessian: one threshold over all targets, whose
per-weight counts, :func:`~arrayprune.adapters.pipeline.reconstruction.amounts_from_masks`,
the engine then prunes). The pipeline refuses inputs without a graph to run
(:func:`input_refusal`) and calls :func:`reconstruct` in place of masking, between plan
and write.

``--keep-masks``, ``--seed``, ``--dim`` and ``--input-norms`` do not apply (the
weights kept are not the original ones; nothing is random; the axis is each weight's
reduction axis; the Hessians come from ``--calibration``). ``--lamp``,
``--min-sparsity`` and ``--max-sparsity`` shape the global ranking as for
``l1_unstructured``. ``--one-pass`` takes every Hessian from the dense model
(``sequential=False``); by default each weight is calibrated on the model whose earlier
weights are already pruned and updated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.pipeline import hf_stage
from arrayprune.adapters.pipeline.calibration import read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.job import Job
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.reconstruction import amounts_from_masks, onnx_sparsegpt
from arrayprune.adapters.pipeline.reconstruction_methods import GRAPH_FORMATS, elsewhere, refusal
from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["input_refusal", "reconstruct", "refusal"]


def input_refusal(spec: PruneSpec, src: str) -> str | None:
    """Why the reconstruction method of `spec`, or ``calibration``, cannot run on `src`; None if it can."""
    method = reconstructs(spec.method)
    if not method and not spec.calibration:
        return None
    kind = "sharded" if sharded.is_sharded(src) else fmt.detect_format(src)
    if spec.hessians and kind not in ("sharded", "safetensors"):
        return f"--hessians applies to safetensors files and checkpoints; {kind} models take --calibration"
    if spec.hessians:
        return None
    if not method:  # Wanda's norms: from a Hugging Face model layer by layer, or from ONNX
        return hf_stage.input_refusal(spec, src, kind)
    if kind in GRAPH_FORMATS or (kind in ("sharded", "safetensors") and spec.calibration):
        return hf_stage.input_refusal(spec, src, kind)  # tokens through a Hugging Face model, layer by layer
    if kind in ("sharded", "safetensors"):  # no --calibration, no --hessians: say how to give them here
        return hf_stage.calibration_needed(spec.method, src)
    need = " or ".join(f.upper() if f == "onnx" else f for f in GRAPH_FORMATS)
    what = "sharded checkpoints" if kind == "sharded" else f"{kind} files"
    return (
        f"--method {spec.method} runs the model on calibration data: IN must be an {need} model "
        f"({what} hold no graph to run); {elsewhere(spec.method)}"
    )


#: The solver settings the graph engine passes on (:func:`~arrayprune.adapters.pipeline.reconstruction.onnx_sparsegpt`).
_GRAPH_SETTINGS = ("block_size", "damp")


def reconstruct(job: Job, global_masks: Callable[[list[Any], Any], list[Any]]) -> Mapping:
    """The runner: the job's params with every target pruned and updated by the method's solver.

    Parameters
    ----------
    job : Job
        The job: an ONNX graph read whole (its ``wf`` is handed to the engine; not
        modified), a method with a solver; its hooks are told of the calibration.
    global_masks : callable
        ``global_masks(targets, spec)``: the pipeline's global ranking (keep masks),
        called when ``spec.global_``.

    Returns
    -------
    mapping
        The params, targets replaced (and their tied names with them).

    Raises
    ------
    PruneError
        Unreadable calibration data, data that does not fit the graph, a target the
        engine cannot reconstruct: one line; nothing is written.
    """
    storage, targets, spec, hooks = job.storage, job.targets, job.spec, job.hooks
    if storage.kind not in GRAPH_FORMATS:
        kind = storage.kind
        raise PruneError(f"--method {spec.method} writes {kind} as {kind}: give OUT the input's suffix", storage.src)
    optional_module("onnxruntime", "onnx", f"--method {spec.method}")
    try:
        calibration = read_calibration(spec.calibration)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.calibration) from None
    settings = dict(spec.method_options)  # a method object's settings without a flag
    unknown = sorted(set(settings) - set(_GRAPH_SETTINGS))
    if unknown:
        raise PruneError(
            f"--method {spec.method} through an ONNX graph takes {' and '.join(_GRAPH_SETTINGS)} of a method object, "
            f"not {', '.join(unknown)}",
            storage.src,
        )
    options: dict[str, Any] = {"amount": spec.amount, **settings}
    if spec.nm is not None:
        options = {"n": spec.nm[0], "m": spec.nm[1], **settings}
    elif spec.global_:
        masks = global_masks(targets, spec)
        options["amount"] = amounts_from_masks({t.name: mask for t, mask in zip(targets, masks, strict=True)})
    samples = len(next(iter(calibration.values())))
    how = "every Hessian from the dense model" if spec.one_pass else "layer by layer"
    hooks.stage(f"{spec.method}: {len(targets)} weights, {samples} calibration samples through onnxruntime, {how}")
    try:
        done = onnx_sparsegpt(
            storage.wf,
            [t.name for t in targets],
            calibration,
            **options,
            sequential=not spec.one_pass,
            batch_size=spec.calibration_batch,
            method=spec.method,
        )
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--method {spec.method}: {error_text(exc)}", storage.src) from None
    updated = {}
    for t in targets:
        updated[t.path] = done[t.name].weight
        updated.update(dict.fromkeys(t.tied, done[t.name].weight))
    return mp.replace(storage.params, updated)
