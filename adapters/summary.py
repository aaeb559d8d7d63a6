"""The summary stage of the pipeline: every tensor's counts, and totals that say what they cover.

``arrayprune report`` prints these rows; ``arrayprune prune`` and
:func:`arrayprune.adapters.pipeline.prune_file` count the zeros of what they wrote with
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.plan import _name, _size, alias_key, make_plan
from arrayprune.adapters.roles import Role
from arrayprune.adapters.roles.names import dtype_name, is_float, tree_roles
from arrayprune.adapters.state_dict import _fold

__all__ = ["TOTALS_COVER", "PruneSummary", "Totals", "count_zeros", "report_rows", "totals"]


@dataclass
class Totals:
    """Tensors, entries and zero entries counted while writing."""

    tensors: int = 0
    size: int = 0
    zeros: int = 0

    def add(self, size: int, zeros: int) -> None:
        """Count one more tensor."""
        self.tensors += 1
        self.size += size
        self.zeros += zeros


@dataclass
class PruneSummary:
    """What :func:`~arrayprune.adapters.pipeline.stream_pruning.prune_stored` wrote.

    Attributes
    ----------
    pruned : Totals
        The tensors it pruned.
    whole : Totals
        Every tensor written.
    files : list of str
        Files written (for a checkpoint folder: shards, copied files, the index).
    left : list of str
        Files of a checkpoint folder that were not copied, each with the reason.
    by_tensor : dict of str to (int, int)
        Each pruned tensor's zeros and entries, by name.
    """

    pruned: Totals = field(default_factory=Totals)
    whole: Totals = field(default_factory=Totals)
    files: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    by_tensor: dict[str, tuple[int, int]] = field(default_factory=dict)


def count_zeros(x: Any) -> int:
    """The number of entries of array `x` equal to zero."""
    import array_api_compat as apc

    xp = apc.array_namespace(x)
    return int(xp.count_nonzero(x == 0))


def report_rows(
    params: Mapping,
    *,
    storage: bool = True,
    roles: Mapping[tuple, Role] | None = None,
    load: Callable[[Any], Any] | None = None,
    scan: Callable[[Any, int], tuple[int, bool] | None] | None = None,
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
    scan : callable, optional
        ``scan(value, dim)``: the zeros of a value of `params` and whether it is 2:4
        sparse along `dim`, read in chunks (``TensorFiles.scan``), or None to `load` it
        whole instead.

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
        role = roles.get(path, Role("other", why="unknown"))
        scanned = scan(value, _nm_axis(role, value)) if scan is not None and mask is None else None
        if scanned is not None:
            tied_to = first_name.setdefault(key, _name(path))
            rows.append(_row(path, value, scanned, role, plan, tied_to, masked, storage))
            continue
        if load is not None:
            value, mask = load(value), None if mask is None else load(mask)
        if mask is not None:
            value = _fold(value, mask)
        if load is None:
            key = alias_key(value)
        name = _name(path)
        tied_to = first_name.setdefault(key, name)
        n, z = _size(value), count_zeros(value)
        entry = plan.get(path)
        role = roles.get(path, Role("other", why="unknown"))
        reason = entry.reason if entry is not None else "tied"
        row = _fields(name, value, n, z, path in masked, role, reason, tied_to)
        if storage:
            nbytes = (
                arrayprune.sparse_nbytes(value, dim=_nm_axis(role, value))
                if is_float(value)
                else {"dense": _dense_nbytes(value)}
            )
            row.update(nm_2_4="semi_structured_2_4" in nbytes, bytes=nbytes)
        rows.append(row)
    return rows


def _fields(
    name: str, value: Any, n: int, z: int, masked: bool, role: Role, reason: str | None, tied_to: str
) -> dict[str, Any]:
    """The fields every row has: name, shape and dtype, counts, role and whether it is pruned."""
    return {
        "name": name,
        "shape": [int(s) for s in value.shape],
        "dtype": dtype_name(value),
        "size": n,
        "zeros": z,
        "sparsity": z / n if n else 0.0,
        "masked": masked,
        "role": role.kind,
        "output_axis": role.output_axis,
        "reduction_axis": role.reduction_axis,
        "nodes": list(role.nodes),
        "prunable": reason is None,
        "reason": reason,
        "tied_to": None if tied_to == name else tied_to,
    }


def _row(
    path: tuple,
    value: Any,
    scanned: tuple[int, bool],
    role: Role,
    plan: Mapping[tuple, Any],
    tied_to: str,
    masked: set,
    storage: bool,
) -> dict[str, Any]:
    """The row of a stored floating-point tensor read in chunks (``raw_dtype`` says its
    entries' width): the same as from the whole array."""
    name = _name(path)
    z, nm = scanned
    n = _size(value)
    entry = plan.get(path)
    reason = entry.reason if entry is not None else "tied"
    row = _fields(name, value, n, z, path in masked, role, reason, tied_to)
    if storage:  # arrayprune.sparse_nbytes, from the counts
        itemsize, nnz = int(value.raw_dtype.itemsize), n - z
        rows = value.shape[0] if len(value.shape) > 1 else 1
        nbytes = {
            "dense": n * itemsize,
            "csr": nnz * (itemsize + 4) + (rows + 1) * 4,
            "bitmask": nnz * itemsize + -(-n // 8),
        }
        if nm:
            nbytes["semi_structured_2_4"] = n // 2 * itemsize + n // 2 * 2 // 8
        row.update(nm_2_4=nm, bytes=nbytes)
    return row


def _nm_axis(role: Role, value: Any) -> int:
    """The axis 2:4 groups of `value` run along: its role's reduction axis, else its last axis."""
    axis = role.reduction_axis
    return axis if axis is not None and 0 <= axis < len(value.shape) else -1


def _dense_nbytes(x: Any) -> int:
    itemsize = getattr(x.dtype, "itemsize", None)
    if itemsize is None:
        itemsize = np.dtype(dtype_name(x)).itemsize if dtype_name(x) in np.sctypeDict else 0
    return _size(x) * int(itemsize)


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over `rows`, each tensor once (tied names are not counted again).

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`report_rows`.

    Returns
    -------
    dict
        ``tensors``, ``size``, ``zeros``, ``sparsity``, and ``bytes`` (each storage form)
        when every row has them.
    """
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
