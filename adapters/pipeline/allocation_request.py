"""The request's ``--allocation`` options, checked: which apply, together with what.

The allocation itself is :mod:`arrayprune.adapters.pipeline.allocation`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import arrayprune
from arrayprune.adapters.pipeline.method_names import scan_methods
from arrayprune.method_parts import pattern_of

if TYPE_CHECKING:  # the request module imports this one
    from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["OWL", "check_allocation"]

#: The value of ``--allocation`` that asks for OWL instead of a scan's curves.
OWL = "owl"


def check_allocation(spec: PruneSpec) -> str | None:
    """Why `spec`'s ``allocation`` does not apply, as one line naming the flags; None if it does."""
    allocation = spec.allocation
    owl_flags = [f for f, v in (("--owl-m", spec.owl_m), ("--owl-lambda", spec.owl_lambda)) if v is not None]
    if owl_flags and allocation != OWL:
        return f"{owl_flags[0]} applies to --allocation owl"
    if spec.allocation_check_data is not None:
        if allocation is None or allocation == OWL:
            return "--allocation-check-data: samples to check a scan's allocation jointly: add --allocation SCAN.json"
        if not spec.allocation_check:
            return "--allocation-check-data gives the joint check its samples, --no-allocation-check skips it: pass one"
    if allocation is None:
        return None
    if not isinstance(allocation, str) or not allocation:
        return f"--allocation: expected a scan's JSON file or 'owl', got {allocation!r}"
    if spec.global_:
        return "--allocation sets each weight's sparsity and --global one threshold for all: pass one"
    if spec.shrink:
        return "--allocation does not apply to --shrink"
    allocated = scan_methods()  # the methods a scan's curves can be made with
    if spec.method not in allocated:
        return f"--allocation applies to {', '.join(allocated)}, not {spec.method}"
    if spec.nm is not None:
        return "--allocation shares an --amount among weights; --nm N:M gives every weight the same pattern"
    if spec.amount is None:
        return "--allocation shares an --amount among weights: give --amount"
    channels = spec.method in arrayprune.METHODS and pattern_of(arrayprune.METHODS[spec.method]).unit == "channels"
    if allocation == OWL and channels:
        return "--allocation owl counts outlier entries: not for ln_structured (use a scan)"
    return None
