"""Global pruning: many parameters ranked against each other, all or nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import arrayprune.global_pruning as _global
from arrayprune._masks import apply_keep, eligible
from arrayprune.methods import UnstructuredPruningMethod

from ._apply import apply_method
from ._base import core_of
from ._methods import CLASSES
from ._rollback import transaction
from ._tensors import check_shape


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

    The masks of :func:`torch.nn.utils.prune.global_unstructured`, without concatenating
    the parameters for core-backed methods. Entries that existing masks prune are not
    candidates; each parameter gets its share by :class:`CustomFromMask`. On any failure
    every module is left as it was.

    Parameters
    ----------
    parameters : iterable of (torch.nn.Module, str)
        The parameters to prune.
    pruning_method : type
        A method class of ``PRUNING_TYPE`` ``'unstructured'``, built with `kwargs`.
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
    scores = [importance_scores.get(pair, t) for pair, t in zip(pairs, tensors, strict=True)]
    for (_, name), t, s in zip(pairs, tensors, scores, strict=True):
        check_shape(t, s, f"importance_scores of parameter {name}")
    scores = [s.detach() for s in scores]
    old_masks = [getattr(module, name + "_mask", None) for module, name in pairs]
    old_masks = [None if m is None else m.detach() for m in old_masks]

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
    plain = all(x is None for x in (min_sparsity, max_sparsity, normalization))
    with torch.no_grad():
        if isinstance(core, UnstructuredPruningMethod) and plain:
            keeps = core.keep_masks(scores, [None if m is None else eligible(m) for m in old_masks])
            masks = [keep if m is None else apply_keep(m, keep) for m, keep in zip(old_masks, keeps, strict=True)]
        else:
            if core is None:  # a foreign method: its compute_mask sees the concatenation
                old_masks = [torch.ones_like(t) if m is None else m for t, m in zip(tensors, old_masks, strict=True)]
            masks = _global.global_unstructured(
                tensors,
                lambda: method if core is None else core,
                importance_scores=scores,
                default_masks=old_masks,
                min_sparsity=min_sparsity,
                max_sparsity=max_sparsity,
                normalization=normalization,
            )
    # Each mask holds the earlier pruning: installed as it is (unless compute_mask is patched).
    with transaction(module for module, _ in pairs):
        for (module, name), mask, t in zip(pairs, masks, tensors, strict=True):
            hook = CLASSES["custom_from_mask"](mask.to(dtype=t.dtype))
            apply_method(module, name, hook, None, precomputed=hook.mask if core_of(hook) is not None else None)
