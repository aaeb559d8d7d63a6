"""``arrayprune scan``: each weight pruned alone, the model's output change measured, written as JSON (and drawn).

::

    arrayprune scan IN --calibration calib.npz -o scan.json [--plot scan.png]
                    [--method {l1_unstructured,wanda,sparsegpt,ln_structured}] [--sparsities 0.1,0.3,...]
                    [--include PATTERN ...] [--exclude PATTERN ...] [--min-size N] [--outputs NAME ...]
                    [--calibration-batch N] [--device DEV] [--force]

IN is an ONNX model (run by onnxruntime), or a Hugging Face folder (``config.json`` beside
safetensors weights) with ``--calibration`` a ``.npz`` of token ids ``input_ids``, run
decoder layer by decoder layer (:mod:`arrayprune.adapters.pipeline.hf_scan`). Other formats
hold no graph to run: from
Python, :func:`arrayprune.adapters.pipeline.scan.scan_arrays` scans a mapping of arrays with a
forward function of your own. Everything is checked before the scan runs; ``scan.json``
and the PNG are written to temporary files renamed into place.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.pipeline.calibration import read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.hf_calibration import hf_folder
from arrayprune.adapters.pipeline.hf_scan import scan_hf
from arrayprune.adapters.pipeline.outputs import check_not_input, check_output_name
from arrayprune.adapters.pipeline.scan import DEFAULT_SPARSITIES, check_sparsities, scan_methods, scan_onnx
from arrayprune.adapters.plots import plot_scan

from .errors import CliError
from .tensors import _progress, _stage

__all__ = ["add_scan_parser", "run_scan"]


def _sparsities(text: str) -> tuple[float, ...]:

    try:
        return check_sparsities(p for p in text.split(",") if p.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def add_scan_parser(
    sub: Any, fraction: Callable[[str], float], non_negative: Callable[[str], int], positive: Callable[[str], int]
) -> argparse.ArgumentParser:
    """Add the ``scan`` sub-command to the parser's sub-parsers `sub`."""

    s = sub.add_parser("scan", help="prune each weight alone at several sparsities and measure the output change")
    s.add_argument("input", metavar="IN", help="ONNX model or Hugging Face folder to scan (never modified)")
    s.add_argument("-o", "--output", metavar="SCAN.json", required=True, help="the curves, as JSON")
    s.add_argument(
        "--calibration",
        metavar="NPZ",
        required=True,
        help="graph input name -> samples along axis 0 (a Hugging Face folder: input_ids [batch, seq])",
    )
    s.add_argument("--plot", metavar="PNG", default=None, help="draw the curves (matplotlib: arrayprune[plot])")
    s.add_argument("--method", choices=scan_methods(), default="l1_unstructured", help="default: %(default)s")
    default = ",".join(f"{v:g}" for v in DEFAULT_SPARSITIES)
    s.add_argument(
        "--sparsities",
        type=_sparsities,
        default=DEFAULT_SPARSITIES,
        metavar="S1,S2,...",
        help=f"at least five, ascending, in (0, 1) (default: {default})",
    )
    s.add_argument("--include", action="extend", nargs="+", default=[], metavar="PATTERN", help="as for prune")
    s.add_argument("--exclude", action="extend", nargs="+", default=[], metavar="PATTERN", help="as for prune")
    s.add_argument("--min-size", type=non_negative, default=0, metavar="N", help="leave tensors with fewer entries")
    s.add_argument(
        "--outputs",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME",
        help="the values compared: graph outputs or any value of the graph, e.g. the logits before a Softmax "
        "(default: every floating-point graph output)",
    )
    s.add_argument("--calibration-batch", type=positive, default=None, metavar="N", help="samples run at a time")
    s.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="a Hugging Face folder: cpu, cuda or cuda:N, where the layers run, one at a time",
    )
    s.add_argument("--force", action="store_true", help="overwrite SCAN.json and PNG if they exist")
    return s


