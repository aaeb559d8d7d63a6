"""The plan of a request on an opened input: what each tensor is, and what is pruned.

:func:`plan_for` plans (the method's axes checked against the shapes; on a Hugging Face
checkpoint, the weights layer-by-layer calibration cannot reach left);
:func:`selected_targets` is the plan's entries to prune, or the error that there are none.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.hf_calibration import _skeleton, hf_folder
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.storage import StreamedCheckpoint
from arrayprune.adapters.plan import PlanEntry, make_plan
from arrayprune.amount import normalize_dim

__all__ = ["OUTSIDE", "leave_outside_layers", "outside_note", "plan_for", "selected_targets"]

#: The reason the plan gives for a weight that layer-by-layer calibration does not reach.
OUTSIDE = "outside the model's layers: calibrated layer by layer, only the weights inside them are pruned"


def plan_for(storage: Any, spec: PruneSpec, *, reach: bool = True) -> list[PlanEntry]:
    """The plan of the request; a ``--dim`` out of range for a selected weight is refused.

    With `reach` (the default), weights that layer-by-layer calibration cannot reach are
    left (:func:`leave_outside_layers`, which builds the
    model's skeleton with transformers); without, the plan needs no framework, for the
    checks made before one is imported.
    """
    plan = make_plan(
        storage.params,
        storage.roles,
        method=spec.method,
        include=spec.include,
        exclude=spec.exclude,
        min_size=spec.min_size,
        dim=spec.dim,
        nm=spec.nm is not None,
    )
    for e in plan:
        if e.prune and e.dim is not None and e.shape:
            try:
                normalize_dim(e.shape, e.dim)
            except (IndexError, TypeError) as exc:  # the method's own refusal, before any stage uses the axis
                raise PruneError(f"tensor {e.name!r}: {error_text(exc)}", storage.src) from None
    if reach and isinstance(storage, StreamedCheckpoint):  # calibrated layer by layer: what it reaches
        plan = leave_outside_layers(storage, spec, plan)
    return plan


def selected_targets(plan: list[PlanEntry], src: str) -> list[PlanEntry]:
    targets = [e for e in plan if e.prune]
    if not targets:
        raise PruneError("no tensor selected for pruning (see --include, --exclude, --min-size)", src)
    return targets


def leave_outside_layers(storage: Any, spec: PruneSpec, plan: list[Any]) -> list[Any]:
    """`plan` with the weights outside the model's decoder (or encoder) layers left, when calibrated on tokens.

    `storage` is a safetensors checkpoint (one file or sharded).

    Layer by layer, calibration reaches the weights inside the repeated layers only; the
    others the plan selects (``lm_head``, a pooler, classifier heads) are left with the
    reason :data:`OUTSIDE` and copied unchanged, as llmcompressor leaves ``lm_head``. Any
    other request: `plan` as it is.

    Raises
    ------
    PruneError
        Missing transformers, or a ``config.json`` transformers cannot build: one line.
    """
    if not spec.calibration or spec.hessians:
        return plan
    if not any(entry.prune for entry in plan) or hf_folder(os.fspath(storage.src)) is None:
        return plan
    from arrayprune.adapters.torch.calibration import layer_list  # torch, once a model is built

    try:
        prefix, layers = layer_list(*_skeleton(hf_folder(os.fspath(storage.src))))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise PruneError(f"--calibration: {error_text(exc)}", storage.src) from None
    inside = {f"{prefix}.{index}." if prefix else f"{index}." for index in range(len(layers))}
    return [
        dataclasses.replace(entry, prune=False, reason=OUTSIDE)
        if entry.prune and not any(entry.name.startswith(p) for p in inside)
        else entry
        for entry in plan
    ]


def outside_note(plan: list[Any]) -> str | None:
    """The note naming the weights :func:`leave_outside_layers` left; None if it left none."""
    left = [entry.name for entry in plan if entry.reason == OUTSIDE]
    if not left:
        return None
    shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return (
        f"left {len(left)} weight{'s' if len(left) > 1 else ''} outside the model's layers unchanged ({shown}): "
        "calibration layer by layer does not reach them"
    )
