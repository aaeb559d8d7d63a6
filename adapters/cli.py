"""The ``arrayprune`` command: prune the weights of a model file, or report its sparsity.

::

    arrayprune prune IN -o OUT --amount A [--method M] [--global] [--n N] [--dim D]
                     [--nm N:M] [--block RxC] [--min-sparsity F] [--max-sparsity F] [--lamp]
                     [--include PATTERN ...] [--exclude PATTERN ...] [--min-size N]
                     [--seed S] [--keep-masks] [--force] [--verify]
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
:mod:`torch.nn.utils.prune` would.

Errors are one line on stderr, ``arrayprune: error: <file>: <problem>``, with exit
status 2; IN is never modified, and OUT is written to a temporary file renamed into
place, so it is never left half written.
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

__all__ = ["main", "build_parser", "CliError"]

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
    p.add_argument("--n", type=_norm_order, default=2, help="norm order of ln_structured (default: 2)")
    p.add_argument("--dim", type=int, default=None, help="channel axis of structured methods (default: 0; -1 for nm_structured)")
    p.add_argument("--nm", type=_pattern, default=(2, 4), metavar="N:M", help="nm_structured: N zeros in every M (default: 2:4)")
    p.add_argument("--block", type=_block, default=(1, 4), metavar="RxC", help="block_unstructured: block shape (default: 1x4)")
    p.add_argument("--min-sparsity", type=_fraction, default=None, metavar="F", help="--global: least sparsity of any tensor")
    p.add_argument("--max-sparsity", type=_fraction, default=None, metavar="F", help="--global: most sparsity of any tensor")
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
    p.add_argument("--seed", type=int, default=None, help="seed of the random methods")
    p.add_argument(
        "--keep-masks",
        action="store_true",
        help="write name_orig and name_mask (the PyTorch state-dict convention) instead of folded weights",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists (even if it is IN)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="ONNX: run original and pruned model on the same random inputs and print the largest difference",
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


def _select(params: Mapping, args: argparse.Namespace) -> list[tuple[tuple, Any]]:
    chosen = []
    for path, value, _ in _logical_tensors(params):
        name = _name(path)
        if not _is_float(value):
            continue
        if args.include:
            if not any(fnmatch.fnmatchcase(name, pat) for pat in args.include):
                continue
        elif len(value.shape) < 2:
            continue
        if any(fnmatch.fnmatchcase(name, pat) for pat in args.exclude):
            continue
        if _size(value) < args.min_size:
            continue
        chosen.append((path, value))
    return chosen


def _tensor_seed(seed: int | None, name: str) -> int | None:
    """A seed per tensor, from the user's seed and the tensor's name."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed & (2**63 - 1), zlib.crc32(name.encode())]).generate_state(1)[0])


def _generator_for(x: Any, seed: int | None) -> Any:
    if seed is None:
        return None
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        return torch.Generator(device=x.device).manual_seed(seed)
    if mod == "numpy":
        return np.random.default_rng(seed)
    return None


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
        gen = _generator_for(targets[0][1], args.seed)
        if gen is not None:
            kwargs["generator"] = gen
        elif args.seed is not None:
            kwargs["seed"] = args.seed
    return cls, kwargs


def _prune_entry(params: Mapping, key: Any, name: str, args: argparse.Namespace) -> Mapping:
    """`params` with `key` pruned by ``args.method`` (a mapping verb); seeds follow `name`."""
    method, amount = args.method, args.amount
    if method == "l1_unstructured":
        return mp.l1_unstructured(params, key, amount)
    if method == "random_unstructured":
        return mp.random_unstructured(params, key, amount, seed=_tensor_seed(args.seed, name))
    if method == "ln_structured":
        return mp.ln_structured(params, key, amount, args.n, args.dim)
    if method == "nm_structured":
        return mp.nm_structured(params, key, *args.nm, dim=args.dim)
    if method == "block_unstructured":
        return mp.block_unstructured(params, key, amount, args.block)
    return mp.random_structured(params, key, amount, args.dim, seed=_tensor_seed(args.seed, name))


def _prune_params(params: Mapping, targets: list[tuple[tuple, Any]], args: argparse.Namespace, src: str) -> Mapping:
    """`params` with the targets pruned, as ``name_orig`` + ``name_mask`` entries."""
    if args.global_:
        cls, kwargs = _global_arguments(targets, args)
        try:
            return mp.global_unstructured(params, [p for p, _ in targets], cls, **kwargs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"global pruning: {_message(exc)}", src) from None
    for path, _ in _progress(targets, "pruning"):
        try:
            params = _prune_entry(params, path, _name(path), args)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise CliError(f"tensor {_name(path)!r}: {_message(exc)}", src) from None
    return params


def _prune_folded(params: Mapping, targets: list[tuple[tuple, Any]], args: argparse.Namespace, src: str) -> Mapping:
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
    return mp.replace(params, folded)