def _check_output(src: str, path: str | None, force: bool, flag: str) -> None:

    if path is None:
        return
    check_output_name(path, flag)
    check_not_input(src, path, flag, in_place=False)
    if os.path.isdir(path):
        raise CliError(f"{flag}: is a directory", path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise CliError(f"{flag}: folder does not exist", path)
    if os.path.exists(path) and not force:
        raise CliError(f"{flag}: exists; use --force to overwrite it", path)


def run_scan(args: argparse.Namespace) -> int:
    """Run ``arrayprune scan``: check everything, scan, write the JSON (and the PNG), print the ranking."""

    src = args.input
    if not os.path.exists(src):
        raise CliError("no such file", src)
    _check_output(src, args.output, args.force, "-o")
    _check_output(src, args.plot, args.force, "--plot")
    if args.plot is not None and os.path.abspath(args.plot) == os.path.abspath(args.output):
        raise CliError("--plot and -o name the same file", args.plot)
    kind = "sharded safetensors" if os.path.isdir(src) else fmt.detect_format(src)
    folder = hf_folder(src) if kind != "onnx" else None
    if folder is not None:
        return _scan_folder(args, folder)
    if args.device is not None and kind == "onnx":
        raise CliError("--device: a scan of an ONNX model runs onnxruntime on the CPU (--device is for a Hugging "
                       "Face folder)", src)  # fmt: skip
    if kind != "onnx":
        raise CliError(
            f"scan runs the model on calibration data: IN must be an ONNX model ({kind} files hold no graph to run); "
            "from Python, arrayprune.adapters.pipeline.scan.scan_arrays(params, forward) scans arrays with your own "
            "forward",
            src,
        )
    optional_module("onnxruntime", "onnx", "scan")
    if args.plot is not None:
        optional_module("matplotlib", "plot", "--plot")
    try:
        calibration = read_calibration(args.calibration)
    except ValueError as exc:
        raise CliError(error_text(exc), args.calibration) from None
    _stage(f"loading {src}")
    wf = fmt.load(src)
    samples = len(next(iter(calibration.values())))
    _stage(f"scan: {samples} calibration samples, {len(args.sparsities)} sparsities per weight, {args.method}")
    try:
        result = scan_onnx(
            wf,
            calibration,
            method=args.method,
            sparsities=args.sparsities,
            include=args.include,
            exclude=args.exclude,
            min_size=args.min_size,
            calibration_batch=args.calibration_batch,
            outputs=args.outputs,
            progress=_progress,
        )
    except ValueError as exc:
        raise PruneError(f"scan: {error_text(exc)}", src) from None
    result.model = os.path.basename(src)
    return _written(args, result)


def _scan_folder(args: argparse.Namespace, folder: str) -> int:
    """``arrayprune scan FOLDER``: a Hugging Face checkpoint scanned layer by layer on token ids."""

    src = args.input
    if args.outputs:
        raise CliError(
            "--outputs names values of an ONNX graph: a Hugging Face folder is compared at each layer's output"
        )
    optional_module("transformers", "transformers", "scan of a Hugging Face folder")
    if args.plot is not None:
        optional_module("matplotlib", "plot", "--plot")
    try:
        ckpt = fmt.sharded.open_checkpoint(folder)
    except fmt.FormatError as exc:
        raise CliError(exc.problem, src) from None
    if not isinstance(ckpt, fmt.sharded.ShardedCheckpoint):
        raise CliError("a Hugging Face folder holds safetensors weights (sharded or one file)", src)
    _stage(f"scan: {src} layer by layer, {len(args.sparsities)} sparsities per weight, {args.method}")
    try:
        result = scan_hf(
            ckpt,
            folder,
            args.calibration,
            method=args.method,
            sparsities=args.sparsities,
            include=args.include,
            exclude=args.exclude,
            min_size=args.min_size,
            calibration_batch=args.calibration_batch,
            device=args.device,
            progress=_progress,
        )
    except ValueError as exc:
        raise PruneError(f"scan: {error_text(exc)}", src) from None
    result.model = os.path.basename(os.path.normpath(src))
    return _written(args, result)


def _written(args: argparse.Namespace, result: Any) -> int:
    """Write the scan (and its plot), print the ranking."""

    src = args.input
    result.save(args.output)
    if args.plot is not None:

        plot_scan(result, args.plot)
    print(f"scanned {len(result.curves)} weights of {src} ({result.method}, {result.samples} samples) -> {args.output}")
    width = max(len(c.name) for c in result.curves)
    head = "  ".join(f"{100 * s:>8g}%" for s in result.sparsities)
    print(f"{'weight (most fragile first)'.ljust(width)}  {head}")
    for c in result.ranked():
        print(f"{c.name.ljust(width)}  " + "  ".join(f"{e:9.2e}" for e in c.errors))
    print(f"values: {result.metric}")
    if args.plot is not None:
        print(f"plot -> {args.plot}")
    return 0
