"""Shrink a Hugging Face checkpoint folder: MLP channels or attention heads removed, tensor by tensor.

:func:`shrink_checkpoint` reads the folder's ``config.json`` and safetensors (one file or
sharded), finds one group per layer (:func:`~arrayprune.adapters.roles.hf_groups.hf_groups`:
the MLP's hidden channels, or with ``groups="heads"`` the KV groups of Llama-style
attention), drops ``round(amount * units)`` units of every layer (the config holds one
size), chosen per layer by a structured method's score over the group's weight members
(:func:`arrayprune.groups.group_scores`; biases do not score), and writes:

* every member sliced (kept units in their order), every other tensor byte for byte;
* shard headers with the new shapes, the index's ``total_size`` the new byte count;
* ``config.json`` with the new size (``intermediate_size``, GPT-2's ``n_inner``; or
  ``num_attention_heads``, ``num_key_value_heads`` and an explicit ``head_dim``);
* every other file of the folder copied, as pruning a checkpoint copies them.

Memory is bounded by one layer's group: its members are read through memory maps
(scored in float32, or float64 for float64 tensors; bfloat16 is widened exactly), sliced
as stored bit patterns, written, and their pages given back; other tensors are copied
chunk by chunk. The output folder replaces `dst` as a whole
(:meth:`~arrayprune.adapters.formats.sharded.ShardedCheckpoint.write`).

:func:`run_checkpoint_shrink` is the pipeline's stage (``arrayprune prune FOLDER -o OUT
--shrink``).

Examples
--------
>>> from arrayprune.adapters.pipeline.shrink_checkpoint import shrink_checkpoint
>>> done = shrink_checkpoint("Llama-3-8B", "Llama-3-8B-mlp50", 0.5)  # doctest: +SKIP
>>> done.config  # doctest: +SKIP
{'intermediate_size': 7168}
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from arrayprune import amount as _amount
from arrayprune.adapters import provenance
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.errors import FormatError, write_failure
from arrayprune.adapters.formats.safetensors_stream import StoredTensor, TensorFiles, TensorWriter
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.job import ShrinkJob
from arrayprune.adapters.pipeline.prune_result import PruneResult, ShrinkResult, shrink_notes
from arrayprune.adapters.provenance import KEY
from arrayprune.adapters.roles.hf_config import CONFIG_NAME, config_bytes, read_config
from arrayprune.adapters.roles.hf_groups import FAMILIES, HfGroup, HfGroups, HfGroupsError, hf_groups
from arrayprune.adapters.roles.onnx_group_types import even_drop
from arrayprune.adapters.shrink import _check_method, _per_group_methods
from arrayprune.adapters.summary import PruneSummary, Totals
from arrayprune.groups import choose_channels, group_scores

__all__ = ["CheckpointShrink", "open_hf", "plan_checkpoint_shrink", "run_checkpoint_shrink", "shrink_checkpoint"]

#: Dtypes a member may have: scored after widening, sliced as stored.
_SCORED = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": None}


@dataclass(frozen=True)
class CheckpointShrink:
    """What :func:`shrink_checkpoint` did.

    Attributes
    ----------
    groups : HfGroups
        The groups (one per layer) and the config's sizes before.
    kept : dict of str to list of int
        Per group name, the units kept, ascending.
    params_before, params_after : int
        Entries of all tensors, before and after.
    config : dict
        The config fields written.
    files : list of str
        The files written (shards, other files, the index), in the output folder.
    left : list of str
        Files of the folder not copied, with the reason.
    """

    groups: HfGroups
    kept: dict[str, list[int]]
    params_before: int
    params_after: int
    config: dict[str, int]
    files: list[str]
    left: list[str]


def open_hf(src: Any) -> tuple[sharded.ShardedCheckpoint, dict[str, Any]]:
    """A checkpoint folder and its config.

    Raises
    ------
    FormatError
        If `src` is not a folder of safetensors (sharded or one file) with a ``config.json``.
    """
    src = os.fspath(src)
    if not os.path.isdir(src):
        raise FormatError(src, "a Hugging Face checkpoint is a folder (config.json and safetensors)")
    ckpt = sharded.open_checkpoint(src)
    if not isinstance(ckpt, sharded.ShardedCheckpoint):
        raise FormatError(src, "a Hugging Face checkpoint is a folder of safetensors shards or one safetensors file")
    if not os.path.lexists(os.path.join(ckpt.folder, CONFIG_NAME)):
        raise FormatError(src, f"no {CONFIG_NAME}: the sizes of a Hugging Face model's layers are read from it")
    if CONFIG_NAME not in ckpt.files:  # a symlink leading out of the folder, ...: neither copied nor read
        why = next((x for x in ckpt.left if x.startswith(CONFIG_NAME + " ")), CONFIG_NAME)
        raise FormatError(src, f"{why}: not read")
    config = read_config(ckpt.folder)
    if config is None:
        raise FormatError(src, f"{CONFIG_NAME}: not read")
    return ckpt, config


def plan_checkpoint_shrink(
    ckpt: sharded.ShardedCheckpoint, config: Mapping[str, Any], amount: int | float, groups: str = "channels"
) -> tuple[HfGroups, int, dict[str, StoredTensor]]:
    """The groups, the units every group keeps, and every tensor as it will be written.

    Raises
    ------
    HfGroupsError
        For groups that cannot be read, an amount that removes every unit, or a member
        of a dtype that cannot be scored.
    TypeError, ValueError
        For a bad amount.
    """
    _amount.validate_pruning_amount_init(amount)
    found = hf_groups(config, {n: t.shape for n, t in ckpt.tensors.items()}, groups)
    units = found.groups[0].units
    k = _amount.compute_nparams_toprune(amount, units)
    _amount.validate_pruning_amount(k, units)
    if k >= units:
        raise HfGroupsError(f"amount {amount} would remove every one of the {units} {found.groups[0].unit} of a layer")
    kept = units - k
    found.check_kept(kept, int(config.get(FAMILIES[found.family].hidden) or 0))
    tensors = dict(ckpt.tensors)
    for g in found.groups:
        for m in g.members:
            t = tensors[m.key]
            if t.code not in _SCORED:
                raise HfGroupsError(f"{m.key!r}: dtype {t.dtype} is not shrunk (float32, float16, bfloat16, float64)")
            shape = g.new_shape(m, t.shape, kept)
            size = int(np.prod(shape))
            tensors[m.key] = dataclasses.replace(t, shape=shape, end=t.begin + size * t.raw_dtype.itemsize)
    return found, kept, tensors


def _widened(raw: np.ndarray, code: str) -> np.ndarray:
    """Entries as read, as float32 (float64 stays): bfloat16 bit patterns widened exactly."""
    if code == "BF16":
        wide = raw.astype(np.uint32)
        wide <<= np.uint32(16)
        return wide.view(np.float32)
    return raw.astype(np.float64 if code == "F64" else np.float32)  # a copy: the map's pages go back


def _shrink_group(
    tf: TensorFiles, g: HfGroup, src: Mapping[str, StoredTensor], method: Any, amount: int | float
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One group: its members read, scored, the kept units chosen, the members sliced (as stored)."""
    raw, views = {}, {}
    for m in g.members:
        t = src[m.key]
        raw[m.key] = tf.raw(t).reshape(t.shape)
        for key, view in g.views(m, raw[m.key]).items():
            views[key] = _widened(view, t.code) if m.weight else view  # a bias: only its length is checked
    group = g.group_over({m.key: src[m.key].shape for m in g.members})
    kept = np.asarray(choose_channels(group_scores(views, group, method), amount))
    out = {m.key: g.take(m, raw[m.key], kept) for m in g.members}
    for m in g.members:
        tf.release_tensor(src[m.key])
    return kept, out


