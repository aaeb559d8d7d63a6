"""A toy reconstruction, registered from this one file: magnitude selection, then the kept
weights refit by least squares on the Hessian.

For each output row ``w`` (over the reduction axis) with kept inputs ``K``, the refit
minimises the layer's output error on the calibration inputs, ``(w - w') H (w - w')^T``
with ``w'`` zero outside ``K``: ``w'_K = w Hd[:, K] Hd[K, K]^-1``, ``Hd = H + 0.01
mean(diag H) I``. It takes NumPy arrays and torch tensors (on any device) and returns
the input's kind, as :func:`arrayprune.sparsegpt` does. :class:`MagnitudeRefit` is the
method: a :class:`arrayprune.ReconstructionMethod` carrying the solver, and
``register()`` puts it in :data:`arrayprune.METHODS`, which makes it
``--method magnitude_refit`` everywhere.
"""

from __future__ import annotations

import numpy as np

import arrayprune
from arrayprune.amount import compute_nparams_toprune

NAME = "magnitude_refit"


def _numpy(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    return np.asarray(x, dtype=np.float64)


def magnitude_refit(weight, hessian, amount=None, *, n=None, m=None, reduction_axis=-1):
    """The toy solver: ``(new_weight, keep_mask)`` of a 2-D weight."""
    w = np.moveaxis(_numpy(weight), reduction_axis, -1)  # [out, K]
    h = _numpy(hessian)
    hd = h + 0.01 * np.mean(np.diag(h)) * np.eye(h.shape[0])
    magnitude = np.abs(w)
    keep = np.ones(w.shape, dtype=bool)
    if n is not None:  # n of every m along the reduction, smallest first
        groups = magnitude.reshape(w.shape[0], -1, m)
        order = np.argsort(groups, axis=-1, kind="stable")[..., :n]
        dropped = np.zeros(groups.shape, dtype=bool)
        np.put_along_axis(dropped, order, True, axis=-1)
        keep = ~dropped.reshape(w.shape)
    else:
        k = compute_nparams_toprune(amount, w.size)
        keep.reshape(-1)[np.argsort(magnitude.reshape(-1), kind="stable")[:k]] = False
    new = np.zeros_like(w)
    for i in range(w.shape[0]):
        kept = np.flatnonzero(keep[i])
        if kept.size:
            new[i, kept] = np.linalg.solve(hd[np.ix_(kept, kept)], (w[i] @ hd[:, kept])).T
    new, keep = np.moveaxis(new, -1, reduction_axis), np.moveaxis(keep, -1, reduction_axis)
    if hasattr(weight, "detach"):  # a torch tensor: back to its dtype and device
        import torch

        return (
            torch.as_tensor(new, dtype=weight.dtype, device=weight.device),
            torch.as_tensor(keep, device=weight.device),
        )
    return new.astype(np.asarray(weight).dtype), keep


class MagnitudeRefit(arrayprune.ReconstructionMethod):
    """Magnitude selection, then a least-squares refit of the kept weights on the Hessian.

    Parameters
    ----------
    amount : int or float, optional
        Fraction in ``[0, 1]`` of each weight's entries to prune, or their number.
    n, m : int, optional
        The N:M pattern along the reduction axis, instead of `amount`.
    """

    SOLVE = staticmethod(magnitude_refit)


def register() -> None:
    arrayprune.registry.register_method(NAME, MagnitudeRefit)


def unregister() -> None:
    arrayprune.registry.unregister_method(NAME)
