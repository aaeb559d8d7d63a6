"""Channel groups of a torch module, read from a ``torch.fx`` trace.

A *group* is a set of channels that must go together: the output channels of one or more
producers (``Conv*d``, ``ConvTranspose*d``, ``Linear``), everything that carries them
channel by channel (biases, norm scales, shifts and running statistics, a depthwise
convolution's filters, a parameter added to them) and the input columns of every
consumer. Element-wise operations, activations, pools and flattening after a global pool
carry a group on; a ``GroupNorm`` makes its groups of channels go whole; a residual
``Add``/``Mul`` joins the groups of its operands into one (a
ResNet stage's trunk is one group); ``torch.cat`` along the channels lays several groups
side by side (each consumer's columns are members at an offset).

Why ``torch.fx`` and not ``torch.export``: ``symbolic_trace`` keeps every ``nn.Module``
call as one node naming the module object by its qualified name, which is what shrinking
slices (the same modules, the same state-dict keys); ``torch.export`` lowers modules to
ATen operators on lifted parameters, and mapping those back to modules and attributes
needs its metadata. ``symbolic_trace`` also needs no compilation (milliseconds for a
ResNet), and a module it cannot trace through (data-dependent control flow) is kept as
one leaf, whose channels are left with that reason. The example inputs give the shapes the rules
need: the graph runs once on PyTorch's ``meta`` device (shapes without values), or for
real where something needs values, without gradients and in evaluation mode (restored
after).

Every operation is looked up in two tables, :data:`MODULE_RULES` (module type, searched
along the type's MRO) and :data:`FUNCTION_RULES` (a function, or a method's name); an
operation with no row *leaves* the groups that reach it, with a one-line reason.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import fx, nn

from ._base import pruning_hooks

__all__ = ["Slot", "TorchGroup", "channel_groups", "MODULE_RULES", "FUNCTION_RULES"]


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
    """

    param: str
    axis: int
    offset: int = 0
    weight: bool = True


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
    """

    name: str
    channels: int
    members: tuple[Slot, ...]
    reason: str | None = None
    block: int = 1

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
        return ra

    def set_block(self, space: _Space, block: int) -> None:
        """Channels of `space` go in whole blocks of `block` (and of any block already set)."""
        root = space.root()
        joint = math.lcm(root.block, block)
        if root.channels % joint:
            self.lock(root, f"its GroupNorm groups ({root.block} and {block} channels) do not tile its channels")
        else:
            root.block = joint

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


# ---------------------------------------------------------------------------------------
# module rules
# ---------------------------------------------------------------------------------------


def _conv(walk: _Walk, node: fx.Node) -> _Layout | None:
    name = str(node.target)
    m: Any = walk.gm_modules[name]
    x = _first(node)
    out_axis, in_axis = (1, 0) if m.transposed else (0, 1)
    weight, bias = walk.key(name, "weight"), walk.key(name, "bias") if m.bias is not None else None
    inp = walk.at_axis(node, x, 1, "reads channels on axis 1")
    if m.groups == 1:
        walk.claim_layout(inp or walk.untracked(x, m.in_channels, 1), weight, in_axis, True)
        out = walk.space(name, m.out_channels)
    elif not m.transposed and m.groups == m.in_channels == m.out_channels:
        # depthwise: each channel is filtered by itself, so the group runs through
        inp = inp or walk.untracked(x, m.in_channels, 1)
        walk.claim_layout(inp, weight, 0, True)
        if bias is not None:
            walk.claim_layout(inp, bias, 0, False)
        return _Layout(1, inp.spaces)
    else:
        reason = f"{name} is a grouped convolution (groups={m.groups}): its channels go in blocks"
        walk.lock_value(x, reason)
        out = walk.space(name, m.out_channels, reason)
    if weight is not None:
        walk.claim(out, Slot(weight, out_axis, 0, True))
    if bias is not None:
        walk.claim(out, Slot(bias, 0, 0, False))
    return _Layout(1, (out,))


def _linear(walk: _Walk, node: fx.Node) -> _Layout | None:
    name = str(node.target)
    m: Any = walk.gm_modules[name]
    x = _first(node)
    inp = walk.at_axis(node, x, -1, "reads features on the last axis")
    weight, bias = walk.key(name, "weight"), walk.key(name, "bias") if m.bias is not None else None
    walk.claim_layout(inp or walk.untracked(x, m.in_features, 1), weight, 1, True)
    out = walk.space(name, m.out_features)
    if weight is not None:
        walk.claim(out, Slot(weight, 0, 0, True))
    if bias is not None:
        walk.claim(out, Slot(bias, 0, 0, False))
    shape = _shape(node)
    return _Layout(len(shape) - 1 if shape else 0, (out,))


def _per_channel(walk: _Walk, node: fx.Node, names: Sequence[str]) -> _Layout | None:
    """A module scaling or shifting each channel on axis 1 by its own tensors."""
    name = str(node.target)
    m = walk.gm_modules[name]
    inp = walk.at_axis(node, _first(node), 1, "normalizes channels on axis 1")
    if inp is None:
        return None
    for attr in names:
        if isinstance(getattr(m, attr, None), torch.Tensor):
            walk.claim_layout(inp, walk.key(name, attr), 0, False)
    return inp


def _batch_norm(walk: _Walk, node: fx.Node) -> _Layout | None:
    return _per_channel(walk, node, ("weight", "bias", "running_mean", "running_var"))


def _group_norm(walk: _Walk, node: fx.Node) -> _Layout | None:
    """GroupNorm: each of its groups is normalized alone, so whole groups can go."""
    m: Any = walk.gm_modules[str(node.target)]
    block = m.num_channels // m.num_groups
    inp = walk.layout(_first(node))
    if inp is not None and block > 1:
        if any(w % block for w in inp.widths()):
            walk.refuse(node, f"{node.target} (GroupNorm) normalizes groups of {block} channels across its inputs")
            return None
        for s in inp.spaces:
            walk.set_block(s, block)
    return _per_channel(walk, node, ("weight", "bias"))


def _layer_norm(walk: _Walk, node: fx.Node) -> _Layout | None:
    m: Any = walk.gm_modules[str(node.target)]
    x = _first(node)
    layout, shape = walk.layout(x), _shape(x)
    if layout is None or shape is None:
        return None
    if layout.axis < len(shape) - len(m.normalized_shape):
        return layout  # it normalizes other axes: channel by channel
    walk.refuse(node, f"{node.target} (LayerNorm) normalizes over the channels: removing some changes the others")
    return None


def _prelu(walk: _Walk, node: fx.Node) -> _Layout | None:
    m: Any = walk.gm_modules[str(node.target)]
    if m.num_parameters == 1:
        return walk.layout(_first(node))
    return _per_channel(walk, node, ("weight",))


def _same(walk: _Walk, node: fx.Node) -> _Layout | None:
    """An operation that keeps every channel where it is (element-wise, dropout)."""
    return walk.layout(_first(node))


def _spatial(walk: _Walk, node: fx.Node) -> _Layout | None:
    """Pools, resizing and padding: they work on the axes after the channels (axis 1)."""
    x = _first(node)
    inp, shape, out = walk.layout(x), _shape(x), _shape(node)
    if inp is None:
        return None
    if shape is None or out is None or len(shape) != len(out) or shape[: inp.axis + 1] != out[: inp.axis + 1]:
        walk.refuse(node, f"{_what(node)} changes the axes that hold the channels")
        return None
    return inp


def _softmax(walk: _Walk, node: fx.Node) -> _Layout | None:
    x = _first(node)
    inp, shape = walk.layout(x), _shape(x)
    if node.op == "call_module":
        dim = getattr(walk.gm_modules[str(node.target)], "dim", None)
    else:
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if inp is None or shape is None:
        return None
    if not isinstance(dim, int) or dim % len(shape) == inp.axis:
        walk.refuse(node, f"{_what(node)} normalizes over the channels")
        return None
    return inp


def _attention(walk: _Walk, node: fx.Node) -> _Layout | None:
    """``nn.MultiheadAttention``: its heads and width stay (one group, left, says why)."""
    name = str(node.target)
    m: Any = walk.gm_modules[name]
    reason = (
        f"{name} (nn.MultiheadAttention) derives its head size from embed_dim={m.embed_dim}: "
        f"its {m.num_heads} heads and its width stay"
    )
    walk.refuse(node, reason)
    heads = walk.space(name, m.embed_dim, reason)
    for attr, axis in (("in_proj_weight", 1), ("q_proj_weight", 1)):
        if isinstance(getattr(m, attr, None), torch.Tensor):
            walk.claim(heads, Slot(str(walk.key(name, attr)), axis))
    walk.claim(heads, Slot(str(walk.key(f"{name}.out_proj", "weight")), 0))
    return None


def _flatten_module(walk: _Walk, node: fx.Node) -> _Layout | None:
    return _regroup(walk, node, literal=())


MODULE_RULES: dict[type, Rule] = {
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.Conv3d: _conv,
    nn.ConvTranspose1d: _conv,
    nn.ConvTranspose2d: _conv,
    nn.ConvTranspose3d: _conv,
    nn.Linear: _linear,
    nn.modules.batchnorm._BatchNorm: _batch_norm,
    nn.modules.instancenorm._InstanceNorm: _batch_norm,
    nn.GroupNorm: _group_norm,
    nn.LayerNorm: _layer_norm,
    nn.PReLU: _prelu,
    nn.MultiheadAttention: _attention,
    nn.Flatten: _flatten_module,
    nn.Softmax: _softmax,
    nn.LogSoftmax: _softmax,
    **dict.fromkeys(
        (
            nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
            nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Softplus,
            nn.Softsign, nn.Tanhshrink, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
            nn.Dropout3d, nn.AlphaDropout,
        ),
        _same,
    ),
    **dict.fromkeys(
        (
            nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
            nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d,
            nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.LPPool1d, nn.LPPool2d, nn.Upsample,
            nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
            nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReplicationPad1d, nn.ReplicationPad2d,
            nn.ConstantPad1d, nn.ConstantPad2d,
        ),
        _spatial,
    ),
}  # fmt: skip
"""Module type -> rule; a subclass uses its closest ancestor's row."""