def _index_bytes(ckpt: sharded.ShardedCheckpoint, removed: int) -> bytes:
    """The index with ``total_size`` less the bytes removed."""
    with open(ckpt.index, "rb") as f:
        index = json.loads(f.read())
    meta = index.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
        meta["total_size"] -= removed
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()


def shrink_checkpoint(
    src: Any,
    dst: Any,
    amount: int | float,
    method: Any = "ln_structured",
    *,
    groups: str = "channels",
    force: bool = False,
    stage: Any = None,
    made: Mapping[str, str] | None = None,
    **method_args: Any,
) -> CheckpointShrink:
    """Shrink a Hugging Face checkpoint folder into folder `dst`, tensor by tensor.

    Parameters
    ----------
    src : str or os.PathLike
        A folder with ``config.json`` and safetensors (one file, or shards and their index).
    dst : str or os.PathLike
        The output folder (new; an existing one only with `force`).
    amount : int or float
        A fraction in ``[0, 1]`` of each layer's units, or a count; every layer loses
        the same number, at least one unit stays.
    method : str or method object, default "ln_structured"
        A structured method that scores channels (``ln_structured`` with ``n``, default
        2; ``random_structured`` with ``seed``: each layer its own stream).
    groups : {"channels", "heads"}
        MLP channels, or attention heads (KV groups with grouped-query attention).
    force : bool
        Replace an existing `dst`.
    stage : callable, optional
        ``stage(text)``: announcements.
    made : mapping of str to str, optional
        A provenance record (:mod:`arrayprune.adapters.provenance`) for ``config.json``
        and the shards' metadata.
    **method_args
        Constructor arguments of a method given by name.

    Returns
    -------
    CheckpointShrink

    Raises
    ------
    FormatError
        For an input that is not such a folder, an output that cannot be written.
    HfGroupsError
        For groups that cannot be read or an amount that removes every unit.
    TypeError, ValueError
        For a bad amount or method. Everything is checked before anything is written.
    """
    _check_method(method, dict(method_args))
    ckpt, config = open_hf(src)
    found, kept_count, tensors = plan_checkpoint_shrink(ckpt, config, amount, groups)
    dst = os.fspath(dst)
    if sharded.writes_one_file(dst):
        raise FormatError(dst, "a shrunk checkpoint is written to a folder (its config.json changes)")
    sharded.check_destination(dst, ckpt, force)
    methods = _per_group_methods([g.group for g in found.groups], method, dict(method_args))
    updates = found.config_updates(kept_count)
    removed = sum(ckpt.tensors[n].nbytes - t.nbytes for n, t in tensors.items())
    contents = {CONFIG_NAME: config_bytes({**config, **updates, **({KEY: dict(made)} if made else {})})}
    if ckpt.index:
        contents[os.path.basename(ckpt.index)] = _index_bytes(ckpt, removed)
    members = {m.key for g in found.groups for m in g.members}
    if stage is not None:
        stage(f"shrinking {len(found.groups)} layers: {found.groups[0].units} -> {kept_count} {found.groups[0].unit}")

    def fill(writers: Mapping[str, TensorWriter]) -> dict[str, list[int]]:
        kept: dict[str, list[int]] = {}
        with TensorFiles() as tf:
            for g, m in zip(found.groups, methods, strict=True):
                idx, out = _shrink_group(tf, g, ckpt.tensors, m, amount)
                kept[g.name] = [int(i) for i in idx]
                for key, data in out.items():
                    writers[key].write(key, data)
            for name, t in ckpt.tensors.items():
                if name not in members:
                    for chunk in tf.chunks(t):
                        writers[name].write(name, chunk)
        return kept

    kept = ckpt.write(dst, fill, tensors=tensors, contents=contents, made=made, replace=force)
    return CheckpointShrink(
        found,
        kept,
        sum(t.size for t in ckpt.tensors.values()),
        sum(t.size for t in tensors.values()),
        updates,
        [os.path.join(dst, n) for n in ckpt.written()],
        list(ckpt.left),
    )


