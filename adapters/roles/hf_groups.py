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

* ``experts`` (:func:`hf_experts`): the experts of a mixture-of-experts layer (Mixtral's
  ``block_sparse_moe``, Qwen2-MoE's and Qwen3-MoE's ``mlp``): the router's rows and each
  expert's tensors (one set per expert, or fused ``[experts, ...]`` tensors) ->
  ``num_local_experts`` or ``num_experts``, whichever key the config holds.
* ``layers`` (:func:`hf_layers`): whole decoder layers -> ``num_hidden_layers`` and every
  per-layer list of the config.

A family is told by the config's ``model_type`` where a row names it, else by the weight
its layers hold (:attr:`Family.marker`). A member is a tensor and the axis holding the
units; that axis is read as consecutive sections, each holding every unit in turn
(``units x rows``): one section for most tensors, two for Phi-3's fused ``gate_up_proj``,
three for its fused ``qkv_proj`` (a KV group has ``heads / kv_heads`` query heads' rows in
the first, one head's rows in the others). The core's
:class:`~arrayprune.groups.ChannelGroup` is made over those sections (:meth:`HfGroup.views`).
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arrayprune.amount import compute_nparams_toprune
from arrayprune.groups import ChannelGroup

__all__ = [
    "FAMILIES",
    "Family",
    "HfExperts",
    "HfGroup",
    "HfGroups",
    "HfGroupsError",
    "HfLayers",
    "HfMember",
    "family_of",
    "hf_experts",
    "hf_groups",
    "hf_layers",
]


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
        The axis holds `outer` sections of equal size, each ``(units, rows)``.
    weight : bool, default True
        Whether it scores (biases do not).
    sections : tuple of int, optional
        Sections of unequal size: the rows of one unit in each (Phi-3's fused
        ``qkv_proj`` with grouped-query attention); `outer` is then ignored.
    """

    key: str
    axis: int
    outer: int = 1
    weight: bool = True
    sections: tuple[int, ...] | None = None


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
        """The core's group of the members as stored (its name and unit count; scoring uses :meth:`group_over`)."""
        return ChannelGroup([(m.key, m.axis, m.weight) for m in self.members], self.units, self.name)

    def rows(self, m: HfMember, shape: Sequence[int]) -> tuple[int, ...]:
        """The rows of one unit in each section of `m`'s axis."""
        if m.sections is not None:
            return m.sections
        return (shape[m.axis] // (m.outer * self.units),) * m.outer

    def parts(self, m: HfMember, shape: Sequence[int]) -> list[str]:
        """The keys of `m`'s sections in :attr:`group` (`m.key` itself for one section)."""
        n = len(self.rows(m, shape))
        return [m.key] if n == 1 else [f"{m.key}#{j}" for j in range(n)]

    def group_over(self, shapes: Mapping[str, Sequence[int]]) -> ChannelGroup:
        """The core's group over the sections of :meth:`views` (each unit axis is the member's)."""
        members = [(key, m.axis, m.weight) for m in self.members for key in self.parts(m, shapes[m.key])]
        return ChannelGroup(members, self.units, self.name)

    def views(self, m: HfMember, a: Any) -> dict[str, Any]:
        """`m`'s array `a` as its sections, each shaped ``(..., units, rows, ...)`` at its axis."""
        rows = self.rows(m, a.shape)
        out, start = {}, 0
        for key, r in zip(self.parts(m, a.shape), rows, strict=True):
            index = [slice(None)] * a.ndim
            index[m.axis] = slice(start, start + r * self.units)
            part = a[tuple(index)]
            out[key] = part.reshape((*a.shape[: m.axis], self.units, r, *a.shape[m.axis + 1 :]))
            start += r * self.units
        return out

    def take(self, m: HfMember, a: Any, kept: Any) -> Any:
        """`m`'s array `a` with only the `kept` units (NumPy), in their order."""
        pieces = []
        for view in self.views(m, a).values():
            part = np.take(view, kept, axis=m.axis)
            pieces.append(part.reshape((*a.shape[: m.axis], -1, *a.shape[m.axis + 1 :])))
        return np.ascontiguousarray(np.concatenate(pieces, axis=m.axis))

    def new_shape(self, m: HfMember, shape: Sequence[int], kept: int) -> tuple[int, ...]:
        """`m`'s stored shape with `kept` units left."""
        out = list(shape)
        out[m.axis] = sum(self.rows(m, shape)) * kept
        return tuple(out)


@dataclass
class HfGroups:
    """The groups of a checkpoint, and what the config says about them.

    Attributes
    ----------
    family : str
        A row of :data:`FAMILIES` (``"llama"``, ``"phi3"``, ``"bert"``, ...).
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

    def check_kept(self, kept: int, hidden: int) -> None:
        """Refuse a number of units the config cannot state (heads that transformers would refuse to load).

        Raises
        ------
        HfGroupsError
            One line, with the counts that would do.
        """
        if self.kind != "heads" or not FAMILIES[self.family].heads_divide_hidden:
            return
        per_kv = self.sizes["num_attention_heads"] // self.sizes["num_key_value_heads"]
        if hidden % (kept * per_kv):
            n = self.sizes["num_key_value_heads"]
            fine = " or ".join(str(k) for k in range(1, n) if hidden % (k * per_kv) == 0) or "all"
            raise HfGroupsError(
                f"--groups heads: {kept * per_kv} attention heads do not divide hidden_size={hidden}, and "
                f"transformers refuses such a {FAMILIES[self.family].label} config whatever its head_dim; keep "
                f"{fine} of the {n} {self.groups[0].unit}"
            )

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
    mlp : tuple or None
        (module prefix under `layer`, the producers, the consumer, whether the producers'
        biases are members whenever the checkpoint holds them (else always)); None where
        the layers hold experts instead of one MLP.
    out_axis, in_axis : int
        The axis of a producer's output channels and of the consumer's input channels in
        their stored weights (GPT-2's ``Conv1D`` stores ``[in, out]``).
    attention : tuple or None
        (module prefix, the producers (q, k, v; or one fused ``qkv_proj``), the consumer
        (o)) where heads can shrink: the config can state the head size (``head_dim``);
        None where transformers derives it from the hidden size.
    model_types : tuple of str
        The config's ``model_type`` values of the family (tried before the markers).
    mlp_outer : int
        Sections of the producers' axis (2: Phi-3's ``gate_up_proj``, gate then up).
    experts : tuple or None
        (module prefix of the sparse block, the router, an expert's prefix with ``{e}``,
        an expert's weights (producers then the consumer)) of a mixture-of-experts family.
    heads_divide_hidden : bool
        transformers refuses a config whose ``hidden_size`` is not a multiple of
        ``num_attention_heads``, whatever ``head_dim`` says (``LlamaConfig``).
    pre_norm : bool
        The MLP's consumer (else the attention's) adds its output to the residual stream
        as it is (normalization before each block, not after): a removed layer's change
        of the stream can be refit into the layer before it. False for BERT's post-norm.
    """

    label: str
    layer: str
    marker: str
    layer_count: str
    hidden: str
    inner: str
    inner_default: int | None
    mlp: tuple[str, tuple[str, ...], str, bool] | None
    out_axis: int = 0
    in_axis: int = 1
    attention: tuple[str, tuple[str, ...], str] | None = None
    model_types: tuple[str, ...] = ()
    mlp_outer: int = 1
    experts: tuple[str, str, str, tuple[str, ...]] | None = None
    heads_divide_hidden: bool = False
    pre_norm: bool = True

    def pattern(self) -> re.Pattern[str]:
        """Matches the marker weight of any layer: groups ``p`` (the model's prefix) and ``i``."""
        return self.layer_pattern(self.marker)

    def layer_pattern(self, tail: str = "") -> re.Pattern[str]:
        """Matches a name under any layer ending in `tail` (anything, if empty): groups ``p`` and ``i``."""
        layer = re.escape(self.layer).replace(re.escape("{i}"), r"(?P<i>\d+)")
        end = re.escape(tail) if tail else ".*"
        return re.compile(rf"^(?P<p>(?:.*\.)?){layer}{end}$")


_LLAMA_MLP = ("mlp.", ("gate_proj", "up_proj"), "down_proj", True)
_LLAMA_ATTENTION = ("self_attn.", ("q_proj", "k_proj", "v_proj"), "o_proj")


def _decoder(label: str, model_types: tuple[str, ...], **overrides: Any) -> Family:
    """A row of a Llama-style decoder (``model.layers.{i}``, ``num_hidden_layers``, ...)."""
    fields: dict[str, Any] = {
        "layer": "layers.{i}.", "marker": "mlp.gate_proj.weight", "layer_count": "num_hidden_layers",
        "hidden": "hidden_size", "inner": "intermediate_size", "inner_default": None, "mlp": _LLAMA_MLP,
        "attention": _LLAMA_ATTENTION, "model_types": model_types,
    }  # fmt: skip
    return Family(label=label, **{**fields, **overrides})


#: The families whose channel groups (and heads, experts, layers) are known, by name. Add
#: a row to support one (a test in ``tests/hf/test_hf_shrink.py`` or
#: ``tests/hf/test_hf_families.py`` on a ``save_pretrained`` folder). Rows naming the
#: config's ``model_type`` are tried first; a checkpoint whose ``model_type`` no row names
#: takes the first row whose marker its layers hold.
FAMILIES: dict[str, Family] = {
    "llama": _decoder("Llama", ("llama",), heads_divide_hidden=True),
    "mistral": _decoder("Mistral", ("mistral",)),
    "qwen2": _decoder("Qwen2", ("qwen2",)),
    "qwen3": _decoder("Qwen3", ("qwen3",)),  # q_norm, k_norm: one scale per head_dim entry, kept
    "gemma": _decoder("Gemma", ("gemma",)),  # head_dim explicit, not hidden / heads
    "phi3": _decoder(
        "Phi-3", ("phi3",), marker="mlp.gate_up_proj.weight", mlp=("mlp.", ("gate_up_proj",), "down_proj", True),
        mlp_outer=2, attention=("self_attn.", ("qkv_proj",), "o_proj"),
    ),
    "mixtral": _decoder(
        "Mixtral", ("mixtral",), marker="block_sparse_moe.gate.weight", mlp=None,
        experts=("block_sparse_moe.", "gate", "experts.{e}.", ("w1", "w3", "w2")),
    ),
    "qwen2_moe": _decoder(
        "Qwen2-MoE", ("qwen2_moe",), marker="mlp.gate.weight", mlp=None,
        experts=("mlp.", "gate", "experts.{e}.", ("gate_proj", "up_proj", "down_proj")),
    ),
    "qwen3_moe": _decoder(
        "Qwen3-MoE", ("qwen3_moe",), marker="mlp.gate.weight", mlp=None,
        experts=("mlp.", "gate", "experts.{e}.", ("gate_proj", "up_proj", "down_proj")),
    ),
    "bert": Family(
        "BERT", "encoder.layer.{i}.", "intermediate.dense.weight", "num_hidden_layers", "hidden_size",
        "intermediate_size", None, ("", ("intermediate.dense",), "output.dense", False), model_types=("bert",),
        pre_norm=False,
    ),
    "gpt2": Family(
        "GPT-2", "h.{i}.", "mlp.c_fc.weight", "n_layer", "n_embd", "n_inner", 4,
        ("mlp.", ("c_fc",), "c_proj", False), out_axis=1, in_axis=0, model_types=("gpt2",),
    ),
}  # fmt: skip


def _int(config: Mapping, key: str, default: Any = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HfGroupsError(f"config.json: {key} is {value!r}, not a positive integer")
    return value


def family_of(config: Mapping[str, Any], names: Sequence[str]) -> tuple[str, str, list[int]]:
    """The family of a checkpoint, the prefix of its layers and the layer indices found.

    The row naming the config's ``model_type`` if its marker is there, else the first row
    whose marker the layers hold.

    Raises
    ------
    HfGroupsError
        If no row's marker is found, or layers sit under several prefixes.
    """
    model_type = config.get("model_type")
    rows = [f for f, row in FAMILIES.items() if model_type in row.model_types]
    rows += [f for f in FAMILIES if f not in rows]
    for family in rows:
        row = FAMILIES[family]
        found = [m for m in map(row.pattern().match, names) if m]
        if found:
            prefixes = {m["p"] for m in found}
            if len(prefixes) > 1:
                raise HfGroupsError(f"layers under several prefixes ({', '.join(sorted(prefixes))}): not one model")
            return family, found[0]["p"], sorted(int(m["i"]) for m in found)
    by_marker: dict[str, list[str]] = {}
    for row in FAMILIES.values():
        by_marker.setdefault(row.marker.removesuffix(".weight"), []).append(row.label)
    known = [f"{', '.join(labels)} ({marker})" for marker, labels in by_marker.items()]
    raise HfGroupsError(
        f"no {', '.join(known[:-1])} or {known[-1]} layers in the checkpoint: its channel groups are not known"
    )


def _members(family: str, kind: str, p: str, i: int, shapes: Mapping[str, Any], sizes: Mapping) -> list[HfMember]:
    """A layer's group: the producers' weights, the consumer's weight, the producers' biases."""
    row = FAMILIES[family]
    outer = 1
    sections: tuple[int, ...] | None = None
    if kind == "channels":
        module, producers, consumer, optional_biases = row.mlp or ("", (), "", True)
        out_axis, in_axis, outer = row.out_axis, row.in_axis, row.mlp_outer
    else:
        module, producers, consumer = row.attention or ("", (), "")
        optional_biases, out_axis, in_axis = True, 0, 1
        if len(producers) == 1:  # q, k and v fused: a KV group's rows in each of the three sections
            hd, per_kv = sizes["head_dim"], sizes["num_attention_heads"] // sizes["num_key_value_heads"]
            sections = (per_kv * hd, hd, hd)
    base = f"{p}{row.layer.format(i=i)}{module}"
    members = [HfMember(f"{base}{n}.weight", out_axis, outer, sections=sections) for n in producers]
    members.append(HfMember(f"{base}{consumer}.weight", in_axis))
    biases = [f"{base}{n}.bias" for n in producers]
    members += [
        HfMember(b, 0, outer, weight=False, sections=sections) for b in biases if not optional_biases or b in shapes
    ]
    return members


def _expected(family: str, kind: str, m: HfMember, sizes: Mapping[str, int], hidden: int) -> tuple[int, ...]:
    """The shape `m` must have."""
    leaf = m.key.rsplit(".", 2)[-2]
    if kind == "channels":
        n = sizes[FAMILIES[family].inner] * m.outer
        if m.key.endswith(".bias"):
            return (n,)
        return (n, hidden) if m.axis == 0 else (hidden, n)
    hd = sizes["head_dim"]
    q, kv = sizes["num_attention_heads"] * hd, sizes["num_key_value_heads"] * hd
    rows = {"q_proj": q, "o_proj": q, "qkv_proj": q + 2 * kv}.get(leaf, kv)
    if m.key.endswith(".bias"):
        return (rows,)
    return (hidden, rows) if leaf == "o_proj" else (rows, hidden)


def _head_sizes(config: Mapping[str, Any], hidden: int) -> dict[str, int]:
    heads = _int(config, "num_attention_heads")
    kv = _int(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
    hd = config.get("head_dim") or hidden // heads
    if heads % kv:
        raise HfGroupsError(f"config.json: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    return {"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": _int({"head_dim": hd}, "head_dim")}


def _check_layers(row: Family, config: Mapping[str, Any], layers: Sequence[int], what: str) -> int:
    count = _int(config, row.layer_count)
    if list(layers) != list(range(count)):
        raise HfGroupsError(
            f"config.json has {row.layer_count}={count} but the checkpoint holds the layers {_ranges(layers)}: "
            f"{what}"
        )
    return count


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
        or of a shape the config does not give, heads of BERT or GPT-2, channels of a
        mixture of experts; one line.
    """
    if kind not in ("channels", "heads"):
        raise HfGroupsError(f"unknown group kind {kind!r}; expected channels or heads")
    names = sorted(shapes)
    family, prefix, layers = family_of(config, names)
    row = FAMILIES[family]
    if kind == "heads" and row.attention is not None:  # every layer has attention, not every one the marker
        module, producers, _ = row.attention
        pattern = row.layer_pattern(f"{module}{producers[0]}.weight")
        layers = sorted({int(m["i"]) for m in map(pattern.match, names) if m and m["p"] == prefix})
    _check_layers(row, config, layers, "every layer must shrink by the same count")
    hidden = _int(config, row.hidden)
    unit = "channels"
    if kind == "channels":
        if row.mlp is None:
            raise HfGroupsError(
                f"--groups channels: {row.label} layers hold experts, not one MLP; remove whole experts "
                "(--groups experts), heads or layers"
            )
        if row.inner_default is not None and config.get(row.inner) is None:
            sizes = {row.inner: row.inner_default * hidden}
        else:
            sizes = {row.inner: _int(config, row.inner)}
    else:
        if row.attention is None:
            raise HfGroupsError(
                f"--groups heads: transformers derives {row.label}'s head size from the hidden size / the number of "
                "heads, so a config with fewer heads cannot be loaded; heads shrink in Llama-style attention "
                "(q_proj, k_proj, v_proj, o_proj, with an explicit head_dim)"
            )
        sizes = _head_sizes(config, hidden)
        unit = "KV groups" if sizes["num_key_value_heads"] < sizes["num_attention_heads"] else "heads"
    found = HfGroups(family, kind, sizes=sizes)
    for i in layers:
        members = _members(family, kind, prefix, i, shapes, sizes)
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


@dataclass
class HfExperts:
    """The experts of each mixture-of-experts layer of a checkpoint.

    Attributes
    ----------
    family : str
        The row of :data:`FAMILIES`.
    count_key : str
        The config key holding the number of experts (``num_local_experts`` or ``num_experts``).
    top_k : int
        ``num_experts_per_tok``.
    units : int
        Experts per layer.
    layers : dict of int to str
        Layer index -> the sparse block's name (``model.layers.3.block_sparse_moe``).
    routers : dict of int to str
        Layer index -> the router's weight (``[experts, hidden]``).
    experts : dict of int to list of list of str
        Layer index -> per expert, its tensors (empty lists when the experts are fused).
    fused : dict of int to list of str
        Layer index -> the fused tensors (``[experts, ...]``), empty when per expert.
    """

    family: str
    count_key: str
    top_k: int
    units: int
    layers: dict[int, str] = field(default_factory=dict)
    routers: dict[int, str] = field(default_factory=dict)
    experts: dict[int, list[list[str]]] = field(default_factory=dict)
    fused: dict[int, list[str]] = field(default_factory=dict)

    def renamed(self, names: Sequence[str], kept: Mapping[int, Sequence[int]]) -> dict[str, str | None]:
        """Every name -> its name after the experts not in ``kept[layer]`` go (None: dropped)."""
        out: dict[str, str | None] = {n: n for n in names}
        for i, per_expert in self.experts.items():
            index = {int(e): j for j, e in enumerate(kept[i])}
            template = FAMILIES[self.family].experts[2]  # type: ignore[index]
            for e, keys in enumerate(per_expert):
                old = f"{self.layers[i]}.{template.format(e=e)}"
                new = f"{self.layers[i]}.{template.format(e=index[e])}" if e in index else None
                for key in keys:
                    out[key] = None if new is None else new + key[len(old) :]
        return out

    def describe(self, amount: int | float | None = None) -> str:
        """One line per layer: its experts before (and after the amount)."""
        n = self.units
        count = f"{n}" if amount is None else f"{n} -> {n - compute_nparams_toprune(amount, n)}"
        lines = [f"experts {name} ({count} experts): router {self.routers[i]}" for i, name in self.layers.items()]
        return "\n".join(lines)


def hf_experts(config: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> HfExperts:
    """The experts of a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE).

    Layers without a router (Qwen-MoE's ``mlp_only_layers``) have no experts and are left.

    Raises
    ------
    HfGroupsError
        For a family without experts, a config without the count of experts, a missing
        expert tensor or a router of another shape; one line.
    """
    names = sorted(shapes)
    family, prefix, layers = family_of(config, names)
    row = FAMILIES[family]
    if row.experts is None:
        raise HfGroupsError(f"--groups experts: {row.label} layers hold no experts (Mixtral, Qwen2-MoE, Qwen3-MoE do)")
    module, router, template, weights = row.experts
    count_key = next((k for k in ("num_local_experts", "num_experts") if config.get(k) is not None), None)
    if count_key is None:
        raise HfGroupsError("config.json holds neither num_local_experts nor num_experts")
    units, top_k, hidden = _int(config, count_key), _int(config, "num_experts_per_tok"), _int(config, row.hidden)
    found = HfExperts(family, count_key, top_k, units)
    for i in layers:
        block = f"{prefix}{row.layer.format(i=i)}{module}".rstrip(".")
        gate = f"{block}.{router}.weight"
        if tuple(shapes[gate]) != (units, hidden):
            raise HfGroupsError(f"{gate!r} has shape {tuple(shapes[gate])}, not {(units, hidden)} as config.json gives")
        found.layers[i], found.routers[i] = block, gate
        fused = sorted(n for n in names if n.startswith(f"{block}.experts.") and n.count(".") == block.count(".") + 2)
        if fused:
            for n in fused:
                if not shapes[n] or shapes[n][0] != units:
                    raise HfGroupsError(f"{n!r} has shape {tuple(shapes[n])}: fused experts hold {units} first")
            found.fused[i], found.experts[i] = fused, []
            continue
        per: list[list[str]] = []
        for e in range(units):
            base = f"{block}.{template.format(e=e)}"
            keys = sorted(n for n in names if n.startswith(base))
            missing = [w for w in weights if f"{base}{w}.weight" not in shapes]
            if missing:
                key = f"{base}{missing[0]}.weight"
                raise HfGroupsError(f"layer {i}: no tensor {key!r} (a {family} expert holds it)")
            per.append(keys)
        found.experts[i], found.fused[i] = per, []
    return found


#: Config keys listing layer indices (renumbered when layers go). Lists of one value per
#: layer (``layer_types``, sliding-window lists: a key naming layers or windows, as long as
#: the layer count) are cut to the layers kept.
LAYER_INDEX_LISTS = ("mlp_only_layers",)


@dataclass
class HfLayers:
    """The decoder layers of a checkpoint.

    Attributes
    ----------
    family : str
    count_key : str
        ``num_hidden_layers`` (GPT-2: ``n_layer``).
    names : list of str
        Layer index -> its prefix (``model.layers.3``).
    """

    family: str
    count_key: str
    names: list[str] = field(default_factory=list)

    @property
    def units(self) -> int:
        """The number of layers."""
        return len(self.names)

    def renamed(self, names: Sequence[str], kept: Sequence[int]) -> dict[str, str | None]:
        """Every name -> its name with the layers not in `kept` gone and the others renumbered."""
        index = {int(i): j for j, i in enumerate(kept)}
        pattern = re.compile("^(" + "|".join(re.escape(n) for n in self.names) + r")\.")
        by_name = {n: i for i, n in enumerate(self.names)}
        new_prefix = {i: self.names[0].rsplit(".", 1)[0] + f".{j}" for i, j in index.items()}
        out: dict[str, str | None] = {}
        for n in names:
            m = pattern.match(n)
            if m is None:
                out[n] = n
                continue
            i = by_name[m[1]]
            out[n] = None if i not in index else new_prefix[i] + n[len(m[1]) :]
        return out

    def config_updates(self, config: Mapping[str, Any], kept: Sequence[int]) -> dict[str, Any]:
        """The config fields to write: the count, every per-layer list cut to the layers kept,
        lists of layer indices renumbered (Qwen-MoE's dense layers: ``decoder_sparse_step``
        becomes ``mlp_only_layers``).

        Raises
        ------
        HfGroupsError
            For a per-layer setting that cannot be rewritten.
        """
        n, kept = self.units, [int(i) for i in kept]
        out: dict[str, Any] = {self.count_key: len(kept)}
        for key, value in config.items():
            per_layer = "layer" in key or "window" in key
            if isinstance(value, list) and len(value) == n and per_layer and key not in LAYER_INDEX_LISTS:
                out[key] = [value[i] for i in kept]
        step = config.get("decoder_sparse_step")
        if isinstance(step, int) and step > 1 or config.get("mlp_only_layers"):
            dense = set(config.get("mlp_only_layers") or [])
            if isinstance(step, int) and step > 1:
                dense |= {i for i in range(n) if (i + 1) % step}
                out["decoder_sparse_step"] = 1
            out["mlp_only_layers"] = [j for j, i in enumerate(kept) if i in dense]
        if isinstance(config.get("max_window_layers"), int) and "layer_types" not in config:
            if config.get("use_sliding_window"):
                raise HfGroupsError(
                    "--groups layers: config.json sets use_sliding_window by max_window_layers without layer_types; "
                    "the layers' kinds cannot be rewritten"
                )
        return out

    def writer(self, index: int) -> tuple[str, int, bool] | None:
        """The weight through which layer `index` last adds to the residual stream.

        Returns its name, its input axis, and whether it is the last thing before the
        residual add (the MLP's consumer: ``down_proj``, GPT-2's ``c_proj``) or the
        attention's (``o_proj``, where the layers hold experts, which read the stream
        after it); None for a post-norm family (BERT).
        """
        row = FAMILIES[self.family]
        if not row.pre_norm:
            return None
        if row.mlp is not None:
            return f"{self.names[index]}.{row.mlp[0]}{row.mlp[2]}.weight", row.in_axis, True
        if row.attention is not None:
            return f"{self.names[index]}.{row.attention[0]}{row.attention[2]}.weight", 1, False
        return None

    def checked(self, layers: Iterable[int]) -> set[int]:
        """Those of `layers` whose :meth:`writer` should be the last thing before the
        residual add (an MLP's consumer), which a refit checks first."""
        return {p for p in layers if (w := self.writer(p)) is not None and w[2]}

    def absorbers(
        self, kept: Sequence[int], stored: Container[str]
    ) -> tuple[dict[int, str], dict[str, list[int]]]:
        """Where each run of removed layers is refit: the kept layer before it and its :meth:`writer`.

        Returns ``{p: weight name}`` for each kept layer ``p`` right before a run, and
        ``{weight name: the layers of its run}``. A run at the start of the model, or
        whose layer before has no writer in `stored` (the checkpoint's names), is in neither.
        """
        writers: dict[int, str] = {}
        runs: dict[str, list[int]] = {}
        for i in (i for i in range(self.units) if i not in kept):
            p = next((j for j in range(i - 1, -1, -1) if j in kept), None)
            found = None if p is None else self.writer(p)
            if p is not None and found is not None and found[0] in stored:
                writers[p] = found[0]
                runs.setdefault(found[0], []).append(i)
        return writers, runs

    def describe(self, amount: int | float | None = None) -> str:
        """One line: the layers, before (and after the amount)."""
        n = self.units
        count = f"{n}" if amount is None else f"{n} -> {n - compute_nparams_toprune(amount, n)}"
        return f"layers {self.names[0].rsplit('.', 1)[0]} ({count} layers)"


def hf_layers(config: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> HfLayers:
    """The decoder layers of a checkpoint.

    Raises
    ------
    HfGroupsError
        For a family not known, or layers that are not those of the config.
    """
    names = sorted(shapes)
    family, prefix, _ = family_of(config, names)
    row = FAMILIES[family]
    pattern = row.layer_pattern()
    layers = sorted({int(m["i"]) for m in map(pattern.match, names) if m and m["p"] == prefix})
    _check_layers(row, config, layers, "layers are removed from a checkpoint holding all of them")
    base = prefix + row.layer.split("{i}")[0]
    return HfLayers(family, row.layer_count, [f"{base}{i}" for i in layers])


def _ranges(layers: Sequence[int]) -> str:
    if not layers:
        return "none"
    shown = ", ".join(map(str, layers[:8]))
    return shown + (", ..." if len(layers) > 8 else "") + f" ({len(layers)} in all)"