# ---------------------------------------------------------------------------------------
# function and method rules
# ---------------------------------------------------------------------------------------


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if _shape(a) is not None]


def _elementwise(walk: _Walk, node: fx.Node) -> _Layout | None:
    """Element-wise on broadcast operands: tracked operands on one axis join their groups."""
    out = _shape(node)
    inputs = _tensor_inputs(node)
    if out is None:
        walk.refuse(node, f"{_what(node)} does not return one tensor")
        return None
    tracked: list[tuple[fx.Node, _Layout, int]] = []
    others: list[tuple[fx.Node, tuple[int, ...]]] = []
    for a in inputs:
        shape = _shape(a)
        if shape is None:
            walk.refuse(node, f"{_what(node)} reads an input of unknown shape")
            return None
        layout = walk.layout(a)
        shift = len(out) - len(shape)
        if layout is None:
            others.append((a, shape))
        elif shift < 0 or shape[layout.axis] != out[layout.axis + shift]:
            walk.lock_value(a, f"{_what(node)} broadcasts them")
        else:
            tracked.append((a, layout, layout.axis + shift))
    if not tracked:
        return None
    axis, first = tracked[0][2], tracked[0][1]
    if any(ax != axis or layout.widths() != first.widths() for _, layout, ax in tracked):
        walk.refuse(node, f"{_what(node)} combines channels laid out differently")
        return None
    for _, layout, _ in tracked[1:]:
        for s, t in zip(first.spaces, layout.spaces, strict=True):
            walk.union(s, t)
    for a, shape in others:
        i = axis - (len(out) - len(shape))
        if i < 0 or shape[i] == 1:
            continue  # the same value for every channel
        key = walk.attr_key(a) if a.op == "get_attr" else None
        if key is None:
            walk.refuse(node, f"{_what(node)} combines them with a tensor that is not followed")
            return None
        walk.claim_layout(first, key, i, False)
    return _Layout(axis, first.spaces)


