"""Functional pruning: take an array, return its mask.

One verb per method of :data:`arrayprune.METHODS`, named after it and made from the
method's class (its parameters follow the class's constructor): ``l1_unstructured(x,
amount)``, ``ln_structured(x, amount, n, dim)``, ``nm_structured(x, n=2, m=4)``, ... and
:func:`mask_for`, which does the same for any method object. Without ``default_mask``
a verb prunes a fresh array and returns a boolean mask. With the mask of earlier
pruning as ``default_mask``, it acts only on what that mask leaves unpruned (the amount
is relative to what remains) and returns the combined mask, of the dtype of
``default_mask``, exactly as a :class:`~arrayprune.PruningContainer` would.

Examples
--------
>>> import numpy as np
>>> import arrayprune as ap
>>> ap.l1_unstructured(np.array([0.3, -0.1, 0.2, 0.0]), amount=2)
array([ True, False,  True, False])
"""

from __future__ import annotations

from typing import Any

from . import registry as _table  # the classes of the table (the core imports only relatively)
from ._masks import check_same_shape, ones_mask
from .methods import BasePruningMethod, combine_masks

__all__ = ["mask_for"]

Array = Any


def mask_for(
    method: Any, x: Array, *, default_mask: Array | None = None, importance_scores: Array | None = None
) -> Array:
    """The mask of a pruning method on `x`, on top of earlier pruning.

    What every verb of this module does with its own method, for any method object
    (also PyTorch's): without `default_mask`, the method's mask of `x` (its
    :meth:`~arrayprune.BasePruningMethod.keep_mask`, boolean for built-in methods);
    with it, the masks combined as :class:`~arrayprune.PruningContainer` does
    (the method acts only on what `default_mask` leaves).

    Parameters
    ----------
    method : BasePruningMethod
        The method, e.g. ``L1Unstructured(0.5)``.
    x : array
        The array to prune.
    default_mask : array, optional
        Mask of earlier pruning, same shape.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape.

    Returns
    -------
    array
        The mask.

    Raises
    ------
    ValueError
        If `default_mask` or `importance_scores` has another shape than `x`.
    """
    scores = x if importance_scores is None else importance_scores
    check_same_shape(x, scores, "importance_scores")
    if default_mask is None:
        if isinstance(method, BasePruningMethod):
            return method.keep_mask(scores)
        return method.compute_mask(scores, default_mask=ones_mask(x))
    check_same_shape(x, default_mask, "default_mask")
    return combine_masks(method, scores, default_mask)


# <verbs>
# Written by tools/write_verbs.py from arrayprune.METHODS: edit the table or the class, then rerun it.

def identity(x: Array, *, default_mask: Array | None = None) -> Array:
    """Mask of :class:`~arrayprune.Identity` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.Identity` for what is pruned; this is ``mask_for(Identity(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.

    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.Identity()
    return mask_for(method, x, default_mask=default_mask)


def random_unstructured(
    x: Array,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: Any = None,
    default_mask: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.RandomUnstructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.RandomUnstructured` for what is pruned; this is ``mask_for(RandomUnstructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.RandomUnstructured(amount, seed=seed, generator=generator)
    return mask_for(method, x, default_mask=default_mask)


def l1_unstructured(
    x: Array,
    amount: int | float,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.L1Unstructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.L1Unstructured` for what is pruned; this is ``mask_for(L1Unstructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.L1Unstructured(amount)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


def random_structured(
    x: Array,
    amount: int | float,
    dim: int = -1,
    *,
    seed: int | None = None,
    generator: Any = None,
    default_mask: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.RandomStructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.RandomStructured` for what is pruned; this is ``mask_for(RandomStructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Axis along which channels are defined.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.RandomStructured(amount, dim, seed=seed, generator=generator)
    return mask_for(method, x, default_mask=default_mask)


def ln_structured(
    x: Array,
    amount: int | float,
    n: Any,
    dim: int = -1,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.LnStructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.LnStructured` for what is pruned; this is ``mask_for(LnStructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm` (see
        :func:`arrayprune.norms.channel_norms`).
    dim : int, default -1
        Axis along which channels are defined.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.LnStructured(amount, n, dim)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


def custom_from_mask(x: Array, mask: Array, *, default_mask: Array | None = None) -> Array:
    """Mask of :class:`~arrayprune.CustomFromMask` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.CustomFromMask` for what is pruned; this is ``mask_for(CustomFromMask(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    mask : array
        The mask; non-zero entries are kept.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.CustomFromMask(mask)
    return mask_for(method, x, default_mask=default_mask)


def nm_structured(
    x: Array,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.NMStructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.NMStructured` for what is pruned; this is ``mask_for(NMStructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    n : int, default 2
        Entries pruned per group.
    m : int, default 4
        Group length.
    dim : int, default -1
        Axis along which groups run (the input dimension of a linear weight is -1).
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.NMStructured(n, m, dim)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


def block_unstructured(
    x: Array,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.BlockUnstructured` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.BlockUnstructured` for what is pruned; this is ``mask_for(BlockUnstructured(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean (positive, or ``inf``).
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.BlockUnstructured(amount, block_shape, n)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


def wanda(
    x: Array,
    amount: int | float,
    dim: int = 0,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask of :class:`~arrayprune.Wanda` on `x`, on top of earlier pruning.

    See :class:`~arrayprune.Wanda` for what is pruned; this is ``mask_for(Wanda(...), x,
    ...)``.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Per output unit, the fraction in ``[0, 1]`` of its entries to prune, or their
        number. Inside a container (iterative pruning), of its entries still unpruned.
    dim : int, default 0
        The output axis of the weight.
    default_mask : array, optional
        Mask of earlier pruning: the method acts only on what it leaves, as in a
        :class:`~arrayprune.PruningContainer`.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape (methods that rank by value).

    Returns
    -------
    array
        The mask: boolean without `default_mask`, else of its dtype.
    """
    method = _table.Wanda(amount, dim)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


__all__ += [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "wanda",
]
# </verbs>
