"""The allocation stage of the file pipeline: each weight's share of the pruning, ``prune --allocation``.

``--allocation scan.json`` reads the curves of a sensitivity scan
(:mod:`arrayprune.adapters.scan`) and gives each selected weight the count of entries
that minimises the summed predicted error (:func:`arrayprune.allocate_from_curves`);
``--allocation owl`` sets the counts from outlier ratios of the importance scores (OWL,
:func:`arrayprune.owl_allocation`): Wanda's ``|W| * ||X||`` where the calibration data give
input norms (``wanda``, ``sparsegpt``, or ``l1_unstructured`` with ``--calibration``), the
magnitudes otherwise. Either way the selected weights lose ``round(amount * n)`` entries
in all, each within ``--min-sparsity`` and ``--max-sparsity``.

A method that prunes the same number of entries from every output unit (``wanda``)
moves in steps of its number of output units, and ``ln_structured`` in whole channels;
the total is then the nearest the steps reach below it. The counts become the amounts
handed to each weight's method (:func:`arrayprune.adapters.pipeline.method_for`) or to
SparseGPT (a count per weight).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters.calibration import wanda_scores_for
from arrayprune.adapters.reconstruct_stage import RECONSTRUCTIONS
from arrayprune.adapters.request import PruneError, error_text
from arrayprune.method_parts import PER_OUTPUT, pattern_of

__all__ = ["ALLOCATED_METHODS", "OWL", "Allocation", "allocate", "check_allocation"]

#: The value of ``--allocation`` that asks for OWL instead of a scan's curves.
OWL = "owl"

#: The methods whose per-weight amounts an allocation sets.
ALLOCATED_METHODS = ("l1_unstructured", "wanda", "sparsegpt", "ln_structured")


@dataclass
class Allocation:
    """Each selected weight's share of the pruning.

    Attributes
    ----------
    source : str
        ``"owl"`` or the scan file.
    counts : dict of str to int
        Weight name to the entries it loses.
    sizes : dict of str to int
        Weight name to its entries.
    amounts : dict of str to int
        Weight name to the amount its method is given (entries; per output unit for
        ``wanda``; channels for ``ln_structured``).
    notes : list of str
        What the command says about it (a scan made with another method).
    """

    source: str
    counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    amounts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def sparsity(self, name: str) -> float:
        """The sparsity weight `name` is given."""
        return self.counts[name] / self.sizes[name] if self.sizes[name] else 0.0

    def describe(self) -> str:
        """One line per weight: its share, as a table for people."""
        width = max((len(n) for n in self.counts), default=6)
        lines = [f"{'weight'.ljust(width)}  sparsity  pruned/entries"]
        for name, k in self.counts.items():
            lines.append(f"{name.ljust(width)}  {100 * self.sparsity(name):7.2f}%  {k}/{self.sizes[name]}")
        total, n = sum(self.counts.values()), sum(self.sizes.values())
        lines.append(f"{'all'.ljust(width)}  {100 * total / n if n else 0.0:7.2f}%  {total}/{n}")
        return "\n".join(lines)


def check_allocation(spec: Any) -> str | None:
    """Why `spec`'s ``allocation`` does not apply, as one line naming the flags; None if it does."""
    allocation = spec.allocation
    if allocation is None:
        return None
    if not isinstance(allocation, str) or not allocation:
        return f"--allocation: expected a scan's JSON file or 'owl', got {allocation!r}"
    if spec.global_:
        return "--allocation sets each weight's sparsity and --global one threshold for all: pass one"
    if spec.shrink:
        return "--allocation does not apply to --shrink"
    if spec.method not in ALLOCATED_METHODS:
        return f"--allocation applies to {', '.join(ALLOCATED_METHODS)}, not {spec.method}"
    if spec.nm is not None:
        return "--allocation shares an --amount among weights; --nm N:M gives every weight the same pattern"
    if spec.amount is None:
        return "--allocation shares an --amount among weights: give --amount"
    channels = spec.method in arrayprune.METHODS and pattern_of(arrayprune.METHODS[spec.method]).unit == "channels"
    if allocation == OWL and channels:
        return "--allocation owl counts outlier entries: not for ln_structured (use a scan)"
    return None


def _step(target: Any, method: str) -> int:
    """Entries a weight loses at a time under `method`."""
    size = math.prod(target.shape)
    pattern = pattern_of(arrayprune.METHODS[method]) if method in arrayprune.METHODS else None
    if pattern is PER_OUTPUT:  # the same count from each output unit
        return int(target.shape[target.dim]) if size else 1
    if pattern is not None and pattern.unit == "channels":  # whole channels
        return size // int(target.shape[target.dim]) if size else 1
    return 1


