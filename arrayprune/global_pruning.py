"""Global pruning: one threshold across many arrays, without concatenating them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import array_api_compat as apc

from ._masks import apply_keep, check_same_shape, eligible, ones_mask, size
from .methods import _Unstructured, combine_masks

__all__ = ["global_unstructured"]

Array = Any


def global_unstructured(
    arrays: Sequence[Array] | Mapping[Any, Array],
    pruning_method: Any,
    importance_scores: Sequence[Array | None] | Mapping[Any, Array] | None = None,
    *,
    default_masks: Sequence[Array | None] | Mapping[Any, Array] | None = None,
    **kwargs: Any,
) -> list[Array] | dict[Any, Array]:
    """Prune many arrays together, ranking all their entries against each other.

    Equivalent to pruning the concatenation of all arrays with one method and splitting
    the mask, as ``torch.nn.utils.prune.global_unstructured`` does, but the built-in
    methods never build that concatenation: their memory overhead is the masks plus a
    few percent of the entries.

    Parameters
    ----------
    arrays : sequence or mapping of arrays
        The arrays to prune, all of one namespace and device.
    pruning_method : type
        An unstructured method class, such as :class:`~arrayprune.L1Unstructured`;
        it is instantiated with `kwargs`.
    importance_scores : sequence or mapping, optional
        Scores per array (same structure as `arrays`; a missing key or ``None`` entry
        means the array itself).
    default_masks : sequence or mapping, optional
        Masks of earlier pruning, so that global pruning can be iterated: only entries
        they keep are candidates, and a float amount is a fraction of those.
    **kwargs
        Arguments of `pruning_method`, such as ``amount``.

    Returns
    -------
    list or dict of arrays
        The new masks, in the structure of `arrays` (a dict for a mapping). Each has the
        dtype of its default mask, boolean where none was given.

    Raises
    ------
    TypeError
        If the method is not of ``PRUNING_TYPE`` ``'unstructured'``, or the structures
        are not sequences or mappings.
    ValueError
        If a score or mask array has another shape than its array, or the amount is too
        large.
    """
    keys, values = _unpack(arrays, "arrays")
    scores = _aligned(importance_scores, keys, values, "importance_scores")
    given_masks = _aligned(default_masks, keys, [None] * len(values), "default_masks")
    for value, score, mask in zip(values, scores, given_masks):
        check_same_shape(value, score, "importance_scores")
        if mask is not None:
            check_same_shape(value, mask, "default_mask")

    method = pruning_method(**kwargs)
    if getattr(method, "PRUNING_TYPE", None) != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {getattr(method, 'PRUNING_TYPE', None)}"
        )
    if not values:
        return {} if keys is not None else []

    if isinstance(method, _Unstructured):
        eligible_masks = [None if m is None else eligible(m) for m in given_masks]
        keeps = method._keep_masks(scores, eligible_masks)
        result = [keep if m is None else apply_keep(m, keep) for m, keep in zip(given_masks, keeps)]
    else:
        masks = [ones_mask(v) if m is None else m for v, m in zip(values, given_masks)]
        result = _concatenated(method, scores, masks)
    return dict(zip(keys, result)) if keys is not None else result


def _concatenated(method: Any, scores: list[Array], masks: list[Array]) -> list[Array]:
    """Fallback for methods arrayprune does not know: concatenate, as PyTorch does."""
    xp = apc.array_namespace(*scores)
    dtype = xp.result_type(*(m.dtype for m in masks))
    flat_scores = xp.concat([xp.reshape(s, (-1,)) for s in scores])
    flat_masks = xp.concat([xp.reshape(xp.astype(m, dtype), (-1,)) for m in masks])
    combined = combine_masks(method, flat_scores, flat_masks)
    out, offset = [], 0
    for m in masks:
        n = size(m)
        out.append(xp.astype(xp.reshape(combined[offset : offset + n], m.shape), m.dtype))
        offset += n
    return out


def _unpack(structure: Any, what: str) -> tuple[list[Any] | None, list[Any]]:
    if isinstance(structure, Mapping):
        return list(structure.keys()), list(structure.values())
    if isinstance(structure, Sequence) and not isinstance(structure, (str, bytes)):
        return None, list(structure)
    if hasattr(structure, "__iter__") and not hasattr(structure, "shape"):
        return None, list(structure)
    raise TypeError(f"global_unstructured(): {what} must be a sequence or a mapping of arrays")


def _aligned(structure: Any, keys: list[Any] | None, defaults: list[Any], what: str) -> list[Any]:
    """Entries of `structure` in the order of `keys` (or positions), with defaults."""
    if structure is None:
        return list(defaults)
    if keys is not None:
        if not isinstance(structure, Mapping):
            raise TypeError(f"global_unstructured(): {what} must be a mapping like arrays")
        unknown = set(structure) - set(keys)
        if unknown:
            raise ValueError(f"global_unstructured(): {what} has keys not in arrays: {sorted(map(str, unknown))}")
        got = [structure.get(k) for k in keys]
    else:
        if isinstance(structure, Mapping):
            raise TypeError(f"global_unstructured(): {what} must be a sequence like arrays")
        got = list(structure)
        if len(got) != len(defaults):
            raise ValueError(f"global_unstructured(): {what} has {len(got)} entries for {len(defaults)} arrays")
    return [d if g is None else g for g, d in zip(got, defaults)]
