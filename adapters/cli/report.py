"""``arrayprune report``: every tensor of a file, its sparsity and storage, and totals that say what they cover."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.plan import _name, _size, alias_key, file_roles, make_plan, nodes_text
from arrayprune.adapters.roles import Role
from arrayprune.adapters.roles.names import dtype_name, is_float, tree_roles
from arrayprune.adapters.state_dict import _fold

from .errors import CliError
from .tensors import _check_arrays, _stage, _zeros

__all__ = ["TOTALS_COVER", "report_rows", "run_report"]


def report_rows(
    params: Mapping,
    *,
    storage: bool = True,
    roles: Mapping[tuple, Role] | None = None,
    load: Callable[[Any], Any] | None = None,
) -> list[dict[str, Any]]:
    """Per-tensor statistics of every array of a mapping.

    Pruned tensors (``name_orig`` + ``name_mask``) appear once, as their effective array.

    Parameters
    ----------
    params : mapping
        Names to arrays (possibly nested), or to stored tensors that `load` reads.
    storage : bool, default True
        Whether to compute ``nm_2_4`` and ``bytes`` (a pass over each tensor).
    roles : mapping, optional
        Path to role (:func:`arrayprune.adapters.plan.file_roles`); from the names and
        layout of `params` if omitted.
    load : callable, optional
        Reads one value of `params` as an array (one tensor in memory at a time):
        ``TensorFiles.load`` for :class:`~arrayprune.adapters.formats.safetensors_stream.StoredTensor`
        values.

    Returns
    -------
    list of dict
        Per tensor: ``name``, ``shape``, ``dtype``, ``size``, ``zeros``, ``sparsity``,
        ``masked``, ``role`` (and ``output_axis``, ``reduction_axis`` of a weight),
        ``nodes`` (the names of the graph nodes reading it, ONNX; else empty),
        ``prunable`` (whether ``prune`` selects it by default: a floating-point layer
        weight), ``reason`` (why not, or None),
        ``tied_to`` (the first name of the same tensor stored under several names, or
        None), ``nm_2_4`` (whether the tensor is 2:4 sparse along its reduction axis, the
        axis ``prune --method nm_structured`` uses, or its last axis when the role has
        none) and
        ``bytes`` (the storage forms of :func:`arrayprune.sparse_nbytes`).
    """
    masked = set(mp.pruned_keys(params))
    if roles is None:
        roles = tree_roles(params)
    plan = {e.path: e for e in make_plan(params, roles)}
    first_name: dict[Any, str] = {}
    rows = []
    for path, value, mask in mp.iter_entries(params):
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            continue  # plain numbers and strings of a checkpoint: not tensors
        key = alias_key(value)  # of the stored tensor: copies read one at a time may reuse memory
        if load is not None:
            value, mask = load(value), None if mask is None else load(mask)
        if mask is not None:
            value = _fold(value, mask)
        if load is None:
            key = alias_key(value)
        name = _name(path)
        tied_to = first_name.setdefault(key, name)
        n, z = _size(value), _zeros(value)
        entry = plan.get(path)
        role = roles.get(path, Role("other", why="unknown"))
        reason = entry.reason if entry is not None else "tied"
        row = {
            "name": name,
            "shape": [int(s) for s in value.shape],
            "dtype": dtype_name(value),
            "size": n,
            "zeros": z,
            "sparsity": z / n if n else 0.0,
            "masked": path in masked,
            "role": role.kind,
            "output_axis": role.output_axis,
            "reduction_axis": role.reduction_axis,
            "nodes": list(role.nodes),
            "prunable": reason is None,
            "reason": reason,
            "tied_to": None if tied_to == name else tied_to,
        }
        if storage:
            nbytes = (
                arrayprune.sparse_nbytes(value, dim=_nm_axis(role, value))
                if is_float(value)
                else {"dense": _dense_nbytes(value)}
            )
            row.update(nm_2_4="semi_structured_2_4" in nbytes, bytes=nbytes)
        rows.append(row)
    return rows


def _nm_axis(role: Role, value: Any) -> int:
    """The axis 2:4 groups of `value` run along: its role's reduction axis, else its last axis."""
    axis = role.reduction_axis
    return axis if axis is not None and 0 <= axis < len(value.shape) else -1


def _dense_nbytes(x: Any) -> int:
    itemsize = getattr(x.dtype, "itemsize", None)
    if itemsize is None:
        itemsize = np.dtype(dtype_name(x)).itemsize if dtype_name(x) in np.sctypeDict else 0
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
    if all("bytes" in r for r in rows):
        total["bytes"] = {
            form: sum(r["bytes"].get(form, r["bytes"]["dense"]) for r in rows)
            for form in ("dense", "csr", "bitmask", "semi_structured_2_4")
        }
    return total


TOTALS_COVER = {
    "total": "every tensor of the file, each counted once",
    "prunable": "the tensors prune selects by default: the floating-point layer weights",
}


def run_report(args: argparse.Namespace) -> int:
    path = args.file
    if not os.path.exists(path):
        raise CliError("no such file", path)
    with TensorFiles() as files:
        if sharded.is_sharded(path) or fmt.detect_format(path) == "safetensors":
            source = sharded.open_checkpoint(path)  # headers only; tensors read one at a time
            kind, params = source.kind, source.tensors
            rows = report_rows(params, roles=tree_roles(params), load=files.load)
        else:
            _stage(f"loading {path}")
            wf = fmt.load(path)
            _check_arrays(wf.params, path)
            kind, rows = wf.format, report_rows(wf.params, roles=file_roles(wf))
            for row in rows:  # bfloat16 read as float32 (ONNX): shown as stored
                row["dtype"] = wf.context.get("stored_dtypes", {}).get(row["name"], row["dtype"])
    total = _totals(rows)
    prunable = _totals([r for r in rows if r["prunable"]])
    if args.json:
        out = {"file": path, "format": kind, "tensors": rows, "total": total, "prunable": prunable}
        json.dump({**out, "covers": TOTALS_COVER}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = [("name", "read by", "shape", "dtype", "role", "zeros", "sparsity", "2:4", "prunable")]
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


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
