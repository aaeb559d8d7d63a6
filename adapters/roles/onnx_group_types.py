"""What :func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups` finds in an ONNX graph:
the groups of channels (or heads) and their members, private copies of shared
initializers (:class:`View`), and the layers left with their reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arrayprune.amount import compute_nparams_toprune
from arrayprune.groups import ChannelGroup, Member

__all__ = ["KINDS", "ROUNDINGS", "LeftGroup", "OnnxGroup", "OnnxGroups", "View", "check_rounding", "even_drop"]

#: How a fraction becomes a count of channels: ``"nearest"`` removes
#: ``round(amount * channels)`` (PyTorch's rule, half to even); ``"keep_floor"`` keeps
#: ``int((1 - amount) * channels)`` (Torch-Pruning's rule, computed as it computes it:
#: at 30% it removes one channel more wherever ``0.3 * channels`` has a fraction below 1/2).
ROUNDINGS = ("nearest", "keep_floor")

#: What a group's channels are: layer channels, or attention heads.
KINDS = ("channels", "heads")


def check_rounding(rounding: str) -> None:
    """Refuse a `rounding` that is not one of :data:`ROUNDINGS`."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")


def _drop(amount: int | float, channels: int, rounding: str) -> int:
    if rounding == "keep_floor" and isinstance(amount, float):
        return channels - int((1 - amount) * channels)
    return compute_nparams_toprune(amount, channels)


