"""What a run of the file pipeline returns, and the notes and warnings it prints.

:class:`PruneResult` is what :func:`~arrayprune.adapters.pipeline.run` (and
``prune_file``) returns; :func:`count_note`, :func:`nearly_empty_warning` and
:func:`nm_warnings` are the lines the command prints on stderr about a request and its
result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.plan import PlanEntry, nm_shortfalls
from arrayprune.adapters.roles.onnx_groups import OnnxGroups
from arrayprune.adapters.summary import PruneSummary
from arrayprune.method_parts import pattern_of

__all__ = ["NEARLY_EMPTY", "PruneResult", "count_note", "nearly_empty_warning", "nm_warnings"]

#: Sparsity from which global pruning warns that it emptied a tensor.
NEARLY_EMPTY = 0.99


@dataclass
class PruneResult:
    """What a run planned, wrote and counted, and what to warn about.

    Attributes
    ----------
    src, dst : str
        Input and output (``dst`` None for a dry run).
    kind : str
        The input's format (``"onnx"``, ``"sharded safetensors"``, ...).
    spec : PruneSpec
        The request, its defaults filled in.
    plan : list of PlanEntry
        Every tensor, its role, and whether it was (or would be) pruned.
    written : PruneSummary or None
        Counts of the pruned tensors and of the whole output, each pruned tensor's
        ``(zeros, size)``, the files written and those left (None for a dry run).
    tied : int
        Other names of the pruned tensors (tied weights), pruned with them.
    shards, copied : int
        A sharded input's shards and the other files copied with them.
    notes, warnings : list of str
        What the command prints on stderr: an integer amount is a count; global
        pruning left a tensor :data:`NEARLY_EMPTY` or more.
    verify : list of OutputCheck or None
        ``verify``: each output of the pruned model against the original's.
    verify_sizes : dict
        ``verify`` on random inputs: the sizes chosen for symbolic dimensions.
    shrink : ShrinkResult or None
        ``shrink``: groups, channels kept, parameters (:mod:`arrayprune.adapters.pipeline.shrinking`).
    allocation : Allocation or None
        ``allocation``: each weight's share (:mod:`arrayprune.adapters.pipeline.allocation`).
    evaluation : EvalResult or None
        ``verify`` on a Hugging Face folder: OUT's perplexity, KL and cosine to IN
        (:mod:`arrayprune.adapters.pipeline.evaluate`).
    """

    src: str
    dst: str | None
    kind: str
    spec: PruneSpec
    plan: list[PlanEntry]
    written: PruneSummary | None = None
    tied: int = 0
    shards: int = 0
    copied: int = 0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    verify: list[Any] | None = None
    verify_sizes: dict[str, int] = field(default_factory=dict)
    shrink: Any = None
    allocation: Any = None
    evaluation: Any = None

    @property
    def targets(self) -> list[PlanEntry]:
        """The entries of the plan that were (or would be) pruned."""
        return [e for e in self.plan if e.prune]

    @property
    def verify_failed(self) -> list[str]:
        """The outputs that failed ``verify`` (empty without ``verify``)."""
        return [c.name for c in self.verify or () if not c.passed]


def count_note(spec: PruneSpec) -> str | None:
    """Say that an integer amount is a count (of what, and per what), not a fraction; None otherwise."""
    amount = spec.amount
    if not isinstance(amount, int) or isinstance(amount, bool) or amount == 0:
        return None
    cls = spec.method_class()
    unit = pattern_of(cls).unit
    where = "in total over the selected tensors (--global)" if spec.global_ else "in each tensor"
    return (
        f"--amount {amount} is a count, not a fraction: {amount} {unit} pruned {where}; "
        "a fraction has a decimal point (0.5 is half)"
    )


def nearly_empty_warning(spec: PruneSpec, counts: Mapping[str, tuple[int, int]]) -> str | None:
    """The warning when global pruning left a tensor :data:`NEARLY_EMPTY` zero or more; None otherwise."""
    if not spec.global_:
        return None
    empty = [(name, z / n) for name, (z, n) in counts.items() if n and z / n >= NEARLY_EMPTY]
    if not empty:
        return None
    shown = ", ".join(f"{name} ({100 * f:.2f}%)" for name, f in empty[:5])
    more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
    return (
        f"--global pruned {len(empty)} tensor{'s' if len(empty) > 1 else ''} to {100 * NEARLY_EMPTY:g}% or more: "
        f"{shown}{more}; such a layer passes almost nothing on: cap every tensor with --max-sparsity "
        "(e.g. --max-sparsity 0.9) or leave it with --exclude"
    )


def nm_warnings(spec: PruneSpec, plan: Sequence[PlanEntry]) -> list[str]:
    """One warning per tensor an N:M method prunes that cannot hold the pattern (see
    :func:`~arrayprune.adapters.plan.nm_shortfalls`); none for other methods."""
    if spec.nm is None:  # set for the methods that take --nm only
        return []
    n, m = spec.nm
    return [f"cannot hold {n}:{m}: {line}" for line in nm_shortfalls(plan, n, m, reduction=spec.dim is None)]


@dataclass(frozen=True)
class ShrinkResult:
    """What the shrink stage found and did: ``PruneResult.shrink``.

    Attributes
    ----------
    groups : OnnxGroups
        The channel groups of the graph and the producers left, with reasons.
    amount : int or float or None
        The amount each group lost (None: a dry run without one).
    kept : dict of str to list of int, or None
        Per group name, the channels kept, ascending (None for a dry run).
    params_before, params_after : int or None
        Entries of all initializers of the main graph, before and after (None for a dry run).
    rounding : str
        How a fraction became each ONNX group's count (``"nearest"``, ``"keep_floor"``).
    score : str or None
        What ranked the units when it is not the request's method: layers and experts
        have their own (``"residual_change"``, ``"router_statistics"``, their weights'
        ``"ln_structured"``), the name the provenance record gives.
    """

    groups: OnnxGroups
    amount: int | float | None = None
    kept: dict[str, list[int]] | None = None
    params_before: int | None = None
    params_after: int | None = None
    rounding: str = "nearest"
    score: str | None = None

    def describe(self) -> str:
        """Each group (members, channels before and after the amount) and each producer left, one a line."""
        if self.rounding != "nearest":
            return self.groups.describe(self.amount, rounding=self.rounding)
        return self.groups.describe(self.amount)


def shrink_notes(spec: PruneSpec, unit: str = "channels", where: str | None = None) -> list[str]:
    """What to tell of a shrink request's amount: a count given where a fraction was likely meant.

    `unit` names what is counted (plural); `where`, where from (by default each channel
    group, or all of them with ``--global``).
    """
    amount = spec.amount
    if not isinstance(amount, int) or isinstance(amount, bool) or amount == 0:
        return []
    if where is None:
        where = "in total over the channel groups (--global)" if spec.global_ else "from each channel group"
    else:
        where = f"from {where}"
    counted = unit if amount != 1 else unit.removesuffix("s")
    return [
        f"--amount {amount} is a count, not a fraction: {amount} {counted} removed {where}; "
        "a fraction has a decimal point (0.5 is half)"
    ]
