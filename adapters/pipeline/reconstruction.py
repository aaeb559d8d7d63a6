"""SparseGPT on ONNX models: Hessians from calibration data run by onnxruntime.

:func:`onnx_sparsegpt` prunes the layer weights of an ONNX model with SparseGPT
(:func:`arrayprune.sparsegpt`) and updates the entries it keeps. Each weight's Hessian
``X^T X / n`` comes from the activations it multiplies (``MatMul`` A, ``Gemm`` A, a
convolution's X: :func:`~arrayprune.adapters.roles.onnx_graph.weight_feeds`), read as
extra graph outputs while onnxruntime runs the calibration batches, and reduced at once
into a :class:`~arrayprune.HessianAccumulator` (convolutions: the patches of
:func:`~arrayprune.unfold_patches`, one Hessian per group); activations are never
stored whole.

Sequential calibration (the paper's setting, the default): weights are processed in
data-flow order, and each one's Hessian is computed on the model whose earlier weights
are already pruned and updated. The target weights are graph *inputs* of one
onnxruntime session, fed their current values on every run; the weights of one depth
(:func:`~arrayprune.adapters.roles.onnx_graph.weight_levels`: none feeds another) share
a calibration pass, so a chain of ``L`` layers takes ``L`` passes and memory holds the
Hessians of one depth at a time. ``sequential=False`` takes every Hessian from the dense
model in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

import arrayprune
from arrayprune import amount as _amount
from arrayprune.adapters.blas_threads import blas_threads
from arrayprune.adapters.pipeline.calibration import (
    BATCH_SIZE,
    _check_inputs,
    _fed_inputs,
    _open_session,
    _prepared_model,
    _run_batches,
)
from arrayprune.adapters.pipeline.onnx_stages import LevelRunner
from arrayprune.adapters.roles.onnx_graph import onnx_roles, weight_feeds, weight_levels
from arrayprune.reconstruction import check_sparsegpt_options
from arrayprune.registry import reconstruction_method, settings_for

__all__ = ["Reconstructed", "amounts_from_masks", "onnx_input_hessians", "onnx_sparsegpt"]

#: The operators whose weights SparseGPT reconstructs here.
OPERATORS = ("MatMul", "Gemm", "Conv")

# Operators between a convolution's weight and the Conv that keep its layout.
_LAYOUT_KEEPING = ("Cast", "CastLike", "Identity")


class Reconstructed(NamedTuple):
    """One weight pruned by SparseGPT.

    Attributes
    ----------
    weight : ndarray
        The updated weight: its shape and dtype, zero where pruned.
    mask : ndarray
        Boolean keep mask shaped like it (False where pruned).
    """

    weight: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True)
class _Target:
    """A weight to reconstruct: how its Hessian is gathered and how it is pruned."""

    name: str
    feeds: tuple[Any, ...]  # Feed, one per use
    reduction_axis: int
    groups: int  # convolution groups (one Hessian each), else 1
    k: int  # length of the reduction (per group)
    conv: bool
    kernel: tuple[int, ...] = ()  # a convolution's kernel size (the weight's last axes)


def onnx_sparsegpt(
    wf: Any,
    names: Iterable[str],
    calibration: Mapping[str, np.ndarray],
    *,
    amount: int | float | Mapping[str, int | float] | None = None,
    n: int | None = None,
    m: int | None = None,
    block_size: int = 128,
    damp: float = 0.01,
    sequential: bool = True,
    batch_size: int | None = None,
    method: str | type = "sparsegpt",
) -> dict[str, Reconstructed]:
    """Prune weights of an ONNX model with SparseGPT (or another method of
    :data:`arrayprune.METHODS` that carries a solver), their Hessians from calibration data.

    Parameters
    ----------
    wf : WeightFile
        The ONNX model, as :func:`arrayprune.adapters.formats.load` read it; not modified.
    names : iterable of str
        The weights (initializers) to prune: ``MatMul`` B ``[K, N]`` (reduction axis 0),
        ``Gemm`` B (``[N, K]`` with ``transB=1``: axis 1), A of either, and ``Conv`` W
        ``[out, in/groups, kh, kw]``, read directly or through ``Transpose``, ``Cast``
        and the other chains of the roles (a convolution weight only through ``Cast``
        and ``Identity``).
    calibration : mapping of str to ndarray
        Every graph input (initializers aside) to samples along axis 0, as for
        :func:`~arrayprune.adapters.pipeline.calibration.onnx_input_norms`.
    amount : int or float, or mapping of str to int or float, optional
        Fraction of each weight's entries to prune, or their number:
        ``round(amount * weight.size)`` per weight, exactly. A mapping gives each weight
        its own (every name needs one): the per-weight counts of a global ranking, say
        (:func:`amounts_from_masks`).
    n, m : int, optional
        An N:M pattern (2 and 4 for 2:4) along each weight's reduction axis, instead of
        `amount`.
    block_size, damp
        As for :func:`arrayprune.sparsegpt`.
    sequential : bool, default True
        Calibrate each weight on the model whose earlier weights (in data-flow order)
        are already pruned and updated; False: every Hessian from the dense model, in
        one pass.
    batch_size : int, optional
        Samples run at a time; :data:`~arrayprune.adapters.pipeline.calibration.BATCH_SIZE` if
        omitted.
    method : str or type, default "sparsegpt"
        The method (a name of :data:`arrayprune.METHODS`, or a subclass of
        :class:`arrayprune.ReconstructionMethod`) that prunes each weight from its
        Hessian (``block_size`` and ``damp`` go to it if its constructor takes them).

    Returns
    -------
    dict of str to Reconstructed
        Each weight's updated values and keep mask, in data-flow order. Nothing else of
        the model changes (biases included).

    Raises
    ------
    ValueError
        Before anything is computed: a bad amount or pattern, a name that is not a
        weight of a ``MatMul``, ``Gemm`` or ``Conv`` this function can read (a bias, a
        ``ConvTranspose`` weight, a convolution weight behind a ``Transpose``, a use in
        a subgraph, ...: the message names it), or calibration data that does not match
        the graph's inputs or is not finite (as :func:`onnx_input_norms` raises them);
        later, if onnxruntime fails or a Hessian is not positive definite after damping.
    TypeError
        For options of the wrong type (as :func:`arrayprune.sparsegpt`).
    ImportError
        If onnx or onnxruntime is missing.

    Notes
    -----
    A weight used by several operators gets one Hessian, summed over all its uses
    (their squared errors add up). With ``groups`` > 1 a convolution is pruned group
    by group (the output slice of each group with its own Hessian), the count
    ``round(amount * weight.size)`` shared among groups to within one entry. A model
    with external data is handed to onnxruntime by path (see
    :func:`~arrayprune.adapters.pipeline.calibration.onnx_input_norms`). While every Hessian is
    at most :data:`~arrayprune.adapters.blas_threads.SMALL` wide, BLAS runs on one
    thread (:func:`~arrayprune.adapters.blas_threads.blas_threads`).
    """

    cls = reconstruction_method(method)
    settings = settings_for(cls, {"block_size": block_size, "damp": damp})
    names = list(dict.fromkeys(names))
    amounts = _amounts(amount, names)
    if not isinstance(amount, Mapping):  # options first; per-weight amounts are checked with their weights
        check_sparsegpt_options(amount, n, m, block_size, damp)
    model = wf.context["model"]
    feeds, roles = weight_feeds(model), onnx_roles(model)
    targets = {name: _target(wf, name, feeds.get(name), roles.get(name)) for name in names}
    for name in names:
        try:
            check_sparsegpt_options(amounts[name], n, m, block_size, damp, size=int(wf.params[name].size))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{name!r}: {exc}") from None
    try:
        levels = weight_levels(model, {name: list(t.feeds) for name, t in targets.items()})
    except ValueError:
        if sequential:
            raise
        levels = [names]  # weights feeding each other: from the dense model, any order does
    order = [name for level in levels for name in level]
    if not sequential:
        levels = [order]
    activations = sorted({f.activation for t in targets.values() for f in t.feeds})
    fed = {name: wf.params[name].dtype for name in names} if sequential else {}
    prepared = _prepared_model(wf, activations, fed)
    session = _open_session(wf, prepared)
    inputs = _fed_inputs(model, fed)
    casts, samples = _check_inputs(session, calibration, inputs.values())

    runner = None
    if sequential and len(levels) > 1:  # each level runs its own part of the graph only
        wanted = [sorted({f.activation for x in level for f in targets[x].feeds}) for level in levels]
        runner = LevelRunner.for_levels(wf, wanted, fed, prepared)

    current = {name: wf.params[name] for name in names}
    done: dict[str, Reconstructed] = {}
    kept = runner if runner is not None else nullcontext()  # a runner removes the values it wrote to disk
    with kept, blas_threads(max(t.k for t in targets.values())):  # small Hessians: one BLAS thread
        for index, level in enumerate(levels):
            weights = {inputs[name]: current[name] for name in names} if sequential else None
            level_targets = [targets[x] for x in level]
            if runner is not None and weights is not None:
                batches = runner.run(index, calibration, casts, samples, batch_size or BATCH_SIZE, weights)
                hessians = _hessians_of(batches, level_targets)
            else:
                hessians = _hessians(session, calibration, casts, samples, level_targets, batch_size, weights)
            for name in level:
                chosen = cls(amount=amounts[name], n=n, m=m, **settings)
                done[name] = _prune(targets[name], current[name], hessians.pop(name), chosen)
                current[name] = done[name].weight
    return {name: done[name] for name in order}


def onnx_input_hessians(
    wf: Any, names: Iterable[str], calibration: Mapping[str, np.ndarray], *, batch_size: int | None = None
) -> dict[str, np.ndarray]:
    """``X^T X`` of the input rows of ONNX weights over calibration data, from the dense model in one pass.

    The rows are what :func:`onnx_sparsegpt` takes its Hessians from (a ``MatMul`` or
    ``Gemm`` A's feature vectors, a convolution's patches, channel-major), summed, not
    divided by their count: the statistic a calibrated structured method scores
    channels on (:func:`arrayprune.adapters.shrink.shrink_onnx`, ``hessians``).

    Parameters
    ----------
    wf : WeightFile
        The ONNX model, as :func:`arrayprune.adapters.formats.load` read it; not modified.
    names : iterable of str
        Weights of ``MatMul``, ``Gemm`` or ``Conv`` with ``group=1``.
    calibration : mapping of str to ndarray
        Every graph input (initializers aside) to samples along axis 0.
    batch_size : int, optional
        Samples run at a time; :data:`~arrayprune.adapters.pipeline.calibration.BATCH_SIZE` if omitted.

    Returns
    -------
    dict of str to ndarray
        Weight name -> ``[K, K]`` float64 (``K`` its input features; ``in * kh * kw``
        for a convolution).

    Raises
    ------
    ValueError
        A name that is not such a weight, calibration data that do not fit the graph,
        onnxruntime failing.
    ImportError
        If onnx or onnxruntime is missing.
    """
    names = list(dict.fromkeys(names))
    model = wf.context["model"]
    feeds, roles = weight_feeds(model), onnx_roles(model)
    targets = [_target(wf, name, feeds.get(name), roles.get(name)) for name in names]
    for t in targets:
        if t.groups != 1:
            raise ValueError(f"{t.name!r} is the weight of a grouped convolution (group={t.groups})")
    if not targets:
        return {}
    prepared = _prepared_model(wf, sorted({f.activation for t in targets for f in t.feeds}), {})
    session = _open_session(wf, prepared)
    casts, samples = _check_inputs(session, calibration, [])
    with blas_threads(max(t.k for t in targets)):
        hessians = _hessians(session, calibration, casts, samples, targets, batch_size, None, sums=True)
    return {name: np.asarray(hessians[name][0], dtype=np.float64) for name in names}


def _amounts(amount: Any, names: list[str]) -> dict[str, Any]:
    """Each weight's amount: `amount` itself, or its entry when it is a mapping."""
    if not isinstance(amount, Mapping):
        return dict.fromkeys(names, amount)
    missing = [name for name in names if name not in amount]
    if missing:
        raise ValueError(f"amount is a mapping without an entry for {missing[0]!r}")
    return {name: amount[name] for name in names}


