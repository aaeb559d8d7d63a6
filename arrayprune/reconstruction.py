"""Weight reconstruction: SparseGPT prunes a layer and updates the weights it keeps.

SparseGPT (Frantar & Alistarh, "SparseGPT: Massive Language Models Can Be Accurately
Pruned in One-Shot", ICML 2023) prunes a layer ``y = W x`` given the Hessian of its
layer-wise squared error, ``H = X^T X / n`` over ``n`` calibration inputs, and spreads the
error of every pruned entry over the input columns not yet processed (optimal brain
surgeon updates with the Cholesky factor of ``H^-1``), so that ``X W'^T`` stays close to
``X W^T``. Here:

* :func:`sparsegpt` does the pruning and the update of one weight;
* :class:`HessianAccumulator` keeps the running ``X^T X`` of calibration batches (the
  activations are never stored whole);
* :func:`unfold_patches` turns convolution inputs into the rows ``X`` of the layer's
  matrix product (im2col), one matrix per group;
* :class:`SparseGPT` is the method of the table (``--method sparsegpt``), and
  :class:`ReconstructionMethod` the base of any method that carries such a solver.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

import array_api_compat as apc
import array_api_extra as xpx

from . import amount as _amount
from . import method_parts as _parts
from ._factor import upper_inverse_factor
from ._namespace import namespace, widest_float
from .methods import UnstructuredPruningMethod
from .patterns import NMStructured, _check_nm
from .selection import smallest_magnitude_keep

__all__ = [
    "HessianAccumulator",
    "ReconstructionMethod",
    "SparseGPT",
    "check_sparsegpt_options",
    "sparsegpt",
    "unfold_patches",
]

Array = Any

# Columns of a block solved one at a time between two products (see `sparsegpt`): fewer
# means less elementwise work per column, more means fewer products.
_COLUMN_STEP = 16


def sparsegpt(
    weight: Array,
    hessian: Array,
    amount: int | float | None = None,
    *,
    n: int | None = None,
    m: int | None = None,
    block_size: int = 128,
    damp: float = 0.01,
    reduction_axis: int = -1,
) -> tuple[Array, Array]:
    """Prune a layer weight with SparseGPT and update the entries it keeps.

    Give either `amount` (unstructured: exactly that many entries of the whole weight
    are pruned) or `n` and `m` (N:M: `n` of every `m` consecutive entries along the
    reduction axis).

    Parameters
    ----------
    weight : array
        A floating layer weight. 2-D: outputs along one axis, inputs along
        `reduction_axis` (``[out, in]`` for a PyTorch ``Linear``: 1; ``[K, N]`` for an ONNX
        ``MatMul``: 0). More than 2-D: a convolution ``[out, in/groups, kh, kw]`` with the
        output axis first; all other axes form the reduction, flattened in C order
        (``in/groups``, then ``kh``, then ``kw``: the order of :func:`unfold_patches`).
    hessian : array
        ``K x K`` with ``K`` the length of the reduction, e.g. from
        :meth:`HessianAccumulator.hessian`. Only its ratios matter: the result is
        invariant to scaling `hessian` by a positive factor (`damp` is relative).
    amount : int or float, optional
        Fraction in ``[0, 1]`` of the entries to prune, or their number, as everywhere in
        arrayprune: ``round(amount * weight.size)`` entries are pruned, exactly.
    n, m : int, optional
        The N:M pattern (2 and 4 for 2:4), instead of `amount`.
    block_size : int, default 128
        Number of input columns processed together (the mask of a block is chosen at
        once). For N:M it must be a multiple of `m`.
    damp : float, default 0.01
        ``damp * mean(diag(hessian))`` is added to the diagonal before inversion.
    reduction_axis : int, default -1
        The input axis of a 2-D weight; for more dimensions any axis but 0 (the output
        axis, which must come first).

    Returns
    -------
    updated_weight : array
        Shaped like `weight`, in its dtype, namespace and device: the pruned entries are
        zero and the kept ones updated.
    mask : array
        Boolean keep mask shaped like `weight` (False where pruned).

    Raises
    ------
    TypeError
        If `weight` is not floating, `hessian` not real, or an integer parameter is not
        an integer.
    ValueError
        For a bad amount or pattern (both or neither given), a weight of fewer than two
        dimensions or with non-finite entries, a Hessian that is not ``K x K``, not
        finite, all zero, has a negative diagonal or is not positive definite after
        damping (to working precision: a Cholesky pivot of at most ``4 * eps`` times its
        diagonal entry is within rounding).
    IndexError
        If `reduction_axis` is out of range.

    Notes
    -----
    The algorithm, in float64 where the library has it on the weight's device (float32
    otherwise): the rows of ``W`` are the outputs, its ``K`` columns the inputs. Inputs
    with ``H_jj == 0`` (dead: they never fire) get ``H_jj = 1`` (see below for their
    entries); ``d = damp * mean(diag(H))`` (the mean of the Hessian as given, so that
    scaling ``H`` scales ``d``) is added to the diagonal; ``U`` is the upper Cholesky
    factor of ``H^-1`` (``U^T U = H^-1``), computed without forming ``H^-1``: ``H = R R^T``
    with ``R`` upper (a Cholesky factorization) and ``U = R^-1``. Columns are processed in blocks of
    `block_size`; the entries of a block with the smallest scores
    ``W_ij^2 / U_jj^2`` (taken when the block starts) are pruned, then for each column
    ``j`` of the block ``err = (W_:j - Q_:j) / U_jj`` (``Q`` is ``W`` with the pruned
    entries zeroed) updates the block, ``W_:k -= err * U_jk``, and after the block the
    errors update the later columns, ``W[:, later] -= Err @ U[block, later]`` (inside a
    block the same is done in steps of 16 columns: the order of the additions differs from
    one column at a time by rounding only).

    Counts are exact: ``T = round(amount * weight.size)`` for a float amount. The paper
    prunes the same fraction of every block; here block ``b`` covering columns
    ``[s, e)`` prunes ``c(e) - c(s)`` entries with ``c(x) = floor(T * x / K + 1/2)``, so
    the blocks sum to ``T`` exactly and each gets its share to within one entry. In a
    block, the entries of smallest score over all rows go first, ties by lowest index in
    the ``[outputs, inputs]`` layout (row-major). For N:M, each group of `m` columns
    (counted from column 0; a shorter last group keeps at most ``m - n``) drops, in every
    row, the `n` smallest scores taken when the group is reached, ties by column.

    Inputs whose Hessian diagonal is 0 (dead: always 0 on the calibration data) cost
    nothing to prune and spread no error: their entries are pruned first (by position,
    column block by column block), and count toward ``T``; the rest of ``T`` is shared
    over the blocks' live columns as above. No more than ``T`` entries are pruned: with
    more dead entries than ``T``, the dead entries not pruned keep their values. A
    Hessian that is all zero (no input ever fired) is refused.

    For a grouped convolution, call :func:`sparsegpt` once per group: the output slice
    ``weight[g * out/groups:(g + 1) * out/groups]`` with the Hessian of group ``g``.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> w = np.array([[1.0, 0.2, -0.5], [0.3, -2.0, 1.0]])
    >>> h = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]])
    >>> new, keep = ap.sparsegpt(w, h, 0.5, damp=0.0)
    >>> keep
    array([[False, False,  True],
           [False,  True,  True]])
    >>> new  # the pruned 0.3 of input 0 moved onto the correlated input 1: -2 + 0.9 * 0.3
    array([[ 0.  ,  0.  , -0.5 ],
           [ 0.  , -1.73,  1.  ]])
    """
    xp = namespace(weight)
    device = apc.device(weight)
    if not xp.isdtype(weight.dtype, "real floating"):
        raise TypeError(f"sparsegpt needs a floating weight, got dtype {weight.dtype}")
    if weight.ndim < 2:
        raise ValueError(f"sparsegpt needs a weight of at least 2 dimensions, got shape {tuple(weight.shape)}")
    axis = _amount.normalize_dim(weight.shape, reduction_axis)
    if weight.ndim > 2 and axis == 0:
        raise ValueError(
            f"a weight of {weight.ndim} dimensions has its output axis first; reduction_axis=0 is not allowed"
        )
    pattern, block_size = check_sparsegpt_options(amount, n, m, block_size, damp)
    if weight.ndim == 2:
        w = weight if axis == 1 else xp.permute_dims(weight, (1, 0))
    else:
        w = xp.reshape(weight, (weight.shape[0], math.prod(weight.shape[1:])))
    rows, k = w.shape
    total = 0
    if pattern is None:
        _amount.validate_pruning_amount_init(amount)
        _amount.validate_pruning_amount(amount, rows * k)
        total = _amount.compute_nparams_toprune(amount, rows * k)
    h = _checked_hessian(xp, hessian, k, device)
    if not bool(xp.all(xp.isfinite(weight))):
        raise ValueError("sparsegpt needs a finite weight: it has NaN or infinite entries")
    if rows * k == 0:
        return xp.asarray(weight, copy=True), xp.ones(weight.shape, dtype=xp.bool, device=device)

    wide = widest_float(xp, device)
    zero = xp.asarray(0, dtype=wide, device=device)
    w = xp.astype(w, wide)
    h = xp.astype(h, wide)
    diag = xp.linalg.diagonal(h)
    dead = diag == 0
    if bool(xp.all(dead)):
        raise ValueError(
            "the Hessian is all zero: every input of the layer was 0 on the calibration data, "
            "so it says nothing about which weights matter"
        )
    h = h + xp.eye(k, dtype=wide, device=device) * (xp.astype(dead, wide) + float(damp) * xp.mean(diag))
    u = upper_inverse_factor(xp, h)
    u_diag = xp.linalg.diagonal(u)
    nm = None if pattern is None else NMStructured(*pattern, dim=-1)

    in_place = _views_update_in_place(w)
    step = _COLUMN_STEP if nm is None else nm.m * max(1, _COLUMN_STEP // nm.m)
    dead_k = int(xp.sum(xp.astype(dead, xp.int32)))
    dead_left = min(total, rows * dead_k)  # dead entries pruned (first, by position)
    live_total, live_k = total - dead_left, k - dead_k
    live_before = 0
    done, keeps, rest = [], [], w
    for start in range(0, k, block_size):
        stop = min(start + block_size, k)
        block, rest = rest[:, : stop - start], rest[:, stop - start :]
        if in_place:  # a block of its own, row-major (as the library makes new arrays), updated in place below
            own = xp.empty(block.shape, dtype=block.dtype, device=device)
            own[...] = block
            block = own
        u_block = u[start:stop, start:stop]
        d = u_diag[start:stop]
        if nm is None:
            live_block = (stop - start) - (int(xp.sum(xp.astype(dead[start:stop], xp.int32))) if dead_k else 0)
            count = _block_share(live_total, live_k, live_before + live_block) - _block_share(
                live_total, live_k, live_before
            )
            live_before += live_block
            dead_here = min(dead_left, rows * (stop - start - live_block))
            keep = _block_keep(xp, block**2 / d**2, dead[start:stop], count, dead_here)
            dead_left -= dead_here
        # Columns go in steps: each column updates the rest of its step (one column at a
        # time), and a finished step updates the rest of the block with one product.
        errs, keep_columns, finished, pending = [], [], [], block
        for a in range(0, stop - start, step):
            b = min(a + step, stop - start)
            part, pending = pending[:, : b - a], pending[:, b - a :]
            part_errs = []
            for j in range(a, b):
                if nm is not None:
                    if j % nm.m == 0:  # dead inputs score 0: pruned first; a step holds whole groups
                        scores = part[:, j - a : j - a + nm.m] ** 2 / d[j : j + nm.m] ** 2
                        group = nm.compute_mask(xp.where(dead[None, start + j : start + j + nm.m], zero, scores), None)
                    keep_j = group[:, j % nm.m]
                    keep_columns.append(keep_j)
                else:
                    keep_j = keep[:, j]
                err = xp.where(keep_j, zero, part[:, j - a]) / u_block[j, j]
                if in_place:  # U is upper: only columns j and later change
                    tail = part[:, j - a :]
                    tail -= err[:, None] * u_block[j : j + 1, j:b]
                else:
                    part = part - err[:, None] * u_block[j : j + 1, a:b]
                part_errs.append(err)
            if in_place:
                part = _signed_zeros_as_full_update(xp, part, part_errs, zero)
            finished.append(part)
            errs.extend(part_errs)
            if b < stop - start:
                pending = pending - xp.stack(part_errs, axis=1) @ u_block[a:b, b:]
        block = xp.concat(finished, axis=1)
        if nm is not None:
            keep = xp.stack(keep_columns, axis=1)
        done.append(xp.where(keep, block, zero))
        keeps.append(keep)
        if stop < k:
            rest = rest - xp.stack(errs, axis=1) @ u[start:stop, stop:]

    new = xp.astype(xp.concat(done, axis=1), weight.dtype)
    keep = xp.concat(keeps, axis=1)
    if weight.ndim > 2:
        return xp.reshape(new, weight.shape), xp.reshape(keep, weight.shape)
    if axis == 0:
        return xp.permute_dims(new, (1, 0)), xp.permute_dims(keep, (1, 0))
    return new, keep


def _views_update_in_place(x: Array) -> bool:
    """Whether `x`'s library updates a slice in place through ``view -= ...`` (NumPy, CuPy, PyTorch)."""
    return bool(apc.is_numpy_array(x) or apc.is_cupy_array(x) or apc.is_torch_array(x))


