"""The pipeline's stage for Hugging Face checkpoints calibrated layer by layer.

With ``--calibration tokens.npz`` on a safetensors checkpoint (``--method sparsegpt``, or
a method ranking by Wanda's scores), :func:`calibrated` runs
:func:`~arrayprune.adapters.pipeline.hf_calibration.calibrate_checkpoint` before the checkpoint is
written: the pruned weights wait in a temporary folder beside the output, and the
streaming writer (:func:`~arrayprune.adapters.pipeline.stream_pruning.prune_source`) writes them
in place of the stored ones. With ``--method sparsegpt --hessians hessians.npz`` on any
safetensors file or checkpoint, :func:`given_hessians` reconstructs each weight from its
given Hessian as the writer reaches it (no model is run). :func:`input_refusal` says why
an input cannot be calibrated on tokens, before anything is read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from arrayprune.adapters.formats import FormatError
from arrayprune.adapters.formats.errors import write_failure
from arrayprune.adapters.formats.files import read_json
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline.calibration import _read_npz, read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.hf_calibration import (
    _stored,
    calibrate_checkpoint,
    hf_folder,
    token_problems,
    workdir_beside,
)
from arrayprune.adapters.pipeline.job import Job
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.scoring import method_for, scores_for
from arrayprune.adapters.roles.hf_config import CONFIG_MAX_BYTES, CONFIG_NAME

__all__ = [
    "calibrated",
    "calibration_needed",
    "calibration_problems",
    "dense_input_norms",
    "given_hessians",
    "input_refusal",
]


def calibration_problems(spec: PruneSpec, src: str) -> list[Exception]:
    """Every problem ``config.json`` and the calibration file's tokens can tell, before a
    framework is imported: a config that cannot be read, a calibration file that cannot,
    a missing or unexpected array, token ids beyond ``vocab_size``, a bad attention mask.

    Parameters
    ----------
    spec : PruneSpec
        The request (``spec.calibration`` the token ids).
    src : str
        The Hugging Face folder (or its index).

    Returns
    -------
    list of Exception
        One :class:`~arrayprune.adapters.pipeline.request.PruneError` or
        :class:`~arrayprune.adapters.formats.FormatError` per problem, each one line.
    """

    folder = hf_folder(os.fspath(src))
    if not spec.calibration or folder is None:
        return []
    problems: list[Exception] = []
    vocab_size = None
    try:
        config = read_json(os.path.join(folder, CONFIG_NAME), CONFIG_MAX_BYTES, "config", "not a valid config.json")
    except FormatError as exc:
        problems.append(exc)
    else:
        value = config.get("vocab_size") if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            vocab_size = value
    try:
        arrays = read_calibration(spec.calibration)
    except FormatError as exc:
        return [*problems, exc]
    except ValueError as exc:
        return [*problems, PruneError(error_text(exc), spec.calibration)]
    return [*problems, *(PruneError(p, spec.calibration) for p in token_problems(arrays, vocab_size))]


#: The reason of a weight left because layer-by-layer calibration does not reach it.


def input_refusal(spec: PruneSpec, src: str, kind: str) -> str | None:
    """Why `src` (a ``"sharded"`` or ``"safetensors"`` `kind`) cannot be calibrated on tokens; None if it can."""
    if not spec.calibration or kind not in ("sharded", "safetensors"):
        return None
    if hf_folder(os.fspath(src)) is None:
        return (
            "--calibration runs the model: IN must be an ONNX model, or a Hugging Face folder (config.json beside "
            "the safetensors weights) run with transformers layer by layer on token ids"
            + ("" if reconstructs(spec.method) else " (or use --input-norms)")
        )
    return None


def calibration_needed(method: str, src: str) -> str:
    """Why `method` cannot run on the safetensors input `src` without calibration, and how to give it."""
    if hf_folder(os.fspath(src)) is not None:
        return (
            f"--method {method} needs calibration data on this Hugging Face folder: give --calibration tokens.npz "
            "(token ids, input_ids [batch, seq]; the model runs through transformers layer by layer), "
            "or --hessians hessians.npz (weight name -> K x K)"
        )
    return (
        f"--method {method} needs calibration data on this safetensors input: give --hessians hessians.npz "
        "(weight name -> K x K), or --calibration tokens.npz with a Hugging Face folder (config.json beside "
        "the weights) as IN"
    )


def _masking(target: Any, spec: PruneSpec, norms: Mapping, value: Any) -> tuple[Any, Any]:
    """The pipeline's method of `target` and the importance scores it ranks `value` by."""

    return method_for(target, spec), scores_for(target, norms, value)


