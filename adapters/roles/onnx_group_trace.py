"""The trace of :func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups`: one channel group followed through a graph.

:class:`_Trace` holds the values that carry a group's channels and what was found of
them (producers, members, consumers); :data:`_STEPS` maps each op type to the method
that follows a node reading a group value forward, :data:`_BACK` to the one that goes
back from a node whose output joins the group. What is followed, closes a group or
leaves it is told in :mod:`~arrayprune.adapters.roles.onnx_groups`; a new op type is a
method here and a row of :data:`_STEPS` (and :data:`_BACK` if it can be met backward).
"""


from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from arrayprune.groups import Member

from .onnx_graph import _attr
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
from .onnx_group_types import View

__all__: list[str] = []  # the trace is the private engine of onnx_groups


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
        self.targets: list[Any] = []  # Reshapes whose target is the Shape of a group value

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

    def member(
        self, node: Any, slot: int, axis: int, weight: bool, block: int = 1, what: str = "weight",
        constant: bool = False,
    ) -> str:  # fmt: skip
        """Make input `slot` of `node` (an initializer, maybe through ``Identity``; with
        `constant`, also a ``Constant`` read by `node` alone) a member (from entry
        :attr:`at` of its axis, where a ``Concat`` put the channels)."""
        m = self.m
        name = node.input[slot]
        src = m.alias.get(name, name)
        own = constant and name in m.constants and m.reads[name] == 1 and m.dims(name) is not None
        if src not in m.inits and not own:
            raise _Left(f"{what} {name!r} of {m.label(node)} is not an initializer")
        dims = (m.dims(src) or ()) if own else m.init_dims(src)
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

    def produced(self, node: Any, ax: int, block: int, parts: int = 1) -> None:
        """Take producer `node`, whose output holds the channels: its weight and bias are members.

        With `parts` above 1, the output is `parts` equal consecutive ranges of columns
        (the query, key and value of a fused projection), each holding the channels:
        every range of the weight and bias is a member of its own.
        """
        m = self.m
        found = _producer(m, node)
        if found is None:
            raise _Left(f"{node.output[0]!r} comes from {m.label(node)}, which the trace cannot follow back")
        w, channels, reason_or_axis = found
        if isinstance(reason_or_axis, str):
            raise _Left(reason_or_axis)
        if channels != self.channels * block * parts:
            raise _Left(f"{m.label(node)} makes {channels} channels, not {self.channels} x {block}")
        rank = self.rank(node.output[0])
        if (ax - reason_or_axis) % rank:
            raise _Left(f"{m.label(node)} makes its channels on another axis")
        op = node.op_type
        if op == "Conv" and parts == 1:
            groups = int(_attr(m.onnx, node, "group", 1))
            if groups > 1:
                self.split(node, groups, block)
            self.member(node, 1, 0, True, block)
            if len(node.input) > 2 and node.input[2]:
                self.member(node, 2, 0, False, block, "bias")
        elif op == "Conv":
            raise _Left(f"{m.label(node)} is a Conv split into {parts} parts")
        else:
            axis = 0 if op == "Gemm" and int(_attr(m.onnx, node, "transB", 0)) else 1
            c = (m.dims(node.input[2]) or ()) if op == "Gemm" and len(node.input) > 2 and node.input[2] else ()
            for i in range(parts):
                if parts > 1:
                    self.at, self.total = i * channels // parts, channels
                self.member(node, 1, axis, True, block)
                if c and c[-1] != 1:
                    self.member(node, 2, len(c) - 1, False, block, "bias")
            self.at, self.total = None, 0
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
        found = _BACK.get(node.op_type)
        if node.op_type in _MIXING_NORMS and found is None:
            raise _Left(f"{name!r} comes from {m.label(node)}, {_why_norm(node.op_type)}")
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

    def back_matmul(self, node: Any, ax: int, block: int) -> None:
        """A product of two activations with the channels on a batch axis (attention
        scores, their product with the values): both operands hold them."""
        m, out = self.m, node.output[0]
        if any(m.dims(x) is not None for x in node.input) or ax >= -2 or self.rank(out) < 3:
            raise _Left(f"{out!r} comes from {m.label(node)}, which the trace cannot follow back")
        for x in node.input:
            if not self.broadcast(x, ax):
                self.back(x, ax, block, node, self.lead(out))

    def back_group_norm(self, node: Any, ax: int, block: int) -> None:
        self.group_norm_members(node, node.output[0], ax, block)
        self.back(node.input[0], ax, block, node)

    def back_concat(self, node: Any, ax: int, block: int) -> None:
        if len(node.input) != 1:
            raise _Left(f"{self.m.label(node)} joins the channels with other values")
        self.back(node.input[0], ax, block, node, self.lead(node.output[0]))

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
        if ax % self.rank(name) != 1:
            raise _Left(f"{self.m.label(node)} pools axes after 1, not after the channel axis")
        if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1] and self.m.uses(node.output[1]):
            raise _Left(f"the indices of {self.m.label(node)} are read")

    def norm_members(self, node: Any, name: str, ax: int, block: int) -> None:
        m = self.m
        if ax % self.rank(name) != 1:
            raise _Left(f"{m.label(node)} normalizes axis 1, not the channel axis")
        last = 5 if node.op_type == "BatchNormalization" else 3
        for slot in range(1, min(last, len(node.input))):
            self.member(node, slot, 0, False, block, f"{node.op_type} input", constant=True)
        if any(o and m.uses(o) for o in node.output[1:]):
            raise _Left(f"the running statistics of {m.label(node)} are read")

    def group_norm_members(self, node: Any, name: str, ax: int, block: int) -> None:
        """Take ``GroupNormalization`` `node`: a channel of the group must be one of its norm
        groups; its scale and bias (one entry per group, opset 18; per channel, opset 21)
        are members, its ``num_groups`` follows the channel count."""
        m = self.m
        self.plain(name, node)
        what = f"{m.label(node)} normalizes groups of channels together"
        if ax % self.rank(name) != 1:
            raise _Left(f"{what} on axis 1, not the channel axis")
        groups = int(_attr(m.onnx, node, "num_groups", 0))
        if groups <= 0 or (self.channels * block) % groups:
            raise _Left(f"{what} in {groups} groups, which do not split {self.channels * block} channels")
        if groups != self.channels:
            self.regroup(groups, block, what)
        for slot in (1, 2):
            dims = m.dims(node.input[slot]) if len(node.input) > slot and node.input[slot] else None
            if dims is None:
                raise _Left(f"{what}: its input {slot} is not a constant")
            self.member(node, slot, 0, False, 1 if dims == (groups,) else block, "GroupNormalization input", True)
        self.depthwise.append(m.index[id(node)])

    def group_norm(self, node: Any, name: str, ax: int, block: int) -> None:
        self.group_norm_members(node, name, ax, block)
        self.add_value(node.output[0], ax, block)

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
        if target is None and self.shape_of_same(node, dst, ax_out, b_out):
            return
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

    def shape_of_same(self, node: Any, dst: str, ax_out: int, b_out: int) -> bool:
        """Whether Reshape `node`'s target is the ``Shape`` of a group value that holds the
        channels as its output `dst` does (torch.onnx's GroupNorm reshaping back to its
        input's shape): the target then follows by itself."""
        m = self.m
        made = m.made_by.get(node.input[1])
        if made is None or made.op_type != "Shape" or any(a.name in ("start", "end") for a in made.attribute):
            return False
        v = made.input[0]
        s_v, s_dst = m.shape(v), m.shape(dst)
        if v not in self.values or s_v is None or s_v != s_dst or None in s_v:
            return False
        a, b, lead = self.values[v]
        r = len(s_v)
        return a % r == ax_out % r and b * lead == b_out

    # ---------------------------------------------------------------- forward: one method per op type

    def unary(self, node: Any, name: str, ax: int, block: int) -> None:
        self.check_unary(node, ax)
        if name in self.pooled:
            self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax, block, self.lead(name))

    def global_pool(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        if ax != 1 - self.rank(name):
            raise _Left(f"{self.m.label(node)} pools axes after 1, not after the channel axis")
        self.pooled.add(node.output[0])
        self.add_value(node.output[0], ax, block)

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
        self.add_value(node.output[0], ax, block)

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
            s = self.m.shape(out)
            what = f"{self.m.label(node)} and {self.m.label(norms[0])} normalize groups of channels together"
            groups = s[1] if s is not None and len(s) > 1 else None
            if not isinstance(groups, int) or groups <= 0 or (self.channels * block) % groups:
                raise _Left(f"{what} (a GroupNorm) in an unknown number of groups")
            if groups != self.channels:
                self.regroup(groups, block, what)
        q, b, lead_out = self.reshaped(node, name, ax, block, lead, out)
        self.reshape_target(node, name, ax, block * lead, out, q, b * lead_out)
        if name in self.pooled and b == 1 and q == -1:
            self.pooled.add(out)
        self.add_value(out, q, b, lead_out)

    def regroup(self, groups: int, block: int, what: str) -> None:
        """The channels can only go in whole norm groups: start again with `groups` channels."""
        if groups == 1:
            raise _Left(f"{what} (a GroupNorm of one group): {_why_norm('GroupNormalization')}")
        if block != 1 or self.segments != 1 or self.at is not None or groups > self.channels:
            raise _Left(f"{what} (a GroupNorm) of {groups} groups: the channels are already in blocks")
        raise _Regroup(f"{what} (a GroupNorm)", groups)

    def flatten(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        r = self.rank(name)
        axis = int(_attr(self.m.onnx, node, "axis", 1))
        if name not in self.pooled or r + ax != (axis if axis >= 0 else r + axis):
            raise _Left(f"{self.m.label(node)} mixes the channels with other axes (only [N, C, 1, ...] -> [N, C])")
        self.add_value(node.output[0], -1, block)

    def transpose(self, node: Any, name: str, ax: int, block: int) -> None:
        r = self.rank(name)
        perm = list(_attr(self.m.onnx, node, "perm") or list(range(r))[::-1])
        self.add_value(node.output[0], perm.index(ax % r) - r, block, self.lead(name))

    def elementwise(self, node: Any, name: str, ax: int, block: int) -> None:
        self.binary(node, ax, block, self.lead(name))

    def batch_norm(self, node: Any, name: str, ax: int, block: int) -> None:
        self.plain(name, node)
        self.norm_members(node, name, ax, block)
        self.add_value(node.output[0], ax, block)

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
        if ax != 1 - len(dims):
            raise _Left(f"{m.label(node)} reads channels on axis 1, not the channel axis")
        if self.depthwise_members(node, name, ax, block):
            self.add_value(node.output[0], ax)
            return
        groups = int(_attr(m.onnx, node, "group", 1))
        if groups > 1:
            if block != 1:
                raise _Left(f"grouped {m.label(node)} (group={groups}) reads channels in blocks")
            self.grouped_consumer(node, groups)
            return
        if dims[1] != self.width(block):
            raise _Left(f"{m.label(node)} W {w!r} has {dims[1]} input channels, not {self.width(block)}")
        self.consumer(node, 1, 1, block)

    def concat(self, node: Any, name: str, ax: int, block: int) -> None:
        """The channels go on at an offset of the joined axis: readers see a range of their inputs."""
        if len(node.input) == 1:  # one input (a key cache with no past): the same tensor
            self.add_value(node.output[0], ax, block, self.lead(name))
            return
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
        """A ``Shape`` whose entries are only read away from the channel axis (GPT-2's
        causal mask reads the sequence lengths of the query and key) does not change."""
        m = self.m
        out = node.output[0]
        readers = m.consumers.get(out, ())
        whole = node.op_type == "Shape" and not any(a.name in ("start", "end") for a in node.attribute)
        if whole and readers and out not in m.outputs and out not in m.in_subgraph:
            if all(r.op_type == "Reshape" and i == 1 for r, i in readers):
                self.targets.extend(r for r, _ in readers)  # checked in reshape_target, and at the end
                return
        if node.op_type != "Shape" or not self.shape_entries_kept(node, ax % self.rank(name)):
            raise _Left(f"its shape is read ({self.m.label(node)})")

    def shape_entries_kept(self, node: Any, p: int) -> bool:
        """Whether every entry of the shape ``Shape`` `node` makes that is read (through
        ``Slice`` or ``Gather`` with constant positions) is another axis than `p`."""
        m = self.m
        r = self.rank(node.input[0])
        start, end = int(_attr(m.onnx, node, "start", 0)), _attr(m.onnx, node, "end")
        axes = list(range(r))[slice(start, None if end is None else int(end))]
        if p not in axes:
            return True
        out = node.output[0]
        if out in m.outputs or out in m.in_subgraph or not m.consumers.get(out):
            return False
        for reader, i in m.consumers[out]:
            if i != 0:
                return False
            if reader.op_type == "Gather":
                at = m.ints(reader.input[1])
                if at is None or int(_attr(m.onnx, reader, "axis", 0)) != 0:
                    return False
                read = [axes[int(j)] for j in at]
            elif reader.op_type == "Slice" and len(reader.input) >= 3:
                ends = [m.ints(x) if x else None for x in list(reader.input)[1:5]]
                starts, stops = ends[0], ends[1]
                axes_in = ends[2] if len(ends) > 2 else [0]
                steps = ends[3] if len(ends) > 3 else [1]
                if starts is None or stops is None or len(starts) != 1 or axes_in not in ([0], None):
                    return False
                if steps is None or len(steps) != 1:
                    return False
                read = axes[slice(int(starts[0]), int(stops[0]), int(steps[0]))]
            else:
                return False
            if p in read:
                return False
        return True

    def fused(self, name: str, ax: int, block: int, parts: int) -> None:
        """Follow the output `name` of a fused projection (`parts` ranges of columns, each
        holding the channels) through reshapes and element-wise operators with constants
        to the ``Split`` that cuts it into its parts, whose outputs go on as group values."""
        m = self.m
        width = self.channels * block
        while True:
            if name in m.outputs or name in m.in_subgraph:
                raise _Left(f"{name!r} is a graph output or read inside a subgraph")
            self.values[name] = (ax, block * parts, 1)
            uses = m.consumers.get(name, ())
            if len(uses) != 1 or uses[0][1] != 0:
                raise _Left(f"{name!r}, which holds {parts} parts of the channels, is read {len(uses)} times")
            node = uses[0][0]
            self.done.add(m.index[id(node)])
            out = node.output[0]
            if node.op_type == "Reshape":
                q, b, lead = self.reshaped(node, name, ax, block * parts, 1, out)
                if lead != 1 or b != block * parts:
                    raise _Left(f"{m.label(node)} mixes the {parts} parts with other axes")
                self.reshape_target(node, name, ax, block * parts, out, q, block * parts)
                ax = q
            elif node.op_type in _UNARY:
                self.check_unary(node, ax)
            elif node.op_type in _BINARY:
                for slot, x in enumerate(node.input):
                    if x == name:
                        continue
                    if m.dims(x) is None:
                        raise _Left(f"{m.label(node)} combines {parts} parts of the channels with {x!r}")
                    for i in range(parts):
                        self.at, self.total = i * width, parts * width
                        self.constant_member(node, slot, ax, block)
                    self.at, self.total = None, 0
            elif node.op_type == "Split":
                self.split_parts(node, name, ax, block, parts)
                return
            else:
                raise _Left(f"{m.label(node)} reads {parts} parts of the channels")
            name = out

    def split_parts(self, node: Any, name: str, ax: int, block: int, parts: int) -> None:
        """``Split`` `node` cuts `name` into its `parts`: its sizes follow the channel count."""
        m = self.m
        r = self.rank(name)
        if int(_attr(m.onnx, node, "axis", 0)) % r != ax % r or len(node.output) != parts:
            raise _Left(f"{m.label(node)} does not cut the channel axis into {parts} parts")
        width = self.channels * block
        sizes = _attr(m.onnx, node, "split")
        if sizes is not None:
            raise _Left(f"{m.label(node)} states its sizes in an attribute (opset < 13)")
        if len(node.input) > 1 and node.input[1]:
            sizes = m.ints(node.input[1])
            if sizes is None or list(sizes) != [width] * parts:
                raise _Left(f"{m.label(node)} sizes {sizes} are not {parts} constant parts of {width}")
            given = node.input[1]
            src = m.alias.get(given, given)
            key = given
            if m.reads[src] != 1 or given != src:
                key = m.fresh(src)
                self.views[key] = View(src, 0, 1, (m.index[id(node)], 1))
            self.shapes.extend((key, i, block) for i in range(parts))
        for out in node.output:
            self.add_value(out, ax, block)

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

    def run(self, start: Any, ax: int, block: int, parts: int = 1) -> None:
        """Take producer `start` and follow its output until every value is closed (with
        `parts` above 1, from the outputs of the ``Split`` that cuts it into that many parts)."""
        self.produced(start, ax, block, parts)
        if parts > 1:
            self.fused(start.output[0], ax, block, parts)
        else:
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
        for node in self.targets:
            if m.index[id(node)] not in self.done:
                raise _Left(f"a Shape of the channels sets the target of {m.label(node)}, which reshapes other values")


class _Regroup(_Left):
    """The channels meet a GroupNorm of `groups` groups: the trace starts again with a norm
    group (a block of consecutive channels) as its unit."""

    def __init__(self, reason: str, groups: int):
        super().__init__(reason)
        self.groups = groups


def _why_norm(op: str) -> str:
    """Why the channels a norm over several channels reads stay (one line)."""
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
    "GroupNormalization": (_Trace.group_norm, True),
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
    "Concat": _Trace.back_concat,
    "MatMul": _Trace.back_matmul,
    "GroupNormalization": _Trace.back_group_norm,
}
