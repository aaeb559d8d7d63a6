"""The ``arrayprune`` command: prune the weights of a model file, or report its sparsity.

::

    arrayprune prune IN -o OUT --amount A [--method M] [--global] [--n N] [--dim D]
                     [--nm N:M] [--block RxC] [--min-sparsity F] [--max-sparsity F] [--lamp]
                     [--include PATTERN ...] [--exclude PATTERN ...] [--min-size N]
                     [--seed S] [--keep-masks] [--force] [--shrink [--groups {channels,heads}]]
                     [--verify [--verify-tol RTOL[,ATOL]] [--verify-data NPZ]]
    arrayprune report FILE [--json] [--compare OTHER] [--plot PNG]
    arrayprune scan IN --calibration NPZ -o SCAN.json [--plot PNG] [--method M] [--sparsities S1,S2,...]
    arrayprune eval MODEL --tokens NPZ [--compare DENSE] [--json OUT.json] [--device D] [--batch N]

Files are ``.npz``, ``.safetensors``, ``.onnx`` or PyTorch state dicts (``.pt``,
``.pth``, ``.bin``), recognised from their content (see
:mod:`arrayprune.adapters.formats`). The output format follows the suffix of OUT, or the
input's format for another suffix. IN (and FILE) may be a sharded safetensors checkpoint,
a folder or its ``*.safetensors.index.json``, pruned into the folder OUT
(:mod:`arrayprune.adapters.formats.sharded`); safetensors files and shards are pruned
tensor by tensor, in memory that does not grow with the model.

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

import os
import sys
from collections.abc import Sequence

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.cli.evaluate import run_eval
from arrayprune.adapters.cli.scan import run_scan
from arrayprune.adapters.pipeline.errors import PruneError, PruneProblems

from .errors import CliError, _error
from .options import build_parser
from .prune import run_prune
from .report import report_rows, run_report
from .tensors import stream_seed

__all__ = ["main", "build_parser", "CliError", "report_rows", "stream_seed"]


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
                return run_prune(args)
            if args.command == "scan":

                return run_scan(args)
            if args.command == "eval":
                return run_eval(args)
            return run_report(args)
    except PruneProblems as exc:  # several, found at once: how many, then one per line
        _error(f"{len(exc.problems)} problems:", *map(str, exc.problems))
    except PruneError as exc:  # CliError too
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
