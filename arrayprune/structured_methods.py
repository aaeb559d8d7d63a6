"""Calibrated structured methods: units of a layer's input columns, scored on calibration data.

A row of :data:`arrayprune.METHODS` like any other, with a score that needs a statistic of
calibration data (``Score.statistic == "hessian"``: ``H = X^T X`` of the inputs of the layer
that reads the units) and a pattern of whole channels. Where the statistic exists (a
Hugging Face folder shrunk layer by layer, :func:`prune.shrink_llm
<arrayprune.adapters.torch.prune.shrink_llm>`), :meth:`UnitPruningMethod.prune_units`
scores the units of the *consumer* (``down_proj`` for MLP channels, ``o_proj`` for heads),
keeps the best and, with ``compensate`` (the default), refits the kept columns
(:func:`arrayprune.structured.compensate`). Where several consumers read the same units
(the channel groups of a torch module given calibration batches, ``prune.shrink``), each
scores them and :meth:`UnitPruningMethod.combine_scores` makes one score per unit.
Without the statistic (a plan, a container, a bare array) the method ranks channels by
their L2 norm, as ``ln_structured`` with ``n=2``.

A new calibrated score is a subclass with :meth:`~UnitPruningMethod.unit_scores` and a
one-line ``DESCRIPTION``, registered with :func:`arrayprune.registry.register_method`:
``--method`` offers it for ``--shrink --groups channels|heads``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import array_api_compat as apc
import array_api_extra as xpx

from . import method_parts as _parts
from ._namespace import namespace
from .methods import StructuredPruningMethod
from .norms import channel_norms
from .selection import smallest_magnitude_keep
from .structured import DEFAULT_DAMP, activation_unit_scores, compensate, obs_unit_scores

__all__ = ["ActivationStructured", "ObsStructured", "UnitChoice", "UnitPruningMethod", "UNIT_SCORES"]

Array = Any

#: The score of the calibrated structured methods: a unit's importance from the Hessian of
#: its consumer's inputs (its diagonal, the inputs' squared norms, is enough for
#: activation-aware scores; the refit needs the whole).
UNIT_SCORES = _parts.Score("unit scores", elementwise=False, needs_calibration=True, statistic="hessian")


@dataclass(frozen=True)
class UnitChoice:
    """What :meth:`UnitPruningMethod.prune_units` decides for one consumer.

    Attributes
    ----------
    scores : array
        ``[units]``: each unit's score (lowest goes first).
    kept : array
        The kept units' indices, ascending.
    columns : array
        The kept input columns, ascending (each kept unit's run of columns).
    weight : array
        ``[out, in]``, in the weight's dtype: the consumer's new weight; the dropped
        columns are zero, the kept ones refit (``compensate``) or as they were.
    """

    scores: Array
    kept: Array
    columns: Array
    weight: Array


class UnitPruningMethod(StructuredPruningMethod):
    """Base of the methods that remove units of a layer's input columns scored on calibration data.

    A subclass implements :meth:`unit_scores` and states in ``DESCRIPTION`` what it
    computes. Units are contiguous runs of equal size of the consumer's input columns (an
    MLP channel is one column, a head ``head_dim`` columns, a KV group its query heads').

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the units to prune (of each consumer), or their number.
    dim : int, default -1
        Axis of the channels when ranked without statistics (by L2 norm).
    compensate : bool, default True
        Refit the consumer's kept columns to its outputs on the calibration inputs:
        ``W'_K = W Hd[:, K] Hd[K, K]^-1`` (:func:`arrayprune.structured.compensate`).
    damp : float, default 0.01
        The Hessian's damping, ``Hd = H + damp * mean(diag H) * I``.
    """

    SCORE: ClassVar[_parts.Score] = UNIT_SCORES
    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {"compensate": _parts.NO_FLAG, "damp": _parts.NO_FLAG}
    #: What a unit's score is, in one line (dry runs and reports print it).
    DESCRIPTION: ClassVar[str] = ""

    def __init__(self, amount: int | float, dim: int = -1, compensate: bool = True, damp: float = DEFAULT_DAMP):
        super().__init__(amount, dim)
        if not isinstance(compensate, bool):
            raise TypeError(f"compensate must be True or False, got {compensate!r}")
        if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not damp >= 0:
            raise ValueError(f"damp must be a number >= 0, got {damp!r}")
        self.compensate = compensate
        self.damp = float(damp)

    def channel_scores(self, t: Array, dim: int) -> Array:
        """Without calibration statistics: each channel's L2 norm (as ``ln_structured``, ``n=2``)."""
        return channel_norms(t, 2, dim)

    def unit_scores(self, weight: Array, hessian: Array, units: int) -> Array:
        """One score per unit of `weight`'s input columns (``[units]``); lowest goes first.

        Parameters
        ----------
        weight : array
            The consumer's weight ``[out, in]``.
        hessian : array
            ``[in, in]``: ``X^T X`` of the consumer's calibration inputs.
        units : int
            How many units the ``in`` columns hold.
        """
        raise NotImplementedError

    def combine_scores(self, scores: Sequence[Array]) -> Array:
        """One score per unit from the scores several consumers give the same units.

        A unit read by several layers (a channel of a residual trunk, read by every block
        of the stage) gets one score from each of them; this combines them. The scores of
        :meth:`unit_scores` are taken as increases of the consumers' squared output
        errors, which add: the default is their sum. A subclass whose scores are norms
        overrides it (:class:`ActivationStructured`: the root of the sum of squares).

        Parameters
        ----------
        scores : sequence of arrays
            One ``[units]`` array per consumer, of one namespace, device and shape.

        Returns
        -------
        array
            ``[units]``: the combined scores (lowest goes first).

        Raises
        ------
        ValueError
            If `scores` is empty or the arrays differ in shape.
        """
        _check_parts(scores)
        total = scores[0]
        for s in scores[1:]:
            total = total + s
        return total

    def prune_units(self, weight: Array, hessian: Array, units: int) -> UnitChoice:
        """Score the units, keep all but ``amount`` of them, and refit the kept columns.

        Ranking is that of every arrayprune selection: by ``|score|`` ascending, ties to
        the lower index.

        Parameters
        ----------
        weight : array
            The consumer's weight ``[out, in]``.
        hessian : array
            ``[in, in]``: ``X^T X`` of its calibration inputs.
        units : int
            How many units the ``in`` columns hold (contiguous, of equal size).

        Returns
        -------
        UnitChoice

        Raises
        ------
        ValueError
            For shapes that do not agree, or an amount larger than `units`.
        """
        xp = namespace(weight, hessian)
        scores = self.unit_scores(weight, hessian, units)
        k = self.count(units)
        if k:
            kept = xp.nonzero(smallest_magnitude_keep([scores], k)[0])[0]
        else:
            kept = xp.arange(units, device=apc.device(scores))
        columns = _unit_columns(xp, kept, weight.shape[1] // units)
        return UnitChoice(scores, kept, columns, self._refit(xp, weight, hessian, columns))

    def group_scores(
        self,
        reads: Sequence[Sequence[tuple[Any, int]]],
        sizes: Sequence[int],
        matrix: Callable[[Any], Array],
        hessians: Mapping[Any, Array],
        per: Mapping[Any, int],
    ) -> list[Array | None]:
        """Per channel group, one score per channel from every consumer that reads it.

        Each consumer is scored once (:meth:`unit_scores` on its whole weight, its input
        channels as units of ``per[key]`` columns); a group takes its channels there at its
        offset, and :meth:`combine_scores` makes one score of its consumers' scores.

        Parameters
        ----------
        reads : sequence of sequences of (key, int)
            Per group, each consumer reading it and the first of its input units the
            group's channels take (after a concatenation); empty: the group is not scored.
        sizes : sequence of int
            Per group, its number of channels.
        matrix : callable
            ``matrix(key)``: the consumer's weight ``[out, in]``, in the dtype to score in.
        hessians, per : mappings
            By consumer: ``X^T X`` of its inputs, and columns per input channel.

        Returns
        -------
        list
            Per group, ``[channels]`` scores, or None for a group no consumer reads.
        """
        scored: dict[Any, Array] = {}
        out: list[Array | None] = []
        for slots, size in zip(reads, sizes, strict=True):
            parts = []
            for key, offset in slots:
                if key not in scored:
                    w = matrix(key)
                    scored[key] = self.unit_scores(w, hessians[key], w.shape[1] // per[key])
                parts.append(scored[key][offset : offset + size])
            out.append(self.combine_scores(parts) if parts else None)
        return out

    def refit_consumers(
        self,
        kept: Sequence[Sequence[int]],
        reads: Sequence[Sequence[tuple[Any, int]]],
        sizes: Sequence[int],
        matrix: Callable[[Any], Array],
        hessians: Mapping[Any, Array],
        per: Mapping[Any, int],
    ) -> dict[Any, Array]:
        """Each consumer that loses channels: its new weight once every group it reads is cut.

        :meth:`refit_units` over all the units the consumer keeps, whatever group they
        belong to (one solve per consumer).

        Parameters
        ----------
        kept : sequence of sequences of int
            Per group, the channels it keeps.
        reads, sizes, matrix, hessians, per
            As for :meth:`group_scores`.

        Returns
        -------
        dict
            By consumer key, ``[out, in]`` (the dropped columns zero), for those that lose
            a column.
        """
        removed: dict[Any, set[int]] = {}
        for keep, slots, size in zip(kept, reads, sizes, strict=True):
            gone = set(range(size)) - {int(k) for k in keep}
            for key, offset in slots:
                removed.setdefault(key, set()).update(offset + c for c in gone)
        out: dict[Any, Array] = {}
        for key, units_gone in removed.items():
            if not units_gone:
                continue
            w = matrix(key)
            xp = namespace(w)
            units = w.shape[1] // per[key]
            kept_units = xp.asarray(sorted(set(range(units)) - units_gone), dtype=xp.int64, device=apc.device(w))
            out[key] = self.refit_units(w, hessians[key], kept_units, units)
        return out

    def refit_units(self, weight: Array, hessian: Array, kept: Array, units: int) -> Array:
        """The consumer's new weight once `kept` units are chosen: the others' columns zero.

        With ``compensate`` the kept columns are refit on `hessian`
        (:func:`arrayprune.structured.compensate`, one solve over all of them), else they
        stay as they are. Where several consumers read the units (channel groups), each
        is refit with the units it keeps, whatever group they belong to.

        Parameters
        ----------
        weight : array
            The consumer's weight ``[out, in]``.
        hessian : array
            ``[in, in]``: ``X^T X`` of its calibration inputs.
        kept : array
            The kept units' indices (integers, ascending).
        units : int
            How many units the ``in`` columns hold (contiguous, of equal size).

        Returns
        -------
        array
            ``[out, in]``, in the weight's dtype.
        """
        xp = namespace(weight, hessian, kept)
        return self._refit(xp, weight, hessian, _unit_columns(xp, kept, weight.shape[1] // units))

    def _refit(self, xp: Any, weight: Array, hessian: Array, columns: Array) -> Array:
        if self.compensate:
            refit = xp.astype(compensate(weight, hessian, columns, self.damp), weight.dtype)
        else:
            refit = xp.take(weight, columns, axis=1)
        new = xp.zeros(weight.shape, dtype=weight.dtype, device=apc.device(weight))
        return _put_columns(xp, new, columns, refit)


def _unit_columns(xp: Any, kept: Array, per: int) -> Array:
    """The input columns of the `kept` units of `per` contiguous columns each, ascending."""
    offsets = xp.arange(per, dtype=kept.dtype, device=apc.device(kept))
    return xp.reshape(kept[:, None] * per + offsets[None, :], (-1,))


def _check_parts(scores: Sequence[Array]) -> None:
    if len(scores) == 0:
        raise ValueError("no unit scores to combine")
    shape = tuple(scores[0].shape)
    for s in scores[1:]:
        if tuple(s.shape) != shape:
            raise ValueError(f"unit scores to combine differ in shape: {shape} and {tuple(s.shape)}")


def _put_columns(xp: Any, out: Array, columns: Array, values: Array) -> Array:
    """`out` with ``out[:, columns] = values`` (a copy where the namespace's arrays are immutable)."""
    try:
        return xpx.at(out)[:, columns].set(values, xp=xp)
    except IndexError:  # no integer-array assignment (array-api-strict): a one-hot product
        at = columns[:, None] == xp.arange(out.shape[1], dtype=columns.dtype, device=apc.device(columns))[None, :]
        return values @ xp.astype(at, values.dtype)


class ActivationStructured(UnitPruningMethod):
    """Prune whole units of smallest activation-aware norm, refitting what reads them.

    A unit's score is ``sqrt(sum_{j in unit} ||W[:, j]||^2 ||X_j||^2)`` over the
    consumer's input columns ``j`` (Wanda's ``|W| ||X||``, over whole columns):
    :func:`arrayprune.structured.activation_unit_scores`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the units to prune (of each consumer), or their number.
    dim : int, default -1
        Axis of the channels when ranked without statistics (by L2 norm).
    compensate : bool, default True
        Refit the consumer's kept columns on the calibration inputs.
    damp : float, default 0.01
        The Hessian's damping for the refit.
    """

    DESCRIPTION = "||X_j|| x ||W[:, j]|| of the consumer's input columns (root of the sum over a unit)"

    def unit_scores(self, weight: Array, hessian: Array, units: int) -> Array:
        xp = namespace(weight, hessian)
        if hessian.ndim != 2:
            raise ValueError(f"the Hessian must be square, got shape {tuple(hessian.shape)}")
        return activation_unit_scores(weight, xp.linalg.diagonal(hessian), units)

    def combine_scores(self, scores: Sequence[Array]) -> Array:
        """Several consumers' scores of the same units: the root of the sum of their squares.

        A unit's score is a root of a sum of squares over its columns; over several
        consumers it stays one: the norm of the unit's activation-weighted columns in all
        of them, ``sqrt(sum_c s_c^2)``.

        Parameters
        ----------
        scores : sequence of arrays
            One ``[units]`` array per consumer, of one namespace, device and shape.

        Returns
        -------
        array
            ``[units]``.

        Raises
        ------
        ValueError
            If `scores` is empty or the arrays differ in shape.
        """
        _check_parts(scores)
        xp = namespace(*scores)
        total = scores[0] * scores[0]
        for s in scores[1:]:
            total = total + s * s
        return xp.sqrt(total)


class ObsStructured(UnitPruningMethod):
    """Prune whole units whose removal (the others refit) costs the consumer's output least.

    Optimal Brain Surgeon over a unit's columns ``S``: ``tr(W_S ([Hd^-1]_SS)^-1 W_S^T)``,
    ``||W[:, j]||^2 / [Hd^-1]_jj`` for one column
    (:func:`arrayprune.structured.obs_unit_scores`).

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the units to prune (of each consumer), or their number.
    dim : int, default -1
        Axis of the channels when ranked without statistics (by L2 norm).
    compensate : bool, default True
        Refit the consumer's kept columns on the calibration inputs.
    damp : float, default 0.01
        The Hessian's damping (scores and refit).
    """

    DESCRIPTION = "OBS: ||W[:, j]||^2 / [H^-1]_jj of the consumer's input columns (a unit as a whole)"

    def unit_scores(self, weight: Array, hessian: Array, units: int) -> Array:
        return obs_unit_scores(weight, hessian, units, self.damp)
