"""Shrink a torch module: the pruned channels of every group physically removed.

:func:`shrink` traces the model with ``torch.fx`` (:mod:`._groups` says why not
``torch.export``), finds its channel groups (:func:`channel_groups`), decides which
channels go, from the masks already on the model or from an amount and a group score
(:func:`arrayprune.groups.group_scores`, :func:`arrayprune.groups.choose_channels`; with
a calibrated method and calibration batches, the scores of the layers reading each group,
:mod:`.shrink_calibrated`), and slices every member of every group in place: parameters
and buffers become smaller, the modules' ``in_channels``/``out_channels``/
``in_features``/``out_features``/``num_features``/``groups`` follow, and the modules
and state-dict keys stay the same.

What "equal" means: the shrunk model computes what the dense model computes with the
removed channels zeroed in *every member* of their group (producer rows and bias, norm
scale and shift, depthwise filters, consumer columns). A mask of the drop-in zeroes only
the tensor it is on: after ``ln_structured(conv, "weight", 0.5, dim=0)`` the following
BatchNorm still adds its shift ``bias - weight * mean / sqrt(var + eps)`` to the
"removed" channel, and the next layer reads that constant; shrinking removes it too, so
the shrunk model equals the masked model only where that shift is zero (or the norm's
scale and shift are masked as well).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from torch import nn

from arrayprune import amount as _amount
from arrayprune.adapters.pipeline.method_names import unit_methods
from arrayprune.groups import ChannelGroup, Member, choose_channels, group_scores, resolve_method, unit_method
from arrayprune.methods import LnStructured
from arrayprune.structured_methods import UnitPruningMethod

from . import shrink_calibrated as _calibrated
from ._base import pruning_hooks
from ._groups import Slot, TorchGroup, channel_groups
from ._verbs import remove

__all__ = ["shrink", "channel_groups", "Slot", "TorchGroup"]


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return model.get_submodule(module_name), attr


def _mask(module: nn.Module, attr: str) -> torch.Tensor | None:
    if pruning_hooks(module, attr):
        mask = getattr(module, attr + "_mask", None)
        return mask if isinstance(mask, torch.Tensor) else None
    return None


def _value(module: nn.Module, attr: str) -> torch.Tensor:
    """The tensor as the model uses it (a pruned one: ``orig * mask``)."""
    mask = _mask(module, attr)
    if mask is not None:
        return (getattr(module, attr + "_orig") * mask).detach()
    return getattr(module, attr).detach()


def _slot_key(slot: Slot) -> str:
    return f"{slot.param}@{slot.axis}+{slot.offset}"


def _unfold(t: torch.Tensor, segments: int) -> torch.Tensor:
    """A grouped convolution's weight ``[out, in/g, ...]`` as ``[out/g, in, ...]``: input
    channel ``j * in/g + i`` on axis 1 reads the rows of block ``j`` at entry ``i``."""
    rows, local = t.shape[0], t.shape[1]
    parts = t.reshape(segments, rows // segments, local, *t.shape[2:]).movedim(0, 1)
    return parts.reshape(rows // segments, segments * local, *t.shape[2:])


def _fold(u: torch.Tensor, segments: int) -> torch.Tensor:
    """The inverse of :func:`_unfold`."""
    rows, width = u.shape[0], u.shape[1]
    parts = u.reshape(rows, segments, width // segments, *u.shape[2:]).movedim(1, 0)
    return parts.reshape(segments * rows, width // segments, *u.shape[2:])


def _channels(t: torch.Tensor, slot: Slot, channels: int) -> torch.Tensor:
    """The part of `t` holding the slot's channels, along ``slot.axis``."""
    if slot.segments > 1:
        t = _unfold(t, slot.segments)
    return t.narrow(slot.axis, slot.offset, channels)


def _per_channel(t: torch.Tensor, slot: Slot, channels: int) -> torch.Tensor:
    """``[channels, -1]``: the slot's channels first, the rest flattened."""
    return _channels(t, slot, channels).movedim(slot.axis, 0).reshape(channels, -1)


_ROUNDINGS = ("nearest", "keep_floor")


