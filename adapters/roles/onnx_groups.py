"""Coupled channel groups of an ONNX model, read from its graph.

A layer's output channels can only go if every tensor that holds them loses the same
indices: the layer's weight and bias, per-channel constants applied on the way, norm
statistics, the input channels of the next layers, and, through a residual connection,
the output channels of every other layer whose output is added to (or multiplied with)
them. :func:`onnx_groups` starts at every layer (a *producer*) and follows its output
forward, and every other activation that joins it backward, until the set of values
holding the channels is closed; it then closes an :class:`OnnxGroup` (one group for a
ResNet stage's trunk: the stem or first block's producers, each block's last
convolution and shortcut, every convolution reading the trunk) or leaves all the
producers it met, saying why.

With ``kind="heads"``, a group is the attention heads of one attention block: the
channels are heads, each a block of ``head_size`` consecutive columns of the query, key
and value projections (and of their biases) and of rows of the output projection; the
``Reshape`` and ``Transpose`` that split and merge the heads are followed, and the
``Reshape`` target shapes that state a head count are rewritten with it. A fused
projection whose output reaches (through reshapes and element-wise operators with
constants) a ``Split`` of its column axis into equal parts, each reshaped into heads of
one size (GPT-2's ``c_attn``: Q, K and V side by side), starts a head group whose heads are
a block of columns in every part: each part of its weight and bias is a member
(:attr:`View.start`), and the ``Split`` sizes follow the head count.

Producers
---------
``MatMul`` with an initializer B ``[K, N]`` (axis 1), ``Gemm`` with an initializer B
(axis 1, or 0 with ``transB=1``; its C when it is ``[N]`` or ``[1, N]``), ``Conv`` with
an initializer W ``[out, in/g, k...]`` (axis 0; its B), with ``group=1`` or grouped
(``group=g``, not depthwise: the group's channels then lie in ``g`` equal parts, each
losing as many, and ``group`` stays). The weight must be a
``weight`` of :func:`~arrayprune.adapters.roles.onnx_graph.onnx_roles` with that output
axis, stored directly or read through ``Identity``.

Followed (forward, and backward from a value that joins the group)
------------------------------------------------------------------
* element-wise operators of one activation: ``Relu``, ``LeakyRelu``, ``Gelu``, ``Sigmoid``,
  ``HardSigmoid``, ``HardSwish``, ``Tanh``, ``Erf``, ``Elu``, ``Selu``, ``Celu``,
  ``Softplus``, ``Softsign``, ``Mish``, ``Neg``, ``Abs``, ``Sqrt``, ``Exp``, ``Cast``,
  ``Identity``, ``Dropout`` (its mask unused), ``Clip`` (constant bounds);
  ``Softmax``/``LogSoftmax`` over another axis;
* ``Add``, ``Sub``, ``Mul``, ``Div``, ``Pow`` of constants and activations: a scalar or broadcast
  constant is not touched, a per-channel one (length C along the channel axis, as
  broadcasting aligns it) is a member; an activation that broadcasts over the channel
  axis (size 1 there) is not touched either; any other activation joins the group (a
  residual ``Add``, a squeeze-excite ``Mul``, the ``x * sigmoid(x)`` of SiLU), and the
  trace goes back from it to its producers;
* ``BatchNormalization`` and ``InstanceNormalization`` on the channel axis 1: their
  per-channel inputs are members;
* a GroupNorm, as ``GroupNormalization`` (opset 18 or 21) or as torch.onnx writes it
  (``Reshape`` to ``[N, G, -1]``, ``InstanceNormalization``, ``Reshape`` back, its target
  a constant or the ``Shape`` of the input): its channels can only go in whole norm
  groups, so the trace starts again with a norm group of ``C/G`` consecutive channels as
  the group's unit (:attr:`OnnxGroup.per`); the norm's scale and bias are members, the
  group count (``num_groups``, the first ``Reshape``'s target) follows; torch.onnx's
  form met on the way back from a residual connection, or a GroupNorm of channels
  already in blocks (heads, a second GroupNorm of other groups), stops the group;
* a depthwise ``Conv`` (``group`` equal to the channels, W ``[C, 1, k...]``): its W axis 0
  and B are members, its ``group`` attribute follows the channel count;
* ``MaxPool``, ``AveragePool``, ``LpPool`` (channels on axis 1, MaxPool's indices unused),
  ``GlobalAveragePool``, ``GlobalMaxPool``, ``GlobalLpPool``; ``ReduceMean``,
  ``ReduceMax``, ``ReduceMin``, ``ReduceSum``, ``ReduceL1``, ``ReduceL2`` whose axes leave
  the channel axis out;
* ``Reshape`` whose input and output shapes (from shape inference) keep each channel a
  contiguous block of one axis (``[N, C, 1, 1] -> [N, C]``; ``[B, T, H*D] -> [B, T, H, D]``
  and back): its constant target shape follows the channel count where it states it;
  ``Flatten`` after a global pool or reduction; ``Transpose`` (the channel axis moves);
* ``MatMul`` of two activations with the channels on a batch axis of both (attention
  scores and their product with the values), forward and back;
* a ``Concat`` of one input (an exporter's key cache with no past);
* ``Shape`` whose entries are only read (by ``Slice``/``Gather`` with constant positions)
  away from the channel axis (a causal mask's sequence lengths);
* ``Resize``/``Upsample`` with scale 1 on the channel axis;
* ``Concat`` along the channel axis: the input's channels are a range of the output's
  (:attr:`View.start`); element-wise operators with constants, pools, per-channel norms,
  depthwise convolutions and the closing layers after it take that range (a U-Net's
  skip); another activation joining them, or a reshape, leaves the group.

An initializer member read by several operators (torch.onnx.export shares one zero bias
per shape across layers), or read through ``Identity``, gets a private copy for the
operator in the group (:class:`View`); the shrunk model reads the copy.

Closed by
---------
``MatMul`` A (the activation's last axis; B ``[K, N]`` axis 0 is a member, in blocks of
the channel's block size), ``Gemm`` A with ``transA=0`` (B axis 0, or 1 with
``transB=1``), ``Conv`` X with ``group=1`` (W axis 1), a grouped ``Conv`` X (W axis 1
block by block: :attr:`View.segments`; its ``group`` splits the group's channels into
equal parts, each losing as many).

Left
----
Everything else leaves the producers' channels as they are, with the reason: a graph
input or graph output holding the channels, a ``Concat`` along another axis, a norm over the channels
(``LayerNormalization``, a GroupNorm of one group), a ``Shape`` read on the channel axis, a reshape that mixes the
channels with other axes, a grouped ``Conv`` reading channels a ``Concat`` joined or
heads, a depthwise ``Conv`` with a channel multiplier, a value read inside a subgraph, a per-channel constant that is a
``Constant`` node, an axis or shape that cannot be known.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from arrayprune.groups import ChannelGroup

from .onnx_graph import _attr, _onnx
from .onnx_group_model import (
    _BINARY,
    _UNARY,
    _Left,
    _Model,
    _producer,
)
from .onnx_group_trace import _Regroup, _Trace
from .onnx_group_types import KINDS, LeftGroup, OnnxGroup, OnnxGroups, View

__all__ = ["KINDS", "View", "OnnxGroup", "LeftGroup", "OnnxGroups", "onnx_groups"]


def _head_size(m: _Model, value: str, channels: int) -> int | None:
    """The head size where `value` (through biases and element-wise ops) is reshaped
    from ``[..., H*D]`` to ``[..., H, D]`` with ``H*D = channels``; None if it is not."""
    seen = 0
    while seen < 8:
        seen += 1
        uses = m.consumers.get(value, [])
        if len(uses) != 1:
            return None
        nxt, _ = uses[0]
        if nxt.op_type == "Reshape":
            s_in, s_out = m.shape(value), m.shape(nxt.output[0])
            if not s_in or not s_out or len(s_out) != len(s_in) + 1:
                return None
            d, h = s_out[-1], s_out[-2]
            if isinstance(d, int) and isinstance(h, int) and h * d == channels and d > 1 and h > 1:
                return d
            return None
        if nxt.op_type not in _BINARY | _UNARY:
            return None
        value = nxt.output[0]
    return None


def _fused_heads(m: _Model, value: str, channels: int) -> tuple[int, int] | None:
    """(head size, parts) where `value` holds the columns of a fused projection (GPT-2's
    ``c_attn``: query, key and value side by side) on its last axis, carried through
    reshapes and element-wise ops to a ``Split`` of that axis into equal parts, each of
    them reshaped into heads of one size; None if it is not."""
    for _ in range(8):
        uses = m.consumers.get(value, [])
        s = m.shape(value)
        if len(uses) != 1 or not s or s[-1] != channels:
            return None
        nxt, _ = uses[0]
        if nxt.op_type == "Split":
            parts = len(nxt.output)
            if parts < 2 or channels % parts or int(_attr(m.onnx, nxt, "axis", 0)) % len(s) != len(s) - 1:
                return None
            sizes = {_head_size(m, out, channels // parts) for out in nxt.output}
            size = sizes.pop() if len(sizes) == 1 else None
            outs = [m.shape(out) for out in nxt.output]
            if size is None or any(not o or o[-1] != channels // parts for o in outs):
                return None
            return size, parts
        if nxt.op_type not in _BINARY | _UNARY | {"Reshape"}:
            return None
        value = nxt.output[0]
    return None


def onnx_groups(model: Any, kind: str = "channels") -> OnnxGroups:
    """The channel groups of an ONNX model, and the producers whose channels stay.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (only the main graph's layers are producers; see the module's notes).
    kind : {"channels", "heads"}, default "channels"
        Layer channels (each producer's output channels, joined through residual
        connections), or the attention heads of each attention block (producers whose
        output is split into heads by a ``Reshape``; the others are not listed).

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
    ValueError
        If `kind` is not one of :data:`KINDS`.
    """
    onnx = _onnx()
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    m = _Model(onnx, model)
    out = OnnxGroups(kind=kind)
    names = Counter(n.name for n in m.nodes)
    claimed: set[int] = set()

    def name_of(node: Any) -> str:
        return node.name if node.name and names[node.name] == 1 else node.output[0]

    for node in m.nodes:
        idx = m.index[id(node)]
        if idx in claimed:
            continue
        found = _producer(m, node)
        if found is None:
            continue
        w, channels, axis = found
        block = 1
        if isinstance(axis, str):
            if kind == "channels":
                out.left.append(LeftGroup(name_of(node), m.label(node), w, channels, axis))
            continue
        parts = 1
        if kind == "heads":
            size = _head_size(m, node.output[0], channels)
            if size is None:
                fused = _fused_heads(m, node.output[0], channels)
                if fused is None:
                    continue
                size, parts = fused
            channels, block = channels // size // parts, size
        trace, per, units = _Trace(m, channels), 1, channels
        try:
            try:
                trace.run(node, axis, block, parts)
            except _Regroup as again:  # whole GroupNorm groups: a unit of the group is a norm group
                per = channels // again.groups
                if kind != "channels":
                    raise _Left(str(again)) from None
                units, block = again.groups, block * per
                trace = _Trace(m, units)
                trace.run(node, axis, block, parts)
        except _Left as exc:
            met = [node] + [p for p in trace.producers if p is not node]
            for p in met:
                if m.index[id(p)] in claimed:
                    continue
                claimed.add(m.index[id(p)])
                pw = _producer(m, p)
                out.left.append(LeftGroup(name_of(p), m.label(p), pw[0] if pw else "", channels, str(exc)))
            continue
        channels = units  # the group counts norm groups where a GroupNorm joins them
        try:
            group = ChannelGroup(trace.members, channels, name=name_of(node))
        except ValueError as exc:  # a tensor met twice on one axis: not a group this can shrink
            out.left.append(LeftGroup(name_of(node), m.label(node), w, channels, str(exc)))
            claimed.add(idx)
            continue
        claimed.update(m.index[id(p)] for p in trace.producers)
        out.groups.append(
            OnnxGroup(
                group,
                m.label(node),
                tuple(trace.consumers),
                tuple((v, a, b * lead) for v, (a, b, lead) in trace.values.items()),
                tuple(trace.depthwise),
                tuple(trace.shapes),
                tuple(m.label(p) for p in trace.producers),
                tuple(trace.views.items()),
                tuple(trace.closing),
                kind,
                trace.segments,
                per,
            )
        )
    where = {name_of(n): i for i, n in enumerate(m.nodes)}
    out.left.sort(key=lambda lf: where.get(lf.name, 0))
    return out
