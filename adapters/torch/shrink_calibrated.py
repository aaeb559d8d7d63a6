"""Calibrated group scores for :func:`~arrayprune.adapters.torch.shrink`: consumers, Hessians, scores, refits.

With a calibrated structured method (``activation_structured``, ``obs_structured``, or any
:class:`arrayprune.UnitPruningMethod`) and calibration batches, a channel group is scored by
the layers that *read* its channels, its consumers, on what they read:

* :func:`consumers` finds every consumer of the groups that can shrink (a ``Linear``'s input
  columns, a ``Conv1d``/``Conv2d`` with ``groups=1``: each input channel is the ``kh * kw``
  contiguous columns of its im2col matrix) and refuses, in one line naming the group and
  the layer, a group read where that statistic cannot be taken (grouped, transposed or 3-D
  convolutions reading it);
* :func:`input_hessians` runs the batches through the model once (evaluation mode, no
  gradients, the modes restored and the hooks removed afterwards, also on error) and keeps
  per consumer ``H = X^T X`` of its input rows (float64, on the input's device): the tokens
  of a ``Linear`` (all leading axes), the im2col columns of a convolution;
* :func:`channel_scores` scores each channel in every consumer with the method's
  :meth:`~arrayprune.UnitPruningMethod.unit_scores` (the consumer's whole weight and
  Hessian, its input channels as units; a group read at an offset of a ``torch.cat`` takes
  that range) and combines the consumers' scores with
  :meth:`~arrayprune.UnitPruningMethod.combine_scores`;
* :func:`refits` gives each consumer its new weight once the channels are chosen: the kept
  columns refit by :func:`arrayprune.structured.compensate` (one solve over all its kept
  columns, whatever groups they belong to), the removed ones zero.

Statistics come from the dense model in one pass: a consumer's refit does not see the
refits of the layers before it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arrayprune.structured_methods import UnitPruningMethod

from ._base import pruning_hooks
from ._group_walk import Slot, TorchGroup
from .calibration import _run
from .reconstruction import _batch_list, _conv_patches, _input_of

__all__ = ["Consumer", "channel_scores", "consumers", "input_hessians", "refits"]


@dataclass(frozen=True)
class Consumer:
    """A layer reading the channels of groups that can shrink.

    Attributes
    ----------
    param : str
        Qualified name of its weight (``"layer2.0.conv1.weight"``).
    modules : tuple of torch.nn.Module
        The layers applying that weight (more than one where it is tied).
    per : int
        Columns of the weight's ``[out, -1]`` matrix per input channel: 1 for a
        ``Linear``, ``kh * kw`` for a convolution.
    """

    param: str
    modules: tuple[nn.Module, ...]
    per: int


def _owner(model: nn.Module, name: str) -> tuple[str, nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return module_name, model.get_submodule(module_name), attr


def _stored(module: nn.Module, attr: str) -> Any:
    """The tensor object a module stores for `attr` (``<attr>_orig`` while it is pruned)."""
    if attr + "_orig" in module._parameters:
        return module._parameters[attr + "_orig"]
    return module._parameters.get(attr, module._buffers.get(attr))


def _reader(group: TorchGroup, module_name: str, module: nn.Module, slot: Slot) -> int | None:
    """Columns per channel if `slot` makes `module` a consumer of `group`; None for a producer
    or a depthwise filter (sliced only). Refuses a reader whose statistic cannot be taken."""
    if isinstance(module, nn.Linear):
        return 1 if slot.axis == 1 else None
    if isinstance(module, nn.modules.conv._ConvNd):
        reads = slot.axis == (0 if module.transposed else 1)
        if not reads:
            return None
        if isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.groups == 1:
            return math.prod(module.kernel_size)
        kind = f"{type(module).__name__}, groups={module.groups}"
    else:
        kind = type(module).__name__
    raise ValueError(
        f"group {group.name!r}: {module_name} ({kind}) reads its channels, and calibrated scores are taken on "
        "the inputs of Linear and Conv1d/Conv2d layers with groups=1 only"
    )


def consumers(model: nn.Module, groups: Sequence[TorchGroup]) -> tuple[dict[str, Consumer], list[list[Slot]]]:
    """The consumers of `groups` (by weight name) and, per group, the slots where they read it.

    Raises
    ------
    ValueError
        A group read by a layer whose input statistic cannot be taken, or read by none;
        one line naming the group (and the layer).
    """
    found: dict[str, Consumer] = {}
    reads: list[list[Slot]] = []
    for group in groups:
        slots = []
        for slot in group.members:
            if not slot.weight:
                continue
            module_name, module, attr = _owner(model, slot.param)
            per = _reader(group, module_name, module, slot)
            if per is None:
                continue
            if slot.param not in found:
                tensor = _stored(module, attr)
                layers = tuple(
                    m for m in model.modules() if type(m) is type(module) and _stored(m, attr) is tensor
                )  # fmt: skip
                found[slot.param] = Consumer(slot.param, layers or (module,), per)
            slots.append(slot)
        if not slots:
            raise ValueError(f"group {group.name!r}: no Linear or convolution reads its channels to score them on")
        reads.append(slots)
    return found, reads


def check_masks(model: nn.Module, found: Mapping[str, Consumer]) -> None:
    """Refuse a refit of a consumer whose weight carries a pruning mask (the refit would fill its zeros)."""
    for param in found:
        _, module, attr = _owner(model, param)
        if pruning_hooks(module, attr):
            raise ValueError(
                f"{param} carries a pruning mask and compensate=True would refit its kept columns densely: make the "
                "mask permanent first (prune.remove) or pass compensate=False"
            )


def _columns(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module`'s input rows ``[rows, in * per]`` in float64: tokens of a Linear, im2col columns of a convolution."""
    x = x.detach()
    rows = x if isinstance(module, nn.Linear) else _conv_patches(module, x)[0]  # groups=1: one matrix
    return rows.reshape(-1, rows.shape[-1]).to(torch.float64)


