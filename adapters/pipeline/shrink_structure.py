"""Structured pruning of a Hugging Face checkpoint on calibration data: layers, experts, calibrated units.

``arrayprune prune FOLDER -o OUT --shrink`` with

* ``--groups layers --calibration tokens.npz``: whole decoder layers removed, those whose
  residual-stream change ``1 - cosine(input, output)`` (averaged over the calibration
  tokens, the dense model's activations) is smallest; the other layers' tensors renamed
  to consecutive indices; ``num_hidden_layers`` and every per-layer list of
  ``config.json`` (``layer_types``, sliding-window lists, Qwen-MoE's ``mlp_only_layers``)
  rewritten;
* ``--groups experts``: experts of every mixture-of-experts layer removed, those the
  router uses least on the calibration tokens (``--calibration``: the routing weight an
  expert gets per token, frequency x mean weight), or without calibration those of
  smallest L2 norm; the router's rows, the experts' tensors (renumbered, or sliced when
  fused) and ``num_local_experts`` / ``num_experts`` (the key the config holds)
  rewritten; ``num_experts_per_tok`` must stay at most the experts kept;
* ``--groups channels|heads --method activation_structured|obs_structured
  --calibration tokens.npz``: units scored on the inputs of the layer that reads them
  (:mod:`arrayprune.structured`), layer after layer on the model already pruned, and that
  layer refit on the kept columns (``W'_K = W Hd[:, K] Hd[K, K]^-1``) unless
  ``--no-compensate``.

The statistics come from :mod:`~arrayprune.adapters.pipeline.hf_structure` (one layer's
weights in memory at a time); the checkpoint is then written tensor by tensor
(:meth:`~arrayprune.adapters.formats.sharded.ShardedCheckpoint.write`), refit
consumers read back from a temporary folder beside the output. ``--dry-run`` lists the
units with their scores and those that would go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune
from arrayprune import amount as _amount
from arrayprune.adapters import provenance
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.errors import write_failure
from arrayprune.adapters.formats.safetensors_stream import StoredTensor, TensorFiles, TensorWriter
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.hf_calibration import _stored, hf_folder, workdir_beside
from arrayprune.adapters.pipeline.hf_structure import LayerWalk, calibrated_units, layer_changes, router_statistics
from arrayprune.adapters.pipeline.job import ShrinkJob
from arrayprune.adapters.pipeline.method_names import unit_methods
from arrayprune.adapters.pipeline.prune_result import PruneResult, ShrinkResult, shrink_notes
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.shrink_checkpoint import (
    _widened,
    open_hf,
    plan_checkpoint_shrink,
    run_checkpoint_shrink,
)
from arrayprune.adapters.provenance import KEY
from arrayprune.adapters.roles.hf_config import CONFIG_NAME, config_bytes
from arrayprune.adapters.roles.hf_groups import (
    FAMILIES,
    HfExperts,
    HfGroups,
    HfGroupsError,
    HfLayers,
    hf_experts,
    hf_groups,
    hf_layers,
)
from arrayprune.adapters.summary import PruneSummary, Totals
from arrayprune.groups import choose_channels
from arrayprune.structured import expert_scores
from arrayprune.structured_methods import UnitPruningMethod

__all__ = [
    "StructureShrink",
    "UnitReport",
    "UnitScores",
    "check_hf_shrink",
    "decide_units",
    "shrink_errors",
    "walk_arguments",
    "run_hf_shrink",
    "shrink_calibrated",
    "shrink_experts",
    "shrink_layers",
]


@dataclass(frozen=True)
class _Named:
    name: str
    channels: int


@dataclass(frozen=True)
class _Unitset:
    """A set of units as the command's summary lists it (``g.group.name``, ``g.group.channels``, ``g.unit``)."""

    group: _Named
    unit: str


