"""The pipeline's stage for Hugging Face checkpoints calibrated layer by layer.

With ``--calibration tokens.npz`` on a safetensors checkpoint (``--method sparsegpt``, or
a method ranking by Wanda's scores), :func:`calibrated` runs
:func:`~arrayprune.adapters.hf_calibration.calibrate_checkpoint` before the checkpoint is
written: the pruned weights wait in a temporary folder beside the output, and the
streaming writer (:func:`~arrayprune.adapters.stream_pruning.prune_source`) writes them
in place of the stored ones. :func:`input_refusal` says why an input cannot be
calibrated so, before anything is read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from arrayprune.adapters.hf_calibration import calibrate_checkpoint, hf_folder, workdir_beside

__all__ = ["calibrated", "input_refusal"]


def input_refusal(spec: Any, src: str, kind: str) -> str | None:
    """Why `src` (a ``"sharded"`` or ``"safetensors"`` `kind`) cannot be calibrated on tokens; None if it can."""
    if not spec.calibration or kind not in ("sharded", "safetensors"):
        return None
    if hf_folder(os.fspath(src)) is None:
        return (
            "--calibration on a safetensors checkpoint runs it with transformers, layer by layer: IN must be a "
            "Hugging Face folder (config.json beside the weights)"
        )
    return None


def calibrated(
    storage: Any,
    targets: list[Any],
    spec: Any,
    hooks: Any,
    dst: str,
    stack: contextlib.ExitStack,
    method_for: Callable[[Any, Any, Mapping], Any],
) -> dict[str, Callable[[], np.ndarray]] | None:
    """The targets pruned layer by layer (weight name -> its entries), or None without ``calibration``.

    The temporary folder lives as long as `stack`.

    Raises
    ------
    PruneError
        Missing transformers (naming the extra), bad token ids, a model that cannot be
        built, a target outside the model's layers: one line, nothing written.
    """
    if not spec.calibration:
        return None
    from arrayprune.adapters.request import PruneError, error_text, optional_module

    optional_module("transformers", "transformers", "--calibration on a Hugging Face checkpoint")
    workdir = stack.enter_context(workdir_beside(dst))
    try:
        return calibrate_checkpoint(storage, targets, spec, hooks, workdir, method_for)
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--calibration: {error_text(exc)}", storage.src) from None
