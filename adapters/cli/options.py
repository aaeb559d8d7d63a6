"""The options of ``arrayprune``: the parser, the types of values, and which option applies to which method."""

from __future__ import annotations

import argparse
import inspect
import math
import re
from typing import Any, NoReturn

import arrayprune
from arrayprune.adapters.calibration import BATCH_SIZE
from arrayprune.adapters.verify import DEFAULT_TOL
from arrayprune.registry import constructor_parameters

from .errors import PROG, CliError

__all__ = ["METHODS", "PARAMETER_FLAGS", "DEFAULT_VERIFY_TOL", "build_parser", "method_arguments", "method_flags"]


#: The command line's name for each constructor parameter it can set. A method with
#: both ``n`` and ``m`` (an N:M pattern) takes them together as ``--nm N:M``.
PARAMETER_FLAGS = {"amount": "--amount", "dim": "--dim", "n": "--n", "block_shape": "--block", "seed": "--seed"}

#: Values of required constructor parameters that the command line fills in.
_REQUIRED_DEFAULTS = {"n": 2, "block_shape": (1, 4)}


def method_flags(name: str) -> dict[str, str]:
    """The flags of method `name` of :data:`arrayprune.METHODS`: constructor parameter -> flag.

    Parameters the command line cannot give (a mask, a generator) are left out.
    """
    params = [p.name for p in constructor_parameters(arrayprune.METHODS[name])]
    flags = {p: PARAMETER_FLAGS[p] for p in params if p in PARAMETER_FLAGS}
    if {"n", "m"} <= set(params):
        flags.update(n="--nm", m="--nm")
    return flags


def _runnable(name: str) -> bool:
    """Whether the command line can give every required parameter of method `name`."""
    flags = method_flags(name)
    return all(
        p.name in flags or p.default is not inspect.Parameter.empty
        for p in constructor_parameters(arrayprune.METHODS[name])
    )


#: The ``--method`` choices: the methods of the table that prune something the command
#: line can describe (``identity`` has nothing to set; ``custom_from_mask`` needs a mask).
METHODS = tuple(name for name in arrayprune.METHODS if method_flags(name) and _runnable(name))


def method_arguments(args: argparse.Namespace, seed: int | None = None, dim: int | None = None) -> dict[str, Any]:
    """Constructor arguments of ``args.method`` from the parsed options.

    `seed` is the seed to give a random method (the CLI derives one per tensor), `dim`
    the axis of the tensor at hand (``--dim``, or the tensor's own axis from the plan).
    """
    cls = arrayprune.METHODS[args.method]
    flags = method_flags(args.method)
    values = {"amount": args.amount, "dim": args.dim if dim is None else dim, "block_shape": args.block, "seed": seed}
    if flags.get("n") == "--nm":
        values["n"], values["m"] = args.nm
    else:
        values["n"] = args.n
    kwargs = {}
    for p in constructor_parameters(cls):
        if p.name in flags and values.get(p.name) is not None:
            kwargs[p.name] = values[p.name]
        elif p.default is inspect.Parameter.empty:
            kwargs[p.name] = _REQUIRED_DEFAULTS[p.name]
    return kwargs


#: Methods that rank by scores Wanda's input norms can make (``--calibration``, ``--input-norms``).
SCORED_METHODS = ("wanda", "l1_unstructured", "nm_structured")


def _check_norm_options(args: argparse.Namespace) -> None:
    """Input norms go with the methods that rank by scores, and Wanda needs them."""
    given = [f for f, v in (("--calibration", args.calibration), ("--input-norms", args.input_norms)) if v]
    if len(given) == 2:
        raise CliError("--calibration and --input-norms both give input norms: pass one")
    if given and args.method not in SCORED_METHODS:
        raise CliError(f"{given[0]} makes Wanda's scores, for {', '.join(SCORED_METHODS)}; not for {args.method}")
    if not given and args.method == "wanda":
        raise CliError(
            "--method wanda needs input norms: --calibration calib.npz (ONNX models) or --input-norms norms.npz"
        )
    if args.calibration_batch is not None and not args.calibration:
        raise CliError("--calibration-batch needs --calibration")


def _methods_with(flag: str) -> list[str]:
    return [m for m in METHODS if flag in method_flags(m).values()]


