"""The options of ``arrayprune``: the parser and the types of values.

Which option applies to which method is the request's business
(:class:`arrayprune.adapters.pipeline.request.PruneSpec`): every ``prune`` flag fills the field of
the same name.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any, NoReturn

import arrayprune
from arrayprune.adapters.cli.evaluate import add_eval_parser
from arrayprune.adapters.cli.scan import add_scan_parser
from arrayprune.adapters.pipeline.calibration import BATCH_SIZE
from arrayprune.adapters.pipeline.method_names import (
    PARAMETER_FLAGS,
    extra_flags,
    method_flags,
    methods_with,
    runnable_methods,
    scored_methods,
    unit_methods,
)
from arrayprune.adapters.pipeline.request import method_arguments
from arrayprune.adapters.pipeline.shrink_request import GROUPS, channel_methods
from arrayprune.adapters.roles.onnx_group_types import ROUNDINGS
from arrayprune.adapters.verify import DEFAULT_TOL

from .errors import PROG, CliError

__all__ = [
    "METHODS",  # noqa: F822 (the module's __getattr__: the --method choices as they are now)
    "PARAMETER_FLAGS",
    "DEFAULT_VERIFY_TOL",
    "build_parser",
    "method_arguments",
    "method_flags",
]


DEFAULT_VERIFY_TOL = DEFAULT_TOL
"""``--verify`` default ``(rtol, atol)``. Pruning changes outputs by design, so the default
fails only outputs that moved by more than their own largest magnitude or stopped being
finite (a broken model, not a less accurate one); pass a smaller RTOL to gate accuracy."""


def __getattr__(name: str) -> Any:
    # ``METHODS``: the ``--method`` choices as they are now (methods registered at run time in).
    if name == "METHODS":
        return runnable_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MethodOption(argparse.Action):
    """Stores a flag a method declares under its parameter's name in ``method_options``."""

    def __init__(self, option_strings: Any, dest: str, param: str = "", **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.param = param

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), self.param: values})


def _declared(flag: Any) -> Any:
    """A flag's declared type, its errors in argparse's form."""

    def parse(text: str) -> Any:
        try:
            return flag.type(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {exc}") from None

    parse.__name__ = getattr(flag.type, "__name__", "value")
    return parse


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def _amount(text: str) -> int | float:
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid amount {text!r}: a fraction like 0.5 or a count like 100") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid amount {text!r}")
    return value


