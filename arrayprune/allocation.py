"""Per-layer sparsity: how many entries each array loses when many are pruned to one total.

Two ways to split a total of ``round(amount * n)`` pruned entries over several arrays:

* :func:`allocate_from_curves`: from sensitivity curves (a model's output error when one
  array alone is pruned to each of a few sparsities, as a scan measures them). The
  predicted error of the model is the sum of the arrays' errors at their sparsities,
  each curve interpolated linearly between the points measured (and from ``(0, 0)``);
  the counts minimise it for the total asked. Every curve is replaced by its lower
  convex hull, whose segments cost an increasing error per entry removed; all segments
  of all arrays are filled cheapest first, so the total is met exactly and a fragile
  array (a steep curve) is pruned less.
* :func:`owl_allocation`: OWL, "Outlier Weighed Layerwise sparsity" (Yin et al., ICML
  2024), from importance scores alone (Wanda's ``|W| * ||X||`` or magnitudes): an
  array's outlier ratio is the fraction of its scores above ``m`` times their mean;
  ratios are scaled to ``[0, 2 * lam]`` and an array's sparsity is the target minus its
  scaled ratio, shifted so that the total is met. Arrays rich in outliers keep more.

Both respect per-array bounds (``min_sparsity``, ``max_sparsity``) and can count in
steps: an array whose method prunes the same number of entries from each of ``r``
output units (Wanda) changes by ``r`` entries at a time. Only Python numbers are
computed here, apart from :func:`outlier_ratio`, which reads an array of any Array API
library.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from ._namespace import namespace
from .amount import compute_nparams_toprune, validate_pruning_amount_init

__all__ = [
    "OWL_LAMBDA",
    "OWL_M",
    "allocate_from_curves",
    "counts_near",
    "outlier_ratio",
    "owl_allocation",
    "owl_counts",
    "predicted_error",
]

#: OWL's outlier threshold: a score is an outlier above ``OWL_M`` times its array's mean.
OWL_M = 5.0
#: OWL's spread: sparsities lie within ``amount - OWL_LAMBDA`` and ``amount + OWL_LAMBDA``.
OWL_LAMBDA = 0.08


def _bounds(
    sizes: Sequence[int], steps: Sequence[int], low: Any, high: Any
) -> tuple[list[int], list[int]]:
    """Per array, the fewest and most entries it may lose (multiples of its step)."""
    lows = _per_array(low, len(sizes), 0.0, "min_sparsity")
    highs = _per_array(high, len(sizes), 1.0, "max_sparsity")
    least, most = [], []
    for n, step, lo, hi in zip(sizes, steps, lows, highs, strict=True):
        if lo > hi:
            raise ValueError(f"min_sparsity {lo} exceeds max_sparsity {hi}")
        a = math.ceil(math.ceil(lo * n - 1e-9) / step) * step
        b = math.floor(math.floor(hi * n + 1e-9) / step) * step
        if a > b:
            raise ValueError(
                f"no count of pruned entries of an array of {n} (in steps of {step}) lies between "
                f"min_sparsity {lo} and max_sparsity {hi}"
            )
        least.append(a)
        most.append(b)
    return least, most


def _per_array(value: Any, count: int, default: float, what: str) -> list[float]:
    if value is None:
        values = [default] * count
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = [float(value)] * count
    else:
        values = [float(v) for v in value]
        if len(values) != count:
            raise ValueError(f"{what} has {len(values)} values for {count} arrays")
    for v in values:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{what} must be in [0, 1], got {v}")
    return values


def _checked(sizes: Sequence[int], steps: Sequence[int] | None, amount: Any) -> tuple[list[int], list[int], int]:
    """Sizes and steps as ints, and the total to prune: ``round(amount * n)`` (or the count)."""
    sizes = [int(n) for n in sizes]
    if any(n < 0 for n in sizes):
        raise ValueError("array sizes must be >= 0")
    steps = [1] * len(sizes) if steps is None else [int(s) for s in steps]
    if len(steps) != len(sizes) or any(s < 1 or (n and n % s) for n, s in zip(sizes, steps, strict=True)):
        raise ValueError("every step must be a positive divisor of its array's size")
    validate_pruning_amount_init(amount)
    total = compute_nparams_toprune(amount, sum(sizes))
    if total > sum(sizes):
        raise ValueError(f"amount={amount} should be smaller than the number of entries ({sum(sizes)})")
    return sizes, steps, total


def _curve_points(sparsities: Sequence[float], errors: Sequence[float]) -> list[tuple[float, float]]:
    """The measured points of one curve, from ``(0, 0)``, as (sparsity, error)."""
    points = [(0.0, 0.0)]
    for s, e in zip(sparsities, errors, strict=True):
        e = float(e)
        if not math.isfinite(e) or e < 0:
            raise ValueError(f"curve errors must be finite and >= 0, got {e}")
        if s > 0:
            points.append((float(s), e))
    return points


def _interpolate(points: list[tuple[float, float]], s: float) -> float:
    """The error at sparsity `s`: linear between points, the last segment's slope beyond them."""
    for (s0, e0), (s1, e1) in zip(points, points[1:], strict=False):
        if s <= s1:
            return e0 + (e1 - e0) * (s - s0) / (s1 - s0)
    if len(points) == 1:
        return 0.0
    (s0, e0), (s1, e1) = points[-2], points[-1]
    return e1 + max(e1 - e0, 0.0) * (s - s1) / (s1 - s0)


