"""A shrunk Hugging Face checkpoint folder: what was removed, and the writer of the new folder.

The pieces every structured shrink of a folder shares
(:mod:`~arrayprune.adapters.pipeline.shrink_structure`): the report of the units and their
scores (:class:`UnitReport`), what a shrink did (:class:`StructureShrink`), what calibration
data said of the units (:class:`UnitScores`, the calibrate stage's answer), and the writer
of the checkpoint with tensors renamed, dropped or reshaped, tensor by tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arrayprune import amount as _amount
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.safetensors_stream import StoredTensor, TensorFiles, TensorWriter
from arrayprune.adapters.pipeline.hf_calibration import hf_folder
from arrayprune.adapters.pipeline.hf_structure import LayerWalk
from arrayprune.adapters.provenance import KEY
from arrayprune.adapters.roles.hf_config import CONFIG_NAME, config_bytes
from arrayprune.adapters.roles.hf_groups import HfGroupsError
from arrayprune.groups import choose_channels

__all__ = ["StructureShrink", "UnitReport", "UnitScores"]


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
    kept : dict of str to ndarray, optional
        Per set, the units kept where they are not the highest scores (layers chosen one
        at a time, each rescored).
    """

    kind: str
    groups: list[_Unitset]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    what: str = ""
    left: list[Any] = field(default_factory=list)
    kept: dict[str, np.ndarray] | None = None

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
                chosen = (self.kept or {}).get(g.group.name)
                if chosen is None:
                    chosen = choose_channels(np.asarray(scores), amount)
                kept = set(np.asarray(chosen).tolist())
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
    refits : dict of str to list of int
        Layers: each projection refit to absorb removed layers, and those layers.
    notes : list of str
        What else the report should say (how the layers were chosen).
    """

    report: UnitReport
    kept: dict[str, list[int]]
    params_before: int
    params_after: int
    config: dict[str, Any]
    files: list[str]
    left: list[str]
    refits: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


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
        Calibrated units, layers: the units each group keeps (the layers kept), decided
        while calibrating.
    saved : dict of str to str, optional
        Calibrated units with an amount: each refit consumer's weight (``.npy``, float64
        ``[out, in]``, dropped columns zero); layers: each projection refit to absorb the
        removed layers after it (:func:`decide_layers`). In a folder beside the output that
        lives as long as the calibrate stage's exit stack.
    order : list of (int, float), optional
        Layers chosen one at a time (:func:`choose_layers`): each removed layer, in the
        order chosen, with its score then (on the model without the layers before it in
        the list).
    """

    statistic: str
    found: Any
    scores: Any
    kept: dict[str, np.ndarray] | None = None
    saved: dict[str, str] | None = None
    order: list[tuple[int, float]] | None = None


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