def _owl_scores(spec: Any, storage: Any, targets: list[Any], norms: Mapping | None, src: str, hooks: Any) -> list[Any]:
    """The scores OWL counts outliers among: Wanda's where input norms exist, else magnitudes."""
    if norms is None and spec.method in RECONSTRUCTIONS:  # its Hessians' activations give the norms too
        from arrayprune.adapters.pipeline import input_norms

        norms = input_norms(spec, storage, targets, src, hooks)
    scores = []
    for t in targets:
        value = np.asarray(t.value)
        if norms is None:
            scores.append(np.abs(value))
            continue
        try:
            scores.append(np.asarray(wanda_scores_for(value, t.role, norms[t.name], t.name)))
        except ValueError as exc:
            raise PruneError(f"--allocation owl: {error_text(exc)}", src) from None
    return scores


def _scan_curves(spec: Any, targets: list[Any]) -> tuple[list[list[float]], tuple[float, ...], list[str]]:
    """The curves of the targets from the scan file, and what to note about them."""
    from arrayprune.adapters.scan import ScanResult

    try:
        scan = ScanResult.load(spec.allocation)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.allocation) from None
    curves = []
    for t in targets:
        try:
            curve = scan.curve(t.name)
        except KeyError:
            raise PruneError(
                f"no curve for {t.name!r} (selected for pruning): scan it with the same --include/--exclude",
                spec.allocation,
            ) from None
        if tuple(curve.shape) != tuple(t.shape):
            raise PruneError(f"{t.name!r} was scanned with shape {curve.shape}, not {t.shape}", spec.allocation)
        curves.append(list(curve.errors))
    notes = []
    if scan.method != spec.method:
        notes.append(f"--allocation: the scan measured {scan.method}; pruning with {spec.method}")
    return curves, scan.sparsities, notes


def allocate(spec: Any, storage: Any, targets: list[Any], norms: Mapping | None, src: str, hooks: Any) -> Allocation:
    """The stage: each target's count of pruned entries, from a scan's curves or OWL.

    Parameters
    ----------
    spec : PruneSpec
        The checked request (``spec.allocation`` set).
    storage : WholeFile
        The input, in memory.
    targets : list of PlanEntry
        The weights to prune.
    norms : mapping or None
        Wanda's input norms, where the request computed them.
    src : str
        The input, for messages.
    hooks : Hooks
        Told of the stage.

    Returns
    -------
    Allocation

    Raises
    ------
    PruneError
        An unreadable scan, a target without a curve, bounds that cannot hold the total.
    """
    sizes = [math.prod(t.shape) for t in targets]
    steps = [_step(t, spec.method) for t in targets]
    bounds = {"min_sparsity": spec.min_sparsity, "max_sparsity": spec.max_sparsity, "steps": steps}
    notes: list[str] = []
    try:
        if spec.allocation == OWL:
            hooks.stage(f"allocation: OWL over {len(targets)} weights")
            scores = _owl_scores(spec, storage, targets, norms, src, hooks)
            counts = arrayprune.owl_allocation(scores, spec.amount, **bounds)
        else:
            curves, sparsities, notes = _scan_curves(spec, targets)
            hooks.stage(f"allocation: {len(targets)} weights from the curves of {spec.allocation}")
            counts = arrayprune.allocate_from_curves(curves, sizes, spec.amount, sparsities=sparsities, **bounds)
            beyond = [t.name for t, k, n in zip(targets, counts, sizes, strict=True) if n and k / n > sparsities[-1]]
            if beyond:
                notes.append(
                    f"--allocation: {len(beyond)} weight(s) ({', '.join(beyond[:3])}) get more than the scan's last "
                    f"sparsity ({sparsities[-1]:g}), where their curves are extrapolated: scan up to it "
                    "(arrayprune scan --sparsities ...,0.95,0.98)"
                )
    except ValueError as exc:
        if isinstance(exc, PruneError):
            raise
        raise PruneError(f"--allocation: {error_text(exc)}", src) from None
    result = Allocation(spec.allocation, notes=notes)
    for t, n, k, step in zip(targets, sizes, counts, steps, strict=True):
        result.counts[t.name], result.sizes[t.name] = int(k), n
        result.amounts[t.name] = int(k) // step
    return result
