"""Sensitivity scans of a Hugging Face folder, decoder layer by decoder layer, on token ids.

``arrayprune scan FOLDER --calibration tokens.npz -o scan.json`` on a folder holding
``config.json`` beside safetensors weights (sharded or not) walks the model as the
calibrated pruning of a folder does (:class:`~arrayprune.adapters.pipeline.hf_structure.LayerWalk`):
the embeddings run once, then each decoder layer in turn has its weights read from the
shards (float32), runs on its inputs from the dense model, and hands its dense outputs
to the next layer. Within a layer, every selected weight is pruned alone (the layer's
other weights and every other layer dense) at each scanned sparsity, by the pipeline's
mask for it (:func:`arrayprune.adapters.pipeline.scan._masked`), and the layer is run
again.

The value of a curve is the relative squared error of that decoder layer's output hidden
states against the dense layer's, ``sum((h - h0)^2) / sum(h0^2)`` over the calibration
tokens (those of ``attention_mask`` 1, where the file has one): the error the pruned
weight makes where it acts, with the layer's inputs those of the dense model. It is a
local measure, cheaper than running the rest of the model for every trial: one layer's
forward per weight and sparsity.

Memory: one decoder layer's weights, the calibration activations of its inputs and dense
outputs, and one trial's outputs.

The result is a :class:`~arrayprune.adapters.pipeline.scan.ScanResult` under the
checkpoint's tensor names and shapes, so that ``arrayprune prune FOLDER --allocation
scan.json`` reads its curves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from arrayprune.adapters.pipeline.devices import checked_device
from arrayprune.adapters.pipeline.hf_structure import _FUSED, _RENAMED, LayerWalk
from arrayprune.adapters.pipeline.method_names import reconstructs, scan_methods
from arrayprune.adapters.pipeline.scan import (
    DEFAULT_SPARSITIES,
    Curve,
    ScanResult,
    _calibrated,
    _masked,
    _targets,
    check_sparsities,
)
from arrayprune.adapters.roles.names import tree_roles

__all__ = ["HF_METRIC", "hf_scan_methods", "scan_hf"]

#: What the curves of a Hugging Face scan are.
HF_METRIC = (
    "relative squared error of the decoder layer's output hidden states against the dense layer's, "
    "on the dense model's inputs to that layer, over the calibration tokens"
)


def hf_scan_methods() -> tuple[str, ...]:
    """The methods a scan of a Hugging Face folder prunes with: those ranking a weight's own values."""
    return tuple(m for m in scan_methods() if not _calibrated(m) and not reconstructs(m))


def _layer_of(name: str, prefix: str, count: int) -> int:
    head = prefix + "."
    index = name[len(head) :].split(".", 1)[0] if name.startswith(head) else ""
    if not index.isdigit() or int(index) >= count:
        raise ValueError(
            f"{name!r} is outside the decoder layers ({prefix}.N): a scan of a Hugging Face folder measures "
            "the weights of its decoder layers (see --include, --exclude)"
        )
    return int(index)


def _weight(walk: LayerWalk, layer: Any, index: int, name: str) -> Any:
    """The tensor of `layer` that the checkpoint stores as `name`: a module's ``weight``, or
    one expert's rows of a fused ``[experts, ...]`` parameter (a view, written in place)."""
    try:
        return walk.module(layer, index, name).weight
    except AttributeError:
        pass
    inner = "." + name.removeprefix(f"{walk.prefix}.{index}.")
    for stored, model in _RENAMED:
        inner = inner.replace(stored, model)
    experts, _, rest = inner[1:].rpartition(".experts.")
    parts = rest.split(".")
    if experts and len(parts) == 3 and parts[0].isdigit() and parts[2] == "weight":
        expert, leaf = int(parts[0]), parts[1]
        base = name[: len(name) - len(rest)]  # the stored prefix of this expert's tensors
        for fused, orders in _FUSED.items():
            for order in orders:
                if leaf in order:
                    before = order[: order.index(leaf)]
                    start = sum(int(walk.source.tensors[f"{base}{expert}.{n}.weight"].shape[0]) for n in before)
                    param = getattr(layer.get_submodule(experts + ".experts"), fused)
                    rows = int(walk.source.tensors[name].shape[0])
                    view = param[expert, start : start + rows]
                    if tuple(view.shape) == tuple(walk.source.tensors[name].shape):
                        return view
    raise ValueError(f"{name!r} is no weight of a module or expert of layer {index} that the scan can prune alone")


