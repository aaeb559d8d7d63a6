"""``arrayprune eval``: next-token loss and perplexity of a Hugging Face causal LM, and its distance to the dense model.

::

    arrayprune eval MODEL --tokens tokens.npz [--compare DENSE] [--json OUT.json]
                    [--device {cpu,cuda,cuda:N}] [--batch N] [--force]

MODEL (and DENSE) is a folder with ``config.json`` and safetensors weights, sharded or
not; ``tokens.npz`` holds ``input_ids`` ``[sequences, seq]`` (and optionally
``attention_mask``), as ``--calibration`` does. The model runs one decoder layer at a
time (:mod:`arrayprune.adapters.pipeline.evaluate`). One line is printed: perplexity and
loss, and with ``--compare`` the mean KL divergence ``KL(dense || model)`` of the
next-token distributions and the mean cosine of the final hidden states. ``--json``
writes them (``perplexity``, ``loss``, ``kl_to_dense``, ``cosine_to_dense``, ``tokens``,
...) to a temporary file renamed into place.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from arrayprune.adapters.cli.scan import _check_output
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.evaluate import evaluate, write_json
from arrayprune.adapters.pipeline.hooks import Hooks

from .errors import CliError
from .tensors import _progress, _stage

__all__ = ["add_eval_parser", "run_eval"]


def add_eval_parser(sub: Any, positive: Callable[[str], int]) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to the parser's sub-parsers `sub`."""

    e = sub.add_parser("eval", help="next-token perplexity of a Hugging Face causal LM (and KL to the dense model)")
    e.add_argument("input", metavar="MODEL", help="Hugging Face folder (config.json + safetensors), never modified")
    e.add_argument("--tokens", metavar="NPZ", required=True, help="input_ids [sequences, seq] (and attention_mask)")
    e.add_argument(
        "--compare", metavar="DENSE", default=None, help="the dense model: KL(dense || MODEL) and hidden-state cosine"
    )
    e.add_argument("--json", metavar="OUT.json", default=None, help="write the figures as JSON")
    e.add_argument(
        "--device", default=None, metavar="DEVICE", help="cpu, cuda or cuda:N: where the layers run, one at a time"
    )
    e.add_argument("--batch", type=positive, default=None, metavar="N", help="sequences run at a time (default 8)")
    e.add_argument("--force", action="store_true", help="overwrite OUT.json if it exists")
    return e


def run_eval(args: argparse.Namespace) -> int:
    """Run ``arrayprune eval``: check, evaluate layer by layer, print one line (and write the JSON)."""

    src = args.input
    for path in (src, args.tokens, args.compare):
        if path is not None and not os.path.exists(path):
            raise CliError("no such file", path)
    _check_output(src, args.json, args.force, "--json")
    try:
        result = evaluate(
            src,
            args.tokens,
            compare=args.compare,
            device=args.device,
            batch=args.batch,
            hooks=Hooks(stage=_stage, progress=_progress),
        )
    except ValueError as exc:
        raise PruneError(error_text(exc), src) from None
    if args.json is not None:
        write_json(result, args.json)
    print(result.summary())
    return 0
