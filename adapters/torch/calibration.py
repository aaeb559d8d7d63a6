"""Calibration for Wanda: input-feature norms of a model's layers, in one pass.

:func:`input_norms` runs calibration batches through the dense model once, with a
forward pre-hook on each chosen ``Linear`` and convolution, and keeps per layer only a
running sum of squares per input feature (float64, on the layer's device): memory is
one vector per layer, whatever the number of batches. :func:`wanda_importance` turns the
norms into Wanda's scores, ready for the verbs::

    scores = prune.wanda_importance(model, batches)          # one pass, no gradients
    for module, s in scores.items():
        prune.wanda(module, "weight", amount=0.5, importance_scores=s)

The same scores feed ``prune.nm_structured(module, "weight", 2, 4, dim=1,
importance_scores=s)`` (the paper's 2:4 setting) and ``prune.global_unstructured``.
All norms come from the unpruned model: the paper's block-by-block variant, which
calibrates each block on the output of the blocks already pruned, is not done here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

import arrayprune

__all__ = ["input_norms", "wanda_importance"]

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _chosen(model: nn.Module, modules: Iterable[Any] | None) -> dict[str, nn.Module]:
    """Qualified name -> layer, for the layers to calibrate (every Linear and Conv by default)."""
    named = dict(model.named_modules())
    if modules is None:
        return {name: m for name, m in named.items() if isinstance(m, _LAYERS)}
    by_module = {id(m): name for name, m in named.items()}
    chosen = {}
    for item in modules:
        name = item if isinstance(item, str) else by_module.get(id(item))
        if name is None or name not in named:
            raise ValueError(f"{item!r} is not a submodule of the model")
        if not isinstance(named[name], _LAYERS):
            raise TypeError(f"{name!r} is a {type(named[name]).__name__}: Wanda calibrates Linear and Conv layers")
        chosen[name] = named[name]
    return chosen


def _feature_axis(module: nn.Module, x: torch.Tensor) -> int:
    """Axis of the input features of `x`, as `module` reads it."""
    if isinstance(module, nn.Linear):
        return x.ndim - 1
    spatial = len(module.kernel_size)
    return 0 if x.ndim == spatial + 1 else 1  # an unbatched input has no batch axis


def _run(model: nn.Module, batch: Any) -> None:
    if isinstance(batch, Mapping):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)


def input_norms(
    model: nn.Module, batches: Iterable[Any], modules: Iterable[Any] | None = None
) -> dict[str, torch.Tensor]:
    """The L2 norm of every input feature of the chosen layers over calibration data.

    Parameters
    ----------
    model : torch.nn.Module
        The dense model, in the mode to calibrate in (usually ``model.eval()``).
    batches : iterable
        Calibration batches: each a tensor (``model(batch)``), a tuple or list
        (``model(*batch)``) or a mapping (``model(**batch)``).
    modules : iterable of modules or qualified names, optional
        The layers to calibrate; every ``Linear``, ``Conv1d``, ``Conv2d`` and ``Conv3d``
        of `model` if omitted.

    Returns
    -------
    dict of str to torch.Tensor
        Per layer (by qualified name), ``sqrt(sum of x_j**2)`` over every token, batch
        entry and spatial position seen, one float64 value per input feature ``j``
        (``in_features``, or the input channels of a convolution).

    Raises
    ------
    ValueError
        If `batches` is empty, or a module is not part of `model`.
    TypeError
        If a chosen module is not a Linear or convolution layer.
    """
    layers = _chosen(model, modules)
    sums: dict[str, torch.Tensor] = {}

    def hook_for(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].detach()
            axis = _feature_axis(module, x)
            flat = torch.movedim(x, axis, -1).reshape(-1, x.shape[axis])
            squares = torch.linalg.vector_norm(flat, dim=0, dtype=torch.float64) ** 2
            sums[name] = squares if name not in sums else sums[name] + squares

        return hook

    handles = [m.register_forward_pre_hook(hook_for(name)) for name, m in layers.items()]
    seen = 0
    try:
        with torch.no_grad():
            for batch in batches:
                _run(model, batch)
                seen += 1
    finally:
        for h in handles:
            h.remove()
    if not seen:
        raise ValueError("no calibration batch was given")
    missing = sorted(set(layers) - set(sums))
    if missing:
        raise ValueError(f"the calibration batches never reached {missing[0]!r}")
    return {name: torch.sqrt(sums[name]) for name in layers}


def _layer_scores(module: nn.Module, norms: torch.Tensor) -> torch.Tensor:
    """Wanda scores of a layer's weight ``[out, in/groups, ...]``: |W| times its input norms."""
    weight = module.weight.detach()
    groups = getattr(module, "groups", 1)
    return arrayprune.wanda_scores(weight, norms.to(weight.device), reduction_axis=1, groups=groups)


def wanda_importance(
    model: nn.Module, batches: Iterable[Any], modules: Iterable[Any] | None = None
) -> dict[nn.Module, torch.Tensor]:
    """Wanda's importance scores of the weights of the chosen layers, from one calibration pass.

    Parameters
    ----------
    model, batches, modules
        As for :func:`input_norms`.

    Returns
    -------
    dict of torch.nn.Module to torch.Tensor
        Per layer, scores shaped like its ``weight`` (``|W| * ||X_j||_2``), for
        ``importance_scores`` of ``prune.wanda`` (``dim=0``: per output unit),
        ``prune.nm_structured`` (``dim=1``) or, keyed by ``(module, "weight")``,
        ``prune.global_unstructured``.
    """
    norms = input_norms(model, batches, modules)
    named = dict(model.named_modules())
    return {named[name]: _layer_scores(named[name], n) for name, n in norms.items()}
