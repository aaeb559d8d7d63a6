"""The files the options of a request name, checked before the model is loaded.

:func:`option_file_problems` tells every problem of ``--calibration``, ``--hessians``,
``--verify-data``, ``--allocation-check-data`` (regular files), ``--input-norms`` (read:
finite, non-negative, covering the plan) and ``--allocation`` (a scan, read and
checked), without importing a framework, so that the pipeline reports them together with
the other mistakes of a request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.formats.files import _require_regular
from arrayprune.adapters.pipeline.calibration import read_input_norms
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.scan import ScanResult
from arrayprune.adapters.plan import PlanEntry

__all__ = ["option_file_problems", "problem_of"]


def problem_of(check: Callable[[], Any]) -> list[Exception]:
    """The one-line error `check` raises, as a list (empty if it raises none)."""
    try:
        check()
    except (PruneError, fmt.FormatError) as exc:
        return [exc]
    return []


def option_file_problems(
    spec: PruneSpec, plan: Sequence[PlanEntry] = (), *, calibration: bool = True
) -> list[Exception]:
    """Every problem of the files the options name that can be told before the model is
    loaded: each must be a regular file; input norms are read (small: one vector per
    weight) and must be finite, non-negative, and name every weight of `plan` pruned; a
    scan (``allocation``) is read and checked. No framework is imported.

    Parameters
    ----------
    spec : PruneSpec
        The checked request.
    plan : sequence of PlanEntry, optional
        The plan, where it is known before loading (headers): the weights input norms
        must cover.
    calibration : bool, default True
        Whether to check ``spec.calibration`` too (a Hugging Face folder's tokens are
        checked by :func:`~arrayprune.adapters.pipeline.hf_stage.calibration_problems`).

    Returns
    -------
    list of Exception
        One-line :class:`PruneError` or :class:`~arrayprune.adapters.formats.FormatError`
        per problem, in the order of the options.
    """
    problems: list[Exception] = []
    given = (spec.calibration if calibration else None, spec.hessians, spec.verify_data, spec.allocation_check_data)
    for path in given:
        if path:
            problems += problem_of(functools.partial(_require_regular, path))
    if spec.input_norms:
        try:
            norms = read_input_norms(spec.input_norms)
        except fmt.FormatError as exc:
            problems.append(exc)
        except ValueError as exc:
            problems.append(PruneError(error_text(exc), spec.input_norms))
        else:
            missing = [e.name for e in plan if e.prune and e.name not in norms]
            if missing:
                more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
                problems.append(
                    PruneError(f"no input norms for {missing[0]!r}{more} (selected for pruning)", spec.input_norms)
                )
    if spec.allocation and spec.allocation != "owl":

        try:
            ScanResult.load(spec.allocation)
        except ValueError as exc:
            problems.append(PruneError(error_text(exc), spec.allocation))
    return problems
