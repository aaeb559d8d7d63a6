"""Calibrated scores of structured units and the compensation of the layer that reads them.

A structured unit (an MLP channel, an attention head, a KV group with its query heads)
is a set of input columns of one *consumer* layer: ``down_proj`` (``c_proj``, BERT's
``output.dense``) reads the MLP's channels, ``o_proj`` the heads. Removing the unit
removes those columns. From calibration data, the consumer's inputs ``X`` (rows are
tokens) give the statistics every function here takes:

* ``sq_norms``: ``sum_t X[t, j]^2`` per input column (the diagonal of ``H``);
* ``hessian``: ``H = X^T X``, ``K x K``.

Scores (lowest goes first):

* :func:`activation_unit_scores`: ``||W[:, j]||_2 * ||X_j||_2`` per column (Wanda's
  ``|W| ||X||`` over a whole column), a unit scored by the root of the sum of its
  columns' squares;
* :func:`obs_unit_scores`: the increase of the consumer's squared output error when the
  unit's columns ``S`` are removed and the others refit (Optimal Brain Surgeon):
  ``tr(W_S [Hd^-1]_SS^-1 W_S^T)``, which is ``||W[:, j]||^2 / [Hd^-1]_jj`` for a single
  column; ``Hd = H + damp * mean(diag H) * I``.

:func:`compensate` is the refit: the kept columns ``K`` become
``W'_K = W Hd[:, K] Hd[K, K]^-1``, the least-squares solution of ``X_K W'_K^T ~ X W^T``
(exactly that with ``damp=0``). :func:`expert_scores` ranks the experts of a
mixture-of-experts layer by router statistics, and :func:`residual_change` the layers of
a residual stream. :func:`absorb` is the refit of a removed layer: the last projection of
the layer before it (``down_proj``) also learns to add what the removed layer added to
the residual stream, ``W' = W + (Hd^-1 X^T F)^T``.

Array API only: any namespace with ``linalg`` (NumPy, PyTorch, CuPy, JAX, array-api-strict).
Units are contiguous runs of ``K / units`` columns (a KV group's query heads are adjacent
in ``o_proj``).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as apc
import array_api_extra as xpx

from ._factor import upper_inverse_factor
from ._namespace import namespace, widest_float

__all__ = [
    "DEFAULT_DAMP",
    "absorb",
    "activation_unit_scores",
    "compensate",
    "damped",
    "expert_scores",
    "obs_unit_scores",
    "residual_change",
]

Array = Any

#: The default damping of ``H``: ``0.01 * mean(diag H)`` added to its diagonal.
DEFAULT_DAMP = 0.01


def _per_unit(k: int, units: int) -> int:
    if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
        raise ValueError(f"units must be a positive integer, got {units!r}")
    if k % units:
        raise ValueError(f"{k} input columns do not split into {units} units of equal size")
    return k // units


def _check_weight(weight: Array, k: int | None = None) -> None:
    if weight.ndim != 2:
        raise ValueError(f"the consumer's weight must be 2-D [out, in], got shape {tuple(weight.shape)}")
    if k is not None and weight.shape[1] != k:
        raise ValueError(f"the weight has {weight.shape[1]} input columns, the statistics {k}")


def activation_unit_scores(weight: Array, sq_norms: Array, units: int) -> Array:
    """Activation-aware scores of the units of a consumer's input columns.

    Parameters
    ----------
    weight : array
        The consumer's weight ``[out, in]``.
    sq_norms : array
        ``[in]``: the sum over calibration tokens of each input's square (the
        diagonal of ``X^T X``).
    units : int
        How many units the ``in`` columns hold (contiguous, of equal size).

    Returns
    -------
    array
        ``[units]``: ``sqrt(sum_{j in unit} ||W[:, j]||^2 ||X_j||^2)``, in the weight's
        floating dtype.

    Raises
    ------
    ValueError
        For shapes that do not agree.
    """
    xp = namespace(weight, sq_norms)
    _check_weight(weight, sq_norms.shape[0] if sq_norms.ndim == 1 else None)
    if sq_norms.ndim != 1:
        raise ValueError(f"sq_norms must be 1-D [in], got shape {tuple(sq_norms.shape)}")
    per = _per_unit(weight.shape[1], units)
    col = xp.sum(weight * weight, axis=0) * xp.astype(sq_norms, weight.dtype)
    return xp.sqrt(xp.sum(xp.reshape(col, (units, per)), axis=1))


def damped(hessian: Array, damp: float = DEFAULT_DAMP, *, copy: bool = True) -> Array:
    """``H + damp * mean(diag H) * I`` (a zero diagonal gets ``damp`` itself, so that it inverts).

    With ``copy=False`` the diagonal of `hessian` itself is raised where its library
    writes in place (NumPy, PyTorch, CuPy; a new array elsewhere): no second ``K x K``.
    """
    xp = namespace(hessian)
    if hessian.ndim != 2 or hessian.shape[0] != hessian.shape[1]:
        raise ValueError(f"the Hessian must be square, got shape {tuple(hessian.shape)}")
    if not damp >= 0:
        raise ValueError(f"damp must be >= 0, got {damp!r}")
    if not xp.isdtype(hessian.dtype, "real floating"):  # counts: the damping makes them floats
        hessian = xp.astype(hessian, widest_float(xp, apc.device(hessian)))
    k = hessian.shape[0]
    diag = xp.linalg.diagonal(hessian)
    mean = xp.mean(diag)
    level = xp.where(mean > 0, mean, xp.ones_like(mean)) * damp
    # The diagonal is every (k+1)-th entry of the flat matrix: no k x k identity is made.
    flat = xp.reshape(xp.asarray(hessian, copy=True) if copy else hessian, (k * k,))
    flat = xpx.at(flat, slice(None, None, k + 1)).add(level)
    return xp.reshape(flat, (k, k))


def obs_unit_scores(weight: Array, hessian: Array, units: int, damp: float = DEFAULT_DAMP) -> Array:
    """Optimal Brain Surgeon scores of the units of a consumer's input columns.

    Parameters
    ----------
    weight : array
        The consumer's weight ``[out, in]``.
    hessian : array
        ``[in, in]``: ``X^T X`` of the consumer's calibration inputs.
    units : int
        How many units the ``in`` columns hold (contiguous, of equal size); a unit of
        several columns (a head) is scored as a whole.
    damp : float, default 0.01
        See :func:`damped`.

    Returns
    -------
    array
        ``[units]``: ``tr(W_S ([Hd^-1]_SS)^-1 W_S^T)`` for each unit's columns ``S``
        (``||W[:, j]||^2 / [Hd^-1]_jj`` for one column), in the Hessian's dtype.
    """
    xp = namespace(weight, hessian)
    _check_weight(weight, hessian.shape[0])
    per = _per_unit(weight.shape[1], units)
    w = xp.astype(weight, hessian.dtype)
    # Hd^-1 = U^T U with U upper: its diagonal block on S is U[:S_end, S]^T U[:S_end, S],
    # and Hd^-1 itself is never formed.
    factor = upper_inverse_factor(xp, damped(hessian, damp))
    if per == 1:
        return xp.sum(w * w, axis=0) / xp.sum(factor * factor, axis=0)
    scores = []
    for unit in range(units):
        end = (unit + 1) * per
        columns = factor[:end, unit * per : end]
        ws = w[:, unit * per : end]
        block = xp.permute_dims(columns, (1, 0)) @ columns  # [Hd^-1]_SS
        solved = xp.linalg.solve(block, xp.permute_dims(ws, (1, 0)))  # B^-1 W_S^T
        scores.append(xp.sum(xp.permute_dims(ws, (1, 0)) * solved))
    return xp.stack(scores)


def compensate(weight: Array, hessian: Array, kept: Array, damp: float = DEFAULT_DAMP) -> Array:
    """The consumer's kept columns refit to its outputs on the calibration inputs.

    Parameters
    ----------
    weight : array
        The consumer's weight ``[out, in]``.
    hessian : array
        ``[in, in]``: ``X^T X`` of its calibration inputs.
    kept : array
        The kept input columns (integers, ascending).
    damp : float, default 0.01
        See :func:`damped`.

    Returns
    -------
    array
        ``[out, len(kept)]``: ``W Hd[:, K] Hd[K, K]^-1``, in the Hessian's dtype.
    """
    xp = namespace(weight, hessian, kept)
    _check_weight(weight, hessian.shape[0])
    hd = damped(hessian, damp)
    cross = xp.take(hd, kept, axis=0)  # Hd[K, :]
    block = xp.take(cross, kept, axis=1)  # Hd[K, K]
    rhs = cross @ xp.permute_dims(xp.astype(weight, hessian.dtype), (1, 0))  # Hd[K, :] W^T
    return xp.permute_dims(xp.linalg.solve(block, rhs), (1, 0))


def absorb(
    weight: Array, hessian: Array, cross: Array, damp: float = DEFAULT_DAMP, *, overwrite_hessian: bool = False
) -> Array:
    """A layer's weight refit to also add what removed layers added to its output's stream.

    The layer ``y = X W^T`` writes into a residual stream (``down_proj``), and the layers
    removed after it added ``F`` to that stream on the calibration data. The refit weight
    ``W'`` minimises ``||X W'^T - (X W^T + F)||^2`` (plus the damping):
    ``W' = W + (Hd^-1 X^T F)^T``.

    Parameters
    ----------
    weight : array
        The layer's weight ``[out, in]``.
    hessian : array
        ``[in, in]``: ``X^T X`` of its calibration inputs.
    cross : array
        ``[in, out]``: ``X^T F``, with ``F`` (``[tokens, out]``) the change of the stream
        over the removed layers on the same tokens.
    damp : float, default 0.01
        See :func:`damped`.
    overwrite_hessian : bool, default False
        Damp `hessian` in place (where its library writes in place), sparing a
        ``K x K`` copy: for a caller done with it.

    Returns
    -------
    array
        ``[out, in]``, in the Hessian's dtype.

    Raises
    ------
    ValueError
        For shapes that do not match.
    """
    xp = namespace(weight, hessian, cross)
    _check_weight(weight, hessian.shape[0])
    if tuple(cross.shape) != (weight.shape[1], weight.shape[0]):
        raise ValueError(f"cross must be [in, out] = {[weight.shape[1], weight.shape[0]]}, got {list(cross.shape)}")
    delta = xp.linalg.solve(damped(hessian, damp, copy=not overwrite_hessian), xp.astype(cross, hessian.dtype))
    return xp.astype(weight, hessian.dtype) + xp.permute_dims(delta, (1, 0))


def expert_scores(counts: Array, weight_sums: Array, tokens: int) -> Array:
    """How much each expert of a layer is used: the routing weight it gets per token.

    Parameters
    ----------
    counts : array
        ``[experts]``: tokens that chose each expert (among their top k).
    weight_sums : array
        ``[experts]``: the sum of the routing weights (router probabilities) each
        expert got from the tokens that chose it.
    tokens : int
        Calibration tokens routed.

    Returns
    -------
    array
        ``[experts]``: ``frequency * mean weight = weight_sums / tokens`` (an expert never
        chosen scores 0; ties, then, by frequency: ``+ counts / tokens * 1e-9``).
    """
    xp = namespace(counts, weight_sums)
    if tokens <= 0:
        raise ValueError(f"expert scores need routed tokens, got {tokens}")
    dtype = weight_sums.dtype if xp.isdtype(weight_sums.dtype, "real floating") else xp.float64
    return xp.astype(weight_sums, dtype) / tokens + xp.astype(counts, dtype) / tokens * 1e-9


def residual_change(before: Array, after: Array, mask: Array | None = None) -> tuple[Array, Array]:
    """The sum over tokens of ``1 - cosine(before, after)`` of a residual stream, and the token count.

    Parameters
    ----------
    before, after : array
        ``[..., hidden]``: a layer's input and output hidden states.
    mask : array, optional
        ``[...]``: tokens counted (1) or not (0, padding).

    Returns
    -------
    (array, array)
        Scalars: the sum over the counted tokens, their number. Divide for the mean.
    """
    xp = namespace(before, after)
    a, b = before, after
    dot = xp.sum(a * b, axis=-1)
    norms = xp.sqrt(xp.sum(a * a, axis=-1) * xp.sum(b * b, axis=-1))
    tiny = xp.finfo(norms.dtype).smallest_normal
    change = 1 - dot / xp.where(norms > 0, norms, xp.full_like(norms, tiny))
    if mask is None:
        count = apc.size(change)
        return xp.sum(change), xp.asarray(0 if count is None else count, dtype=change.dtype, device=apc.device(change))
    m = xp.astype(mask, change.dtype)
    return xp.sum(change * m), xp.sum(m)
