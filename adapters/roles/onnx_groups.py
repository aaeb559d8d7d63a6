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
``Reshape`` target shapes that state a head count are rewritten with it.

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
  scores and their product with the values);
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
(``LayerNormalization``, ``GroupNormalization``), ``Shape``, a reshape that mixes the
channels with other axes, a grouped ``Conv`` reading channels a ``Concat`` joined or
heads, a depthwise ``Conv`` with a channel multiplier, a value read inside a subgraph, a per-channel constant that is a
``Constant`` node, an axis or shape that cannot be known.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from arrayprune.groups import ChannelGroup, Member

from .onnx_graph import _attr, _onnx
from .onnx_group_model import (
    _BINARY,
    _CHANNEL_NORMS,
    _GLOBAL_POOLS,
    _MIXING_NORMS,
    _POOLS,
    _REDUCE,
    _RESIZE,
    _SELECT,
    _SOFTMAX,
    _UNARY,
    _Left,
    _map_axis,
    _Model,
    _producer,
)
from .onnx_group_types import KINDS, LeftGroup, OnnxGroup, OnnxGroups, View

__all__ = ["KINDS", "View", "OnnxGroup", "LeftGroup", "OnnxGroups", "onnx_groups"]


class _Trace:
    """The walk of one group from its producer's output, forward and back.

    It holds the values that carry the channels (on which axis, in blocks of how many
    entries), the producers, consumers and members found so far; :data:`_STEPS` maps
    each op type to the method that takes a node reading a group value (or raises
    :class:`_Left` with the reason), :data:`_BACK` each op type to the method that takes
    a node making one. An op type the tables do not hold stops the group.
    """

    def __init__(self, m: _Model, channels: int):
        self.m, self.channels = m, channels
        self.members: list[Member] = []
        self.values: dict[str, tuple[int, int, int]] = {}  # value -> (axis, block, lead)
        self.queue: list[str] = []
        self.done: set[int] = set()
        self.consumers: list[str] = []
        self.producers: list[Any] = []
        self.depthwise: list[int] = []
        self.shapes: list[tuple[str, int, int]] = []
        self.views: dict[str, View] = {}
        self.closing: list[str] = []
        self.pooled: set[str] = set()  # values whose axes after the channel axis all have size 1
        # values where a Concat joined the channels with others: value -> (first entry, axis size)
        self.offset: dict[str, tuple[int, int]] = {}
        self.at: int | None = None  # the first entry of the value a handler takes (None: the whole axis)
        self.total = 0  # and the size of its axis
        self.segments = 1  # equal parts of the channels that lose as many each (grouped convolutions)

    # ---------------------------------------------------------------- helpers

    def add_value(self, name: str, ax: int, block: int = 1, lead: int = 1) -> bool:
        """Record that `name` holds the channels; False if it was known."""
        if name in self.values:
            if self.values[name] != (ax, block, lead):
                raise _Left(f"{name!r} holds the channels on two axes")
            return False
        if name in self.m.inputs:
            raise _Left(f"{name!r} is a graph input")
        self.values[name] = (ax, block, lead)
        self.queue.append(name)
        return True

    def width(self, block: int = 1) -> int:
        """The size of the channel axis of the value at hand: the group's, or a Concat's."""
        return self.total if self.at is not None else self.channels * block

    def lead(self, name: str) -> int:
        """How many times a merged batch axis repeats the channels of group value `name`."""
        return self.values[name][2]

    def plain(self, name: str, node: Any) -> None:
        """Refuse a value whose channels share their axis with a merged batch axis."""
        if self.values[name][2] != 1:
            raise _Left(f"{self.m.label(node)} reads channels merged with a batch axis")

    def rank(self, name: str) -> int:
        s = self.m.shape(name)
        if s is None:
            raise _Left(f"the rank of {name!r} is unknown")
        return len(s)

    def member(self, node: Any, slot: int, axis: int, weight: bool, block: int = 1, what: str = "weight") -> str:
        """Make input `slot` of `node` (an initializer, maybe through ``Identity``) a member
        (from entry :attr:`at` of its axis, where a ``Concat`` put the channels)."""
        m = self.m
        name = node.input[slot]
        src = m.alias.get(name, name)
        if src not in m.inits:
            raise _Left(f"{what} {name!r} of {m.label(node)} is not an initializer")
        dims = m.init_dims(src)
        p = axis % len(dims) if dims else 0
        start = self.at
        if not dims or dims[p] != (self.total if start is not None else self.channels * block):
            raise _Left(f"{what} {name!r} of shape {list(dims)} does not hold {self.channels} channels on axis {p}")
        start = start or 0
        shared = m.reads[src] > 1 or name != src
        whole = dims[p] == self.channels * block
        if not shared and block == 1 and whole:
            key = src
        else:
            key = m.fresh(src)
            where = (m.index[id(node)], slot)
            copy = m.copy_of(where, src) if shared else None
            self.views[key] = View(src, p, block, where if shared else None, start, copy)
        self.members.append(Member(key, p, weight))
        return key

    def constant_member(self, node: Any, slot: int, ax: int, block: int) -> None:
        m = self.m
        name = node.input[slot]
        dims = m.dims(name)
        if dims is None:
            raise _Left(f"{m.label(node)} reads {name!r}, which is not a constant")
        p = len(dims) + ax
        if p < 0 or dims[p] == 1:
            return  # broadcast over the channels: untouched
        if dims[p] != (self.total if self.at is not None else self.channels * block):
            raise _Left(
                f"{m.label(node)} constant {name!r} of shape {list(dims)} does not fit {self.channels} channels"
            )
        if m.alias.get(name, name) not in m.inits:
            raise _Left(f"per-channel constant {name!r} of {m.label(node)} is a Constant node")
        self.member(node, slot, p, False, block, "per-channel constant")

    def broadcast(self, name: str, ax: int) -> bool:
        """Whether activation `name` broadcasts over the channel axis (size 1, or no such axis)."""
        s = self.m.shape(name)
        if s is None:
            return False
        return len(s) + ax < 0 or s[ax] == 1

    def binary(self, node: Any, ax: int, block: int, lead: int) -> None:
        """Take an element-wise node: constants are members, activations join the group."""
        m = self.m
        for slot, x in enumerate(node.input):
            if not x:
                continue
            if x in self.values:
                if self.values[x] != (ax, block, lead):
                    raise _Left(f"{m.label(node)} combines the channels on different axes")
            elif m.dims(x) is not None:
                if lead != 1 and m.dims(x) and len(m.dims(x) or ()) + ax >= 0 and (m.dims(x) or ())[ax] != 1:
                    raise _Left(f"{m.label(node)} applies a constant to channels merged with a batch axis")
                self.constant_member(node, slot, ax, block)
            elif not self.broadcast(x, ax):
                if self.at is not None:
                    raise _Left(f"{m.label(node)} combines channels a Concat joined with {x!r}")
                self.back(x, ax, block, node, lead)
        joined = (self.at, self.total)
        if self.at is not None and any(self.offset.get(x) != joined for x in node.input if x in self.values):
            raise _Left(f"{m.label(node)} combines channels at different places of a Concat")
        self.add_value(node.output[0], ax, block, lead)

    def consumer(self, node: Any, slot: int, axis: int, block: int) -> None:
        """`node` reads the channels through its weight's `axis`: a member, and a consumer."""
        key = self.member(node, slot, axis, True, block)
        self.closing.append(key)
        self.consumers.append(self.m.label(node))

    def produced(self, node: Any, ax: int, block: int) -> None:
        """Take producer `node`, whose output holds the channels: its weight and bias are members."""
        m = self.m
        found = _producer(m, node)
        if found is None:
            raise _Left(f"{node.output[0]!r} comes from {m.label(node)}, which the trace cannot follow back")
        w, channels, reason_or_axis = found
        if isinstance(reason_or_axis, str):
            raise _Left(reason_or_axis)
        if channels != self.channels * block:
            raise _Left(f"{m.label(node)} makes {channels} channels, not {self.channels} x {block}")
        rank = self.rank(node.output[0])
        if (ax - reason_or_axis) % rank:
            raise _Left(f"{m.label(node)} makes its channels on another axis")
        op = node.op_type
        if op == "Conv":
            groups = int(_attr(m.onnx, node, "group", 1))
            if groups > 1:
                self.split(node, groups, block)
            self.member(node, 1, 0, True, block)
            if len(node.input) > 2 and node.input[2]:
                self.member(node, 2, 0, False, block, "bias")
        else:
            axis = 0 if op == "Gemm" and int(_attr(m.onnx, node, "transB", 0)) else 1
            self.member(node, 1, axis, True, block)
            if op == "Gemm" and len(node.input) > 2 and node.input[2]:
                c = m.dims(node.input[2]) or ()
                if c and c[-1] != 1:
                    self.member(node, 2, len(c) - 1, False, block, "bias")
        self.producers.append(node)
        self.done.add(m.index[id(node)])

    def back(self, name: str, ax: int, block: int, via: Any, lead: int = 1) -> None:
        """Value `name` joins the group (read by `via` beside a group value): trace it back."""
        m = self.m
        if name in m.inputs:
            what = "residual Add" if via.op_type == "Add" else m.label(via)
            raise _Left(f"{what}: {m.label(via)} also reads {name!r}")  # a graph input
        if not self.add_value(name, ax, block, lead):
            return
        node = m.made_by.get(name)
        if node is None:
            raise _Left(f"{name!r} is made by no node")
        idx = m.index[id(node)]
        if idx in self.done:
            return
        if node.op_type in _MIXING_NORMS:
            raise _Left(f"{name!r} comes from {m.label(node)}, {_why_norm(node.op_type)}")
        found = _BACK.get(node.op_type)
        if found is None or _producer(m, node) is not None:
            if lead != 1:
                raise _Left(f"{name!r} holds channels merged with a batch axis, made by {m.label(node)}")
            self.produced(node, ax, block)
            return
        self.done.add(idx)
        found(self, node, ax, block)

    # ---------------------------------------------------------------- back: one method per op type

    def back_unary(self, node: Any, ax: int, block: int) -> None:
        self.check_unary(node, ax)
        self.back(node.input[0], ax, block, node, self.lead(node.output[0]))

    def back_binary(self, node: Any, ax: int, block: int) -> None:
        self.binary(node, ax, block, self.lead(node.output[0]))

    def back_norm(self, node: Any, ax: int, block: int) -> None:
        self.plain(node.output[0], node)
        self.norm_members(node, node.output[0], ax, block)
        self.back(node.input[0], ax, block, node)

    def back_pool(self, node: Any, ax: int, block: int) -> None:
        self.plain(node.output[0], node)
        self.check_pool(node, node.output[0], ax, block)
        self.back(node.input[0], ax, block, node)

    def back_conv(self, node: Any, ax: int, block: int) -> None:
        self.plain(node.output[0], node)
        if not self.depthwise_members(node, node.output[0], ax, block):
            self.produced(node, ax, block)
            return
        self.back(node.input[0], ax, block, node)

    def back_transpose(self, node: Any, ax: int, block: int) -> None:
        r = self.rank(node.output[0])
        perm = _attr(self.m.onnx, node, "perm") or list(range(r))[::-1]
        self.back(node.input[0], perm[ax % r] - r, block, node, self.lead(node.output[0]))

    def back_reshape(self, node: Any, ax: int, block: int) -> None:
        lead = self.lead(node.output[0])
        q, b, lead_in = self.reshaped(node, node.output[0], ax, block, lead, node.input[0])
        self.back(node.input[0], q, b, node, lead_in)
        self.reshape_target(node, node.input[0], q, b * lead_in, node.output[0], ax, block * lead)

    # ---------------------------------------------------------------- checks shared by both directions

    def check_unary(self, node: Any, ax: int) -> None:
        m = self.m
        if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1] and m.uses(node.output[1]):
            raise _Left(f"the mask of {m.label(node)} is read")
        if node.op_type == "Clip":
            for x in node.input[1:]:
                if x and m.dims(x) not in ((), (1,)):
                    raise _Left(f"{m.label(node)} bound {x!r} is not a scalar constant")
        if node.op_type in _SOFTMAX:
            r = self.rank(node.input[0])
            axis = int(_attr(m.onnx, node, "axis", -1))
            if axis % r == ax % r:
                raise _Left(f"{m.label(node)} normalizes over the channel axis")

    def check_pool(self, node: Any, name: str, ax: int, block: int) -> None:
        if ax % self.rank(name) != 1 or block != 1:
            raise _Left(f"{self.m.label(node)} pools axes after 1, not after the channel axis")
        if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1] and self.m.uses(node.output[1]):
            raise _Left(f"the indices of {self.m.label(node)} are read")

    def norm_members(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        if ax % self.rank(name) != 1 or block != 1:
            raise _Left(f"{m.label(node)} normalizes axis 1, not the channel axis")
        last = 5 if node.op_type == "BatchNormalization" else 3
        for slot in range(1, min(last, len(node.input))):
            self.member(node, slot, 0, False, 1, f"{node.op_type} input")
        if any(o and m.uses(o) for o in node.output[1:]):
            raise _Left(f"the running statistics of {m.label(node)} are read")

    def depthwise_members(self, node: Any, name: str, ax: int, block: int) -> bool:
        """Take a depthwise convolution's members; False if `node` is a plain Conv."""
        m, channels = self.m, self.channels
        w = node.input[1]
        dims = m.dims(w)
        if dims is None:
            raise _Left(f"{m.label(node)} W {w!r} is not an initializer")
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups == 1:
            return False
        if ax != 1 - len(dims) or block != 1:
            raise _Left(f"{m.label(node)} reads channels on axis 1, not the channel axis")
        channels = self.width()
        if groups == channels and dims[1] == 1 and dims[0] == channels:
            self.member(node, 1, 0, True, 1, "depthwise weight")
            if len(node.input) > 2 and node.input[2]:
                self.member(node, 2, 0, False, 1, "bias")
            self.depthwise.append(m.index[id(node)])
            return True
        if groups == channels and dims[1] == 1:
            raise _Left(f"depthwise {m.label(node)} with a channel multiplier of {dims[0] // channels}")
        return False  # grouped

    def split(self, node: Any, groups: int, block: int) -> None:
        """The channels lie in the `groups` groups of grouped ``Conv`` `node`."""
        if block != 1 or self.at is not None:
            where = "in blocks" if block != 1 else "that a Concat joined with others"
            raise _Left(f"grouped {self.m.label(node)} (group={groups}) holds channels {where}")
        joint = math.lcm(self.segments, groups)
        if self.channels % joint:
            raise _Left(f"grouped {self.m.label(node)} (group={groups}) does not split {self.channels} channels evenly")
        self.segments = joint

    def grouped_consumer(self, node: Any, groups: int) -> None:
        """Grouped ``Conv`` `node` reads the channels: its W, block by block, closes the group."""
        m = self.m
        name = node.input[1]
        src = m.alias.get(name, name)
        if src not in m.inits:
            raise _Left(f"weight {name!r} of {m.label(node)} is not an initializer")
        dims = m.init_dims(src)
        self.split(node, groups, 1)
        if dims[1] * groups != self.channels or dims[0] % groups:
            shape = list(dims)
            raise _Left(f"grouped {m.label(node)} W {name!r} of shape {shape} does not read {self.channels} channels")
        shared = m.reads[src] > 1 or name != src
        key = m.fresh(src)
        where = (m.index[id(node)], 1)
        copy = m.copy_of(where, src) if shared else None
        self.views[key] = View(src, 1, 1, where if shared else None, 0, copy, groups)
        self.members.append(Member(key, 1, True))
        self.closing.append(key)
        self.consumers.append(m.label(node))

    def reshaped(self, node: Any, src: str, ax: int, block: int, lead: int, dst: str) -> tuple[int, int, int]:
        """(axis, block, lead) of the channels in `dst`, the other side of Reshape `node` from `src`."""
        m = self.m
        s_in, s_out = m.shape(src), m.shape(dst)
        if s_in is None or s_out is None:
            raise _Left(f"the shapes around {m.label(node)} are unknown")
        found = _map_axis(s_in, ax % len(s_in), block, lead, self.channels, s_out)
        if found is None:
            raise _Left(f"{m.label(node)} mixes the channels with other axes ({list(s_in)} -> {list(s_out)})")
        q, b, lead_out = found
        return q - len(s_out), b, lead_out

    def reshape_target(self, node: Any, src: str, ax_in: int, b_in: int, dst: str, ax_out: int, b_out: int) -> None:
        """Have the target shape of Reshape `node` (from `src` to `dst`) follow the channel count."""
        m = self.m
        target = m.ints(node.input[1]) if len(node.input) > 1 else None
        if target is None:
            raise _Left(f"the target shape of {m.label(node)} is not a constant held in the model")
        r_in, r_out = self.rank(src), len(target)
        p, q = ax_in % r_in, ax_out % r_out
        copy = not int(_attr(m.onnx, node, "allowzero", 0))
        if copy and p < r_out and target[p] == 0 and not (p == q and b_in == b_out):
            raise _Left(f"{m.label(node)} copies the channel axis of its input to another place")
        entry = target[q]
        if entry == -1 or (copy and entry == 0 and p == q and b_in == b_out):
            return
        if entry != self.channels * b_out:
            raise _Left(f"{m.label(node)} to {target} does not keep {self.channels} channels on axis {q}")
        name = node.input[1]
        src_name = m.alias.get(name, name)
        if m.reads[src_name] == 1 and name == src_name:
            self.shapes.append((name, q, b_out))
            return
        key = m.fresh(src_name)
        self.views[key] = View(src_name, 0, 1, (m.index[id(node)], 1))
        self.shapes.append((key, q, b_out))

    # ---------------------------------------------------------------- forward: one method per op type

    def unary(self, node: Any, name: str, ax: int, block: int) -> None:
        self.check_unary(node, ax)
        if name in self.pooled:
            self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax, block, self.lead(name))

    def global_pool(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        if ax != 1 - self.rank(name) or block != 1:
            raise _Left(f"{self.m.label(node)} pools axes after 1, not after the channel axis")
        self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax)

    def resize(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        self.plain(name, node)
        r = self.rank(name)
        slot = 1 if node.op_type == "Upsample" else 2
        scales = None
        if len(node.input) > slot and node.input[slot]:
            t = m.main.constants.get(m.alias.get(node.input[slot], node.input[slot]))
            scales = None if t is None else [float(v) for v in m.onnx.numpy_helper.to_array(t).reshape(-1)]
        if node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
            raise _Left(f"{m.label(node)} resizes to sizes given as an input")
        if scales is None or len(scales) != r or scales[ax % r] != 1.0:
            raise _Left(f"{m.label(node)} does not keep the channel axis (scales {scales})")
        self.add_value(node.output[0], ax, block)

    def pool(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        self.check_pool(node, name, ax, block)
        self.add_value(node.output[0], ax)

    def reduce(self, node: Any, name: str, ax: int, block: int) -> None:
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
        if block != 1 and p + 1 in reduced:
            raise _Left(f"{m.label(node)} reduces within the channels' blocks")
        if int(_attr(m.onnx, node, "keepdims", 1)):
            out_ax = ax
        else:
            out_ax = p - sum(a < p for a in reduced) - (r - len(reduced))
        if name in self.pooled or set(range(p + 1, r)) <= reduced:
            self.pooled.add(node.output[0])
        self.add_value(node.output[0], out_ax, block, self.lead(name))

    def reshape(self, node: Any, name: str, ax: int, block: int) -> None:
        out, lead = node.output[0], self.lead(name)
        norms = [n for n, _ in self.m.consumers.get(out, ()) if n.op_type == "InstanceNormalization"]
        if norms and ax % self.rank(name) == 1:  # torch.onnx's GroupNorm: [N, C, ...] -> [N, G, -1]
            what = f"{self.m.label(node)} and {self.m.label(norms[0])} normalize groups of channels together"
            raise _Left(f"{what} (a GroupNorm): {_why_norm('GroupNormalization')}")
        q, b, lead_out = self.reshaped(node, name, ax, block, lead, out)
        self.reshape_target(node, name, ax, block * lead, out, q, b * lead_out)
        if name in self.pooled and b == 1 and q == -1:
            self.pooled.add(out)
        self.add_value(out, q, b, lead_out)

    def flatten(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        r = self.rank(name)
        axis = int(_attr(self.m.onnx, node, "axis", 1))
        if name not in self.pooled or r + ax != (axis if axis >= 0 else r + axis) or block != 1:
            raise _Left(f"{self.m.label(node)} mixes the channels with other axes (only [N, C, 1, ...] -> [N, C])")
        self.add_value(node.output[0], -1)

    def transpose(self, node: Any, name: str, ax: int, block: int) -> None:
        r = self.rank(name)
        perm = list(_attr(self.m.onnx, node, "perm") or list(range(r))[::-1])
        self.add_value(node.output[0], perm.index(ax % r) - r, block, self.lead(name))

    def elementwise(self, node: Any, name: str, ax: int, block: int) -> None:
        self.binary(node, ax, block, self.lead(name))

    def batch_norm(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        self.norm_members(node, name, ax, block)
        self.add_value(node.output[0], ax)

    def matmul(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        i = list(node.input).index(name)
        if m.dims(node.input[1]) is not None and i == 0:  # a layer: it closes the group
            self.plain(name, node)
            dims = m.dims(node.input[1])
            if ax != -1:
                raise _Left(f"{m.label(node)} reduces the last axis, not the channel axis")
            if dims is None or len(dims) != 2 or dims[0] != self.width(block):
                w = node.input[1]
                raise _Left(f"{m.label(node)} B {w!r} is not a [K, N] initializer with K = {self.channels * block}")
            self.consumer(node, 1, 0, block)
            return
        if any(m.dims(x) is not None for x in node.input):
            raise _Left(f"{m.label(node)} multiplies the channels by a constant {node.input[1 - i]!r}")
        r = self.rank(name)
        if ax >= -2 or r < 3:
            raise _Left(f"{m.label(node)} reads the channels on a matrix axis, not a batch axis")
        other, lead = node.input[1 - i], self.lead(name)
        if not self.broadcast(other, ax):
            self.back(other, ax, block, node, lead)
        self.add_value(node.output[0], ax, block, lead)

    def gemm(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        w = node.input[1]
        self.plain(name, node)
        if node.input[0] != name or m.dims(w) is None:
            raise _Left(f"{m.label(node)} reads {name!r} as B")
        if int(_attr(m.onnx, node, "transA", 0)) or ax != -1:
            raise _Left(f"{m.label(node)} with transA=1")
        dims = m.dims(w)
        k_axis = 1 if int(_attr(m.onnx, node, "transB", 0)) else 0
        if dims is None or len(dims) != 2 or dims[k_axis] != self.width(block):
            raise _Left(f"{m.label(node)} B {w!r} is not an initializer with {self.channels} input features")
        self.consumer(node, 1, k_axis, block)

    def conv(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        w = node.input[1]
        dims = m.dims(w)
        self.plain(name, node)
        if node.input[0] != name or dims is None:
            raise _Left(f"{m.label(node)} W {w!r} is not an initializer")
        if ax != 1 - len(dims) or block != 1:
            raise _Left(f"{m.label(node)} reads channels on axis 1, not the channel axis")
        if self.depthwise_members(node, name, ax, block):
            self.add_value(node.output[0], ax)
            return
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups > 1:
            self.grouped_consumer(node, groups)
            return
        if dims[1] != self.width():
            raise _Left(f"{m.label(node)} W {w!r} has {dims[1]} input channels, not {self.width()}")
        self.consumer(node, 1, 1, 1)

    def concat(self, node: Any, name: str, ax: int, block: int) -> None:
        """The channels go on at an offset of the joined axis: readers see a range of their inputs."""
        m = self.m
        r = self.rank(name)
        axis = int(_attr(m.onnx, node, "axis", 0)) % r
        if axis != ax % r:
            raise _Left(f"{m.label(node)} joins {name!r} along another axis than the channels'")
        if block != 1 or self.lead(name) != 1:
            raise _Left(f"{m.label(node)} joins channels in blocks or merged with a batch axis")
        if list(node.input).count(name) != 1:
            raise _Left(f"{m.label(node)} reads {name!r} twice")
        sizes = []
        for x in node.input:
            s = m.shape(x)
            d = s[axis] if s is not None and len(s) == r else None
            if not isinstance(d, int):
                raise _Left(f"the size of {x!r} along the axis {m.label(node)} joins is unknown")
            sizes.append(d)
        i = list(node.input).index(name)
        start = sum(sizes[:i]) + (self.at or 0)
        self.add_value(node.output[0], ax)
        self.offset[node.output[0]] = (start, sum(sizes))

    def shape_read(self, node: Any, name: str, ax: int, block: int) -> None:
        raise _Left(f"its shape is read ({self.m.label(node)})")

    # ---------------------------------------------------------------- the walk

    def step(self, node: Any, i: int, name: str, ax: int, block: int) -> None:
        """Take `node`, which reads group value `name` (channels on `ax`) as its input `i`."""
        idx = self.m.index[id(node)]
        if idx in self.done:
            return
        found = _STEPS.get(node.op_type)
        if found is None or (found[1] and i != 0):
            if node.op_type in _MIXING_NORMS:
                raise _Left(f"{self.m.label(node)} reads {name!r}: {_why_norm(node.op_type)}")
            raise _Left(f"{self.m.label(node)} reads {name!r}")
        joined = self.offset.get(name)
        if joined is not None and node.op_type not in _JOINED:
            raise _Left(f"{self.m.label(node)} reads {name!r}, whose channels a Concat joined with others")
        self.at, self.total = joined if joined is not None else (None, 0)
        self.done.add(idx)
        found[0](self, node, name, ax, block)
        if joined is not None:
            for o in node.output:
                if o in self.values and o not in self.offset:
                    self.offset[o] = joined
        self.at, self.total = None, 0

    def run(self, start: Any, ax: int, block: int) -> None:
        """Take producer `start` and follow its output until every value is closed."""
        self.produced(start, ax, block)
        self.add_value(start.output[0], ax, block)
        m = self.m
        while self.queue:
            name = self.queue.pop(0)
            ax, block, _ = self.values[name]
            if name in m.outputs:
                raise _Left(f"{name!r} is a graph output")
            if name in m.in_subgraph:
                raise _Left(f"{name!r} is read inside a subgraph")
            uses = m.consumers.get(name, ())
            if not uses:
                raise _Left(f"{name!r} is not used")
            for node, i in uses:
                self.step(node, i, name, ax, block)
        if not self.consumers:
            raise _Left("no layer reads the channels")


def _why_norm(op: str) -> str:
    """Why the channels a norm over several channels reads stay (one line)."""
    if op == "GroupNormalization":
        return "only whole groups could go, which ONNX shrinking does not follow (torch modules: prune.shrink)"
    return "a norm over the channels, whose statistics would change without the removed ones"


_Step = Callable[[_Trace, Any, str, int, int], None]
_Back = Callable[[_Trace, Any, int, int], None]

#: Op type -> (the :class:`_Trace` method that takes a node of that type reading a group
#: value, whether the value must be its first input). Add an op here, with its method.
_STEPS: dict[str, tuple[_Step, bool]] = {
    **{op: (_Trace.unary, True) for op in _UNARY | _SOFTMAX},
    **{op: (_Trace.global_pool, True) for op in _GLOBAL_POOLS},
    **{op: (_Trace.pool, True) for op in _POOLS},
    **{op: (_Trace.resize, True) for op in _RESIZE},
    **{op: (_Trace.reduce, True) for op in _REDUCE},
    "Reshape": (_Trace.reshape, True),
    "Flatten": (_Trace.flatten, True),
    "Transpose": (_Trace.transpose, True),
    **{op: (_Trace.elementwise, False) for op in _BINARY | _SELECT},
    **{op: (_Trace.batch_norm, True) for op in _CHANNEL_NORMS},
    "MatMul": (_Trace.matmul, False),
    "Gemm": (_Trace.gemm, False),
    "Conv": (_Trace.conv, False),
    "Concat": (_Trace.concat, False),
    "Shape": (_Trace.shape_read, False),
    "Size": (_Trace.shape_read, False),
}

#: Op types that take channels a ``Concat`` joined with others (at an offset of the axis).
_JOINED = _UNARY | _POOLS | _GLOBAL_POOLS | _RESIZE | _CHANNEL_NORMS | _BINARY
_JOINED |= {"Conv", "MatMul", "Gemm", "Concat", "Flatten"}

#: Op type -> the :class:`_Trace` method that takes a node of that type whose output
#: joins a group from the other side (a residual branch): it goes on to the node's inputs.
#: Producers (``MatMul``, ``Gemm``, a ``Conv`` with ``group=1``) end the way back.
_BACK: dict[str, _Back] = {
    **{op: _Trace.back_unary for op in _UNARY | _SOFTMAX},
    **{op: _Trace.back_binary for op in _BINARY | _SELECT},
    **{op: _Trace.back_norm for op in _CHANNEL_NORMS},
    **{op: _Trace.back_pool for op in _POOLS},
    "Conv": _Trace.back_conv,
    "Transpose": _Trace.back_transpose,
    "Reshape": _Trace.back_reshape,
}


def _head_size(m: _Model, node: Any, channels: int) -> int | None:
    """The head size where the output of `node` (through biases and element-wise ops) is
    reshaped from ``[..., H*D]`` to ``[..., H, D]``; None if it is not."""
    value, seen = node.output[0], 0
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
        if kind == "heads":
            size = _head_size(m, node, channels)
            if size is None:
                continue
            channels, block = channels // size, size
        trace = _Trace(m, channels)
        try:
            trace.run(node, axis, block)
        except _Left as exc:
            met = [node] + [p for p in trace.producers if p is not node]
            for p in met:
                if m.index[id(p)] in claimed:
                    continue
                claimed.add(m.index[id(p)])
                pw = _producer(m, p)
                out.left.append(LeftGroup(name_of(p), m.label(p), pw[0] if pw else "", channels, str(exc)))
            continue
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
            )
        )
    where = {name_of(n): i for i, n in enumerate(m.nodes)}
    out.left.sort(key=lambda lf: where.get(lf.name, 0))
    return out
