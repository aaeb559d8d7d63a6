"""The plan of a request on an opened input: what each tensor is, and what is pruned.

:func:`plan_for` plans (the method's axes checked against the shapes; on a Hugging Face
checkpoint, the weights layer-by-layer calibration cannot reach left);
:func:`selected_targets` is the plan's entries to prune, or the error that there are none.
"""

from __future__ import annotations

from typing import Any

from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.hf_stage import leave_outside_layers
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.storage import StreamedCheckpoint
from arrayprune.adapters.plan import PlanEntry, make_plan
from arrayprune.amount import normalize_dim

__all__ = ["plan_for", "selected_targets"]


def plan_for(storage: Any, spec: PruneSpec, *, reach: bool = True) -> list[PlanEntry]:
    """The plan of the request; a ``--dim`` out of range for a selected weight is refused.

    With `reach` (the default), weights that layer-by-layer calibration cannot reach are
    left (:func:`~arrayprune.adapters.pipeline.hf_stage.leave_outside_layers`, which builds the
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