def _literal_sizes(node: fx.Node) -> tuple[Any, ...]:
    """The target shape of ``reshape``/``view`` as written (ints, or nodes computed in the trace)."""
    args = node.args[1:]  # torch.reshape(x, shape) and x.reshape(*shape) alike
    if "shape" in node.kwargs:
        args = (node.kwargs["shape"],)
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _regroup(walk: _Walk, node: fx.Node, literal: tuple[Any, ...] | None = None) -> _Layout | None:
    """Reshapes (flatten, view, squeeze, ...): the channel axis survives if the sizes before it do."""
    x = _first(node)
    inp, shape, out = walk.layout(x), _shape(x), _shape(node)
    if inp is None:
        return None
    if shape is None or out is None:
        walk.refuse(node, f"{_what(node)} reshapes them")
        return None
    before = math.prod(shape[: inp.axis])
    width = shape[inp.axis]
    for j in range(len(out)):
        if math.prod(out[:j]) == before and out[j] == width:
            sizes = _literal_sizes(node) if literal is None else literal
            if j < len(sizes) and isinstance(sizes[j], int) and sizes[j] != -1 and width > 1:
                walk.refuse(node, f"{_what(node)} names their count as the constant {sizes[j]}")
                return None
            return _Layout(j, inp.spaces)
    walk.refuse(node, f"{_what(node)} merges or splits the channel axis")
    return None