@dataclass
class UnitReport:
    """The units of a structured shrink, their scores and those that go: ``ShrinkResult.groups``.

    Attributes
    ----------
    kind : str
        ``"layers"``, ``"experts"``, ``"channels"`` or ``"heads"``.
    groups : list
        One entry per set of units (all layers; each layer's experts or group).
    scores : dict of str to ndarray
        Per set, each unit's score (higher is kept).
    what : str
        How the units were scored.
    left : list
        Always empty.
    """

    kind: str
    groups: list[_Unitset]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    what: str = ""
    left: list[Any] = field(default_factory=list)

    def describe(self, amount: int | float | None = None) -> str:
        """Per set: units before and after, each unit's score, and the units that would go."""
        lines = [f"scores: {self.what}"] if self.what else []
        for g in self.groups:
            n = g.group.channels
            k = None if amount is None else _amount.compute_nparams_toprune(amount, n)
            count = f"{n}" if k is None else f"{n} -> {n - k}"
            lines.append(f"{g.unit} {g.group.name} ({count} {g.unit})")
            scores = self.scores.get(g.group.name)
            if scores is None:
                continue
            lines.append("  " + " ".join(f"{i}:{s:.4g}" for i, s in enumerate(scores)))
            if k and amount is not None:
                kept = set(np.asarray(choose_channels(np.asarray(scores), amount)).tolist())
                lines.append(f"  removed: {', '.join(str(i) for i in range(n) if i not in kept)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StructureShrink:
    """What a structured shrink did.

    Attributes
    ----------
    report : UnitReport
        The units and their scores.
    kept : dict of str to list of int
        Per set of units, those kept, ascending.
    params_before, params_after : int
    config : dict
        The config fields written.
    files : list of str
        The files written.
    left : list of str
        Files of the folder not copied, with the reason.
    """

    report: UnitReport
    kept: dict[str, list[int]]
    params_before: int
    params_after: int
    config: dict[str, Any]
    files: list[str]
    left: list[str]


@dataclass(frozen=True)
class UnitScores:
    """What calibration data say of a shrink job's units: the calibrate stage's answer.

    Attributes
    ----------
    statistic : str
        ``"residual_change"`` (layers), ``"router_statistics"`` (experts) or
        ``"unit_hessians"`` (channels or heads of a calibrated structured method, decided
        layer after layer on the model already pruned).
    found : HfLayers, HfExperts or HfGroups
        The units of the checkpoint.
    scores : ndarray or dict
        Layers: one score per layer; experts: per MoE layer index; units: per group name.
    kept : dict of str to ndarray, optional
        Calibrated units: the units each group keeps, decided while calibrating.
    saved : dict of str to str, optional
        Calibrated units with an amount: each refit consumer's weight (``.npy``, float64
        ``[out, in]``, dropped columns zero), in a folder beside the output that lives as
        long as the calibrate stage's exit stack.
    """

    statistic: str
    found: Any
    scores: Any
    kept: dict[str, np.ndarray] | None = None
    saved: dict[str, str] | None = None


def _count_kept(amount: int | float, units: int, what: str) -> int:
    _amount.validate_pruning_amount_init(amount)
    k = _amount.compute_nparams_toprune(amount, units)
    _amount.validate_pruning_amount(k, units)
    if k >= units:
        raise HfGroupsError(f"amount {amount} would remove every one of the {units} {what}")
    return units - k


def _walk(ckpt: Any, calibration: str, rows: int | None, device: Any) -> LayerWalk:
    folder = hf_folder(ckpt.folder)
    if folder is None:
        raise HfGroupsError("config.json is missing")
    return LayerWalk(ckpt, folder, calibration, rows, device)


def _index_bytes(ckpt: sharded.ShardedCheckpoint, tensors: Mapping[str, StoredTensor], shard_of: Mapping) -> bytes:
    """The index of the new tensors: their shards and ``total_size``."""
    with open(ckpt.index, "rb") as f:
        index = json.loads(f.read())
    index["weight_map"] = {name: shard_of[name] for name in sorted(tensors)}
    meta = index.setdefault("metadata", {})
    if isinstance(meta, dict):
        meta["total_size"] = sum(t.nbytes for t in tensors.values())
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()


def _write(
    ckpt: sharded.ShardedCheckpoint,
    dst: str,
    config: Mapping[str, Any],
    updates: Mapping[str, Any],
    renamed: Mapping[str, str | None],
    new_shapes: Mapping[str, tuple[int, ...]],
    data: Callable[[TensorFiles, str], Any],
    *,
    force: bool,
    made: Mapping[str, str] | None,
) -> list[str]:
    """Write the checkpoint with tensors renamed, dropped (None) or of new shapes.

    ``data(files, old_name)`` gives a reshaped or sliced tensor's entries (as stored), or
    None for one copied as it is. Returns the files written.
    """
    tensors: dict[str, StoredTensor] = {}
    origin: dict[str, str] = {}
    for old, new in renamed.items():
        if new is None:
            continue
        t = ckpt.tensors[old]
        shape = tuple(new_shapes.get(old, t.shape))
        size = int(np.prod(shape))
        tensors[new] = dataclasses.replace(t, name=new, shape=shape, end=t.begin + size * t.raw_dtype.itemsize)
        origin[new] = old
    contents = {CONFIG_NAME: config_bytes({**config, **updates, **({KEY: dict(made)} if made else {})})}
    if ckpt.index:
        shard_of = {n: ckpt.shard_of[o] for n, o in origin.items()}
        contents[os.path.basename(ckpt.index)] = _index_bytes(ckpt, tensors, shard_of)
    sharded.check_destination(dst, ckpt, force)

    def fill(writers: Mapping[str, TensorWriter]) -> None:
        with TensorFiles() as tf:
            for new, old in origin.items():
                value = data(tf, old)
                if value is None:
                    for chunk in tf.chunks(ckpt.tensors[old]):
                        writers[new].write(new, chunk)
                else:
                    writers[new].write(new, value)
                    tf.release_tensor(ckpt.tensors[old])

    ckpt.write(dst, fill, tensors=tensors, contents=contents, made=made, replace=force, origin=origin)
    used = {ckpt.shard_of[o] for o in origin.values()}
    return [os.path.join(dst, n) for n in ckpt.written() if n not in ckpt.shards or n in used]


def _check_out(ckpt: Any, dst: Any) -> str:
    dst = os.fspath(dst)
    if sharded.writes_one_file(dst):
        raise HfGroupsError("a shrunk checkpoint is written to a folder (its config.json changes)")
    return dst


def _size(ckpt: Any, renamed: Mapping[str, str | None], shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int]:
    before = sum(t.size for t in ckpt.tensors.values())
    after = sum(int(np.prod(shapes.get(n, t.shape))) for n, t in ckpt.tensors.items() if renamed.get(n, n) is not None)
    return before, after


def score_layers(
    src: Any, calibration: str, *, rows: int | None = None, device: Any = None, hooks: Any = None
) -> tuple[HfLayers, np.ndarray]:
    """The decoder layers of a checkpoint folder and their scores (mean ``1 - cosine``; lowest go)."""
    ckpt, config = open_hf(src)
    layers = hf_layers(config, {n: t.shape for n, t in ckpt.tensors.items()})
    with _walk(ckpt, calibration, rows, device) as walk:
        if len(walk.layers) != layers.units:
            raise HfGroupsError(f"transformers builds {len(walk.layers)} layers, the checkpoint holds {layers.units}")
        return layers, layer_changes(walk, hooks)


def shrink_layers(
    src: Any,
    dst: Any,
    amount: int | float,
    calibration: str,
    *,
    force: bool = False,
    made: Mapping[str, str] | None = None,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
    scores: UnitScores | None = None,
) -> StructureShrink:
    """Remove whole decoder layers of a Hugging Face checkpoint folder: those that change the residual stream least.

    Parameters
    ----------
    src, dst : str or os.PathLike
        The checkpoint folder, the output folder.
    amount : int or float
        A fraction of the layers, or their number; one layer at least stays.
    calibration : str
        Token ids (``.npz``, ``input_ids``).
    force : bool
        Replace an existing `dst`.
    made : mapping, optional
        The provenance record.
    rows : int, optional
        Calibration sequences run at a time.
    device : str, optional
        Where the layers run.
    hooks : Hooks, optional
        Progress.
    scores : UnitScores, optional
        The layers' scores, computed already (:func:`score_layers`); else computed here.

    Returns
    -------
    StructureShrink

    Raises
    ------
    HfGroupsError
        For a checkpoint whose layers are not known or an amount removing every layer.
    FormatError
        For an input or output that is not a folder.
    """
    ckpt, config = open_hf(src)
    shapes = {n: t.shape for n, t in ckpt.tensors.items()}
    layers = hf_layers(config, shapes)
    _count_kept(amount, layers.units, "layers")  # refused before anything is run
    dst = _check_out(ckpt, dst)
    sharded.check_destination(dst, ckpt, force)
    if scores is None:
        scores = UnitScores("residual_change", *score_layers(src, calibration, rows=rows, device=device, hooks=hooks))
    layers, changes = scores.found, scores.scores
    kept = np.asarray(choose_channels(changes, amount))
    updates = layers.config_updates(config, kept.tolist())
    renamed = layers.renamed(list(ckpt.tensors), kept.tolist())
    files = _write(ckpt, dst, config, updates, renamed, {}, lambda tf, name: None, force=force, made=made)
    name = layers.names[0].rsplit(".", 1)[0]
    report = UnitReport("layers", [_Unitset(_Named(name, layers.units), "layers")], {name: changes}, _LAYER_SCORE)
    before, after = _size(ckpt, renamed, {})
    return StructureShrink(report, {name: kept.tolist()}, before, after, updates, files, list(ckpt.left))


_LAYER_SCORE = "1 - cosine(input, output) of each layer's residual stream, mean over calibration tokens"
_EXPERT_SCORE = "routing weight per calibration token (frequency x mean weight of the tokens choosing it)"
_EXPERT_NORM = "L2 norm of each expert's weights (no --calibration)"


def score_experts(
    src: Any, calibration: str | None, *, rows: int | None = None, device: Any = None, hooks: Any = None
) -> tuple[HfExperts, dict[int, np.ndarray]]:
    """The experts of every mixture-of-experts layer and their scores (lowest go)."""
    ckpt, config = open_hf(src)
    found = hf_experts(config, {n: t.shape for n, t in ckpt.tensors.items()})
    if calibration is None:
        scores = {}
        with TensorFiles() as tf:
            for i in found.layers:
                sq = np.zeros(found.units)
                if found.fused[i]:
                    for key in found.fused[i]:
                        w = _widened(tf.raw(ckpt.tensors[key]), ckpt.tensors[key].code).astype(np.float64)
                        sq += (w.reshape(found.units, -1) ** 2).sum(1)
                        tf.release_tensor(ckpt.tensors[key])
                else:
                    for e, keys in enumerate(found.experts[i]):
                        for key in keys:
                            w = _widened(tf.raw(ckpt.tensors[key]), ckpt.tensors[key].code).astype(np.float64)
                            sq[e] += float((w**2).sum())
                            tf.release_tensor(ckpt.tensors[key])
                scores[i] = np.sqrt(sq)
        return found, scores
    with _walk(ckpt, calibration, rows, device) as walk:
        stats = router_statistics(walk, found.routers, found.top_k, hooks)
    return found, {i: np.asarray(expert_scores(c, s, n)) for i, (c, s, n) in stats.items()}


def shrink_experts(
    src: Any,
    dst: Any,
    amount: int | float,
    calibration: str | None = None,
    *,
    force: bool = False,
    made: Mapping[str, str] | None = None,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
    scores: UnitScores | None = None,
) -> StructureShrink:
    """Remove experts of every mixture-of-experts layer of a Hugging Face checkpoint folder.

    Each layer loses the same number (the config holds one count): those with the least
    routing weight per calibration token (`calibration`), or of smallest L2 norm.

    Parameters
    ----------
    src, dst, amount, force, made, rows, device, hooks
        As :func:`shrink_layers`; `amount` counts the experts of each layer.
    calibration : str, optional
        Token ids; without, the experts' weights rank.
    scores : UnitScores, optional
        The experts' scores, computed already (:func:`score_experts`); else computed here.

    Raises
    ------
    HfGroupsError
        For a checkpoint without experts, an amount leaving fewer experts than
        ``num_experts_per_tok``.
    """
    ckpt, config = open_hf(src)
    found = hf_experts(config, {n: t.shape for n, t in ckpt.tensors.items()})
    kept_count = _count_kept(amount, found.units, "experts of a layer")
    if kept_count < found.top_k:
        raise HfGroupsError(
            f"amount {amount} would leave {kept_count} experts per layer, fewer than num_experts_per_tok="
            f"{found.top_k} that each token is routed to"
        )
    dst = _check_out(ckpt, dst)
    sharded.check_destination(dst, ckpt, force)
    if scores is None:
        found_scores = score_experts(src, calibration, rows=rows, device=device, hooks=hooks)
        scores = UnitScores("router_statistics", *found_scores)
    found, by_layer = scores.found, scores.scores
    kept = {i: np.asarray(choose_channels(by_layer[i], amount)) for i in found.layers}
    renamed = found.renamed(list(ckpt.tensors), kept)
    sliced: dict[str, tuple[int, np.ndarray]] = {}
    for i in found.layers:
        for key in [found.routers[i], *found.fused[i]]:
            sliced[key] = (i, kept[i])
    new_shapes = {k: (kept_count, *ckpt.tensors[k].shape[1:]) for k in sliced}

    def data(tf: TensorFiles, name: str) -> Any:
        if name not in sliced:
            return None
        t = ckpt.tensors[name]
        return np.ascontiguousarray(np.take(tf.raw(t).reshape(t.shape), sliced[name][1], axis=0))

    updates = {found.count_key: kept_count}
    files = _write(ckpt, dst, config, updates, renamed, new_shapes, data, force=force, made=made)
    report = _expert_report(found, by_layer, calibration is not None)
    before, after = _size(ckpt, renamed, new_shapes)
    kept_out = {found.layers[i]: kept[i].tolist() for i in found.layers}
    return StructureShrink(report, kept_out, before, after, updates, files, list(ckpt.left))


def _expert_report(found: HfExperts, scores: Mapping[int, np.ndarray], calibrated: bool) -> UnitReport:
    sets = [_Unitset(_Named(name, found.units), "experts") for name in found.layers.values()]
    by_name = {found.layers[i]: s for i, s in scores.items()}
    return UnitReport("experts", sets, by_name, _EXPERT_SCORE if calibrated else _EXPERT_NORM)


def _consumer(found: HfGroups, g: Any) -> Any:
    """The member of group `g` that reads its units (``down_proj``, ``o_proj``, ...)."""
    row = FAMILIES[found.family]
    leaf = (row.mlp[2] if found.kind == "channels" and row.mlp else (row.attention or ("", (), ""))[2]) + ".weight"
    return next(m for m in g.members if m.key.endswith("." + leaf))


def _unit_class(method: str) -> type[UnitPruningMethod]:
    """The calibrated structured method of the table named `method` (:func:`unit_methods`)."""
    cls = arrayprune.METHODS.get(method)
    if method not in unit_methods() or not (isinstance(cls, type) and issubclass(cls, UnitPruningMethod)):
        raise ValueError(f"unknown calibrated score {method!r}; expected one of {', '.join(unit_methods())}")
    return cls


def _unit_method(method: str, amount: int | float, compensated: bool, damp: float) -> UnitPruningMethod:
    """The calibrated structured method named `method`, with these settings."""
    return _unit_class(method)(amount, compensate=compensated, damp=damp)


def _decide(found: HfGroups, method: str, amount: int | float, compensated: bool, damp: float) -> Any:
    """The choice of one layer: scores of its units, the kept ones, the consumer's new weight."""
    chooser = _unit_method(method, amount, compensated, damp)

    def decide(index: int, weight: np.ndarray, hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        choice = chooser.prune_units(weight, hessian, found.groups[index].units)
        return np.asarray(choice.scores), np.asarray(choice.kept), np.asarray(choice.weight)

    return decide


def score_calibrated(
    src: Any,
    method: str,
    amount: int | float | None,
    calibration: str,
    groups: str = "channels",
    *,
    compensated: bool = True,
    damp: float = 0.01,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
    keep: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[HfGroups, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Score the units of every layer on calibration data, sequentially; the groups, scores and kept units.

    With an `amount`, each layer's choice (and refit, if `compensated`) is applied before
    the next layer's inputs are computed; ``keep(index, new_consumer_weight)`` receives
    each refit consumer (``[out, in]`` with the dropped columns zero, float64).
    """
    ckpt, config = open_hf(src)
    found = hf_groups(config, {n: t.shape for n, t in ckpt.tensors.items()}, groups)
    decide = _decide(found, method, 0 if amount is None else amount, compensated, damp)
    scores: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}

    def step(index: int, weight: np.ndarray, hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, k, new = decide(index, weight, hessian)
        name = found.groups[index].name
        scores[name], kept[name] = s, k
        if amount is None:
            return k, weight
        if keep is not None:
            keep(index, new)
        return k, new

    consumers = {i: _consumer(found, g).key for i, g in enumerate(found.groups)}
    with _walk(ckpt, calibration, rows, device) as walk:
        if len(walk.layers) != len(found.groups):
            built, held = len(walk.layers), len(found.groups)
            raise HfGroupsError(f"transformers builds {built} layers, the checkpoint holds {held}")
        calibrated_units(walk, consumers, step, hooks)
    return found, scores, kept


def decide_units(
    src: Any,
    dst: str,
    method: str,
    amount: int | float,
    calibration: str,
    groups: str,
    stack: contextlib.ExitStack,
    *,
    compensated: bool = True,
    damp: float = 0.01,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
) -> UnitScores:
    """Score, choose and refit the units of every layer on calibration data, layer after layer.

    The refit consumers are saved (``.npy``) in a folder beside `dst` that lives as long
    as `stack`; :func:`shrink_calibrated` writes the checkpoint from them.
    """
    ckpt, config = open_hf(src)
    planned = hf_groups(config, {n: t.shape for n, t in ckpt.tensors.items()}, groups)
    workdir = stack.enter_context(workdir_beside(dst))
    saved: dict[str, str] = {}

    def keep(index: int, new: np.ndarray) -> None:
        key = _consumer(planned, planned.groups[index]).key
        path = os.path.join(workdir, f"{index}.npy")
        np.save(path, new)
        saved[key] = path

    found, scores, kept = score_calibrated(
        src, method, amount, calibration, groups, compensated=compensated, damp=damp, rows=rows, device=device,
        hooks=hooks, keep=keep,
    )  # fmt: skip
    return UnitScores("unit_hessians", found, scores, kept, saved)


def shrink_calibrated(
    src: Any,
    dst: Any,
    amount: int | float,
    method: str,
    calibration: str,
    *,
    groups: str = "channels",
    compensated: bool = True,
    damp: float = 0.01,
    force: bool = False,
    made: Mapping[str, str] | None = None,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
    decided: UnitScores | None = None,
) -> StructureShrink:
    """Shrink MLP channels or heads of every layer, scored on calibration data, the consumer refit.

    Parameters
    ----------
    src, dst, amount, force, made, rows, device, hooks
        As :func:`shrink_layers`; `amount` counts each layer's units.
    method : str
        A calibrated structured method of :data:`arrayprune.METHODS` (``"activation_structured"``,
        ``"obs_structured"``, or one registered: a :class:`~arrayprune.UnitPruningMethod`).
    calibration : str
        Token ids.
    groups : {"channels", "heads"}
    compensated : bool, default True
        Refit the consumer's kept columns (:func:`arrayprune.structured.compensate`).
    damp : float, default 0.01
        The Hessian's damping.
    decided : UnitScores, optional
        The units each layer keeps and the refit consumers, decided already
        (:func:`decide_units`); else decided here.
    """
    _unit_method(method, amount, compensated, damp)  # a name of the table, settings it takes
    ckpt, config = open_hf(src)
    found, kept_count, planned = plan_checkpoint_shrink(ckpt, config, amount, groups)
    dst = _check_out(ckpt, dst)
    sharded.check_destination(dst, ckpt, force)
    consumers = {_consumer(found, g).key: i for i, g in enumerate(found.groups)}
    with contextlib.ExitStack() as stack:
        if decided is None:
            decided = decide_units(
                src, dst, method, amount, calibration, groups, stack, compensated=compensated, damp=damp, rows=rows,
                device=device, hooks=hooks,
            )  # fmt: skip
        found, scores, kept, saved = decided.found, decided.scores, decided.kept or {}, decided.saved or {}
        members = {m.key: (g, m) for g in found.groups for m in g.members}

        def data(tf: TensorFiles, name: str) -> Any:
            if name not in members:
                return None
            g, m = members[name]
            t = ckpt.tensors[name]
            if name in consumers and compensated:
                import torch

                new = np.load(saved[name])
                k = kept[g.name]
                per = new.shape[1] // g.units
                columns = (k[:, None] * per + np.arange(per)).reshape(-1)
                value = new[:, columns]
                value = value if m.axis == 1 else value.T  # GPT-2's Conv1D: [in, out]
                return _stored(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)), t.code).reshape(
                    planned[name].shape
                )
            return g.take(m, tf.raw(t).reshape(t.shape), kept[g.name])

        renamed: dict[str, str | None] = {n: n for n in ckpt.tensors}
        new_shapes = {n: planned[n].shape for n in members}
        updates = found.config_updates(kept_count)
        files = _write(ckpt, dst, config, updates, renamed, new_shapes, data, force=force, made=made)
    what = _unit_class(method).DESCRIPTION + (", the consumer refit on the kept columns" if compensated else "")
    sets = [_Unitset(_Named(g.name, g.units), g.unit) for g in found.groups]
    report = UnitReport(groups, sets, scores, what)
    before, after = _size(ckpt, renamed, new_shapes)
    return StructureShrink(
        report, {n: k.tolist() for n, k in kept.items()}, before, after, updates, files, list(ckpt.left)
    )


@contextlib.contextmanager
def shrink_errors(job: ShrinkJob) -> Iterator[None]:
    """The errors of shrinking a folder as the pipeline reports them: one line, nothing written."""
    try:
        yield
    except PruneError:
        raise
    except HfGroupsError as exc:
        raise PruneError(f"--shrink: {exc}", job.src) from None
    except OSError as exc:  # a full disk: the new folder is gone, OUT as it was
        if job.dst is None or job.spec.dry_run:
            raise
        raise write_failure(job.dst, exc) from None
    except ValueError as exc:  # token ids, a model transformers cannot build
        raise PruneError(f"--shrink: {error_text(exc)}", job.src) from None


def check_hf_shrink(job: ShrinkJob) -> None:
    """Refuse, before anything runs, what a folder cannot lose: layers, experts or calibrated units.

    Raises
    ------
    PruneError
        An amount a kind of unit cannot lose, a checkpoint without such units, an output
        that is not a new folder (unless ``force``); one line.
    """
    spec = job.spec
    if not job.whole_units and not job.calibrated:
        if spec.calibration:
            raise PruneError(
                f"--calibration ranks {job.groups} with --method {' or '.join(unit_methods())}, not {spec.method}"
            )
        return  # channels or heads by weight norm: run_checkpoint_shrink checks its own
    with shrink_errors(job):
        ckpt, config = open_hf(job.src)
        shapes = {n: t.shape for n, t in ckpt.tensors.items()}
        if job.groups == "layers":
            units: Any = hf_layers(config, shapes)
            if spec.amount is not None:
                _count_kept(spec.amount, units.units, "layers")
        elif job.groups == "experts":
            units = hf_experts(config, shapes)
            if spec.amount is not None:
                kept = _count_kept(spec.amount, units.units, "experts of a layer")
                if kept < units.top_k:
                    raise HfGroupsError(
                        f"amount {spec.amount} would leave {kept} experts per layer, fewer than "
                        f"num_experts_per_tok={units.top_k} that each token is routed to"
                    )
        elif spec.amount is not None:
            plan_checkpoint_shrink(ckpt, config, spec.amount, job.groups)
        else:
            hf_groups(config, shapes, job.groups)
        if not spec.dry_run:
            if job.dst is None:
                raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
            sharded.check_destination(_check_out(ckpt, job.dst), ckpt, spec.force)


def walk_arguments(job: ShrinkJob) -> dict[str, Any]:
    """How the layer-by-layer runner walks a job's calibration data: rows at a time, device, progress."""
    return {"rows": job.spec.calibration_batch, "device": job.spec.device, "hooks": job.hooks}


def run_hf_shrink(job: ShrinkJob, scores: UnitScores | None = None) -> Any:
    """The pipeline's shrink stage for a Hugging Face checkpoint folder: every ``--groups`` and method.

    Weight-norm channels and heads go to
    :func:`~arrayprune.adapters.pipeline.shrink_checkpoint.run_checkpoint_shrink`; layers,
    experts and the calibrated structured methods are written here, from the `scores` the
    calibrate stage computed (:func:`arrayprune.adapters.pipeline.calibrate.unit_scores`;
    None: computed here, or none needed). :func:`check_hf_shrink` has run before.

    Raises
    ------
    PruneError
        For options or inputs that cannot be shrunk; nothing is written then.
    """
    if not job.whole_units and not job.calibrated:
        return run_checkpoint_shrink(job)
    spec, src, dst, groups = job.spec, job.src, job.dst, job.groups
    kind = "Hugging Face checkpoint"
    args = walk_arguments(job)
    with shrink_errors(job):
        ckpt, _ = open_hf(src)
        if spec.dry_run:
            report = _dry_run(src, groups, spec, args, scores)
            return PruneResult(
                src, None, kind, spec, [], notes=_notes(spec, groups), shrink=ShrinkResult(report, spec.amount)
            )
        if dst is None:
            raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
        made = provenance.record(_recorded(spec, groups))
        common = {"force": spec.force, "made": made, **args}
        if groups == "layers":
            done = shrink_layers(src, dst, spec.amount, spec.calibration, scores=scores, **common)
        elif groups == "experts":
            done = shrink_experts(src, dst, spec.amount, spec.calibration, scores=scores, **common)
        else:
            done = shrink_calibrated(
                src, dst, spec.amount, spec.method, spec.calibration, groups=groups, compensated=spec.compensate,
                decided=scores, **common,
            )  # fmt: skip
    written = PruneSummary(pruned=Totals(), whole=Totals(), files=done.files, left=done.left)
    written.whole.add(done.params_after, 0)
    shrunk = ShrinkResult(done.report, spec.amount, done.kept, done.params_before, done.params_after)
    changes = ", ".join(f"{k} -> {v}" for k, v in done.config.items())
    notes = [*_notes(spec, groups), f"{CONFIG_NAME} rewritten: {changes}"]
    return PruneResult(
        src, dst, kind, spec, [], written, shards=len(ckpt.shards), copied=len(ckpt.files) - 1, notes=notes,
        shrink=shrunk,
    )  # fmt: skip


#: What ranks layers and experts, as the provenance record names it (their own scores, not ``--method``).
_RECORDED = {"layers": "residual_change", "experts": "router_statistics"}


def _recorded(spec: PruneSpec, groups: str) -> Any:
    """The request as the provenance record tells it: layers and experts by the score that ranked them."""
    if groups == "experts" and not spec.calibration:
        return dataclasses.replace(spec, method="ln_structured")
    return dataclasses.replace(spec, method=_RECORDED[groups]) if groups in _RECORDED else spec


def _notes(spec: PruneSpec, groups: str) -> list[str]:
    """:func:`shrink_notes`, naming the units removed."""
    unit, where = {"layers": ("layers", "the model"), "experts": ("experts", "each MoE layer")}.get(
        groups, ("channels" if groups == "channels" else "KV groups", "each layer")
    )
    return shrink_notes(spec, unit, where)


def _dry_run(
    src: str, groups: str, spec: PruneSpec, args: Mapping[str, Any], scores: UnitScores | None = None
) -> UnitReport:
    """The units with their scores (on calibration data where the kind or method needs it)."""
    if groups == "layers":
        if scores is None:
            scores = UnitScores("residual_change", *score_layers(src, spec.calibration, **args))
        layers, changes = scores.found, scores.scores
        name = layers.names[0].rsplit(".", 1)[0]
        return UnitReport("layers", [_Unitset(_Named(name, layers.units), "layers")], {name: changes}, _LAYER_SCORE)
    if groups == "experts":
        if scores is None:
            scores = UnitScores("router_statistics", *score_experts(src, spec.calibration, **args))
        return _expert_report(scores.found, scores.scores, spec.calibration is not None)
    if scores is None:
        dense = score_calibrated(src, spec.method, None, spec.calibration, groups, **args)
        scores = UnitScores("unit_hessians", *dense)
    found = scores.found
    sets = [_Unitset(_Named(g.name, g.units), g.unit) for g in found.groups]
    return UnitReport(groups, sets, scores.scores, _unit_class(spec.method).DESCRIPTION + ", on the dense model")