def _count(amount: int | float, units: int, rounding: str) -> int:
    """The units a fraction removes: ``round(amount * units)``, or with ``"keep_floor"``
    all but ``int((1 - amount) * units)`` (Torch-Pruning's rule); a count as it is."""
    if rounding == "keep_floor" and isinstance(amount, float):
        return units - int((1 - amount) * units)
    return _amount.compute_nparams_toprune(amount, units)


def _even_count(group: TorchGroup, amount: int | float, rounding: str = "nearest") -> int:
    """How many channels the group loses (whole blocks: how many blocks): with convolution
    groups, a fraction of each part; a count must split evenly."""
    if group.segments == 1:
        return _count(amount, group.channels // group.block, rounding)
    if isinstance(amount, float):
        return group.segments * _count(amount, group.channels // group.segments, rounding)
    if amount % group.segments:
        raise ValueError(
            f"group {group.name!r}: {amount} of its {group.channels} channels cannot be removed evenly from "
            f"its {group.segments} convolution groups (each must lose as many)"
        )
    return int(amount)


def _l2_scores(model: nn.Module, group: TorchGroup, method: Any, importance_scores: Mapping) -> torch.Tensor:
    """One score per channel of `group` from its weight members (a method with ``channel_scores``)."""
    arrays: dict[str, torch.Tensor] = {}
    scores: dict[str, torch.Tensor] = {}
    members = []
    for slot in group.members:
        key = _slot_key(slot)
        arrays[key] = _channels(_value(*_owner(model, slot.param)), slot, group.channels)
        if slot.param in importance_scores:
            scores[key] = _channels(importance_scores[slot.param].detach(), slot, group.channels)
        members.append(Member(key, slot.axis, slot.weight))
    core_group = ChannelGroup(members, group.channels, group.name)
    n = getattr(method, "n", None) if isinstance(method, LnStructured) else None
    power = float(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < math.inf else None
    if power is not None and len(members) > 1:
        # the norm of the concatenation, from each member's own norms (no copy of the members)
        parts = [(str(m.key), m.axis) for m in core_group.weights]
        total = sum(method.channel_scores(scores.get(k, arrays[k]), axis) ** power for k, axis in parts)
        return total ** (1.0 / power)
    return group_scores(arrays, core_group, method, importance_scores=scores)


def _block_scores(method: Any) -> Any:
    """How the channels of a GroupNorm block make its score: ``method.combine_scores`` for a
    calibrated method, else the L``n`` norm of their scores (``n`` of ``ln_structured``, 1 otherwise)."""
    if isinstance(method, UnitPruningMethod):
        return lambda per_block: method.combine_scores(list(per_block.T))
    n = getattr(method, "n", None) if isinstance(method, LnStructured) else None
    p = float(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < math.inf else 1.0
    return lambda per_block: (per_block.abs() ** p).sum(dim=1) ** (1.0 / p)


def _kept_by_score(group: TorchGroup, channel: torch.Tensor, amount: int | float, method: Any) -> torch.Tensor:
    """The channels `group` keeps, given one score per channel (see :func:`shrink` for the rules)."""
    if group.segments > 1:
        # the same count from every convolution group, ranked within it
        count = _even_count(group, amount)
        width = group.channels // group.segments
        parts = [choose_channels(part, count // group.segments) + j * width
                 for j, part in enumerate(channel.reshape(group.segments, width))]  # fmt: skip
        return torch.cat(cast(list[torch.Tensor], parts))
    if group.block == 1:
        return choose_channels(channel, amount)
    # whole blocks (a GroupNorm's groups): a block scores as the norm of its channels' scores
    blocks = _block_scores(method)(channel.reshape(-1, group.block))
    kept = choose_channels(blocks, amount)
    return (kept[:, None] * group.block + torch.arange(group.block, device=kept.device)).flatten()


def _kept_by_masks(model: nn.Module, group: TorchGroup) -> torch.Tensor:
    """The channels no mask of the group zeroes entirely."""
    dropped = torch.zeros(group.channels, dtype=torch.bool)
    for slot in group.members:
        module, attr = _owner(model, slot.param)
        mask = _mask(module, attr)
        if mask is not None:
            dropped |= (_per_channel(mask, slot, group.channels) == 0).all(dim=1).cpu()
    return torch.nonzero(~dropped).flatten()


def _check_partial(model: nn.Module, groups: list[TorchGroup], kept: list[torch.Tensor]) -> None:
    """A mask zero that no removed channel covers is a partial mask: refuse, naming the group."""
    covered: dict[str, torch.Tensor] = {}
    slots: dict[str, list[tuple[TorchGroup, Slot]]] = {}
    for group, keep in zip(groups, kept, strict=True):
        gone = torch.ones(group.channels, dtype=torch.bool)
        gone[keep] = False
        for slot in group.members:
            mask = _mask(*_owner(model, slot.param))
            if mask is None:
                continue
            slots.setdefault(slot.param, []).append((group, slot))
            cover = covered.setdefault(slot.param, torch.zeros(mask.shape, dtype=torch.bool))
            shape = [1] * mask.ndim
            shape[slot.axis] = group.channels
            if slot.segments > 1:
                unfolded = _unfold(cover, slot.segments).clone()
                unfolded.narrow(slot.axis, slot.offset, group.channels).logical_or_(gone.reshape(shape))
                covered[slot.param] = _fold(unfolded, slot.segments)
            else:
                cover.narrow(slot.axis, slot.offset, group.channels).logical_or_(gone.reshape(shape))
    for param, cover in covered.items():
        mask = _mask(*_owner(model, param))
        if mask is None:  # `covered` holds only masked parameters
            raise RuntimeError(f"{param!r} lost its pruning mask while its groups were read")
        loose = (mask.cpu() == 0) & ~cover
        if not bool(loose.any()):
            continue
        for group, slot in slots[param]:
            partial = _per_channel(loose, slot, group.channels).any(dim=1)
            if bool(partial.any()):
                c = int(torch.nonzero(partial)[0])
                raise ValueError(
                    f"group {group.name!r}: the mask of {param} zeroes part of channel {c} "
                    f"(along axis {slot.axis}); shrink removes whole channels only"
                )


def _new_sizes(module: nn.Module) -> None:
    """Set a module's size attributes from its (sliced) tensors."""
    if isinstance(module, nn.modules.conv._ConvNd):
        w = module.weight
        if getattr(module, "_depthwise", False):
            module.groups = w.shape[0]
            module.in_channels = module.out_channels = w.shape[0]
        elif module.transposed:
            module.in_channels, module.out_channels = w.shape[0], w.shape[1] * module.groups
        else:
            module.out_channels, module.in_channels = w.shape[0], w.shape[1] * module.groups
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, (nn.modules.batchnorm._NormBase, nn.modules.instancenorm._InstanceNorm)):
        t = module.weight if module.weight is not None else module.running_mean
        if t is not None:
            module.num_features = t.shape[0]
    elif isinstance(module, nn.GroupNorm):
        per_group = module.num_channels // module.num_groups
        module.num_channels = module.weight.shape[0]
        module.num_groups = module.num_channels // per_group
    elif isinstance(module, nn.PReLU):
        module.num_parameters = module.weight.numel()


def _holders(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, bool]]]:
    """By tensor identity: every (module, attribute, is a parameter) holding it (tied ones too)."""
    found: dict[int, list[tuple[nn.Module, str, bool]]] = {}
    for m in model.modules():
        for is_param, tensors in ((True, m._parameters), (False, m._buffers)):
            for a, t in tensors.items():
                found.setdefault(id(t), []).append((m, a, is_param))
    return found


def _slice(model: nn.Module, groups: list[TorchGroup], kept: list[torch.Tensor]) -> None:
    # the entries each (tensor, axis) loses: what it holds of other groups (the other parts of a
    # torch.cat, those left or losing nothing) stays
    cuts: dict[tuple[str, int, int], list[torch.Tensor]] = {}
    for group, keep in zip(groups, kept, strict=True):
        if int(keep.numel()) == group.channels:
            continue
        gone = torch.ones(group.channels, dtype=torch.bool, device=keep.device)
        gone[keep] = False
        for slot in group.members:
            cuts.setdefault((slot.param, slot.axis, slot.segments), []).append(torch.nonzero(gone)[:, 0] + slot.offset)
    depthwise = [
        m for m in model.modules()
        if isinstance(m, nn.modules.conv._ConvNd) and not m.transposed and m.groups > 1
        and m.groups == m.in_channels == m.out_channels
    ]  # fmt: skip
    touched: dict[int, nn.Module] = {}
    by_param: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    for (param, axis, segments), parts in sorted(cuts.items(), key=lambda item: item[0][2]):
        # plain cuts first: a grouped convolution's rows go before its per-block columns
        by_param.setdefault(param, []).append((axis, segments, torch.cat(parts)))
    holders = _holders(model)
    for param, items in by_param.items():
        module, attr = _owner(model, param)
        owners = holders[id(module._parameters.get(attr, module._buffers.get(attr)))]
        holder, attr, is_param = owners[0]
        old = holder._parameters[attr] if is_param else holder._buffers[attr]
        if old is None:
            raise RuntimeError(f"{param!r} holds no tensor to slice")
        new = old.detach()
        for axis, segments, removed in items:
            view = _unfold(new, segments) if segments > 1 else new
            stays = torch.ones(view.shape[axis], dtype=torch.bool, device=new.device)
            stays[removed.to(new.device)] = False
            view = view.index_select(axis, torch.nonzero(stays)[:, 0])
            new = _fold(view, segments) if segments > 1 else view
        for m, name, is_param in owners:
            if is_param:
                m._parameters[name] = nn.Parameter(new, requires_grad=old.requires_grad)
            else:
                m._buffers[name] = new
            touched[id(m)] = m
    for m in depthwise:
        m._depthwise = True  # type: ignore[assignment]
    try:
        for m in touched.values():
            _new_sizes(m)
    finally:
        for m in depthwise:
            del m._depthwise


def _amounts(amount: Any, groups: list[TorchGroup]) -> dict[str, int | float]:
    """Each group's amount, checked: one for all, or by group name (0 for groups not named)."""
    if not isinstance(amount, Mapping):
        _amount.validate_pruning_amount_init(amount)
        return {g.name: amount for g in groups}
    names = {g.name for g in groups}
    for name, a in amount.items():
        if name not in names:
            raise ValueError(f"amount names {name!r}, which is not a group that can shrink")
        _amount.validate_pruning_amount_init(a)
    return {g.name: amount.get(g.name, 0) for g in groups}


def _bake(model: nn.Module) -> None:
    """Remove every pruning hook, making its mask permanent (``prune.remove``)."""
    for module in model.modules():
        names = [h._tensor_name for h in module._forward_pre_hooks.values() if hasattr(h, "_tensor_name")]
        for name in names:
            if pruning_hooks(module, name):
                remove(module, name)


def shrink(
    model: nn.Module,
    example_inputs: Any,
    amount: int | float | Mapping[str, int | float] | None = None,
    method: Any = "ln_structured",
    *,
    importance_scores: Mapping[str, torch.Tensor] | None = None,
    calibration_batches: Iterable[Any] | None = None,
    leaf_modules: Iterable[Any] = (),
    rounding: str = "nearest",
    **method_args: Any,
) -> nn.Module:
    """Remove pruned channels from `model`'s layers for real; return `model`, smaller.

    The model is traced with ``torch.fx`` and run once on `example_inputs` (without
    gradients, in evaluation mode; the modes are restored) to find its channel groups
    (see :func:`channel_groups`): a producer's output channels with everything that
    carries them (biases, BatchNorm/InstanceNorm statistics, depthwise filters, the
    branches a residual ``+`` or ``*`` joins, each part of a ``torch.cat``) and every
    consumer's input columns. What goes is said one of two ways:

    * ``amount=None``: the masks already on the model (the drop-in's or PyTorch's
      ``ln_structured``/``random_structured``/``custom_from_mask``, ...). A channel goes
      when a mask of one of its group's members zeroes all of it; a mask zeroing part of
      a channel is a ``ValueError`` naming the group.
    * an ``amount``: every group loses ``round(amount * channels)`` channels (an int is
      a count per group; a mapping gives each named group its own, and groups it
      does not name keep all their channels), those of lowest group score: by default
      ``ln_structured``'s L2 norm of each channel across all weight members of the
      group (producer rows, consumer columns, depthwise filters), ties to the lower
      index (:func:`arrayprune.groups.group_scores`).
    * an ``amount``, a calibrated method (``"activation_structured"``,
      ``"obs_structured"`` or a :class:`arrayprune.UnitPruningMethod`) and
      `calibration_batches`: each group is scored by its *consumers*, the layers reading
      its channels (a ``Linear``'s input columns; a ``Conv1d``/``Conv2d`` with
      ``groups=1``, where an input channel is the ``kh * kw`` columns of its im2col
      matrix; a ``torch.cat`` part at its offset), on ``H = X^T X`` of their inputs over
      the batches (one pass: evaluation mode, no gradients, float64 sums on the inputs'
      device, the modes restored and the hooks removed after). Each consumer scores the
      channels with the method's ``unit_scores`` on its whole weight and Hessian; the
      scores of several consumers are combined by ``method.combine_scores`` (OBS
      scores, output-error energies, add; activation scores, ``||W_j|| ||X_j||`` over a
      channel's columns, as the root of the sum of squares). The count, ranking, ties,
      `rounding`, GroupNorm blocks (scored by ``combine_scores`` of their channels) and
      grouped-convolution parts are those of the weight scores. With ``compensate``
      (the default) each consumer that loses columns gets the least-squares refit of
      all its kept columns on its Hessian (:func:`arrayprune.structured.compensate`,
      ``damp`` relative to the mean of its diagonal), whichever groups they belong to;
      producers, norms and the rest are only sliced. All statistics come from the dense
      model (a consumer's refit does not see the refit of the layers before it). Only
      the groups that lose channels are scored: one of them read by a layer whose
      inputs cannot be taken that way (a grouped, transposed or 3-D convolution) is a
      ``ValueError`` naming the group and the layer (an amount by group name can leave
      it out), as is a refit of a consumer carrying a pruning mask (the refit would fill
      its zeros: ``prune.remove`` it first or pass ``compensate=False``). Without
      `calibration_batches` a calibrated method is refused (``TypeError``), as
      everywhere a statistic is missing.

    Then every pruning hook is removed (``prune.remove``: masks become permanent) and
    every member is sliced in place: the same module objects, parameter and buffer names
    and state-dict keys, with smaller tensors and updated ``in_channels``,
    ``out_channels``, ``in_features``, ``out_features``, ``num_features`` and
    ``groups``. The result equals the model with the removed channels zeroed in every
    member of their group (see the module docstring for what that means after masks on
    convolution weights only). Groups that cannot shrink keep their channels; their
    reasons are what :func:`channel_groups` says: the model's inputs and outputs,
    ``nn.MultiheadAttention`` (its heads and width stay: ``embed_dim`` sets the head
    size, but the MLP around it shrinks), ``LayerNorm`` over the channels, transposed
    grouped convolutions, modules that cannot be traced or are named in `leaf_modules`,
    operations the tables do not know, and reshapes that write the channel count as a
    constant. A ``GroupNorm`` makes its groups of channels go whole: amounts count
    them. A grouped convolution (``1 < groups < channels``) keeps its ``groups``: the
    channels it reads and those it writes each lose the same number from every one of
    its groups, ranked within the group: a fraction is taken of each of its groups
    (``round(amount * channels / groups)`` each), a count must split evenly (else a
    ``ValueError``); transposed grouped convolutions are left.

    Parameters
    ----------
    model : torch.nn.Module
        The model, changed in place.
    example_inputs : tensor or tuple of tensors
        Inputs for the one tracing run.
    amount : int, float or mapping of str to int or float, optional
        Fraction in ``[0, 1]`` of each group's channels, or a count per group; or, by
        group name (:attr:`TorchGroup.name`), each group's own; None takes the masks on
        the model.
    method : str or method object, default "ln_structured"
        The group score: a name of :data:`arrayprune.METHODS` that removes whole
        channels (``"ln_structured"`` with ``n=2`` unless `method_args` say,
        ``"random_structured"`` with a ``seed``; ``"activation_structured"`` and
        ``"obs_structured"`` with `calibration_batches`), or a method object with
        ``channel_scores`` (a :class:`arrayprune.UnitPruningMethod` with
        `calibration_batches`: its ``compensate`` and ``damp`` apply).
    importance_scores : mapping of str to tensor, optional
        Qualified tensor name (``"layer1.0.conv1.weight"``) -> scores shaped like it,
        scored instead of its values (not with a calibrated method).
    calibration_batches : iterable, optional
        The batches a calibrated method scores on, as for :func:`prune.sparsegpt
        <arrayprune.adapters.torch.sparsegpt>`: each a tensor (``model(batch)``), a
        tuple or list (``model(*batch)``) or a mapping (``model(**batch)``); only with a
        calibrated method.
    leaf_modules : iterable of modules or module types, optional
        Modules kept whole (not traced into): their channels are left.
    rounding : {"nearest", "keep_floor"}, default "nearest"
        How a fraction becomes each group's count: ``round(amount * channels)``
        removed (PyTorch's rule, half to even), or ``int((1 - amount) * channels)``
        kept (Torch-Pruning's rule: the same parameter counts as its ``MetaPruner`` at
        the same ratio). Counts are taken as they are.
    **method_args
        Constructor arguments of a method given by name (``n=1``, ``seed=0``; for a
        calibrated one ``compensate=False`` to slice without the refit, ``damp=0.01``
        the Hessian's damping of the OBS scores and the refit).

    Returns
    -------
    torch.nn.Module
        `model` itself.

    Raises
    ------
    TypeError
        If `model` is not a module, `example_inputs` not tensors, the amount or
        method is of the wrong kind, a calibrated method has no `calibration_batches`,
        or these are not an iterable of batches.
    ValueError
        If the amount is out of range or would empty a group, no amount is given and
        the model has no pruning mask, a mask zeroes part of a channel,
        `calibration_batches` are given with a method that does not use them or are
        empty, or a group's consumers cannot be scored on them.
    RuntimeError
        If ``torch.fx`` cannot trace the model or it does not run on the inputs or the
        calibration batches. Every error is raised before the model is changed.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    >>> _ = prune.ln_structured(net[0], "weight", amount=0.5, n=2, dim=0)
    >>> _ = prune.shrink(net, torch.randn(1, 3, 8, 8))
    >>> net[0].out_channels, net[1].num_features, net[3].in_channels, sorted(net[0].state_dict())
    (4, 4, 4, ['bias', 'weight'])
    >>> batches = [torch.randn(8, 3, 8, 8) for _ in range(4)]
    >>> _ = prune.shrink(net, batches[0], 0.25, "obs_structured", calibration_batches=batches)
    >>> net[0].out_channels, net[3].in_channels
    (3, 3)
    """
    groups = channel_groups(model, example_inputs, leaf_modules=leaf_modules)
    open_groups = [g for g in groups if g.shrinkable]
    scores = dict(importance_scores or {})
    for name, t in scores.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"importance_scores[{name!r}] must be a tensor, got {type(t).__name__}")
    refit: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if amount is None:
            given = method_args or method != "ln_structured" or scores or rounding != "nearest"
            if given or calibration_batches is not None:
                raise TypeError(
                    "method, its arguments, importance_scores, calibration_batches and rounding are taken only with "
                    "an amount"
                )
            if not any(pruning_hooks(m, getattr(h, "_tensor_name", "")) for m in model.modules()
                       for h in m._forward_pre_hooks.values()):  # fmt: skip
                raise ValueError("shrink() needs an amount, or pruning masks on the model (it has none)")
            kept = [_kept_by_masks(model, g) for g in open_groups]
            for g, keep in zip(open_groups, kept, strict=True):
                whole = torch.zeros(g.channels, dtype=torch.bool)
                whole[keep] = True
                split = whole.reshape(-1, g.block).any(dim=1) != whole.reshape(-1, g.block).all(dim=1)
                if bool(split.any()):
                    raise ValueError(
                        f"group {g.name!r}: the masks remove part of GroupNorm group {int(torch.nonzero(split)[0])} "
                        f"({g.block} channels each); its groups go whole"
                    )
            for g, keep in zip(open_groups, kept, strict=True):
                if g.segments > 1:
                    width = g.channels // g.segments
                    per_block = torch.bincount(keep // width, minlength=g.segments)
                    lost = [width - int(n) for n in per_block]
                    if len(set(lost)) > 1:
                        raise ValueError(
                            f"group {g.name!r}: the masks remove {', '.join(map(str, lost))} channels from its "
                            f"{g.segments} convolution groups; each must lose as many"
                        )
            _check_partial(model, open_groups, kept)
        else:
            if rounding not in _ROUNDINGS:
                raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {rounding!r}")
            amounts = _amounts(amount, open_groups)
            for g in open_groups:  # fractions become each group's count under `rounding`
                if isinstance(amounts[g.name], float):
                    amounts[g.name] = _even_count(g, amounts[g.name], rounding)
            calibrated = unit_method(method, method_args) if calibration_batches is not None else None
            if calibration_batches is not None and calibrated is None:
                raise ValueError(
                    f"calibration_batches score channels with a calibrated method ({', '.join(unit_methods())}), "
                    f"not {method if isinstance(method, str) else type(method).__name__!r}"
                )
            if calibrated is not None and scores:
                raise TypeError(f"importance_scores replace weights; method {method!r} scores on calibration_batches")
            chosen = resolve_method(method, **method_args) if calibrated is None else calibrated
            for g in open_groups:
                a = amounts[g.name]
                units = g.channels // g.block
                _amount.validate_pruning_amount(_amount.compute_nparams_toprune(a, units), units)
                _amount.validate_pruning_amount(_even_count(g, a), g.channels)
                for slot in g.members:
                    given = scores.get(slot.param)
                    if given is not None and tuple(given.shape) != tuple(_value(*_owner(model, slot.param)).shape):
                        raise ValueError(
                            f"importance_scores[{slot.param!r}] has shape {tuple(given.shape)}, the tensor "
                            f"{tuple(_value(*_owner(model, slot.param)).shape)}"
                        )
            if calibrated is None:
                kept = [_kept_by_score(g, _l2_scores(model, g, chosen, scores), amounts[g.name], chosen)
                        for g in open_groups]  # fmt: skip
            else:  # only the groups that lose channels are scored (and their consumers checked)
                cut = [g for g in open_groups if _even_count(g, amounts[g.name]) > 0]
                consumers, reads = _calibrated.consumers(model, cut)
                if calibrated.compensate:
                    _calibrated.check_masks(model, consumers)
                hessians = _calibrated.input_hessians(model, consumers, cast(Iterable[Any], calibration_batches))
                weights = {p: _value(*_owner(model, p)) for p in consumers}
                channel = _calibrated.channel_scores(calibrated, cut, reads, consumers, weights, hessians)
                chosen_kept = [_kept_by_score(g, c, amounts[g.name], chosen) for g, c in zip(cut, channel, strict=True)]
                by_group = {id(g): k for g, k in zip(cut, chosen_kept, strict=True)}
                every = torch.device("cpu")
                kept = [by_group.get(id(g), torch.arange(g.channels, device=every)) for g in open_groups]
                if calibrated.compensate:
                    refit = _calibrated.refits(calibrated, cut, chosen_kept, reads, consumers, weights, hessians)
        for g, keep in zip(open_groups, kept, strict=True):
            if int(keep.numel()) == 0:
                raise ValueError(f"group {g.name!r}: every one of its {g.channels} channels would go")
        _bake(model)
        for param, new in refit.items():
            getattr(*_owner(model, param)).copy_(new)
        _slice(model, open_groups, [k.cpu() for k in kept])
    return model