def _flatten(walk: _Walk, node: fx.Node) -> _Layout | None:
    return _regroup(walk, node, literal=())


def _reshape(walk: _Walk, node: fx.Node) -> _Layout | None:
    return _regroup(walk, node)


def _dims_arg(node: fx.Node) -> list[int]:
    if node.op == "call_method":
        args = node.args[1:]
    else:
        args = node.args[1:] if len(node.args) > 1 else (node.kwargs.get("dims", ()),)
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return [int(cast(int, a)) for a in args]


def _permute(walk: _Walk, node: fx.Node) -> _Layout | None:
    x = _first(node)
    inp, shape = walk.layout(x), _shape(x)
    if inp is None or shape is None:
        return None
    dims = [d % len(shape) for d in _dims_arg(node)]
    return _Layout(dims.index(inp.axis), inp.spaces)


def _transpose(walk: _Walk, node: fx.Node) -> _Layout | None:
    x = _first(node)
    inp, shape = walk.layout(x), _shape(x)
    if inp is None or shape is None:
        return None
    d0, d1 = (int(cast(int, d)) % len(shape) for d in node.args[1:3])
    axis = d1 if inp.axis == d0 else d0 if inp.axis == d1 else inp.axis
    return _Layout(axis, inp.spaces)


def _cat(walk: _Walk, node: fx.Node) -> _Layout | None:
    parts = node.args[0] if node.args else node.kwargs.get("tensors", ())
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    out = _shape(node)
    if out is None or not isinstance(parts, (list, tuple)) or not isinstance(dim, int):
        walk.refuse(node, f"{_what(node)} is not followed")
        return None
    dim %= len(out)
    layouts = [walk.layout(p) for p in parts]
    if any(layout is not None and layout.axis != dim for layout in layouts):
        # joined along another axis: every part must hold the same channels
        if all(layout is not None for layout in layouts):
            return _elementwise(walk, node)
        walk.refuse(node, f"{_what(node)} joins them to tensors that are not followed")
        return None
    if all(layout is None for layout in layouts):
        return None
    spaces: list[_Space] = []
    for p, layout in zip(parts, layouts, strict=True):
        if layout is not None:
            spaces.extend(layout.spaces)
        else:
            shape = _shape(p)
            width = shape[dim] if shape is not None else 0
            spaces.append(walk.space(node.name, width, f"{_what(node)} joins them to channels that are not followed"))
    return _Layout(dim, tuple(spaces))


def _reduce(walk: _Walk, node: fx.Node) -> _Layout | None:
    x = _first(node)
    inp, shape, out = walk.layout(x), _shape(x), _shape(node)
    if inp is None:
        return None
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if shape is None or out is None or dim is None:
        walk.refuse(node, f"{_what(node)} reduces over the channels")
        return None
    dims = {int(d) % len(shape) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    if inp.axis in dims:
        walk.refuse(node, f"{_what(node)} reduces over the channels")
        return None
    if len(out) == len(shape):
        return inp
    return _Layout(inp.axis - sum(d < inp.axis for d in dims), inp.spaces)


def _getitem(walk: _Walk, node: fx.Node) -> _Layout | None:
    x, index = node.args[0], node.args[1]
    inp, shape, out = walk.layout(x), _shape(x), _shape(node)
    if inp is None:
        return None
    if shape is None or out is None:
        walk.refuse(node, f"{_what(node)} indexes them")
        return None
    items = index if isinstance(index, tuple) else (index,)
    explicit = sum(1 for i in items if i is not None and i is not Ellipsis)
    expanded: list[Any] = []
    for i in items:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - explicit))
        else:
            expanded.append(i)
    src = dst = 0
    for i in expanded:
        if i is None:
            dst += 1
            continue
        if src == inp.axis:
            if i == slice(None):
                return _Layout(dst, inp.spaces)
            break
        if isinstance(i, int):
            src += 1
        elif isinstance(i, slice):
            src, dst = src + 1, dst + 1
        else:
            break
    else:
        if src <= inp.axis:
            return _Layout(dst + inp.axis - src, inp.spaces)
    walk.refuse(node, f"{_what(node)} indexes the channels")
    return None


