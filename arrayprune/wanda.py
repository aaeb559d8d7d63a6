"""Wanda: prune within each output unit by weight magnitude times input norm.

Wanda (Sun et al., "A Simple and Effective Pruning Approach for Large Language Models",
ICLR 2024) scores weight ``W[i, j]`` of a layer by ``|W[i, j]| * ||X_j||_2``, where
``||X_j||_2`` is the L2 norm of input feature ``j`` over calibration data, and prunes the
same fraction of the entries of every output unit ``i`` (the comparison group). Here the
two halves are separate, as everywhere in arrayprune: :func:`wanda_scores` makes the
scores (``importance_scores``), and :class:`Wanda` is the method that compares entries
within each output unit. Without scores, :class:`Wanda` prunes by magnitude per output
unit.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar

import array_api_compat as apc
import array_api_extra as xpx

from . import amount as _amount
from . import method_parts as _parts
from ._masks import apply_keep, is_bool, mask_or_ones
from ._namespace import check_known_shape, namespace, widest_float
from ._tracing import is_traced
from .methods import AmountPruningMethod
from .selection.portable import magnitude_keys

__all__ = ["Wanda", "wanda_scores"]

Array = Any


class Wanda(AmountPruningMethod):
    """Prune ``amount`` of the entries of every output unit: those of smallest score.

    The entries sharing one index along `dim` (one output unit: a row of a PyTorch
    ``Linear`` weight ``[out, in]``, a column of an ONNX ``MatMul`` weight ``[K, N]``, an
    output channel of a convolution) form a group, and each group loses the same number
    of its entries, those of smallest ``|score|``. Pass :func:`wanda_scores` as the
    importance scores for Wanda; without them the weight's own magnitude ranks.

    Parameters
    ----------
    amount : int or float
        Per output unit, the fraction in ``[0, 1]`` of its entries to prune, or their
        number. Inside a container (iterative pruning), of its entries still unpruned.
    dim : int, default 0
        The output axis of the weight.

    Notes
    -----
    Ties are broken by position (the lowest index in the group, in C order, goes
    first) and NaN scores rank above +inf, as for every method.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> w = np.array([[0.1, -0.4, 0.3, 0.2], [4.0, 3.0, -2.0, 1.0]])
    >>> ap.Wanda(amount=0.5, dim=0).keep_mask(w)
    array([[False,  True,  True, False],
           [ True,  True, False, False]])
    """

    PRUNING_TYPE = "global"  # a container hands it the whole array and the mask
    SCORE: ClassVar[_parts.Score] = _parts.WANDA
    PATTERN: ClassVar[_parts.Pattern] = _parts.PER_OUTPUT  # `dim` is a weight's output axis
    FLAGS = {"dim": _parts.Flag("--dim", int, "the output axis (default: each weight's own)")}

    def __init__(self, amount: int | float, dim: int = 0):
        super().__init__(amount)
        self.dim = dim

    def keep_mask(self, t: Array) -> Array:
        return self._keep(t, None)

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Mask pruning ``amount`` of each output unit's entries that `default_mask` leaves."""
        mask = mask_or_ones(t, default_mask)
        return apply_keep(mask, self._keep(t, mask))

    def units(self, t: Array, mask: Array | None = None) -> tuple[int, int]:
        """Not defined: the amount applies to each output unit, not to the whole array.

        Raises
        ------
        TypeError
            Always: schedules prune a total number of entries.
        """
        raise TypeError("Wanda prunes an amount of each output unit; it does not follow a whole-array schedule")

    def _keep(self, t: Array, mask: Array | None) -> Array:
        """Boolean keep mask over `t`; entries `mask` prunes are never counted."""
        xp = namespace(t)
        _amount.validate_structured_pruning(t.shape)
        dim = _amount.normalize_dim(t.shape, self.dim)
        groups = t.shape[dim]
        order = (dim, *(d for d in range(t.ndim) if d != dim))
        per_unit = math.prod(t.shape[d] for d in order[1:])  # also without output units
        rows = xp.reshape(xp.permute_dims(t, order), (groups, per_unit))
        if mask is None:
            keep = _keep_per_row(xp, rows, None, [self.count(rows.shape[1])] * groups)
        else:
            eligible = xp.reshape(xp.permute_dims(mask if is_bool(mask) else mask == 1, order), rows.shape)
            remaining = xp.sum(xp.astype(eligible, xp.int64), axis=1)
            # Inside jax.jit the counts are unknown: `count` then takes an int amount as is.
            available = [None] * groups if is_traced(remaining) else [int(n) for n in remaining]
            keep = _keep_per_row(xp, rows, eligible, [self.count(n) for n in available])
        back = [0] * t.ndim
        for i, d in enumerate(order):
            back[d] = i
        shape = tuple(t.shape[d] for d in order)
        return xp.permute_dims(xp.reshape(keep, shape), tuple(back))


