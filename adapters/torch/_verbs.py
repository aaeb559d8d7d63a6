"""The verbs not made from the method table: global pruning, schedules, ``remove``, ``is_pruned``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.global_pruning as _global
import arrayprune.schedules as _schedules
from arrayprune._masks import apply_keep, eligible
from arrayprune.methods import UnstructuredPruningMethod

from ._base import apply_method, core_of, pruning_hooks, transaction
from ._methods import CustomFromMask, L1Unstructured
from ._tensors import check_shape, detached


def prune_to_sparsity(
    module: torch.nn.Module,
    name: str,
    sparsity: float,
    pruning_method: type = L1Unstructured,
    importance_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """Prune just enough more of ``module.<name>`` that a fraction `sparsity` is pruned.

    Not in PyTorch: a step of gradual pruning, with ``schedule(step)``. Units pruned count;
    `pruning_method` gets an integer amount, `importance_scores` and `kwargs`. Returns `module`.

    Examples
    --------
    >>> import arrayprune, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m, schedule = nn.Linear(10, 10), arrayprune.PolynomialDecay(0.0, 0.9, 0, 100)
    >>> for step in range(0, 101, 10):
    ...     _ = prune.prune_to_sparsity(m, "weight", schedule(step))
    >>> int((m.weight_mask == 0).sum())
    90
    """
    probe = pruning_method(0, **kwargs)
    mask = getattr(module, name + "_mask", None)
    extra = _schedules.units_to_prune(getattr(module, name).detach(), sparsity, mask, getattr(probe, "_core", probe))
    apply_method(module, name, pruning_method(amount=extra, **kwargs), importance_scores)
    return module


def remove(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Make the pruning of ``module.<name>`` permanent (ValueError if not pruned); return `module`."""
    for key, hook in pruning_hooks(module, name):
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: torch.nn.Module) -> bool:
    """Whether `module` or a submodule has a pruning hook (of either library)."""
    hooks = (hook for submodule in module.modules() for hook in submodule._forward_pre_hooks.values())
    return any(isinstance(hook, _tprune.BasePruningMethod) for hook in hooks)


def global_unstructured(
    parameters: Iterable[tuple[torch.nn.Module, str]],
    pruning_method: type,
    importance_scores: dict | None = None,
    *,
    min_sparsity: Any = None,
    max_sparsity: Any = None,
    normalization: str | None = None,
    **kwargs: Any,
) -> None:
    """Prune many parameters together, ranking all their entries against each other.

    PyTorch's masks, without concatenating the parameters for core-backed methods; each
    parameter gets its share by :class:`CustomFromMask`, or on failure is left as it was.

    Parameters
    ----------
    parameters : iterable of (torch.nn.Module, str)
        The parameters to prune, by an ``'unstructured'`` `pruning_method` built with `kwargs`.
    importance_scores : dict, optional
        Scores by ``(module, name)``; a parameter without any is ranked by itself.
    min_sparsity, max_sparsity, normalization : optional
        Not in PyTorch: as in :func:`arrayprune.global_unstructured`.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> net = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 1))
    >>> pairs = [(net[0], "weight"), (net[1], "weight")]
    >>> prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=10)
    >>> int(sum((b == 0).sum() for b in net.buffers()))
    10
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    pairs = [(module, name) for module, name in parameters]
    tensors = [getattr(module, name).detach() for module, name in pairs]
    scores = [importance_scores.get(pair, t).detach() for pair, t in zip(pairs, tensors, strict=True)]
    for (_, name), t, s in zip(pairs, tensors, scores, strict=True):
        check_shape(t, s, f"importance_scores of parameter {name}")
    old_masks = [detached(getattr(module, name + "_mask", None)) for module, name in pairs]

    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if not pairs:
        return
    method._tensor_name = "temp"
    core = core_of(method)
    bounds = {"min_sparsity": min_sparsity, "max_sparsity": max_sparsity, "normalization": normalization}
    with torch.no_grad():
        if isinstance(core, UnstructuredPruningMethod) and all(v is None for v in bounds.values()):
            keeps = core.keep_masks(scores, [None if m is None else eligible(m) for m in old_masks])
            masks = [keep if m is None else apply_keep(m, keep) for m, keep in zip(old_masks, keeps, strict=True)]
        else:
            if core is None:  # a foreign method: its compute_mask sees the concatenation
                old_masks = [torch.ones_like(t) if m is None else m for t, m in zip(tensors, old_masks, strict=True)]
            chosen = method if core is None else core
            found = _global.global_unstructured(tensors, lambda: chosen, scores, default_masks=old_masks, **bounds)
            masks = cast(list[Any], found)  # a list, as the tensors are
    # Each mask holds the earlier pruning: installed as it is (unless compute_mask is patched).
    with transaction(module for module, _ in pairs):
        for (module, name), mask, t in zip(pairs, masks, tensors, strict=True):
            hook = CustomFromMask(mask.to(dtype=t.dtype))
            apply_method(module, name, hook, None, precomputed=hook.mask if core_of(hook) is not None else None)
