"""Channel groups of Hugging Face checkpoints, from tensor names and ``config.json``.

A Hugging Face config holds one size for all layers (``intermediate_size``,
``num_attention_heads``), so every layer has one group of each kind and every layer
loses the same number of units. Two kinds (``--groups``):

* ``channels``: the hidden channels of each layer's MLP. Llama, Mistral, Qwen2 and
  their kin: ``mlp.gate_proj`` and ``mlp.up_proj`` rows (and biases, with ``mlp_bias``),
  ``mlp.down_proj`` columns -> ``intermediate_size``. BERT and its kin:
  ``intermediate.dense`` rows and bias, ``output.dense`` columns ->
  ``intermediate_size``. GPT-2: ``mlp.c_fc`` columns and bias, ``mlp.c_proj`` rows
  (``Conv1D`` stores ``[in, out]``) -> ``n_inner``.
* ``heads``: whole attention heads of Llama-style attention: ``q_proj``, ``k_proj``,
  ``v_proj`` rows (and biases, as Qwen2 has), ``o_proj`` columns. With grouped-query
  attention the unit is a KV group: one key/value head and the query heads that read it
  (query head ``j`` reads KV head ``j // (heads / kv_heads)``) ->
  ``num_attention_heads``, ``num_key_value_heads`` and an explicit ``head_dim``. BERT
  and GPT-2 are refused: ``transformers`` derives their head size from
  ``hidden_size / num_attention_heads``, so a config with fewer heads of the same size
  cannot be written.

A member is a tensor and the axis holding the units; that axis is read as
``(outer, units, inner)``: ``outer`` is 3 where q, k and v sit side by side in one
tensor, ``inner`` the entries of a unit along the axis (a KV group's rows). The core's
:class:`~arrayprune.groups.ChannelGroup` is made over that view (:meth:`HfGroup.view`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arrayprune.amount import compute_nparams_toprune
from arrayprune.groups import ChannelGroup

__all__ = ["FAMILIES", "Family", "HfGroup", "HfGroups", "HfGroupsError", "HfMember", "hf_groups"]


class HfGroupsError(ValueError):
    """A checkpoint whose groups cannot be read or shrunk: the reason, one line."""


@dataclass(frozen=True)
class HfMember:
    """One tensor of a group.

    Attributes
    ----------
    key : str
        The tensor's name.
    axis : int
        The stored axis holding the units (non-negative).
    outer : int, default 1
        The axis is read as ``(outer, units, inner)``.
    weight : bool, default True
        Whether it scores (biases do not).
    """

    key: str
    axis: int
    outer: int = 1
    weight: bool = True


@dataclass(frozen=True)
class HfGroup:
    """One layer's group: its members, how many units it has, and what they are.

    Attributes
    ----------
    name : str
        ``model.layers.3.mlp``, ``model.layers.3.self_attn``, ...
    members : tuple of HfMember
    units : int
        Channels, or KV groups.
    unit : str
        ``"channels"`` or ``"KV groups"`` (``"heads"`` without grouped-query attention).
    """

    name: str
    members: tuple[HfMember, ...]
    units: int
    unit: str = "channels"

    @property
    def group(self) -> ChannelGroup:
        """The core's group over the views of :meth:`view` (the unit axis is ``axis + 1``)."""
        return ChannelGroup([(m.key, m.axis + 1, m.weight) for m in self.members], self.units, self.name)

    def view(self, m: HfMember, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape in which `m`'s stored shape shows the units on axis ``m.axis + 1``."""
        shape = tuple(shape)
        inner = shape[m.axis] // (m.outer * self.units)
        return (*shape[: m.axis], m.outer, self.units, inner, *shape[m.axis + 1 :])

    def new_shape(self, m: HfMember, shape: Sequence[int], kept: int) -> tuple[int, ...]:
        """`m`'s stored shape with `kept` units left."""
        shape = list(shape)
        shape[m.axis] = shape[m.axis] // self.units * kept
        return tuple(shape)


@dataclass
class HfGroups:
    """The groups of a checkpoint, and what the config says about them.

    Attributes
    ----------
    family : str
        ``"llama"`` (Llama, Mistral, Qwen2 naming), ``"bert"`` or ``"gpt2"``.
    kind : str
        ``"channels"`` or ``"heads"``.
    groups : list of HfGroup
        One per layer, in layer order.
    left : list
        Always empty: every layer of the config has its group, or nothing is done.
    sizes : dict
        The config fields the groups set, as they are.
    """

    family: str
    kind: str
    groups: list[HfGroup] = field(default_factory=list)
    left: list[Any] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)

    def config_updates(self, kept: int) -> dict[str, int]:
        """The config fields to write when every group keeps `kept` units."""
        if self.kind == "channels":
            return {FAMILIES[self.family].inner: kept}
        per_kv = self.sizes["num_attention_heads"] // self.sizes["num_key_value_heads"]
        return {
            "num_attention_heads": kept * per_kv,
            "num_key_value_heads": kept,
            "head_dim": self.sizes["head_dim"],
        }

    def describe(self, amount: int | float | None = None) -> str:
        """One line per group: its members (``name[axis]``, ``*`` if it does not score) and units."""
        lines = []
        for g in self.groups:
            members = ", ".join(f"{m.key}[{m.axis}]" + ("" if m.weight else "*") for m in g.members)
            n = g.units
            count = f"{n}" if amount is None else f"{n} -> {n - compute_nparams_toprune(amount, n)}"
            lines.append(f"group {g.name} ({count} {g.unit}): {members}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Family:
    """One row of :data:`FAMILIES`: how a Hugging Face model family names and sizes its layers.

    Attributes
    ----------
    label : str
        The family as messages name it.
    layer : str
        A layer's prefix after the model's own, with ``{i}`` for its index.
    marker : str
        The weight (under `layer`) whose presence tells the family.
    layer_count, hidden, inner : str
        The ``config.json`` keys of the number of layers, the hidden size and the MLP's
        inner size (the channels).
    inner_default : int or None
        The inner size as a multiple of the hidden size when the config leaves it null.
    mlp : tuple
        (module prefix under `layer`, the producers, the consumer, whether the producers'
        biases are members whenever the checkpoint holds them (else always)).
    out_axis, in_axis : int
        The axis of a producer's output channels and of the consumer's input channels in
        their stored weights (GPT-2's ``Conv1D`` stores ``[in, out]``).
    attention : tuple or None
        (module prefix, the producers (q, k, v), the consumer (o)) where heads can
        shrink: the config can state the head size (``head_dim``); None where
        transformers derives it from the hidden size.
    """

    label: str
    layer: str
    marker: str
    layer_count: str
    hidden: str
    inner: str
    inner_default: int | None
    mlp: tuple[str, tuple[str, ...], str, bool]
    out_axis: int = 0
    in_axis: int = 1
    attention: tuple[str, tuple[str, ...], str] | None = None

    def pattern(self) -> re.Pattern[str]:
        """Matches the marker weight of any layer: groups ``p`` (the model's prefix) and ``i``."""
        layer = re.escape(self.layer).replace(re.escape("{i}"), r"(?P<i>\d+)")
        return re.compile(rf"^(?P<p>(?:.*\.)?){layer}{re.escape(self.marker)}$")


#: The families whose channel groups (and heads) are known, by name. Add a row to
#: support one (a test in ``tests/hf/test_hf_shrink.py`` on a ``save_pretrained`` folder).
FAMILIES: dict[str, Family] = {
    "llama": Family(
        "Llama/Mistral/Qwen2", "layers.{i}.", "mlp.gate_proj.weight", "num_hidden_layers", "hidden_size",
        "intermediate_size", None, ("mlp.", ("gate_proj", "up_proj"), "down_proj", True),
        attention=("self_attn.", ("q_proj", "k_proj", "v_proj"), "o_proj"),
    ),
    "bert": Family(
        "BERT", "encoder.layer.{i}.", "intermediate.dense.weight", "num_hidden_layers", "hidden_size",
        "intermediate_size", None, ("", ("intermediate.dense",), "output.dense", False),
    ),
    "gpt2": Family(
        "GPT-2", "h.{i}.", "mlp.c_fc.weight", "n_layer", "n_embd", "n_inner", 4,
        ("mlp.", ("c_fc",), "c_proj", False), out_axis=1, in_axis=0,
    ),
}  # fmt: skip


def _int(config: Mapping, key: str, default: Any = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HfGroupsError(f"config.json: {key} is {value!r}, not a positive integer")
    return value


def _family(names: Sequence[str]) -> tuple[str, str, list[int]]:
    """The family, the prefix of its layers and the layer indices found."""
    for family, row in FAMILIES.items():
        found = [m for m in map(row.pattern().match, names) if m]
        if found:
            prefixes = {m["p"] for m in found}
            if len(prefixes) > 1:
                raise HfGroupsError(f"layers under several prefixes ({', '.join(sorted(prefixes))}): not one model")
            return family, found[0]["p"], sorted(int(m["i"]) for m in found)
    known = [f"{row.label} ({row.marker.removesuffix('.weight')})" for row in FAMILIES.values()]
    raise HfGroupsError(
        f"no {', '.join(known[:-1])} or {known[-1]} layers in the checkpoint: its channel groups are not known"
    )


def _members(family: str, kind: str, p: str, i: int, shapes: Mapping[str, Any]) -> list[HfMember]:
    """A layer's group: the producers' weights, the consumer's weight, the producers' biases."""
    row = FAMILIES[family]
    if kind == "channels":
        module, producers, consumer, optional_biases = row.mlp
        out_axis, in_axis = row.out_axis, row.in_axis
    else:
        module, producers, consumer = row.attention or ("", (), "")
        optional_biases, out_axis, in_axis = True, 0, 1
    base = f"{p}{row.layer.format(i=i)}{module}"
    members = [HfMember(f"{base}{n}.weight", out_axis) for n in producers] + [
        HfMember(f"{base}{consumer}.weight", in_axis)
    ]
    biases = [f"{base}{n}.bias" for n in producers]
    members += [HfMember(b, 0, weight=False) for b in biases if not optional_biases or b in shapes]
    return members


def _expected(family: str, kind: str, m: HfMember, sizes: Mapping[str, int], hidden: int) -> tuple[int, ...]:
    """The shape `m` must have."""
    leaf = m.key.rsplit(".", 2)[-2]
    if kind == "channels":
        n = sizes[FAMILIES[family].inner]
        if m.key.endswith(".bias"):
            return (n,)
        return (n, hidden) if m.axis == 0 else (hidden, n)
    hd = sizes["head_dim"]
    rows = sizes["num_attention_heads"] * hd if leaf in ("q_proj", "o_proj") else sizes["num_key_value_heads"] * hd
    if m.key.endswith(".bias"):
        return (rows,)
    return (hidden, rows) if leaf == "o_proj" else (rows, hidden)


def hf_groups(config: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], kind: str = "channels") -> HfGroups:
    """The groups of a checkpoint: one per layer.

    Parameters
    ----------
    config : mapping
        The checkpoint's ``config.json``.
    shapes : mapping
        Every tensor's name and shape.
    kind : {"channels", "heads"}
        MLP channels, or attention heads (KV groups).

    Returns
    -------
    HfGroups

    Raises
    ------
    HfGroupsError
        For a checkpoint whose layers are not known, a layer missing, a member missing
        or of a shape the config does not give, or heads of BERT or GPT-2; one line.
    """
    if kind not in ("channels", "heads"):
        raise HfGroupsError(f"unknown group kind {kind!r}; expected channels or heads")
    names = sorted(shapes)
    family, prefix, layers = _family(names)
    row = FAMILIES[family]
    count = _int(config, row.layer_count)
    if layers != list(range(count)):
        raise HfGroupsError(
            f"config.json has {row.layer_count}={count} but the checkpoint holds the layers {_ranges(layers)}: "
            "every layer must shrink by the same count"
        )
    hidden = _int(config, row.hidden)
    if row.inner_default is not None and config.get(row.inner) is None:
        sizes = {row.inner: row.inner_default * hidden}
    else:
        sizes = {row.inner: _int(config, row.inner)}
    unit = "channels"
    if kind == "heads":
        if row.attention is None:
            what = row.label
            raise HfGroupsError(
                f"--groups heads: transformers derives {what}'s head size from the hidden size / the number of "
                "heads, so a config with fewer heads cannot be loaded; heads shrink in Llama-style attention "
                "(q_proj, k_proj, v_proj, o_proj, with an explicit head_dim)"
            )
        heads = _int(config, "num_attention_heads")
        kv = _int(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
        hd = config.get("head_dim") or hidden // heads
        if heads % kv:
            raise HfGroupsError(
                f"config.json: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}"
            )
        sizes = {
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": _int({"head_dim": hd}, "head_dim"),
        }
        unit = "KV groups" if kv < heads else "heads"
    found = HfGroups(family, kind, sizes=sizes)
    for i in layers:
        members = _members(family, kind, prefix, i, shapes)
        for m in members:
            if m.key not in shapes:
                raise HfGroupsError(f"layer {i}: no tensor {m.key!r} (a {family} layer holds it)")
            want, got = _expected(family, kind, m, sizes, hidden), tuple(shapes[m.key])
            if got != want:
                raise HfGroupsError(f"{m.key!r} has shape {got}, not {want} as config.json gives")
        units = sizes["num_key_value_heads"] if kind == "heads" else next(iter(sizes.values()))
        name = members[0].key.rsplit(".", 2)[0]
        found.groups.append(HfGroup(name, tuple(members), units, unit))
    return found


def _ranges(layers: Sequence[int]) -> str:
    if not layers:
        return "none"
    shown = ", ".join(map(str, layers[:8]))
    return shown + (", ..." if len(layers) > 8 else "") + f" ({len(layers)} in all)"