def _signed_zeros_as_full_update(xp: Any, block: Array, errs: list[Array], zero: Array) -> Array:
    """The block as the full-width update leaves it, after the in-place one updated columns ``j:`` only.

    Subtracting ``err_j * U[j, c]`` from a finished column ``c < j``, where ``U[j, c]``
    is ``+0``, changes nothing but the sign of a zero: ``-0 - (-0)`` is ``+0``. So an
    entry left at ``-0`` becomes ``+0`` where a later column of the block had an error
    with its sign bit set, as the full-width update would have made it.
    """
    negative_zero = (block == zero) & xp.signbit(block)
    if not bool(xp.any(negative_zero)):
        return block
    signs = xp.astype(xp.signbit(xp.stack(errs, axis=1)), xp.int32)
    from_here = xp.flip(xp.cumulative_sum(xp.flip(signs, axis=1), axis=1), axis=1)  # over columns j >= c
    return xp.where(negative_zero & (from_here - signs > 0), zero, block)


def check_sparsegpt_options(
    amount: Any, n: Any, m: Any, block_size: Any, damp: Any, size: int | None = None
) -> tuple[tuple[int, int] | None, int]:
    """Check the options of :func:`sparsegpt` without a weight: the N:M pattern and block size.

    Callers that compute Hessians first (from calibration data) check here, so that a bad
    option is an error before anything is computed; :func:`sparsegpt` checks the same way.

    Parameters
    ----------
    amount, n, m, block_size, damp
        As for :func:`sparsegpt`.
    size : int, optional
        The number of entries of the weight, to check `amount` against (a count may not
        exceed it).

    Returns
    -------
    pattern : tuple of two ints, or None
        ``(n, m)``, or None for an amount.
    block_size : int

    Raises
    ------
    TypeError, ValueError
        As :func:`sparsegpt` raises them for these options.
    """
    pattern = _check_pattern(amount, n, m)
    block_size = _positive_int("block_size", block_size)
    if pattern is not None and block_size % pattern[1]:
        raise ValueError(f"block_size={block_size} must be a multiple of m={pattern[1]} for {pattern[0]}:{pattern[1]}")
    if isinstance(damp, bool) or not isinstance(damp, numbers.Real) or not 0 <= float(damp) < math.inf:
        raise ValueError(f"damp must be a finite non-negative number, got {damp!r}")
    if pattern is None:
        _amount.validate_pruning_amount_init(amount)
        if size is not None:
            _amount.validate_pruning_amount(amount, size)
    return pattern, block_size