def _kth_smallest_per_row(xp: Any, ranked: Array, k: int) -> Array:
    """The `k`-th smallest value (1-based) of every row of the 2-D `ranked`.

    array-api-extra's ``partition`` for torch (0.11.5) makes an index tensor on torch's
    default device, not the input's: on a CUDA tensor, or on CPU tensors under
    ``torch.device("meta")``, it fails. Torch tensors use their own ``kthvalue`` (on the
    input's device); every other library, ``xpx.partition``.
    """
    if apc.is_torch_array(ranked):
        return ranked.kthvalue(k, dim=1).values
    return xpx.partition(ranked, k - 1, axis=1, xp=xp)[:, k - 1]


def _keep_per_row(xp: Any, rows: Array, eligible: Array | None, counts: list[int]) -> Array:
    """Keep mask of a 2-D array dropping ``counts[i]`` eligible entries of row ``i``.

    By ``|score|`` ascending, NaN above +inf, ties by column. The k-th key of each row
    comes from a partition (a sort when rows drop different numbers), then one
    comparison and, for rows where equal keys straddle the cut, a running count of them.
    """
    device = apc.device(rows)
    n_rows, n_cols = rows.shape
    if n_rows == 0 or n_cols == 0 or not any(counts):
        return xp.ones(rows.shape, dtype=xp.bool, device=device)
    dtype = rows.dtype if xp.isdtype(rows.dtype, "real floating") else widest_float(xp, device)
    key = magnitude_keys(xp, rows, dtype)  # |x|; on JAX and accelerators, integer keys of the bits
    if xp.isdtype(key.dtype, "real floating"):
        nan = xp.isnan(key)
        ranked = xp.where(nan, xp.asarray(xp.inf, dtype=dtype, device=device), key)  # NaN sorts as +inf
    else:  # bit keys already rank NaN above +inf
        nan = xp.zeros(rows.shape, dtype=xp.bool, device=device)
        ranked = key
    usable = ~nan if eligible is None else ~nan & eligible
    n_ineligible = None
    if eligible is not None:  # ineligible entries sort as -1, below every eligible key
        ranked = xp.where(eligible, ranked, xp.asarray(-1, dtype=key.dtype, device=device))
        n_ineligible = n_cols - xp.sum(xp.astype(eligible, xp.int64), axis=1)
    k = xp.asarray(counts, dtype=xp.int64, device=device)
    if n_ineligible is None and len(set(counts)) == 1:
        kth = _kth_smallest_per_row(xp, ranked, counts[0])
    else:
        pick = k - 1 if n_ineligible is None else k - 1 + n_ineligible
        pick = xp.clip(pick, 0, n_cols - 1) + xp.arange(n_rows, dtype=xp.int64, device=device) * n_cols
        kth = xp.take(xp.reshape(xp.sort(ranked, axis=1), (-1,)), pick)
    kth = kth[:, None]
    # A row whose cut lies among its NaN keys drops every other usable key, then NaNs.
    in_nan = (xp.sum(xp.astype(usable, xp.int64), axis=1) < k)[:, None]
    live = xp.ones(rows.shape, dtype=xp.bool, device=device) if eligible is None else eligible
    below = xp.where(in_nan, usable, usable & (key < kth))
    equal = xp.where(in_nan, nan & live, usable & (key == kth))
    need = (k - xp.sum(xp.astype(below, xp.int64), axis=1))[:, None]
    first = xp.cumulative_sum(xp.astype(equal, xp.int64), axis=1) <= need
    return ~((below | (equal & first)) & (k > 0)[:, None])


