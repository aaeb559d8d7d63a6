"""The functional interface: one verb per method, and :func:`remove` / :func:`is_pruned`."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.schedules as _schedules

from ._methods import (
    BlockUnstructured,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    NMStructured,
    RandomStructured,
    RandomUnstructured,
)
from ._reparam import _pruning_hooks


def identity(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Add the pruning reparametrization to ``module.<name>`` without pruning anything.

    The mask ``<name>_mask`` is all ones.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> prune.identity(nn.Linear(2, 3), "bias").bias_mask
    tensor([1., 1., 1.])
    """
    Identity.apply(module, name)
    return module


def random_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) entries of ``module.<name>`` at random.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    seed : int, optional
        Seed for a reproducible mask (not in PyTorch).
    generator : torch.Generator, optional
        Generator to draw from (not in PyTorch). With neither, PyTorch's own draws and mask.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.random_unstructured(nn.Linear(2, 3), "weight", amount=1)
    >>> int(torch.sum(m.weight_mask == 0))
    1
    """
    RandomUnstructured.apply(module, name, amount, seed=seed, generator=generator)
    return module


def l1_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) entries of smallest magnitude.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.l1_unstructured(nn.Linear(2, 3), "weight", amount=0.2)
    >>> sorted(m.state_dict())
    ['bias', 'weight_mask', 'weight_orig']
    """
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    dim: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) channels along `dim` at random.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    dim : int
        Dimension along which channels are defined.
    seed : int, optional
        Seed for a reproducible mask (not in PyTorch).
    generator : torch.Generator, optional
        Generator to draw from (not in PyTorch). With neither, PyTorch's own draws and mask.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.random_structured(nn.Linear(5, 3), "weight", amount=3, dim=1)
    >>> int(torch.sum(m.weight_mask.sum(dim=0) == 0))
    3
    """
    RandomStructured.apply(module, name, amount, dim, seed=seed, generator=generator)
    return module


def ln_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    n: Any,
    dim: int,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) channels of smallest L\\ `n` norm.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int
        Dimension along which channels are defined.
    importance_scores : torch.Tensor, optional
        Scores to take norms of instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.ln_structured(nn.Conv2d(5, 3, 2), "weight", amount=0.3, n=float("-inf"), dim=1)
    >>> int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum())
    2
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: torch.nn.Module, name: str, mask: Any) -> torch.nn.Module:
    """Prune ``module.<name>`` with the precomputed `mask`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    mask : torch.Tensor
        Mask of the shape of the parameter; non-zero entries are kept.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> prune.custom_from_mask(nn.Linear(5, 3), name="bias", mask=torch.tensor([0, 1, 0])).bias_mask
    tensor([0., 1., 0.])
    """
    CustomFromMask.apply(module, name, mask)
    return module


def nm_structured(
    module: torch.nn.Module,
    name: str,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Impose `n`:`m` sparsity (2:4 by default) on ``module.<name>`` along `dim`.

    Not in :mod:`torch.nn.utils.prune`; the reparametrization is the same as for the
    other verbs, and it combines with them in a :class:`PruningContainer`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    n, m : int
        The pattern: `n` zeros in every `m` consecutive entries.
    dim : int, default -1
        Axis along which groups run.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune, arrayprune.adapters.torch as prune
    >>> m = prune.nm_structured(nn.Linear(8, 4), "weight")
    >>> arrayprune.is_nm_sparse(m.weight, 2, 4)
    True
    """
    NMStructured.apply(module, name, n=n, m=m, dim=dim, importance_scores=importance_scores)
    return module


def block_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (remaining) blocks of ``module.<name>``, weakest first.

    Not in :mod:`torch.nn.utils.prune`; see :class:`BlockUnstructured`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Block shape, aligned to the trailing dimensions.
    n : float, default 1
        Order of the power mean scoring a block.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.
    """
    BlockUnstructured.apply(module, name, amount, block_shape, n=n, importance_scores=importance_scores)
    return module


def prune_to_sparsity(
    module: torch.nn.Module,
    name: str,
    sparsity: float,
    pruning_method: type = L1Unstructured,
    importance_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """Prune just enough more of ``module.<name>`` that a fraction `sparsity` is pruned.

    Not in :mod:`torch.nn.utils.prune`: the step of gradual pruning. Call it at each
    training step with ``schedule(step)`` (:class:`arrayprune.PolynomialDecay`, ...):
    units already pruned count towards the target and stay pruned, and the new method
    joins the others in the :class:`PruningContainer`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    sparsity : float
        Target fraction of pruned units (entries, or channels for structured methods).
    pruning_method : type, default L1Unstructured
        Unstructured or structured method class, applied with an integer amount.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries (for methods that take them).
    **kwargs
        Further arguments of the method's ``apply`` (``n``, ``dim``, ...).

    Returns
    -------
    torch.nn.Module
        `module`, modified in place (nothing is pruned if the target is already met,
        but the reparametrization is added, as with an amount of 0).

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
    t = getattr(module, name)
    mask = getattr(module, name + "_mask", None)
    probe = pruning_method(0, **kwargs)._core_method()
    extra = _schedules.units_to_prune(t.detach(), sparsity, mask, probe)
    if importance_scores is not None:
        kwargs["importance_scores"] = importance_scores
    pruning_method.apply(module, name, amount=extra, **kwargs)
    return module


def remove(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Make the pruning of ``module.<name>`` permanent and remove its reparametrization.

    The pruned values are written into the original parameter object, which becomes
    ``module.<name>`` again; ``<name>_orig``, ``<name>_mask`` and the hook are removed.
    Works on tensors pruned by PyTorch as well.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the pruned parameter.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Raises
    ------
    ValueError
        If ``module.<name>`` is not pruned.
    """
    for key, hook in _pruning_hooks(module, name):
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: torch.nn.Module) -> bool:
    """Whether `module` or one of its submodules has a pruning hook (from either library).

    Parameters
    ----------
    module : torch.nn.Module
        The module to inspect.

    Returns
    -------
    bool
        True if some forward pre-hook is a pruning method.
    """
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, _tprune.BasePruningMethod):
                return True
    return False
