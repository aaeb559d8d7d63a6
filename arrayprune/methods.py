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

Inside ``jax.jit``
------------------
Every built-in method computes its mask on traced arrays, equal to the eager one: how
many units to prune depends on shapes and the amount only, and the selection then
reads no value back. One thing cannot be known while JAX traces: how many units a
traced ``default_mask`` leaves. A float amount relative to that (iterative pruning, a
schedule over earlier pruning, sparsity bounds with default masks) raises a
``TypeError`` saying so; an int amount works, but is not checked against what remains:
if it is larger, everything that remains is pruned.

Writing a method
----------------
A method is a score (``SCORE``: what ranks) and a pattern (``PATTERN``: which units go,
what the amount counts), see :mod:`arrayprune.method_parts`. Derive from
:class:`UnstructuredPruningMethod` and implement ``entry_scores`` (entries of smallest
score are pruned; declare ``SCORE`` with ``elementwise=True`` if an entry's score
depends on that entry alone, and stored tensors are then streamed), or from
:class:`StructuredPruningMethod` and implement ``channel_scores`` (one score per channel
along ``dim``); a method of another unit derives from :class:`AmountPruningMethod`
(implement ``units`` and ``compute_mask``; a pattern with ``whole_array`` makes a
container hand it the whole array). Each constructor parameter declares its
command-line flag in ``FLAGS``. Listing the class in :data:`arrayprune.METHODS` gives it
a functional verb, verbs in both adapters and a ``--method`` choice of the command line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import array_api_compat as apc
import array_api_extra as xpx

from . import amount as _amount
from . import method_parts as _parts
from ._masks import (
    apply_keep,
    check_same_shape,
    count_true,
    eligible,
    is_bool,
    known_count,
    mask_or_ones,
    ones_mask,
    size,
)
from ._namespace import check_known_shape, namespace
from ._tracing import DATA_DEPENDENT
from .norms import channel_norms
from .rng import check_random_source, uniform_like, uniform_many
from .selection import defers_count, smallest_magnitude_keep

