"""PyTorch's random streams, for the random methods without ``seed`` or ``generator``.

Without ``seed`` or ``generator``, RandomUnstructured and RandomStructured make exactly
the calls torch.nn.utils.prune makes on the global generator, in the same order and
with the same numbers, shapes, dtypes and devices, and select with the same torch
operations (``torch.topk``, ``torch.kthvalue``), whose choice among tied draws is
their own: masks are PyTorch's bit for bit and the generator ends in the same state.
Every check that can fail runs before the draw, and nothing is drawn when nothing is
pruned. With a seed or a generator the core's own streams apply (arrayprune.rng).
This module is the only place where the adapter follows PyTorch's streams.
"""

from __future__ import annotations

from typing import Any

import torch

import arrayprune.methods as _core
from arrayprune._masks import check_same_shape as _check_same_shape


def _pytorch_random_keep(
    scores: list[torch.Tensor], eligible_masks: list[torch.Tensor | None], count: Any
) -> list[torch.Tensor]:
    """Keep masks of PyTorch's ``RandomUnstructured`` over one or several tensors.

    PyTorch scores the entries still in play, as one flat vector in row-major order
    (tensor after tensor in global pruning, whose concatenation has the promoted dtype),
    by ``torch.rand_like`` of that vector, and prunes the ``k`` largest draws
    (``torch.topk``). The same draw is made here from the count, dtype and device alone,
    and the positions chosen are scattered back tensor by tensor; the scores themselves
    are never concatenated.

    Parameters
    ----------
    scores : list of torch.Tensor
        Importance scores, all on one device (only shapes, dtypes and device matter).
    eligible_masks : list of (boolean torch.Tensor or None)
        Per tensor, the entries in play (``None``: all of them).
    count : callable
        ``count(available)``: the validated number of entries to prune.

    Returns
    -------
    list of torch.Tensor
        Boolean masks shaped like `scores`, False at the pruned entries (True outside
        the eligible entries).
    """
    sizes = [s.numel() if e is None else int(e.sum()) for s, e in zip(scores, eligible_masks, strict=True)]
    total = sum(sizes)
    k = count(total)  # validation errors come before any draw
    device = scores[0].device
    keeps = [torch.ones(s.shape, dtype=torch.bool, device=s.device) for s in scores]
    if k == 0:  # PyTorch draws nothing then (topk is never called)
        return keeps
    dtype = scores[0].dtype
    for s in scores[1:]:
        dtype = torch.promote_types(dtype, s.dtype)  # the dtype of torch.cat
    prob = torch.rand(total, dtype=dtype, device=device)  # == rand_like(<remaining entries>)
    dropped = torch.zeros(total, dtype=torch.bool, device=device)
    dropped[torch.topk(prob, k=k).indices] = True
    offset = 0
    for keep, e, n in zip(keeps, eligible_masks, sizes, strict=True):
        part = ~dropped[offset : offset + n].to(device=keep.device)
        if e is None:
            keep.view(-1).copy_(part)
        else:
            keep[e.to(device=keep.device)] = part  # row-major, as t[mask == 1]
        offset += n
    return keeps


def _pytorch_channel_keep(nchannels: int, k: int) -> torch.Tensor:
    """PyTorch's ``RandomStructured`` choice among `nchannels` channels, pruning `k` > 0.

    ``torch.rand(nchannels)`` (CPU, default dtype), then the channels whose draw exceeds
    the `k`-th smallest (``torch.kthvalue``) are kept: tied draws at the threshold are
    all pruned, as in PyTorch.
    """
    prob = torch.rand(nchannels)
    threshold = torch.kthvalue(prob, k=k).values
    return prob > threshold


class _PyTorchStreamRandomUnstructured(_core.RandomUnstructured):
    """The core's ``RandomUnstructured``, drawing and selecting as PyTorch does."""

    def __init__(self, amount: Any):
        super().__init__(amount)

    def keep_masks(self, scores: list[Any], eligible_masks: list[Any]) -> list[Any]:
        return _pytorch_random_keep(list(scores), list(eligible_masks), self.count)


class _PyTorchStreamRandomStructured(_core.RandomStructured):
    """The core's ``RandomStructured``, drawing and selecting as PyTorch does."""

    def __init__(self, amount: Any, dim: int = -1):
        super().__init__(amount, dim)

    def compute_mask(self, t: Any, default_mask: Any) -> Any:
        """Prune ``amount`` of all channels of `t` (``RandomStructured.compute_mask``)."""
        if default_mask is None:
            default_mask = torch.ones(t.shape, dtype=torch.bool, device=t.device)
        _check_same_shape(t, default_mask, "default_mask")
        dim = self.checked_dim(t)
        return self._prune_channels(default_mask, dim, None)

    def remaining_mask(self, t: Any, mask: Any) -> Any:
        """Prune ``amount`` of the remaining channels (a container's ``_combine_masks``)."""
        dim = self.checked_dim(t)
        return self._prune_channels(mask, dim, _core.remaining_channels(mask, dim))

    def _prune_channels(self, mask: torch.Tensor, dim: int, remaining: torch.Tensor | None) -> torch.Tensor:
        nchannels = mask.shape[dim] if remaining is None else int(remaining.sum())
        k = self.count(nchannels)
        if k == 0:
            return mask
        chosen = _pytorch_channel_keep(nchannels, k).to(device=mask.device)
        if remaining is None:
            keep = chosen
        else:
            keep = torch.ones(mask.shape[dim], dtype=torch.bool, device=mask.device)
            keep[remaining] = chosen
        return _core.channel_keep_to_mask(mask, keep, dim)