def predicted_error(
    curves: Sequence[Sequence[float]], sparsities: Sequence[float], sizes: Sequence[int], counts: Sequence[int]
) -> float:
    """The sum of the curves' errors at the sparsities that `counts` give (interpolated).

    Parameters
    ----------
    curves : sequence of sequences of float
        One curve per array: its error at each of `sparsities`.
    sparsities : sequence of float
        Ascending, in ``(0, 1]``.
    sizes : sequence of int
        Entries of each array.
    counts : sequence of int
        Entries pruned from each array.

    Returns
    -------
    float
    """
    _check_sparsities(sparsities)
    total = 0.0
    for curve, n, k in zip(curves, sizes, counts, strict=True):
        total += _interpolate(_curve_points(sparsities, curve), k / n if n else 0.0)
    return total


def _check_sparsities(sparsities: Sequence[float]) -> list[float]:
    values = [float(s) for s in sparsities]
    ascending = all(a < b for a, b in zip(values, values[1:], strict=False))
    if not values or any(not 0.0 < s <= 1.0 for s in values) or not ascending:
        raise ValueError(f"sparsities must be ascending, in (0, 1], got {values}")
    return values


def _hull(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The lower convex hull of points sorted by their first coordinate (monotone chain)."""
    hull: list[tuple[int, float]] = []
    for p in points:
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (p[0] - x0) >= (p[1] - y0) * (x1 - x0):  # hull[-1] lies on or above the chord
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def allocate_from_curves(
    curves: Sequence[Sequence[float]],
    sizes: Sequence[int],
    amount: int | float,
    *,
    sparsities: Sequence[float],
    min_sparsity: float | Sequence[float] | None = None,
    max_sparsity: float | Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
) -> list[int]:
    """How many entries each array loses: ``round(amount * n)`` in all, least predicted error.

    Parameters
    ----------
    curves : sequence of sequences of float
        One curve per array: the model's output error (any non-negative measure that adds
        up over arrays, a relative squared error say) when that array alone is pruned to
        each of `sparsities`.
    sizes : sequence of int
        Entries of each array.
    amount : int or float
        Fraction of all entries to prune, or their number (``round(amount * sum(sizes))``
        as in PyTorch).
    sparsities : sequence of float
        The sparsities the curves were measured at: ascending, in ``(0, 1]``.
    min_sparsity, max_sparsity : float or sequence of float, optional
        Bounds on each array's sparsity (one for all, or one per array).
    steps : sequence of int, optional
        Entries an array loses at a time (a divisor of its size; 1 by default): Wanda
        prunes the same count from each output unit, so its arrays move by their number
        of output units.

    Returns
    -------
    list of int
        Entries to prune from each array, multiples of its step, within its bounds. They
        add up to the total exactly when every step is 1; with larger steps, to the total
        less what no step fits (less than the largest step).

    Raises
    ------
    ValueError
        If curves, sparsities, sizes or steps disagree, an error is negative or not
        finite, or the bounds cannot hold the total.

    Notes
    -----
    The error of an array between measured sparsities is interpolated linearly, beyond
    the last with the last segment's slope. Each curve is replaced by its lower convex
    hull, on which the error per entry removed only grows; filling all hull segments of
    all arrays in order of that cost (ties: the earlier array first) minimises the summed
    error of the hulls for the total, within the bounds.

    Examples
    --------
    >>> allocate_from_curves([[0.1, 0.2], [1.0, 4.0]], [100, 100], 0.5, sparsities=[0.5, 1.0])
    [100, 0]
    """
    sizes, steps, total = _checked(sizes, steps, amount)
    sparsities = _check_sparsities(sparsities)
    if len(curves) != len(sizes):
        raise ValueError(f"{len(curves)} curves for {len(sizes)} arrays")
    least, most = _bounds(sizes, steps, min_sparsity, max_sparsity)
    if not sum(least) <= total <= sum(most):
        raise ValueError(
            f"cannot prune {total} entries within the per-array sparsity bounds "
            f"(between {sum(least)} and {sum(most)} are possible)"
        )
    segments = []  # (cost per entry, array, order, units)
    for i, (curve, n, step, lo, hi) in enumerate(zip(curves, sizes, steps, least, most, strict=True)):
        if len(curve) != len(sparsities):
            raise ValueError(f"curve {i} has {len(curve)} errors for {len(sparsities)} sparsities")
        points = _curve_points(sparsities, curve)
        counts = sorted({lo, hi, *(round(s * n / step) * step for s, _ in points if lo < s * n < hi)})
        at = [(k, _interpolate(points, k / n if n else 0.0)) for k in counts]
        hull = _hull(at)
        for j, ((k0, e0), (k1, e1)) in enumerate(zip(hull, hull[1:], strict=False)):
            segments.append(((e1 - e0) / (k1 - k0), i, j, (k1 - k0) // step))
    segments.sort(key=lambda seg: seg[:3])
    result = list(least)
    left = total - sum(least)
    for _, i, _, units in segments:
        if left <= 0:
            break
        take = min(units, left // steps[i])
        result[i] += take * steps[i]
        left -= take * steps[i]
    return result


def counts_near(
    sparsities: Sequence[float],
    sizes: Sequence[int],
    amount: int | float,
    *,
    min_sparsity: float | Sequence[float] | None = None,
    max_sparsity: float | Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
) -> list[int]:
    """Counts close to the given sparsities, shifted by one common offset to meet the total.

    Each array ``i`` gets about ``(sparsities[i] + t) * sizes[i]`` entries, clipped to its
    bounds, with the one offset ``t`` that makes them add up to ``round(amount * n)``;
    counts are then rounded (largest remainders first) so the total is exact when every
    step is 1.

    Parameters
    ----------
    sparsities : sequence of float
        The wished sparsity of each array.
    sizes : sequence of int
        Entries of each array.
    amount : int or float
        Fraction of all entries to prune, or their number.
    min_sparsity, max_sparsity, steps
        As for :func:`allocate_from_curves`.

    Returns
    -------
    list of int
        Entries to prune from each array.

    Raises
    ------
    ValueError
        If the bounds cannot hold the total, or the inputs disagree.
    """
    sizes, steps, total = _checked(sizes, steps, amount)
    wished = [float(s) for s in sparsities]
    if len(wished) != len(sizes) or not all(math.isfinite(s) for s in wished):
        raise ValueError(f"{len(wished)} finite sparsities are needed for {len(sizes)} arrays")
    least, most = _bounds(sizes, steps, min_sparsity, max_sparsity)
    if not sum(least) <= total <= sum(most):
        raise ValueError(
            f"cannot prune {total} entries within the per-array sparsity bounds "
            f"(between {sum(least)} and {sum(most)} are possible)"
        )

    def spread(t: float) -> list[float]:
        return [min(max((s + t) * n, lo), hi) for s, n, lo, hi in zip(wished, sizes, least, most, strict=True)]

    below, above = -2.0, 2.0  # spread(below) is every array's least, spread(above) its most
    for _ in range(200):
        middle = (below + above) / 2
        if sum(spread(middle)) < total:
            below = middle
        else:
            above = middle
    real = spread(above)
    result = [
        min(max(math.floor(x / step) * step, lo), hi) for x, step, lo, hi in zip(real, steps, least, most, strict=True)
    ]
    left = total - sum(result)
    order = sorted(range(len(sizes)), key=lambda i: (-(real[i] - result[i]) / steps[i], i))
    while left > 0:
        moved = False
        for i in order:
            if steps[i] <= left and result[i] + steps[i] <= most[i]:
                result[i] += steps[i]
                left -= steps[i]
                moved = True
                if left <= 0:
                    break
        if not moved:
            break
    return result


def outlier_ratio(scores: Any, m: float = OWL_M) -> float:
    """The fraction of the entries of `scores` above `m` times their mean (OWL's layer outlier distribution).

    Parameters
    ----------
    scores : array
        Importance scores of one array (Wanda's ``|W| * ||X||``, or magnitudes), of any
        Array API library.
    m : float, default :data:`OWL_M`
        The threshold, in means.

    Returns
    -------
    float
        In ``[0, 1]``; 0 for an empty array.
    """
    xp = namespace(scores)
    n = math.prod(int(s) for s in scores.shape)
    if n == 0:
        return 0.0
    a = xp.abs(xp.reshape(scores, (-1,)))
    if not xp.isdtype(a.dtype, "real floating"):
        a = xp.astype(a, xp.float64)
    mean = xp.mean(a)
    return float(xp.count_nonzero(a > m * mean)) / n


def owl_allocation(
    scores: Sequence[Any],
    amount: int | float,
    *,
    m: float = OWL_M,
    lam: float = OWL_LAMBDA,
    min_sparsity: float | Sequence[float] | None = None,
    max_sparsity: float | Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
) -> list[int]:
    """OWL's per-array counts: arrays with more outliers are pruned less (Yin et al., 2024).

    Parameters
    ----------
    scores : sequence of arrays
        Importance scores of each array: Wanda's ``|W| * ||X||`` as in the paper, or
        magnitudes for magnitude pruning.
    amount : int or float
        Fraction of all entries to prune, or their number.
    m : float, default :data:`OWL_M` (5)
        Outlier threshold, in means of the array's scores.
    lam : float, default :data:`OWL_LAMBDA` (0.08)
        Spread: outlier ratios are scaled to ``[0, 2 * lam]``, centred on their mean and
        subtracted from the target sparsity ``S``; every array stays within
        ``[S - lam, S + lam]`` (and `min_sparsity`, `max_sparsity`).
    min_sparsity, max_sparsity, steps
        As for :func:`allocate_from_curves`.

    Returns
    -------
    list of int
        Entries to prune from each array; ``round(amount * n)`` in all (exactly, with
        steps of 1).

    Raises
    ------
    ValueError
        If `lam` or `m` is negative, or the bounds cannot hold the total.

    Notes
    -----
    The paper sets the density of layer ``l`` to ``1 - S + (r_l - mean(r))`` where ``r``
    are the outlier ratios scaled to ``[0, 2 * lam]``, keeping every sparsity within
    ``[S - lam, S + lam]``; its layers (decoder blocks) have one size. Here arrays may
    differ in size, so those sparsities are shifted by the one offset that meets the total
    number of entries (:func:`counts_near`, nothing for equal sizes), within those bounds.
    """
    if not (math.isfinite(m) and m >= 0 and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"m and lam must be finite and >= 0, got m={m}, lam={lam}")
    scores = list(scores)
    sizes = [math.prod(int(s) for s in x.shape) for x in scores]
    ratios = [outlier_ratio(x, m) for x in scores]
    return owl_counts(
        ratios, sizes, amount, lam=lam, min_sparsity=min_sparsity, max_sparsity=max_sparsity, steps=steps
    )


def owl_counts(
    ratios: Sequence[float],
    sizes: Sequence[int],
    amount: int | float,
    *,
    lam: float = OWL_LAMBDA,
    min_sparsity: float | Sequence[float] | None = None,
    max_sparsity: float | Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
) -> list[int]:
    """:func:`owl_allocation` from each array's outlier ratio (:func:`outlier_ratio`) and size.

    For arrays read one at a time (a checkpoint streamed tensor by tensor): the
    counts depend on the scores only through their ratios.

    Parameters
    ----------
    ratios : sequence of float
        Each array's outlier ratio.
    sizes : sequence of int
        Entries of each array.
    amount, lam, min_sparsity, max_sparsity, steps
        As for :func:`owl_allocation`.

    Returns
    -------
    list of int
        Entries to prune from each array.

    Raises
    ------
    ValueError
        If `lam` is negative, or the bounds cannot hold the total.
    """
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")
    ratios = [float(r) for r in ratios]
    low, high = min(ratios, default=0.0), max(ratios, default=0.0)
    scaled = [0.0 if high == low else (r - low) / (high - low) * 2 * lam for r in ratios]
    _, _, total = _checked(sizes, steps, amount)
    target = total / sum(sizes) if sum(sizes) else 0.0
    mean = sum(scaled) / len(scaled) if scaled else 0.0
    wished = [target - (r - mean) for r in scaled]
    lows = [max(lo, target - lam) for lo in _per_array(min_sparsity, len(sizes), 0.0, "min_sparsity")]
    highs = [min(hi, target + lam) for hi in _per_array(max_sparsity, len(sizes), 1.0, "max_sparsity")]
    lows = [min(lo, hi) for lo, hi in zip(lows, highs, strict=True)]
    return counts_near(wished, sizes, amount, min_sparsity=lows, max_sparsity=highs, steps=steps)