def wanda_scores(
    weight: Array, input_norms: Array, reduction_axis: int, *, groups: int = 1, output_axis: int = 0
) -> Array:
    """Wanda's importance scores: ``|weight|`` times the norm of each entry's input feature.

    Parameters
    ----------
    weight : array
        A layer weight, such as ``[out, in]`` (PyTorch ``Linear``), ``[K, N]`` (ONNX
        ``MatMul``) or ``[out, in/groups, kH, kW]`` (convolution). Booleans count as 0
        and 1 (as every magnitude method ranks them).
    input_norms : array
        One value per input feature of the layer: the L2 norm of that feature over the
        calibration data (``sqrt`` of its sum of squares), 1-D, of length
        ``groups * weight.shape[reduction_axis]``.
    reduction_axis : int
        The axis of `weight` that runs over input features (1 for ``[out, in]`` and for
        convolutions, 0 for ``[K, N]``).
    groups : int, default 1
        For a grouped convolution: the input features fall into `groups` consecutive
        groups, and output unit ``o`` (along `output_axis`) reads group
        ``o // (outputs / groups)`` only, so its entry ``j`` takes the norm of feature
        ``group * weight.shape[reduction_axis] + j``.
    output_axis : int, default 0
        The output axis of `weight`; only read when ``groups > 1``.

    Returns
    -------
    array
        Scores shaped like `weight`, in its floating dtype (or the promotion with the
        norms' dtype).

    Raises
    ------
    TypeError
        If `input_norms` is not an array (or sequence) of real numbers, or `groups` is
        not an int.
    ValueError
        If `input_norms` is not 1-D of the right length or holds negative or NaN
        values, or `groups` is not positive or does not divide the outputs.
    IndexError
        If an axis is out of range.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> ap.wanda_scores(np.array([[1.0, -2.0], [3.0, 0.5]]), np.array([10.0, 1.0]), 1)
    array([[10. ,  2. ],
           [30. ,  0.5]])
    """
    xp = namespace(weight)
    device = apc.device(weight)
    axis = _amount.normalize_dim(weight.shape, reduction_axis)
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"groups must be an int, got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups}")
    norms = _checked_norms(xp, input_norms, device)
    per_group = weight.shape[axis]
    if norms.ndim != 1 or norms.shape[0] != groups * per_group:
        raise ValueError(
            f"input_norms should hold one norm per input feature: got shape {tuple(norms.shape)}, "
            f"expected ({groups * per_group},) for axis {axis} of a weight of shape {tuple(weight.shape)}"
            + (f" in {groups} groups" if groups > 1 else "")
        )
    if xp.isdtype(weight.dtype, "bool"):  # ranked as 0 and 1, as by every magnitude method
        weight = xp.astype(weight, widest_float(xp, device))
    magnitude = xp.abs(weight)
    if not xp.isdtype(magnitude.dtype, "real floating"):
        magnitude = xp.astype(magnitude, widest_float(xp, device))
    dtype = magnitude.dtype
    if xp.isdtype(norms.dtype, "real floating"):
        dtype = xp.result_type(dtype, norms.dtype)
    norms = xp.astype(norms, dtype)
    shape = [1] * weight.ndim
    shape[axis] = per_group
    if groups == 1:
        return xp.astype(magnitude, dtype) * xp.reshape(norms, tuple(shape))
    out_axis = _amount.normalize_dim(weight.shape, output_axis)
    outputs = weight.shape[out_axis]
    if out_axis == axis or outputs % groups:
        raise ValueError(f"{groups} groups do not divide the {outputs} outputs along axis {out_axis}")
    group_of = xp.arange(outputs, dtype=xp.int64, device=device) // (outputs // groups)
    per_output = xp.take(xp.reshape(norms, (groups, per_group)), group_of, axis=0)  # [out, per_group]
    if out_axis > axis:
        per_output = xp.permute_dims(per_output, (1, 0))
    shape[out_axis] = outputs
    return xp.astype(magnitude, dtype) * xp.reshape(per_output, tuple(shape))


def _checked_norms(xp: Any, input_norms: Any, device: Any) -> Array:
    """`input_norms` as an array of `xp` on `device`, refused unless real and ``>= 0``."""
    if input_norms is None or isinstance(input_norms, (str, bytes)):
        raise TypeError(f"input_norms must be an array of norms, got {type(input_norms).__name__}")
    norms = input_norms
    try:
        if not apc.is_array_api_obj(norms) or namespace(norms) is not xp:
            norms = xp.asarray(norms, device=device)
        real = xp.isdtype(norms.dtype, ("real floating", "integral"))
    except (TypeError, ValueError) as error:
        check_known_shape(norms)  # a Dask array of unknown chunk sizes says so
        raise TypeError(f"input_norms must be an array of norms, got {type(input_norms).__name__}") from error
    if not real:
        raise TypeError(f"input_norms must hold real numbers, got dtype {norms.dtype}")
    if not is_traced(norms):
        bad = int(xp.count_nonzero(~(norms >= 0)))  # negative or NaN
        if bad:
            raise ValueError(
                f"input_norms must be L2 norms, non-negative and not NaN: {bad} of {math.prod(norms.shape)} are not"
            )
    return norms