def _block_share(total: int, k: int, column: int) -> int:
    """``floor(total * column / k + 1/2)``: entries pruned in columns ``[0, column)``."""
    return (2 * total * column + k) // (2 * k) if k else 0


def _block_keep(xp: Any, scores: Array, dead: Array, live_count: int, dead_count: int) -> Array:
    """The keep mask of a block: `dead_count` (at most all) entries of its dead columns,
    first in row-major order, and the `live_count` smallest `scores` of its live columns."""
    if not bool(xp.any(dead)):
        return smallest_magnitude_keep([scores], live_count)[0]
    inf = xp.asarray(math.inf, dtype=scores.dtype, device=apc.device(scores))
    live_keep = smallest_magnitude_keep([xp.where(dead[None, :], inf, scores)], live_count)[0]
    dead_entries = xp.astype(xp.broadcast_to(dead[None, :], scores.shape), scores.dtype)
    ones = xp.ones(scores.shape, dtype=scores.dtype, device=apc.device(scores))
    dead_keep = smallest_magnitude_keep([ones - dead_entries], dead_count)[0]
    return live_keep & dead_keep


def _check_pattern(amount: Any, n: Any, m: Any) -> tuple[int, int] | None:
    """``(n, m)`` for an N:M pattern, None for an amount; errors if both or neither."""
    if n is None and m is None:
        if amount is None:
            raise ValueError("sparsegpt needs an amount, or n and m for an N:M pattern")
        return None
    if amount is not None:
        raise ValueError(f"give either amount or n and m, not both: got amount={amount!r}, n={n!r}, m={m!r}")
    if n is None or m is None:
        raise ValueError(f"an N:M pattern needs both n and m, got n={n!r}, m={m!r}")
    return _check_nm(n, m)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def _checked_hessian(xp: Any, hessian: Array, k: int, device: Any) -> Array:
    """`hessian` in the weight's namespace, checked: real, ``k x k``, finite, diagonal >= 0."""
    h = hessian if namespace(hessian) is xp else xp.asarray(hessian, device=device)
    if not xp.isdtype(h.dtype, ("real floating", "integral")):
        raise TypeError(f"the Hessian must be real, got dtype {h.dtype}")
    if tuple(h.shape) != (k, k):
        raise ValueError(
            f"the Hessian must be {k} x {k} (the length of the weight's reduction), got shape {tuple(h.shape)}"
        )
    if not xp.isdtype(h.dtype, "real floating"):
        h = xp.astype(h, widest_float(xp, device))
    if not bool(xp.all(xp.isfinite(h))):
        raise ValueError("the Hessian has NaN or infinite entries")
    if k and bool(xp.any(xp.linalg.diagonal(h) < 0)):
        raise ValueError("the Hessian has a negative diagonal entry: it is not X^T X of any inputs")
    return h


