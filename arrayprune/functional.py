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

import inspect
from typing import Any

from ._masks import check_same_shape, ones_mask
from .methods import BasePruningMethod, combine_masks
from .registry import METHODS, make_verb

__all__ = ["mask_for", *METHODS]

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


_DOC = """Mask of :class:`~arrayprune.{cls}` on `x`, on top of earlier pruning.

See :class:`~arrayprune.{cls}` for what is pruned; this is ``mask_for({cls}(...), x,
...)``.

Parameters
----------
x : array
    The array to prune.
{parameters}
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


def _call(method: Any, x: Array, default_mask: Array | None = None, importance_scores: Array | None = None) -> Array:
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


for _name, _cls in METHODS.items():
    globals()[_name] = make_verb(
        _cls,
        _name,
        _call,
        leading=[inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
        scores="keyword",
        extra=[inspect.Parameter("default_mask", inspect.Parameter.KEYWORD_ONLY, default=None)],
        doc=_DOC,
        module="arrayprune",
    )
del _name, _cls