DEFAULT_VERIFY_TOL = DEFAULT_TOL
"""``--verify`` default ``(rtol, atol)``. Pruning changes outputs by design, so the default
fails only outputs that moved by more than their own largest magnitude or stopped being
finite (a broken model, not a less accurate one); pass a smaller RTOL to gate accuracy."""


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
    sub = parser.add_subparsers(dest="command", metavar="{prune,report}", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("prune", help="prune the tensors of a model file and write the result")
    p.add_argument("input", metavar="IN", help="model file to read (never modified)")
    p.add_argument("-o", "--output", metavar="OUT", help="file to write; format from its suffix")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (each tensor: role, shape, axis used, pruned or why not) and write nothing",
    )
    p.add_argument("--method", choices=METHODS, default="l1_unstructured", help="pruning method (default: %(default)s)")
    p.add_argument(
        "--amount", type=_amount, default=None, help="fraction in [0, 1] to prune, or a count (not for nm_structured)"
    )
    p.add_argument(
        "--global",
        dest="global_",
        action="store_true",
        help="one threshold over all selected tensors (unstructured methods only)",
    )
    for_ = {flag: ", ".join(_methods_with(flag)) for flag in ("--n", "--dim", "--nm", "--block")}
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
        f"with {', '.join(SCORED_METHODS)}",
    )
    p.add_argument(
        "--calibration-batch",
        type=_positive,
        default=None,
        metavar="N",
        help=f"--calibration: samples run at a time (default: {BATCH_SIZE})",
    )
    p.add_argument(
        "--input-norms",
        metavar="NPZ",
        help="precomputed input norms for Wanda's scores (weight name -> one norm per input feature), any format",
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

    r = sub.add_parser("report", help="per-tensor sparsity of a model file")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not apply to the method, then fill in the defaults.

    ``--dry-run`` needs no ``--amount``: without one, the plan lists roles and axes.
    """
    cls = arrayprune.METHODS[args.method]
    if args.global_ and cls.PRUNING_TYPE != "unstructured":
        unstructured = [m for m in METHODS if arrayprune.METHODS[m].PRUNING_TYPE == "unstructured"]
        raise CliError(f"--global needs an unstructured method ({' or '.join(unstructured)}), not {args.method}")
    if not args.global_ and (args.min_sparsity is not None or args.max_sparsity is not None or args.lamp):
        raise CliError("--min-sparsity, --max-sparsity and --lamp shape global pruning: add --global")
    if args.lamp and args.method != "l1_unstructured":
        raise CliError("--lamp ranks magnitudes: use it with --method l1_unstructured")
    flags = set(method_flags(args.method).values())
    given = {"--n": args.n, "--dim": args.dim, "--nm": args.nm, "--block": args.block}
    for flag, value in given.items():
        if value is not None and flag not in flags:
            raise CliError(f"{flag} does not apply to {args.method} (only to {', '.join(_methods_with(flag))})")
    if args.amount is not None and "--amount" not in flags:
        raise CliError(f"{args.method} prunes a pattern (--nm N:M), not an --amount")
    plan_only = args.command == "prune" and args.dry_run and args.amount is None
    if args.amount is None and "--amount" in flags and not plan_only:
        raise CliError(f"--amount is required for {args.method} (--dry-run alone shows the roles and axes)")
    if args.nm is None and "--nm" in flags:
        args.nm = (2, 4)
    if args.seed is not None and "--seed" not in flags and not args.verify:
        raise CliError(
            f"--seed does not apply to {args.method}, which is deterministic (it seeds random methods and --verify)"
        )
    if args.verify_tol is not None and not args.verify:
        raise CliError("--verify-tol needs --verify")
    if getattr(args, "verify_data", None) is not None and not args.verify:
        raise CliError("--verify-data needs --verify")
    _check_norm_options(args)
    if args.verify_tol is None:
        args.verify_tol = DEFAULT_VERIFY_TOL
    if plan_only and "--amount" in flags:
        return  # nothing to construct: the plan needs the method's axes only
    try:
        cls(**method_arguments(args))
    except (TypeError, ValueError) as exc:
        flag = "--nm" if "--nm" in flags else "--amount" if "--amount" in flags else "--method"
        raise CliError(f"{flag}: {exc}") from None
