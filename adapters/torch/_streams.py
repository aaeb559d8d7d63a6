"""PyTorch's random streams: the core's random methods making PyTorch's very draws on its
global generator and selecting as it does, for bit-identical masks and generator states."""

from __future__ import annotations

import functools
from typing import Any

import torch

import arrayprune.methods as _core


def pytorch_random_keep(scores: list[torch.Tensor], eligible: list[Any], count: Any) -> list[torch.Tensor]:
    """Keep masks of PyTorch's ``RandomUnstructured`` over the `eligible` entries (None: all) of
    several tensors: ``torch.rand_like`` of their concatenation, whose ``count`` largest draws are
    pruned, is drawn from the sizes alone and scattered back, never concatenating anything."""
    sizes = [s.numel() if e is None else int(e.sum()) for s, e in zip(scores, eligible, strict=True)]
    k = count(sum(sizes))  # validation errors come before any draw
    keeps = [torch.ones(s.shape, dtype=torch.bool, device=s.device) for s in scores]
    if k == 0:  # PyTorch draws nothing then
        return keeps
    dtype = functools.reduce(torch.promote_types, [s.dtype for s in scores])  # the dtype of torch.cat
    prob = torch.rand(sum(sizes), dtype=dtype, device=scores[0].device)
    kept = torch.ones(sum(sizes), dtype=torch.bool, device=prob.device)
    kept[torch.topk(prob, k=k).indices] = False
    for keep, e, part in zip(keeps, eligible, torch.split(kept, sizes), strict=True):
        if e is None:
            keep.view(-1).copy_(part)
        else:
            keep[e.to(device=keep.device)] = part.to(device=keep.device)  # row-major, as t[mask == 1]
    return keeps


class PyTorchStreamRandomUnstructured(_core.RandomUnstructured):
    """The core's ``RandomUnstructured``, drawing and selecting as PyTorch does."""

    def keep_masks(self, scores: list[Any], eligible_masks: list[Any]) -> list[Any]:
        return pytorch_random_keep(list(scores), list(eligible_masks), self.count)


class PyTorchStreamRandomStructured(_core.RandomStructured):
    """The core's ``RandomStructured``, drawing ``torch.rand(nchannels)`` (CPU, default dtype)
    for the channels in play and keeping those above the ``k``-th smallest draw, as PyTorch."""

    def keep_channels(self, t: Any, dim: int, k: int, remaining: Any) -> Any:
        nchannels = t.shape[dim] if remaining is None else int(remaining.sum())
        prob = torch.rand(nchannels)
        keep = (prob > torch.kthvalue(prob, k=k).values).to(device=t.device)  # ties at the threshold go
        if remaining is None:
            return keep
        return torch.ones(t.shape[dim], dtype=torch.bool, device=t.device).index_put_((remaining,), keep)


STREAMS = {  # the variants of core classes, for unseeded methods
    _core.RandomUnstructured: PyTorchStreamRandomUnstructured, _core.RandomStructured: PyTorchStreamRandomStructured
}
