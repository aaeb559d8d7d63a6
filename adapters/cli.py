"""The ``arrayprune`` command: prune the weights of a model file, or report its sparsity.

::

    arrayprune prune IN -o OUT --amount A [--method M] [--global] [--n N] [--dim D]
                     [--nm N:M] [--block RxC] [--min-sparsity F] [--max-sparsity F] [--lamp]
                     [--include PATTERN ...] [--exclude PATTERN ...] [--min-size N]
                     [--seed S] [--keep-masks] [--force] [--verify [--verify-tol RTOL[,ATOL]]]
    arrayprune report FILE [--json]

Files are ``.npz``, ``.safetensors``, ``.onnx`` or PyTorch state dicts (``.pt``,
``.pth``, ``.bin``), recognised from their content (see
:mod:`arrayprune.adapters.formats`). The output format follows the suffix of OUT, or the
input's format for another suffix.

Which tensors are pruned: by default every floating-point tensor with at least two
dimensions (weights of linear and convolution layers; biases and norm scales are left
alone). ``--include`` replaces that rule by fnmatch patterns on tensor names (any
floating-point tensor matching one is a candidate, whatever its dimensions);
``--exclude`` removes matches; ``--min-size`` drops small tensors. Tensors already
pruned in the PyTorch convention (``name_orig`` + ``name_mask``) are candidates under
their own name, and are pruned further on what their mask leaves, as
:mod:`torch.nn.utils.prune` would. A tensor stored under several names (tied weights)
is pruned once and stays tied; ``--exclude`` on any of its names leaves it.

An option that does not apply to the method is an error, never ignored: ``--seed``
seeds the random methods and ``--verify`` only, ``--n`` is ``ln_structured``'s,
``--dim`` the structured and N:M methods', ``--nm`` and ``--block`` their methods'.
Any integer is a seed (:func:`stream_seed` says how it becomes a stream).

``prune`` prints the sparsity of the tensors it pruned and of the whole file;
``report`` lists every tensor (integer ones too), marks those the default selection
leaves and why, and gives two totals: ``prunable`` (the default selection) and
``total`` (every tensor, tied names counted once).

Errors are one line on stderr, ``arrayprune: error: <file>: <problem>``, with exit
status 2; IN is never modified, and OUT is written to a temporary file renamed into
place, so it is never left half written. ``--verify`` failing its tolerance is exit
status 1 (OUT is written: the verdict is about its outputs, not its validity).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp

__all__ = ["main", "build_parser", "CliError", "report_rows", "stream_seed"]

PROG = "arrayprune"
METHODS = (
    "l1_unstructured",
    "random_unstructured",
    "ln_structured",
    "random_structured",
    "nm_structured",
    "block_unstructured",
)
UNSTRUCTURED = ("l1_unstructured", "random_unstructured")
RANDOM = ("random_unstructured", "random_structured")

# The methods each option applies to; any other combination is refused, not ignored.
_OPTION_METHODS = {
    "n": ("--n", ("ln_structured",)),
    "dim": ("--dim", ("ln_structured", "random_structured", "nm_structured")),
    "nm": ("--nm", ("nm_structured",)),
    "block": ("--block", ("block_unstructured",)),
}
_DEFAULTS = {"n": 2, "nm": (2, 4), "block": (1, 4)}

DEFAULT_VERIFY_TOL = (1.0, 1e-6)
"""``--verify`` default ``(rtol, atol)``. Pruning changes outputs by design, so the default
fails only outputs that moved by more than their own largest magnitude or stopped being
finite (a broken model, not a less accurate one); pass a smaller RTOL to gate accuracy."""


class CliError(Exception):
    """An error reported as one line, ``arrayprune: error: [file: ]problem``.

    Parameters
    ----------
    problem : str
        What went wrong.
    file : str, optional
        The file concerned.
    """

    def __init__(self, problem: str, file: Any = None):
        self.file = None if file is None else os.fspath(file)
        self.problem = problem
        super().__init__(f"{self.file}: {problem}" if self.file else problem)


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
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="file to write; format from its suffix")
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
    p.add_argument("--n", type=_norm_order, default=None, help="ln_structured: norm order (default: 2)")
    p.add_argument(
        "--dim",
        type=int,
        default=None,
        help="ln_structured, random_structured: channel axis (default: 0);"
        " nm_structured: axis of the groups (default: -1)",
    )
    p.add_argument(
        "--nm", type=_pattern, default=None, metavar="N:M", help="nm_structured: N zeros in every M (default: 2:4)"
    )
    p.add_argument(
        "--block", type=_block, default=None, metavar="RxC", help="block_unstructured: block shape (default: 1x4)"
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
        help="prune tensors whose name matches (fnmatch glob)",
    )
    p.add_argument(
        "--exclude",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="leave tensors whose name matches (fnmatch glob)",
    )
    p.add_argument("--min-size", type=_non_negative, default=0, metavar="N", help="leave tensors with fewer entries")
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
        help="ONNX: run original and pruned model on the same random inputs, print the largest difference of "
        "each floating-point output, and exit with status 1 if one exceeds --verify-tol",
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


# --------------------------------------------------------------------------------------
# Tensors of a file
# --------------------------------------------------------------------------------------


def _name(path: tuple) -> str:
    return "/".join(map(str, path))


def _logical_tensors(params: Mapping) -> list[tuple[tuple, Any, bool]]:
    """``(path, original array, pruned)`` per logical tensor; mask entries are hidden."""
    pruned = set(mp.pruned_keys(params))
    out = []
    for path, value in mp.iter_arrays(params):
        leaf = path[-1]
        if isinstance(leaf, str):
            if leaf.endswith(mp.MASK_SUFFIX) and path[:-1] + (leaf[: -len(mp.MASK_SUFFIX)],) in pruned:
                continue
            if leaf.endswith(mp.ORIG_SUFFIX) and path[:-1] + (leaf[: -len(mp.ORIG_SUFFIX)],) in pruned:
                out.append((path[:-1] + (leaf[: -len(mp.ORIG_SUFFIX)],), value, True))
                continue
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            out.append((path, value, False))
    return out


def _is_float(x: Any) -> bool:
    try:
        import array_api_compat as apc

        xp = apc.array_namespace(x)
        return bool(xp.isdtype(x.dtype, "real floating"))
    except Exception:
        return False


def _size(x: Any) -> int:
    return math.prod(int(s) for s in x.shape)


def _zeros(x: Any) -> int:
    import array_api_compat as apc

    xp = apc.array_namespace(x)
    return int(xp.count_nonzero(x == 0))


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def _default_rule(value: Any) -> str | None:
    """Why the default selection leaves `value`, or None if it prunes it."""
    if not _is_float(value):
        return f"{_dtype_name(value)}, not floating point"
    if len(value.shape) < 2:
        return f"{len(value.shape)}-D"
    return None


def _alias_key(value: Any) -> Any:
    """A key shared by the arrays that are one tensor under several names (tied weights).

    Two names are one tensor when they view the same memory with the same shape, strides
    and dtype, as ``torch.load`` returns tied parameters (``lm_head.weight`` and
    ``embed_tokens.weight``, say).
    """
    if _size(value) == 0:
        return ("distinct", id(value))
    if type(value).__module__.split(".")[0] == "torch":
        return ("torch", str(value.device), value.data_ptr(), tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, np.ndarray):
        return ("numpy", value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)
    return ("distinct", id(value))


def _check_arrays(params: Mapping, src: str) -> None:
    """Refuse trees that cannot be walked and tensors that hold no values."""
    try:
        mp.check_tree(params)
    except mp.TreeError as exc:
        raise CliError(f"cannot walk the file's contents: {exc}", src) from None
    for path, value in mp.iter_arrays(params):
        if getattr(value, "is_meta", False):
            raise CliError(f"tensor {_name(path)!r} is on the meta device: it holds no values to prune", src)


def _select(params: Mapping, args: argparse.Namespace) -> tuple[list[tuple[tuple, Any]], dict[tuple, list[tuple]]]:
    """The tensors to prune, and the other names of each (tied weights).

    A tensor stored under several names is pruned once and written under all of them,
    so the names stay tied; it is selected if one of its names is, unless ``--exclude``
    matches one of them.
    """
    groups: dict[Any, list[tuple[tuple, Any]]] = {}
    for path, value, pruned in _logical_tensors(params):
        key = ("pruned", path) if pruned else _alias_key(value)
        groups.setdefault(key, []).append((path, value))
    chosen, tied = [], {}
    for members in groups.values():
        names = [_name(path) for path, _ in members]
        value = members[0][1]
        if not _is_float(value) or _size(value) < args.min_size:
            continue
        if any(fnmatch.fnmatchcase(name, pat) for name in names for pat in args.exclude):
            continue
        if args.include:
            if not any(fnmatch.fnmatchcase(name, pat) for name in names for pat in args.include):
                continue
        elif _default_rule(value) is not None:
            continue
        chosen.append(members[0])
        tied[members[0][0]] = [path for path, _ in members[1:]]
    return chosen, tied


def stream_seed(seed: int | None, name: str = "") -> int | None:
    """The seed of one random stream, from the user's ``--seed`` and a tensor's name.

    Any integer is a seed. It is mixed with the name by NumPy's
    :class:`~numpy.random.SeedSequence` (entropy ``[crc32(name), seed < 0, |seed|]``,
    which tells every integer apart) into a 63-bit seed, which every library's generator
    accepts; the random method then draws from the generator of the tensor's own library
    seeded with it (see :mod:`arrayprune.rng`). Without ``--global`` each tensor has
    its own stream (its name), with ``--global`` one stream serves all (the empty name).

    Parameters
    ----------
    seed : int or None
        The user's seed; None means fresh entropy (None is returned).
    name : str, default ""
        The tensor's name.

    Returns
    -------
    int or None
        A seed in ``[0, 2**63)``.
    """
    if seed is None:
        return None
    entropy = [zlib.crc32(name.encode()), int(seed < 0), abs(int(seed))]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _progress(items: Sequence[Any], desc: str) -> Any:
    if not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="tensor", file=sys.stderr, leave=False)


# --------------------------------------------------------------------------------------
# prune
# --------------------------------------------------------------------------------------


def _global_arguments(targets: list[tuple[tuple, Any]], args: argparse.Namespace) -> tuple[type, dict[str, Any]]:
    """The method class and keyword arguments of a ``global_unstructured`` call."""
    cls = arrayprune.L1Unstructured if args.method == "l1_unstructured" else arrayprune.RandomUnstructured
    kwargs: dict[str, Any] = {
        "amount": args.amount,
        "min_sparsity": args.min_sparsity,
        "max_sparsity": args.max_sparsity,
        "normalization": "lamp" if args.lamp else None,
    }
    if args.method == "random_unstructured":
        kwargs["seed"] = stream_seed(args.seed)
    return cls, kwargs


def _prune_entry(params: Mapping, key: Any, name: str, args: argparse.Namespace) -> Mapping:
    """`params` with `key` pruned by ``args.method`` (a mapping verb); seeds follow `name`."""
    method, amount = args.method, args.amount
    if method == "l1_unstructured":
        return mp.l1_unstructured(params, key, amount)
    if method == "random_unstructured":
        return mp.random_unstructured(params, key, amount, seed=stream_seed(args.seed, name))
    if method == "ln_structured":
        return mp.ln_structured(params, key, amount, args.n, args.dim)
    if method == "nm_structured":
        return mp.nm_structured(params, key, *args.nm, dim=args.dim)
    if method == "block_unstructured":
        return mp.block_unstructured(params, key, amount, args.block)
    return mp.random_structured(params, key, amount, args.dim, seed=stream_seed(args.seed, name))


def _prune_params(
    params: Mapping,
    targets: list[tuple[tuple, Any]],
    tied: dict[tuple, list[tuple]],
    args: argparse.Namespace,
    src: str,
) -> Mapping:
    """`params` with the targets pruned, as ``name_orig`` + ``name_mask`` entries.

    The other names of a tied tensor get its mask (their ``_orig`` entries stay the one
    shared tensor).
    """
    if args.global_:
        cls, kwargs = _global_arguments(targets, args)
        try:
            params = mp.global_unstructured(params, [p for p, _ in targets], cls, **kwargs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"global pruning: {_message(exc)}", src) from None
    else:
        for path, _ in _progress(targets, "pruning"):
            try:
                params = _prune_entry(params, path, _name(path), args)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise CliError(f"tensor {_name(path)!r}: {_message(exc)}", src) from None
    for path, others in tied.items():
        if others:
            mask = _lookup(params, path[:-1] + (path[-1] + mp.MASK_SUFFIX,))
            for other in others:
                params = mp.custom_from_mask(params, other, mask)
    return params


def _lookup(params: Mapping, path: tuple) -> Any:
    node: Any = params
    for part in path:
        node = node[part]
    return node


def _prune_folded(
    params: Mapping,
    targets: list[tuple[tuple, Any]],
    tied: dict[tuple, list[tuple]],
    args: argparse.Namespace,
    src: str,
) -> Mapping:
    """`params` with the targets pruned and folded, for inputs without masks.

    No mask outlives its tensor's folding: global pruning keeps the core's boolean masks
    (a byte per entry) until each is folded, and tensor by tensor only the current
    tensor's mask exists at a time.
    """
    folded = {}
    if args.global_:
        cls, kwargs = _global_arguments(targets, args)
        try:
            masks = arrayprune.global_unstructured([x for _, x in targets], cls, **kwargs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"global pruning: {_message(exc)}", src) from None
        for i, (path, x) in enumerate(targets):
            folded[path] = x * masks[i]
            masks[i] = None
    else:
        for path, x in _progress(targets, "pruning"):
            try:
                folded[path] = mp.remove(_prune_entry({"t": x}, "t", _name(path), args), "t")["t"]
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise CliError(f"tensor {_name(path)!r}: {_message(exc)}", src) from None
    for path, others in tied.items():
        for other in others:
            folded[other] = folded[path]  # the same object: written once, still tied
    return mp.replace(params, folded)


def _message(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not apply to the method, then fill in the defaults."""
    for attr, (flag, methods) in _OPTION_METHODS.items():
        if getattr(args, attr) is not None and args.method not in methods:
            raise CliError(f"{flag} does not apply to {args.method} (only to {', '.join(methods)})")
        if getattr(args, attr) is None:
            setattr(args, attr, _DEFAULTS.get(attr))
    if args.dim is None:
        args.dim = -1 if args.method == "nm_structured" else 0
    if args.seed is not None and args.method not in RANDOM and not args.verify:
        raise CliError(
            f"--seed does not apply to {args.method}, which is deterministic (it seeds random methods and --verify)"
        )
    if args.verify_tol is not None and not args.verify:
        raise CliError("--verify-tol needs --verify")
    if args.verify_tol is None:
        args.verify_tol = DEFAULT_VERIFY_TOL