def amounts_from_masks(masks: Mapping[str, Any]) -> dict[str, int]:
    """The number of entries each mask prunes: per-weight counts for :func:`onnx_sparsegpt`.

    Parameters
    ----------
    masks : mapping of str to array
        Keep masks (False or 0 where pruned), e.g. of a global ranking
        (:func:`arrayprune.global_unstructured`).

    Returns
    -------
    dict of str to int
        Name to its count of pruned entries: SparseGPT then prunes as many entries of
        each weight as the ranking did, choosing which and updating the rest itself.
    """
    return {name: int(np.size(mask) - np.count_nonzero(np.asarray(mask))) for name, mask in masks.items()}


def _target(wf: Any, name: str, feeds: Any, role: Any) -> _Target:
    """What reconstructing `name` needs, or a ValueError saying why it cannot be."""
    if feeds is None:
        why = f" ({role.why})" if role is not None else " (not an initializer of the graph)"
        raise ValueError(f"{name!r} is not a MatMul, Gemm or Conv weight{why}: SparseGPT cannot reconstruct it")
    if isinstance(feeds, str):
        raise ValueError(f"{name!r} cannot be calibrated ({feeds})")
    for f in feeds:
        if f.node is None or f.node.op_type not in OPERATORS:
            raise ValueError(f"{name!r}: {f.why}: SparseGPT reconstructs {', '.join(OPERATORS)} weights only")
    weight = wf.params.get(name)
    if weight is None or np.asarray(weight).dtype.kind != "f":
        raise ValueError(f"{name!r}: SparseGPT needs a floating weight")
    if role.reduction_axis is None or role.output_axis is None:
        raise ValueError(f"{name!r}: its axes are unknown ({role.why})")
    conv = [f for f in feeds if f.node.op_type == "Conv"]
    if conv:
        moved = [op for f in conv for op in f.chain if op not in _LAYOUT_KEEPING]
        if moved:
            raise ValueError(f"{name!r}: {conv[0].why}: a convolution weight behind {moved[0]} is not supported")
        if weight.ndim != 4 or len(conv) != len(feeds):
            raise ValueError(f"{name!r}: {conv[0].why}: only 2-D convolutions are supported (weight of 4 dimensions)")
        groups = {f.groups for f in conv}
        if len(groups) != 1:
            raise ValueError(f"{name!r}: used by convolutions with different groups {sorted(groups)}")
        (g,) = groups
        return _Target(name, tuple(feeds), 1, g, math.prod(weight.shape[1:]), True, tuple(weight.shape[2:]))
    if weight.ndim != 2:
        raise ValueError(f"{name!r}: {feeds[0].why}: SparseGPT needs a 2-D weight, got shape {tuple(weight.shape)}")
    return _Target(name, tuple(feeds), role.reduction_axis, 1, int(weight.shape[role.reduction_axis]), False)


