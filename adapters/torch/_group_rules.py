"""The rules of channel groups in a ``torch.fx`` graph: one row per module type
(:data:`MODULE_RULES`) and per function or method name (:data:`FUNCTION_RULES`), each a
function moving the groups of its inputs through one node (or leaving them, with the
reason). Read by :func:`arrayprune.adapters.torch._groups.channel_groups`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import fx, nn

from ._group_walk import Rule, Slot, _first, _Layout, _shape, _Space, _Walk, _what

__all__ = ["FUNCTION_RULES", "MODULE_RULES"]


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
    elif not m.transposed:
        # grouped: output block j reads input block j only; each block keeps its size
        inp = inp or walk.untracked(x, m.in_channels, 1)
        if len(inp.spaces) > 1:
            walk.lock_value(x, f"{name} is a grouped convolution (groups={m.groups}) reading a concatenation")
        else:
            walk.set_segments(inp.spaces[0], m.groups)
        if weight is not None and len(inp.spaces) == 1:
            walk.claim(inp.spaces[0], Slot(weight, 1, 0, True, m.groups))
        out = walk.space(name, m.out_channels)
        walk.set_segments(out, m.groups)
    else:
        reason = f"{name} is a transposed grouped convolution (groups={m.groups}): its channels go in blocks"
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