def _squares(outputs: Sequence[Any], dense: Sequence[Any], masks: Sequence[Any]) -> float:
    """``sum((outputs - dense)^2)`` (``dense`` alone where `outputs` is None) over the kept tokens, in float64."""
    total: Any = 0.0
    for out, ref, mask in zip(outputs, dense, masks, strict=True):
        diff = ref if out is None else out - ref
        per_token = (diff.double() ** 2).sum(-1)
        if mask is not None:
            per_token = per_token * mask.to(per_token.dtype)
        total = total + per_token.sum()  # on the device: one read back at the end
    return float(total)


def scan_hf(
    source: Any,
    folder: str,
    calibration: str,
    *,
    method: str = "l1_unstructured",
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    calibration_batch: int | None = None,
    device: Any = None,
    progress: Callable[..., Iterable[Any]] | None = None,
) -> ScanResult:
    """Scan the decoder-layer weights of a Hugging Face checkpoint on calibration token ids.

    Parameters
    ----------
    source : ShardedCheckpoint
        The checkpoint's tensors (:func:`arrayprune.adapters.formats.sharded.open_checkpoint`).
    folder : str
        Its folder (``config.json``).
    calibration : str
        A ``.npz`` of ``input_ids`` ``[batch, seq]`` (and optionally ``attention_mask``).
    method : str, default "l1_unstructured"
        One of :func:`hf_scan_methods`.
    sparsities : sequence of float
        At least five, ascending, in ``(0, 1)``.
    include, exclude, min_size
        The selection, as for ``arrayprune prune`` (the default: every layer weight).
    calibration_batch : int, optional
        Sequences run at a time.
    device : str, optional
        Where the layers run (``cpu`` by default).
    progress : callable, optional
        ``progress(items, description, unit)`` wraps the loop over layers.

    Returns
    -------
    ScanResult
        One curve per selected weight, in layer order, the values :data:`HF_METRIC`.

    Raises
    ------
    ValueError
        A method or sparsities the scan does not take, no weight selected, a selected
        weight outside the decoder layers, token ids that do not fit the model, a device
        that is not here (one line).
    """
    import torch

    if method not in hf_scan_methods():
        raise ValueError(
            f"a scan of a Hugging Face folder prunes with {', '.join(hf_scan_methods())}, not {method!r}"
        )
    sparsities = check_sparsities(sparsities)
    if device is not None:
        device = str(checked_device(device))  # before anything runs
    targets = _targets(source.tensors, tree_roles(source.tensors), method, include, exclude, min_size)
    curves: list[Curve] = []
    with LayerWalk(source, folder, calibration, calibration_batch, device) as walk:
        count = len(walk.layers)
        by_layer: list[list[Any]] = [[] for _ in range(count)]
        for t in targets:
            by_layer[_layer_of(t.name, walk.prefix, count)].append(t)
        samples = sum(len(h) for h, *_ in walk.inputs)
        last = max((i for i, found in enumerate(by_layer) if found), default=-1)  # no layer after it is run
        layers = range(last + 1) if progress is None else progress(list(range(last + 1)), "scan", "layer")
        with torch.no_grad():
            for index in layers:
                with walk.loaded(index) as layer:
                    dense = walk.outputs(layer)
                    reference = _squares([None] * len(dense), dense, walk.masks) if by_layer[index] else 0.0
                    for target in by_layer[index]:
                        weight = _weight(walk, layer, index, target.name)
                        original = weight.detach().clone()
                        entry = dataclasses.replace(target, value=original.cpu().numpy())
                        errors = []
                        for s in sparsities:
                            weight.copy_(torch.from_numpy(_masked(entry, method, s, None)))
                            err = _squares(walk.outputs(layer), dense, walk.masks)
                            errors.append(err / reference if reference > 0 else err)
                        weight.copy_(original)
                        curves.append(Curve(target.name, tuple(target.shape), tuple(errors)))
                    if index < last:  # no layer after the last one scanned is run
                        walk.advance(dense)
    return ScanResult(method, sparsities, curves, [f"{walk.prefix}.N output"], samples, folder, HF_METRIC)