__all__ = [
    "BasePruningMethod",
    "AmountPruningMethod",
    "UnstructuredPruningMethod",
    "StructuredPruningMethod",
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


class BasePruningMethod(ABC):
    """Abstract base of pruning methods: the extension point of arrayprune.

    A method is a small value object: what it scores, which units it removes and how
    many. Subclasses set ``PRUNING_TYPE`` and implement :meth:`compute_mask`; most new
    methods derive instead from :class:`UnstructuredPruningMethod` (implement
    :meth:`~UnstructuredPruningMethod.entry_scores`) or :class:`StructuredPruningMethod`
    (implement :meth:`~StructuredPruningMethod.channel_scores`), and get iterative and
    global pruning, schedules and every adapter for free once listed in
    :data:`arrayprune.METHODS`.

    Attributes
    ----------
    SCORE : arrayprune.method_parts.Score
        What ranks (magnitude, random draws, a channel norm, ...): whether it is
        elementwise (streamed, ranked across arrays), what it needs.
    PATTERN : arrayprune.method_parts.Pattern
        Which units go (entries, channels, N of M, blocks, ...), what the amount counts,
        which axis ``dim`` names, whether a container hands it the whole array.
    FLAGS : mapping of str to arrayprune.method_parts.Flag
        The command-line flag of each constructor parameter (merged along the MRO).
    PRUNING_TYPE : {'unstructured', 'structured', 'global'}
        PyTorch's name for what an iterative :class:`PruningContainer` hands the method:
        the entries still unpruned, the channels along ``dim`` still unpruned, or the
        whole array (the method then respects its ``default_mask`` itself); it is the
        pattern's ``pruning_type``.
    USES_SCORES : bool
        Whether the method ranks by the values it is given, so that verbs offer
        ``importance_scores`` (False for random methods and given masks).
    """

    PRUNING_TYPE: ClassVar[str]
    SCORE: ClassVar[_parts.Score]
    PATTERN: ClassVar[_parts.Pattern]
    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {}
    USES_SCORES: ClassVar[bool] = True
    _tensor_name: Any = None  # the name of the tensor pruned, set by adapters (PyTorch declares str)

    @abstractmethod
    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Return the mask for scores `t` on top of `default_mask`.

        Parameters
        ----------
        t : array
            Importance scores (the array itself unless other scores are given).
        default_mask : array or None
            Mask of earlier pruning, same shape as `t`; it is never modified. ``None``
            means nothing was pruned before (built-in methods then return
            :meth:`keep_mask`).

        Returns
        -------
        array
            The new mask: `default_mask` with more entries zeroed, same dtype.
        """

    def keep_mask(self, t: Array) -> Array:
        """The mask of this method alone on `t`: nothing pruned before.

        Built-in methods return a boolean mask without building a mask of ones first;
        the default implementation calls :meth:`compute_mask` with one.
        """
        return self.compute_mask(t, ones_mask(t))

    def remaining_mask(self, t: Array, mask: Array) -> Array:
        """Prune only what `mask` leaves, and return the combined mask.

        This is what :class:`PruningContainer` does with its newest method. Which part
        of `t` the method sees depends on ``PRUNING_TYPE``: the entries where `mask` is
        1 (``'unstructured'``), the channels along ``dim`` not yet entirely zero
        (``'structured'``) or all of `t` (``'global'``). The amount is relative to
        that part. This default gathers the part, as PyTorch does; built-in methods
        override it with masked selections that gather nothing.

        Parameters
        ----------
        t : array
            Importance scores, same shape as `mask`.
        mask : array
            Mask of earlier pruning; not modified.

        Returns
        -------
        array
            The combined mask, of the dtype of `mask`.
        """
        return _gathered_remaining_mask(self, t, mask)

    def prune(self, t: Array, default_mask: Array | None = None, importance_scores: Array | None = None) -> Array:
        """Return `t` multiplied by the mask computed from `importance_scores` (or `t`).

        Parameters
        ----------
        t : array
            Array to prune.
        default_mask : array, optional
            Mask of earlier pruning; none if omitted.
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
        if default_mask is None:
            mask = self.keep_mask(scores)
        else:
            check_same_shape(t, default_mask, "default_mask")
            mask = self.compute_mask(scores, default_mask=default_mask)
        xp = namespace(t)
        return t * xp.astype(mask, t.dtype)

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
        if len(methods) == 1 and isinstance(methods[0], Iterable) and not self._accepts(methods[0]):
            methods = tuple(methods[0])
        self._tensor_name = getattr(methods[0], "_tensor_name", None) if methods else None
        for method in methods:
            self.add_pruning_method(method)

    @classmethod
    def _accepts(cls, method: Any) -> bool:
        """Whether `method` may join a container: a method instance (the PyTorch adapter's
        container accepts PyTorch's methods only)."""
        return _is_method(method)

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
        if not self._accepts(method):
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

    :meth:`BasePruningMethod.remaining_mask` of arrayprune's methods; any other object
    with ``PRUNING_TYPE`` and ``compute_mask`` (PyTorch's own methods, say) gets the part
    it may prune gathered, as in PyTorch. Arguments and result as for
    :meth:`~BasePruningMethod.remaining_mask`, with the method first.

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
    if isinstance(method, BasePruningMethod):
        return method.remaining_mask(t, mask)
    return _gathered_remaining_mask(method, t, mask)


def _gathered_remaining_mask(method: Any, t: Array, mask: Array) -> Array:
    """PyTorch's combination: gather the part `method` may prune, scatter its mask back."""
    kind = getattr(method, "PRUNING_TYPE", None)
    if kind == "global":
        return method.compute_mask(t, default_mask=mask)
    xp = namespace(t, mask)
    if kind == "unstructured":
        slc = eligible(mask)
        partial = method.compute_mask(t[slc], default_mask=mask[slc])
        return xpx.at(mask, slc).set(xp.astype(partial, mask.dtype), copy=True, xp=xp)
    if kind != "structured":
        raise ValueError(f"Unrecognized PRUNING_TYPE {kind!r}")
    if not hasattr(method, "dim"):
        raise AttributeError('Pruning methods of PRUNING_TYPE "structured" need to have the attribute `dim` defined.')
    _amount.validate_structured_pruning(t.shape)
    dim = _amount.normalize_dim(t.shape, method.dim)
    remaining = remaining_channels(mask, dim)
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


def remaining_channels(mask: Array, dim: int) -> Array:
    """Channels along `dim` not yet entirely pruned (their mask does not sum to 0)."""
    xp = namespace(mask)
    others = tuple(d for d in range(mask.ndim) if d != dim)
    if is_bool(mask):
        return xp.any(mask, axis=others)
    return xp.sum(mask, axis=others) != 0


def available_count(arrays: list[Array], eligible_masks: list[Array | None]) -> int | None:
    """Number of entries that may still be pruned across `arrays`.

    None if an eligibility mask is traced by ``jax.jit``: the number is then unknown.
    """
    total = 0
    for a, e in zip(arrays, eligible_masks, strict=True):
        count = size(a) if e is None else known_count(e)
        if count is None:
            return None
        total += count
    return total


def channel_keep_to_mask(default_mask: Array, keep: Array, dim: int) -> Array:
    """Zero the channels of `default_mask` along `dim` where the 1-D `keep` is False."""
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
# The extension contract: methods that prune an amount of units
# --------------------------------------------------------------------------------------


class AmountPruningMethod(BasePruningMethod):
    """Base of methods that prune ``amount`` of some units (entries, channels, blocks).

    Subclasses say what a unit is with :meth:`units`; :meth:`count` turns the amount
    into a number of units. Such methods can follow sparsity schedules
    (:func:`~arrayprune.prune_to_sparsity`), which build them with an integer amount.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the units to prune, or their number.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """

    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {
        "amount": _parts.Flag("--amount", float, "fraction (0..1) of the units to prune, or their number if > 1"),
    }

    def __init__(self, amount: int | float):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount

    def count(self, available: int | None) -> int:
        """Number of units to prune among `available` ones.

        Parameters
        ----------
        available : int or None
            Units that may be pruned; None if unknown, as inside ``jax.jit`` when a mask
            of earlier pruning says which units remain. An integer amount is then taken
            as it is, unchecked: if it exceeds the units remaining, all of them are pruned.

        Raises
        ------
        ValueError
            If an integer amount exceeds `available`.
        TypeError
            If `available` is None and the amount is a fraction of it.
        """
        if available is None:
            if _amount.is_count(self.amount):
                return int(self.amount)
            raise TypeError(DATA_DEPENDENT)
        nparams = _amount.compute_nparams_toprune(self.amount, available)
        _amount.validate_pruning_amount(nparams, available)
        return nparams

    @abstractmethod
    def units(self, t: Array, mask: Array | None = None) -> tuple[int, int]:
        """How many units `t` has, and how many of them `mask` prunes already.

        Parameters
        ----------
        t : array
            The array (only its shape matters).
        mask : array, optional
            Mask of earlier pruning; None if nothing was pruned.

        Returns
        -------
        tuple of int
            ``(units, pruned)``.
        """


class UnstructuredPruningMethod(AmountPruningMethod):
    """Base of methods that prune the entries of smallest score.

    A subclass implements :meth:`entry_scores`; ranking, ties, iterative pruning
    (amount relative to the entries still unpruned) and global pruning across arrays
    come from here.
    """

    PRUNING_TYPE = "unstructured"
    SCORE: ClassVar[_parts.Score] = _parts.Score("entry scores", elementwise=False)
    PATTERN: ClassVar[_parts.Pattern] = _parts.UNSTRUCTURED

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "entry_scores" in cls.__dict__ and "SCORE" not in cls.__dict__:
            # Its own scores rank, not an inherited score's: unknown unless it declares them.
            cls.SCORE = _parts.Score("entry scores", elementwise=False)

    def entry_scores(self, arrays: list[Array]) -> list[Array]:
        """Scores of the entries of each array: entries of smallest ``|score|`` go first.

        Parameters
        ----------
        arrays : list of arrays
            Importance scores, one array per tensor pruned together.

        Returns
        -------
        list of arrays
            One array per input, same shapes. The default ranks by magnitude (returns
            `arrays` themselves).
        """
        return arrays

    def keep_masks(self, scores: list[Array], eligible_masks: list[Array | None]) -> list[Array]:
        """Boolean keep masks pruning ``amount`` of the eligible entries of all `scores`.

        Parameters
        ----------
        scores : list of arrays
            Importance scores, ranked together as if concatenated.
        eligible_masks : list of (boolean array or None)
            Per array, the entries that may be pruned; None for all.

        Returns
        -------
        list of arrays
            Boolean masks, False exactly at the pruned entries.
        """
        k = self.drop_count(scores, eligible_masks)
        return smallest_magnitude_keep(self.entry_scores(scores), k, eligible_masks)

    def drop_count(self, scores: list[Array], eligible_masks: list[Array | None], *, defer: bool = True) -> Any:
        """How many entries of `scores` to prune, as the selection takes it.

        The number, from the eligible entries counted here; or, for lazy (Dask) arrays
        with eligibility masks and `defer` true, :meth:`count` itself, which the
        selection applies to the count its first pass makes (counting here would cost a
        graph execution of its own).
        """
        if defer and defers_count(scores, eligible_masks):
            return self.count
        return self.count(available_count(scores, eligible_masks))

    def keep_mask(self, t: Array) -> Array:
        return self.keep_masks([t], [None])[0]

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Mask pruning ``amount`` of all entries of `t`, on top of `default_mask`.

        As in PyTorch, every entry is ranked; :meth:`remaining_mask` ranks only those
        `default_mask` leaves.
        """
        keep = self.keep_mask(t)
        if default_mask is None:
            return keep
        check_same_shape(t, default_mask, "default_mask")
        return apply_keep(default_mask, keep)

    def remaining_mask(self, t: Array, mask: Array) -> Array:
        return apply_keep(mask, self.keep_masks([t], [eligible(mask)])[0])

    def units(self, t: Array, mask: Array | None = None) -> tuple[int, int]:
        n = size(t)
        return n, 0 if mask is None else n - count_true(eligible(mask))


class StructuredPruningMethod(AmountPruningMethod):
    """Base of methods that prune whole channels along ``dim``, those of smallest score.

    A subclass implements :meth:`channel_scores`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Axis along which channels are defined.
    """

    PRUNING_TYPE = "structured"
    SCORE: ClassVar[_parts.Score] = _parts.Score("channel scores", elementwise=False)
    PATTERN: ClassVar[_parts.Pattern] = _parts.CHANNELS
    FLAGS: ClassVar[Mapping[str, _parts.Flag]] = {
        "dim": _parts.Flag("--dim", int, "the axis of the channels (default: each weight's output axis)")
    }

    def __init__(self, amount: int | float, dim: int = -1):
        super().__init__(amount)
        self.dim = dim

    def channel_scores(self, t: Array, dim: int) -> Array:
        """One score per channel of `t` along `dim` (a 1-D array); smallest pruned first."""
        raise NotImplementedError

    def checked_dim(self, t: Array) -> int:
        """``dim`` as a non-negative axis of `t`, which must be at least 2-D.

        Raises
        ------
        ValueError
            If `t` has fewer than two dimensions.
        IndexError
            If ``dim`` is out of range.
        """
        _amount.validate_structured_pruning(t.shape)
        return _amount.normalize_dim(t.shape, self.dim)

    def keep_channels(self, t: Array, dim: int, k: int, remaining: Array | None) -> Array:
        """Boolean keep vector over the channels of `t` along `dim`, False at the `k` pruned.

        Parameters
        ----------
        t : array
            Importance scores.
        dim : int
            The channel axis, non-negative.
        k : int
            How many channels to prune, at least 1.
        remaining : boolean array or None
            The channels that may be pruned (None: all).

        Returns
        -------
        array
            One boolean per channel. The default prunes the `k` of smallest
            :meth:`channel_scores`, ties by position.
        """
        return smallest_magnitude_keep([self.channel_scores(t, dim)], k, [remaining])[0]

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        """Mask pruning ``amount`` of all channels of `t`, on top of `default_mask`."""
        return self._prune_channels(t, mask_or_ones(t, default_mask), only_remaining=False)

    def remaining_mask(self, t: Array, mask: Array) -> Array:
        check_same_shape(t, mask, "default_mask")
        return self._prune_channels(t, mask, only_remaining=True)

    def _prune_channels(self, t: Array, mask: Array, only_remaining: bool) -> Array:
        dim = self.checked_dim(t)
        remaining = remaining_channels(mask, dim) if only_remaining else None
        k = self.count(t.shape[dim] if remaining is None else known_count(remaining))
        if k == 0:
            return mask
        return channel_keep_to_mask(mask, self.keep_channels(t, dim, k, remaining), dim)

    def units(self, t: Array, mask: Array | None = None) -> tuple[int, int]:
        check_known_shape(t)
        dim = _amount.normalize_dim(t.shape, self.dim)
        n = t.shape[dim]
        return n, 0 if mask is None else n - count_true(remaining_channels(mask, dim))


# --------------------------------------------------------------------------------------
# Built-in methods
# --------------------------------------------------------------------------------------


_RANDOM_FLAGS: Mapping[str, _parts.Flag] = {
    "seed": _parts.Flag("--seed", int, "seed of the random methods (each tensor gets its own stream)"),
    "generator": _parts.NO_FLAG,
}


class Identity(BasePruningMethod):
    """A method that prunes nothing: its mask is the default mask."""

    PRUNING_TYPE = "unstructured"
    SCORE: ClassVar[_parts.Score] = _parts.NOTHING
    PATTERN: ClassVar[_parts.Pattern] = _parts.UNSTRUCTURED
    USES_SCORES = False

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        return mask_or_ones(t, default_mask)

    def remaining_mask(self, t: Array, mask: Array) -> Array:
        return mask


class L1Unstructured(UnstructuredPruningMethod):
    """Prune the (currently unpruned) entries of smallest absolute value.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayprune as ap
    >>> ap.L1Unstructured(amount=2).keep_mask(np.array([0.3, -0.1, 0.2, 0.0]))
    array([ True, False,  True, False])
    """

    SCORE: ClassVar[_parts.Score] = _parts.MAGNITUDE


class RandomUnstructured(UnstructuredPruningMethod):
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

    SCORE: ClassVar[_parts.Score] = _parts.RANDOM
    FLAGS = _RANDOM_FLAGS
    USES_SCORES = False

    def __init__(self, amount: int | float, *, seed: int | None = None, generator: Any = None):
        super().__init__(amount)
        check_random_source(seed, generator)
        self.seed = seed
        self.generator = generator

    def entry_scores(self, arrays: list[Array]) -> list[Array]:
        shapes = [tuple(a.shape) for a in arrays]
        return uniform_many(arrays, shapes, seed=self.seed, generator=self.generator)


class RandomStructured(StructuredPruningMethod):
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

    SCORE: ClassVar[_parts.Score] = _parts.RANDOM
    FLAGS = _RANDOM_FLAGS
    USES_SCORES = False

    def __init__(self, amount: int | float, dim: int = -1, *, seed: int | None = None, generator: Any = None):
        super().__init__(amount, dim)
        check_random_source(seed, generator)
        self.seed = seed
        self.generator = generator

    def channel_scores(self, t: Array, dim: int) -> Array:
        return uniform_like(t, (t.shape[dim],), seed=self.seed, generator=self.generator)


class LnStructured(StructuredPruningMethod):
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

    SCORE: ClassVar[_parts.Score] = _parts.CHANNEL_NORM
    FLAGS = {"n": _parts.Flag("--n", float, "order of the channel norm (1, 2, inf, fro, ...)")}

    def __init__(self, amount: int | float, n: Any, dim: int = -1):
        super().__init__(amount, dim)
        self.n = n

    def channel_scores(self, t: Array, dim: int) -> Array:
        return channel_norms(t, self.n, dim)


class CustomFromMask(BasePruningMethod):
    """Prune with a precomputed mask (multiplied into the default mask).

    Parameters
    ----------
    mask : array
        The mask; non-zero entries are kept.
    """

    PRUNING_TYPE = "global"
    SCORE: ClassVar[_parts.Score] = _parts.GIVEN_MASK
    PATTERN: ClassVar[_parts.Pattern] = _parts.GIVEN
    FLAGS = {"mask": _parts.NO_FLAG}
    USES_SCORES = False

    def __init__(self, mask: Array):
        self.mask = mask

    def compute_mask(self, t: Array, default_mask: Array | None) -> Array:
        default_mask = mask_or_ones(t, default_mask)
        check_same_shape(default_mask, self.mask, "mask")
        xp = namespace(default_mask)
        custom = self.mask
        if namespace(custom) is not xp:
            custom = xp.asarray(custom, device=apc.device(default_mask))
        if is_bool(default_mask):
            return default_mask & xp.astype(custom, xp.bool)
        return default_mask * xp.astype(custom, default_mask.dtype)
