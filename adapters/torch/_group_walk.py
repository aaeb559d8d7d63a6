"""The walk over a ``torch.fx`` graph that grows channel groups: what a group is, where its
channels sit in each value (:class:`_Layout`), and the walk the rules of
:mod:`._group_rules` move it along (:class:`_Walk`). The entry point is
:func:`arrayprune.adapters.torch._groups.channel_groups`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import fx, nn

from ._base import pruning_hooks

__all__ = ["Rule", "Slot", "TorchGroup"]


@dataclass(frozen=True)
class Slot:
    """One tensor of a group: which entries of which axis hold the group's channels.

    Attributes
    ----------
    param : str
        Qualified name of a parameter or buffer (``"layer1.0.conv1.weight"``); with a
        pruning reparametrization, the name of the pruned tensor (``weight``, not
        ``weight_orig``).
    axis : int
        The axis along which the tensor holds channels.
    offset : int, default 0
        The first entry of the group's channels along `axis` (a consumer of a
        ``torch.cat`` holds several groups side by side).
    weight : bool, default True
        Whether it scores (layer weights); biases, norm parameters and statistics only
        lose channels.
    segments : int, default 1
        Above 1, the input side of a grouped convolution (``groups=segments``, weight
        ``[out, in/segments, ...]``): the tensor's axis 0 is split into `segments` equal
        blocks of rows, and block ``j`` reads the group's ``j``-th part of channels at
        its local entries along `axis` (channel ``c`` is entry ``c % (channels /
        segments)`` of the rows of block ``c // (channels / segments)``).
    """

    param: str
    axis: int
    offset: int = 0
    weight: bool = True
    segments: int = 1


@dataclass(frozen=True)
class TorchGroup:
    """Channels that go together, the tensors holding them, and why they stay (if they do).

    Attributes
    ----------
    name : str
        The first producer's qualified name (the model's input or an operation for a
        group no layer produces).
    channels : int
        How many channels.
    members : tuple of Slot
        Every tensor that holds them.
    reason : str or None
        Why the group cannot shrink (one line), or None when it can.
    block : int, default 1
        Channels go only in whole blocks of this many (consecutive) channels: the
        groups of a ``GroupNorm`` they pass through.
    segments : int, default 1
        The channels lie in this many equal consecutive parts (the groups of a grouped
        convolution they enter or leave), and every part loses as many channels as
        the others, ranked within the part.
    """

    name: str
    channels: int
    members: tuple[Slot, ...]
    reason: str | None = None
    block: int = 1
    segments: int = 1

    @property
    def shrinkable(self) -> bool:
        """Whether the group can lose channels."""
        return self.reason is None


class _Space:
    """A union-find node: channels that go together while the graph is walked."""

    def __init__(self, name: str, channels: int, order: int) -> None:
        self.parent: _Space = self
        self.name, self.channels, self.order = name, channels, order
        self.slots: list[Slot] = []
        self.reasons: list[str] = []
        self.block = 1  # channels that go only together (a GroupNorm's groups)
        self.segments = 1  # equal parts that lose as many channels each (grouped convolutions)

    def root(self) -> _Space:
        s = self
        while s.parent is not s:
            s.parent = s.parent.parent
            s = s.parent
        return s


class _Layout(NamedTuple):
    """Where a value holds tracked channels: one axis, one or more groups side by side."""

    axis: int
    spaces: tuple[_Space, ...]

    def widths(self) -> tuple[int, ...]:
        return tuple(s.root().channels for s in self.spaces)


_SHAPE = "arrayprune_shape"


def _shape(node: Any) -> tuple[int, ...] | None:
    """The shape of the tensor a node computed on the example inputs (None: not a tensor)."""
    return node.meta.get(_SHAPE) if isinstance(node, fx.Node) else None


def _meta_like(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def _conv_shape(m: Any, x: torch.Tensor) -> torch.Tensor:
    return m._conv_forward(x, _meta_like(m.weight), _meta_like(m.bias))


def _linear_shape(m: Any, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, cast(torch.Tensor, _meta_like(m.weight)), _meta_like(m.bias))


def _same_shape(m: Any, x: torch.Tensor) -> torch.Tensor:
    return x


#: Module type -> its output on the meta device, without swapping its tensors in and out.
_META_SHORTCUTS: dict[type, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    **dict.fromkeys((nn.Conv1d, nn.Conv2d, nn.Conv3d), _conv_shape),
    nn.Linear: _linear_shape,
    **dict.fromkeys(
        (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d,
         nn.InstanceNorm2d, nn.InstanceNorm3d, nn.PReLU),
        _same_shape,
    ),
}  # fmt: skip


class _Shapes(fx.Interpreter):
    """Runs the traced graph once, writing each tensor's shape on its node.

    With ``meta=True`` every tensor is on PyTorch's ``meta`` device (shapes, no values:
    nothing is computed); a graph that needs values (data-dependent branches in a
    module kept whole) fails there and runs for real.
    """

    def __init__(self, gm: fx.GraphModule, meta: bool) -> None:
        super().__init__(gm)
        self.on_meta = meta

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta[_SHAPE] = tuple(int(d) for d in result.shape)
        return result

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if not self.on_meta:
            return super().call_module(target, args, kwargs)
        module = self.fetch_attr(target)
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        if not tensors:  # pools, activations, dropout: nothing to put on the meta device
            return module(*args, **kwargs)
        shortcut = _META_SHORTCUTS.get(type(module))
        if shortcut is not None and not kwargs and len(args) == 1:
            return shortcut(module, args[0])
        meta = {k: torch.empty_like(v, device="meta") for k, v in tensors.items()}
        return torch.func.functional_call(module, meta, args, kwargs)

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if self.on_meta and isinstance(value, torch.Tensor):
            return torch.empty_like(value, device="meta")
        return value


def _what(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"{node.target}"
    if node.op == "call_method":
        return f".{node.target}() ({node.name})"
    name = getattr(node.target, "__name__", str(node.target))
    return f"{name} ({node.name})"


class _Walk:
    """The state of one walk over a traced graph."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule) -> None:
        self.model = model
        self.modules = dict(model.named_modules())
        self.gm_modules = dict(gm.named_modules())
        self.layouts: dict[fx.Node, _Layout | None] = {}
        self.spaces: list[_Space] = []
        self.claims: dict[tuple[str, int], list[tuple[int, int, _Space]]] = {}
        self.opaque: dict[str, str] = {}
        self.fresh: dict[tuple[fx.Node, int], _Layout] = {}
        self.names: dict[int, str] = {}
        for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
            self.names.setdefault(id(t), name)

    # -- spaces and members ------------------------------------------------------------
    def space(self, name: str, channels: int, reason: str | None = None) -> _Space:
        s = _Space(name, channels, len(self.spaces))
        self.spaces.append(s)
        if reason:
            s.reasons.append(reason)
        return s

    def key(self, module_name: str, attr: str) -> str | None:
        """The canonical name of ``<module>.<attr>`` (tied tensors: the first name), or None."""
        module = self.modules.get(module_name)
        full = f"{module_name}.{attr}" if module_name else attr
        if module is None:
            return None
        if pruning_hooks(module, attr):
            return full
        t = getattr(module, attr, None)
        if not isinstance(t, torch.Tensor):
            return None
        return self.names.get(id(t), full)

    def attr_key(self, node: fx.Node) -> str | None:
        """The canonical name of the tensor a ``get_attr`` node reads."""
        module_name, _, attr = str(node.target).rpartition(".")
        return self.key(module_name, attr)

    def union(self, a: _Space, b: _Space) -> _Space:
        ra, rb = a.root(), b.root()
        if ra is rb:
            return ra
        if ra.channels != rb.channels:
            why = f"joined with {rb.name if ra.order < rb.order else ra.name} of another width"
            self.lock(ra, why)
            self.lock(rb, why)
            return ra
        if rb.order < ra.order:
            ra, rb = rb, ra
        rb.parent = ra
        ra.slots.extend(rb.slots)
        ra.reasons.extend(rb.reasons)
        self.set_block(ra, rb.block)
        self.set_segments(ra, rb.segments)
        return ra

    def set_block(self, space: _Space, block: int) -> None:
        """Channels of `space` go in whole blocks of `block` (and of any block already set)."""
        root = space.root()
        joint = math.lcm(root.block, block)
        if root.channels % joint:
            self.lock(root, f"its GroupNorm groups ({root.block} and {block} channels) do not tile its channels")
        else:
            root.block = joint
        self._check_mix(root)

    def set_segments(self, space: _Space, segments: int) -> None:
        """`space`'s channels lie in `segments` equal parts losing as many channels each."""
        root = space.root()
        joint = math.lcm(root.segments, segments)
        if root.channels % joint:
            self.lock(root, f"its convolution groups ({root.segments} and {segments}) do not split its channels evenly")
        else:
            root.segments = joint
        self._check_mix(root)

    def _check_mix(self, root: _Space) -> None:
        if root.block > 1 and root.segments > 1:
            self.lock(root, "they pass through both a GroupNorm and a grouped convolution")

    def claim(self, space: _Space, slot: Slot) -> None:
        """Make `slot` a member of `space`; the same entries claimed twice join the groups."""
        root = space.root()
        entries = self.claims.setdefault((slot.param, slot.axis), [])
        for offset, width, other in entries:
            if offset == slot.offset and width == root.channels:
                self.union(other, root)
                return
            if offset < slot.offset + root.channels and slot.offset < offset + width:
                why = f"{slot.param} holds them at overlapping offsets"
                self.lock(other, why)
                self.lock(root, why)
        entries.append((slot.offset, root.channels, root))
        root.slots.append(slot)

    def claim_layout(self, layout: _Layout, param: str | None, axis: int, weight: bool) -> None:
        if param is None:
            return
        offset = 0
        for s in layout.spaces:
            self.claim(s, Slot(param, axis, offset, weight))
            offset += s.root().channels

    # -- leaving -------------------------------------------------------------------------
    def lock(self, space: _Space, reason: str) -> None:
        space.root().reasons.append(reason)

    def lock_value(self, node: Any, reason: str) -> None:
        if not isinstance(node, fx.Node):
            return
        layout = self.layouts.get(node)
        if layout is not None:
            for s in layout.spaces:
                self.lock(s, reason)
        if node.op == "get_attr":
            key = self.attr_key(node)
            if key is not None:
                self.opaque.setdefault(key, reason)

    def refuse(self, node: fx.Node, reason: str) -> None:
        """Leave every group reaching `node`, and every tensor it reads, with `reason`."""
        for a in node.all_input_nodes:
            self.lock_value(a, reason)

    # -- reading nodes -------------------------------------------------------------------
    def layout(self, node: Any) -> _Layout | None:
        return self.layouts.get(node) if isinstance(node, fx.Node) else None

    def untracked(self, value: Any, width: int, axis: int) -> _Layout:
        """A left group for channels that are not followed (the model's input, say), so that
        the tensors reading them are never sliced along them."""
        if isinstance(value, fx.Node) and (value, axis) in self.fresh:
            return self.fresh[value, axis]
        if isinstance(value, fx.Node) and value.op == "placeholder":
            name, reason = value.name, "they are an input of the model"
        else:
            name = value.name if isinstance(value, fx.Node) else "?"
            reason = f"they come from {name}, which is not followed"
        layout = _Layout(axis, (self.space(name, width, reason),))
        if isinstance(value, fx.Node):
            self.fresh[value, axis] = layout
        return layout

    def at_axis(self, node: fx.Node, value: Any, axis: int, why: str) -> _Layout | None:
        """The layout of `value` if it holds its channels on `axis` (else leave it)."""
        layout = self.layout(value)
        if layout is None:
            return None
        shape = _shape(value)
        if shape is not None and axis < 0:
            axis += len(shape)
        if layout.axis != axis:
            self.lock_value(value, f"{_what(node)} {why}")
            return None
        return layout


Rule = Callable[[_Walk, fx.Node], "_Layout | None"]


def _first(node: fx.Node) -> Any:
    return node.args[0] if node.args else next(iter(node.kwargs.values()), None)