def _hessians(
    session: Any,
    calibration: Mapping[str, np.ndarray],
    casts: Mapping[str, Any],
    samples: int,
    targets: list[_Target],
    batch_size: int | None,
    weights: Mapping[str, np.ndarray] | None,
    sums: bool = False,
) -> dict[str, list[Any]]:
    """The Hessians of `targets` (one per group) over the calibration data, in one pass."""
    wanted = sorted({f.activation for t in targets for f in t.feeds})
    batches = _run_batches(session, calibration, casts, samples, wanted, batch_size, weights)
    return _hessians_of(batches, targets, sums)


def _hessians_of(
    batches: Iterable[Mapping[str, np.ndarray]], targets: list[_Target], sums: bool = False
) -> dict[str, list[Any]]:
    """The Hessians of `targets` (one per group) over `batches` of activations (`sums`: ``X^T X``, else ``/ rows``).

    Weights that multiply the same activations the same way (the query, key and value
    projections of an attention layer) share one accumulator: their Hessians are one.
    """
    shared: dict[Any, str] = {}  # what fixes a Hessian -> the first weight with it
    owner: dict[str, str] = {}
    accumulators: dict[str, tuple[_Target, list[Any]]] = {}
    for t in targets:
        key = _same_inputs(t)
        if key is not None and key in shared:
            owner[t.name] = shared[key]
            continue
        if key is not None:
            shared[key] = t.name
        owner[t.name] = t.name
        accumulators[t.name] = (t, [arrayprune.HessianAccumulator(t.k) for _ in range(t.groups)])
    for outputs in batches:
        for t, accs in accumulators.values():
            for f in t.feeds:
                try:
                    _accumulate(accs, t, f, outputs[f.activation])
                except ValueError as exc:
                    raise ValueError(f"{t.name!r}: activation {f.activation!r}: {exc}") from None
    hessians = {
        name: [acc.gram() if sums else acc.hessian() for acc in accs]
        for name, (_, accs) in accumulators.items()
    }
    return {t.name: hessians[owner[t.name]] for t in targets}


