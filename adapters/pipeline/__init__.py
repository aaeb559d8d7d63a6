"""The file pipeline: what ``arrayprune prune`` runs, :func:`prune_file` from Python.

Its modules import downwards only, in seven layers (a test checks it:
``tests/project/test_import_graph.py``)::

    runner.py        the sequence of stages: prune_file, prune_checkpoint, run
       |
    stages           calibrate.py (the runners x statistics table), allocation.py,
       |             shrinking.py (--shrink, on a ShrinkJob): none imports another
       |
    runners          hf_stage.py (Hugging Face folders layer by layer, given Hessians),
       |             reconstruct_stage.py (a solver's Hessians through an ONNX graph),
       |             verify_stage.py (OUT run against IN), shrink_checkpoint.py,
       |             shrink_structure.py (a folder's channels, heads, layers, experts) and
       |             layer_choice.py (which decoder layers go, on calibration data)
       |
    the job          job.py (Job, ShrinkJob: the request resolved once on its input),
       |             storage.py (the input, opened), targets.py (the plan, what is pruned),
       |             scoring.py (each target's method and scores), prune_result.py (what a
       |             run returns), outputs.py (OUT checked), option_files.py (the files
       |             options name, checked), scan.py (error curves: the scan verb, allocations),
       |             hf_scan.py (a Hugging Face folder's error curves, layer by layer),
       |             evaluate.py (arrayprune eval: perplexity and KL of a Hugging Face folder),
       |             shrink_folder.py (a shrunk folder's report, and its writer)
       |
    engines          calibration.py (onnxruntime statistics), hf_calibration.py (transformers,
       |             layer by layer), reconstruction.py (SparseGPT through a graph),
       |             stream_pruning.py (tensor by tensor, in bounded memory)
       |
    the request      request.py (PruneSpec, validated once), method_names.py (the --method
       |             choices and flags), allocation_request.py, shrink_request.py,
       |             reconstruction_methods.py (the options of a method with a solver)
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
