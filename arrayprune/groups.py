"""Coupled channel groups: score them, choose the channels to drop, slice them away.

A structured method that removes channels only pays off when the channels go: the
producer's output channels, its bias and per-channel constants, and the next layer's
input channels must all lose the same indices, so that the smaller model computes the
same function as the dense one with those channels zeroed. A :class:`ChannelGroup` lists
such *members*, ``(key, axis)`` pairs, each marked as a weight (it scores) or not
(biases, per-channel constants, norm statistics: they lose channels but do not score).
Which tensors are coupled is read by the adapters (ONNX graph edges, see
:mod:`arrayprune.adapters.roles.onnx_groups`); this module only

* scores a group (:func:`group_scores`): a structured method's channel score over all
  the group's weight members at once (for ``ln_structured`` the L``n`` norm of each
  channel's entries across all weight members, the norm of their concatenation);
* chooses the channels to keep (:func:`choose_channels`): exactly
  ``round(amount * channels)`` are dropped (an int amount is a count), lowest scores
  first, ties to the lower index, the kept ones in their order;
* slices (:func:`take_channels`, :func:`shrink`): every member with ``xp.take`` along
  its axis, in the member's own library and on its device.

Any method with a ``channel_scores(t, dim)`` method works (every structured method of
:data:`arrayprune.METHODS` that removes whole channels: ``ln_structured``,
``random_structured``); its own ``amount`` and ``dim`` are not used here.

Examples
--------
>>> import numpy as np
>>> from arrayprune.groups import ChannelGroup, shrink
>>> w1 = np.array([[1.0, 0.1, 3.0], [1.0, 0.2, 0.0]], dtype=np.float32)  # [K=2, N=3]
>>> b1 = np.array([0.5, 0.6, 0.7], dtype=np.float32)
>>> w2 = np.ones((3, 2), dtype=np.float32)  # [K=3, N=2]
>>> g = ChannelGroup([("w1", 1), ("b1", 0, False), ("w2", 0)], channels=3)
>>> out, kept = shrink({"w1": w1, "b1": b1, "w2": w2}, [g], amount=1)
>>> kept[0]
array([0, 2])
>>> out["b1"]
array([0.5, 0.7], dtype=float32)
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import array_api_compat as apc

from . import amount as _amount
from ._namespace import namespace
from .method_parts import prunes_units
from .registry import METHODS
from .selection import smallest_magnitude_keep

__all__ = [
    "Member",
    "ChannelGroup",
    "Shrunk",
    "resolve_method",
    "unit_method",
    "group_scores",
    "choose_channels",
    "choose_channels_global",
    "take_channels",
    "shrink",
]

Array = Any


@dataclass(frozen=True)
class Member:
    """One tensor of a channel group, and the axis along which it holds the channels.

    Attributes
    ----------
    key : hashable
        The tensor's key in the mapping of arrays.
    axis : int
        The axis with one entry per channel (negative counts from the end).
    weight : bool, default True
        Whether the member scores: layer weights do, biases, per-channel constants and
        norm statistics only lose channels.
    """

    key: Hashable
    axis: int
    weight: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise TypeError(f"member {self.key!r}: axis must be an int, got {type(self.axis).__name__}")
        if not isinstance(self.weight, bool):
            raise TypeError(f"member {self.key!r}: weight must be a bool, got {type(self.weight).__name__}")


@dataclass(frozen=True)
class ChannelGroup:
    """Tensors that must lose the same channel indices, and how many channels they have.

    Parameters
    ----------
    members : sequence of Member or tuple
        ``Member`` objects, or tuples ``(key, axis)`` (a weight) or
        ``(key, axis, weight)``. A key may appear twice only with different axes.
    channels : int
        The number of channels: every member's length along its axis.
    name : str, default ""
        A label for reports (the ONNX adapter uses the producer's value name).

    Raises
    ------
    TypeError
        If a member is malformed or `channels` is not an int.
    ValueError
        If there is no member, `channels` is negative or a ``(key, axis)`` repeats.
    """

    members: tuple[Member, ...]
    channels: int
    name: str = ""

    def __init__(self, members: Sequence[Any], channels: int, name: str = ""):
        out = []
        for m in members:
            if isinstance(m, Member):
                out.append(m)
            elif isinstance(m, tuple) and len(m) in (2, 3):
                out.append(Member(*m))
            else:
                raise TypeError(f"a group member is a Member or a tuple (key, axis[, weight]), got {m!r}")
        if not out:
            raise ValueError("a channel group needs at least one member")
        if isinstance(channels, bool) or not isinstance(channels, int):
            raise TypeError(f"channels must be an int, got {type(channels).__name__}")
        if channels < 0:
            raise ValueError(f"channels must be non-negative, got {channels}")
        seen = set()
        for m in out:
            if (m.key, m.axis) in seen:
                raise ValueError(f"member {m.key!r} along axis {m.axis} is listed twice")
            seen.add((m.key, m.axis))
        object.__setattr__(self, "members", tuple(out))
        object.__setattr__(self, "channels", channels)
        object.__setattr__(self, "name", str(name))

    @property
    def weights(self) -> tuple[Member, ...]:
        """The members that score."""
        return tuple(m for m in self.members if m.weight)


class Shrunk(NamedTuple):
    """What :func:`shrink` returns.

    Attributes
    ----------
    arrays : dict
        The new mapping: every member sliced, every other entry the input's own object.
    kept : list of arrays
        Per group (in the order given), the kept channel indices, ascending: 1-D integer
        arrays of the namespace and device of the group's first member.
    """

    arrays: Mapping
    kept: list


def resolve_method(method: Any = "ln_structured", **method_args: Any) -> Any:
    """A method object that can score channels, from a method or its name.

    Parameters
    ----------
    method : str or method object, default "ln_structured"
        A name of :data:`arrayprune.METHODS` (built with ``amount=0`` and
        `method_args`; ``ln_structured`` gets ``n=2`` unless given), or an object with a
        ``channel_scores(t, dim)`` method (its ``amount`` and ``dim`` are not used).
    **method_args
        Constructor arguments for a method given by name (``n=1``, ``seed=0``, ...).

    Returns
    -------
    object
        The method.

    Raises
    ------
    ValueError
        If the name is not in :data:`arrayprune.METHODS`.
    TypeError
        If the method does not remove whole channels (no ``channel_scores``), or
        `method_args` are given with a method object or do not fit the constructor.
    """
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {sorted(METHODS)}")
        cls: Any = METHODS[method]
        if not callable(getattr(cls, "channel_scores", None)):
            raise TypeError(f"method {method!r} does not remove whole channels: it cannot shrink a model")
        _check_by_weights(cls, repr(method))
        params = inspect.signature(cls.__init__).parameters
        if "n" in params and params["n"].default is inspect.Parameter.empty:
            method_args.setdefault("n", 2)
        if "dim" in method_args:
            raise TypeError("dim does not apply to channel groups: each member has its own axis")
        return cls(0, **method_args)
    if method_args:
        raise TypeError(f"method arguments {sorted(method_args)} are only taken with a method name")
    if not callable(getattr(method, "channel_scores", None)):
        raise TypeError(
            f"{type(method).__name__} does not remove whole channels (it has no channel_scores): "
            "it cannot shrink a model"
        )
    _check_by_weights(method, type(method).__name__)
    return method


def unit_method(method: Any, method_args: Mapping[str, Any]) -> Any:
    """The calibrated structured method `method` names or is, built from `method_args`; None for any other.

    A calibrated structured method (:class:`~arrayprune.structured_methods.UnitPruningMethod`:
    ``activation_structured``, ``obs_structured``) scores a group's channels in the layers
    that read them, on calibration data; every other method goes through
    :func:`resolve_method`.

    Parameters
    ----------
    method : str or method object
        A name of :data:`arrayprune.METHODS` (built with ``amount=0`` and `method_args`) or
        a method object.
    method_args : mapping
        Constructor arguments for a method given by name (``compensate``, ``damp``).

    Returns
    -------
    UnitPruningMethod or None

    Raises
    ------
    TypeError
        For ``dim``, arguments the constructor does not take, or arguments given with a
        method object.
    """
    if isinstance(method, str):
        cls: Any = METHODS.get(method)
        if not prunes_units(cls):
            return None
        if "dim" in method_args:
            raise TypeError("dim does not apply to channel groups: each member has its own axis")
        try:
            return cls(0, **method_args)
        except TypeError as exc:
            raise TypeError(f"method {method!r}: {exc}") from None
    if not prunes_units(method):
        return None
    if method_args:
        raise TypeError(f"method arguments {sorted(method_args)} are only taken with a method name")
    return method


def _check_by_weights(method: Any, name: str) -> None:
    """Refuse a calibrated structured method: channel groups are scored by their weights here."""
    if prunes_units(method):
        raise TypeError(
            f"method {name} scores units on calibration data (the Hessian of the layer reading them): it shrinks a "
            "torch module given calibration batches (prune.shrink(..., calibration_batches=...)), an ONNX model or a "
            "Hugging Face folder (prune FILE --shrink --calibration) or a transformers model (prune.shrink_llm), not "
            "channel groups scored by their weights"
        )


def _check_members(arrays: Mapping, group: ChannelGroup) -> list[int]:
    """Each member's non-negative axis, after checking key, axis and length."""
    if not isinstance(group, ChannelGroup):
        raise TypeError(f"expected a ChannelGroup, got {type(group).__name__}")
    axes = []
    for m in group.members:
        if m.key not in arrays:
            raise KeyError(f"group {group.name!r}: no array named {m.key!r}")
        shape = tuple(arrays[m.key].shape)
        try:
            axis = _amount.normalize_dim(shape, m.axis)
        except IndexError:
            raise ValueError(
                f"group {group.name!r}: axis {m.axis} out of range for {m.key!r} of shape {shape}"
            ) from None
        if shape[axis] != group.channels:
            raise ValueError(
                f"group {group.name!r}: {m.key!r} of shape {shape} has {shape[axis]} entries along axis "
                f"{m.axis}, not the group's {group.channels} channels"
            )
        axes.append(axis)
    return axes


def group_scores(
    arrays: Mapping,
    group: ChannelGroup,
    method: Any = "ln_structured",
    *,
    importance_scores: Mapping | None = None,
    **method_args: Any,
) -> Array:
    """One score per channel of `group`: the method's channel score over all weight members.

    Each weight member is laid out as ``[channels, -1]`` (its channel axis first, the
    rest flattened) and the members are concatenated along the second axis; the
    method scores the channels of that matrix. For ``ln_structured`` that is the L``n``
    norm of each channel's entries across all weight members; ``random_structured``
    draws one number per channel (seeded: the same numbers for the same seed and count).
    A group with a single weight member is scored on the member itself (so ``'nuc'``
    norms see its shape).

    Parameters
    ----------
    arrays : mapping
        Key -> array, holding every member (all of one namespace and device).
    group : ChannelGroup
        The group.
    method : str or method object, default "ln_structured"
        See :func:`resolve_method`.
    importance_scores : mapping, optional
        Key -> array shaped like the member, scored instead of the member's values
        (as ``importance_scores`` of PyTorch's verbs); members not in it score their
        own values.
    **method_args
        Constructor arguments of a method given by name.

    Returns
    -------
    array
        Shape ``(channels,)``, in the namespace and on the device of the weight members.

    Raises
    ------
    KeyError
        If a member is missing from `arrays`.
    ValueError
        If a member's length along its axis is not ``group.channels``, the group has
        no weight member, or an importance score has another shape than its member.
    TypeError
        See :func:`resolve_method`.
    """
    method = resolve_method(method, **method_args)
    axes = _check_members(arrays, group)
    chosen = [(m, a) for m, a in zip(group.members, axes, strict=True) if m.weight]
    if not chosen:
        raise ValueError(f"group {group.name!r} has no weight member to score")
    given = importance_scores or {}
    parts = []
    for m, axis in chosen:
        t = arrays[m.key]
        if m.key in given:
            s = given[m.key]
            if tuple(s.shape) != tuple(t.shape):
                raise ValueError(
                    f"importance_scores[{m.key!r}] has shape {tuple(s.shape)}, the array {tuple(t.shape)}"
                )
            t = s
        parts.append((t, axis))
    if len(parts) == 1:
        t, axis = parts[0]
        return method.channel_scores(t, axis)
    xp = namespace(*[t for t, _ in parts])
    dtype = xp.result_type(*[t.dtype for t, _ in parts])
    rows = []
    for t, axis in parts:
        moved = xp.permute_dims(t, (axis, *(d for d in range(t.ndim) if d != axis)))
        rows.append(xp.astype(xp.reshape(moved, (group.channels, -1)), dtype, copy=False))
    return method.channel_scores(xp.concat(rows, axis=1), 0)


def choose_channels(scores: Array, amount: int | float) -> Array:
    """The channels to keep after dropping exactly ``round(amount * channels)`` of them.

    Parameters
    ----------
    scores : array
        One score per channel (1-D). Channels rank by ``|score|`` ascending (the order
        of every arrayprune selection: NaN above +inf), ties to the lower index.
    amount : int or float
        A fraction in ``[0, 1]`` of the channels (rounded half to even, as PyTorch
        does), or a count.

    Returns
    -------
    array
        The kept indices, ascending: a 1-D integer array of the namespace and on the
        device of `scores`.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a negative int, a float outside ``[0, 1]``, a count larger
        than the number of channels, or `scores` is not 1-D.
    """
    _amount.validate_pruning_amount_init(amount)
    if scores.ndim != 1:
        raise ValueError(f"channel scores must be 1-D, got shape {tuple(scores.shape)}")
    n = int(scores.shape[0])
    k = _amount.compute_nparams_toprune(amount, n)
    _amount.validate_pruning_amount(k, n)
    xp = namespace(scores)
    if k == 0:
        return xp.arange(n, device=apc.device(scores))
    keep = smallest_magnitude_keep([scores], k)[0]
    return xp.nonzero(keep)[0]


def choose_channels_global(scores: Sequence[Array], amount: int | float) -> list[Array]:
    """The channels each group keeps when ``round(amount * all channels)`` go, ranked across groups.

    The channels of all groups are ranked together by ``|score|`` (NaN above +inf;
    ties to the lower index, over groups in the order given), so groups lose different
    counts. Every group keeps its best channel: it is not ranked (a layer with no
    channel left would cut the model), so the amount can take at most
    ``channels - groups`` channels. Scores are compared as they are: methods whose
    scores grow with a group's fan-in (the L``n`` norms of ``ln_structured``) favour
    wide groups, as global magnitude pruning favours layers of large weights.

    Parameters
    ----------
    scores : sequence of arrays
        Per group, one score per channel (1-D); one namespace and device.
    amount : int or float
        A fraction in ``[0, 1]`` of all channels (rounded half to even), or a count.

    Returns
    -------
    list of arrays
        Per group, the kept indices, ascending (1-D integer arrays).

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If a score array is not 1-D or empty, there is no group, or the amount would
        take more than ``channels - groups`` channels.
    """
    _amount.validate_pruning_amount_init(amount)
    if not scores:
        raise ValueError("no channel group to rank")
    for s in scores:
        if s.ndim != 1 or s.shape[0] == 0:
            raise ValueError(f"channel scores must be 1-D and not empty, got shape {tuple(s.shape)}")
    total = sum(int(s.shape[0]) for s in scores)
    k = _amount.compute_nparams_toprune(amount, total)
    _amount.validate_pruning_amount(k, total)
    if k > total - len(scores):
        raise ValueError(
            f"amount={amount} would remove {k} of {total} channels; every one of the {len(scores)} groups keeps "
            f"at least one, so at most {total - len(scores)} can go"
        )
    xp = namespace(*scores)
    best = [smallest_magnitude_keep([s], int(s.shape[0]) - 1)[0] for s in scores]
    keep = smallest_magnitude_keep(list(scores), k, eligible=[xp.logical_not(b) for b in best])
    return [xp.nonzero(xp.logical_or(kp, b))[0] for kp, b in zip(keep, best, strict=True)]


def take_channels(arrays: Mapping, groups: Sequence[ChannelGroup], kept: Sequence[Array]) -> dict:
    """A new dict with every member of every group sliced to its group's kept channels.

    Parameters
    ----------
    arrays : mapping
        Key -> array.
    groups : sequence of ChannelGroup
        The groups. A key may be in several groups along different axes (a layer's
        input channels in one, its output channels in another); one ``(key, axis)``
        may not be in two groups.
    kept : sequence of arrays
        Per group, the kept channel indices (1-D integers, as :func:`choose_channels`
        returns them), ascending and distinct.

    Returns
    -------
    dict
        Same keys in the same order; members are new arrays (``xp.take`` along their
        axis, on their device), every other value is the input's own object.

    Raises
    ------
    KeyError, ValueError, TypeError
        For missing members, lengths that do not match, a ``(key, axis)`` in two
        groups, or kept indices that are not 1-D, ascending, distinct and in range;
        raised before anything is sliced.
    """
    if len(groups) != len(kept):
        raise ValueError(f"{len(groups)} groups but {len(kept)} kept-index arrays")
    cuts: dict[Hashable, list[tuple[int, Array]]] = {}
    owner: dict[tuple[Hashable, int], str] = {}
    for group, idx in zip(groups, kept, strict=True):
        axes = _check_members(arrays, group)
        if idx.ndim != 1:
            raise ValueError(f"group {group.name!r}: kept indices must be 1-D, got shape {tuple(idx.shape)}")
        xp = namespace(idx)
        if not xp.isdtype(idx.dtype, "integral"):
            raise TypeError(f"group {group.name!r}: kept indices must be integers, got {idx.dtype}")
        count = int(idx.shape[0])
        if count:
            lo, hi = int(xp.min(idx)), int(xp.max(idx))
            if lo < 0 or hi >= group.channels:
                raise ValueError(f"group {group.name!r}: kept indices out of range [0, {group.channels})")
            if count > 1 and not bool(xp.all(idx[1:] > idx[:-1])):
                raise ValueError(f"group {group.name!r}: kept indices must be ascending and distinct")
        for m, axis in zip(group.members, axes, strict=True):
            if (m.key, axis) in owner:
                raise ValueError(
                    f"{m.key!r} along axis {axis} is in two groups ({owner[m.key, axis]!r} and {group.name!r})"
                )
            owner[m.key, axis] = group.name
            cuts.setdefault(m.key, []).append((axis, idx))
    out = dict(arrays)
    for key, items in cuts.items():
        t = arrays[key]
        xp = namespace(t)
        for axis, idx in items:
            if int(idx.shape[0]) == t.shape[axis]:
                continue  # nothing dropped along this axis
            where = idx
            if namespace(idx) is not xp or apc.device(idx) != apc.device(t):
                where = xp.asarray(idx, device=apc.device(t))
            t = xp.take(t, where, axis=axis)
        out[key] = t
    return out


def shrink(
    arrays: Mapping,
    groups: Sequence[ChannelGroup],
    amount: int | float,
    method: Any = "ln_structured",
    *,
    importance_scores: Mapping | None = None,
    **method_args: Any,
) -> Shrunk:
    """Drop ``amount`` of the channels of every group, and slice all members.

    Every group is scored on the arrays as given (before any slicing), by
    :func:`group_scores`, and loses exactly ``round(amount * group.channels)`` channels
    (:func:`choose_channels`; an int amount is a count per group).

    Parameters
    ----------
    arrays : mapping
        Key -> array.
    groups : sequence of ChannelGroup
        The groups (see :func:`take_channels` for keys in several groups).
    amount : int or float
        Fraction in ``[0, 1]`` of each group's channels, or a count per group.
    method : str or method object, default "ln_structured"
        See :func:`resolve_method`. A seeded random method draws the same numbers for
        every group of the same size; give each group its own seed through
        :func:`group_scores` where that matters.
    importance_scores : mapping, optional
        Key -> array scored instead of the member's values.
    **method_args
        Constructor arguments of a method given by name (``n=1``, ``seed=0``).

    Returns
    -------
    Shrunk
        ``(arrays, kept)``: the new dict and the kept indices of each group.

    Raises
    ------
    KeyError, ValueError, TypeError
        Bad amounts, methods, members or lengths; everything is checked before any
        array is sliced.
    """
    _amount.validate_pruning_amount_init(amount)
    method = resolve_method(method, **method_args)
    for group in groups:
        _check_members(arrays, group)
        _amount.validate_pruning_amount(_amount.compute_nparams_toprune(amount, group.channels), group.channels)
    kept = [
        choose_channels(group_scores(arrays, g, method, importance_scores=importance_scores), amount) for g in groups
    ]
    return Shrunk(take_channels(arrays, groups, kept), kept)