def _same_inputs(target: _Target) -> Any:
    """What fixes the Hessian of a weight that is no convolution (its feeds and width); None for a convolution."""
    if target.conv:
        return None
    return target.k, tuple((f.activation, f.feature_axis) for f in target.feeds)


def _accumulate(accumulators: list[Any], target: _Target, feed: Any, activation: np.ndarray) -> None:
    """Add one batch of a weight's activation to its Hessian(s)."""
    a = np.asarray(activation)
    if target.conv:
        patches = _conv_patches(a, feed.node, target.kernel, target.groups)
        for g, acc in enumerate(accumulators):
            acc.update(patches[g])
        return
    rows = a.reshape(1, -1) if a.ndim == 1 else np.moveaxis(a, feed.feature_axis, -1)
    accumulators[0].update(rows)


def _conv_patches(x: np.ndarray, node: Any, kernel: tuple[int, ...], groups: int) -> np.ndarray:
    """The patches a ``Conv`` node reads from its input `x` ``[N, C, H, W]``: ``[groups, rows, K]``.

    Its ``strides``, ``dilations``, ``pads`` (begins then ends: asymmetric padding is
    applied here) and ``auto_pad`` are honoured; `kernel` is the weight's ``[kh, kw]``.
    """
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if x.ndim != 4:
        raise ValueError(f"a 2-D convolution's input must be [N, C, H, W], got shape {x.shape}")
    strides = [int(s) for s in attrs.get("strides", (1, 1))]
    dilations = [int(d) for d in attrs.get("dilations", (1, 1))]
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations, strict=True):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
    elif auto == "VALID":
        begins, ends = [0, 0], [0, 0]
    else:
        pads = [int(p) for p in attrs.get("pads", (0, 0, 0, 0))]
        begins, ends = pads[:2], pads[2:]
    if any(begins) or any(ends):
        x = np.pad(x, ((0, 0), (0, 0), (begins[0], ends[0]), (begins[1], ends[1])))
    return arrayprune.unfold_patches(x, tuple(kernel), stride=tuple(strides), dilation=tuple(dilations), groups=groups)


def _prune(target: _Target, weight: np.ndarray, hessians: list[Any], method: Any) -> Reconstructed:
    """`method`'s reconstruction of one weight (group by group for a grouped convolution)."""
    amount = method.amount
    try:
        if target.groups == 1:
            new, keep = method.reconstruct(weight, hessians[0], reduction_axis=target.reduction_axis)
            return Reconstructed(np.ascontiguousarray(new), np.ascontiguousarray(keep))
        total = None if amount is None else _amount.compute_nparams_toprune(amount, weight.size)
        size = weight.shape[0] // target.groups
        parts = []
        for g, h in enumerate(hessians):
            share = None if total is None else _share(total, target.groups, g + 1) - _share(total, target.groups, g)
            part = method if share is None else type(method)(**{**method.options(), "amount": share})
            parts.append(part.reconstruct(weight[g * size : (g + 1) * size], h, reduction_axis=1))
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{target.name!r}: {exc}") from None
    return Reconstructed(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _share(total: int, parts: int, upto: int) -> int:
    """``floor(total * upto / parts + 1/2)``: the entries pruned in the first `upto` parts."""
    return (2 * total * upto + parts) // (2 * parts)