def _cmd_prune(args: argparse.Namespace) -> int:
    src, dst = args.input, args.output
    if not os.path.exists(src):
        raise CliError("no such file", src)
    if os.path.isdir(src):
        raise CliError("is a directory", src)
    if os.path.isdir(dst):
        raise CliError("is a directory", dst)
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise CliError("folder does not exist", dst)
    if os.path.exists(dst):
        if os.path.samefile(src, dst) and not args.force:
            raise CliError("is the input file; refusing to overwrite it without --force", dst)
        if not args.force:
            raise CliError("exists; use --force to overwrite it", dst)
    if args.global_ and args.method not in UNSTRUCTURED:
        raise CliError(
            f"--global needs an unstructured method (l1_unstructured or random_unstructured), not {args.method}"
        )
    if not args.global_ and (args.min_sparsity is not None or args.max_sparsity is not None or args.lamp):
        raise CliError("--min-sparsity, --max-sparsity and --lamp shape global pruning: add --global")
    if args.lamp and args.method != "l1_unstructured":
        raise CliError("--lamp ranks magnitudes: use it with --method l1_unstructured")
    _check_options(args)
    if args.method == "nm_structured":
        if args.amount is not None:
            raise CliError("nm_structured prunes a pattern (--nm N:M), not an --amount")
        try:
            arrayprune.NMStructured(*args.nm, dim=args.dim)
        except (TypeError, ValueError) as exc:
            raise CliError(f"--nm: {exc}") from None
    elif args.amount is None:
        raise CliError(f"--amount is required for {args.method}")
    else:
        try:
            arrayprune.validate_pruning_amount_init(args.amount)
        except (TypeError, ValueError) as exc:
            raise CliError(f"--amount: {exc}") from None

    in_format = fmt.detect_format(src)
    out_format = fmt.format_from_suffix(dst) or in_format
    if out_format == "onnx" and in_format != "onnx":
        raise CliError(f"an ONNX model can only be written from an ONNX model, and {src} is {in_format}", dst)
    if args.keep_masks and out_format == "onnx":
        raise CliError(
            "--keep-masks needs an .npz, .safetensors or PyTorch output: an ONNX graph uses the effective weights", dst
        )
    if args.verify and not (in_format == "onnx" and out_format == "onnx"):
        raise CliError("--verify runs ONNX models: IN and OUT must both be .onnx")
    if args.verify:
        _optional("onnxruntime", "onnx", "--verify")  # before anything is written

    wf = fmt.load(src, in_format)
    _check_arrays(wf.params, src)

    targets, tied = _select(wf.params, args)
    if not targets:
        raise CliError("no tensor selected for pruning (see --include, --exclude, --min-size)", src)
    if args.keep_masks or mp.is_pruned(wf.params):
        params = _prune_params(wf.params, targets, tied, args, src)
        folded = mp.apply_masks(params)
        folded = mp.replace(folded, {o: _lookup(folded, p) for p, others in tied.items() for o in others})
        out_params = params if args.keep_masks else folded
    else:
        folded = out_params = _prune_folded(wf.params, targets, tied, args, src)
    fmt.save(dst, out_params, out_format, like=wf)

    selected = {p for p, _ in targets}
    total = zeros = 0
    for path, value in mp.iter_arrays(folded):
        if path in selected:
            total += _size(value)
            zeros += _zeros(value)
    everything = _whole_file(folded)
    detail = f"{args.nm[0]}:{args.nm[1]}" if args.method == "nm_structured" else f"amount {args.amount}"
    how = f"{args.method}{', global' if args.global_ else ''}, {detail}"
    n_tied = sum(len(v) for v in tied.values())
    names = f"{len(targets)} tensors" + (f" (and {n_tied} tied names)" if n_tied else "")
    print(f"pruned {names} of {src} ({how}): {zeros} of {total} entries zero ({_pct(zeros, total)}) -> {dst}")
    print(
        f"whole file: {everything['zeros']} of {everything['size']} entries zero"
        f" ({_pct(everything['zeros'], everything['size'])})"
        f" in {everything['tensors']} tensors"
    )
    if args.verify:
        return _verify(src, dst, args.seed, args.verify_tol)
    return 0