def _metadata(walk: _Walk, node: fx.Node) -> _Layout | None:
    """Reads shapes or checks, never values: nothing to follow, nothing to leave."""
    return None


_UNARY = (
    torch.relu, F.relu, F.relu6, F.gelu, F.silu, F.mish, F.hardswish, F.hardsigmoid, F.leaky_relu,
    F.elu, F.selu, F.celu, F.softplus, F.hardtanh, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d,
    F.alpha_dropout, torch.sigmoid, torch.tanh, torch.exp, torch.abs, torch.neg, torch.sqrt, torch.rsqrt,
    torch.clamp, torch.clip, torch.square, F.sigmoid, F.tanh, torch.nn.functional.relu_,
)
_BINARY = (
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.iadd, operator.imul,
    torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum, torch.where,
)
_METHOD_ELEMENTWISE = (
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "add", "add_", "sub", "sub_", "mul", "mul_", "div",
    "div_", "clamp", "clamp_", "clip", "exp", "abs", "neg", "sqrt", "contiguous", "clone", "float", "double",
    "half", "to", "type_as", "detach", "square", "__add__", "__mul__", "__radd__", "__rmul__",
)
_SPATIAL = (
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d, F.adaptive_avg_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d,
    F.adaptive_max_pool3d, F.interpolate, F.upsample, F.pad, F.lp_pool2d,
)

FUNCTION_RULES: dict[Any, Rule] = {
    **dict.fromkeys((*_UNARY, *_BINARY, *_METHOD_ELEMENTWISE), _elementwise),
    **dict.fromkeys(_SPATIAL, _spatial),
    **dict.fromkeys((torch.flatten, "flatten", "squeeze", "unsqueeze", torch.squeeze, torch.unsqueeze), _flatten),
    **dict.fromkeys((torch.reshape, "reshape", "view"), _reshape),
    **dict.fromkeys((torch.permute, "permute"), _permute),
    **dict.fromkeys((torch.transpose, "transpose", torch.swapaxes, "swapaxes"), _transpose),
    **dict.fromkeys((torch.cat, torch.concat, torch.concatenate), _cat),
    **dict.fromkeys((torch.mean, "mean", torch.sum, "sum", torch.amax, "amax", torch.amin, "amin"), _reduce),
    **dict.fromkeys((F.softmax, "softmax", torch.softmax, F.log_softmax, "log_softmax"), _softmax),
    operator.getitem: _getitem,
    **dict.fromkeys((getattr, "size", "dim", "numel", torch._assert, len), _metadata),
}  # fmt: skip
"""Function (``call_function``) or method name (``call_method``) -> rule."""


# ---------------------------------------------------------------------------------------
# tracing
# ---------------------------------------------------------------------------------------


class _Tracer(fx.Tracer):
    """``torch.fx``'s tracer; a module it cannot trace through, or one named a leaf, stays whole."""

    def __init__(self, leaves: tuple[Any, ...], tried: dict[int, bool] | None = None) -> None:
        super().__init__()
        self.leaves = leaves
        self.untraceable: dict[int, str] = {}
        self._tried: dict[int, bool] = {} if tried is None else tried  # shared with the trial tracers

    def named_leaf(self, m: nn.Module) -> bool:
        """Whether `m` is one of the modules or types the caller keeps whole."""
        return any(m is leaf or (isinstance(leaf, type) and isinstance(m, leaf)) for leaf in self.leaves)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.named_leaf(m):
            return True
        if super().is_leaf_module(m, module_qualified_name):
            return True
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return False
        if id(m) not in self._tried:
            try:
                _Tracer(self.leaves, self._tried).trace(m)
                self._tried[id(m)] = False
            except Exception as e:  # any failure of fx inside the module: keep it whole
                self._tried[id(m)] = True
                self.untraceable[id(m)] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return self._tried[id(m)]


