"""A request resolved once against its opened input: the job every stage takes.

Two kinds: :class:`Job` prunes tensors (a plan of targets), :class:`ShrinkJob` removes
units (channel groups, heads, layers, experts); the runner resolves either.

:class:`~arrayprune.adapters.pipeline.request.PruneSpec` is what was asked, plain data
checked once. A :class:`Job` is what that means for one input: the storage opened, the
plan and its targets, the method that prunes each target, the statistic of calibration
data the method needs, and where the result goes. The runner resolves it once
(:meth:`Job.resolve`); the stages after it (calibrate, allocation, prune and write) take
the job and read what they need from it, so none of them decides again what the
request means.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.pipeline.errors import PruneError
from arrayprune.adapters.pipeline.hooks import Hooks
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.request import PruneSpec, method_arguments
from arrayprune.adapters.pipeline.scoring import method_for
from arrayprune.adapters.pipeline.shrink_request import format_refusal
from arrayprune.adapters.pipeline.storage import StreamedCheckpoint, WholeFile
from arrayprune.adapters.pipeline.targets import selected_targets
from arrayprune.adapters.plan import PlanEntry
from arrayprune.method_parts import prunes_units, score_of

__all__ = ["Job", "ShrinkJob"]


@dataclass(frozen=True)
class Job:
    """One prune run: the checked request on its opened input.

    Attributes
    ----------
    spec : PruneSpec
        The checked request (with the per-target amounts of an allocation, once made).
    storage : WholeFile or StreamedCheckpoint
        The input, opened.
    plan : list of PlanEntry
        Every tensor, with what happens to it.
    targets : list of PlanEntry
        The tensors pruned (the plan's selected entries).
    hooks : Hooks
        Stage announcements and progress bars.
    dst : str, optional
        The output (None for a dry run).
    out_format : str, optional
        The output's format, for a file read whole.
    """

    spec: PruneSpec
    storage: WholeFile | StreamedCheckpoint
    plan: list[PlanEntry]
    targets: list[PlanEntry]
    hooks: Hooks = Hooks()
    dst: str | None = None
    out_format: str | None = None

    @classmethod
    def resolve(
        cls,
        spec: PruneSpec,
        storage: WholeFile | StreamedCheckpoint,
        plan: list[PlanEntry],
        hooks: Hooks = Hooks(),
        dst: str | None = None,
        out_format: str | None = None,
    ) -> Job:
        """The job of the checked `spec` on `storage` with its `plan`, the targets selected from it.

        Raises
        ------
        PruneError
            If the plan selects no tensor.
        """
        return cls(spec, storage, plan, selected_targets(plan, storage.src), hooks, dst, out_format)

    @property
    def src(self) -> str:
        """The input's path."""
        return self.storage.src

    @property
    def streamed(self) -> bool:
        """Whether the input is pruned tensor by tensor (a safetensors file or a sharded checkpoint)."""
        return isinstance(self.storage, StreamedCheckpoint)

    @property
    def statistic(self) -> str | None:
        """The statistic of calibration data the method needs (:attr:`Score.statistic
        <arrayprune.method_parts.Score.statistic>`): None, ``"input_norms"`` or ``"hessian"``."""
        return score_of(self.spec.method_class()).statistic

    @property
    def solves(self) -> bool:
        """Whether the method carries a solver that updates the weights it keeps."""
        return reconstructs(self.spec.method)

    def method_for(self, target: PlanEntry) -> Any:
        """The method instance that prunes `target` on its own (its axis, its seed, its amount)."""
        return method_for(target, self.spec)

    def with_amounts(self, amounts: Mapping[str, int]) -> Job:
        """This job with each target's own amount (an allocation's), by name."""
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, amount=dict(amounts)))

    def with_spec(self, **changes: Any) -> Job:
        """This job with the request's fields `changes` replaced."""
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, **changes))


#: The units whose score is their own (router statistics, residual change), not ``--method``'s.
WHOLE_UNITS = ("layers", "experts")


@dataclass(frozen=True)
class ShrinkJob:
    """One shrink run: the checked request with ``shrink`` on its input, of a known format.

    Attributes
    ----------
    spec : PruneSpec
        The checked request.
    src : str
        The input's path.
    kind : str
        Its format as the pipeline names it (``"onnx"``, ``"sharded safetensors"``).
    hooks : Hooks
        Stage announcements.
    dst : str, optional
        The output (None for a dry run).
    """

    spec: PruneSpec
    src: str
    kind: str
    hooks: Hooks = Hooks()
    dst: str | None = None

    @property
    def groups(self) -> str:
        """What a unit is: ``"channels"`` (the default), ``"heads"``, ``"layers"`` or ``"experts"``."""
        return self.spec.groups or "channels"

    @property
    def whole_units(self) -> bool:
        """Whether the units are layers or experts, ranked by their own score."""
        return self.groups in WHOLE_UNITS

    @property
    def calibrated(self) -> bool:
        """Whether the method scores units on calibration data and refits their consumer
        (:func:`~arrayprune.method_parts.prunes_units`)."""
        return prunes_units(self.spec.method_class())

    def channel_arguments(self) -> dict[str, Any]:
        """The constructor arguments of the method that scores each channel group by its
        weights, but the amount and the axis (each group gives its members' own)."""
        args = method_arguments(self.spec, self.spec.seed)
        args.pop("amount", None)
        args.pop("dim", None)
        return args

    @classmethod
    def resolve(cls, spec: PruneSpec, src: str, dst: str | None = None, hooks: Hooks = Hooks()) -> ShrinkJob:
        """The shrink job of `spec` (checked here) on the input `src`, its format detected.

        Raises
        ------
        PruneError
            For options that cannot go with ``shrink``, or an input of a format that
            cannot be shrunk (:func:`~arrayprune.adapters.pipeline.shrink_request.format_refusal`).
        """
        spec = spec.checked()
        kind = "sharded safetensors" if sharded.is_sharded(src) else fmt.detect_format(src)
        refused = format_refusal(kind, spec)
        if refused:
            raise PruneError(refused, src)
        return cls(spec, src, kind, hooks, dst)
