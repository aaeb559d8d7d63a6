"""Pruning methods at array level, with the names and semantics of ``torch.nn.utils.prune``.

A method computes a *mask* for an array of importance scores ``t`` on top of a
``default_mask`` (the mask of earlier pruning, ones if none). Masks keep the dtype of
``default_mask``; arrayprune's own default is boolean.

Calling ``method.compute_mask(t, default_mask)`` directly ranks *all* entries of ``t``,
as PyTorch does. Iterative pruning goes through :class:`PruningContainer`, whose
``compute_mask`` lets its newest method act only on what is still unpruned: remaining
entries for ``'unstructured'`` methods, remaining channels for ``'structured'`` ones,
everything for ``'global'`` ones; the amount is then relative to what remains.

Ties are broken by position: among equal scores, the lowest flat index (or channel
index) is pruned first. NaN scores rank above +inf.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import array_api_compat as apc
import array_api_extra as xpx

from . import amount as _amount
from ._masks import (
    apply_keep,
    check_same_shape,
    count_true,
    eligible,
    is_bool,
    ones_mask,
    size,
)
from ._namespace import namespace
from .norms import channel_norms
from .rng import check_random_source, uniform_like, uniform_many
from .selection import smallest_magnitude_keep

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "combine_masks",
]

Array = Any
PRUNING_TYPES = ("unstructured", "structured", "global")


class BasePruningMethod(ABC):
    """Abstract base of pruning methods.

    Subclasses set ``PRUNING_TYPE`` (``'unstructured'``, ``'structured'`` or
    ``'global'``; structured methods also have a ``dim`` attribute) and implement
    :meth:`compute_mask`.
    """

    PRUNING_TYPE: ClassVar[str]
    _tensor_name: str | None = None

    @abstractmethod
    def compute_mask(self, t: Array, default_mask: Array) -> Array:
        """Return the mask for scores `t` on top of `default_mask`.

        Parameters
        ----------
        t : array
            Importance scores (the array itself unless other scores are given).
        default_mask : array
            Mask of earlier pruning, same shape as `t`; it is never modified.

        Returns
        -------
        array
            The new mask: `default_mask` with more entries zeroed, same dtype.
        """

    def prune(self, t: Array, default_mask: Array | None = None, importance_scores: Array | None = None) -> Array:
        """Return `t` multiplied by the mask computed from `importance_scores` (or `t`).

        Parameters
        ----------
        t : array
            Array to prune.
        default_mask : array, optional
            Mask of earlier pruning; ones if omitted.
        importance_scores : array, optional
            Scores ranking the entries of `t`, same shape; `t` itself if omitted.

        Returns
        -------
        array
            The pruned array, a new array of the dtype of `t`.

        Raises
        ------
        ValueError
            If `importance_scores` or `default_mask` has another shape than `t`.
        """
        scores = t if importance_scores is None else importance_scores
        check_same_shape(t, scores, "importance_scores")
        mask = ones_mask(t) if default_mask is None else default_mask
        check_same_shape(t, mask, "default_mask")
        xp = namespace(t)
        return t * xp.astype(self.compute_mask(scores, default_mask=mask), t.dtype)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class PruningContainer(BasePruningMethod):
    """A sequence of pruning methods applied one after the other to the same array.

    Parameters
    ----------
    *methods : BasePruningMethod
        Methods already applied, oldest first (or a single iterable of them).

    Notes
    -----
    :meth:`compute_mask` applies only the newest method, on top of the mask the
    earlier ones produced (the ``default_mask``); see :func:`combine_masks`.
    """

    def __init__(self, *methods: Any):
        self._pruning_methods: tuple[Any, ...] = ()
        if len(methods) == 1 and isinstance(methods[0], Iterable) and not _is_method(methods[0]):
            methods = tuple(methods[0])
        if methods:
            self._tensor_name = getattr(methods[0], "_tensor_name", None)
        for method in methods:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: Any) -> None:
        """Append `method` to the container.

        Raises
        ------
        TypeError
            If `method` is not a pruning method.
        ValueError
            If `method` acts on another tensor name than the container.
        """
        if method is None:
            return
        if not _is_method(method):
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if self._tensor_name != getattr(method, "_tensor_name", None):
            raise ValueError(
                "Can only add pruning methods acting on the parameter named "
                f"'{self._tensor_name}' to PruningContainer {self}. "
                f"Found '{getattr(method, '_tensor_name', None)}'"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> Any:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Array, default_mask: Array) -> Array:
        """Apply the newest method to what `default_mask` leaves unpruned.

        Raises
        ------
        IndexError
            If the container is empty.
        """
        if not self._pruning_methods:
            raise IndexError("PruningContainer holds no pruning method")
        return combine_masks(self._pruning_methods[-1], t, default_mask)

    def __repr__(self) -> str:
        return f"PruningContainer{self._pruning_methods!r}"


def _is_method(obj: Any) -> bool:
    # A method *instance*: a class has compute_mask and PRUNING_TYPE too, but its
    # compute_mask is unbound (torch's isinstance check rejects classes as well).
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "compute_mask", None))
        and hasattr(obj, "PRUNING_TYPE")
    )


def combine_masks(method: Any, t: Array, mask: Array) -> Array:
    """Let `method` prune only what `mask` leaves, and combine the result with `mask`.

    Which part of `t` the method sees depends on its ``PRUNING_TYPE``:

    * ``'unstructured'``: the entries where `mask` is 1, flattened;
    * ``'structured'``: the channels along ``method.dim`` not yet entirely zero;
    * ``'global'``: all of `t`.

    Built-in methods do this without gathering the slice; any other method object with
    ``PRUNING_TYPE`` and ``compute_mask`` gets the slice gathered, as in PyTorch.

    Parameters
    ----------
    method : pruning method
        The method to apply.
    t : array
        Importance scores, same shape as `mask`.
    mask : array
        Mask of earlier pruning; not modified.

    Returns
    -------
    array
        The combined mask, of the dtype of `mask`.

    Raises
    ------
    AttributeError
        If a structured method has no ``dim``.
    IndexError
        If its ``dim`` is out of range.
    ValueError
        If ``PRUNING_TYPE`` is not recognised or shapes differ.
    """
    check_same_shape(t, mask, "default_mask")
    kind = getattr(method, "PRUNING_TYPE", None)
    if kind == "global":
        return method.compute_mask(t, default_mask=mask)
    if kind == "unstructured":
        if isinstance(method, _Unstructured):
            return method._remaining_mask(t, mask)
        return _combine_gathered_entries(method, t, mask)
    if kind == "structured":
        if not hasattr(method, "dim"):
            raise AttributeError(
                'Pruning methods of PRUNING_TYPE "structured" need to have the attribute `dim` defined.'
            )
        if isinstance(method, _Structured):
            return method._remaining_mask(t, mask)
        return _combine_gathered_channels(method, t, mask)
    raise ValueError(f"Unrecognized PRUNING_TYPE {kind!r}")


def _combine_gathered_entries(method: Any, t: Array, mask: Array) -> Array:
    xp = namespace(t, mask)
    slc = eligible(mask)
    partial = method.compute_mask(t[slc], default_mask=mask[slc])
    return xpx.at(mask, slc).set(xp.astype(partial, mask.dtype), copy=True, xp=xp)


def _combine_gathered_channels(method: Any, t: Array, mask: Array) -> Array:
    xp = namespace(t, mask)
    _amount.validate_structured_pruning(t.shape)
    dim = _amount.normalize_dim(t.shape, method.dim)
    remaining = _remaining_channels(mask, dim)
    idx = xp.nonzero(remaining)[0]
    partial = method.compute_mask(xp.take(t, idx, axis=dim), default_mask=xp.take(mask, idx, axis=dim))
    partial = xp.astype(partial, mask.dtype)
    if idx.shape[0] == 0:
        return xp.asarray(mask, copy=True)
    # Scatter the partial mask back with standard operations only (integer-array
    # __setitem__ is not in the Array API standard): channel j of the result is
    # channel (number of remaining channels before j) of `partial` where j remains.
    pos = xp.cumulative_sum(xp.astype(remaining, idx.dtype)) - 1
    pos = xp.where(pos < 0, xp.zeros_like(pos), pos)
    shape = [1] * t.ndim
    shape[dim] = remaining.shape[0]
    return xp.where(xp.reshape(remaining, tuple(shape)), xp.take(partial, pos, axis=dim), mask)


def _remaining_channels(mask: Array, dim: int) -> Array:
    """Channels along `dim` not yet entirely pruned (their mask does not sum to 0)."""
    xp = namespace(mask)
    others = tuple(d for d in range(mask.ndim) if d != dim)
    if is_bool(mask):
        return xp.any(mask, axis=others)
    return xp.sum(mask, axis=others) != 0


def available_count(arrays: list[Array], eligible_masks: list[Array | None]) -> int:
    """Number of entries that may still be pruned across `arrays`."""
    return sum(size(a) if e is None else count_true(e) for a, e in zip(arrays, eligible_masks, strict=True))


def _channel_keep_to_mask(default_mask: Array, keep: Array, dim: int) -> Array:
    if dim == 0 and size(default_mask) <= 1 << 18 and not apc.is_jax_array(default_mask):
        # Leading channels are contiguous rows. While the mask fits in cache, copying it
        # and clearing the pruned rows beats a broadcast multiply; beyond, one fused
        # multiply (a single read and write of memory) wins.
        xp = namespace(default_mask)
        out = xp.asarray(default_mask, copy=True)
        out[~keep] = False if is_bool(out) else 0
        return out
    shape = [1] * default_mask.ndim
    shape[dim] = keep.shape[0]
    xp = namespace(keep)
    return apply_keep(default_mask, xp.reshape(keep, tuple(shape)))


# --------------------------------------------------------------------------------------
# Built-in methods
# --------------------------------------------------------------------------------------


class Identity(BasePruningMethod):
    """A method that prunes nothing: its mask is the default mask."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Array, default_mask: Array) -> Array:
        check_same_shape(t, default_mask, "default_mask")
        return default_mask