def _norm_order(text: str) -> Any:
    low = text.strip().lower()
    if low in ("fro", "nuc"):
        return low
    if low in ("inf", "+inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    try:
        return int(low)
    except ValueError:
        pass
    try:
        return float(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid norm order {text!r}: a number, inf, -inf, fro or nuc") from None


def _pattern(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid pattern {text!r}: write N:M, like 2:4")
    return int(match.group(1)), int(match.group(2))


def _block(text: str) -> tuple[int, ...]:
    parts = re.split(r"[x,]", text.strip().lower())
    if not parts or not all(re.fullmatch(r"\d+", p.strip()) for p in parts):
        raise argparse.ArgumentTypeError(f"invalid block shape {text!r}: write e.g. 4x4 or 1x4")
    return tuple(int(p) for p in parts)


def _seed(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: an integer") from None


def _tolerance(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or not all(math.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"invalid tolerance {text!r}: RTOL or RTOL,ATOL, numbers >= 0")
    return values[0], values[1] if len(values) == 2 else DEFAULT_VERIFY_TOL[1]


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}: must be in [0, 1]")
    return value


def _positive_real(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be finite and > 0")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``arrayprune`` command.

    Returns
    -------
    argparse.ArgumentParser
        Parser with the ``prune`` and ``report`` sub-commands.
    """
    parser = _Parser(
        prog=PROG,
        description="Prune the weights of model files (.npz, .safetensors, .onnx, PyTorch state dicts) "
        "with the semantics of torch.nn.utils.prune, or report their sparsity.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {arrayprune.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{prune,report,scan,eval}", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("prune", help="prune the tensors of a model file and write the result")
    p.add_argument("input", metavar="IN", help="model file to read (never modified)")
    p.add_argument("-o", "--output", metavar="OUT", help="file to write; format from its suffix")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (each tensor: role, shape, axis used, pruned or why not) and write nothing",
    )
    p.add_argument(
        "--method",
        choices=runnable_methods(),
        default="l1_unstructured",
        help="pruning method (default: %(default)s); sparsegpt (needs --calibration or --hessians, --amount or"
        " --nm) also updates the weights it keeps, calibrated layer by layer",
    )
    p.add_argument(
        "--amount", type=_amount, default=None, help="fraction in [0, 1] to prune, or a count (not for nm_structured)"
    )
    p.add_argument(
        "--global",
        dest="global_",
        action="store_true",
        help="one threshold over all selected tensors (unstructured methods only)",
    )
    for_ = {flag: ", ".join(methods_with(flag)) for flag in ("--n", "--dim", "--nm", "--block")}
    p.add_argument(
        "--n",
        type=_norm_order,
        default=None,
        help=f"{for_['--n']}: order of the channel norm (default: 2) or of the block power mean (default: 1)",
    )
    p.add_argument(
        "--dim",
        type=int,
        default=None,
        help=f"{for_['--dim']}: the axis for every tensor (default: each weight's own, its output axis for"
        " structured methods and its reduction axis for N:M patterns)",
    )
    p.add_argument("--nm", type=_pattern, default=None, metavar="N:M", help=f"{for_['--nm']}: N zeros in every M")
    p.add_argument("--block", type=_block, default=None, metavar="RxC", help=f"{for_['--block']}: block shape")
    p.set_defaults(method_options={})
    for flag, (param, declared, takes) in extra_flags().items():  # flags the methods declare
        p.add_argument(
            flag,
            action=_MethodOption,
            param=param,
            dest="method_options",
            type=_declared(declared),
            metavar=param.upper(),
            help=f"{', '.join(takes)}: {declared.help}",
        )
    p.add_argument(
        "--min-sparsity", type=_fraction, default=None, metavar="F", help="--global: least sparsity of any tensor"
    )
    p.add_argument(
        "--max-sparsity", type=_fraction, default=None, metavar="F", help="--global: most sparsity of any tensor"
    )
    p.add_argument("--lamp", action="store_true", help="--global: rank by layer-adaptive (LAMP) scores")
    p.add_argument(
        "--include",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="prune tensors whose name, or the name of an ONNX node reading them, matches (fnmatch glob)",
    )
    p.add_argument(
        "--exclude",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="leave tensors whose name, or the name of an ONNX node reading them, matches (fnmatch glob)",
    )
    p.add_argument("--min-size", type=_non_negative, default=0, metavar="N", help="leave tensors with fewer entries")
    p.add_argument(
        "--calibration",
        metavar="NPZ",
        help="ONNX: calibration batches (graph input name -> samples along axis 0) for Wanda's input norms; "
        f"with {', '.join(scored_methods())}; or for sparsegpt's Hessians; a Hugging Face folder: token ids "
        "(input_ids [batch, seq]), run layer by layer through transformers",
    )
    p.add_argument(
        "--calibration-batch",
        type=_positive,
        default=None,
        metavar="N",
        help=f"--calibration: samples run at a time (default: {BATCH_SIZE})",
    )
    p.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="--calibration: where the model runs, cpu (default), cuda or cuda:N; a Hugging Face folder one "
        "layer on the device at a time (PyTorch), an ONNX model on onnxruntime's CUDA provider",
    )
    p.add_argument(
        "--one-pass", action="store_true", help="sparsegpt: every Hessian from the dense model, in one pass"
    )
    p.add_argument(
        "--input-norms",
        metavar="NPZ",
        help="precomputed input norms for Wanda's scores (weight name -> one norm per input feature), any format",
    )
    p.add_argument(
        "--hessians",
        metavar="NPZ",
        help="sparsegpt on safetensors: precomputed Hessians (weight name -> K x K, K its input features)",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="random methods and --verify: any integer; the same seed gives the same masks and inputs",
    )
    p.add_argument(
        "--keep-masks",
        action="store_true",
        help="write name_orig and name_mask (the PyTorch state-dict convention) instead of folded weights",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists (even if it is IN)")
    p.add_argument(
        "--shrink",
        action="store_true",
        help=f"ONNX or Hugging Face folder: remove the channels {' or '.join(channel_methods())} drop "
        "from every tensor holding them",
    )
    p.add_argument(
        "--groups",
        choices=GROUPS,
        default=None,
        help="--shrink: what goes (channels, the default; heads; a Hugging Face folder's decoder layers or the "
        "experts of its MoE layers, ranked on --calibration token ids)",
    )
    p.add_argument(
        "--rounding",
        choices=ROUNDINGS,
        default="nearest",
        help="--shrink by weights: a fraction removes round(amount * C) channels of each group (nearest, the "
        "default, as PyTorch) or keeps int((1 - amount) * C) (keep_floor, as Torch-Pruning)",
    )
    p.add_argument(
        "--no-compensate",
        dest="compensate",
        action="store_false",
        help=f"--shrink with {' or '.join(unit_methods())}: do not refit the layer reading the removed units; "
        "--groups layers: do not refit removed layers into the layer before them",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="ONNX: run original and pruned model on the same inputs (--verify-data, else the --calibration "
        "samples, else random), print the largest difference of each floating-point output, and exit with "
        "status 1 if one exceeds --verify-tol",
    )
    p.add_argument(
        "--verify-data",
        metavar="DATA.npz",
        default=None,
        help="--verify: real inputs, graph input name -> array (random inputs need a size for every symbolic "
        "dimension, which is searched)",
    )
    p.add_argument(
        "--verify-tol",
        type=_tolerance,
        default=None,
        metavar="RTOL[,ATOL]",
        help="--verify: an output passes if max|pruned - original| <= ATOL + RTOL * max|original| "
        f"(default: {DEFAULT_VERIFY_TOL[0]:g},{DEFAULT_VERIFY_TOL[1]:g})",
    )
    p.add_argument(
        "--allocation",
        metavar="SCAN.json|owl",
        default=None,
        help="each weight's share of --amount: from a sensitivity scan's curves (arrayprune scan), or owl "
        "(outlier ratios, Yin et al. 2024); within --min-sparsity/--max-sparsity",
    )
    p.add_argument(
        "--no-allocation-check",
        dest="allocation_check",
        action="store_false",
        help="--allocation SCAN.json with --calibration: use the scan's allocation as it is, without checking it "
        "jointly against uniform and global on the calibration data",
    )
    p.add_argument(
        "--allocation-check-data",
        metavar="NPZ",
        default=None,
        help="ONNX, --allocation SCAN.json: check the allocation jointly on these samples (graph input name -> "
        "samples) instead of --calibration's; they make no scores, so l1_unstructured checks its magnitude masks",
    )
    p.add_argument(
        "--owl-m",
        type=_positive_real,
        default=None,
        metavar="M",
        help="--allocation owl: a score is an outlier above M times its weight's mean (default 5)",
    )
    p.add_argument(
        "--owl-lambda",
        type=_fraction,
        default=None,
        metavar="LAMBDA",
        help="--allocation owl: every weight's sparsity within --amount +- LAMBDA (default 0.08)",
    )

    r = sub.add_parser("report", help="per-tensor sparsity of a model file")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.add_argument(
        "--compare", metavar="OTHER", help="parameters and tensor shapes of FILE and OTHER (a shrunk copy)"
    )
    r.add_argument(
        "--plot", metavar="PNG", default=None, help="draw each tensor's sparsity and 2:4 status (matplotlib)"
    )

    add_scan_parser(sub, _fraction, _non_negative, _positive)
    add_eval_parser(sub, _positive)
    return parser