def calibrated(job: Job, stack: contextlib.ExitStack) -> dict[str, Callable[[], np.ndarray]] | None:
    """The job's targets pruned layer by layer or from ``hessians`` (weight name -> its entries); None without either.

    The temporary folder (beside the job's output) lives as long as `stack`.

    Raises
    ------
    PruneError
        Missing transformers (naming the extra), bad token ids, a model that cannot be
        built or run, a target outside the model's layers: one line, nothing written.
    """
    storage, targets, spec, hooks, dst = job.storage, job.targets, job.spec, job.hooks, job.dst or ""
    if spec.hessians:
        return given_hessians(job, stack)
    if not spec.calibration:
        return None

    optional_module("transformers", "transformers", "--calibration on a Hugging Face checkpoint")
    try:
        workdir = stack.enter_context(workdir_beside(dst))
        return calibrate_checkpoint(storage, targets, spec, hooks, workdir, _masking)
    except OSError as exc:  # a full disk beside OUT: the folder of pruned layers goes with `stack`
        raise write_failure(dst, exc) from None
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:  # the model's own errors too
        raise PruneError(f"--calibration: {error_text(exc)}", storage.src) from None


def dense_input_norms(job: Job) -> dict[str, np.ndarray]:
    """Every target's input norms from the dense model run layer by layer on ``calibration``'s tokens.

    What ``--allocation owl`` ranks outliers by (Wanda's scores, as ONNX calibration
    gives them): one layer's weights and activations in memory at a time, nothing pruned
    or set aside.

    Raises
    ------
    PruneError
        As :func:`calibrated`.
    """

    storage, targets, spec, hooks = job.storage, job.targets, job.spec, job.hooks
    optional_module("transformers", "transformers", "--calibration on a Hugging Face checkpoint")
    norms: dict[str, np.ndarray] = {}
    hooks.stage("allocation: input norms of the dense model")
    try:
        calibrate_checkpoint(storage, targets, spec, hooks, "", _masking, recorded=norms)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:  # the model's own errors too
        raise PruneError(f"--calibration: {error_text(exc)}", storage.src) from None
    return norms


def given_hessians(job: Job, stack: contextlib.ExitStack) -> dict[str, Callable]:
    """``--hessians``: each target pruned by SparseGPT with its Hessian from the file, when written.

    Every Hessian is checked (present, ``K x K`` for the weight's reduction axis,
    finite, not all zero) before anything is written; each weight is read and reconstructed when the
    writer reaches it, so one weight is in memory at a time.

    Raises
    ------
    PruneError
        One line naming the weight or the file.
    """
    storage, targets, spec = job.storage, job.targets, job.spec

    try:
        hessians = _read_npz(spec.hessians)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.hessians) from None
    for entry in targets:
        axis = entry.role.reduction_axis
        if len(entry.shape) != 2 or axis is None:
            raise PruneError(f"{entry.name!r}: --hessians prunes 2-D weights with a known input axis", storage.src)
        k = entry.shape[axis]
        h = hessians.get(entry.name)
        if h is None:
            raise PruneError(f"no Hessian for {entry.name!r} (selected for pruning)", spec.hessians)
        if h.shape != (k, k) or h.dtype.kind != "f" or not np.isfinite(h).all():
            raise PruneError(
                f"the Hessian of {entry.name!r} must be finite floats of shape [{k}, {k}] (its {k} input features), "
                f"got {h.dtype} {list(h.shape)}",
                spec.hessians,
            )
        if not h.any():
            raise PruneError(
                f"the Hessian of {entry.name!r} is all zero: it says nothing about which weights matter", spec.hessians
            )
    files = stack.enter_context(TensorFiles())

    def reconstructed(entry: Any) -> Callable[[], np.ndarray]:
        def compute() -> np.ndarray:
            import torch

            value = files.load(entry.value)
            weight = value.to(torch.float32).numpy() if isinstance(value, torch.Tensor) else value
            method = job.method_for(entry)  # its amount (an allocation's, if any), or the pattern
            new, _ = method.reconstruct(weight, hessians[entry.name], reduction_axis=entry.role.reduction_axis)
            return _stored(torch.from_numpy(np.asarray(new, dtype=np.float32)), entry.value.code).reshape(-1)

        return compute

    return {entry.name: reconstructed(entry) for entry in targets}
