"""The upper Cholesky factor of an inverse Hessian, from one Cholesky and a triangular inverse.

SparseGPT needs ``U``, upper triangular with ``U^T U = H^-1``. Inverting ``H`` and then
factoring the inverse costs about ``3 n^3`` flops (an LU solve against the identity, then
a Cholesky). Here ``H`` is factored once, ``H = R R^T`` with ``R`` upper (the lower
Cholesky factor of ``H`` with its rows and columns reversed), and ``U = R^-1``: a
triangular inverse written with matrix products, about ``n^3`` flops in all. Both
routes give the same ``U`` (the upper factor with a positive diagonal is unique) to the
rounding of the arithmetic; this one does not form the explicit inverse of ``H`` and
so loses less of it.
"""

from __future__ import annotations

from typing import Any

import array_api_extra as xpx

Array = Any

# Blocks up to this size are inverted by the library's own `inv`; larger ones are split
# in two and joined with two matrix products (where the time goes at model sizes).
_DIRECT_INVERSE = 64

# A Cholesky pivot of at most this many units of rounding of its diagonal entry is taken
# for zero: exactly singular matrices (two equal inputs) leave 0.5-4 units. A bound
# growing with n would refuse float32 Hessians that damping makes positive definite.
_PIVOT_EPS = 4

NOT_POSITIVE_DEFINITE = "the damped Hessian is not positive definite; raise damp or check the calibration data"


def upper_inverse_factor(xp: Any, h: Array) -> Array:
    """Upper triangular ``U`` with ``U^T U = h^-1``, or ValueError if `h` is not positive definite.

    Parameters
    ----------
    xp : namespace
        The array namespace of `h`.
    h : array
        A symmetric ``n x n`` floating matrix.

    Returns
    -------
    array
        ``U``, upper triangular with a positive diagonal, in `h`'s dtype and on its device.

    Raises
    ------
    TypeError
        If `h` is not float32 or float64 (the libraries' Cholesky factorizations take no
        narrower float).
    ValueError
        If `h` is not positive definite to working precision: the factorization fails, or
        one of its pivots is at most ``4 * eps`` times its diagonal entry (within rounding,
        as happens to an exactly singular matrix).
    """
    if not (xp.isdtype(h.dtype, "real floating") and xp.finfo(h.dtype).bits >= 32):
        raise TypeError(f"the factor of an inverse Hessian needs a float32 or float64 matrix, got {h.dtype}")
    # Each n x n temporary is let go as soon as the next exists: the reversed matrix, its
    # factor, the factor reversed back (PyTorch's flip copies), then the inverse.
    floor = _PIVOT_EPS * xp.finfo(h.dtype).eps * xp.flip(xp.linalg.diagonal(h), axis=0)
    flipped = xp.flip(h, axis=(0, 1))
    try:
        lower = xp.linalg.cholesky(flipped)
    except (ValueError, RuntimeError) as exc:  # NumPy's LinAlgError, PyTorch's RuntimeError
        raise ValueError(NOT_POSITIVE_DEFINITE) from exc
    del flipped
    # A pivot within the rounding of its own diagonal entry: singular to working precision
    # (libraries that return NaN instead of raising fail here too).
    if not bool(xp.all(xp.linalg.diagonal(lower) ** 2 > floor)):
        raise ValueError(NOT_POSITIVE_DEFINITE)
    upper = xp.flip(lower, axis=(0, 1))  # NumPy and CuPy: a view of `lower`, inverted in place
    del lower
    u = _upper_triangular_inverse(xp, upper, overwrite=True)
    if not bool(xp.all(xp.isfinite(u))):
        raise ValueError(NOT_POSITIVE_DEFINITE)
    return u


def _upper_triangular_inverse(xp: Any, r: Array, *, overwrite: bool = False) -> Array:
    """Inverse of the upper triangular `r` (nonzero diagonal), upper triangular itself.

    ``[[A, B], [0, C]]^-1 = [[A^-1, -A^-1 B C^-1], [0, C^-1]]``, by halves down to
    blocks of ``_DIRECT_INVERSE``. Each block of the inverse takes the place of the same
    block of `r` (of its copy, unless `overwrite`), in place where the library writes in
    place: ``B`` is read before its place is written, and besides the result at most two
    quarter-size products exist.
    """
    return _invert_in_place(xp, r if overwrite else xp.asarray(r, copy=True), 0, r.shape[0])


def _invert_in_place(xp: Any, r: Array, start: int, stop: int) -> Array:
    """`r` with its diagonal block ``[start:stop, start:stop]`` replaced by that block's inverse."""
    block = (slice(start, stop), slice(start, stop))
    if stop - start <= _DIRECT_INVERSE:
        return xpx.at(r, block).set(xp.triu(xp.linalg.inv(r[block])), xp=xp)
    middle = start + (stop - start) // 2
    r = _invert_in_place(xp, r, start, middle)
    r = _invert_in_place(xp, r, middle, stop)
    corner = -((r[start:middle, start:middle] @ r[start:middle, middle:stop]) @ r[middle:stop, middle:stop])
    return xpx.at(r, (slice(start, middle), slice(middle, stop))).set(corner, xp=xp)
