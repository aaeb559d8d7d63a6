"""Validation of pruning amounts and dimensions, with the error types of PyTorch.

An *amount* says how much to prune: a float in ``[0, 1]`` is a fraction of the units
(entries or channels) considered, a non-negative integer is an absolute count. These
helpers are public so that adapters and user-written methods validate the same way the
built-in methods do.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = [
    "validate_pruning_amount_init",
    "validate_pruning_amount",
    "compute_nparams_toprune",
    "validate_structured_pruning",
    "validate_pruning_dim",
    "normalize_dim",
    "is_count",
]


def validate_pruning_amount_init(amount: Any) -> None:
    """Check an amount on its own, before the size of the array is known.

    Parameters
    ----------
    amount : int or float
        A fraction in ``[0, 1]`` (float) or a non-negative count (int).

    Raises
    ------
    TypeError
        If `amount` is not a real number (``bool`` counts as an integer, as in PyTorch).
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """
    if type(amount) is float and 0.0 <= amount <= 1.0:
        return  # the common case, spared the abstract-base-class checks below
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount!r}. Must be int or float.")
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise ValueError(
                f"amount={amount} should either be a float in the range [0, 1] "
                "or a non-negative integer"
            )
    elif not 0.0 <= float(amount) <= 1.0:
        raise ValueError(
            f"amount={amount} should either be a float in the range [0, 1] "
            "or a non-negative integer"
        )


def validate_pruning_amount(amount: Any, tensor_size: int) -> None:
    """Check that an absolute amount does not exceed the number of units available.

    Parameters
    ----------
    amount : int or float
        The amount as given by the user (a float always fits).
    tensor_size : int
        Number of units (entries or channels) that can be pruned.

    Raises
    ------
    ValueError
        If `amount` is an integer larger than `tensor_size`.
    """
    if is_count(amount) and amount > tensor_size:
        raise ValueError(
            f"amount={amount} should be smaller than the number of parameters "
            f"to prune={tensor_size}"
        )


def compute_nparams_toprune(amount: Any, tensor_size: int) -> int:
    """Convert an amount into a number of units to prune.

    A float is multiplied by `tensor_size` and rounded with Python's :func:`round`
    (half to even), exactly as PyTorch does; an integer is returned unchanged.

    Parameters
    ----------
    amount : int or float
        A validated amount.
    tensor_size : int
        Number of units that can be pruned.

    Returns
    -------
    int
        The number of units to prune.
    """
    if is_count(amount):
        return int(amount)
    return round(amount * tensor_size)


def is_count(amount: Any) -> bool:
    """Whether `amount` is an absolute number of units (an integer), not a fraction.

    Parameters
    ----------
    amount : int or float
        An amount.

    Returns
    -------
    bool
        True for integers (``bool`` included, as in PyTorch), False for floats.
    """
    return type(amount) is not float and isinstance(amount, numbers.Integral)


def validate_structured_pruning(shape: tuple[int, ...]) -> None:
    """Check that an array has channels, that is at least two dimensions.

    Parameters
    ----------
    shape : tuple of int
        Shape of the array to prune.

    Raises
    ------
    ValueError
        If the array has fewer than two dimensions.
    """
    if len(shape) <= 1:
        raise ValueError(
            "Structured pruning can only be applied to multidimensional tensors. "
            f"Found tensor of shape {tuple(shape)} with {len(shape)} dims"
        )


def validate_pruning_dim(shape: tuple[int, ...], dim: int) -> None:
    """Check that `dim` indexes a dimension of an array of this shape.

    Parameters
    ----------
    shape : tuple of int
        Shape of the array to prune.
    dim : int
        Dimension along which channels are defined; negative values count from the end.

    Raises
    ------
    TypeError
        If `dim` is not an integer.
    IndexError
        If `dim` is out of range.
    """
    normalize_dim(shape, dim)


def normalize_dim(shape: tuple[int, ...], dim: int) -> int:
    """Return `dim` as a non-negative axis index for an array of this shape.

    Parameters
    ----------
    shape : tuple of int
        Shape of the array.
    dim : int
        Axis, negative values counting from the end.

    Returns
    -------
    int
        The axis in ``range(len(shape))``.

    Raises
    ------
    TypeError
        If `dim` is not an integer.
    IndexError
        If `dim` is out of range.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    ndim = len(shape)
    if not -ndim <= dim < ndim:
        raise IndexError(f"Invalid index {dim} for tensor of size {tuple(shape)}")
    return int(dim) % ndim
