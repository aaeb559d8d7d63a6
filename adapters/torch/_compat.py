"""PyTorch's private helpers of :mod:`torch.nn.utils.prune`: same names, signatures, meaning."""

from __future__ import annotations

from typing import Any

import torch

from arrayprune import amount as _amount
from arrayprune.norms import channel_norms as _channel_norms


def _validate_pruning_amount_init(amount: Any) -> None:
    """Check an amount before the tensor is known: a float in ``[0, 1]`` or an int >= 0."""
    _amount.validate_pruning_amount_init(amount)


def _validate_pruning_amount(amount: Any, tensor_size: int) -> None:
    """Check that an integer amount does not exceed `tensor_size` units."""
    _amount.validate_pruning_amount(amount, tensor_size)


def _compute_nparams_toprune(amount: Any, tensor_size: int) -> int:
    """Units to prune: an integer amount as is, a float as ``round(amount * tensor_size)``."""
    return _amount.compute_nparams_toprune(amount, tensor_size)


def _validate_structured_pruning(t: torch.Tensor) -> None:
    """Raise ValueError unless `t` has at least two dimensions."""
    _amount.validate_structured_pruning(tuple(t.shape))


def _validate_pruning_dim(t: torch.Tensor, dim: int) -> None:
    """Raise IndexError unless `dim` is a dimension of `t` (TypeError if not an int)."""
    _amount.validate_pruning_dim(tuple(t.shape), dim)


def _compute_norm(t: torch.Tensor, n: Any, dim: int) -> torch.Tensor:
    """L\\ `n` norm (``p`` of :func:`torch.norm`) of each channel of `t` along `dim`."""
    return _channel_norms(t, n, _amount.normalize_dim(tuple(t.shape), dim))


__all__ = [name for name in list(globals()) if name.startswith(("_validate_", "_compute_"))]
