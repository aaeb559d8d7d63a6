"""The pruning plan of a model file: every tensor, its role, and what would be pruned.

``arrayprune prune --dry-run`` prints this plan and writes nothing; ``prune`` follows
it. From Python::

    from arrayprune.adapters import formats, plan
    wf = formats.load("model.onnx")
    for entry in plan.make_plan(wf.params, plan.file_roles(wf), method="nm_structured"):
        print(entry.name, entry.role.kind, entry.prune, entry.dim, entry.reason)

Default selection: the layer weights (role ``weight``, see :mod:`arrayprune.adapters.roles`)
only. ``include`` patterns replace that rule (every floating tensor whose name matches,
whatever its role), ``exclude`` patterns remove tensors, ``min_size`` skips small ones.
A pattern matches a tensor when it matches its name or, in an ONNX model, the name of a
node reading it: ``--include "/encoder/*/query/MatMul"`` selects the weight of those
nodes, whatever its initializer is called (``onnx::MatMul_925``).
Methods that take a ``dim`` use each weight's own axis unless one is given: the output
axis for structured methods (whole output channels), the reduction axis for N:M
patterns (what sparse tensor cores need).
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.roles import Role
from arrayprune.adapters.roles.names import dtype_name, is_float, tree_roles
from arrayprune.adapters.roles.onnx_graph import onnx_roles
from arrayprune.method_parts import pattern_of
from arrayprune.registry import constructor_parameters

__all__ = [
    "PlanEntry", "alias_key", "file_roles", "format_plan", "make_plan", "nm_shortfalls", "nodes_text", "stream_seed"
]  # fmt: skip


@dataclass(frozen=True)
class PlanEntry:
    """One tensor of the plan.

    Attributes
    ----------
    path : tuple
        Where the tensor is in the file's mapping (pruned tensors under their own name).
    name : str
        The path joined with ``/``.
    shape : tuple of int
    dtype : str
    role : Role
        What the tensor is, and its axes.
    prune : bool
        Whether the plan prunes it.
    dim : int or None
        The axis the method uses for it (structured and N:M methods), else None.
    reason : str or None
        Why it is left alone, if it is.
    tied : tuple of tuple
        Other paths of the same tensor (tied weights): pruned once, written under all.
    value : array
        The tensor itself (not shown).
    """

    path: tuple
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role
    prune: bool
    dim: int | None = None
    reason: str | None = None
    tied: tuple[tuple, ...] = ()
    value: Any = field(default=None, repr=False, compare=False)


def _name(path: tuple) -> str:
    return "/".join(map(str, path))


def _size(x: Any) -> int:
    return math.prod(int(s) for s in x.shape)


def alias_key(value: Any) -> Any:
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


def _tensors(params: Mapping) -> list[tuple[tuple, Any, bool]]:
    """Every tensor of a mapping by path, pruned ones under their own name (their original)."""
    return [(p, v, m is not None) for p, v, m in mp.iter_entries(params) if hasattr(v, "shape") and hasattr(v, "dtype")]


def file_roles(wf: Any) -> dict[tuple, Role]:
    """The role of every tensor of a loaded weight file, by path.

    ONNX models are read from their graph; other files from the layout of training
    checkpoints and naming conventions (:mod:`arrayprune.adapters.roles.names`).

    Parameters
    ----------
    wf : WeightFile
        What :func:`arrayprune.adapters.formats.load` returned.

    Returns
    -------
    dict
        Path to :class:`~arrayprune.adapters.roles.Role`.
    """
    if wf.format == "onnx":

        by_name = onnx_roles(wf.context["model"])
        return {p: by_name.get(str(p[-1]), Role("other", why="not in the graph")) for p, _, _ in _tensors(wf.params)}
    return tree_roles(wf.params)


def make_plan(
    params: Mapping,
    roles: Mapping[tuple, Role],
    *,
    method: str = "l1_unstructured",
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    min_size: int = 0,
    dim: int | None = None,
    nm: bool = False,
) -> list[PlanEntry]:
    """The plan: every tensor of `params` in file order, with what would happen to it.

    Parameters
    ----------
    params : mapping
        The file's contents (possibly nested, possibly pruned before).
    roles : mapping
        Path to role, as :func:`file_roles` gives.
    method : str, default "l1_unstructured"
        A name of :data:`arrayprune.METHODS`; decides whether and which ``dim`` is needed.
    include, exclude : iterable of str
        fnmatch patterns on tensor names, or on the names of the graph nodes reading a
        tensor (``role.nodes``, ONNX): a pattern matches a tensor when it matches one
        of them (see the module docs).
    min_size : int, default 0
        Tensors with fewer entries are left alone.
    dim : int, optional
        The axis for every tensor, overriding each weight's own.
    nm : bool, default False
        An N:M pattern is asked of a method that takes no ``dim`` (SparseGPT's
        ``n`` and ``m``): each weight is planned on its reduction axis all the same.

    Returns
    -------
    list of PlanEntry
        One entry per tensor (tied names: one entry listing the others).
    """
    include, exclude = list(include), list(exclude)
    takes_dim = nm or "dim" in {p.name for p in constructor_parameters(arrayprune.METHODS[method])}
    cls = arrayprune.METHODS[method]
    # Which of a weight's axes the method's `dim` names: its pattern's say (N:M: the reduction).
    on_output = pattern_of(cls).dim_axis == "output" and not nm
    groups: dict[Any, list[tuple[tuple, Any]]] = {}
    for path, value, pruned in _tensors(params):
        key = ("pruned", path) if pruned else alias_key(value)
        groups.setdefault(key, []).append((path, value))
    plan = []
    for members in groups.values():
        path, value = members[0]
        names = [_name(p) for p, _ in members]
        role = roles.get(path, Role("other", why="unknown"))
        reason = _leave_reason(value, role, [*names, *role.nodes], include, exclude, min_size)
        axis = None
        if reason is None and takes_dim:
            axis = dim if dim is not None else (role.output_axis if on_output else role.reduction_axis)
            if axis is None and len(value.shape) == 1:
                axis = 0  # its only axis
            if axis is None:
                reason = f"its axes are unknown ({role.why}): pass --dim"
        plan.append(
            PlanEntry(
                path=path,
                name=names[0],
                shape=tuple(int(s) for s in value.shape),
                dtype=dtype_name(value),
                role=role,
                prune=reason is None,
                dim=axis,
                reason=reason,
                tied=tuple(p for p, _ in members[1:]),
                value=value,
            )
        )
    return plan


def _leave_reason(
    value: Any, role: Role, names: list[str], include: list[str], exclude: list[str], min_size: int
) -> str | None:
    """Why the plan leaves a tensor alone, or None if it prunes it."""
    if not is_float(value):
        return f"{dtype_name(value)}, not floating point"
    if _size(value) < min_size:
        return f"fewer than {min_size} entries (--min-size)"
    if any(fnmatch.fnmatchcase(name, pat) for name in names for pat in exclude):
        return "excluded (--exclude)"
    if include:
        if any(fnmatch.fnmatchcase(name, pat) for name in names for pat in include):
            return None
        return "not included (--include)"
    if role.kind != "weight":
        return f"not a layer weight ({role.why})" if role.why else "not a layer weight"
    return None


def nodes_text(nodes: tuple[str, ...], most: int = 2) -> str:
    """The names of the nodes reading a tensor, for people: at most `most`, the rest counted."""
    shown = ", ".join(nodes[:most])
    return shown + (f" (+{len(nodes) - most} more)" if len(nodes) > most else "")


def format_plan(plan: list[PlanEntry], *, amount: bool = True) -> str:
    """The plan as a table for people: one line per tensor, then a count.

    Parameters
    ----------
    plan : list of PlanEntry
        What :func:`make_plan` returned.
    amount : bool, default True
        Whether an amount was given; without one the plan lists roles and axes, and its
        last line says so.

    Returns
    -------
    str
        The table, with a ``read by`` column (the graph nodes reading each tensor) when
        any tensor has nodes.
    """
    with_nodes = any(e.role.nodes for e in plan)
    rows: list[tuple[str, ...]] = [("tensor", "read by", "role", "shape", "dtype", "plan")]
    for e in plan:
        if e.prune:
            what = "prune" + (f", dim {e.dim}" if e.dim is not None else "")
            what += f" ({e.role.why})" if e.role.why else ""
        else:
            what = f"leave: {e.reason}"
        shape = "x".join(map(str, e.shape)) or "scalar"
        name = e.name + (f" (= {', '.join(map(_name, e.tied))})" if e.tied else "")
        rows.append((name, nodes_text(e.role.nodes), e.role.kind, shape, e.dtype, what))
    if not with_nodes:
        rows = [(r[0], *r[2:]) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    chosen = [e for e in plan if e.prune]
    n = sum(math.prod(e.shape) for e in chosen)
    if amount:
        lines.append(f"{len(chosen)} of {len(plan)} tensors would be pruned ({n} entries)")
    else:
        lines.append(f"{len(chosen)} of {len(plan)} tensors selected ({n} entries); no --amount: roles and axes only")
    return "\n".join(lines)


def nm_shortfalls(plan: Iterable[PlanEntry], n: int, m: int, *, reduction: bool = True) -> list[str]:
    """Why each tensor the plan prunes with ``n`` of every ``m`` cannot hold the pattern.

    N:M groups run along each tensor's ``dim``; an axis whose length is not a multiple
    of `m` ends in a shorter group, which keeps up to ``m - n`` entries (a depthwise
    convolution's one input channel per group: nothing pruned).

    Parameters
    ----------
    plan : iterable of PlanEntry
        The plan (entries left alone, or without a ``dim``, are skipped).
    n, m : int
        ``n`` zeros in every ``m`` consecutive entries.
    reduction : bool, default True
        Whether ``dim`` is each weight's reduction axis (no ``--dim`` given), for the words.

    Returns
    -------
    list of str
        One line per tensor that cannot hold the pattern, in plan order: its name, why,
        and the fraction of it that ends zero (a dense tensor's).

    Examples
    --------
    >>> from arrayprune.adapters.roles import Role
    >>> e = PlanEntry(("c1.weight",), "c1.weight", (8, 3, 3, 3), "float32", Role("weight"), True, dim=1)
    >>> nm_shortfalls([e], 2, 4)
    ['c1.weight: reduction axis (dim 1) of length 3 is not a multiple of 4: 2:4 leaves it 33.33% zero, not 50%']
    """
    out = []
    for e in plan:
        if not e.prune or e.dim is None or not e.shape:
            continue
        length = e.shape[e.dim]
        if length % m == 0:
            continue
        zeros = (length // m) * n + max(0, length % m - (m - n))
        axis = f"{'reduction axis' if reduction else 'axis'} (dim {e.dim}) of length {length}"
        depthwise = "depthwise: " if length == 1 and len(e.shape) > 2 else ""
        out.append(
            f"{e.name}: {depthwise}{axis} is not a multiple of {m}: "
            f"{n}:{m} leaves it {100 * zeros / length:.2f}% zero, not {100 * n / m:g}%"
        )
    return out


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
