"""SparseGPT on a PyTorch model: calibration hooks, per-layer reconstruction, the usual reparametrization.

:func:`sparsegpt` prunes the ``Linear``, ``Conv1d`` and ``Conv2d`` layers of a model with
:func:`arrayprune.sparsegpt` (Frantar & Alistarh, ICML 2023): each layer's Hessian
``X^T X / n`` is accumulated from its calibration inputs by a forward pre-hook into an
:class:`arrayprune.HessianAccumulator` (float64, on the layer's device; the activations
are never stored), the weight is pruned and the entries it keeps are updated, and the
layer gets PyTorch's reparametrization (``weight_orig`` holding the updated values,
``weight_mask``, a forward pre-hook), so ``prune.remove``, ``prune.is_pruned``, state
dicts and :mod:`torch.nn.utils.prune` work on it as on any other pruned module::

    import arrayprune.adapters.torch as prune
    prune.sparsegpt(model, batches, 0.5)          # or n=2, m=4
    for module in model.modules():
        if prune.is_pruned(module) and hasattr(module, "weight_mask"):
            prune.remove(module, "weight")
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

import arrayprune
from arrayprune.reconstruction import _check_pattern, _positive_int
from arrayprune.registry import reconstruction_method, settings_for

from ._base import apply_method, pruning_hooks, transaction
from ._methods import CLASSES
from .calibration import _run, block_layers, is_transposed_linear

__all__ = ["REUSE_BYTES", "reconstruct", "sparsegpt"]

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)

#: Bytes of finished layers' outputs that sequential calibration keeps to reuse (see :class:`_Reuse`);
#: on a CUDA device at most a quarter of its free memory (:func:`_reuse_budget`).
REUSE_BYTES = 1 << 30


def _reuse_budget(device: torch.device | None) -> int:
    """:data:`REUSE_BYTES`, or on a CUDA device at most a quarter of the memory free there now."""
    if device is None or device.type != "cuda":
        return REUSE_BYTES
    free, _total = torch.cuda.mem_get_info(device)
    return min(REUSE_BYTES, free // 4)
Layer = nn.Linear | nn.Conv1d | nn.Conv2d  # the layers sparsegpt prunes


class _Captured(Exception):
    """Raised by a capturing hook once a layer's inputs of a forward are taken: the rest
    of the model is not run."""


def _batch_list(calibration_batches: Any) -> list[Any] | tuple[Any, ...]:
    """The batches as a list or tuple (other iterables are read once, here)."""
    if isinstance(calibration_batches, (torch.Tensor, Mapping, str, bytes)) or not isinstance(
        calibration_batches, Iterable
    ):
        raise TypeError(
            "calibration_batches must be an iterable of batches (a list of tensors or of tuples of "
            f"positional arguments), got {type(calibration_batches).__name__}; wrap a single batch in a list"
        )
    if not isinstance(calibration_batches, (list, tuple)):
        calibration_batches = list(calibration_batches)
    if not calibration_batches:
        raise ValueError("no calibration batch was given")
    return calibration_batches


def _layer_name(named: dict[str, nn.Module], by_module: dict[int, str], item: Any) -> str:
    """The qualified name of `item` (a module of the model or its name), checked to be a prunable layer."""
    name = item if isinstance(item, str) else by_module.get(id(item))
    if name is None or name not in named:
        shown = repr(item) if isinstance(item, str) else type(item).__name__
        raise ValueError(f"{shown} is not a submodule of the model")
    layer = named[name]
    if not isinstance(layer, _LAYERS) and not is_transposed_linear(layer):
        raise TypeError(
            f"{name!r} is a {type(layer).__name__}: sparsegpt prunes Linear, Conv1d, Conv2d and "
            "transformers' Conv1D layers"
        )
    return name


def _chosen(model: nn.Module, modules: Iterable[Any] | None) -> dict[str, Layer]:
    """Qualified name -> layer to prune, in model order, checked (nothing is changed)."""
    named = dict(model.named_modules())
    if modules is None:
        found = {name: m for name, m in named.items() if isinstance(m, _LAYERS) or is_transposed_linear(m)}
        chosen = cast(dict[str, Layer], block_layers(model, found))
    else:
        if isinstance(modules, (nn.Module, str)) or not isinstance(modules, Iterable):
            raise TypeError(f"modules must be an iterable of modules or qualified names, got {type(modules).__name__}")
        by_module = {id(m): name for name, m in named.items()}
        chosen = {}
        for item in modules:
            name = _layer_name(named, by_module, item)
            chosen[name] = cast(Layer, named[name])
    weights: dict[int, str] = {}
    for name, layer in chosen.items():
        if "weight_orig" in layer._parameters or pruning_hooks(layer, "weight"):
            raise ValueError(
                f"the weight of {name!r} is already pruned: sparsegpt prunes dense weights "
                "(make the earlier pruning permanent with prune.remove, or leave the layer out of modules)"
            )
        weight = layer._parameters.get("weight")
        if not isinstance(weight, nn.Parameter):
            raise TypeError(f"the weight of {name!r} is not a Parameter of the layer (parametrized?)")
        if not weight.is_floating_point():
            raise TypeError(f"sparsegpt needs a floating weight, got dtype {weight.dtype} in {name!r}")
        if id(weight) in weights:
            raise ValueError(f"{weights[id(weight)]!r} and {name!r} share their weight: prune it once")
        weights[id(weight)] = name
    return chosen


def _layer_amounts(model: nn.Module, amount: Mapping[Any, Any], modules: Iterable[Any] | None) -> dict[str, Any]:
    """Qualified name -> amount, from a mapping of layers (modules or names) to amounts, checked.

    The layers are the mapping's keys; with `modules` given too, the keys must name exactly
    those layers."""
    named = dict(model.named_modules())
    by_module = {id(m): name for name, m in named.items()}
    amounts: dict[str, Any] = {}
    for key, value in amount.items():
        if not isinstance(key, (nn.Module, str)):
            raise TypeError(
                f"the keys of amount must be modules or qualified names of the model's layers, got {type(key).__name__}"
            )
        name = _layer_name(named, by_module, key)
        if name in amounts:
            raise ValueError(f"amount gives {name!r} twice (as a module and by its name)")
        try:
            arrayprune.validate_pruning_amount_init(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"amount for {name!r}: {exc}") from None
        amounts[name] = value
    if modules is not None:
        wanted = _chosen(model, modules)
        without = [name for name in wanted if name not in amounts]
        if without:
            raise ValueError(f"{without[0]!r} is in modules but has no amount (amount maps layers to their amounts)")
        outside = [name for name in amounts if name not in wanted]
        if outside:
            raise ValueError(f"amount gives {outside[0]!r} an amount, but it is not in modules")
    return amounts


def _counts(layer: Layer, amount: Any, name: str | None = None) -> list[int] | None:
    """Entries to prune per group of `layer` (they sum to the layer's count), None for N:M."""
    if amount is None:
        return None
    numel = layer.weight.numel()
    if name is None:
        arrayprune.validate_pruning_amount(amount, numel)
    else:  # one amount of a mapping: the message names its layer
        try:
            arrayprune.validate_pruning_amount(amount, numel)
        except ValueError as exc:
            raise ValueError(f"amount for {name!r}: {exc}") from None
    total = arrayprune.compute_nparams_toprune(amount, numel)
    groups = getattr(layer, "groups", 1)
    share = [(2 * total * g + groups) // (2 * groups) for g in range(groups + 1)]
    return [b - a for a, b in zip(share, share[1:], strict=False)]


def _accumulators(layer: Layer) -> list[arrayprune.HessianAccumulator]:
    """One Hessian accumulator per group of `layer` (one for a Linear)."""
    k = layer.weight.shape[0] if is_transposed_linear(layer) else math.prod(layer.weight.shape[1:])
    return [arrayprune.HessianAccumulator(k) for _ in range(getattr(layer, "groups", 1))]


def _feed(layer: Layer, accs: list[arrayprune.HessianAccumulator], x: torch.Tensor) -> None:
    """Add `layer`'s input `x` to its accumulators: rows of its matrix product, per group."""
    x = x.detach()
    if isinstance(layer, nn.Linear) or is_transposed_linear(layer):
        _update(accs[0], x)
        return
    for acc, patches in zip(accs, _conv_patches(layer, x), strict=True):
        acc.update(patches)


def _conv_patches(layer: Any, x: torch.Tensor) -> list[torch.Tensor]:
    """A convolution's input `x` as the rows of its matrix product, one matrix per group.

    Padded as the layer's forward pads it (any ``padding_mode``; a ``Conv1d`` is a 2-D
    convolution of one row), then unfolded by :func:`arrayprune.unfold_patches`: rows
    ``[..., in/groups * kh * kw]``, an input channel's ``kh * kw`` columns together.
    """
    spatial = len(layer.kernel_size)
    if x.ndim == spatial + 1:  # unbatched
        x = x.unsqueeze(0)
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    x = F.pad(x, layer._reversed_padding_repeated_twice, mode=mode)  # what the layer's forward pads
    kernel, stride, dilation = layer.kernel_size, layer.stride, layer.dilation
    if spatial == 1:  # a row of a 2-D convolution
        x = x.unsqueeze(2)
        kernel, stride, dilation = (1, *kernel), (1, *stride), (1, *dilation)
    return arrayprune.unfold_patches(x, kernel, stride=stride, dilation=dilation, groups=layer.groups)


#: Columns of ``X`` per panel of :func:`_panel_gram`.
_PANEL = 256

#: (rows, k, threads) -> whether :func:`_panel_gram` gave the bits of ``X^T @ X`` here.
_PANEL_EXACT: dict[tuple[int, int, int], bool] = {}

#: Input dtypes whose products are exact in float64 (24-bit significands or fewer).
_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def _update(acc: arrayprune.HessianAccumulator, x: torch.Tensor) -> None:
    """``acc.update(x)``, the product computed by :func:`_gram` for float32 (or narrower)
    inputs on the CPU."""
    if x.device.type != "cpu" or x.dtype not in _NARROW or x.ndim < 1 or x.shape[-1] != acc.k:
        acc.update(x)  # elsewhere, and the errors, as the accumulator gives them
        return
    rows = math.prod(x.shape[:-1])
    acc.add_gram(_gram(x.reshape(rows, acc.k).to(torch.float64)), rows)


def _gram(x: torch.Tensor) -> torch.Tensor:
    """``x.T @ x`` of a float64 CPU matrix holding float32 values, bit for bit, computing
    the upper panels only where that was seen to give the same bits.

    Each entry of ``x.T @ x`` is a dot product of two columns. The products of float32
    values are exact in float64, so whether a BLAS kernel fuses them into its additions
    (FMA) or not changes nothing; what remains is the order of the additions, which BLAS
    libraries (MKL in PyTorch's CPU builds) keep the same whichever block of the product
    an entry falls in. Then the upper panels alone (about half the work), mirrored, give
    the full product's bits. That is checked, not assumed: the first product of each
    shape (and thread count) is computed both ways and compared bit for bit; where they
    differ, the full product is used for that shape from then on.
    """
    rows, k = x.shape
    if k <= _PANEL:
        return x.T @ x
    key = (rows, k, torch.get_num_threads())
    exact = _PANEL_EXACT.get(key)
    if exact:
        return _panel_gram(x)
    full = x.T @ x
    if exact is None:
        _PANEL_EXACT[key] = torch.equal(_panel_gram(x).view(torch.int64), full.view(torch.int64))
    return full


def _panel_gram(x: torch.Tensor) -> torch.Tensor:
    """``x.T @ x`` of float64 `x` from its upper panels (rows ``a:a+P``, columns ``a:``), mirrored."""
    k = x.shape[1]
    out = torch.empty((k, k), dtype=x.dtype, device=x.device)
    for a in range(0, k, _PANEL):
        torch.mm(x[:, a : a + _PANEL].T, x[:, a:], out=out[a : a + _PANEL, a:])
    for a in range(0, k - _PANEL, _PANEL):
        out[a + _PANEL :, a : a + _PANEL] = out[a : a + _PANEL, a + _PANEL :].T
    return out


def _input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["input"]


def _reconstruct(
    name: str,
    layer: Layer,
    accs: list[arrayprune.HessianAccumulator],
    counts: list[int] | None,
    pattern: tuple[int, int] | None,
    cls: type[arrayprune.ReconstructionMethod],
    settings: Mapping[str, Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`layer`'s updated weight and boolean keep mask, group by group, by the method `cls`
    (given `settings`, the options of :func:`sparsegpt` its constructor takes)."""
    weight = layer.weight.detach()
    rows = weight.shape[0] // len(accs)
    n, m = pattern if pattern is not None else (None, None)
    news, keeps = [], []
    for g, acc in enumerate(accs):
        amount = None if counts is None else counts[g]
        try:
            new, keep = cls(amount, n, m, **settings).reconstruct(
                weight[g * rows : (g + 1) * rows],
                acc.hessian(),
                reduction_axis=0 if is_transposed_linear(layer) else 1,
            )
        except ValueError as exc:  # degenerate statistics: the message names the layer
            raise ValueError(f"{name!r}: {exc}") from None
        news.append(new)
        keeps.append(keep)
    if len(accs) == 1:
        return news[0], keeps[0]
    return torch.cat(news), torch.cat(keeps)


def _run_capturing(model: nn.Module, batches: Any, hooks: dict[nn.Module, Any], stop: bool) -> None:
    """Run every batch with `hooks` on their layers; with `stop`, a hook raising
    :class:`_Captured` ends its forward."""
    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer, hook in hooks.items()]
    try:
        for batch in batches:
            for hook in hooks.values():
                if isinstance(hook, _Capture):
                    hook.reset()
            try:
                _run(model, batch)
            except _Captured:
                if not stop:
                    raise
    finally:
        for handle in handles:
            handle.remove()


def sparsegpt(
    model: nn.Module,
    calibration_batches: Iterable[Any],
    amount: int | float | Mapping[nn.Module | str, int | float] | None = None,
    *,
    n: int | None = None,
    m: int | None = None,
    modules: Iterable[nn.Module | str] | None = None,
    block_size: int = 128,
    damp: float = 0.01,
    sequential: bool = True,
    method: str | type = "sparsegpt",
    outputs: list[Any] | None = None,
) -> nn.Module:
    """Prune a model's layers with SparseGPT, updating the weights they keep; return `model`.

    Not in :mod:`torch.nn.utils.prune`. Each layer's weight is pruned and reconstructed by
    :func:`arrayprune.sparsegpt` from the Hessian ``X^T X / n`` of its inputs over the
    calibration batches, then reparametrized as by every verb: ``weight_orig`` (the same
    Parameter, now holding the updated values), the buffer ``weight_mask`` (dtype of the
    weight) and a forward pre-hook (a :class:`CustomFromMask`), so that
    ``weight == weight_orig * weight_mask``.

    Parameters
    ----------
    model : torch.nn.Module
        The model. It is run in eval mode (dropout off, batch norms neither updating nor
        using batch statistics), under :func:`torch.no_grad`; every submodule's
        train/eval mode is restored afterwards.
    calibration_batches : iterable
        The calibration inputs: each batch a tensor (``model(batch)``), a tuple or list of
        positional arguments (``model(*batch)``) or a mapping of keyword arguments
        (``model(**batch)``). A list or tuple is iterated once per pruned layer
        (`sequential`) or once; any other iterable (an iterator, a generator, a
        ``DataLoader``) is read once into a list first, so its batches are held in memory
        and are the same on every pass. A tensor on its own is refused (TypeError):
        give ``[batch]``.
    amount : int, float or mapping, optional
        Unstructured pruning: each layer's weight loses exactly
        ``round(amount * weight.numel())`` entries for a float in ``[0, 1]``, `amount`
        entries for an int, chosen over the whole weight (over each group of a grouped
        convolution, the groups' counts summing to the layer's). A mapping gives each
        layer its own amount: its keys are layers of `model` (modules or qualified
        names, as in `modules`), its values amounts as above, validated as the single
        amount is (TypeError for a value that is no int or float, ValueError out of range
        or above the layer's size; the message names the layer). The layers pruned are
        then its keys; with `modules` too, the keys must be exactly those layers.
    n, m : int, optional
        N:M pruning instead of `amount`: `n` of every `m` consecutive entries of each
        output row along the input axis (for a convolution, along ``in/groups x k``
        flattened in C order, as :func:`arrayprune.sparsegpt` does).
    modules : iterable of modules or qualified names, optional
        The layers to prune, each a ``Linear``, ``Conv1d``, ``Conv2d`` or transformers'
        ``Conv1D`` (GPT-2's, weight stored ``[in, out]``) of `model`; the keys of a
        mapping `amount`, else every such layer of `model`, if omitted. For a
        transformers model (its ``config`` gives ``num_hidden_layers``) the default is
        the layers inside its repeated decoder (or encoder) layers, as the command line
        prunes: ``lm_head``, a pooler and classifier heads are left (give them in
        `modules` to prune them too).
        A layer whose weight is already pruned is refused (ValueError), whether given
        or found: make that pruning permanent with :func:`remove` first (its zeros are
        then pruned first), or leave it out.
    block_size : int, default 128
        Input columns processed together (a multiple of `m` for N:M).
    damp : float, default 0.01
        Relative dampening of the Hessians, as in :func:`arrayprune.sparsegpt`.
    sequential : bool, default True
        The paper's setting: the layers are pruned in the order the model first calls
        them (found by one forward of the first batch), each calibrated on the model whose
        earlier layers are already pruned and updated. For each layer the batches are run
        again, stopping each forward once that layer's inputs are taken (the layers after
        it are not run); one layer's Hessians are held at a time. The outputs of layers
        already pruned, which the later runs would compute again bit for bit, are kept
        and reused instead, up to :data:`REUSE_BYTES` (1 GiB; on a CUDA device at most a
        quarter of its free memory) in all, freed at the end
        (0 turns it off; a kept output changed in place is computed again). With
        ``False``, every Hessian comes from the dense model in a single pass over the
        batches, all held until the end (memory: the sum of every layer's ``K x K``,
        ``K`` its input length per group).
    method : str or type, default "sparsegpt"
        The method of :data:`arrayprune.METHODS` that prunes each layer from its Hessian
        and updates the kept weights (one that carries a solver; :func:`reconstruct`
        names it), or such a class; ``block_size`` and ``damp`` go to it if its
        constructor takes them.
    outputs : list, optional
        The model's output for each batch, with every layer pruned and updated, is
        appended to it (sequentially, the layer outputs kept for reuse are not computed
        again).

    Returns
    -------
    torch.nn.Module
        `model`, pruned.

    Raises
    ------
    TypeError
        If `calibration_batches` is a tensor or no iterable, a layer given is not a
        ``Linear``, ``Conv1d`` or ``Conv2d``, its weight is not a floating Parameter, an
        amount or integer parameter has the wrong type, or a key of a mapping `amount`
        is neither a module nor a name.
    ValueError
        If there is no batch, the amount or pattern is bad (both or neither given, out of
        range), a module given is not part of `model`, a layer is already pruned or
        shares its weight with another, a layer is never reached by the batches, a
        Hessian is not positive definite after damping, or a mapping `amount` names a
        layer twice or does not match `modules`.

    Notes
    -----
    Every argument and layer is checked before anything is run; any failure later (a
    forward raising, a Hessian that cannot be inverted) restores every weight, and the
    reparametrization is installed on all layers at the end or on none, so the model is
    never left half-pruned. The pruned values are written into the weights while the
    layers are calibrated (sequential mode runs through them), and a copy of each
    original weight is kept until the end for that restore.

    A layer's input is read from its forward pre-hook (the first positional argument,
    or the keyword ``input``). A layer called several times in a forward accumulates every
    call (as many as on the first batch, in sequential mode). Convolution inputs are padded
    as the layer pads them (any ``padding_mode``, ``padding='same'``) and unfolded by
    :func:`arrayprune.unfold_patches`, one Hessian per group (a ``Conv1d`` is a 2-D
    convolution of height 1); the weight rows of group ``g`` are pruned with the
    Hessian of group ``g``. Hessians are float64 on the layer's device (where the device
    has float64).

    Examples
    --------
    >>> import torch
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> batches = [torch.randn(16, 8) for _ in range(4)]
    >>> _ = prune.sparsegpt(net, batches, 0.5)
    >>> [int((layer.weight_mask == 0).sum()) for layer in (net[0], net[2])]
    [32, 8]
    >>> torch.equal(net[0].weight, net[0].weight_orig * net[0].weight_mask)
    True

    Each layer its own amount (modules or their names as keys):

    >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> _ = prune.sparsegpt(net, batches, {net[0]: 0.75, "2": 4})
    >>> [int((layer.weight_mask == 0).sum()) for layer in (net[0], net[2])]
    [48, 4]
    """
    if outputs is not None and not isinstance(outputs, list):
        raise TypeError(f"outputs must be a list to append the model's outputs to, got {type(outputs).__name__}")
    per_layer = isinstance(amount, Mapping)
    if per_layer:
        if n is not None or m is not None:
            raise ValueError(f"give either amount or n and m, not both: got a mapping of amounts, n={n!r}, m={m!r}")
        pattern = None
    else:
        pattern = _check_pattern(amount, n, m)
        if pattern is None:
            arrayprune.validate_pruning_amount_init(amount)
    cls = reconstruction_method(method)
    block_size = _positive_int("block_size", block_size)
    if pattern is not None and block_size % pattern[1]:
        raise ValueError(f"block_size={block_size} must be a multiple of m={pattern[1]} for {pattern[0]}:{pattern[1]}")
    if isinstance(damp, bool) or not isinstance(damp, numbers.Real) or not 0 <= float(damp) < math.inf:
        raise ValueError(f"damp must be a finite non-negative number, got {damp!r}")
    settings = settings_for(cls, {"block_size": block_size, "damp": damp})
    if not isinstance(sequential, bool):
        raise TypeError(f"sequential must be a bool, got {type(sequential).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if per_layer:
        amounts = _layer_amounts(model, cast(Mapping[Any, Any], amount), modules)
        layers = _chosen(model, list(amounts))
        counts = {name: _counts(layer, amounts[name], name) for name, layer in layers.items()}
    else:
        layers = _chosen(model, modules)
        counts = {name: _counts(layer, amount) for name, layer in layers.items()}
    batches = _batch_list(calibration_batches)
    if not layers:
        return model

    modes = {sub: sub.training for sub in model.modules()}
    saved: list[tuple[nn.Parameter, torch.Tensor]] = []  # (weight, its original values), to restore
    results: dict[str, torch.Tensor] = {}  # name -> boolean keep mask

    def write(name: str, new: torch.Tensor, keep: torch.Tensor) -> None:
        weight = layers[name].weight
        saved.append((weight, weight.detach().clone()))
        weight.copy_(new)
        results[name] = keep

    reuse: _Reuse | None = None
    try:
        with contextlib.ExitStack() as stack, torch.no_grad():
            model.eval()
            if sequential:
                order = _execution_order(model, batches, layers)
                names = list(order)
                first = next(iter(layers.values())).weight
                reuse = stack.enter_context(_Reuse(layers.values(), _reuse_budget(first.device)))
                index = 0
                while index < len(names):
                    name = names[index]
                    accs = _accumulators(layers[name])
                    sharing = _capture_shared(model, batches, layers, names[index:], order, accs, reuse)
                    for each in sharing:  # the same inputs, so the same Hessian, as separate runs would give
                        new, keep = _reconstruct(each, layers[each], accs, counts[each], pattern, cls, settings)
                        write(each, new, keep)
                        reuse.finish(layers[each])
                    del accs
                    index += len(sharing)
            else:
                all_accs = {name: _accumulators(layer) for name, layer in layers.items()}
                hooks = {layers[name]: _Capture(accs, None) for name, accs in all_accs.items()}
                _run_capturing(model, batches, hooks, stop=False)
                reached = {name for name, accs in all_accs.items() if accs[0].rows}
                _check_reached(layers, reached, "the calibration batches")
                computed = {
                    name: _reconstruct(name, layers[name], accs, counts[name], pattern, cls, settings)
                    for name, accs in all_accs.items()
                }
                del all_accs
                for name, (new, keep) in computed.items():
                    write(name, new, keep)
            if outputs is not None:  # the model's outputs with every layer pruned and updated
                for b, batch in enumerate(batches):
                    if reuse is not None:
                        reuse.start(b, store=False)
                    outputs.append(_run(model, batch))
            stack.close()  # the layers' own forwards back before the reparametrization
            with transaction(layers.values()):
                for name, keep in results.items():
                    weight = layers[name].weight
                    hook = CLASSES["custom_from_mask"](keep.to(dtype=weight.dtype))
                    apply_method(layers[name], "weight", hook, None, precomputed=hook.mask)
    except BaseException:
        with torch.no_grad():
            for weight, values in reversed(saved):
                weight.copy_(values)
        raise
    finally:
        for sub, mode in modes.items():
            sub.training = mode
    return model


class _Capture:
    """A forward pre-hook feeding a layer's inputs to `accs`; after `calls` calls in one
    forward (if given) it raises :class:`_Captured`. :meth:`reset` starts a forward."""

    def __init__(self, accs: list[arrayprune.HessianAccumulator], calls: int | None):
        self.accs, self.calls, self.seen = accs, calls, 0

    def reset(self) -> None:
        self.seen = 0

    def __call__(self, layer: Layer, args: tuple, kwargs: dict) -> None:
        _feed(layer, self.accs, _input_of(args, kwargs))
        self.seen += 1
        if self.calls is not None and self.seen >= self.calls:
            raise _Captured


class _SharedCapture:
    """Forward pre-hooks for one sequential step: the first layer's inputs feed `accs`;
    the layers after it (in execution order) that are called once, with the very tensor
    the first one took (same object, not modified in place since), are counted as sharing
    it, and the first other layer called ends the forward (:class:`_Captured`).

    The forward goes on past the first layer only to see which layers follow; what the
    first layer and its followers compute is never used (the forward ends before anything
    reads it as a layer's input), so :attr:`skip` tells their forwards (:meth:`skipping`)
    to give zeros of their output's shape instead of computing it."""

    def __init__(self, accs: list[arrayprune.HessianAccumulator], calls: int, candidates: list[nn.Module]):
        self.accs, self.calls, self.candidates = accs, calls, candidates
        self.shared = len(candidates)  # the fewest followers confirmed by any forward
        self.started = False
        self.seen, self.confirmed = 0, 0
        self.taken: tuple[Any, int | None] | None = None
        self.skip = False  # the next forward of the first layer or a follower need not compute

    @contextlib.contextmanager
    def skipping(self, layers: Iterable[nn.Module]) -> Iterator[None]:
        """While inside, the forwards of `layers` (``Linear`` or ``Conv1D``) give zeros when told to."""
        own = {layer: _own_forward(layer) for layer in layers}
        for layer in own:
            layer.forward = self._zeros_or(layer, layer.forward)
        try:
            yield
        finally:
            for layer, forward in own.items():
                _restore_forward(layer, forward)

    def _zeros_or(self, layer: nn.Module, forward: Any) -> Any:
        weight = cast(torch.Tensor, layer.weight)
        width = int(weight.shape[1 if is_transposed_linear(layer) else 0])

        def zeros_or_forward(*args: Any, **kwargs: Any) -> Any:
            if not self.skip:
                return forward(*args, **kwargs)
            self.skip = False
            x = _input_of(args, kwargs)
            return x.new_zeros((*x.shape[:-1], width))

        return zeros_or_forward

    def reset(self) -> None:
        """End a forward (none the first time) and start the next."""
        if self.started:  # a forward where the first layer did not finish confirms no follower
            self.shared = min(self.shared, self.confirmed if self.seen >= self.calls else 0)
        self.started = True
        self.seen, self.confirmed, self.taken, self.skip = 0, 0, None, False

    def lead(self, layer: Layer, args: tuple, kwargs: dict) -> None:
        x = _input_of(args, kwargs)
        _feed(layer, self.accs, x)
        self.seen += 1
        if self.seen < self.calls:
            return
        self.taken = (x, _version(x)) if self.calls == 1 and self.candidates else None
        if self.taken is None:
            raise _Captured
        self.skip = True

    def follow(self, layer: Layer, args: tuple, kwargs: dict) -> None:
        if self.seen < self.calls:
            return  # not yet there: the forward goes on until the first layer's calls are done
        x = _input_of(args, kwargs)
        expected = self.candidates[self.confirmed] if self.confirmed < len(self.candidates) else None
        if (
            self.taken is not None
            and layer is expected
            and x is self.taken[0]
            and self.taken[1] is not None
            and _version(x) == self.taken[1]
        ):
            self.confirmed += 1
            self.skip = True
            return
        self.taken = None
        raise _Captured


class _Reuse:
    """The outputs of finished layers, kept to be handed back in later runs of the same batch.

    Sequential calibration runs every batch once per step, each run repeating what the
    runs before it computed. A layer is *finished* once its weight is pruned and updated
    (:meth:`finish`): from then on, each of its calls that comes before any unfinished
    layer is called in a forward has the inputs it had in the previous run (everything
    before it is finished or never changes) and so the same output, bit for bit. Such an
    output is kept, keyed by (layer, call in the forward, batch), while the outputs kept
    fit in `budget` bytes, and returned in place of computing it again; one that was
    modified in place since (its version counter moved) is computed again. Calls after an
    unfinished layer's are computed as usual. The forward is assumed deterministic (the
    same inputs give the same bits), as PyTorch's CPU kernels are for one thread setting.
    """

    def __init__(self, layers: Iterable[nn.Module], budget: int):
        self.budget, self.used = budget, 0
        self.kept: dict[tuple[int, int, int], tuple[torch.Tensor, int]] = {}
        self.batch, self.store, self.settled = 0, True, True
        self.calls: dict[int, int] = {}
        self.reached = {layer: layer.register_forward_pre_hook(self._unfinished) for layer in layers}
        self.forwards: dict[nn.Module, Any] = {}  # a finished layer -> its own instance attribute forward, if any

    def __enter__(self) -> _Reuse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, batch: int, store: bool = True) -> None:
        """Begin a forward of batch number `batch`; with `store` False nothing more is kept."""
        self.batch, self.store, self.settled = batch, store, True
        self.calls.clear()

    def _unfinished(self, layer: nn.Module, args: tuple) -> None:
        self.settled = False  # what follows may depend on weights still to change

    def finish(self, layer: nn.Module) -> None:
        """`layer`'s weight is final: its outputs may be kept and reused from now on."""
        self.reached.pop(layer).remove()
        self.forwards[layer] = _own_forward(layer)
        own = layer.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._output(layer, own, args, kwargs)

        layer.forward = forward

    def _output(self, layer: nn.Module, own: Any, args: tuple, kwargs: dict) -> Any:
        call = self.calls.get(id(layer), 0)
        self.calls[id(layer)] = call + 1
        if not self.settled:
            return own(*args, **kwargs)
        key = (id(layer), call, self.batch)
        kept = self.kept.get(key)
        if kept is not None:
            if _version(kept[0]) == kept[1]:
                return kept[0]
            del self.kept[key]  # changed in place by what read it: computed again
            self.used -= kept[0].untyped_storage().nbytes()
        out = own(*args, **kwargs)
        if self.store and isinstance(out, torch.Tensor):
            version, size = _version(out), out.untyped_storage().nbytes()
            if version is not None and self.used + size <= self.budget:
                self.kept[key] = (out, version)
                self.used += size
        return out

    def close(self) -> None:
        """Give every layer its own forward back, remove the hooks, drop what was kept."""
        for handle in self.reached.values():
            handle.remove()
        for layer, forward in self.forwards.items():
            _restore_forward(layer, forward)
        self.reached, self.forwards, self.kept, self.used = {}, {}, {}, 0


#: Stands for "no ``forward`` of its own" (the class's is used) in :func:`_own_forward`.
_NOTHING = object()


def _own_forward(layer: nn.Module) -> Any:
    """The ``forward`` set on `layer` itself (an instance attribute), or :data:`_NOTHING`."""
    return layer.__dict__.get("forward", _NOTHING)


def _restore_forward(layer: nn.Module, forward: Any) -> None:
    """Put back what :func:`_own_forward` returned, after a wrapper replaced the layer's forward."""
    if forward is _NOTHING:
        del layer.__dict__["forward"]
    else:
        layer.__dict__["forward"] = forward


def _version(x: Any) -> int | None:
    """The in-place version counter of a tensor (None where it keeps none: inference tensors)."""
    try:
        return int(x._version)
    except (AttributeError, RuntimeError):
        return None


def _capture_shared(
    model: nn.Module,
    batches: Any,
    layers: dict[str, nn.Module],
    names: list[str],
    order: Mapping[str, int],
    accs: list[arrayprune.HessianAccumulator],
    reuse: _Reuse | None = None,
) -> list[str]:
    """Feed the Hessian of ``names[0]`` from every batch; the names (a prefix of `names`)
    whose Hessian it is too, ``names[0]`` first.

    Layers after it in execution order share it while each is called once per forward
    and multiplies the very input tensor ``names[0]`` took, unchanged (the query, key and
    value projections of an attention layer): their inputs do not depend on the weights
    pruned before them, so separate runs would give the same Hessian, bit for bit. The
    forward then stops at the first other layer, where a step of its own would start.
    """
    first = layers[names[0]]

    def kind(layer: nn.Module) -> Any:
        if not (isinstance(layer, nn.Linear) or is_transposed_linear(layer)):
            return None  # a convolution's Hessian depends on the layer too
        return type(layer), is_transposed_linear(layer), tuple(a.k for a in _accumulators(cast(Layer, layer)))

    candidates = []
    for name in names[1:]:
        if kind(first) is None or kind(layers[name]) != kind(first) or order[name] != 1:
            break
        candidates.append(layers[name])
    capture = _SharedCapture(accs, order[names[0]], candidates)
    hooks: dict[nn.Module, Any] = {first: capture.lead}
    hooks.update((layers[name], capture.follow) for name in names[1:] if layers[name] is not first)
    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer, hook in hooks.items()]
    try:
        with capture.skipping([first, *candidates] if candidates and order[names[0]] == 1 else []):
            _run_batches(model, batches, capture, reuse)
        capture.reset()
    finally:
        for handle in handles:
            handle.remove()
    return names[: 1 + capture.shared]


def _run_batches(model: nn.Module, batches: Any, capture: _SharedCapture, reuse: _Reuse | None) -> None:
    """Run every batch for one sequential step, each forward ending at :class:`_Captured`."""
    for b, batch in enumerate(batches):
        capture.reset()
        if reuse is not None:
            reuse.start(b)
        try:
            _run(model, batch)
        except _Captured:
            pass


def _execution_order(model: nn.Module, batches: Any, layers: dict[str, nn.Module]) -> dict[str, int]:
    """Layer name -> calls per forward, in the order of first call on the first batch."""
    names = {id(layer): name for name, layer in layers.items()}
    order: dict[str, int] = {}

    def hook(layer: nn.Module, args: tuple, kwargs: dict) -> None:
        name = names[id(layer)]
        order[name] = order.get(name, 0) + 1

    _run_capturing(model, batches[:1], dict.fromkeys(layers.values(), hook), stop=False)
    _check_reached(layers, set(order), "the first calibration batch")
    return order


def _check_reached(layers: dict[str, nn.Module], reached: set[str], what: str) -> None:
    missing = [name for name in layers if name not in reached]
    if missing:
        raise ValueError(f"{what} never reached {missing[0]!r}")


def reconstruct(
    model: nn.Module,
    calibration_batches: Iterable[Any],
    amount: int | float | Mapping[nn.Module | str, int | float] | None = None,
    *,
    method: str | type,
    **options: Any,
) -> nn.Module:
    """Prune a model's layers with `method`, a method of :data:`arrayprune.METHODS` that carries a solver.

    :func:`sparsegpt` with ``method`` named: the same calibration (each layer's Hessian,
    sequential or one pass), arguments and reparametrization, the layer weights pruned
    and updated by the solver of `method` (a subclass of
    :class:`arrayprune.ReconstructionMethod` registered with
    :func:`arrayprune.registry.register_method`).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> import arrayprune.adapters.torch as prune
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    >>> _ = prune.reconstruct(net, [torch.randn(16, 8)], 0.5, method="sparsegpt")
    >>> int((net[0].weight == 0).sum())
    32
    """
    return sparsegpt(model, calibration_batches, amount, method=method, **options)
