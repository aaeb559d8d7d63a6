"""Roles of the initializers of an ONNX model, read from its graph.

An initializer is what the operators reading it make of it: the ``B`` input of a
``MatMul`` is a layer weight ``[K, N]`` (reduction axis 0, output axis 1), the ``C`` input
of a ``Gemm`` a bias, the ``data`` input of a ``Gather`` an embedding table.
:func:`onnx_roles` follows every initializer of the main graph to the operators that
read it, through simple chains and into subgraphs, and gives each one a
:class:`~arrayprune.adapters.roles.Role`.

Rules
-----
By operator input, as the operator sees it (axes: output, reduction):

* **weight**, with its axes:

  - ``MatMul`` B ``[K, N]`` or ``[..., K, N]``: the last axis, the one before it; the
    same for ``MatMulInteger`` B and ``QLinearMatMul`` b;
  - ``MatMul`` A ``[M, K]`` or ``[..., M, K]``: the axis before the last, the last (and
    so for the integer and quantized products); a 1-D A or B ``[K]``: None, 0;
  - ``Gemm`` A: ``[M, K]`` (0, 1) with ``transA=0``, ``[K, M]`` (1, 0) with ``transA=1``;
  - ``Gemm`` B: ``[K, N]`` (1, 0) with ``transB=0``, ``[N, K]`` (0, 1) with ``transB=1``;
  - ``Conv``, ``ConvInteger`` W and ``QLinearConv`` w ``[out, in/groups, k...]``: 0, 1;
  - ``ConvTranspose`` W ``[in, out/groups, k...]``: 1, 0.

* **bias**: ``Gemm`` C, ``Conv`` and ``ConvTranspose`` B, ``QLinearConv`` B, either input
  of ``Add`` (of any shape: skl2onnx writes ``[1, N]``).
* **embedding**: ``Gather`` data (with ``axis=0``), the embeddings of
  ``EmbedLayerNormalization``.
* **norm**: the scales, biases and statistics of ``LayerNormalization``,
  ``BatchNormalization`` (scale, B, mean, var), ``InstanceNormalization``,
  ``GroupNormalization``, ``RMSNormalization``, and of ONNX Runtime's
  ``SimplifiedLayerNormalization``, ``SkipLayerNormalization``,
  ``SkipSimplifiedLayerNormalization`` and ``EmbedLayerNormalization`` (by operator name).
* **other**: ``Einsum`` (its equation is not read), any other input (the why names it:
  ``"Mul input"``, ``"Reshape shape"``, ``"DequantizeLinear x_scale"``), a graph output,
  and ``"unused"``.

``FusedConv`` and ``FusedGemm`` (ONNX Runtime's fused operators) read their inputs as
``Conv`` and ``Gemm`` do. ``Shape`` and ``Size`` read only the shape of a tensor: such
uses do not count, unless they are its only ones.

**Chains.** Between the initializer and the operator, these are followed, and the
operator's axes mapped back to the initializer's: ``Transpose`` (axis ``i`` of the
output is axis ``perm[i]`` of the input; no ``perm`` reverses the axes), ``Cast``,
``CastLike``, ``Identity``, ``QuantizeLinear`` and ``DequantizeLinear`` (their ``x``;
scales and zero points are ``other``), ``Squeeze`` and ``Unsqueeze`` (size-1 axes
dropped or added), ``Reshape`` and ``Flatten`` when they only add or drop size-1 axes
(any other reshape stops the chain: the initializer is ``other``, and the why says so).
A ``Reshape`` needs its shape, ``Squeeze`` and ``Unsqueeze`` their axes (if given) as
constants: initializers or ``Constant`` nodes.

**Subgraphs.** A node inside the body of a ``Loop`` or ``Scan``, the branches of an
``If`` (any graph attribute, at any depth) that reads an initializer of the main graph
by name counts the same, unless the subgraph defines that name itself (as an input, an
initializer or a node output), which hides the outer one. Initializers stored *inside*
subgraphs get their roles from the nodes of their own graph (and of the graphs inside
it) that read them, as the main graph's do; the first initializer of a name wins.

**Several uses.** An initializer read by several operators, or through several chains:

* all uses agree (same role, same axes): that role; the why lists the uses;
* all uses are weights, with different axes: ``weight`` with both axes None, and the why
  says ``"used with different axes: ..."``, listing each use with its axes (a method that
  needs an axis asks for ``--dim``);
* a weight somewhere and something else elsewhere (an embedding table tied to an output
  projection, say): the other role, with the why ending in ``"also ..."`` naming the
  weight uses. Pruning changes every use of a tensor, so only a tensor that is a weight
  everywhere is a weight; the others are left alone unless asked for by name
  (``--include``), as the name rules leave a tied ``lm_head`` alone;
* two different non-weight roles (a bias here, a norm there): ``other``, listing them.

Nothing is guessed silently: every role carries the uses it was read from in its why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from . import Role

__all__ = ["Feed", "onnx_roles", "weight_feeds", "weight_levels"]

# Operators that pass a tensor on with its axes intact, and the input they pass.
_SAME_AXES = {"Cast": 0, "CastLike": 0, "Identity": 0, "QuantizeLinear": 0, "DequantizeLinear": 0}
# Operators that pass a tensor on with its axes moved or reshaped, and the input they pass.
_MOVE_AXES = {"Transpose": 0, "Squeeze": 0, "Unsqueeze": 0, "Reshape": 0, "Flatten": 0}

# Operators that only read the shape of their input.
_SHAPE_ONLY = ("Shape", "Size")

# Matrix products: op -> (index of A, index of B, name of A, name of B).
_MATMULS = {
    "MatMul": (0, 1, "A", "B"),
    "MatMulInteger": (0, 1, "A", "B"),
    "QLinearMatMul": (0, 3, "a", "b"),
}
# Convolutions: op -> (index of W, name of W, index of the bias or None).
_CONVS: dict[str, tuple[int, str, int | None]] = {
    "Conv": (1, "W", 2),
    "FusedConv": (1, "W", 2),
    "ConvInteger": (1, "w", None),
    "QLinearConv": (3, "w", 8),
    "ConvTranspose": (1, "W", 2),
}
_GEMMS = ("Gemm", "FusedGemm")

# Inputs with a role of their own: op -> {input index: (kind, name of the input)}.
_NAMED_INPUTS: dict[str, dict[int, tuple[str, str]]] = {
    "Add": {0: ("bias", "input"), 1: ("bias", "input")},
    "LayerNormalization": {1: ("norm", "scale"), 2: ("norm", "bias")},
    "BatchNormalization": {1: ("norm", "scale"), 2: ("norm", "B"), 3: ("norm", "mean"), 4: ("norm", "var")},
    "InstanceNormalization": {1: ("norm", "scale"), 2: ("norm", "B")},
    "GroupNormalization": {1: ("norm", "scale"), 2: ("norm", "bias")},
    "RMSNormalization": {1: ("norm", "scale")},
    "SimplifiedLayerNormalization": {1: ("norm", "scale")},
    "SkipLayerNormalization": {2: ("norm", "gamma"), 3: ("norm", "beta"), 4: ("norm", "bias")},
    "SkipSimplifiedLayerNormalization": {2: ("norm", "gamma"), 3: ("norm", "bias")},
    "EmbedLayerNormalization": {
        2: ("embedding", "word_embedding"),
        3: ("embedding", "position_embedding"),
        4: ("embedding", "segment_embedding"),
        5: ("norm", "gamma"),
        6: ("norm", "beta"),
    },
    "Gather": {1: ("other", "indices")},
    "QuantizeLinear": {1: ("other", "y_scale"), 2: ("other", "y_zero_point")},
    "DequantizeLinear": {1: ("other", "x_scale"), 2: ("other", "x_zero_point")},
    "MatMulInteger": {2: ("other", "a_zero_point"), 3: ("other", "b_zero_point")},
    "ConvInteger": {2: ("other", "x_zero_point"), 3: ("other", "w_zero_point")},
    "QLinearMatMul": {
        1: ("other", "a_scale"),
        2: ("other", "a_zero_point"),
        4: ("other", "b_scale"),
        5: ("other", "b_zero_point"),
        6: ("other", "y_scale"),
        7: ("other", "y_zero_point"),
    },
    "QLinearConv": {
        1: ("other", "x_scale"),
        2: ("other", "x_zero_point"),
        4: ("other", "w_scale"),
        5: ("other", "w_zero_point"),
        6: ("other", "y_scale"),
        7: ("other", "y_zero_point"),
    },
    "Reshape": {1: ("other", "shape")},
    "Squeeze": {1: ("other", "axes")},
    "Unsqueeze": {1: ("other", "axes")},
}

_MAX_WHYS = 4  # distinct uses named in a why; more are counted


def _onnx() -> ModuleType:
    """The ``onnx`` package (an optional dependency), with its helpers loaded."""
    try:
        import onnx
        import onnx.helper
        import onnx.numpy_helper
    except ImportError as exc:
        raise ImportError(f'reading an ONNX graph needs onnx: pip install "arrayprune[onnx]" ({exc})') from None
    return onnx


@dataclass(eq=False)
class _Graph:
    """A graph of the model, with what the search for the readers of a name needs."""

    proto: Any
    where: str  # "" for the main graph, else which attribute of which node holds it
    parent: _Graph | None
    consumers: dict[str, list[tuple[Any, int]]] = field(default_factory=dict)
    subgraphs: list[_Graph] = field(default_factory=list)
    defined: set[str] = field(default_factory=set)
    outputs: set[str] = field(default_factory=set)
    free: set[str] = field(default_factory=set)  # names read here or deeper, defined further out
    constants: dict[str, Any] = field(default_factory=dict)  # name -> TensorProto


def _node_label(node: Any) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else node.op_type


def _build(onnx: ModuleType, proto: Any, where: str, parent: _Graph | None) -> _Graph:
    g = _Graph(proto, where, parent)
    g.defined.update(v.name for v in proto.input)
    g.defined.update(t.name for t in proto.initializer)
    g.defined.update(s.values.name for s in proto.sparse_initializer)
    g.outputs.update(v.name for v in proto.output)
    g.constants.update((t.name, t) for t in proto.initializer)
    read: set[str] = set(g.outputs)
    for node in proto.node:
        g.defined.update(o for o in node.output if o)
        for i, name in enumerate(node.input):
            if name:
                g.consumers.setdefault(name, []).append((node, i))
                read.add(name)
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value" and node.output:
                g.constants[node.output[0]] = attr.t
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else []
            if attr.type == onnx.AttributeProto.GRAPHS:
                subs = list(attr.graphs)
            for k, sub in enumerate(subs):
                name = attr.name if len(subs) == 1 else f"{attr.name}[{k}]"
                label = f"{_node_label(node)} {name}"
                sg = _build(onnx, sub, f"{where} > {label}" if where else label, g)
                g.subgraphs.append(sg)
                read.update(sg.free)
    g.free = read - g.defined
    return g


def _constant(onnx: ModuleType, g: _Graph, name: str) -> list[int] | None:
    """The value of an integer constant visible in `g` (a shape, axes), or None."""
    scope: _Graph | None = g
    while scope is not None and name not in scope.defined:
        scope = scope.parent
    if scope is None or name not in scope.constants:
        return None
    tensor = scope.constants[name]
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        value = onnx.numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a damaged constant: the chain stops
        return None
    if value.dtype.kind not in "iu" or value.ndim > 1:
        return None
    return [int(v) for v in value.reshape(-1)]


def _attr(onnx: ModuleType, node: Any, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


@dataclass(frozen=True)
class _Track:
    """A value computed from an initializer by a chain of axis-preserving operators."""

    axes: tuple[int | None, ...]  # for each axis of the value: the initializer's axis, or None
    shape: tuple[int, ...]
    chain: tuple[str, ...] = ()  # the operators passed, in order


@dataclass(frozen=True)
class _Use:
    """One use of an initializer, as the role it gives (axes: the initializer's)."""

    role: Role
    shape_only: bool = False
    site: tuple[Any, int, str] | None = None  # the operator reading it: (node, input index, graph)
    chain: tuple[str, ...] = ()  # the operators passed between the initializer and the reader


def _axes_of(
    onnx: ModuleType, g: _Graph, node: Any, track: _Track
) -> tuple[tuple[int | None, ...], tuple[int, ...]] | str:
    """The axes and shape of the output of `node` (one of :data:`_MOVE_AXES`), or why not."""
    op, shape, axes, rank = node.op_type, track.shape, track.axes, len(track.shape)
    if op == "Transpose":
        perm = _attr(onnx, node, "perm")
        perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
        if sorted(perm) != list(range(rank)):
            return f"Transpose perm {perm} does not fit {rank} axes"
        return tuple(axes[p] for p in perm), tuple(shape[p] for p in perm)
    if op in ("Squeeze", "Unsqueeze"):
        if len(node.input) > 1 and node.input[1]:
            listed = _constant(onnx, g, node.input[1])
            if listed is None:
                return f"{op} axes not a constant"
        else:
            listed = _attr(onnx, node, "axes")
        if op == "Squeeze":
            if listed is None:
                drop = {i for i, d in enumerate(shape) if d == 1}
            else:
                drop = {a + rank if a < 0 else a for a in listed}
            if any(not 0 <= a < rank or shape[a] != 1 for a in drop):
                return f"Squeeze axes {sorted(drop)} do not fit shape {list(shape)}"
            keep = [i for i in range(rank) if i not in drop]
            return tuple(axes[i] for i in keep), tuple(shape[i] for i in keep)
        if listed is None:
            return "Unsqueeze without axes"
        new_rank = rank + len(listed)
        added = {a + new_rank if a < 0 else a for a in listed}
        if len(added) != len(listed) or any(not 0 <= a < new_rank for a in added):
            return f"Unsqueeze axes {sorted(listed)} do not fit {rank} axes"
        it = iter(range(rank))
        old = [None if i in added else next(it) for i in range(new_rank)]
        return (
            tuple(None if o is None else axes[o] for o in old),
            tuple(1 if o is None else shape[o] for o in old),
        )
    if op == "Flatten":
        k = int(_attr(onnx, node, "axis", 1))
        k = k + rank if k < 0 else k
        if not 0 <= k <= rank:
            return f"Flatten axis {k} does not fit {rank} axes"
        new: tuple[int, ...] = (_prod(shape[:k]), _prod(shape[k:]))
    else:  # Reshape
        target = _constant(onnx, g, node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if target is None:
            return "Reshape shape not a constant"
        allowzero = int(_attr(onnx, node, "allowzero", 0))
        new_list = [shape[i] if d == 0 and not allowzero and i < rank else d for i, d in enumerate(target)]
        if new_list.count(-1) == 1:
            known = _prod(d for d in new_list if d != -1)
            if known == 0 or _prod(shape) % known:
                return f"Reshape to {target} does not fit shape {list(shape)}"
            new_list[new_list.index(-1)] = _prod(shape) // known
        if any(d < 0 for d in new_list) or _prod(new_list) != _prod(shape):
            return f"Reshape to {target} does not fit shape {list(shape)}"
        new = tuple(new_list)
    return _regroup(op, shape, axes, new)


def _regroup(
    op: str, shape: tuple[int, ...], axes: tuple[int | None, ...], new: tuple[int, ...]
) -> tuple[tuple[int | None, ...], tuple[int, ...]] | str:
    """Axes after a reshape from `shape` to `new` that only adds or drops size-1 axes."""
    if tuple(new) == tuple(shape):
        return axes, shape
    old_big = [i for i, d in enumerate(shape) if d != 1]
    new_big = [i for i, d in enumerate(new) if d != 1]
    if [shape[i] for i in old_big] != [new[i] for i in new_big]:
        return f"{op} from {list(shape)} to {list(new)} merges or splits axes"
    mapped: list[int | None] = [None] * len(new)
    for o, n in zip(old_big, new_big, strict=True):
        mapped[n] = axes[o]
    return tuple(mapped), tuple(new)


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _dims(labels: str, rank: int) -> str:
    """``[K, N]`` for a 2-D operand, ``[..., K, N]`` for more, ``[K]`` for a vector."""
    parts = labels.split(",")
    if rank == 1:
        return "[K]"
    return "[" + ("..., " if rank > 2 else "") + ", ".join(p.strip() for p in parts) + "]"


def _kernel(first: str, rank: int) -> str:
    spatial = rank - 2
    names = ["kD", "kH", "kW"][-spatial:] if 0 < spatial <= 3 else [f"k{i + 1}" for i in range(spatial)]
    return "[" + ", ".join([first, *names]) + "]"


def _rule(onnx: ModuleType, node: Any, i: int, rank: int) -> Role:
    """The role an operator input gives the tensor it reads (axes: as the operator sees it)."""
    op = node.op_type
    if op in _MATMULS:
        ia, ib, na, nb = _MATMULS[op]
        if i in (ia, ib) and rank >= 1:
            if rank == 1:
                return Role("weight", None, 0, f"{op} {na if i == ia else nb} [K]")
            if i == ib:
                return Role("weight", rank - 1, rank - 2, f"{op} {nb} {_dims('K, N', rank)}")
            return Role("weight", rank - 2, rank - 1, f"{op} {na} {_dims('M, K', rank)}")
    if op in _GEMMS and i in (0, 1, 2):
        if i == 2:
            return Role("bias", why=f"{op} C")
        name, attr = ("A", "transA") if i == 0 else ("B", "transB")
        t = int(_attr(onnx, node, attr, 0))
        if rank != 2:
            return Role("other", why=f"{op} {name} of {rank} dimensions, not 2")
        if i == 0:
            out, red, layout = (1, 0, "[K, M]") if t else (0, 1, "[M, K]")
        else:
            out, red, layout = (0, 1, "[N, K]") if t else (1, 0, "[K, N]")
        return Role("weight", out, red, f"{op} {name} ({attr}={t}) {layout}")
    if op in _CONVS:
        iw, name, conv_bias = _CONVS[op]
        if i == conv_bias:
            return Role("bias", why=f"{op} B")
        if i == iw:
            if rank < 3:
                return Role("other", why=f"{op} {name} of {rank} dimensions, not 3 or more")
            if op == "ConvTranspose":
                return Role("weight", 1, 0, f"{op} {name} {_kernel('in, out/groups', rank)}")
            return Role("weight", 0, 1, f"{op} {name} {_kernel('out, in/groups', rank)}")
    if op == "Gather" and i == 0:
        axis = int(_attr(onnx, node, "axis", 0))
        if axis in (0, -rank):
            return Role("embedding", why="Gather data")
        return Role("other", why=f"Gather data (axis={axis})")
    if op == "Einsum":
        return Role("other", why="Einsum input (equation not read)")
    named = _NAMED_INPUTS.get(op, {}).get(i)
    if named is not None:
        return Role(named[0], why=f"{op} {named[1]}")
    return Role("other", why=f"{op} input")


def _prefix(track: _Track) -> str:
    return "".join(f"{op} -> " for op in track.chain)


def _uses(onnx: ModuleType, g: _Graph, name: str, track: _Track, seen: frozenset) -> list[_Use]:
    """Every use of the value `name` of `g` (computed from an initializer as `track` says)."""
    key = (id(g), name)
    if key in seen:  # a cycle: not a valid graph; nothing more to learn
        return []
    seen = seen | {key}
    uses = []
    if name in g.outputs:
        what = f"output of {g.where}" if g.where else "graph output"
        uses.append(_Use(Role("other", why=_prefix(track) + what)))
    for node, i in g.consumers.get(name, ()):
        uses.extend(_consume(onnx, g, node, i, track, seen))
    for sub in g.subgraphs:
        if name in sub.free:
            uses.extend(_uses(onnx, sub, name, track, seen))
    return uses


def _consume(onnx: ModuleType, g: _Graph, node: Any, i: int, track: _Track, seen: frozenset) -> list[_Use]:
    """The uses of a value read as input `i` of `node`: its role, or those of a chain."""
    op = node.op_type
    where = f" (in {g.where})" if g.where else ""
    if op in _SHAPE_ONLY:
        return [_Use(Role("other", why=f"{_prefix(track)}{op} input{where}"), shape_only=True)]
    if _SAME_AXES.get(op, _MOVE_AXES.get(op)) == i:
        moved = (track.axes, track.shape) if op in _SAME_AXES else _axes_of(onnx, g, node, track)
        if isinstance(moved, str):
            return [_Use(Role("other", why=f"{_prefix(track)}{moved}{where}"))]
        nxt = _Track(moved[0], moved[1], (*track.chain, op))
        out = node.output[0] if node.output else ""
        uses = _uses(onnx, g, out, nxt, seen) if out else []
        return uses or [_Use(Role("other", why=f"{_prefix(nxt)}unused{where}"))]
    role = _rule(onnx, node, i, len(track.shape))

    def back(axis: int | None) -> int | None:
        return None if axis is None else track.axes[axis]

    why = _prefix(track) + role.why + where
    role = Role(role.kind, back(role.output_axis), back(role.reduction_axis), why)
    return [_Use(role, site=(node, i, g.where), chain=track.chain)]


def _join(whys: list[str]) -> str:
    """Distinct whys in order of appearance, repeated ones counted, at most a few named."""
    counts = Counter(whys)
    parts = [w if counts[w] == 1 else f"{w} ({counts[w]} uses)" for w in dict.fromkeys(whys)]
    if len(parts) > _MAX_WHYS:
        parts = [*parts[:_MAX_WHYS], f"and {len(parts) - _MAX_WHYS} more"]
    return "; ".join(parts)


def _combine(uses: list[_Use]) -> Role:
    """One role from all the uses of an initializer (see the module's notes)."""
    if not uses:
        return Role("other", why="unused")
    values = [u.role for u in uses if not u.shape_only]
    if not values:
        return Role("other", why=f"only its shape is read: {_join([u.role.why for u in uses])}")
    kinds = list(dict.fromkeys(r.kind for r in values))
    if kinds == ["weight"]:
        axes = list(dict.fromkeys((r.output_axis, r.reduction_axis) for r in values))
        if len(axes) == 1:
            return Role("weight", axes[0][0], axes[0][1], _join([r.why for r in values]))
        each = [f"{r.why} (output axis {r.output_axis}, reduction axis {r.reduction_axis})" for r in values]
        return Role("weight", None, None, "used with different axes: " + _join(each))
    if len(kinds) == 1:
        return Role(kinds[0], why=_join([r.why for r in values]))
    others = [k for k in kinds if k != "weight"]
    if len(others) == 1:
        own = _join([r.why for r in values if r.kind == others[0]])
        rest = _join([r.why for r in values if r.kind == "weight"])
        return Role(others[0], why=f"{own}; also {rest}")
    return Role("other", why="used as " + _join([f"{r.kind} ({r.why})" for r in values]))


def _initializer_uses(onnx: ModuleType, model: Any, main: _Graph) -> dict[str, list[_Use]]:
    """Every use of every initializer, in graph order: the main graph's, then those stored
    inside subgraphs (depth first), each read in its own graph; a name seen before is
    skipped (as the loader skips it)."""
    found: dict[str, list[_Use]] = {}

    def visit(g: _Graph) -> None:
        for tensor in g.proto.initializer:
            if tensor.name not in found:
                shape = tuple(int(d) for d in tensor.dims)
                track = _Track(tuple(range(len(shape))), shape)
                found[tensor.name] = _uses(onnx, g, tensor.name, track, frozenset())
        for sub in g.subgraphs:
            visit(sub)

    visit(main)
    return found


def _node_names(uses: list[_Use]) -> tuple[str, ...]:
    """The names of the operators reading an initializer (at the end of each chain), once each."""
    return tuple(dict.fromkeys(u.site[0].name for u in uses if u.site is not None and u.site[0].name))


def onnx_roles(model: Any) -> dict[str, Role]:
    """The role of every initializer of an ONNX model, read from its graph.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (external data need not be loaded: only names, shapes, small integer
        constants and the graph are read).

    Returns
    -------
    dict of str to Role
        Every initializer of the main graph by name, in graph order, then those stored
        inside subgraphs (read in their own graph), then the sparse initializers of the
        main graph (``other``: they are not loaded), unless a name is already there. Weights have
        their output and reduction axes (of the initializer as stored); the why of each
        role names the operator inputs it was read from (see the module's notes), and
        its ``nodes`` the names of those operators.

    Raises
    ------
    ImportError
        If the ``onnx`` package is missing.
    """
    onnx = _onnx()
    main = _build(onnx, model.graph, "", None)
    roles = {
        name: replace(_combine(uses), nodes=_node_names(uses))
        for name, uses in _initializer_uses(onnx, model, main).items()
    }
    for sparse in model.graph.sparse_initializer:
        roles.setdefault(sparse.values.name, Role("other", why="sparse initializer: not loaded"))
    return roles


@dataclass(frozen=True)
class Feed:
    """What a weight multiplies in one of its uses: an activation and its feature axis.

    Attributes
    ----------
    activation : str
        Name of the value of the main graph the operator multiplies the weight with
        (``MatMul`` A, ``Gemm`` A, a convolution's X, ...).
    feature_axis : int
        Axis of that activation running over the weight's input features (the
        reduction axis of the product): negative counts from the end. ``-2`` on a 1-D
        activation means its only axis.
    groups : int
        Groups of a convolution whose output unit reads one group of input channels
        (``Conv`` ``groups``); 1 otherwise.
    why : str
        The operator input, as in the weight's role.
    chain : tuple of str
        The operators between the initializer and the product (``("Transpose",)``, ...),
        in order; empty when the product reads the initializer itself.
    node : onnx.NodeProto or None
        The operator that multiplies (for its attributes: a convolution's strides, pads,
        dilations); not compared.
    """

    activation: str
    feature_axis: int
    groups: int
    why: str
    chain: tuple[str, ...] = ()
    node: Any = field(default=None, compare=False, repr=False)


def _feed(onnx: ModuleType, use: _Use) -> Feed | str:
    """The :class:`Feed` of a weight use, or why its activation cannot be read."""
    if use.site is None:
        return "no operator reads it"
    node, i, where = use.site
    op = node.op_type
    if where:
        return f"{use.role.why}: inside a subgraph"
    if op in ("MatMul", "FusedMatMul") and i in (0, 1):
        return Feed(node.input[1 - i], -1 if i == 1 else -2, 1, use.role.why, use.chain, node)
    if op in _GEMMS and i in (0, 1):
        if i == 1:
            axis = 0 if int(_attr(onnx, node, "transA", 0)) else 1
        else:
            axis = 1 if int(_attr(onnx, node, "transB", 0)) else 0
        return Feed(node.input[1 - i], axis, 1, use.role.why, use.chain, node)
    if op in ("Conv", "FusedConv") and i == 1:
        return Feed(node.input[0], 1, int(_attr(onnx, node, "group", 1)), use.role.why, use.chain, node)
    if op == "ConvTranspose" and i == 1:
        return Feed(node.input[0], 1, 1, use.role.why, use.chain, node)  # W [in, out/groups]: one norm per row
    return f"{use.role.why}: {op} reads integer or quantized inputs"


def weight_feeds(model: Any) -> dict[str, list[Feed] | str]:
    """For every weight initializer, the activations it multiplies (for calibration).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    dict of str to (list of Feed, or str)
        Per initializer whose role (:func:`onnx_roles`) is ``weight``, its feeds, one
        per use; or, when one of its uses cannot be calibrated (inside a subgraph, an
        integer or quantized operator), a sentence saying why.
    """
    onnx = _onnx()
    main = _build(onnx, model.graph, "", None)
    feeds: dict[str, list[Feed] | str] = {}
    for name, uses in _initializer_uses(onnx, model, main).items():
        if _combine(uses).kind != "weight":
            continue
        found = [_feed(onnx, u) for u in uses if not u.shape_only]
        problems = [f for f in found if isinstance(f, str)]
        feeds[name] = problems[0] if problems else [f for f in found if not isinstance(f, str)]
    return feeds


def _read_by(onnx: ModuleType, node: Any) -> list[str]:
    """The values of its graph a node reads: its inputs, and what its subgraphs read from outside."""
    read = [x for x in node.input if x]
    for attr in node.attribute:
        subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else []
        if attr.type == onnx.AttributeProto.GRAPHS:
            subs = list(attr.graphs)
        for sub in subs:
            read.extend(sorted(_build(onnx, sub, "", None).free))
    return read


def weight_levels(model: Any, feeds: dict[str, list[Feed]]) -> list[list[str]]:
    """Weights grouped by their depth in the data flow, for sequential calibration.

    A weight depends on another when a value the other multiplies reaches one of the
    activations it multiplies (through any operator, subgraphs included). Level 0 holds
    the weights that depend on none, level ``l`` those whose deepest dependency is at
    level ``l - 1``: the weights of one level have their inputs fixed once every earlier
    level is done, so one calibration pass serves a whole level.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (its nodes in topological order, as ONNX requires).
    feeds : dict of str to list of Feed
        The weights to order and their feeds (from :func:`weight_feeds`).

    Returns
    -------
    list of list of str
        The levels, first to last; in each, the weights in the order of the first node
        that multiplies them.

    Raises
    ------
    ValueError
        If two weights depend on each other (a weight used both before and after
        another): no order calibrates each on the other already pruned.
    """
    onnx = _onnx()
    names = list(feeds)
    reaches: dict[str, frozenset[str]] = {name: frozenset({name}) for name in names}
    position: dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        found = frozenset().union(*(reaches.get(x, frozenset()) for x in _read_by(onnx, node)))
        for out in node.output:
            if out:
                reaches[out] = found
                position.setdefault(out, index)
    depends = {
        name: sorted(frozenset().union(*(reaches.get(f.activation, frozenset()) for f in feeds[name])) - {name})
        for name in names
    }
    first = {
        name: min((position.get(f.node.output[0], -1) for f in feeds[name] if f.node is not None), default=-1)
        for name in names
    }
    level: dict[str, int] = {}

    def depth(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise ValueError(
                f"weights {name!r} and {path[-1]!r} depend on each other (a weight used both before and after "
                "another): calibrate them from the dense model (sequential=False)"
            )
        if name not in level:
            level[name] = 1 + max((depth(d, (*path, name)) for d in depends[name]), default=-1)
        return level[name]

    for name in names:
        depth(name, ())
    levels: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for name in sorted(names, key=lambda n: (first[n], names.index(n))):
        levels[level[name]].append(name)
    return levels