class HessianAccumulator:
    """Running ``X^T X`` of a layer's inputs over calibration batches.

    Parameters
    ----------
    k : int
        Number of input features (the length of the weight's reduction).

    Attributes
    ----------
    rows : int
        Number of input rows seen so far.

    Notes
    -----
    Sums are kept in float64 where the library has it on the batches' device (float32
    otherwise), in the namespace and on the device of the first batch. The scale of the
    Hessian does not matter to :func:`sparsegpt` (its damping is relative), so
    ``X^T X / n`` and the paper's ``2 X^T X / n`` give the same result.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> acc = ap.HessianAccumulator(2)
    >>> acc.update(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> acc.update(np.array([[[0.0, 2.0]]]))  # any leading shape [..., k]
    >>> acc.rows, acc.hessian()
    (3, array([[3.33333333, 4.66666667],
           [4.66666667, 8.        ]]))
    """

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        self.k: int = int(k)
        self.rows: int = 0
        self._sum: Array | None = None

    def update(self, x: Array) -> None:
        """Add a batch of inputs, shaped ``[..., k]``.

        Parameters
        ----------
        x : array
            Real inputs; every index but the last is a row.

        Raises
        ------
        TypeError
            If `x` is not real.
        ValueError
            If its last axis is not of length `k`.
        """
        xp = namespace(x)
        if not xp.isdtype(x.dtype, ("real floating", "integral")):
            raise TypeError(f"inputs must be real, got dtype {x.dtype}")
        if x.ndim < 1 or x.shape[-1] != self.k:
            raise ValueError(f"inputs must be shaped [..., {self.k}], got {tuple(x.shape)}")
        rows = math.prod(x.shape[:-1])
        x2 = xp.astype(xp.reshape(x, (rows, self.k)), widest_float(xp, apc.device(x)))
        self._add(xp.permute_dims(x2, (1, 0)) @ x2, rows, owned=True)

    def add_gram(self, gram: Array, rows: int) -> None:
        """Add ``X^T X`` of a batch of `rows` inputs, computed by the caller.

        :meth:`update` computes it as ``X^T @ X``; a caller with a faster product giving
        the same values (a framework's own, on its device) adds it here.

        Parameters
        ----------
        gram : array
            ``k x k``, real: the sum over the batch's rows ``x`` of ``x^T x``, in the
            dtype the sums are kept in (float64 where available).
        rows : int
            Number of input rows it sums (0 or more).

        Raises
        ------
        TypeError
            If `rows` is not an int.
        ValueError
            If `gram` is not ``k x k`` or `rows` is negative.
        """
        if isinstance(rows, bool) or not isinstance(rows, numbers.Integral):
            raise TypeError(f"rows must be an int, got {type(rows).__name__}")
        if rows < 0:
            raise ValueError(f"rows must be non-negative, got {rows}")
        if tuple(gram.shape) != (self.k, self.k):
            raise ValueError(f"gram must be {self.k} x {self.k}, got shape {tuple(gram.shape)}")
        self._add(gram, int(rows), owned=False)

    def _add(self, gram: Array, rows: int, owned: bool) -> None:
        """Add `gram` to the sums, in place where the library updates arrays in place (the
        same sums as a new array); `owned`: no one else holds `gram`, so it may be kept."""
        if self._sum is None:
            self._sum = gram if owned or not _views_update_in_place(gram) else namespace(gram).asarray(gram, copy=True)
        elif _views_update_in_place(self._sum):
            self._sum += gram
        else:
            self._sum = self._sum + gram
        self.rows += rows

    def hessian(self) -> Array:
        """``X^T X / rows`` over every batch so far.

        Returns
        -------
        array
            ``k x k``, float64 where available.

        Raises
        ------
        ValueError
            If no rows were added.
        """
        return self.gram() / self.rows

    def gram(self) -> Array:
        """``X^T X`` over every batch so far, not divided by the rows.

        Returns
        -------
        array
            ``k x k``, float64 where available: the running sum itself, which later
            updates add to (copy it to keep it apart).

        Raises
        ------
        ValueError
            If no rows were added.
        """
        if self._sum is None or self.rows == 0:
            raise ValueError("no inputs yet: call update with at least one row first")
        return self._sum