def input_hessians(model: nn.Module, found: Mapping[str, Consumer], batches: Iterable[Any]) -> dict[str, torch.Tensor]:
    """``X^T X`` of every consumer's input rows over the batches, in one pass (float64).

    Raises
    ------
    TypeError
        If `batches` is a tensor or not an iterable.
    ValueError
        If there is no batch, or the batches never reach a consumer.
    RuntimeError
        If the model does not run on a batch.
    """
    batches = _batch_list(batches)
    sums: dict[str, torch.Tensor] = {}

    def hook_for(param: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            rows = _columns(module, _input_of(args, kwargs))
            gram = rows.T @ rows
            sums[param] = gram if param not in sums else sums[param] + gram

        return hook

    modes = {m: m.training for m in model.modules()}
    handles = []
    try:
        for param, c in found.items():
            for m in c.modules:
                handles.append(m.register_forward_pre_hook(hook_for(param), with_kwargs=True))
        model.eval()
        with torch.no_grad():
            for batch in batches:
                _run(model, batch)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"{type(model).__name__} does not run on calibration_batches: {first}") from None
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    missing = [p for p in found if p not in sums]
    if missing:
        raise ValueError(f"the calibration batches never reached the layer of {missing[0]!r}")
    return sums


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """``[out, in * per]`` in float64: a convolution's weight flattened after its first axis."""
    return weight.detach().to(torch.float64).reshape(weight.shape[0], -1)


def _reads(reads: Sequence[Sequence[Slot]]) -> list[list[tuple[str, int]]]:
    return [[(slot.param, slot.offset) for slot in slots] for slots in reads]


def channel_scores(
    method: UnitPruningMethod,
    groups: Sequence[TorchGroup],
    reads: Sequence[Sequence[Slot]],
    found: Mapping[str, Consumer],
    weights: Mapping[str, torch.Tensor],
    hessians: Mapping[str, torch.Tensor],
) -> list[torch.Tensor]:
    """Per group, one score per channel: ``method.group_scores`` over its consumers
    (``per`` columns a channel, a group at its offset)."""
    scores = method.group_scores(
        _reads(reads), [g.channels for g in groups], lambda param: _matrix(weights[param]), hessians,
        {param: c.per for param, c in found.items()},
    )  # fmt: skip
    return [s for s in scores if s is not None]  # every group has a consumer (see consumers)


def refits(
    method: UnitPruningMethod,
    groups: Sequence[TorchGroup],
    kept: Sequence[torch.Tensor],
    reads: Sequence[Sequence[Slot]],
    found: Mapping[str, Consumer],
    weights: Mapping[str, torch.Tensor],
    hessians: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Each consumer that loses columns, its new weight (its shape and dtype):
    ``method.refit_consumers``."""
    new = method.refit_consumers(
        [k.cpu().tolist() for k in kept], _reads(reads), [g.channels for g in groups],
        lambda param: _matrix(weights[param]), hessians, {param: c.per for param, c in found.items()},
    )  # fmt: skip
    return {param: w.reshape(weights[param].shape).to(weights[param].dtype) for param, w in new.items()}
