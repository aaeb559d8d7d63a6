"""PyTorch's random streams, for the random methods without ``seed`` or ``generator``.

The variants below make exactly the calls :mod:`torch.nn.utils.prune` makes on the
global generator (same numbers, shapes, dtypes, devices, order) and select with the
same operations (``torch.topk``, ``torch.kthvalue``), so masks are PyTorch's bit for
bit and the generator ends in the same state. Checks that can fail run before the
draw; nothing is drawn when nothing is pruned. This is the only place where the
adapter follows PyTorch's streams; with a seed or a generator the core's own apply.
"""

from __future__ import annotations

from typing import Any

import torch

import arrayprune.methods as _core
from arrayprune._masks import check_same_shape as _check_same_shape


def _pytorch_random_keep(scores: list[torch.Tensor], eligible: list[torch.Tensor | None], count: Any) -> list[Any]:
    """Keep masks of PyTorch's ``RandomUnstructured`` over one or several tensors.

    PyTorch draws ``torch.rand_like`` of the entries in play as one flat row-major
    vector (tensor after tensor in global pruning, in the dtype their concatenation
    would have) and prunes the ``count(available)`` largest draws (``torch.topk``). The
    same draw is made from the count, dtype and device alone and scattered back tensor
    by tensor: the scores are never concatenated. ``None`` in `eligible` means every
    entry; the masks are boolean, False at the pruned entries.
    """
    sizes = [s.numel() if e is None else int(e.sum()) for s, e in zip(scores, eligible, strict=True)]
    k = count(sum(sizes))  # validation errors come before any draw
    keeps = [torch.ones(s.shape, dtype=torch.bool, device=s.device) for s in scores]
    if k == 0:  # PyTorch draws nothing then
        return keeps
    dtype = scores[0].dtype
    for s in scores[1:]:
        dtype = torch.promote_types(dtype, s.dtype)  # the dtype of torch.cat
    device = scores[0].device
    prob = torch.rand(sum(sizes), dtype=dtype, device=device)  # == rand_like(<entries in play>)
    dropped = torch.zeros(sum(sizes), dtype=torch.bool, device=device)
    dropped[torch.topk(prob, k=k).indices] = True
    offset = 0
    for keep, e, n in zip(keeps, eligible, sizes, strict=True):
        part = ~dropped[offset : offset + n].to(device=keep.device)
        if e is None:
            keep.view(-1).copy_(part)
        else:
            keep[e.to(device=keep.device)] = part  # row-major, as t[mask == 1]
        offset += n
    return keeps


class PyTorchStreamRandomUnstructured(_core.RandomUnstructured):
    """The core's ``RandomUnstructured``, drawing and selecting as PyTorch does."""

    def keep_masks(self, scores: list[Any], eligible_masks: list[Any]) -> list[Any]:
        return _pytorch_random_keep(list(scores), list(eligible_masks), self.count)


class PyTorchStreamRandomStructured(_core.RandomStructured):
    """The core's ``RandomStructured``, drawing and selecting as PyTorch does.

    PyTorch draws ``torch.rand(nchannels)`` (CPU, default dtype) for the channels in
    play and keeps those whose draw exceeds the ``k``-th smallest (``torch.kthvalue``):
    tied draws at the threshold are all pruned.
    """

    def compute_mask(self, t: Any, default_mask: Any) -> Any:
        if default_mask is None:
            default_mask = torch.ones(t.shape, dtype=torch.bool, device=t.device)
        _check_same_shape(t, default_mask, "default_mask")
        return self._prune_channels(default_mask, self.checked_dim(t), None)

    def remaining_mask(self, t: Any, mask: Any) -> Any:
        dim = self.checked_dim(t)
        return self._prune_channels(mask, dim, _core.remaining_channels(mask, dim))

    def _prune_channels(self, mask: torch.Tensor, dim: int, remaining: torch.Tensor | None) -> torch.Tensor:
        nchannels = mask.shape[dim] if remaining is None else int(remaining.sum())
        k = self.count(nchannels)
        if k == 0:
            return mask
        prob = torch.rand(nchannels)
        keep = (prob > torch.kthvalue(prob, k=k).values).to(device=mask.device)
        if remaining is not None:
            chosen, keep = keep, torch.ones(mask.shape[dim], dtype=torch.bool, device=mask.device)
            keep[remaining] = chosen
        return _core.channel_keep_to_mask(mask, keep, dim)


#: Core random method classes and their PyTorch-stream variants, used without a seed.
STREAMS: dict[type, type] = {
    _core.RandomUnstructured: PyTorchStreamRandomUnstructured,
    _core.RandomStructured: PyTorchStreamRandomStructured,
}