def even_drop(amount: int | float, channels: int, segments: int = 1, name: str = "", rounding: str = "nearest") -> int:
    """How many of a group's `channels` go when they lie in `segments` equal parts that
    must each lose as many (the groups of a grouped convolution).

    A fraction is taken of each part (``round(amount * channels / segments)`` per part,
    rounded half to even as PyTorch rounds; the total can differ from
    ``round(amount * channels)`` by less than `segments`); a count must be a multiple of
    `segments`.

    Parameters
    ----------
    amount : int or float
        A fraction in ``[0, 1]`` or a count, already validated.
    channels, segments : int
        The group's channels and the parts they lie in.
    name : str, optional
        The group's name, for the error.
    rounding : {"nearest", "keep_floor"}, default "nearest"
        How a fraction becomes a count (:data:`ROUNDINGS`), per part.

    Returns
    -------
    int
        The channels to remove, a multiple of `segments`.

    Raises
    ------
    ValueError
        If a count does not split evenly over the parts.
    """
    if segments == 1:
        return _drop(amount, channels, rounding)
    if isinstance(amount, float):
        return segments * _drop(amount, channels // segments, rounding)
    if amount % segments:
        raise ValueError(
            f"group {name!r}: {amount} of its {channels} channels cannot be removed evenly from "
            f"its {segments} convolution groups (each must lose as many)"
        )
    return int(amount)


@dataclass(frozen=True)
class View:
    """A member that is not an initializer as it is stored.

    Attributes
    ----------
    source : str
        The initializer (or ``Constant`` output) it is read from.
    axis : int
        The axis of `source` that holds the channels (non-negative).
    block : int, default 1
        Entries per channel along `axis`: the member is `source` with that axis split
        into ``[channels, block]`` (the channels on `axis`, the block right after it).
    rewire : tuple of (int, int), optional
        ``(node index, input index)``: `source` is shared (read by other operators too,
        or through ``Identity``), so that operator input reads a private copy instead.
    start : int, default 0
        Where the member's entries begin along `axis` (after a ``Concat``, the channels
        of one of its inputs are a range of the reader's input channels); the member is
        the ``channels * block`` entries from there.
    copy : str, optional
        The name of the private copy (with `rewire`): one per operator input, shared by
        every group that slices it.
    segments : int, default 1
        Above 1, `source` is the weight ``[out, in/segments, k...]`` of a grouped
        ``Conv`` (``group=segments``) and `axis` is 1: the member is the weight
        unfolded to ``[out/segments, in, k...]``, where input channel
        ``j * in/segments + i`` is entry ``i`` of the rows of block ``j``.
    """

    source: str
    axis: int
    block: int = 1
    rewire: tuple[int, int] | None = None
    start: int = 0
    copy: str | None = None
    segments: int = 1


@dataclass(frozen=True)
class OnnxGroup:
    """A channel group of an ONNX model.

    Attributes
    ----------
    group : ChannelGroup
        The members (initializer names, or the keys of :attr:`views`, and axes; weights
        score, biases, per-channel constants and norm statistics do not) and the channel
        count. Its name is the first producer's node name (its output value where the
        node has no name of its own).
    producer : str
        The first producing operator (``"MatMul '/0/l1/MatMul'"``).
    consumers : tuple of str
        The operators whose input channels close the group.
    values : tuple of (str, int, int)
        The activations holding the channels, with their channel axis (negative:
        counted from the end) and block (entries per channel along it), for shape updates.
    depthwise : tuple of int
        Indices (in ``graph.node``) of depthwise convolutions whose ``group`` attribute
        is the channel count, and of ``GroupNormalization`` nodes whose ``num_groups`` is.
    shapes : tuple of (str, int, int)
        Integer constants (initializers, ``Constant`` outputs, or keys of
        :attr:`views` for private copies) that a ``Reshape`` reads as its target shape,
        with the index of the entry that counts the channels and the entries per channel
        (the entry becomes ``channels * factor``).
    producers : tuple of str
        Every producing operator (residual connections join several).
    views : tuple of (str, View)
        Members that are private copies or channel blocks of an initializer, by key.
    closing : tuple of str
        The keys of the members that closing operators read as input channels.
    kind : str
        ``"channels"`` or ``"heads"``.
    segments : int, default 1
        The channels lie in this many equal consecutive parts (the groups of the
        grouped convolutions that make or read them); every part loses as many
        channels, ranked within the part.
    per : int, default 1
        Above 1, each channel of the group is a GroupNorm group of this many consecutive
        layer channels (a norm's channels go only in whole groups): the members hold
        them in blocks of `per`, and an amount counts norm groups.
    """

    group: ChannelGroup
    producer: str
    consumers: tuple[str, ...]
    values: tuple[tuple[str, int, int], ...]
    depthwise: tuple[int, ...] = ()
    shapes: tuple[tuple[str, int, int], ...] = ()
    producers: tuple[str, ...] = ()
    views: tuple[tuple[str, View], ...] = ()
    closing: tuple[str, ...] = ()
    kind: str = "channels"
    segments: int = 1
    per: int = 1

    @property
    def unit(self) -> str:
        """What a channel of the group is, for people: ``"channels"``, ``"heads"``, or
        ``"GroupNorm groups"`` (of :attr:`per` channels each)."""
        if self.per > 1:
            return "GroupNorm groups"
        return "heads" if self.kind == "heads" else "channels"


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
        Its output channels (heads with ``kind="heads"``).
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
        In graph order of their first producers.
    left : list of LeftGroup
        In graph order.
    kind : str
        ``"channels"`` or ``"heads"``.
    """

    groups: list[OnnxGroup] = field(default_factory=list)
    left: list[LeftGroup] = field(default_factory=list)
    kind: str = "channels"

    def describe(self, amount: int | float | None = None, rounding: str = "nearest") -> str:
        """Lines for people: each group with its members, each left producer with its reason.

        Members are ``name[axis]`` (``name[axis/block]`` for blocks of a head; ``from
        start`` where they begin at an entry of that axis after a ``Concat``, or in the
        key and value columns of a fused projection), marked
        ``*`` if they do not score (biases, constants, norm statistics), ``+copy`` where
        the group reads a private copy of a shared initializer. With `amount` (a
        fraction or a count per group, as :func:`~arrayprune.adapters.shrink.shrink_onnx`
        takes it), each group's channels are ``before -> after``.
        """
        unit = "heads" if self.kind == "heads" else "channels"
        lines = []
        for g in self.groups:
            views = dict(g.views)
            members = ", ".join(_shown(m, views) + ("" if m.weight else "*") for m in g.group.members)
            n = g.group.channels
            if amount is None:
                count = f"{n}"
            else:
                count = f"{n} -> {n - even_drop(amount, n, g.segments, g.group.name, rounding)}"
            more = f" + {len(g.producers) - 1} more" if len(g.producers) > 1 else ""
            parts = f" in {g.segments} convolution groups" if g.segments > 1 else ""
            what = f"GroupNorm groups of {g.per} channels" if g.per > 1 else unit
            lines.append(f"group {g.group.name} ({count} {what}{parts}, {g.producer}{more}): {members}")
        for lf in self.left:
            lines.append(f"left {lf.name} ({lf.channels} {unit}, {lf.producer}): {lf.reason}")
        return "\n".join(lines)


def _shown(m: Member, views: dict) -> str:
    """A member for people: ``name[axis]``, ``name[axis/block from start]``, ``+copy`` for a private copy."""
    v = views.get(str(m.key))
    if v is None:
        return f"{m.key}[{m.axis}]"
    block = f"/{v.block}" if v.block > 1 else ""
    block += f" by {v.segments} groups" if v.segments > 1 else ""
    block += f" from {v.start}" if v.start else ""
    return f"{v.source}[{v.axis}{block}]" + ("+copy" if v.rewire else "")
