"""The method and the scores of each target: Wanda's input norms, and the one place that
builds the method instance an entry is pruned with."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from arrayprune.adapters.pipeline.calibration import (
    BATCH_SIZE,
    onnx_input_norms,
    read_calibration,
    read_input_norms,
    wanda_scores_for,
)
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.hooks import Hooks
from arrayprune.adapters.pipeline.request import PruneSpec, method_arguments
from arrayprune.adapters.pipeline.storage import WholeFile
from arrayprune.adapters.plan import PlanEntry, stream_seed

__all__ = ["input_norms", "method_for", "scores_for", "target_scores", "trial_request"]


def trial_request(method: str, *, sequential: bool = False, batch_size: int | None = None) -> PruneSpec:
    """The request a trial of candidate counts prunes with (``measure_allocations``): `method`,
    one pass over the dense model unless `sequential`, `batch_size` samples at a time; each
    trial gives its own counts."""
    return PruneSpec(method=method, amount=0.5, one_pass=not sequential, calibration_batch=batch_size)


def input_norms(
    spec: PruneSpec, storage: Any, targets: list[PlanEntry], src: str, hooks: Hooks = Hooks()
) -> dict[str, Any] | None:
    """Wanda's input norms of every target, from ``calibration`` or ``input_norms``; None without.

    Raises
    ------
    PruneError
        If calibration needs an ONNX model or onnxruntime, the data do not fit the
        model, or a target has no norms.
    """
    if spec.calibration:
        if not isinstance(storage, WholeFile) or storage.kind != "onnx":
            raise PruneError(
                "--calibration runs the model with onnxruntime: IN must be an ONNX model (or use --input-norms)", src
            )
        optional_module("onnxruntime", "onnx", "--calibration")
        try:
            calibration = read_calibration(spec.calibration)
        except ValueError as exc:
            raise PruneError(error_text(exc), spec.calibration) from None
        samples = len(next(iter(calibration.values())))
        batch = spec.calibration_batch or BATCH_SIZE
        hooks.stage(f"calibration: {samples} samples through onnxruntime, {batch} at a time")
        try:
            return onnx_input_norms(
                storage.wf,
                calibration,
                [t.name for t in targets],
                batch_size=spec.calibration_batch,
                progress=lambda items, desc: hooks.progress(items, desc, "batch"),
            )
        except ValueError as exc:
            raise PruneError(f"--calibration: {error_text(exc)}", src) from None
    if spec.input_norms:
        try:
            norms = read_input_norms(spec.input_norms)
        except ValueError as exc:
            raise PruneError(error_text(exc), spec.input_norms) from None
        missing = [t.name for t in targets if t.name not in norms]
        if missing:
            raise PruneError(f"no input norms for {missing[0]!r} (selected for pruning)", spec.input_norms)
        return norms
    return None


def target_scores(targets: list[PlanEntry], norms: Mapping | None, src: str) -> list[Any] | None:
    """Wanda's scores of every target (for global pruning); None without input norms."""
    if norms is None:
        return None
    try:
        return [wanda_scores_for(t.value, t.role, norms[t.name], t.name) for t in targets]
    except ValueError as exc:
        raise PruneError(error_text(exc), src) from None


def method_for(target: PlanEntry, spec: PruneSpec) -> Any:
    """The method instance that prunes `target` on its own: its axis, a seed from its name.

    With input norms, what it ranks by is :func:`scores_for`'s. An amount that maps names
    to amounts (an allocation's) gives the entry its own. This is the one place that builds
    the method of an entry.
    """
    if isinstance(spec.amount, Mapping):
        spec = dataclasses.replace(spec, amount=spec.amount[target.name])
    kwargs = method_arguments(spec, stream_seed(spec.seed, target.name), dim=target.dim)
    return spec.method_class()(**kwargs)


def scores_for(target: PlanEntry, norms: Mapping | None, value: Any) -> Any:
    """The importance scores `target` is ranked by, given its `value`: Wanda's scores with
    input norms, None (the value itself) without."""
    if norms is None:
        return None
    return wanda_scores_for(value, target.role, norms[target.name], target.name)
