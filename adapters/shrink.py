"""Structured pruning that shrinks the model: the chosen channels are removed, not zeroed.

Two entries:

* :func:`shrink_onnx`: an ``onnx.ModelProto`` in, a smaller one out. Its channel groups
  come from the graph (:func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups`);
  each loses ``amount`` of its channels, chosen by a structured method over all its
  weight members (:mod:`arrayprune.groups`); every member initializer is sliced (names
  kept), the shapes of the activations in between and the ``group`` of depthwise
  convolutions follow. The result computes what the dense model computes with those
  channels zeroed.
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
from dataclasses import dataclass
from typing import Any

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
)
from arrayprune.registry import METHODS

from .plan import stream_seed
from .roles.onnx_graph import _onnx
from .roles.onnx_groups import OnnxGroups, onnx_groups
from .trees import _rebuild

__all__ = ["ShrinkReport", "shrink_onnx", "shrink_arrays"]


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
    """

    groups: OnnxGroups
    kept: dict
    params_before: int
    params_after: int


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
    methods = _per_group_methods(groups, method, dict(method_args))
    if not global_:
        for g in groups:
            _amount.validate_pruning_amount(_amount.compute_nparams_toprune(amount, g.channels), g.channels)
    scores = [
        group_scores(params, g, m, importance_scores=importance_scores) for g, m in zip(groups, methods, strict=True)
    ]
    if global_:
        kept = choose_channels_global(scores, amount) if groups else []
    else:
        kept = [choose_channels(s, amount) for s in scores]
    out = take_channels(params, groups, kept)
    return Shrunk(_rebuild(params, out.items()), kept)


def _check_method(method: Any, method_args: dict) -> None:
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {sorted(METHODS)}")
    resolve_method(method, **method_args)


def shrink_onnx(
    model: Any, amount: int | float, method: Any = "ln_structured", *, global_: bool = False, **method_args: Any
) -> tuple[Any, ShrinkReport]:
    """A smaller ONNX model: ``amount`` of the channels of every group removed.

    Parameters
    ----------
    model : onnx.ModelProto
        The dense model, with its initializers' data loaded; not modified.
    amount : int or float
        A fraction in ``[0, 1]`` of each group's channels, or a count per group. At
        least one channel of every group stays.
    method : str or method object, default "ln_structured"
        See :func:`shrink_arrays` (``n=1`` for L1, ``seed=...`` for random).
    global_ : bool, default False
        `amount` of all the groups' channels, ranked across groups (different counts
        per group, each keeps at least one; see :func:`shrink_arrays`).
    **method_args
        Constructor arguments of a method given by name.

    Returns
    -------
    (onnx.ModelProto, ShrinkReport)
        The new model (every initializer outside the groups, every node, name, input,
        output and attribute unchanged, but for the ``group`` of depthwise
        convolutions and the channel count in ``Reshape`` target shapes; member
        initializers sliced under their own names; the shapes of
        the activations in the groups, where ``value_info`` states them, updated) and
        what was done.

    Raises
    ------
    TypeError
        If `model` is not an ``onnx.ModelProto``, or for a bad amount or method.
    ValueError
        For a bad amount, one that would remove every channel of a group, or a member
        initializer whose data is external and not loaded.
    ImportError
        If ``onnx`` is missing.
    """
    onnx = _onnx()
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    _amount.validate_pruning_amount_init(amount)
    _check_method(method, dict(method_args))
    found = onnx_groups(model)
    groups = [g.group for g in found.groups]
    inits = {t.name: t for t in model.graph.initializer}
    if global_:
        total = sum(g.channels for g in groups)
        k = _amount.compute_nparams_toprune(amount, total)
        _amount.validate_pruning_amount(k, total)
        if k > total - len(groups):
            raise ValueError(
                f"amount={amount} would remove {k} of the {total} channels of {len(groups)} groups; each keeps one"
            )
    for g in groups if not global_ else ():
        k = _amount.compute_nparams_toprune(amount, g.channels)
        _amount.validate_pruning_amount(k, g.channels)
        if k >= g.channels:
            raise ValueError(f"amount={amount} would remove every channel of group {g.name!r} ({g.channels})")
    names = list(dict.fromkeys(mem.key for g in groups for mem in g.members))
    for name in names:
        if inits[name].data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"initializer {name!r} has external data that is not loaded (onnx.load its folder)")
    arrays = {name: onnx.numpy_helper.to_array(inits[name]) for name in names}
    small, kept = shrink_arrays(arrays, groups, amount, method, global_=global_, **method_args)

    out = copy.deepcopy(model)
    graph = out.graph
    for t in graph.initializer:
        if t.name in small and small[t.name] is not arrays[t.name]:
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(small[t.name]), t.name))
    new_channels: dict[Any, int] = {og.group.name: int(k.shape[0]) for og, k in zip(found.groups, kept, strict=True)}
    sizes: dict[Any, tuple[int, ...]] = {n: tuple(small[n].shape) for n in names}
    for v in [*graph.input, *graph.value_info]:  # initializers listed as inputs (IR < 4) or with shapes
        if v.name in sizes:
            _set_shape(v, sizes[v.name])
    value_info = {v.name: v for v in graph.value_info}
    for og in found.groups:
        for value, axis in og.values:
            if value in value_info:
                _set_dim(value_info[value], axis, new_channels[og.group.name])
        for idx in og.depthwise:
            for a in graph.node[idx].attribute:
                if a.name == "group":
                    a.i = new_channels[og.group.name]
        for shape_name, index in og.shapes:
            _set_shape_entry(onnx, graph, shape_name, index, new_channels[og.group.name])
    before = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    after = sum(int(np.prod(t.dims)) for t in graph.initializer)
    report = ShrinkReport(
        found,
        {g.group.name: [int(i) for i in np.asarray(k)] for g, k in zip(found.groups, kept, strict=True)},
        before,
        after,
    )
    return out, report


def _set_shape_entry(onnx: Any, graph: Any, name: str, index: int, n: int) -> None:
    """Set entry `index` of the integer constant `name` (an initializer or a ``Constant``
    output, a ``Reshape`` target shape) to `n`."""
    tensors = [t for t in graph.initializer if t.name == name]
    tensors += [
        a.t for node in graph.node if node.op_type == "Constant" and node.output[:1] == [name]
        for a in node.attribute if a.name == "value"
    ]  # fmt: skip
    for t in tensors:
        value = onnx.numpy_helper.to_array(t).copy()
        value.reshape(-1)[index] = n
        t.CopyFrom(onnx.numpy_helper.from_array(value, t.name))


def _set_dim(v: Any, axis: int, n: int) -> None:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return
    dims = t.shape.dim
    if -len(dims) <= axis < len(dims):
        d = dims[axis]
        d.Clear()
        d.dim_value = n


def _set_shape(v: Any, shape: tuple[int, ...]) -> None:
    t = v.type.tensor_type
    t.shape.Clear()
    for n in shape:
        t.shape.dim.add().dim_value = n
