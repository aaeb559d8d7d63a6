"""Global pruning: one threshold across many arrays, without concatenating them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import array_api_compat as apc

from ._masks import apply_keep, check_same_shape, count_true, eligible, ones_mask, size
from ._namespace import namespace, widest_float
from ._tracing import is_traced
from .method_parts import score_of
from .methods import UnstructuredPruningMethod, combine_masks
from .selection import smallest_magnitude_keep

__all__ = ["global_unstructured", "lamp_scores", "sorted_lamp_scores"]

Array = Any


def global_unstructured(
    arrays: Sequence[Array] | Mapping[Any, Array],
    pruning_method: Any,
    importance_scores: Sequence[Array | None] | Mapping[Any, Array] | None = None,
    *,
    default_masks: Sequence[Array | None] | Mapping[Any, Array] | None = None,
    min_sparsity: float | Sequence[float] | Mapping[Any, float] | None = None,
    max_sparsity: float | Sequence[float] | Mapping[Any, float] | None = None,
    normalization: str | None = None,
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
    min_sparsity, max_sparsity : float, or sequence or mapping of floats, optional
        Bounds on the final sparsity of each array (fraction of its entries pruned,
        earlier pruning included), one value for all or one per array. They keep a
        small layer from being wiped out, or force a minimum everywhere. The total
        stays exact; arrays are filled by one global threshold, clipped to their bounds.
    normalization : {None, 'lamp'}, optional
        ``'lamp'`` ranks by layer-adaptive magnitude scores (Lee et al., 2021): the
        squared magnitude of an entry divided by the sum of the squared magnitudes of
        the entries of its array that are not smaller. Needs a magnitude method
        (:class:`~arrayprune.L1Unstructured`); costs a sort of each array.
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
    for value, score, mask in zip(values, scores, given_masks, strict=True):
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

    constrained = min_sparsity is not None or max_sparsity is not None
    if normalization not in (None, "lamp"):
        raise ValueError(f"normalization must be None or 'lamp', got {normalization!r}")
    if (constrained or normalization) and not isinstance(method, UnstructuredPruningMethod):
        raise TypeError("sparsity bounds and normalization need an UnstructuredPruningMethod")
    if normalization == "lamp" and not score_of(method).magnitude:
        raise ValueError("normalization='lamp' ranks magnitudes: use L1Unstructured")

    if isinstance(method, UnstructuredPruningMethod):
        eligible_masks = [None if m is None else eligible(m) for m in given_masks]
        # Bounds and LAMP need the number itself; plain selection may count lazily.
        k = method.drop_count(values, eligible_masks, defer=not constrained and normalization is None)
        if normalization == "lamp":
            ranked = [lamp_scores(s, e) for s, e in zip(scores, eligible_masks, strict=True)]
        else:
            ranked = method.entry_scores(scores)
        if constrained:
            bounds = _bounds(keys, values, eligible_masks, min_sparsity, max_sparsity)
            keeps = _bounded_selection(ranked, eligible_masks, k, bounds)
        else:
            keeps = smallest_magnitude_keep(ranked, k, eligible_masks)
        result = [keep if m is None else apply_keep(m, keep) for m, keep in zip(given_masks, keeps, strict=True)]
    else:
        masks = [ones_mask(v) if m is None else m for v, m in zip(values, given_masks, strict=True)]
        result = _concatenated(method, scores, masks)
    return dict(zip(keys, result, strict=True)) if keys is not None else result


def _bounds(
    keys: list[Any] | None,
    values: list[Array],
    eligible_masks: list[Array | None],
    min_sparsity: Any,
    max_sparsity: Any,
) -> list[tuple[int, int]]:
    """Per array, how many more entries may be pruned: (at least, at most)."""
    lows = _per_array(min_sparsity, keys, len(values), 0.0, "min_sparsity")
    highs = _per_array(max_sparsity, keys, len(values), 1.0, "max_sparsity")
    bounds = []
    for value, e, low, high in zip(values, eligible_masks, lows, highs, strict=True):
        n = size(value)
        available = n if e is None else count_true(e)
        already = n - available
        # A little slack keeps 0.3 * 10 from rounding up to 4.
        least, most = math.ceil(low * n - 1e-9), math.floor(high * n + 1e-9)
        if least > most:
            what = f"min_sparsity {low} exceeds max_sparsity {high}" if low > high else (
                f"no number of pruned entries of an array of {n} lies between "
                f"min_sparsity {low} ({least}) and max_sparsity {high} ({most})"
            )
            raise ValueError(what)
        at_least = min(max(least - already, 0), available)
        at_most = min(max(most - already, 0), available)
        bounds.append((at_least, max(at_least, at_most)))
    return bounds


def _per_array(spec: Any, keys: list[Any] | None, count: int, default: float, what: str) -> list[float]:
    if spec is None:
        return [default] * count
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        values = [spec] * count
    else:
        values = _aligned(spec, keys, [default] * count, what)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{what} must hold numbers, got {type(v).__name__}")
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{what} must be in [0, 1], got {v}")
    return [float(v) for v in values]


def _bounded_selection(
    ranked: list[Array], eligible_masks: list[Array | None], k: int, bounds: list[tuple[int, int]]
) -> list[Array]:
    """Keep masks dropping `k` entries in all, between each array's bounds.

    Each array first drops its own `at_least` smallest entries. The rest are chosen by
    one global ranking among the entries whose rank within their own array lies
    between `at_least` and `at_most`: the union of those ranges is ranked globally, so
    every array takes a prefix of its range, and the global threshold is clipped to
    the bounds exactly.
    """
    forced = _check_total(k, bounds)
    keep_low, free = [], []
    for r, e, (lo, hi) in zip(ranked, eligible_masks, bounds, strict=True):
        below_low = smallest_magnitude_keep([r], lo, [e])[0]
        below_high = smallest_magnitude_keep([r], hi, [e])[0]
        keep_low.append(below_low)
        free.append(below_low & ~below_high)
    chosen = smallest_magnitude_keep(ranked, k - forced, free)
    return [a & b for a, b in zip(keep_low, chosen, strict=True)]


def _check_total(k: int, bounds: list[tuple[int, int]]) -> int:
    """Refuse a total the bounds cannot hold; the entries they force."""
    forced = sum(lo for lo, _ in bounds)
    ceiling = sum(hi for _, hi in bounds)
    if not forced <= k <= ceiling:
        raise ValueError(
            f"cannot prune {k} entries within the per-array sparsity bounds "
            f"(between {forced} and {ceiling} are possible)"
        )
    return forced


def lamp_scores(x: Array, eligible_mask: Array | None = None) -> Array:
    """Layer-adaptive magnitude pruning (LAMP) scores of one array.

    The score of an entry is its squared magnitude divided by the sum of the squared
    magnitudes of the entries of the same array ranked at or above it (ties ranked by
    position, so equal magnitudes get distinct scores and the lower index ranks first).
    Entries outside `eligible_mask` count as zero.

    Parameters
    ----------
    x : array
        Weights or importance scores.
    eligible_mask : boolean array, optional
        Entries still in play.

    Returns
    -------
    array
        Scores in ``[0, 1]``, shaped like `x` (float64 where the library has it).

    Raises
    ------
    ValueError
        If `x` holds NaN. Inside ``jax.jit`` values cannot be checked: there, scores
        of an array holding NaN are NaN.
    """
    xp = namespace(x)
    if size(x) == 0:  # nothing to rank (and Dask cannot flatten every empty array)
        return xp.zeros(x.shape, dtype=widest_float(xp, apc.device(x)), device=apc.device(x))
    a = _magnitudes(x)
    if eligible_mask is not None:
        a = xp.where(xp.reshape(eligible_mask, (-1,)), a, xp.asarray(0.0, dtype=a.dtype, device=apc.device(x)))
    order = xp.argsort(a, stable=True)
    ratio = _ascending_ratios(xp, xp.take(a, order))
    return xp.reshape(xp.take(ratio, xp.argsort(order)), x.shape)


def _magnitudes(x: Array) -> Array:
    """``|x|`` flat, in the widest float; ValueError for NaN (LAMP's input)."""
    xp = namespace(x)
    a = xp.abs(xp.astype(xp.reshape(x, (-1,)), widest_float(xp, apc.device(x))))
    if not is_traced(a) and bool(xp.any(xp.isnan(a))):
        raise ValueError("LAMP scores are undefined for arrays holding NaN")
    return a


def _ascending_ratios(xp: Any, ascending: Array) -> Array:
    """LAMP's ratios of magnitudes sorted ascending: each square over the sum of the squares from it on."""
    squared = ascending**2
    suffix = xp.flip(xp.cumulative_sum(xp.flip(squared)))
    return xp.where(suffix > 0, squared / xp.where(suffix > 0, suffix, 1.0), 0.0)


def sorted_lamp_scores(x: Array) -> Array:
    """The LAMP scores of `x` (:func:`lamp_scores`, every entry eligible), ascending.

    The same values, bit for bit, without the positions (one sort instead of two
    argsorts): what counting them needs.

    Parameters
    ----------
    x : array
        Weights.

    Returns
    -------
    array
        1-D, ascending (float64 where the library has it).

    Raises
    ------
    ValueError
        If `x` holds NaN.
    """
    xp = namespace(x)
    if size(x) == 0:
        return xp.zeros((0,), dtype=widest_float(xp, apc.device(x)), device=apc.device(x))
    return _ascending_ratios(xp, xp.sort(_magnitudes(x)))


def _concatenated(method: Any, scores: list[Array], masks: list[Array]) -> list[Array]:
    """Fallback for methods arrayprune does not know: concatenate, as PyTorch does."""
    xp = namespace(*scores)
    # The standard defines no promotion between bool and numeric dtypes: a common float
    # mask when any default mask is numeric, else bool.
    numeric = [m.dtype for m in masks if not xp.isdtype(m.dtype, "bool")]
    dtype = xp.result_type(*numeric) if numeric else xp.bool
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
    if hasattr(structure, "__iter__") and not hasattr(structure, "shape") and not isinstance(structure, (str, bytes)):
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
    return [d if g is None else g for g, d in zip(got, defaults, strict=True)]
