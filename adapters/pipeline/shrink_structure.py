"""Structured pruning of a Hugging Face checkpoint on calibration data: layers, experts, calibrated units.

``arrayprune prune FOLDER -o OUT --shrink`` with

* ``--groups layers --calibration tokens.npz``: whole decoder layers removed, one at a
  time, each the layer whose removal changes the residual stream least (``1 - cosine``
  of the stream after it, averaged over the calibration tokens), once what it added is
  refit into the layer before (:func:`choose_layers`; ``--no-compensate``: the dense
  model's ``1 - cosine(input, output)`` per layer, the smallest removed, nothing refit);
  the other layers' tensors renamed to consecutive indices; ``num_hidden_layers`` and
  every per-layer list of
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
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters import provenance
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.formats.errors import write_failure
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.hf_calibration import _stored, workdir_beside
from arrayprune.adapters.pipeline.hf_structure import absorb_removed_layers, calibrated_units, router_statistics
from arrayprune.adapters.pipeline.job import ShrinkJob
from arrayprune.adapters.pipeline.layer_choice import _layers_report, _order_notes, choose_layers, score_layers
from arrayprune.adapters.pipeline.method_names import unit_methods
from arrayprune.adapters.pipeline.prune_result import PruneResult, ShrinkResult, shrink_notes
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.shrink_checkpoint import (
    _widened,
    open_hf,
    plan_checkpoint_shrink,
    run_checkpoint_shrink,
)
from arrayprune.adapters.pipeline.shrink_folder import (
    StructureShrink,
    UnitReport,
    UnitScores,
    _check_out,
    _count_kept,
    _Named,
    _size,
    _Unitset,
    _walk,
    _write,
)
from arrayprune.adapters.roles.hf_config import CONFIG_NAME
from arrayprune.adapters.roles.hf_groups import (
    FAMILIES,
    HfExperts,
    HfGroups,
    HfGroupsError,
    hf_experts,
    hf_groups,
    hf_layers,
)
from arrayprune.adapters.summary import PruneSummary, Totals
from arrayprune.groups import choose_channels
from arrayprune.structured import absorb, expert_scores
from arrayprune.structured_methods import UnitPruningMethod

__all__ = [
    "StructureShrink",
    "UnitReport",
    "UnitScores",
    "check_hf_shrink",
    "choose_layers",
    "decide_units",
    "shrink_errors",
    "walk_arguments",
    "run_hf_shrink",
    "shrink_calibrated",
    "shrink_experts",
    "shrink_layers",
]


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
    compensated: bool = True,
    damp: float = 0.01,
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
        The layers chosen already (:func:`choose_layers`, with ``kept``) or their scores
        (:func:`score_layers`: the lowest go); else chosen here, by :func:`choose_layers`
        when `compensated`, by :func:`score_layers` otherwise.
    compensated : bool, default True
        Refit each run of removed layers into the kept layer before it: its last
        projection into the residual stream (``down_proj``; ``o_proj`` where the layers
        hold experts) learns to add what the run added, on the calibration tokens
        (:func:`arrayprune.structured.absorb`), layer after layer on the model already
        shrunk (:func:`~arrayprune.adapters.pipeline.hf_structure.absorb_removed_layers`).
        A run at the start of the model has no layer before it, and a post-norm family
        (BERT) no such projection: those runs are removed as they are.
    damp : float, default 0.01
        The damping of the refit's Hessian.

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
    with contextlib.ExitStack() as stack:
        if scores is None or scores.kept is None:
            scores = decide_layers(
                src, dst, amount, calibration, stack, scores=scores, compensated=compensated, damp=damp, rows=rows,
                device=device, hooks=hooks,
            )  # fmt: skip
        layers = scores.found
        name = layers.names[0].rsplit(".", 1)[0]
        kept = [int(i) for i in (scores.kept or {})[name]]
        saved = scores.saved or {}
        updates = layers.config_updates(config, kept)
        renamed = layers.renamed(list(ckpt.tensors), kept)

        def data(tf: TensorFiles, key: str) -> Any:
            if key not in saved:
                return None
            import torch

            t = ckpt.tensors[key]
            value = np.load(saved[key])
            value = value if FAMILIES[layers.family].in_axis == 1 else value.T  # GPT-2's Conv1D: [in, out]
            return _stored(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)), t.code).reshape(t.shape)

        files = _write(ckpt, dst, config, updates, renamed, {}, data, force=force, made=made)
    runs = layers.absorbers(kept, saved)[1]
    report = _layers_report(scores)
    before, after = _size(ckpt, renamed, {})
    notes = _order_notes(scores)
    return StructureShrink(report, {name: kept}, before, after, updates, files, list(ckpt.left), runs, notes)


def decide_layers(
    src: Any,
    dst: str,
    amount: int | float,
    calibration: str,
    stack: contextlib.ExitStack,
    *,
    scores: UnitScores | None = None,
    compensated: bool = True,
    damp: float = 0.01,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
) -> UnitScores:
    """Choose the kept layers (unless `scores` holds them) and refit each run of removed layers.

    Without `scores`, the layers are chosen by :func:`choose_layers` (`compensated`) or by
    their :func:`score_layers` scores; `scores` without ``kept`` are ranked as they are
    (lowest go). Each run's refit projection
    (:meth:`~arrayprune.adapters.roles.hf_groups.HfLayers.writer` of the kept layer before
    it, refit from its own weight on the run as a whole) is saved (``.npy``, float64
    ``[out, in]``) in a folder beside `dst` that lives as long as `stack`;
    :func:`shrink_layers` writes the checkpoint.
    """
    walking = {"rows": rows, "device": device, "hooks": hooks}
    if scores is None and compensated:
        scores = choose_layers(src, amount, calibration, beside=dst, damp=damp, **walking)
    elif scores is None:
        scores = UnitScores("residual_change", *score_layers(src, calibration, **walking))
    layers = scores.found
    name = layers.names[0].rsplit(".", 1)[0]
    if scores.kept is not None:
        kept = [int(i) for i in scores.kept[name]]
    else:
        kept = [int(i) for i in choose_channels(scores.scores, amount)]
    saved: dict[str, str] = {}
    ckpt, _ = open_hf(src)
    writers, _ = layers.absorbers(kept, ckpt.tensors)
    if compensated and writers:
        workdir = stack.enter_context(workdir_beside(dst))

        def store(p: int, weight: Any, hessian: Any, cross: Any) -> Any:
            new = absorb(weight, hessian, cross, damp, overwrite_hessian=True)  # on the walk's device
            saved[writers[p]] = os.path.join(workdir, f"{p}.npy")
            np.save(saved[writers[p]], new.cpu().numpy())
            return new

        probed = layers.checked(writers)
        with _walk(ckpt, calibration, rows, device) as walk:
            removed = [i for i in range(layers.units) if i not in kept]
            absorb_removed_layers(walk, removed, writers, store, hooks, probed=probed)
    return UnitScores("residual_change", layers, scores.scores, {name: np.asarray(kept)}, saved, scores.order)


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
            report, planned = _dry_run(src, groups, spec, args, scores)
            notes = [*_notes(spec, groups), *planned]
            score = _recorded(spec, groups).method if groups in _RECORDED else None
            shrunk = ShrinkResult(report, spec.amount, score=score)
            return PruneResult(src, None, kind, spec, [], notes=notes, shrink=shrunk)
        if dst is None:
            raise PruneError("the following arguments are required: -o/--output (or --dry-run)")
        made = provenance.record(_recorded(spec, groups))
        common = {"force": spec.force, "made": made, **args}
        if groups == "layers":
            done = shrink_layers(
                src, dst, spec.amount, spec.calibration, scores=scores, compensated=spec.compensate, **common
            )
        elif groups == "experts":
            done = shrink_experts(src, dst, spec.amount, spec.calibration, scores=scores, **common)
        else:
            done = shrink_calibrated(
                src, dst, spec.amount, spec.method, spec.calibration, groups=groups, compensated=spec.compensate,
                decided=scores, **common,
            )  # fmt: skip
    written = PruneSummary(pruned=Totals(), whole=Totals(), files=done.files, left=done.left)
    written.whole.add(done.params_after, 0)
    score = _recorded(spec, groups).method if groups in _RECORDED else None
    shrunk = ShrinkResult(done.report, spec.amount, done.kept, done.params_before, done.params_after, score=score)
    changes = ", ".join(f"{k} -> {v}" for k, v in done.config.items())
    notes = [*_notes(spec, groups), *done.notes, f"{CONFIG_NAME} rewritten: {changes}"]
    notes += [
        f"layer{'s' * (len(run) > 1)} {', '.join(map(str, run))} refit into {key.removesuffix('.weight')} "
        "(what the removed layers added to the residual stream; --no-compensate: not refit)"
        for key, run in done.refits.items()
    ]
    if groups == "layers" and spec.compensate:
        ((name, kept),) = done.kept.items()
        refit = {i for run in done.refits.values() for i in run}
        plain = [i for i in range(len(done.report.scores[name])) if i not in kept and i not in refit]
    if groups == "layers" and spec.compensate and plain:
        notes.append(
            f"layer{'s' * (len(plain) > 1)} {', '.join(map(str, plain))} removed without a refit: no kept layer "
            "before them, or its last projection does not add to the residual stream as it is (a norm after it)"
        )
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
) -> tuple[UnitReport, list[str]]:
    """The units with their scores (on calibration data where the kind or method needs it), and
    for layers with an amount, notes of the projections that would absorb them."""
    if groups == "layers":
        if scores is None:
            scores = UnitScores("residual_change", *score_layers(src, spec.calibration, **args))
        layers, changes = scores.found, scores.scores
        name = layers.names[0].rsplit(".", 1)[0]
        report = _layers_report(scores)
        if not spec.compensate or spec.amount is None:
            return report, []
        chosen = scores.kept[name] if scores.kept is not None else choose_channels(changes, spec.amount)
        kept = [int(i) for i in chosen]
        _, runs = layers.absorbers(kept, open_hf(src)[0].tensors)
        return report, [
            *_order_notes(scores),
            *(
                f"layer{'s' * (len(run) > 1)} {', '.join(map(str, run))} would be refit into "
                f"{key.removesuffix('.weight')}, unless the check that it adds to the residual stream as it is "
                "fails"
                for key, run in runs.items()
            ),
        ]
    if groups == "experts":
        if scores is None:
            scores = UnitScores("router_statistics", *score_experts(src, spec.calibration, **args))
        return _expert_report(scores.found, scores.scores, spec.calibration is not None), []
    if scores is None:
        dense = score_calibrated(src, spec.method, None, spec.calibration, groups, **args)
        scores = UnitScores("unit_hessians", *dense)
    found = scores.found
    sets = [_Unitset(_Named(g.name, g.units), g.unit) for g in found.groups]
    return UnitReport(groups, sets, scores.scores, _unit_class(spec.method).DESCRIPTION + ", on the dense model"), []