def run_checkpoint_shrink(job: ShrinkJob) -> Any:
    """The pipeline's shrink stage for a Hugging Face checkpoint folder: channels or heads by weight norm.

    Returns
    -------
    PruneResult
        With ``shrink`` (a :class:`~arrayprune.adapters.pipeline.shrinking.ShrinkResult`).

    Raises
    ------
    PruneError
        For options or inputs that cannot be shrunk; nothing is written then.
    """

    kind = "Hugging Face checkpoint"
    spec, src, dst = job.spec, job.src, job.dst
    amount = spec.amount
    try:
        ckpt, config = open_hf(src)
        found = hf_groups(config, {n: t.shape for n, t in ckpt.tensors.items()}, job.groups)
        if amount is not None:
            if spec.rounding != "nearest" and found.groups:  # every layer has as many units: one count
                amount = even_drop(amount, found.groups[0].units, 1, found.groups[0].name, spec.rounding)
            found = plan_checkpoint_shrink(ckpt, config, amount, job.groups)[0]
    except HfGroupsError as exc:
        raise PruneError(f"--shrink: {exc}", src) from None
    except (TypeError, ValueError) as exc:
        raise PruneError(f"--amount: {error_text(exc)}", src) from None
    if spec.dry_run:
        return PruneResult(src, None, kind, spec, [], notes=shrink_notes(spec), shrink=ShrinkResult(found, amount))
    if dst is None:
        raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
    try:
        done = shrink_checkpoint(
            src, dst, amount, spec.method, groups=job.groups, force=spec.force,
            stage=job.hooks.stage, made=provenance.record(spec), **job.channel_arguments(),
        )  # fmt: skip
    except HfGroupsError as exc:
        raise PruneError(f"--shrink: {exc}", src) from None
    except OSError as exc:  # a full disk: the new folder is gone, OUT as it was
        raise write_failure(dst, exc) from None
    members = {m.key for g in done.groups.groups for m in g.members}
    sizes = {n: int(np.prod(shape)) for n, shape in _shapes(ckpt, done).items()}
    pruned, whole = Totals(), Totals()
    for name, size in sizes.items():
        whole.add(size, 0)
        if name in members:
            pruned.add(size, 0)
    written = PruneSummary(pruned=pruned, whole=whole, files=done.files, left=done.left)
    shrunk = ShrinkResult(done.groups, amount, done.kept, done.params_before, done.params_after)
    sizes_before = {**done.groups.sizes, "head_dim": done.groups.sizes.get("head_dim")}
    changes = ", ".join(f"{k} {sizes_before[k]} -> {v}" for k, v in done.config.items() if sizes_before.get(k, v) != v)
    notes = [*shrink_notes(spec), f"{CONFIG_NAME} rewritten: {changes}"]
    return PruneResult(
        src, dst, kind, spec, [], written, shards=len(ckpt.shards), copied=len(ckpt.files) - 1, notes=notes,
        shrink=shrunk,
    )  # fmt: skip


def _shapes(ckpt: sharded.ShardedCheckpoint, done: CheckpointShrink) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape as written."""
    kept = len(next(iter(done.kept.values())))
    out = {n: t.shape for n, t in ckpt.tensors.items()}
    for g in done.groups.groups:
        for m in g.members:
            out[m.key] = g.new_shape(m, out[m.key], kept)
    return out