def _message(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())


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
    if args.dim is None:
        args.dim = -1 if args.method == "nm_structured" else 0
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

    wf = fmt.load(src, in_format)
    if out_format == "onnx" and wf.context.get("external"):
        data = os.path.join(os.path.dirname(os.path.abspath(dst)), os.path.basename(dst) + ".data")
        if os.path.exists(data) and not args.force:
            raise CliError("exists (external data of the output); use --force to overwrite it", data)

    targets = _select(wf.params, args)
    if not targets:
        raise CliError("no tensor selected for pruning (see --include, --exclude, --min-size)", src)
    if args.keep_masks or mp.is_pruned(wf.params):
        params = _prune_params(wf.params, targets, args, src)
        folded = mp.apply_masks(params)
        out_params = params if args.keep_masks else folded
    else:
        folded = out_params = _prune_folded(wf.params, targets, args, src)
    fmt.save(dst, out_params, out_format, like=wf)

    selected = {p for p, _ in targets}
    total = zeros = 0
    for path, value in mp.iter_arrays(folded):
        if path in selected:
            total += _size(value)
            zeros += _zeros(value)
    detail = f"{args.nm[0]}:{args.nm[1]}" if args.method == "nm_structured" else f"amount {args.amount}"
    how = f"{args.method}{', global' if args.global_ else ''}, {detail}"
    pct = 100.0 * zeros / total if total else 0.0
    print(f"pruned {len(targets)} tensors of {src} ({how}): {zeros} of {total} entries zero ({pct:.2f}%) -> {dst}")
    if args.verify:
        diff, n_out = _verify(src, dst, args.seed)
        print(f"verify: max abs output difference {diff:.6g} over {n_out} outputs on random inputs")
    return 0


def _verify(src: str, dst: str, seed: int | None) -> tuple[float, int]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise CliError("--verify needs onnxruntime (pip install onnxruntime)") from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sessions = []
    for path in (src, dst):
        try:
            sessions.append(ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]))
        except Exception as exc:
            raise CliError(f"onnxruntime cannot load the model: {fmt._describe(exc)}", path) from None
    rng = np.random.default_rng(0 if seed is None else seed)
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
    for path, session in zip((src, dst), sessions):
        try:
            results.append(session.run(None, feeds))
        except Exception as exc:
            raise CliError(f"onnxruntime failed to run the model: {fmt._describe(exc)}", path) from None
    diff = 0.0
    for a, b in zip(*results):
        a, b = np.asarray(a), np.asarray(b)
        if a.size:
            diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return diff, len(results[0])


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def report_rows(params: Mapping) -> list[dict[str, Any]]:
    """Per-tensor statistics of the floating-point tensors of a mapping.

    Pruned tensors (``name_orig`` + ``name_mask``) appear once, as their effective array.

    Parameters
    ----------
    params : mapping
        Names to arrays.

    Returns
    -------
    list of dict
        ``name``, ``shape``, ``dtype``, ``size``, ``zeros``, ``sparsity``, ``masked``,
        ``nm_2_4`` (whether the tensor is 2:4 sparse along its last axis) and ``bytes``
        (the storage forms of :func:`arrayprune.sparse_nbytes`) per tensor.
    """
    masked = set(mp.pruned_keys(params))
    rows = []
    for path, value in mp.iter_arrays(params, effective=True):
        if not _is_float(value):
            continue
        n, z = _size(value), _zeros(value)
        nbytes = arrayprune.sparse_nbytes(value)
        rows.append(
            {
                "name": _name(path),
                "shape": [int(s) for s in value.shape],
                "dtype": _dtype_name(value),
                "size": n,
                "zeros": z,
                "sparsity": z / n if n else 0.0,
                "masked": path in masked,
                "nm_2_4": "semi_structured_2_4" in nbytes,
                "bytes": nbytes,
            }
        )
    return rows


def _cmd_report(args: argparse.Namespace) -> int:
    path = args.file
    if not os.path.exists(path):
        raise CliError("no such file", path)
    wf = fmt.load(path)
    rows = report_rows(wf.params)
    size = sum(r["size"] for r in rows)
    zeros = sum(r["zeros"] for r in rows)
    total = {"tensors": len(rows), "size": size, "zeros": zeros, "sparsity": zeros / size if size else 0.0}
    total["bytes"] = {
        form: sum(r["bytes"].get(form, r["bytes"]["dense"]) for r in rows)
        for form in ("dense", "csr", "bitmask", "semi_structured_2_4")
    }
    if args.json:
        json.dump({"file": path, "format": wf.format, "tensors": rows, "total": total}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = [("name", "shape", "dtype", "zeros", "sparsity", "2:4")]
    for r in rows:
        name = r["name"] + (" (masked)" if r["masked"] else "")
        shape = "x".join(map(str, r["shape"])) or "scalar"
        nm = "yes" if r["nm_2_4"] else "no"
        table.append((name, shape, r["dtype"], f"{r['zeros']}/{r['size']}", f"{100 * r['sparsity']:.2f}%", nm))
    table.append(("total", f"{len(rows)} tensors", "", f"{zeros}/{size}", f"{100 * total['sparsity']:.2f}%", ""))
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    print(f"{path} ({wf.format})")
    for i, row in enumerate(table):
        if i == len(table) - 1:
            print("  ".join("-" * w for w in widths))
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2])]
        cells += [row[3].rjust(widths[3]), row[4].rjust(widths[4]), row[5].rjust(widths[5])]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sizes = total["bytes"]
    print(
        f"storage: dense {_mib(sizes['dense'])}, CSR {_mib(sizes['csr'])}, "
        f"bitmask {_mib(sizes['bitmask'])}, 2:4 where it holds {_mib(sizes['semi_structured_2_4'])}"
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
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
    sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
