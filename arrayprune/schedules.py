"""Gradual pruning: sparsity schedules and a helper that follows them.

A schedule is a small immutable object: called with a training step, it returns the
target sparsity at that step. :func:`prune_to_schedule` (or :func:`prune_to_sparsity`)
prunes just enough more of an array to reach the target, through the container
semantics: what is already pruned stays pruned, and only the difference is pruned.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from ._masks import check_same_shape
from ._namespace import check_known_shape
from .functional import mask_for
from .methods import AmountPruningMethod, L1Unstructured

__all__ = ["ConstantSparsity", "PolynomialDecay", "prune_to_sparsity", "prune_to_schedule", "units_to_prune"]

Array = Any


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


def _check_step(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)


@dataclass(frozen=True)
class ConstantSparsity:
    """The same target sparsity from `begin_step` on (zero before).

    Parameters
    ----------
    sparsity : float
        Target fraction of pruned units, in ``[0, 1]``.
    begin_step : int, default 0
        First step at which the target applies.
    """

    sparsity: float
    begin_step: int = 0

    def __post_init__(self) -> None:
        _check_fraction("sparsity", self.sparsity)
        _check_step("begin_step", self.begin_step)

    def __call__(self, step: int) -> float:
        """Target sparsity at `step`."""
        return float(self.sparsity) if step >= self.begin_step else 0.0


@dataclass(frozen=True)
class PolynomialDecay:
    """Sparsity rising from `initial_sparsity` to `final_sparsity` (Zhu & Gupta, 2017).

    Between `begin_step` and `end_step` the target is
    ``final + (initial - final) * (1 - (step - begin) / (end - begin)) ** power``:
    fast pruning early, slower as the network has fewer weights left. Before
    `begin_step` the target is 0; from `end_step` on it is `final_sparsity`.

    Parameters
    ----------
    initial_sparsity, final_sparsity : float
        Targets at `begin_step` and `end_step`, in ``[0, 1]``.
    begin_step, end_step : int
        The pruning window, ``begin_step <= end_step``.
    power : float, default 3
        Exponent of the decay (3 in the paper).
    """

    initial_sparsity: float
    final_sparsity: float
    begin_step: int
    end_step: int
    power: float = 3.0

    def __post_init__(self) -> None:
        _check_fraction("initial_sparsity", self.initial_sparsity)
        _check_fraction("final_sparsity", self.final_sparsity)
        begin = _check_step("begin_step", self.begin_step)
        end = _check_step("end_step", self.end_step)
        if end < begin:
            raise ValueError(f"end_step ({end}) must not precede begin_step ({begin})")
        if isinstance(self.power, bool) or not isinstance(self.power, numbers.Real) or not self.power > 0:
            raise ValueError(f"power must be a positive number, got {self.power!r}")

    def __call__(self, step: int) -> float:
        """Target sparsity at `step`."""
        if step < self.begin_step:
            return 0.0
        if step >= self.end_step:
            return float(self.final_sparsity)
        progress = (step - self.begin_step) / (self.end_step - self.begin_step)
        initial, final = float(self.initial_sparsity), float(self.final_sparsity)
        return final + (initial - final) * (1.0 - progress) ** self.power


def prune_to_sparsity(
    x: Array,
    sparsity: float,
    *,
    default_mask: Array | None = None,
    pruning_method: Any = L1Unstructured,
    importance_scores: Array | None = None,
    **kwargs: Any,
) -> Array:
    """Prune just enough more of `x` that ``round(sparsity * units)`` units are pruned.

    Units are what the method prunes: entries for unstructured methods, channels along
    ``dim`` for structured ones, blocks for :class:`~arrayprune.BlockUnstructured`. Units
    pruned by `default_mask` count towards the target and stay pruned; if they already
    meet it, the mask comes back unchanged.

    Parameters
    ----------
    x : array
        The array to prune.
    sparsity : float
        Target fraction of pruned units, in ``[0, 1]``.
    default_mask : array, optional
        Mask of earlier pruning.
    pruning_method : type, default L1Unstructured
        A subclass of :class:`~arrayprune.AmountPruningMethod`; it is built with an
        integer amount (the number of units still to prune) and `kwargs` (``n`` and
        ``dim`` for :class:`~arrayprune.LnStructured`, ``block_shape`` for
        :class:`~arrayprune.BlockUnstructured`, ...).
    importance_scores : array, optional
        Scores to rank by instead of `x`.

    Returns
    -------
    array
        The new mask (dtype of `default_mask`, boolean if none).

    Raises
    ------
    TypeError
        If the method prunes no amount of units (an N:M pattern, a given mask).
    """
    if default_mask is not None:
        check_same_shape(x, default_mask, "default_mask")
    extra = units_to_prune(x, sparsity, default_mask, pruning_method, **kwargs)
    method = pruning_method(extra, **kwargs)
    return mask_for(method, x, default_mask=default_mask, importance_scores=importance_scores)


def units_to_prune(x: Array, sparsity: float, mask: Array | None, pruning_method: Any, **kwargs: Any) -> int:
    """How many more units must be pruned for ``round(sparsity * units)`` to be pruned.

    The adapters use it to follow schedules with their own verbs.

    Parameters
    ----------
    x : array
        The array (only its shape matters).
    sparsity : float
        Target fraction of pruned units, in ``[0, 1]``.
    mask : array or None
        Mask of earlier pruning (None: nothing pruned yet).
    pruning_method : type or AmountPruningMethod
        A subclass of :class:`~arrayprune.AmountPruningMethod` (or an instance of
        one): its :meth:`~arrayprune.AmountPruningMethod.units` decide what a unit is.
    **kwargs
        Further arguments of the method (``dim``, ``block_shape``, ...).

    Returns
    -------
    int
        A non-negative count: units already pruned count towards the target.

    Raises
    ------
    TypeError
        If the method prunes no amount of units, or `sparsity` is not a number.
    ValueError
        If `sparsity` is outside ``[0, 1]``, or `x` is a Dask array of unknown chunk
        sizes (call its ``compute_chunk_sizes()`` first).
    """
    target = _check_fraction("sparsity", sparsity)
    check_known_shape(x)  # a Dask array of unknown chunk sizes has no count of units
    if isinstance(pruning_method, AmountPruningMethod):
        units, pruned = pruning_method.units(x, mask)
        return max(0, round(target * units) - pruned)
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, AmountPruningMethod)):
        what = getattr(pruning_method, "__name__", repr(pruning_method))
        raise TypeError(
            "pruning_method must prune an amount of units (an AmountPruningMethod subclass, such as "
            f"L1Unstructured, LnStructured or BlockUnstructured), got {what}"
        )
    units, pruned = pruning_method(0, **kwargs).units(x, mask)
    return max(0, round(target * units) - pruned)


def prune_to_schedule(x: Array, schedule: Any, step: int, **kwargs: Any) -> Array:
    """Prune `x` to the sparsity `schedule` gives at `step` (see :func:`prune_to_sparsity`).

    Parameters
    ----------
    x : array
        The array to prune.
    schedule : callable
        ``schedule(step) -> sparsity``, e.g. :class:`PolynomialDecay`.
    step : int
        The current step.
    **kwargs
        Passed to :func:`prune_to_sparsity` (``default_mask``, ``pruning_method``, ...).

    Returns
    -------
    array
        The new mask.
    """
    return prune_to_sparsity(x, schedule(step), **kwargs)
