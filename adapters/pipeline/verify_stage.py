"""The ``--verify`` stage: run the original model before OUT is written, then the output.

:func:`verify_inputs` prepares the inputs (``--verify-data``, else the first calibration
batch) and runs the original; :func:`compare_outputs` runs what was written on the same
inputs. Both turn a model's refusal into a one-line :class:`PruneError`.
"""

from __future__ import annotations

from typing import Any

from arrayprune.adapters import verify
from arrayprune.adapters.pipeline.calibration import BATCH_SIZE, _read_npz, read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["compare_outputs", "verify_inputs"]


def verify_inputs(spec: PruneSpec, src: str, original: Any = None) -> Any:
    """Run the original model (`src`, or `original` in memory) on the ``verify`` inputs, before anything is written."""

    data = None
    if spec.verify_data:
        try:
            data = _read_npz(spec.verify_data)
        except ValueError as exc:
            raise PruneError(error_text(exc), spec.verify_data) from None
    elif spec.calibration:
        data = {k: v[:BATCH_SIZE] for k, v in read_calibration(spec.calibration).items()}
    try:
        return verify.prepare(src if original is None else original, data=data, seed=spec.seed)
    except ValueError as exc:
        raise PruneError(f"--verify: {error_text(exc)}", spec.verify_data or src) from None


def compare_outputs(prepared: Any, dst: str, tol: tuple[float, float]) -> list[Any]:
    """Run the pruned model on the prepared inputs: each output's check."""

    try:
        return verify.compare(dst, prepared, tol)
    except ValueError as exc:
        raise PruneError(f"--verify: {error_text(exc)}", dst) from None