def _rule(node: fx.Node, module: nn.Module | None) -> Rule | None:
    if node.op == "call_module":
        for cls in type(module).__mro__:
            if cls in MODULE_RULES:
                return MODULE_RULES[cls]
        return None
    try:
        return FUNCTION_RULES.get(node.target)
    except TypeError:  # an unhashable target
        return None


def _as_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError(
            f"example_inputs must be a tensor or a tuple of tensors, got {type(example_inputs).__name__}"
        )
    return tuple(inputs)


def trace(model: nn.Module, example_inputs: Any, leaf_modules: Iterable[Any] = ()) -> tuple[fx.GraphModule, _Tracer]:
    """The model's ``torch.fx`` graph, with the shapes of `example_inputs` on its nodes."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _as_tuple(example_inputs)
    tracer = _Tracer(tuple(leaf_modules))
    try:
        graph = tracer.trace(model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"torch.fx cannot trace {type(model).__name__}: {first}") from None
    gm = fx.GraphModule(model, graph)
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            try:  # shapes without computing
                _Shapes(gm, meta=True).run(*[torch.empty_like(t, device="meta") for t in inputs])
            except Exception:  # something needs values: run it for real
                _Shapes(gm, meta=False).run(*inputs)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"{type(model).__name__} does not run on example_inputs: {first}") from None
    finally:
        for m, mode in modes.items():
            m.training = mode
    return gm, tracer


def channel_groups(model: nn.Module, example_inputs: Any, *, leaf_modules: Iterable[Any] = ()) -> list[TorchGroup]:
    """The channel groups of `model`, those that can shrink and those left with their reason.

    Parameters
    ----------
    model : torch.nn.Module
        The model; traced with ``torch.fx`` (see the module's docstring), not modified.
    example_inputs : tensor or tuple of tensors
        Inputs the model runs on once (without gradients, in evaluation mode), for shapes.
    leaf_modules : iterable of modules or module types, optional
        Modules kept whole: the channels reaching them are left. Modules ``torch.fx``
        cannot trace through are kept whole anyway.

    Returns
    -------
    list of TorchGroup
        In the order of their first producer in the graph.

    Raises
    ------
    TypeError
        If `model` is not a module or `example_inputs` not tensors.
    RuntimeError
        If ``torch.fx`` cannot trace the model or it does not run on the inputs.
    """
    gm, tracer = trace(model, example_inputs, leaf_modules)
    walk = _Walk(model, gm)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            walk.layouts[node] = None
            continue
        if node.op == "output":
            for a in node.all_input_nodes:
                walk.lock_value(a, "they are an output of the model")
            continue
        module = walk.gm_modules.get(str(node.target)) if node.op == "call_module" else None
        named = module is not None and tracer.named_leaf(module)
        rule = None if named else _rule(node, module)
        if rule is None:
            if module is not None:
                cause = tracer.untraceable.get(id(module))
                how = f"torch.fx cannot trace into it ({cause})" if cause else "shrinking does not know this module"
                how = "it is one of leaf_modules" if named else how
                walk.refuse(node, f"they reach {node.target} ({type(module).__name__}): {how}")
                for key, t in module.named_parameters():
                    walk.opaque.setdefault(walk.names.get(id(t), f"{node.target}.{key}"), f"{node.target} uses it")
            else:
                walk.refuse(node, f"they reach {_what(node)}, which shrinking does not follow")
            walk.layouts[node] = None
            continue
        walk.layouts[node] = rule(walk, node)
    if walk.opaque:
        for s in walk.spaces:
            root = s.root()
            for slot in root.slots:
                if slot.param in walk.opaque:
                    walk.lock(root, f"{slot.param} is also read where it is not followed ({walk.opaque[slot.param]})")
    out: list[TorchGroup] = []
    seen: set[int] = set()
    for s in walk.spaces:
        root = s.root()
        if id(root) in seen or not root.slots:
            continue
        seen.add(id(root))
        slots = tuple(dict.fromkeys(root.slots))
        reason = root.reasons[0] if root.reasons else None
        if reason is None and not any(slot.weight for slot in slots):
            reason = "no layer weight holds them"
        out.append(TorchGroup(root.name, root.channels, slots, reason, root.block))
    return out
