"""Global pruning: many parameters ranked against each other, all or nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import arrayprune.global_pruning as _global
from arrayprune._masks import apply_keep as _apply_keep
from arrayprune._masks import eligible as _eligible

from ._methods import CustomFromMask
from ._reparam import _apply, _native_core_method
from ._rollback import _Transaction
from ._streams import _pytorch_random_keep, _PyTorchStreamRandomUnstructured
from ._tensors import _check_scores
from ._verbs import custom_from_mask


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

    The result is that of pruning the concatenation of all parameters with one method,
    as :func:`torch.nn.utils.prune.global_unstructured` does, but the built-in methods
    never build that concatenation (:func:`arrayprune.global_unstructured`). Existing
    masks are respected: only the entries they keep are candidates, and a float amount
    is a fraction of those. Each parameter is then pruned with its share of the mask by
    :func:`custom_from_mask`. If anything fails, all modules are left as they were.

    Parameters
    ----------
    parameters : iterable of (torch.nn.Module, str)
        The parameters to prune, as pairs of a module and a parameter name.
    pruning_method : type
        A pruning method class of ``PRUNING_TYPE`` ``'unstructured'``, such as
        :class:`L1Unstructured`; it is instantiated with `kwargs`. PyTorch's own and
        user-written classes work too (their masks are computed on the concatenation).
    importance_scores : dict, optional
        Scores per parameter, keyed by the ``(module, name)`` pairs; a parameter without
        an entry is ranked by its own (current, pruned) values.
    min_sparsity, max_sparsity : float, or sequence of floats, optional
        Not in PyTorch: bounds on each parameter's final sparsity (one value for all, or
        one per pair), so that no layer is wiped out; see
        :func:`arrayprune.global_unstructured`.
    normalization : {None, 'lamp'}, optional
        Not in PyTorch: ``'lamp'`` ranks by layer-adaptive magnitude scores.
    **kwargs
        Arguments of `pruning_method`, such as ``amount``.

    Raises
    ------
    TypeError
        If `parameters` is not iterable, `importance_scores` is not a dict, or the method
        is not of ``PRUNING_TYPE`` ``'unstructured'``.
    ValueError
        If an importance score has another shape than its parameter, or the amount is
        too large.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> net = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 1))
    >>> prune.global_unstructured(
    ...     [(net[0], "weight"), (net[1], "weight")], pruning_method=prune.L1Unstructured, amount=10
    ... )
    >>> int(sum((b == 0).sum() for b in net.buffers()))
    10
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    pairs = [(module, name) for module, name in parameters]
    tensors = [getattr(module, name) for module, name in pairs]
    scores = [importance_scores.get(pair, t) for pair, t in zip(pairs, tensors, strict=True)]
    for (_, name), t, s in zip(pairs, tensors, scores, strict=True):
        _check_scores(t, s, name)
    old_masks = [getattr(module, name + "_mask", None) for module, name in pairs]

    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if not pairs:
        return
    method._tensor_name = "temp"
    core_method = _native_core_method(method)
    with torch.no_grad():
        if core_method is not None:
            defaults = [None if m is None else m.detach() for m in old_masks]
            chosen = core_method
        else:
            # An unknown method: its compute_mask sees the concatenation, as in PyTorch.
            defaults = [
                torch.ones_like(t) if m is None else m.detach() for t, m in zip(tensors, old_masks, strict=True)
            ]
            chosen = method
        if isinstance(core_method, _PyTorchStreamRandomUnstructured) and (
            min_sparsity is None and max_sparsity is None and normalization is None
        ):
            # Unseeded random pruning: PyTorch's draw over the remaining entries.
            eligible = [None if m is None else _eligible(m) for m in defaults]
            keeps = _pytorch_random_keep([s.detach() for s in scores], eligible, core_method.count)
            masks = [keep if m is None else _apply_keep(m, keep) for m, keep in zip(defaults, keeps, strict=True)]
        else:
            masks = _global.global_unstructured(
                [t.detach() for t in tensors],
                lambda: chosen,
                importance_scores=[s.detach() for s in scores],
                default_masks=defaults,
                min_sparsity=min_sparsity,
                max_sparsity=max_sparsity,
                normalization=normalization,
            )
    # Each mask already holds the earlier pruning (it is what custom_from_mask would
    # compute on top of the old mask), so it is installed as it is, in the parameter's
    # dtype: one tensor serves as the buffer and as the hook's mask.
    # A patched or overridden CustomFromMask.compute_mask is honoured: then each mask
    # goes through custom_from_mask, as in PyTorch.
    with _Transaction(module for module, _ in pairs):
        for (module, name), mask, t in zip(pairs, masks, tensors, strict=True):
            mask = mask.to(dtype=t.dtype)
            hook = CustomFromMask(mask)
            if _native_core_method(hook) is None:
                custom_from_mask(module, name, mask=mask)
            else:
                _apply(module, name, hook, None, precomputed=mask)
