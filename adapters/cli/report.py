"""``arrayprune report``: every tensor of a file, its sparsity and storage, and totals that say what they cover."""

from __future__ import annotations

import argparse
import json
import os
import sys

from arrayprune.adapters.cli.compare import run_compare
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline import Hooks, StreamedCheckpoint, open_storage
from arrayprune.adapters.pipeline.errors import optional_module
from arrayprune.adapters.pipeline.outputs import check_not_input, check_output_name
from arrayprune.adapters.plan import nodes_text
from arrayprune.adapters.plots import plot_sparsity
from arrayprune.adapters.summary import TOTALS_COVER, report_rows, totals

from .errors import CliError
from .tensors import _stage

__all__ = ["TOTALS_COVER", "report_rows", "run_report"]


def run_report(args: argparse.Namespace) -> int:
    """Run ``arrayprune report``: the rows and totals of the summary stage, printed."""
    path = args.file
    if getattr(args, "compare", None) and getattr(args, "plot", None):
        raise CliError("--plot draws one file's sparsity; it does not go with --compare")
    if getattr(args, "compare", None):

        return run_compare(args)
    if not os.path.exists(path):
        raise CliError("no such file", path)
    plot = getattr(args, "plot", None)
    if plot is not None:
        _check_plot(path, plot)
    storage = open_storage(path, Hooks(stage=_stage))  # safetensors: headers only
    kind = storage.kind
    if isinstance(storage, StreamedCheckpoint):
        with TensorFiles() as files:  # tensors read one at a time
            rows = report_rows(storage.params, roles=storage.roles, load=files.load, scan=files.scan)
    else:
        rows = report_rows(storage.params, roles=storage.roles)
        for row in rows:  # bfloat16 read as float32 (ONNX): shown as stored
            row["dtype"] = storage.wf.context.get("stored_dtypes", {}).get(row["name"], row["dtype"])
    total = totals(rows)
    prunable = totals([r for r in rows if r["prunable"]])
    if plot is not None:

        try:
            plot_sparsity(rows, plot, title=f"{os.path.basename(path)}: sparsity per tensor")
        except ValueError as exc:
            raise CliError(f"--plot: {exc}", path) from None
    if args.json:
        out = {"file": path, "format": kind, "tensors": rows, "total": total, "prunable": prunable}
        json.dump({**out, "covers": TOTALS_COVER}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    header = ("name", "read by", "shape", "dtype", "role", "zeros", "sparsity", "2:4", "prunable")
    table: list[tuple[str, ...]] = [header]
    for r in rows:
        name = r["name"] + (" (masked)" if r["masked"] else "")
        shape = "x".join(map(str, r["shape"])) or "scalar"
        nm = "yes" if r["nm_2_4"] else "no"
        if r["tied_to"] is not None:
            note = f"tied to {r['tied_to']}"
        else:
            note = "yes" if r["prunable"] else f"no: {r['reason']}"
        zeros, sparsity = f"{r['zeros']}/{r['size']}", f"{100 * r['sparsity']:.2f}%"
        table.append((name, nodes_text(tuple(r["nodes"])), shape, r["dtype"], r["role"], zeros, sparsity, nm, note))
    for label, t in (("prunable", prunable), ("total", total)):
        zeros, sparsity = f"{t['zeros']}/{t['size']}", f"{100 * t['sparsity']:.2f}%"
        table.append((label, "", f"{t['tensors']} tensors", "", "", zeros, sparsity, "", ""))
    if not any(r["nodes"] for r in rows):  # no graph: no "read by" column
        table = [(row[0], *row[2:]) for row in table]
    left = len(table[0]) - 4  # name, [read by,] shape, dtype, role; then zeros, sparsity, 2:4; prunable
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    print(f"{path} ({kind})")
    for i, row in enumerate(table):
        if i == len(table) - 2:
            print("  ".join("-" * w for w in widths))
        cells = [row[i].ljust(widths[i]) for i in range(left)]
        cells += [row[i].rjust(widths[i]) for i in range(left, left + 3)] + [row[-1]]
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


def _check_plot(path: str, plot: str) -> None:
    """Refuse a ``--plot`` that cannot be written, or without matplotlib, before anything is read."""

    check_output_name(plot, "--plot")
    check_not_input(path, plot, "--plot", in_place=False)
    if os.path.isdir(plot):
        raise CliError("--plot: is a directory", plot)
    if not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
        raise CliError("--plot: folder does not exist", plot)
    optional_module("matplotlib", "plot", "--plot")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
