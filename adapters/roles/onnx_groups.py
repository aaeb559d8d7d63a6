"""Coupled channel groups of an ONNX model, read from its graph.

A layer's output channels can only go if every tensor that holds them loses the same
indices: the layer's weight and bias, per-channel constants applied on the way, norm
statistics, and the input channels of the next layer. :func:`onnx_groups` starts at
every layer (a *producer*) and follows its output forward; it either closes a
:class:`~arrayprune.groups.ChannelGroup` or leaves the producer's channels, saying why.

Producers
---------
``MatMul`` with an initializer B ``[K, N]`` (axis 1), ``Gemm`` with an initializer B
(axis 1, or 0 with ``transB=1``; its C when it is ``[N]`` or ``[1, N]``), ``Conv`` with
an initializer W ``[out, in, k...]`` and ``group=1`` (axis 0; its B). The weight must be a
``weight`` of :func:`~arrayprune.adapters.roles.onnx_graph.onnx_roles` with that output
axis, read by this operator input only, stored directly (not behind a Transpose or
DequantizeLinear).

Followed
--------
* element-wise operators of one activation: ``Relu``, ``LeakyRelu``, ``Gelu``, ``Sigmoid``,
  ``HardSigmoid``, ``HardSwish``, ``Tanh``, ``Erf``, ``Elu``, ``Selu``, ``Celu``,
  ``Softplus``, ``Softsign``, ``Mish``, ``Neg``, ``Abs``, ``Sqrt``, ``Exp``, ``Cast``,
  ``Identity``, ``Dropout`` (its mask unused), ``Clip`` (constant bounds);
* ``Add``, ``Sub``, ``Mul``, ``Div`` whose other inputs are constants (an initializer or a
  ``Constant``): a scalar or broadcast constant is not touched, a per-channel one (length
  C along the channel axis, as broadcasting aligns it) is a member, scaled down with
  the rest; or whose other inputs are themselves in the group (the ``x * 0.5 *
  (1 + erf(x / sqrt(2)))`` chain of an exported GELU, ``x * sigmoid(x)``);
* ``BatchNormalization`` on the channel axis 1: scale, B, mean and var are members;
* a depthwise ``Conv`` (``group`` equal to the channels, W ``[C, 1, k...]``): its W axis 0
  and B are members, its ``group`` attribute follows the channel count, and the group
  goes on through its output;
* ``GlobalAveragePool``, ``GlobalMaxPool``, ``GlobalLpPool`` on the channel axis 1
  (``[N, C, ...] -> [N, C, 1, ...]``), then ``Flatten`` at axis 1 (``[N, C]``: the
  channels on the last axis), as a CNN's classifier reads them;
* ``ReduceMean``, ``ReduceMax``, ``ReduceMin``, ``ReduceSum``, ``ReduceL1``, ``ReduceL2``
  whose axes (attribute or constant input) leave the channel axis out (``keepdims=0``
  moves it), as ``x.mean((2, 3))`` exports; then ``Flatten`` as above, or ``Reshape``
  of ``[..., C, 1, ...]`` to ``[..., C]`` (its constant target shape follows the channel
  count, or is ``[0, ..., -1]``).

Closed by
---------
``MatMul`` A (the activation's last axis; B ``[K, N]`` axis 0 is a member), ``Gemm`` A
with ``transA=0`` (B axis 0, or 1 with ``transB=1``), ``Conv`` X with ``group=1`` (W axis 1).

Left
----
Everything else leaves the producer's channels as they are, with the reason: a
residual ``Add`` (or any element-wise operator) of an activation from outside the group,
``Concat``, ``Reshape`` and ``Flatten`` (but after a global pool or reduction), ``Transpose``,
a norm over the channels, ``Shape``, a graph output, a grouped (not depthwise) ``Conv``,
a depthwise ``Conv`` with a channel multiplier, a value read inside a subgraph, a member initializer read elsewhere too,
a per-channel constant that is a ``Constant`` node, an axis that cannot be known.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arrayprune.amount import compute_nparams_toprune
from arrayprune.groups import ChannelGroup, Member

from .onnx_graph import _attr, _build, _constant, _node_label, _onnx, onnx_roles

__all__ = ["OnnxGroup", "LeftGroup", "OnnxGroups", "onnx_groups"]

_UNARY = {
    "Relu", "LeakyRelu", "Gelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Elu", "Selu", "Celu",
    "Softplus", "Softsign", "Mish", "Neg", "Abs", "Sqrt", "Exp", "Cast", "Identity", "Dropout", "Clip",
}  # fmt: skip
_BINARY = {"Add", "Sub", "Mul", "Div"}
#: Pools over every axis after the channels: ``[N, C, ...] -> [N, C, 1, ...]``.
_GLOBAL_POOLS = {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
#: Reductions of each channel on its own when their axes leave the channel axis out.
_REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL1", "ReduceL2"}


@dataclass(frozen=True)
class OnnxGroup:
    """A channel group of an ONNX model.

    Attributes
    ----------
    group : ChannelGroup
        The members (initializer names and axes; weights score, biases, per-channel
        constants and norm statistics do not) and the channel count. Its name is the
        producer's node name (its output value where the node has no name of its own).
    producer : str
        The producing operator (``"MatMul '/0/l1/MatMul'"``).
    consumers : tuple of str
        The operators whose input channels close the group.
    values : tuple of (str, int)
        The activations holding the channels, with their channel axis (negative:
        counted from the end), for shape updates.
    depthwise : tuple of int
        Indices (in ``graph.node``) of depthwise convolutions whose ``group`` attribute
        is the channel count.
    shapes : tuple of (str, int)
        Integer constants (initializers or ``Constant`` outputs) that a ``Reshape``
        reads as its target shape, with the index of the entry that is the channel
        count (to follow it).
    """

    group: ChannelGroup
    producer: str
    consumers: tuple[str, ...]
    values: tuple[tuple[str, int], ...]
    depthwise: tuple[int, ...] = ()
    shapes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class LeftGroup:
    """A producer whose channels stay, and why.

    Attributes
    ----------
    name : str
        The producer's node name (its output value where the node has no name of its own).
    producer : str
        The producing operator.
    weight : str
        The producer's weight initializer.
    channels : int
        Its output channels.
    reason : str
        Why they stay (``"residual Add: Add '/0/Add' also reads 'x'"``).
    """

    name: str
    producer: str
    weight: str
    channels: int
    reason: str


@dataclass
class OnnxGroups:
    """The groups of a model and the producers left.

    Attributes
    ----------
    groups : list of OnnxGroup
        In graph order of their producers.
    left : list of LeftGroup
        In graph order.
    """

    groups: list[OnnxGroup] = field(default_factory=list)
    left: list[LeftGroup] = field(default_factory=list)

    def describe(self, amount: int | float | None = None) -> str:
        """Lines for people: each group with its members, each left producer with its reason.

        Members are ``name[axis]``, marked ``*`` if they do not score (biases, constants,
        norm statistics). With `amount` (a fraction or a count per group, as
        :func:`~arrayprune.adapters.shrink.shrink_onnx` takes it), each group's channels
        are ``before -> after``.
        """
        lines = []
        for g in self.groups:
            members = ", ".join(f"{m.key}[{m.axis}]" + ("" if m.weight else "*") for m in g.group.members)
            n = g.group.channels
            count = f"{n}" if amount is None else f"{n} -> {n - compute_nparams_toprune(amount, n)}"
            lines.append(f"group {g.group.name} ({count} channels, {g.producer}): {members}")
        for lf in self.left:
            lines.append(f"left {lf.name} ({lf.channels} channels, {lf.producer}): {lf.reason}")
        return "\n".join(lines)


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
        main = _build(onnx, g, "", None)
        self.main = main
        self.consumers = main.consumers
        self.in_subgraph: set[str] = set()
        for sub in main.subgraphs:
            self.in_subgraph |= sub.free
        self.roles = onnx_roles(model)
        self.ranks: dict[str, int] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # noqa: BLE001 - no ranks from inference: rank checks then leave
            inferred = g
        for v in [*inferred.value_info, *inferred.input, *inferred.output]:
            t = v.type.tensor_type
            if t.HasField("shape"):
                self.ranks[v.name] = len(t.shape.dim)

    def uses(self, name: str) -> int:
        n = len(self.consumers.get(name, ())) + (name in self.outputs) + (name in self.in_subgraph)
        return n

    def label(self, node: Any) -> str:
        return _node_label(node)

    def dims(self, name: str) -> tuple[int, ...] | None:
        """Shape of an initializer or ``Constant`` value, None for an activation."""
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
        return _constant(self.onnx, self.main, name)

    def init_dims(self, name: str) -> tuple[int, ...]:
        """Shape of the initializer `name`."""
        return tuple(int(d) for d in self.inits[name].dims)

    def own(self, name: Any, what: str) -> None:
        """Raise unless initializer `name` is read once, by the operator at hand."""
        if name not in self.inits:
            raise _Left(f"{what} {name!r} is not an initializer")
        if self.uses(name) != 1:
            raise _Left(f"{what} {name!r} is also read elsewhere")


_Producer = tuple[str, int, list[Member], int]
_Refused = tuple[str, int, str]


def _producer(m: _Model, node: Any) -> _Producer | _Refused | None:
    """(weight, channels, members, channel axis of the output) of a producer, None if the
    node is no producer, or (weight, channels, reason) if it is one whose channels cannot go."""
    op, ins = node.op_type, list(node.input)
    if op == "MatMul" and len(ins) == 2 and ins[1] in m.inits and ins[0] not in m.inits:
        w, axis = ins[1], 1
        dims = m.init_dims(w)
        if len(dims) != 2:
            return None
        members = [Member(w, 1)]
        out_axis = -1
    elif op == "Gemm" and len(ins) >= 2 and ins[1] in m.inits and ins[0] not in m.inits:
        w = ins[1]
        dims = m.init_dims(w)
        axis = 0 if int(_attr(m.onnx, node, "transB", 0)) else 1
        members = [Member(w, axis)]
        out_axis = -1
        if len(ins) > 2 and ins[2]:
            c = m.dims(ins[2])
            if c is None or ins[2] not in m.inits:
                return (w, dims[axis], "Gemm C is not an initializer")
            if c in ((dims[axis],), (1, dims[axis])):
                members.append(Member(ins[2], len(c) - 1, False))
            elif c and c[-1] != 1:
                return (w, dims[axis], f"Gemm C of shape {list(c)}")
    elif op == "Conv" and len(ins) >= 2 and ins[1] in m.inits:
        w = ins[1]
        dims = m.init_dims(w)
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups != 1:
            if dims[1] == 1 and dims[0] == groups:
                return None  # depthwise: its channels are its input's
            return (w, dims[0], f"grouped Conv (group={groups})")
        axis = 0
        members = [Member(w, 0)]
        out_axis = 1 - len(dims)
        if len(ins) > 2 and ins[2]:
            members.append(Member(ins[2], 0, False))
    else:
        return None
    channels = dims[axis]
    role = m.roles.get(w)
    if role is None or role.kind != "weight" or role.output_axis != axis:
        why = role.why if role is not None else "no role"
        return (w, channels, f"weight {w!r} is not a plain {op} weight here ({why})")
    try:
        for mem in members:
            m.own(mem.key, "weight" if mem.weight else "bias")
    except _Left as exc:
        return (w, channels, str(exc))
    return (w, channels, members, out_axis)


class _Trace:
    """The walk of one group forward from its producer's output.

    It holds the values that carry the channels (and on which axis), the consumers and
    the members found so far; :data:`_STEPS` maps each op type to the method that takes
    a node reading a group value (or raises :class:`_Left` with the reason). An op type
    the table does not hold stops the group.
    """

    def __init__(self, m: _Model, start: str, axis: int, channels: int, members: list[Member]):
        self.m, self.channels, self.members = m, channels, members
        self.values = {start: axis}
        self.queue = [start]
        self.done: set[int] = set()
        self.pending: dict[int, Any] = {}
        self.consumers: list[str] = []
        self.depthwise: list[int] = []
        self.shapes: list[tuple[str, int]] = []
        self.pooled: set[str] = set()  # values whose axes after the channel axis all have size 1

    # ---------------------------------------------------------------- helpers

    def add_value(self, name: str, ax: int) -> None:
        if name in self.values:
            if self.values[name] != ax:
                raise _Left(f"{name!r} holds the channels on two axes")
            return
        self.values[name] = ax
        self.queue.append(name)

    def rank(self, name: str) -> int:
        r = self.m.ranks.get(name)
        if r is None:
            raise _Left(f"the rank of {name!r} is unknown")
        return r

    def constant_member(self, name: str, ax: int, node: Any) -> None:
        m = self.m
        dims = m.dims(name)
        if dims is None:
            raise _Left(f"{m.label(node)} reads {name!r}, which is not a constant")
        p = len(dims) + ax
        if p < 0 or dims[p] == 1:
            return  # broadcast over the channels: untouched
        if dims[p] != self.channels:
            raise _Left(
                f"{m.label(node)} constant {name!r} of shape {list(dims)} does not fit {self.channels} channels"
            )
        if name not in m.inits:
            raise _Left(f"per-channel constant {name!r} of {m.label(node)} is a Constant node")
        m.own(name, "per-channel constant")
        self.members.append(Member(name, p, False))

    def binary(self, node: Any) -> bool:
        """Take an element-wise node whose inputs are all constants or group values."""
        acts = [x for x in node.input if self.m.dims(x) is None]
        if any(x not in self.values for x in acts):
            return False
        axes = {self.values[x] for x in acts}
        if len(axes) != 1:
            raise _Left(f"{self.m.label(node)} combines the channels on different axes")
        ax = axes.pop()
        for x in node.input:
            if x not in self.values:
                self.constant_member(x, ax, node)
        self.add_value(node.output[0], ax)
        return True

    def consumer(self, node: Any, weight: str, axis: int) -> None:
        """`node` reads the channels through its weight's `axis`: a member, and a consumer."""
        self.m.own(weight, "weight")
        self.members.append(Member(weight, axis))
        self.consumers.append(self.m.label(node))

    # ---------------------------------------------------------------- one method per op type

    def unary(self, node: Any, name: str, ax: int, idx: int) -> None:
        m = self.m
        if idx in self.done:
            return
        self.done.add(idx)
        if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1] and m.uses(node.output[1]):
            raise _Left(f"the mask of {m.label(node)} is read")
        if node.op_type == "Clip":
            for x in node.input[1:]:
                if x and m.dims(x) not in ((), (1,)):
                    raise _Left(f"{m.label(node)} bound {x!r} is not a scalar constant")
        if name in self.pooled:
            self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax)

    def global_pool(self, node: Any, name: str, ax: int, idx: int) -> None:
        if ax != 1 - self.rank(name):
            raise _Left(f"{self.m.label(node)} pools axes after 1, not after the channel axis")
        self.done.add(idx)
        self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax)

    def reduce(self, node: Any, name: str, ax: int, idx: int) -> None:
        m = self.m
        r = self.rank(name)
        p = ax % r
        axes = _attr(m.onnx, node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = m.ints(node.input[1])
            if axes is None:
                raise _Left(f"the axes of {m.label(node)} are not a constant")
        if not axes:
            if int(_attr(m.onnx, node, "noop_with_empty_axes", 0)):
                raise _Left(f"{m.label(node)} reduces no axis")
            raise _Left(f"{m.label(node)} reduces every axis, the channels too")
        reduced = {int(a) % r for a in axes}
        if p in reduced:
            raise _Left(f"{m.label(node)} reduces the channel axis")
        if int(_attr(m.onnx, node, "keepdims", 1)):
            out_ax = ax
        else:
            out_ax = p - sum(a < p for a in reduced) - (r - len(reduced))
        if name in self.pooled or set(range(p + 1, r)) <= reduced:
            self.pooled.add(node.output[0])
        self.done.add(idx)
        self.add_value(node.output[0], out_ax)

    def reshape(self, node: Any, name: str, ax: int, idx: int) -> None:
        m, channels = self.m, self.channels
        r = self.rank(name)
        target = m.ints(node.input[1]) if len(node.input) > 1 else None
        p = ax % r
        copy = not int(_attr(m.onnx, node, "allowzero", 0))
        if target is None:
            raise _Left(f"the target shape of {m.label(node)} is not a constant held in the model")
        if name not in self.pooled or len(target) != p + 1:
            raise _Left(f"{m.label(node)} mixes the channels with other axes (only [..., C, 1, ...] -> [..., C])")
        if target[-1] == channels:
            if node.input[1] in m.inits:
                m.own(node.input[1], "Reshape shape")
            elif m.uses(node.input[1]) != 1:
                raise _Left(f"Reshape shape {node.input[1]!r} is also read elsewhere")
            self.shapes.append((node.input[1], len(target) - 1))
        elif not (target[-1] == -1 and copy and all(d == 0 for d in target[:-1])):
            raise _Left(f"{m.label(node)} to {target} does not keep {channels} channels on the last axis")
        self.done.add(idx)
        self.add_value(node.output[0], -1)

    def flatten(self, node: Any, name: str, ax: int, idx: int) -> None:
        r = self.rank(name)
        axis = int(_attr(self.m.onnx, node, "axis", 1))
        if name not in self.pooled or r + ax != (axis if axis >= 0 else r + axis):
            raise _Left(f"{self.m.label(node)} mixes the channels with other axes (only [N, C, 1, ...] -> [N, C])")
        self.done.add(idx)
        self.add_value(node.output[0], -1)

    def elementwise(self, node: Any, name: str, ax: int, idx: int) -> None:
        if idx in self.done or idx in self.pending:
            return
        if not self.binary(node):
            self.pending[idx] = node  # taken once its other inputs join the group, or left
        else:
            self.done.add(idx)

    def batch_norm(self, node: Any, name: str, ax: int, idx: int) -> None:
        m = self.m
        if ax != 1 - self.rank(name):
            raise _Left(f"{m.label(node)} normalizes axis 1, not the channel axis")
        for x in node.input[1:5]:
            m.own(x, "BatchNormalization input")
            self.members.append(Member(x, 0, False))
        if any(o and m.uses(o) for o in node.output[1:]):
            raise _Left(f"the running statistics of {m.label(node)} are read")
        self.done.add(idx)
        self.add_value(node.output[0], ax)

    def matmul(self, node: Any, name: str, ax: int, idx: int) -> None:
        w = node.input[1]
        if ax != -1:
            raise _Left(f"{self.m.label(node)} reduces the last axis, not the channel axis")
        dims = self.m.dims(w)
        if dims is None or len(dims) != 2 or dims[0] != self.channels:
            raise _Left(f"{self.m.label(node)} B {w!r} is not a [K, N] initializer with K = {self.channels}")
        self.consumer(node, w, 0)

    def gemm(self, node: Any, name: str, ax: int, idx: int) -> None:
        m = self.m
        w = node.input[1]
        if int(_attr(m.onnx, node, "transA", 0)) or ax != -1:
            raise _Left(f"{m.label(node)} with transA=1")
        dims = m.dims(w)
        k_axis = 1 if int(_attr(m.onnx, node, "transB", 0)) else 0
        if dims is None or len(dims) != 2 or dims[k_axis] != self.channels:
            raise _Left(f"{m.label(node)} B {w!r} is not an initializer with {self.channels} input features")
        self.consumer(node, w, k_axis)

    def conv(self, node: Any, name: str, ax: int, idx: int) -> None:
        m, channels = self.m, self.channels
        w = node.input[1]
        dims = m.dims(w)
        if dims is None:
            raise _Left(f"{m.label(node)} W {w!r} is not an initializer")
        if ax != 1 - len(dims):
            raise _Left(f"{m.label(node)} reads channels on axis 1, not the channel axis")
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups == 1:
            if dims[1] != channels:
                raise _Left(f"{m.label(node)} W {w!r} has {dims[1]} input channels, not {channels}")
            self.consumer(node, w, 1)
        elif groups == channels and dims[1] == 1 and dims[0] == channels:
            m.own(w, "depthwise weight")
            self.members.append(Member(w, 0))
            if len(node.input) > 2 and node.input[2]:
                m.own(node.input[2], "bias")
                self.members.append(Member(node.input[2], 0, False))
            self.depthwise.append(idx)
            self.add_value(node.output[0], ax)
        elif groups == channels and dims[1] == 1:
            raise _Left(f"depthwise {m.label(node)} with a channel multiplier of {dims[0] // channels}")
        else:
            raise _Left(f"grouped {m.label(node)} (group={groups})")

    def shape_read(self, node: Any, name: str, ax: int, idx: int) -> None:
        raise _Left(f"its shape is read ({self.m.label(node)})")

    # ---------------------------------------------------------------- the walk

    def step(self, node: Any, i: int, name: str, ax: int) -> None:
        """Take `node`, which reads group value `name` (channels on `ax`) as its input `i`."""
        found = _STEPS.get(node.op_type)
        if found is None or (found[1] and i != 0):
            raise _Left(f"{self.m.label(node)} reads {name!r}")
        found[0](self, node, name, ax, self.m.index[id(node)])

    def run(self) -> tuple[list[str], dict, list, list]:
        """Follow the start forward; return (consumers, values -> axis, depthwise node
        indices, Reshape target shapes to follow)."""
        m = self.m
        while self.queue or self.pending:
            while self.queue:
                name = self.queue.pop(0)
                ax = self.values[name]
                if name in m.outputs:
                    raise _Left(f"{name!r} is a graph output")
                if name in m.in_subgraph:
                    raise _Left(f"{name!r} is read inside a subgraph")
                uses = m.consumers.get(name, ())
                if not uses:
                    raise _Left(f"{name!r} is not used")
                for node, i in uses:
                    self.step(node, i, name, ax)
            progress = False
            for idx, node in list(self.pending.items()):
                if self.binary(node):
                    del self.pending[idx]
                    self.done.add(idx)
                    progress = True
            if not progress and self.pending:
                node = next(iter(self.pending.values()))
                other = [x for x in node.input if m.dims(x) is None and x not in self.values]
                if node.op_type == "Add":
                    raise _Left(f"residual Add: {m.label(node)} also reads {other[0]!r}")
                raise _Left(f"{m.label(node)} also reads {other[0]!r}, from outside the group")
        if not self.consumers:
            raise _Left("no layer reads the channels")
        return self.consumers, self.values, self.depthwise, self.shapes


_Step = Callable[[_Trace, Any, str, int, int], None]

#: Op type -> (the :class:`_Trace` method that takes a node of that type reading a group
#: value, whether the value must be its first input). Add an op here, with its method.
_STEPS: dict[str, tuple[_Step, bool]] = {
    **{op: (_Trace.unary, True) for op in _UNARY},
    **{op: (_Trace.global_pool, True) for op in _GLOBAL_POOLS},
    **{op: (_Trace.reduce, True) for op in _REDUCE},
    "Reshape": (_Trace.reshape, True),
    "Flatten": (_Trace.flatten, True),
    **{op: (_Trace.elementwise, False) for op in _BINARY},
    "BatchNormalization": (_Trace.batch_norm, True),
    "MatMul": (_Trace.matmul, True),
    "Gemm": (_Trace.gemm, True),
    "Conv": (_Trace.conv, True),
    "Shape": (_Trace.shape_read, False),
    "Size": (_Trace.shape_read, False),
}


def onnx_groups(model: Any) -> OnnxGroups:
    """The channel groups of an ONNX model, and the producers whose channels stay.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (only the main graph's layers are producers; see the module's notes).

    Returns
    -------
    OnnxGroups
        ``groups`` (each with its :class:`~arrayprune.groups.ChannelGroup`) and
        ``left`` (each with its reason), in graph order of the producers.

    Raises
    ------
    ImportError
        If the ``onnx`` package is missing.
    TypeError
        If `model` is not an ``onnx.ModelProto``.
    """
    onnx = _onnx()
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    m = _Model(onnx, model)
    out = OnnxGroups()
    names = Counter(n.name for n in m.nodes)
    for node in m.nodes:
        found = _producer(m, node)
        if found is None:
            continue
        value = node.output[0]
        name = node.name if node.name and names[node.name] == 1 else value
        if len(found) == 3:
            out.left.append(LeftGroup(name, m.label(node), *found))
            continue
        w, channels, members, axis = found
        try:
            consumers, values, depthwise, shapes = _Trace(m, value, axis, channels, members).run()
        except _Left as exc:
            out.left.append(LeftGroup(name, m.label(node), w, channels, str(exc)))
            continue
        group = ChannelGroup(members, channels, name=name)
        found_values = tuple(values.items())
        out.groups.append(
            OnnxGroup(group, m.label(node), tuple(consumers), found_values, tuple(depthwise), tuple(shapes))
        )
    return out
