"""The ``--verify`` stage: run the original model before OUT is written, then the output.

:func:`verify_inputs` prepares the inputs (``--verify-data``, else the first calibration
batch) and runs the original; :func:`compare_outputs` runs what was written on the same
inputs. Both turn a model's refusal into a one-line :class:`PruneError`.

On a Hugging Face folder (``config.json`` beside safetensors shards) ``--verify`` is
``arrayprune eval OUT --tokens T --compare IN`` instead (:func:`hf_verify_tokens` checks the
token ids before anything is written, :func:`evaluate_output` runs it after): perplexity
of both and KL / hidden-state cosine of OUT to IN, on ``--verify-data`` token ids (else the
``--calibration`` ones), layer by layer.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from arrayprune.adapters import verify
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.pipeline.calibration import BATCH_SIZE, _read_npz, read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.evaluate import EvalResult, evaluate
from arrayprune.adapters.pipeline.hf_calibration import hf_folder, token_problems
from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["compare_outputs", "evaluate_output", "evaluation_failed", "hf_verify_tokens", "verify_inputs"]


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


def hf_verify_tokens(spec: PruneSpec, src: str) -> str | None:
    """The token file ``--verify`` evaluates a Hugging Face folder on; None if `src` is not one or
    there is no ``--verify``. Checked against IN's vocabulary before anything is written.

    Raises
    ------
    PruneError
        No token ids given, ``--verify-tol`` (it gates ONNX outputs), bad token ids.
    """
    if not spec.verify or not sharded.is_sharded(src) or hf_folder(src) is None:
        return None
    tokens = spec.verify_data or spec.calibration
    if tokens is None:
        raise PruneError(
            "--verify on a Hugging Face folder measures perplexity and KL to IN on token ids: "
            "give --verify-data TOKENS.npz (input_ids [batch, seq]) or --calibration",
            src,
        )
    if spec.verify_tol is not None:
        raise PruneError("--verify-tol gates ONNX outputs; on a Hugging Face folder --verify reports perplexity and KL")
    try:
        with open(os.path.join(str(hf_folder(src)), "config.json"), "rb") as f:
            vocab = json.load(f).get("vocab_size")
        problems = token_problems(read_calibration(tokens), vocab if isinstance(vocab, int) else None)
    except (OSError, ValueError) as exc:
        raise PruneError(f"--verify: {error_text(exc)}", tokens) from None
    if problems:
        raise PruneError(f"--verify: {problems[0]}", tokens)
    return tokens


def evaluate_output(dst: str, src: str, tokens: str, device: str | None = None) -> EvalResult:
    """``arrayprune eval OUT --tokens TOKENS --compare IN``: what ``--verify`` reports on a Hugging Face folder."""
    try:
        return evaluate(dst, tokens, compare=src, device=device)
    except ValueError as exc:
        raise PruneError(f"--verify: {error_text(exc)}", dst) from None


def evaluation_failed(result: EvalResult) -> bool:
    """Whether OUT is broken: a perplexity or KL that is not finite."""
    return not all(math.isfinite(v) for v in (result.perplexity, result.kl_to_dense or 0.0))
