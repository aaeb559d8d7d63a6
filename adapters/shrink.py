"""Structured pruning that shrinks the model: the chosen channels are removed, not zeroed.

Two entries:

* :func:`shrink_onnx`: an ``onnx.ModelProto`` in, a smaller one out. Its channel groups
  come from the graph (:func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups`);
  each loses ``amount`` of its channels, chosen by a structured method over all its
  weight members (:mod:`arrayprune.groups`); every member initializer is sliced (names
  kept), the shapes of the activations in between and the ``group`` of depthwise
  convolutions follow. The result computes what the dense model computes with those
  channels zeroed. With a calibrated structured method and ``hessians``, each group is
  scored by the layers reading its channels (:func:`consumers`), which are refit.
* :func:`shrink_arrays`: the same on a plain mapping of arrays, with the groups given.

Examples
--------
A two-layer MLP as a state dict (PyTorch layout, ``Linear`` weights ``[out, in]``): the
hidden channels are the first layer's rows, its bias and the second layer's columns.

>>> import numpy as np
>>> from arrayprune.groups import ChannelGroup
>>> from arrayprune.adapters.shrink import shrink_arrays
>>> rng = np.random.default_rng(0)
>>> sd = {"fc1.weight": rng.standard_normal((8, 4)), "fc1.bias": np.zeros(8),
...       "fc2.weight": rng.standard_normal((3, 8)), "fc2.bias": np.zeros(3)}
>>> hidden = ChannelGroup([("fc1.weight", 0), ("fc1.bias", 0, False), ("fc2.weight", 1)], 8, "hidden")
>>> small, kept = shrink_arrays(sd, [hidden], amount=0.5)
>>> small["fc1.weight"].shape, small["fc2.weight"].shape, small["fc2.bias"] is sd["fc2.bias"]
((4, 4), (3, 4), True)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import array_api_compat as apc
import numpy as np

from arrayprune import amount as _amount
from arrayprune.groups import (
    ChannelGroup,
    Shrunk,
    choose_channels,
    choose_channels_global,
    group_scores,
    resolve_method,
    take_channels,
    unit_method,
)
from arrayprune.registry import METHODS

from .plan import stream_seed
from .roles.onnx_graph import _onnx
from .roles.onnx_group_types import check_rounding, even_drop
from .roles.onnx_groups import KINDS, OnnxGroups, View, onnx_groups
from .shrink_consumers import Consumer, calibrated_scores, check_hessians, consumers, refits
from .trees import _rebuild

__all__ = ["Consumer", "ShrinkReport", "consumers", "shrink_onnx", "shrink_arrays", "zeroed_onnx", "source_names"]


@dataclass(frozen=True)
class ShrinkReport:
    """What :func:`shrink_onnx` did.

    Attributes
    ----------
    groups : OnnxGroups
        The groups found and the producers left, with reasons.
    kept : dict of str to list of int
        Per group name, the channels kept (ascending).
    params_before, params_after : int
        Entries of all initializers of the main graph, before and after.
    changed : tuple of str
        The initializers whose data changed, or that were added (private copies of
        shared initializers, under the member's key).
    removed : tuple of str
        The initializers and ``Identity``/``Constant`` outputs no longer read, removed.
    refit : dict of str to ndarray
        With a calibrated method and ``compensate``: each consumer weight that lost input
        channels, refit, in its dense layout and dtype (the dropped channels zero);
        :func:`zeroed_onnx` puts them in the dense model.
    """

    groups: OnnxGroups
    kept: dict
    params_before: int
    params_after: int
    changed: tuple = ()
    removed: tuple = ()
    refit: dict = field(default_factory=dict)


def _per_group_methods(groups: Sequence[ChannelGroup], method: Any, method_args: dict) -> list[Any]:
    """One method per group: a seeded random method gets each group its own stream."""
    if isinstance(method, str) and "seed" in method_args and method_args["seed"] is not None:
        return [
            resolve_method(method, **{**method_args, "seed": stream_seed(method_args["seed"], g.name)})
            for g in groups
        ]
    m = resolve_method(method, **method_args)
    return [m] * len(groups)


def shrink_arrays(
    params: Mapping,
    groups: Sequence[ChannelGroup],
    amount: int | float,
    method: Any = "ln_structured",
    *,
    importance_scores: Mapping | None = None,
    global_: bool = False,
    segments: Sequence[int] | None = None,
    rounding: str = "nearest",
    **method_args: Any,
) -> Shrunk:
    """Remove ``amount`` of the channels of every group from a mapping of arrays.

    Parameters
    ----------
    params : mapping
        Name -> array (a state dict, the arrays of an ``.npz`` or ``.safetensors``
        file), any Array API library; not modified.
    groups : sequence of ChannelGroup
        Which tensors lose the same channels, along which axes (see
        :class:`arrayprune.groups.ChannelGroup`).
    amount : int or float
        A fraction in ``[0, 1]`` of each group's channels, or a count per group.
    method : str or method object, default "ln_structured"
        A structured method that removes whole channels (``ln_structured`` with ``n``,
        default 2; ``random_structured`` with ``seed``), or a method object with
        ``channel_scores``. With a name and a ``seed``, each group draws from its own
        stream (the seed mixed with the group's name, as the CLI mixes it with tensor
        names).
    importance_scores : mapping, optional
        Name -> array scored instead of a weight member's values.
    global_ : bool, default False
        Rank the channels of all groups together: ``amount`` of all channels go,
        groups lose different counts, each keeps at least its best channel
        (:func:`arrayprune.groups.choose_channels_global`).
    segments : sequence of int, optional
        Per group, the equal consecutive parts its channels lie in (the groups of a
        grouped convolution): every part loses as many channels, its lowest scores,
        and the count must split evenly. Not with `global_`.
    rounding : {"nearest", "keep_floor"}, default "nearest"
        How a fraction becomes each group's count: ``round(amount * channels)``
        removed (PyTorch's rule), or ``int((1 - amount) * channels)`` kept
        (Torch-Pruning's rule); per part with `segments`. Not with `global_`.
    **method_args
        Constructor arguments of a method given by name.

    Returns
    -------
    Shrunk
        ``(params, kept)``: a new mapping (the type of `params` where it can be
        built from a dict; untouched entries shared) and the kept indices per group.

    Raises
    ------
    KeyError, ValueError, TypeError
        As :func:`arrayprune.groups.shrink`; before anything is sliced.
    """
    _amount.validate_pruning_amount_init(amount)
    check_rounding(rounding)
    if global_ and rounding != "nearest":
        raise ValueError("rounding applies to each group's count; a global ranking counts all channels at once")
    methods = _per_group_methods(groups, method, dict(method_args))
    parts = list(segments) if segments is not None else [1] * len(groups)
    if len(parts) != len(groups):
        raise ValueError(f"segments has {len(parts)} entries for {len(groups)} groups")
    if global_ and any(p > 1 for p in parts):
        raise ValueError("a global ranking cannot keep the groups of a grouped convolution even; rank per group")
    if not global_:
        for g, p in zip(groups, parts, strict=True):
            _amount.validate_pruning_amount(even_drop(amount, g.channels, p, str(g.name), rounding), g.channels)
    scores = [
        group_scores(params, g, m, importance_scores=importance_scores) for g, m in zip(groups, methods, strict=True)
    ]
    if global_:
        kept = choose_channels_global(scores, amount) if groups else []
    else:
        kept = [_choose(s, amount, g, p, rounding) for s, g, p in zip(scores, groups, parts, strict=True)]
    out = take_channels(params, groups, kept)
    return Shrunk(_rebuild(params, out.items()), kept)


def _check_method(method: Any, method_args: dict) -> None:
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {sorted(METHODS)}")
    resolve_method(method, **method_args)


def _choose(scores: Any, amount: int | float, group: ChannelGroup, segments: int, rounding: str) -> Any:
    """:func:`choose_channels`, the same count from each of `segments` equal parts."""
    count = even_drop(amount, group.channels, segments, str(group.name), rounding)
    if segments == 1:
        return choose_channels(scores, count)
    xp = apc.array_namespace(scores)
    width = group.channels // segments
    kept = [choose_channels(scores[j * width : (j + 1) * width], count // segments) + j * width
            for j in range(segments)]  # fmt: skip
    return xp.concat(kept)


def shrink_onnx(
    model: Any,
    amount: int | float,
    method: Any = "ln_structured",
    *,
    global_: bool = False,
    kind: str = "channels",
    rounding: str = "nearest",
    hessians: Mapping[str, Any] | None = None,
    **method_args: Any,
) -> tuple[Any, ShrinkReport]:
    """A smaller ONNX model: ``amount`` of the channels of every group removed.

    Parameters
    ----------
    model : onnx.ModelProto
        The dense model, with its initializers' data loaded; not modified.
    amount : int or float
        A fraction in ``[0, 1]`` of each group's channels, or a count per group. At
        least one channel of every group stays. The channels of a group that meets a
        GroupNorm are its norm groups (:attr:`OnnxGroup.per` layer channels each).
    method : str or method object, default "ln_structured"
        See :func:`shrink_arrays` (``n=1`` for L1, ``seed=...`` for random).
    global_ : bool, default False
        `amount` of all the groups' channels, ranked across groups (different counts
        per group, each keeps at least one; see :func:`shrink_arrays`).
    kind : {"channels", "heads"}, default "channels"
        What goes: layer channels (groups joined through residual connections), or
        whole attention heads (``amount`` of each attention block's heads, also of a
        fused QKV projection cut by a ``Split``, as GPT-2's ``c_attn``; see
        :func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups`).
    rounding : {"nearest", "keep_floor"}, default "nearest"
        How a fraction becomes each group's count (see :func:`shrink_arrays`):
        ``"keep_floor"`` keeps ``int((1 - amount) * channels)``, as Torch-Pruning does.
    hessians : mapping of str to ndarray, optional
        With a calibrated structured method (``"activation_structured"``,
        ``"obs_structured"``, any :class:`arrayprune.UnitPruningMethod`), and only with
        one: the weight name of every layer that reads a group's channels (its
        *consumers*, :func:`consumers`) -> ``X^T X`` of that layer's input rows on
        calibration data (float64, ``[K, K]``; a convolution's patches, channel-major:
        ``K = in * kh * kw``). Each consumer then scores the channels it reads
        (``method.unit_scores`` on its weight as ``[out, K]``, each channel its
        ``kh * kw`` columns, or a head's), a group's consumers' scores are combined
        (``method.combine_scores``), each group loses the channels of lowest scores as
        with weight scores (ties to the lower index), and, with ``compensate=True`` (the
        method's default), each consumer's kept columns are refit once on its Hessian
        (:func:`arrayprune.structured.compensate`) before it is sliced. ``arrayprune
        prune --shrink --calibration`` computes them (one pass of onnxruntime over the
        dense model).
    **method_args
        Constructor arguments of a method given by name (``compensate=False``,
        ``damp=0.01`` for a calibrated one).

    Returns
    -------
    (onnx.ModelProto, ShrinkReport)
        The new model (every initializer outside the groups, every node, name, input,
        output and attribute unchanged, but for the ``group`` of depthwise
        convolutions, the ``num_groups`` of ``GroupNormalization``, the channel count in
        ``Reshape`` target shapes and the sizes of a ``Split`` of fused heads; member
        initializers sliced under their own names; a shared initializer (or one read
        through ``Identity``) that a group slices is copied for the operator in the
        group, under a new name (copies that come out equal, such as the zero biases
        an export shares, sliced alike, are one initializer again), and the original,
        or the ``Identity``, is removed once nothing reads it; the shapes of the activations in the groups, where
        ``value_info`` states them, updated) and what was done.

    Raises
    ------
    TypeError
        If `model` is not an ``onnx.ModelProto``, or for a bad amount or method.
    ValueError
        For a bad amount, one that would remove every channel of a group, a member
        initializer whose data is external and not loaded, a calibrated method without
        `hessians` (or `hessians` without one), a Hessian missing or of the wrong shape,
        or a group whose consumers cannot be scored (a grouped convolution, a weight
        shared with other operators or read through ``Identity``): one line, naming
        the group.
    ImportError
        If ``onnx`` is missing.
    """
    onnx = _onnx()
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    _amount.validate_pruning_amount_init(amount)
    unit = unit_method(method, dict(method_args))
    if unit is None:
        _check_method(method, dict(method_args))
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    name = method if isinstance(method, str) else type(method).__name__
    if unit is not None and hessians is None:
        raise TypeError(
            f"method {name!r} scores channels on calibration data: give hessians (X^T X of the inputs of each layer "
            "reading a group, by weight name), as arrayprune prune --shrink --calibration computes them"
        )
    if hessians is not None and unit is None:
        raise TypeError(f"hessians are taken by a calibrated structured method, not {name!r}")
    if unit is not None and global_:
        raise ValueError(f"method {name!r} scores each group on its consumers; a global ranking is not supported")
    found = onnx_groups(model, kind)
    groups = [g.group for g in found.groups]
    if global_:
        total = sum(g.channels for g in groups)
        k = _amount.compute_nparams_toprune(amount, total)
        _amount.validate_pruning_amount(k, total)
        if k > total - len(groups):
            raise ValueError(
                f"amount={amount} would remove {k} of the {total} channels of {len(groups)} groups; each keeps one"
            )
    segments = [og.segments for og in found.groups]
    if global_ and any(p > 1 for p in segments):
        raise ValueError("a global ranking cannot keep the groups of a grouped convolution even; rank per group")
    if global_ and any(og.per > 1 for og in found.groups):
        raise ValueError("a global ranking cannot weigh GroupNorm groups against single channels; rank per group")
    check_rounding(rounding)
    if global_ and rounding != "nearest":
        raise ValueError("rounding applies to each group's count; a global ranking counts all channels at once")
    for g, p in zip(groups if not global_ else (), segments, strict=False):
        k = even_drop(amount, g.channels, p, str(g.name), rounding)
        _amount.validate_pruning_amount(k, g.channels)
        if k >= g.channels:
            raise ValueError(f"amount={amount} would remove every channel of group {g.name!r} ({g.channels})")
    views: dict[str, View] = {k: v for og in found.groups for k, v in og.views}
    sources = _source_arrays(onnx, model, found, views)
    refit: dict[str, np.ndarray] = {}
    if unit is not None and hessians is not None:  # both or neither, checked above
        cons, reads = consumers(model, found, amount, rounding)  # the groups that lose channels
        check_hessians(cons, sources, hessians)
        scores = calibrated_scores(unit, found, reads, cons, sources, hessians)
        kept = [_choose(sc, amount, g, p, rounding) for sc, g, p in zip(scores, groups, segments, strict=True)]
        if unit.compensate:
            refit = refits(unit, found, kept, reads, cons, sources, hessians)
            sources = {**sources, **refit}  # the consumers are sliced from their refit weights
    else:
        arrays: dict[str, Any] = {}
        for og in found.groups:
            for mem in og.group.members:
                key = str(mem.key)
                if key not in arrays:
                    arrays[key] = _view_array(sources, views[key], og.group.channels) if key in views else sources[key]
        _, kept = shrink_arrays(
            arrays, groups, amount, method, global_=global_, segments=segments, rounding=rounding, **method_args
        )

    out = copy.deepcopy(model)
    graph = out.graph
    new_data = _sliced(found, views, sources, [np.asarray(k) for k in kept])
    merged = _merge_equal(new_data, [v.copy for v in views.values() if v.copy is not None and v.rewire is not None])
    for v in views.values():
        if v.copy is not None and (v.copy in new_data or v.copy in merged) and v.rewire is not None:
            node, slot = v.rewire
            graph.node[node].input[slot] = merged.get(v.copy, v.copy)
    new_channels: dict[Any, int] = {og.group.name: int(k.shape[0]) for og, k in zip(found.groups, kept, strict=True)}
    for og in found.groups:
        n = new_channels[og.group.name]
        for shape_name, index, factor in og.shapes:
            view = views.get(shape_name)
            if view is not None:  # a private copy of a shared target shape
                value = new_data.get(shape_name, np.array(sources[view.source], copy=True))
                node, slot = view.rewire or (0, 0)
                graph.node[node].input[slot] = shape_name
            else:
                value = new_data.get(shape_name, np.array(sources[shape_name], copy=True))
            value.reshape(-1)[index] = n * factor
            new_data[shape_name] = value
    known = {t.name for t in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.output}
    for t in graph.initializer:
        if t.name in new_data:
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(new_data[t.name]), t.name))
    for name, value in new_data.items():
        if name in constants:
            for a in constants[name].attribute:
                if a.name == "value":
                    a.t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(value), a.t.name))
        elif name not in known:
            graph.initializer.append(onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
    sizes = {name: tuple(v.shape) for name, v in new_data.items()}
    for v in [*graph.input, *graph.value_info]:  # initializers listed as inputs (IR < 4) or with shapes
        if v.name in sizes:
            _set_shape(v, sizes[v.name])
    value_info = {v.name: v for v in graph.value_info}
    for og, k in zip(found.groups, kept, strict=True):
        dropped = og.group.channels - int(k.shape[0])
        for value, axis, block in og.values:
            if value in value_info:
                _shrink_dim(value_info[value], axis, dropped * block)
        for idx in og.depthwise:  # a depthwise Conv's group, a GroupNormalization's num_groups
            for a in graph.node[idx].attribute:
                if a.name in ("group", "num_groups"):
                    a.i -= dropped
    removed = _drop_unused(graph, {v.source for v in views.values()})
    before = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    after = sum(int(np.prod(t.dims)) for t in graph.initializer)
    report = ShrinkReport(
        found,
        {g.group.name: [int(i) for i in np.asarray(k)] for g, k in zip(found.groups, kept, strict=True)},
        before,
        after,
        tuple(n for n in new_data if n not in constants),
        tuple(removed),
        refit,
    )
    return out, report


def _merge_equal(new_data: dict[str, np.ndarray], copies: Sequence[str]) -> dict[str, str]:
    """Private copies that came out equal (the zero biases an export shared, each sliced
    alike): all but the first are dropped from `new_data`; returns dropped -> kept."""
    first: dict[tuple[str, tuple[int, ...], bytes], str] = {}
    merged: dict[str, str] = {}
    for name in dict.fromkeys(copies):
        a = new_data.get(name)
        if a is None:
            continue
        key = (a.dtype.str, tuple(a.shape), np.ascontiguousarray(a).tobytes())
        if key in first:
            merged[name] = first[key]
            del new_data[name]
        else:
            first[key] = name
    return merged


def source_names(found: OnnxGroups) -> set[str]:
    """The initializers (and ``Constant`` outputs) that the members and shapes of `found` are read from."""
    views = {k: v for g in found.groups for k, v in g.views}
    names = {str(m.key) for g in found.groups for m in g.group.members if str(m.key) not in views}
    names |= {name for g in found.groups for name, _, _ in g.shapes if name not in views}
    return names | {v.source for v in views.values()}


def zeroed_onnx(model: Any, report: ShrinkReport) -> Any:
    """The dense model with the channels :func:`shrink_onnx` dropped zeroed where the closing layers read them.

    The consumers it refit (a calibrated method with ``compensate``) hold their refit
    weights (:attr:`ShrinkReport.refit`, zero on the dropped channels).

    For each group, the input channels of its closing layers (``MatMul``/``Gemm`` B rows,
    ``Conv`` W input channels; for heads, the output projection's rows of each dropped
    head) are set to zero: the dense model then computes what the shrunk one computes,
    since whatever a dropped channel holds after biases, norms and residual additions is
    multiplied by zero. A closing member that is a private copy of a shared initializer
    is zeroed in a copy read by that layer alone.

    Parameters
    ----------
    model : onnx.ModelProto
        The dense model given to :func:`shrink_onnx` (its member data loaded); not modified.
    report : ShrinkReport
        What :func:`shrink_onnx` returned for it.

    Returns
    -------
    onnx.ModelProto
        The zeroed copy.
    """
    onnx = _onnx()
    found = report.groups
    views: dict[str, View] = {k: v for og in found.groups for k, v in og.views}
    sources = _source_arrays(onnx, model, found, views)
    out = copy.deepcopy(model)
    graph = out.graph
    zero: dict[str, np.ndarray] = {}
    for og in found.groups:
        kept = np.asarray(report.kept[og.group.name], dtype=np.int64)
        dropped = np.setdiff1d(np.arange(og.group.channels), kept)
        axes = {str(m.key): m.axis for m in og.group.members}
        for key in og.closing:
            view = views.get(key)
            if view is None:
                name, source, axis, start, block = key, key, axes[key], 0, 1
            else:
                name, source = view.copy or view.source, view.source
                axis, start, block = view.axis, view.start, view.block
            a = zero.get(name)
            if a is None:
                a = np.array(sources[source], copy=True)
            if view is not None and view.segments > 1:
                unfolded = _unfold(a, view.segments)
                unfolded[:, dropped] = 0
                zero[name] = _fold(unfolded, view.segments)
                continue
            index: list[Any] = [slice(None)] * a.ndim
            index[axis] = _entries(dropped, start, block)
            a[tuple(index)] = 0
            zero[name] = a
            if view is not None and view.copy is not None and view.rewire is not None:
                node, slot = view.rewire
                graph.node[node].input[slot] = view.copy
    zero.update(report.refit)  # refit consumers: their dropped channels are zero already
    known = {t.name for t in graph.initializer}
    for t in graph.initializer:
        if t.name in zero:
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(zero[t.name]), t.name))
    for name, a in zero.items():
        if name not in known:
            graph.initializer.append(onnx.numpy_helper.from_array(np.ascontiguousarray(a), name))
    return out


def _source_arrays(onnx: Any, model: Any, found: OnnxGroups, views: dict[str, View]) -> dict[str, np.ndarray]:
    """The arrays the members and shapes of `found` are read from: initializers and ``Constant`` values."""
    names = source_names(found)
    inits = {t.name: t for t in model.graph.initializer}
    constants = {
        n.output[0]: a.t
        for n in model.graph.node if n.op_type == "Constant" and n.output
        for a in n.attribute if a.name == "value"
    }  # fmt: skip
    out = {}
    for name in sorted(names):
        t = inits.get(name, constants.get(name))
        if t is None:
            raise ValueError(f"{name!r} is neither an initializer nor a Constant of the model")
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"initializer {name!r} has external data that is not loaded (onnx.load its folder)")
        out[name] = onnx.numpy_helper.to_array(t)
    return out


def _view_array(sources: Mapping, view: View, channels: int) -> np.ndarray:
    """The member a view names, for scoring: the range of its source's axis that holds the
    channels, that axis split into ``[channels, block]``."""
    a = np.asarray(sources[view.source])
    if view.segments > 1:
        return _unfold(a, view.segments)
    width = channels * view.block
    if view.start or a.shape[view.axis] != width:
        index: list[Any] = [slice(None)] * a.ndim
        index[view.axis] = slice(view.start, view.start + width)
        a = a[tuple(index)]
    if view.block > 1:
        a = a.reshape(a.shape[: view.axis] + (channels, view.block) + a.shape[view.axis + 1 :])
    return a


def _unfold(w: np.ndarray, segments: int) -> np.ndarray:
    """A grouped ``Conv`` W ``[out, in/g, k...]`` as ``[out/g, in, k...]`` (a copy): input
    channel ``j * in/g + i`` on axis 1 reads the rows of block ``j`` at entry ``i``."""
    rows, local = w.shape[0], w.shape[1]
    blocks = w.reshape((segments, rows // segments, local) + w.shape[2:]).swapaxes(0, 1)
    return blocks.reshape((rows // segments, segments * local) + w.shape[2:])


def _fold(u: np.ndarray, segments: int) -> np.ndarray:
    """The inverse of :func:`_unfold`."""
    rows, width = u.shape[0], u.shape[1]
    blocks = u.reshape((rows, segments, width // segments) + u.shape[2:]).swapaxes(0, 1)
    return blocks.reshape((segments * rows, width // segments) + u.shape[2:])


def _entries(dropped: np.ndarray, start: int, block: int) -> np.ndarray:
    """The entries of an axis that dropped channels hold (channel c: ``start + c*block + j``)."""
    return (start + dropped[:, None] * block + np.arange(block)).reshape(-1)


def _sliced(found: OnnxGroups, views: dict[str, View], sources: Mapping, kept: list[np.ndarray]) -> dict:
    """Every tensor the groups slice (initializers, private copies), with the dropped
    entries of each axis removed at once: a tensor may lose channels of several groups,
    on one axis (ranges a ``Concat`` joined) or on several."""
    drops: dict[str, dict[int, list[np.ndarray]]] = {}
    by_block: dict[str, tuple[int, np.ndarray]] = {}  # grouped Conv W: input channels dropped block by block
    base: dict[str, np.ndarray] = {}
    for og, k in zip(found.groups, kept, strict=True):
        dropped = np.setdiff1d(np.arange(og.group.channels), k)
        for mem in og.group.members:
            key = str(mem.key)
            view = views.get(key)
            if view is None:
                tensor, axis, start, block = key, mem.axis % max(np.ndim(sources[key]), 1), 0, 1
                base.setdefault(tensor, sources[key])
            else:
                tensor, axis, start, block = view.copy or view.source, view.axis, view.start, view.block
                base.setdefault(tensor, sources[view.source])
                if view.segments > 1:
                    by_block[tensor] = (view.segments, dropped)
                    continue
            drops.setdefault(tensor, {}).setdefault(axis, []).append(_entries(dropped, start, block))
    out = {}
    for tensor in dict.fromkeys([*drops, *by_block]):
        a = np.asarray(base[tensor])
        changed = False
        for axis, parts in drops.get(tensor, {}).items():
            gone = np.unique(np.concatenate(parts))
            if gone.size:
                a = np.delete(a, gone, axis=axis)
                changed = True
        if tensor in by_block and by_block[tensor][1].size:  # after its rows: the blocks are their new size
            segments, gone = by_block[tensor]
            a = _fold(np.delete(_unfold(a, segments), gone, axis=1), segments)
            changed = True
        if changed:
            out[tensor] = a
    return out


def _drop_unused(graph: Any, candidates: set[str]) -> list[str]:
    """Remove what the private copies left unread: ``Identity`` and ``Constant`` nodes
    whose outputs nothing reads, then the initializers among `candidates` nothing reads."""
    outputs = {v.name for v in graph.output}
    removed: list[str] = []
    while True:
        read = {x for n in graph.node for x in n.input} | outputs | _subgraph_reads(graph)
        identities = {n.output[0] for n in graph.node if n.op_type == "Identity" and n.output}
        dead = [
            i for i, n in enumerate(graph.node)
            if n.output and n.output[0] not in read and (
                (n.op_type == "Identity" and (n.input[0] in candidates or n.input[0] in identities))
                or (n.op_type == "Constant" and n.output[0] in candidates)
            )
        ]  # fmt: skip
        if not dead:
            break
        for i in reversed(dead):
            removed.append(graph.node[i].output[0])
            del graph.node[i]
    read = {x for n in graph.node for x in n.input} | outputs | _subgraph_reads(graph)
    keep = [t for t in graph.initializer if t.name in read or t.name not in candidates]
    if len(keep) != len(graph.initializer):
        removed += [t.name for t in graph.initializer if t.name not in read and t.name in candidates]
        kept_names = {t.name for t in keep}
        inputs = [v for v in graph.input if v.name in kept_names or v.name not in candidates]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        del graph.input[:]
        graph.input.extend(inputs)
    return removed


def _subgraph_reads(graph: Any) -> set[str]:
    """Names read by nodes of subgraphs (any depth)."""
    out: set[str] = set()
    for n in graph.node:
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                out |= {x for m in sub.node for x in m.input} | _subgraph_reads(sub)
    return out


def _shrink_dim(v: Any, axis: int, by: int) -> None:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return
    dims = t.shape.dim
    if -len(dims) <= axis < len(dims):
        d = dims[axis]
        if d.HasField("dim_value"):
            n = d.dim_value - by
            d.Clear()
            d.dim_value = n


def _set_shape(v: Any, shape: tuple[int, ...]) -> None:
    t = v.type.tensor_type
    t.shape.Clear()
    for n in shape:
        t.shape.dim.add().dim_value = n
