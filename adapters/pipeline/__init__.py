"""The file pipeline: what ``arrayprune prune`` runs, :func:`prune_file` from Python.

Its modules import downwards only, in six layers (a test checks it:
``tests/project/test_import_graph.py``)::

    runner.py        the sequence of stages: prune_file, prune_checkpoint, run
       |
    stages           targets.py (the plan, what is pruned), outputs.py, option_files.py,
       |             verify_stage.py, hf_stage.py (Hugging Face folders), reconstruct_stage.py
       |             (SparseGPT on a graph), allocation.py, scan.py, shrinking.py and
       |             shrink_checkpoint.py (--shrink on ONNX and on folders)
       |
    the job          storage.py (the input, opened), scoring.py (each target's method and
       |             scores), prune_result.py (what a run returns), evaluate.py (arrayprune
       |             eval: perplexity and KL of a Hugging Face folder, layer by layer)
       |
    engines          calibration.py (onnxruntime statistics), hf_calibration.py (transformers,
       |             layer by layer), reconstruction.py (SparseGPT through a graph),
       |             stream_pruning.py (tensor by tensor, in bounded memory)
       |
    the request      request.py (PruneSpec, validated once), method_names.py (the --method
       |             choices and flags), allocation_request.py, shrink_request.py,
       |             reconstruction_methods.py (which methods reconstruct, their options)
       |
    errors.py, hooks.py, devices.py    one-line errors; stages and progress; --device

Below the package: :mod:`arrayprune.adapters.plan`, ``roles/``, ``formats/``,
``mapping.py`` and the core. Above it: the command line (``cli/``). This module exports
the entry points of :mod:`.runner` when first used, so that importing one stage does not
import them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import (
        NEARLY_EMPTY,
        Hooks,
        PruneError,
        PruneResult,
        PruneSpec,
        StreamedCheckpoint,
        WholeFile,
        check_arrays,
        input_norms,
        method_for,
        open_storage,
        prune_checkpoint,
        prune_file,
        run,
        scores_for,
    )

__all__ = [
    "NEARLY_EMPTY",
    "Hooks",
    "PruneError",
    "PruneResult",
    "PruneSpec",
    "StreamedCheckpoint",
    "WholeFile",
    "check_arrays",
    "input_norms",
    "method_for",
    "open_storage",
    "prune_checkpoint",
    "prune_file",
    "run",
    "scores_for",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