def unfold_patches(
    x: Array,
    kernel_size: int | Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Array:
    """The input patches of a 2-D convolution as rows of a matrix, per group (im2col).

    Parameters
    ----------
    x : array
        Convolution input ``[N, C, H, W]``.
    kernel_size, stride, padding, dilation : int or tuple of two ints
        As for ``torch.nn.Conv2d`` (zero padding on both sides).
    groups : int, default 1
        Number of groups; it must divide ``C``.

    Returns
    -------
    array
        ``[groups, N * OH * OW, C / groups * kh * kw]``: row ``(n, oh, ow)`` of group
        ``g`` holds the inputs that output position reads, in the order of a weight
        ``[out, C / groups, kh, kw]`` flattened after its first axis, so that
        ``patches[g] @ weight_g.reshape(out_g, -1).T`` is the convolution of group
        ``g``. Feed ``patches[g]`` to a :class:`HessianAccumulator` per group.

    Raises
    ------
    ValueError
        If `x` is not 4-D, a parameter is out of range, `groups` does not divide ``C``,
        or the kernel does not fit the padded input.
    TypeError
        If a parameter is not an integer.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> x = np.arange(9.0).reshape(1, 1, 3, 3)
    >>> ap.unfold_patches(x, 2)[0]
    array([[0., 1., 3., 4.],
           [1., 2., 4., 5.],
           [3., 4., 6., 7.],
           [4., 5., 7., 8.]])
    """
    xp = namespace(x)
    if x.ndim != 4:
        raise ValueError(f"unfold_patches needs an input [N, C, H, W], got shape {tuple(x.shape)}")
    kh, kw = _pair("kernel_size", kernel_size, 1)
    sh, sw = _pair("stride", stride, 1)
    ph, pw = _pair("padding", padding, 0)
    dh, dw = _pair("dilation", dilation, 1)
    groups = _positive_int("groups", groups)
    batch, channels, height, width = x.shape
    if channels % groups:
        raise ValueError(f"groups={groups} does not divide the {channels} input channels")
    oh = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(
            f"a kernel of {kh} x {kw} (dilation {dh}, {dw}) does not fit the padded input {tuple(x.shape)}"
        )
    if ph or pw:
        x = xpx.pad(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)], xp=xp)
    taps = [
        x[:, :, a * dh : a * dh + sh * (oh - 1) + 1 : sh, b * dw : b * dw + sw * (ow - 1) + 1 : sw]
        for a in range(kh)
        for b in range(kw)
    ]
    patches = xp.reshape(xp.stack(taps, axis=2), (batch, groups, channels // groups, kh * kw, oh, ow))
    patches = xp.permute_dims(patches, (1, 0, 4, 5, 2, 3))
    return xp.reshape(patches, (groups, batch * oh * ow, channels // groups * kh * kw))


def _pair(name: str, value: Any, low: int) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if any(v < low for v in pair):
        raise ValueError(f"{name} must be at least {low}, got {value!r}")
    return int(pair[0]), int(pair[1])


# --------------------------------------------------------------------------------------
# Reconstruction methods: rows of arrayprune.METHODS that carry a solver
# --------------------------------------------------------------------------------------


class ReconstructionMethod(UnstructuredPruningMethod):
    """Base of the methods that prune a layer weight from its Hessian and update the kept entries.

    Such a method is a row of :data:`arrayprune.METHODS` like any other: its score is
    :data:`~arrayprune.method_parts.HESSIAN` (it needs the Hessian ``X^T X`` of the
    layer's inputs, a statistic of calibration data), and it carries a solver,
    ``SOLVE(weight, hessian, amount=None, *, n=None, m=None, reduction_axis=-1,
    **options) -> (new_weight, keep_mask)``, with the arguments and results of
    :func:`sparsegpt`. Its constructor takes ``amount`` (or ``n`` and ``m``) and then the
    solver's own options, kept as attributes of the same names. Every surface that
    calibrates a model runs the solver through :meth:`reconstruct`: the command line's
    ``--method`` and ``prune_file`` (ONNX graphs, Hugging Face folders layer by layer,
    given Hessians), scans, and the PyTorch adapter's ``prune.reconstruct``.

    Without a Hessian (a container, a global ranking, a plan) the method ranks by
    magnitude: the ``amount`` entries of smallest ``|x|``, as
    :class:`~arrayprune.L1Unstructured`, or ``n`` of every ``m`` consecutive entries
    along the last axis, as :class:`~arrayprune.NMStructured`. The command line ranks
    weights by magnitude in this way for ``--global`` and gives each weight's count to
    the solver.

    Parameters
    ----------
    amount : int or float, optional
        Fraction in ``[0, 1]`` of each weight's entries to prune, or their number.
    n, m : int, optional
        The N:M pattern along the reduction axis, instead of `amount`.

    Raises
    ------
    TypeError, ValueError
        For a bad amount or pattern (both or neither given).
    """

    SCORE: ClassVar[_parts.Score] = _parts.HESSIAN
    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {
        "amount": _parts.Flag("--amount", float, "fraction (0..1) of each weight's entries to prune, or their number"),
        "n": _parts.Flag("--nm", str, "N:M, N zeros in every M consecutive entries of the reduction axis"),
        "m": _parts.Flag("--nm", str, "N:M, N zeros in every M consecutive entries of the reduction axis"),
    }

    #: The solver: ``SOLVE(weight, hessian, amount, *, n, m, reduction_axis, **options)``.
    SOLVE: ClassVar[Callable[..., tuple[Array, Array]]]

    def __init__(self, amount: int | float | None = None, n: int | None = None, m: int | None = None):
        pattern = _check_pattern(amount, n, m)
        if pattern is None:
            super().__init__(amount)  # type: ignore[arg-type]  # checked: not None
        else:
            self.amount = None  # type: ignore[assignment]
        self.n: int | None = None if pattern is None else pattern[0]
        self.m: int | None = None if pattern is None else pattern[1]

    def options(self) -> dict[str, Any]:
        """The constructor's arguments, as this method holds them (a copy with another amount:
        ``type(method)(**{**method.options(), "amount": k})``)."""
        return {p.name: getattr(self, p.name) for p in _parts.constructor_parameters(type(self))}

    def reconstruct(self, weight: Array, hessian: Array, reduction_axis: int = -1) -> tuple[Array, Array]:
        """Prune `weight` from `hessian` and update the entries it keeps: ``(new_weight, keep_mask)``.

        Parameters
        ----------
        weight : array
            A floating layer weight (see :func:`sparsegpt`).
        hessian : array
            ``K x K``, the Hessian of the layer's inputs (``K`` the reduction's length).
        reduction_axis : int, default -1
            The input axis of a 2-D weight.
        """
        solve = type(self).SOLVE
        own = {k: v for k, v in self.options().items() if k not in ("amount", "n", "m")}
        return solve(weight, hessian, self.amount, n=self.n, m=self.m, reduction_axis=reduction_axis, **own)

    def count(self, available: int | None) -> int:
        if self.n is not None:
            raise TypeError(f"an {self.n}:{self.m} pattern prunes no amount of a whole array")
        return super().count(available)

    def keep_masks(self, scores: list[Array], eligible_masks: list[Array | None]) -> list[Array]:
        if self.n is None:
            return super().keep_masks(scores, eligible_masks)
        pattern = NMStructured(self.n, cast(int, self.m))  # set with `n`
        return [
            pattern.keep_mask(s) if e is None else _as_keep(pattern.compute_mask(s, e))
            for s, e in zip(scores, eligible_masks, strict=True)
        ]


def _as_keep(mask: Array) -> Array:
    xp = namespace(mask)
    return mask if xp.isdtype(mask.dtype, "bool") else mask != 0


class SparseGPT(ReconstructionMethod):
    """SparseGPT: prune each layer weight from its Hessian and update the entries it keeps.

    The method of :func:`sparsegpt` as a row of :data:`arrayprune.METHODS`
    (``--method sparsegpt``): see :class:`ReconstructionMethod` for what it needs and
    what it does without a Hessian.

    Parameters
    ----------
    amount : int or float, optional
        Fraction in ``[0, 1]`` of each weight's entries to prune, or their number.
    n, m : int, optional
        The N:M pattern along the reduction axis, instead of `amount`.
    block_size : int, default 128
        Input columns processed together; for N:M a multiple of `m`.
    damp : float, default 0.01
        ``damp * mean(diag(hessian))`` is added to the Hessian's diagonal.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> w = np.array([[1.0, -0.2, 0.5, 0.1]])
    >>> new, keep = ap.SparseGPT(amount=0.5).reconstruct(w, np.eye(4))
    >>> keep
    array([[ True, False,  True, False]])
    """

    SOLVE = staticmethod(sparsegpt)
    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {"block_size": _parts.NO_FLAG, "damp": _parts.NO_FLAG}

    def __init__(
        self,
        amount: int | float | None = None,
        n: int | None = None,
        m: int | None = None,
        block_size: int = 128,
        damp: float = 0.01,
    ):
        check_sparsegpt_options(amount, n, m, block_size, damp)
        super().__init__(amount, n, m)
        self.block_size, self.damp = block_size, damp