def _whole_file(params: Mapping) -> dict[str, int]:
    """Tensors, entries and zeros of every array of `params`, tied names counted once."""
    seen = set()
    out = {"tensors": 0, "size": 0, "zeros": 0}
    for _, value in mp.iter_arrays(params):
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            continue
        key = _alias_key(value)
        if key in seen:
            continue
        seen.add(key)
        out["tensors"] += 1
        out["size"] += _size(value)
        out["zeros"] += _zeros(value)
    return out


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole if whole else 0.0:.2f}%"


def _verify(src: str, dst: str, seed: int | None, tol: tuple[float, float]) -> int:
    """Run both models on the same random inputs; 0 if every float output is within `tol`, else 1."""
    ort = _optional("onnxruntime", "onnx", "--verify")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sessions = []
    for path in (src, dst):
        try:
            sessions.append(ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]))
        except Exception as exc:
            raise CliError(f"onnxruntime cannot load the model: {fmt._describe(exc)}", path) from None
    rng = np.random.default_rng(stream_seed(0 if seed is None else seed, "verify"))
    feeds = {}
    for inp in sessions[0].get_inputs():
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in inp.shape)
        kind = inp.type
        if kind in ("tensor(float)", "tensor(double)", "tensor(float16)"):
            dtype = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}[kind]
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif kind == "tensor(bool)":
            feeds[inp.name] = rng.integers(0, 2, shape).astype(bool)
        elif kind.startswith("tensor(int") or kind.startswith("tensor(uint"):
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.dtype(kind[7:-1]))
        else:
            raise CliError(f"--verify: input {inp.name!r} of type {kind} is not supported", src)
    results = []
    for path, session in zip((src, dst), sessions, strict=False):
        try:
            results.append(session.run(None, feeds))
        except Exception as exc:
            raise CliError(f"onnxruntime failed to run the model: {fmt._describe(exc)}", path) from None
    rtol, atol = tol
    failed, skipped = [], []
    for out, a, b in zip(sessions[0].get_outputs(), *results, strict=False):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or b.dtype.kind != "f" or a.shape != b.shape:
            skipped.append(out.name)  # labels, sequences, maps: not a distance
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diff = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        scale = float(np.max(np.abs(a64))) if a.size else 0.0
        bound = atol + rtol * scale
        finite_lost = bool(np.any(np.isfinite(a64) & ~np.isfinite(b64)))
        ok = not finite_lost and diff <= bound
        verdict = "pass" if ok else "FAIL"
        print(f"verify: output {out.name!r}: max abs output difference {diff:.6g}, tolerance {bound:.6g}: {verdict}")
        if not ok:
            failed.append(out.name)
    if skipped:
        print(f"verify: not compared (not floating point): {', '.join(map(repr, skipped))}")
    if failed:
        _error(
            f"{dst}: verify failed: output {failed[0]!r} differs from the original by more than "
            f"{atol:g} + {rtol:g} x its largest magnitude (see --verify-tol)"
        )
        return 1
    return 0


