"""Functional pruning: take an array, return its mask.

Each function mirrors a verb of ``torch.nn.utils.prune`` at array level. Without
``default_mask`` it prunes a fresh array and returns a boolean mask. With the mask of
earlier pruning as ``default_mask``, it acts only on what that mask leaves unpruned
(the amount is relative to what remains) and returns the combined mask, of the dtype of
``default_mask``, exactly as a :class:`~arrayprune.PruningContainer` would.
"""

from __future__ import annotations

from typing import Any

from ._masks import check_same_shape, ones_mask
from .methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
    combine_masks,
)
from .patterns import BlockUnstructured, NMStructured

__all__ = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "mask_for",
]

Array = Any


def mask_for(
    method: Any, x: Array, *, default_mask: Array | None = None, importance_scores: Array | None = None
) -> Array:
    """The mask of a pruning method on `x`, on top of earlier pruning.

    What every function of this module does with its own method, for any method
    object: without `default_mask`, the method's mask of `x` (boolean for built-in
    methods); with it, the masks combined as :class:`~arrayprune.PruningContainer` does
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
        return method.compute_mask(scores, default_mask=ones_mask(x))
    check_same_shape(x, default_mask, "default_mask")
    return combine_masks(method, scores, default_mask)


def identity(x: Array, *, default_mask: Array | None = None) -> Array:
    """Mask that prunes nothing: ones, or `default_mask` itself.

    Parameters
    ----------
    x : array
        The array the mask is for.
    default_mask : array, optional
        Mask of earlier pruning.

    Returns
    -------
    array
        The mask.
    """
    return mask_for(Identity(), x, default_mask=default_mask)


def random_unstructured(
    x: Array,
    amount: int | float,
    *,
    default_mask: Array | None = None,
    seed: int | None = None,
    generator: Any = None,
) -> Array:
    """Mask pruning `amount` of the (remaining) entries of `x` at random.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    default_mask : array, optional
        Mask of earlier pruning; only entries it keeps are candidates.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key).

    Returns
    -------
    array
        The mask.
    """
    method = RandomUnstructured(amount, seed=seed, generator=generator)
    return mask_for(method, x, default_mask=default_mask)


def l1_unstructured(
    x: Array,
    amount: int | float,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask pruning `amount` of the (remaining) entries of smallest magnitude.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    default_mask : array, optional
        Mask of earlier pruning; only entries it keeps are candidates.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape.

    Returns
    -------
    array
        The mask.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> ap.l1_unstructured(np.array([0.3, -0.1, 0.2, 0.0]), amount=2)
    array([ True, False,  True, False])
    """
    return mask_for(L1Unstructured(amount), x, default_mask=default_mask, importance_scores=importance_scores)


def random_structured(
    x: Array,
    amount: int | float,
    dim: int,
    *,
    default_mask: Array | None = None,
    seed: int | None = None,
    generator: Any = None,
) -> Array:
    """Mask pruning `amount` of the (remaining) channels along `dim` at random.

    Parameters
    ----------
    x : array
        The array to prune, at least 2-D.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    dim : int
        Axis along which channels are defined.
    default_mask : array, optional
        Mask of earlier pruning; channels it zeroes entirely are not candidates.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key).

    Returns
    -------
    array
        The mask.
    """
    method = RandomStructured(amount, dim, seed=seed, generator=generator)
    return mask_for(method, x, default_mask=default_mask)


def ln_structured(
    x: Array,
    amount: int | float,
    n: Any,
    dim: int,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask pruning `amount` of the (remaining) channels of smallest L`n` norm.

    Parameters
    ----------
    x : array
        The array to prune, at least 2-D.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int
        Axis along which channels are defined.
    default_mask : array, optional
        Mask of earlier pruning; channels it zeroes entirely are not candidates.
    importance_scores : array, optional
        Scores to take norms of instead of `x`, same shape.

    Returns
    -------
    array
        The mask.
    """
    return mask_for(LnStructured(amount, n, dim), x, default_mask=default_mask, importance_scores=importance_scores)


def custom_from_mask(x: Array, mask: Array, *, default_mask: Array | None = None) -> Array:
    """Mask combining a precomputed `mask` with `default_mask`.

    Parameters
    ----------
    x : array
        The array the mask is for.
    mask : array
        Precomputed mask, same shape; non-zero entries are kept.
    default_mask : array, optional
        Mask of earlier pruning.

    Returns
    -------
    array
        The mask.
    """
    return mask_for(CustomFromMask(mask), x, default_mask=default_mask)


def nm_structured(
    x: Array,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask pruning `n` of every `m` consecutive entries along `dim` (2:4 by default).

    Entries already pruned by `default_mask` count first; see
    :class:`~arrayprune.NMStructured`.

    Parameters
    ----------
    x : array
        The array to prune.
    n, m : int
        The pattern: `n` zeros in every group of `m`.
    dim : int, default -1
        Axis along which groups run.
    default_mask : array, optional
        Mask of earlier pruning.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape.

    Returns
    -------
    array
        The mask.
    """
    return mask_for(NMStructured(n, m, dim), x, default_mask=default_mask, importance_scores=importance_scores)


def block_unstructured(
    x: Array,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    *,
    default_mask: Array | None = None,
    importance_scores: Array | None = None,
) -> Array:
    """Mask pruning `amount` of the (remaining) blocks of `block_shape`, weakest first.

    See :class:`~arrayprune.BlockUnstructured` for tiling, edges and scores.

    Parameters
    ----------
    x : array
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Block shape, aligned to the trailing dimensions of `x`.
    n : float, default 1
        Order of the power mean scoring a block.
    default_mask : array, optional
        Mask of earlier pruning.
    importance_scores : array, optional
        Scores to rank by instead of `x`, same shape.

    Returns
    -------
    array
        The mask.
    """
    method = BlockUnstructured(amount, block_shape, n)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)
