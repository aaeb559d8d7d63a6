"""An ONNX graph as the group tracing reads it: its values, shapes (small constant subgraphs
folded, then inferred with data propagation), the op types it follows, and each
producer's channels. Used by :mod:`arrayprune.adapters.roles.onnx_groups`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .onnx_graph import _attr, _build, _constant, _node_label, onnx_roles

_UNARY = {
    "Relu", "LeakyRelu", "Gelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Elu", "Selu", "Celu",
    "Softplus", "Softsign", "Mish", "Neg", "Abs", "Sqrt", "Exp", "Cast", "Identity", "Dropout", "Clip", "IsNaN",
    "Not",
}  # fmt: skip
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow"}
#: Element-wise selection: ``Where(condition, x, y)``, all three broadcast together.
_SELECT = {"Where"}
#: Pools over every axis after the channels: ``[N, C, ...] -> [N, C, 1, ...]``.
_GLOBAL_POOLS = {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
#: Pools of each channel over a window: ``[N, C, ...] -> [N, C, ...]``.
_POOLS = {"MaxPool", "AveragePool", "LpPool"}
#: Resizing of each channel on its own when the channel axis keeps its size (scale 1).
_RESIZE = {"Resize", "Upsample"}
#: Reductions of each channel on its own when their axes leave the channel axis out.
_REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL1", "ReduceL2"}
#: Softmax over one axis: followed when that axis is not the channel axis.
_SOFTMAX = {"Softmax", "LogSoftmax"}
#: Norms of each channel on its own: their per-channel inputs are members.
_CHANNEL_NORMS = {"BatchNormalization", "InstanceNormalization"}
#: Norms whose statistics mix the channels: removing one changes the others' outputs.
_MIXING_NORMS = {
    "LayerNormalization", "GroupNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "LpNormalization",
}  # fmt: skip

Dim = int | str | None


class _Left(Exception):
    """A trace that stops: the reason."""


class _Model:
    """What the search needs of the main graph."""

    def __init__(self, onnx: Any, model: Any):
        self.onnx = onnx
        g = model.graph
        self.nodes = list(g.node)
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        self.inits = {t.name: t for t in g.initializer}
        self.constants = {n.output[0]: n for n in self.nodes if n.op_type == "Constant" and n.output}
        self.outputs = {v.name for v in g.output}
        self.inputs = {v.name for v in g.input} - set(self.inits)
        main = _build(onnx, g, "", None)
        self.main = main
        self.consumers = main.consumers
        self.made_by = {o: n for n in self.nodes for o in n.output if o}
        self.in_subgraph: set[str] = set()
        for sub in main.subgraphs:
            self.in_subgraph |= sub.free
        # Identity of an initializer: the same tensor under another name
        self.alias: dict[str, str] = {}
        for n in self.nodes:
            if n.op_type == "Identity" and n.input and n.output and n.output[0] not in self.outputs:
                src = self.alias.get(n.input[0], n.input[0])
                if src in self.inits:
                    self.alias[n.output[0]] = src
        self.reads: Counter[str] = Counter()
        for n in self.nodes:
            if n.op_type == "Identity" and n.output and n.output[0] in self.alias:
                continue
            for x in n.input:
                if x:
                    self.reads[self.alias.get(x, x)] += 1
        for sub in main.subgraphs:
            for x in sub.free:
                self.reads[self.alias.get(x, x)] += 1
        for x in self.outputs:
            self.reads[self.alias.get(x, x)] += 1
        self.names = set(self.inits) | set(self.made_by) | {v.name for v in g.input}
        self.copies: dict[tuple[int, int], str] = {}
        self.roles = onnx_roles(model)
        self.shapes: dict[str, tuple[Dim, ...]] = _inferred_shapes(onnx, model)

    def uses(self, name: str) -> int:
        n = len(self.consumers.get(name, ())) + (name in self.outputs) + (name in self.in_subgraph)
        return n

    def label(self, node: Any) -> str:
        return _node_label(node)

    def copy_of(self, where: tuple[int, int], source: str) -> str:
        """The name of the private copy of `source` that input ``where = (node, slot)`` reads."""
        if where not in self.copies:
            self.copies[where] = self.fresh(source)
        return self.copies[where]

    def fresh(self, base: str) -> str:
        """A name not yet used in the graph, from `base`."""
        k = 1
        while f"{base}.{k}" in self.names:
            k += 1
        self.names.add(f"{base}.{k}")
        return f"{base}.{k}"

    def dims(self, name: str) -> tuple[int, ...] | None:
        """Shape of an initializer or ``Constant`` value (through ``Identity``), None for an activation."""
        name = self.alias.get(name, name)
        if name in self.inits:
            return tuple(int(d) for d in self.inits[name].dims)
        node = self.constants.get(name)
        if node is not None:
            for a in node.attribute:
                if a.name == "value":
                    return tuple(int(d) for d in a.t.dims)
                if a.name in ("value_float", "value_int"):
                    return ()
                if a.name in ("value_floats", "value_ints"):
                    return (len(a.floats) or len(a.ints),)
        return None

    def ints(self, name: str) -> list[int] | None:
        """The value of an integer constant (axes, a shape), None if `name` is not one."""
        return _constant(self.onnx, self.main, self.alias.get(name, name))

    def init_dims(self, name: str) -> tuple[int, ...]:
        """Shape of the initializer `name` (through ``Identity``)."""
        return tuple(int(d) for d in self.inits[self.alias.get(name, name)].dims)

    def shape(self, name: str) -> tuple[Dim, ...] | None:
        """The inferred shape of a value (ints, symbols, None where unknown), None if unknown."""
        dims = self.dims(name)
        return dims if dims is not None else self.shapes.get(name)


#: Constants up to this many entries are folded (evaluated) before shape inference.
_SMALL = 4096


def _fold_small(onnx: Any, model: Any) -> tuple[dict[str, Any], set[int]]:
    """Evaluate the main graph's nodes whose inputs are all small constants (shape
    arithmetic: ``Shape`` of nothing, ``ConstantOfShape``, ``Equal``, ``Where``, ...), with
    onnx's reference evaluator; returns (name -> array, indices of the folded nodes)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    values: dict[str, Any] = {}
    for t in g.initializer:
        if int(np.prod(t.dims)) <= _SMALL and t.data_location != onnx.TensorProto.EXTERNAL:
            values[t.name] = onnx.numpy_helper.to_array(t)
    folded: set[int] = set()
    for i, node in enumerate(g.node):
        if node.domain not in ("", "ai.onnx") or any(a.type in (5, 10) for a in node.attribute):
            continue  # another domain, or a subgraph
        if not all(x == "" or x in values for x in node.input) or not node.output:
            continue
        feeds = {x: values[x] for x in node.input if x}
        try:
            inputs = [onnx.helper.make_tensor_value_info(x, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                      for x, v in feeds.items()]  # fmt: skip
            outputs = [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
            tiny = onnx.helper.make_model(
                onnx.helper.make_graph([node], "fold", inputs, outputs), opset_imports=model.opset_import
            )
            results = ReferenceEvaluator(tiny).run(None, feeds)
        except Exception:  # noqa: BLE001 - what the evaluator cannot run stays unknown
            continue
        if any(np.asarray(r).size > _SMALL for r in results):
            continue
        for o, r in zip([o for o in node.output if o], results, strict=True):
            values[o] = np.asarray(r)
        folded.add(i)
    return {k: v for k, v in values.items() if k not in {t.name for t in g.initializer}}, folded


def _inferred_shapes(onnx: Any, model: Any) -> dict[str, tuple[Dim, ...]]:
    """The shapes of the main graph's values: onnx's inference with data propagation, run
    on the graph alone (large initializers as typed inputs, no data) after small constant
    subgraphs are folded, so that shapes computed at run time from constants are known."""
    import numpy as np

    g = model.graph
    try:
        consts, folded = _fold_small(onnx, model)
    except Exception:  # noqa: BLE001 - no folding: inference on the graph as it is
        consts, folded = {}, set()
    inputs = {v.name for v in g.input}
    external = onnx.TensorProto.EXTERNAL
    small = [t for t in g.initializer if int(np.prod(t.dims)) <= _SMALL and t.data_location != external]
    small_names = {t.name for t in small}
    typed = [
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in g.initializer if t.name not in small_names and t.name not in inputs
    ]  # fmt: skip
    folded_inits = []
    for name, value in consts.items():
        try:
            folded_inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        except Exception:  # noqa: BLE001 - a value the format cannot hold: its node stays
            folded = {i for i in folded if name not in g.node[i].output}
    folded_names = {t.name for t in folded_inits}
    nodes = [n for i, n in enumerate(g.node) if i not in folded or not set(n.output) <= folded_names]
    keep = {o for n in nodes for o in n.output}
    folded_inits = [t for t in folded_inits if t.name not in keep]
    graph = onnx.helper.make_graph(
        nodes, g.name or "graph", [*g.input, *typed], list(g.output), [*small, *folded_inits], value_info=g.value_info
    )
    light = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    light.functions.extend(model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True).graph
    except Exception:  # noqa: BLE001 - no shapes from inference: shape checks then leave
        inferred = g
    shapes: dict[str, tuple[Dim, ...]] = {}
    for v in [*inferred.value_info, *inferred.input, *inferred.output]:
        t = v.type.tensor_type
        if t.HasField("shape"):
            shapes[v.name] = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
            )
    for name, value in consts.items():
        shapes[name] = tuple(int(d) for d in np.shape(value))
    return shapes


def _product(dims: Any) -> tuple[int, tuple[str, ...]] | None:
    """A product of dimensions as (integer part, sorted symbols); None if one is unknown."""
    n, symbols = 1, []
    for d in dims:
        if d is None:
            return None
        if isinstance(d, str):
            symbols.append(d)
        else:
            n *= int(d)
    return n, tuple(sorted(symbols))


def _map_axis(
    shape_in: tuple[Dim, ...], p: int, block: int, lead: int, channels: int, shape_out: tuple[Dim, ...]
) -> tuple[int, int, int] | None:
    """Where a reshape puts channels held on axis `p` of `shape_in`.

    Axis `p` holds ``lead * channels * block`` entries: channel c is the runs of
    ``block * prod(shape_in[p+1:])`` entries at ``(l * channels + c)`` times that, for
    each ``l < lead`` (``lead > 1`` where a batch axis was merged in front of the
    channels, as ``[B, H, T, D] -> [B*H, T, D]``). The output holds them on the axis q
    with ``out[q] = lead' * channels * b`` and a run of ``b * prod(out[q+1:])`` entries,
    the axes before q (and ``lead'``) making the same count as before (checked where
    both are known numbers). Returns ``(q, b, lead')``, or None if no axis keeps each
    channel's runs whole.
    """
    outer = _product(shape_in[:p])
    inner = _product(shape_in[p + 1 :])
    if outer is None or inner is None or shape_in[p] != lead * channels * block:
        return None
    run = (inner[0] * block, inner[1])
    for q, d in enumerate(shape_out):
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0 or d % channels:
            continue
        rest = _product(shape_out[q + 1 :])
        if rest is None or rest[1] != run[1] or run[0] % rest[0]:
            continue
        b = run[0] // rest[0]
        if (d // channels) % b:
            continue
        lead_out = d // channels // b
        before = _product(shape_out[:q])
        if before is None:
            continue
        if not outer[1] and not before[1] and outer[0] * lead != before[0] * lead_out:
            continue
        return q, b, lead_out
    return None


_Producer = tuple[str, int, int]  # (weight, output channels, channel axis of the output)
_Refused = tuple[str, int, str]


def _producer(m: _Model, node: Any) -> _Producer | _Refused | None:
    """(weight, channels, channel axis of the output) of a producer, None if the node is no
    producer, or (weight, channels, reason) if it is one whose channels cannot go."""
    op, ins = node.op_type, list(node.input)
    if op == "MatMul" and len(ins) == 2 and m.dims(ins[1]) is not None and m.dims(ins[0]) is None:
        if ins[1] in m.constants:
            return None
        w, axis = ins[1], 1
        dims = m.init_dims(w)
        if len(dims) != 2:
            return None
        out_axis = -1
    elif op == "Gemm" and len(ins) >= 2 and m.dims(ins[1]) is not None and m.dims(ins[0]) is None:
        if ins[1] in m.constants:
            return None
        w = ins[1]
        dims = m.init_dims(w)
        axis = 0 if int(_attr(m.onnx, node, "transB", 0)) else 1
        out_axis = -1
        if len(ins) > 2 and ins[2]:
            c = m.dims(ins[2])
            if c is None or m.alias.get(ins[2], ins[2]) not in m.inits:
                return (w, dims[axis], "Gemm C is not an initializer")
            if c not in ((dims[axis],), (1, dims[axis])) and c and c[-1] != 1:
                return (w, dims[axis], f"Gemm C of shape {list(c)}")
    elif op == "Conv" and len(ins) >= 2 and m.alias.get(ins[1], ins[1]) in m.inits:
        w = ins[1]
        dims = m.init_dims(w)
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups != 1:
            if dims[1] == 1 and dims[0] == groups:
                return None  # depthwise: its channels are its input's
            if dims[0] % groups:
                return (w, dims[0], f"grouped Conv (group={groups}) with {dims[0]} output channels")
        axis = 0
        out_axis = 1 - len(dims)
    else:
        return None
    channels = dims[axis]
    role = m.roles.get(m.alias.get(w, w))
    if role is None or role.kind != "weight" or role.output_axis not in (axis, None):
        why = role.why if role is not None else "no role"
        return (w, channels, f"weight {w!r} is not a plain {op} weight here ({why})")
    return (w, channels, out_axis)