def _optional(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or a one-line error naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CliError(f'{what} needs the {module!r} package: pip install "arrayprune[{extra}]"') from None


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def report_rows(params: Mapping) -> list[dict[str, Any]]:
    """Per-tensor statistics of every array of a mapping.

    Pruned tensors (``name_orig`` + ``name_mask``) appear once, as their effective array.

    Parameters
    ----------
    params : mapping
        Names to arrays (possibly nested).

    Returns
    -------
    list of dict
        Per tensor: ``name``, ``shape``, ``dtype``, ``size``, ``zeros``, ``sparsity``,
        ``masked``, ``prunable`` (whether ``prune`` selects it by default: floating
        point with at least two dimensions), ``reason`` (why not, or None),
        ``tied_to`` (the first name of the same tensor stored under several names, or
        None), ``nm_2_4`` (whether the tensor is 2:4 sparse along its last axis) and
        ``bytes`` (the storage forms of :func:`arrayprune.sparse_nbytes`).
    """
    masked = set(mp.pruned_keys(params))
    first_name: dict[Any, str] = {}
    rows = []
    for path, value in mp.iter_arrays(params, effective=True):
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            continue  # plain numbers and strings of a checkpoint: not tensors
        name = _name(path)
        key = _alias_key(value)
        tied_to = first_name.setdefault(key, name)
        n, z = _size(value), _zeros(value)
        reason = _default_rule(value)
        nbytes = arrayprune.sparse_nbytes(value) if _is_float(value) else {"dense": _dense_nbytes(value)}
        rows.append(
            {
                "name": name,
                "shape": [int(s) for s in value.shape],
                "dtype": _dtype_name(value),
                "size": n,
                "zeros": z,
                "sparsity": z / n if n else 0.0,
                "masked": path in masked,
                "prunable": reason is None,
                "reason": reason,
                "tied_to": None if tied_to == name else tied_to,
                "nm_2_4": "semi_structured_2_4" in nbytes,
                "bytes": nbytes,
            }
        )
    return rows


def _dense_nbytes(x: Any) -> int:
    itemsize = getattr(x.dtype, "itemsize", None)
    if itemsize is None:
        itemsize = np.dtype(_dtype_name(x)).itemsize if _dtype_name(x) in np.sctypeDict else 0
    return _size(x) * int(itemsize)


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over `rows`, each tensor once (tied names are not counted again)."""
    rows = [r for r in rows if r["tied_to"] is None]
    size = sum(r["size"] for r in rows)
    zeros = sum(r["zeros"] for r in rows)
    total: dict[str, Any] = {
        "tensors": len(rows),
        "size": size,
        "zeros": zeros,
        "sparsity": zeros / size if size else 0.0,
    }
    total["bytes"] = {
        form: sum(r["bytes"].get(form, r["bytes"]["dense"]) for r in rows)
        for form in ("dense", "csr", "bitmask", "semi_structured_2_4")
    }
    return total


TOTALS_COVER = {
    "total": "every tensor of the file, each counted once",
    "prunable": "the tensors prune selects by default: floating point, at least 2 dimensions",
}


def _cmd_report(args: argparse.Namespace) -> int:
    path = args.file
    if not os.path.exists(path):
        raise CliError("no such file", path)
    wf = fmt.load(path)
    _check_arrays(wf.params, path)
    rows = report_rows(wf.params)
    total = _totals(rows)
    prunable = _totals([r for r in rows if r["prunable"]])
    if args.json:
        out = {"file": path, "format": wf.format, "tensors": rows, "total": total, "prunable": prunable}
        json.dump({**out, "covers": TOTALS_COVER}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = [("name", "shape", "dtype", "zeros", "sparsity", "2:4", "prunable")]
    for r in rows:
        name = r["name"] + (" (masked)" if r["masked"] else "")
        shape = "x".join(map(str, r["shape"])) or "scalar"
        nm = "yes" if r["nm_2_4"] else "no"
        if r["tied_to"] is not None:
            note = f"tied to {r['tied_to']}"
        else:
            note = "yes" if r["prunable"] else f"no: {r['reason']}"
        table.append((name, shape, r["dtype"], f"{r['zeros']}/{r['size']}", f"{100 * r['sparsity']:.2f}%", nm, note))
    for label, t in (("prunable", prunable), ("total", total)):
        table.append(
            (label, f"{t['tensors']} tensors", "", f"{t['zeros']}/{t['size']}", f"{100 * t['sparsity']:.2f}%", "", "")
        )
    widths = [max(len(row[i]) for row in table) for i in range(7)]
    print(f"{path} ({wf.format})")
    for i, row in enumerate(table):
        if i == len(table) - 2:
            print("  ".join("-" * w for w in widths))
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2])]
        cells += [row[3].rjust(widths[3]), row[4].rjust(widths[4]), row[5].rjust(widths[5]), row[6]]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"prunable: {TOTALS_COVER['prunable']}; total: {TOTALS_COVER['total']}")
    sizes = total["bytes"]
    print(
        f"storage: dense {_mib(sizes['dense'])}, CSR {_mib(sizes['csr'])}, "
        f"bitmask {_mib(sizes['bitmask'])}, 2:4 where it holds {_mib(sizes['semi_structured_2_4'])} (all tensors)"
    )
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``arrayprune`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; ``sys.argv[1:]`` if omitted.

    Returns
    -------
    int
        Exit status: 0 on success, 2 on any error (reported as one line on stderr).
    """
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(None if argv is None else list(argv))
        except SystemExit as exc:  # --help, --version
            return int(exc.code or 0)
        with fmt.cleanup_on_signals():  # SIGTERM, SIGHUP: temporary files removed, then exit 143, 129
            if args.command == "prune":
                return _cmd_prune(args)
            return _cmd_report(args)
    except CliError as exc:
        _error(str(exc))
    except fmt.FormatError as exc:
        _error(str(exc))
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        # output piped into a command that stopped reading (head, ...)
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0
    return 2


def _error(message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
    sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