class _Amount:
    """Mixin: a validated ``amount`` attribute."""

    def __init__(self, amount: Any):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount

    def _count(self, available: int) -> int:
        nparams = _amount.compute_nparams_toprune(self.amount, available)
        _amount.validate_pruning_amount(nparams, available)
        return nparams


class _Unstructured(_Amount, BasePruningMethod):
    """Base of methods that prune the entries of smallest score."""

    PRUNING_TYPE = "unstructured"

    def _score_arrays(self, arrays: list[Array]) -> list[Array]:
        """The arrays whose magnitudes rank the entries, one per input array."""
        raise NotImplementedError

    def _keep_masks(self, scores: list[Array], eligible_masks: list[Array | None]) -> list[Array]:
        """Boolean keep masks pruning ``amount`` of the eligible entries of all `scores`."""
        k = self._count(available_count(scores, eligible_masks))
        return smallest_magnitude_keep(self._score_arrays(scores), k, eligible_masks)

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Mask pruning ``amount`` of all entries of `t`, on top of `default_mask`.

        As in PyTorch, every entry is ranked (use a container to act on the remaining
        ones only). ``default_mask=None`` means no earlier pruning and gives the
        boolean mask directly, without building and multiplying a mask of ones.
        """
        keep = self._keep_masks([t], [None])[0]
        if default_mask is None:
            return keep
        check_same_shape(t, default_mask, "default_mask")
        return apply_keep(default_mask, keep)

    def _remaining_mask(self, t: Array, mask: Array) -> Array:
        return apply_keep(mask, self._keep_masks([t], [eligible(mask)])[0])


class L1Unstructured(_Unstructured):
    """Prune the (currently unpruned) entries of smallest absolute value.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    """

    def _score_arrays(self, arrays: list[Array]) -> list[Array]:
        return arrays  # the selection ranks by magnitude already


class RandomUnstructured(_Unstructured):
    """Prune (currently unpruned) entries chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    """

    def __init__(self, amount: Any, *, seed: int | None = None, generator: Any = None):
        super().__init__(amount)
        check_random_source(seed, generator)
        self.seed = seed
        self.generator = generator

    def _score_arrays(self, arrays: list[Array]) -> list[Array]:
        shapes = [tuple(a.shape) for a in arrays]
        return uniform_many(arrays, shapes, seed=self.seed, generator=self.generator)


class _Structured(_Amount, BasePruningMethod):
    """Base of methods that prune whole channels along ``dim``."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Any, dim: int = -1):
        super().__init__(amount)
        self.dim = dim

    def _channel_scores(self, t: Array, dim: int) -> Array:
        raise NotImplementedError

    def _checked_dim(self, t: Array) -> int:
        _amount.validate_structured_pruning(t.shape)
        return _amount.normalize_dim(t.shape, self.dim)

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Mask pruning ``amount`` of all channels of `t`, on top of `default_mask`.

        ``default_mask=None`` means no earlier pruning (the mask is then boolean).
        """
        if default_mask is None:
            default_mask = ones_mask(t)
        check_same_shape(t, default_mask, "default_mask")
        dim = self._checked_dim(t)
        k = self._count(t.shape[dim])
        if k == 0:
            return default_mask
        keep = smallest_magnitude_keep([self._channel_scores(t, dim)], k)[0]
        return _channel_keep_to_mask(default_mask, keep, dim)

    def _remaining_mask(self, t: Array, mask: Array) -> Array:
        dim = self._checked_dim(t)
        remaining = _remaining_channels(mask, dim)
        k = self._count(count_true(remaining))
        if k == 0:
            return mask
        keep = smallest_magnitude_keep([self._channel_scores(t, dim)], k, [remaining])[0]
        return _channel_keep_to_mask(mask, keep, dim)


class RandomStructured(_Structured):
    """Prune whole (currently unpruned) channels chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Axis along which channels are defined.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    """

    def __init__(self, amount: Any, dim: int = -1, *, seed: int | None = None, generator: Any = None):
        super().__init__(amount, dim)
        check_random_source(seed, generator)
        self.seed = seed
        self.generator = generator

    def _channel_scores(self, t: Array, dim: int) -> Array:
        return uniform_like(t, (t.shape[dim],), seed=self.seed, generator=self.generator)


class LnStructured(_Structured):
    """Prune whole (currently unpruned) channels of smallest L``n`` norm.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm` (see
        :func:`arrayprune.norms.channel_norms`).
    dim : int, default -1
        Axis along which channels are defined.
    """

    def __init__(self, amount: Any, n: Any, dim: int = -1):
        super().__init__(amount, dim)
        self.n = n

    def _channel_scores(self, t: Array, dim: int) -> Array:
        return channel_norms(t, self.n, dim)


class CustomFromMask(BasePruningMethod):
    """Prune with a precomputed mask (multiplied into the default mask).

    Parameters
    ----------
    mask : array
        The mask; non-zero entries are kept.
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: Array):
        self.mask = mask

    def compute_mask(self, t: Array, default_mask: Array) -> Array:
        check_same_shape(default_mask, self.mask, "mask")
        xp = namespace(default_mask)
        custom = self.mask
        if namespace(custom) is not xp:
            custom = xp.asarray(custom, device=apc.device(default_mask))
        if is_bool(default_mask):
            return default_mask & xp.astype(custom, xp.bool)
        return default_mask * xp.astype(custom, default_mask.dtype)
