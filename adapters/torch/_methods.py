"""The built-in pruning methods: subclasses of PyTorch's, with masks computed by the core."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.methods as _core
import arrayprune.patterns as _core_patterns
from arrayprune import amount as _amount
from arrayprune.rng import check_random_source as _check_random_source

from ._reparam import BasePruningMethod, _register_core_backed
from ._streams import _PyTorchStreamRandomStructured, _PyTorchStreamRandomUnstructured
from ._tensors import _check_shape, _detached, _run_core


class Identity(BasePruningMethod, _tprune.Identity):
    """A method that prunes nothing: the mask is the default mask (ones at first)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` itself."""
        return default_mask

    def _core_method(self) -> Any:
        return _core.Identity()

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str):  # type: ignore[override]
        """Add the pruning reparametrization to ``module.<name>`` without pruning anything.

        Arguments as in :func:`identity`; returns the forward pre-hook installed.
        """
        return super().apply(module, name)


def _set_random_source(method: Any, seed: int | None, generator: torch.Generator | None) -> None:
    """Check and store the ``seed`` / ``generator`` of a random method (not in PyTorch)."""
    _check_random_source(seed, generator)
    method.seed = seed
    method.generator = generator


def _random_core_method(method: Any, pytorch_stream: type, core_class: type, *args: Any) -> Any:
    """The core method of a random `method`: PyTorch's stream unseeded, arrayprune's seeded."""
    if method.seed is None and method.generator is None:
        return pytorch_stream(*args)
    return core_class(*args, seed=method.seed, generator=method.generator)


class RandomUnstructured(BasePruningMethod, _tprune.RandomUnstructured):
    """Prune (currently unpruned) entries chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed of a fresh generator on the tensor's device, for reproducible masks.
    generator : torch.Generator, optional
        Generator to draw from. With neither `seed` nor `generator`, the draws and the
        mask are exactly PyTorch's (``torch.rand_like`` of the entries in play on the
        global generator, ``torch.topk``), so ``torch.manual_seed`` gives PyTorch's mask.

    Raises
    ------
    TypeError
        If `amount` is not a number, or both `seed` and `generator` are given.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float, *, seed: int | None = None, generator: torch.Generator | None = None):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount
        _set_random_source(self, seed, generator)

    def _core_method(self) -> Any:
        return _random_core_method(self, _PyTorchStreamRandomUnstructured, _core.RandomUnstructured, self.amount)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of all entries of `t` zeroed at random.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune (only its shape and device matter).
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            New mask of the dtype of `default_mask`.
        """
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining entries of ``module.<name>`` at random.

        Arguments as in :func:`random_unstructured`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, seed=seed, generator=generator)


class L1Unstructured(BasePruningMethod, _tprune.L1Unstructured):
    """Prune the (currently unpruned) entries of smallest absolute value.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.

    Notes
    -----
    Among entries of equal magnitude, the lowest flat index is pruned first.
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount

    def _core_method(self) -> Any:
        return _core.L1Unstructured(self.amount)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the ``amount`` entries of smallest ``|t|`` zeroed.

        All entries of `t` are ranked (inside a :class:`PruningContainer`, only those
        still unpruned are).

        Parameters
        ----------
        t : torch.Tensor
            Importance scores.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            New mask of the dtype of `default_mask`.

        Raises
        ------
        ValueError
            If an integer amount exceeds the number of entries.
        """
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls, module: torch.nn.Module, name: str, amount: int | float, importance_scores: torch.Tensor | None = None
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining entries of ``module.<name>`` of smallest magnitude.

        Arguments as in :func:`l1_unstructured`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


def _structured_mask(core_method: Any, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
    """The structured mask of `core_method`, as PyTorch gives it.

    `default_mask` itself if nothing was pruned, else a new mask of the dtype of `t`.
    """
    given = _detached(default_mask)
    with torch.no_grad():
        mask = core_method.compute_mask(_detached(t), given)
    if mask is given:
        return default_mask
    return mask if mask.dtype == t.dtype else mask.to(dtype=t.dtype)


class RandomStructured(BasePruningMethod, _tprune.RandomStructured):
    """Prune whole (currently unpruned) channels chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Dimension along which channels are defined.
    seed : int, optional
        Seed of a fresh generator on the tensor's device, for reproducible masks.
    generator : torch.Generator, optional
        Generator to draw from. With neither `seed` nor `generator`, the draws and the
        mask are exactly PyTorch's (``torch.rand(nchannels)`` on the global generator,
        ``torch.kthvalue``), so ``torch.manual_seed`` gives PyTorch's mask.

    Raises
    ------
    TypeError
        If `amount` is not a number, or both `seed` and `generator` are given.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """

    PRUNING_TYPE = "structured"

    def __init__(
        self, amount: int | float, dim: int = -1, *, seed: int | None = None, generator: torch.Generator | None = None
    ):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount
        self.dim = dim
        _set_random_source(self, seed, generator)

    def _core_method(self) -> Any:
        return _random_core_method(self, _PyTorchStreamRandomStructured, _core.RandomStructured, self.amount, self.dim)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of the channels of `t` zeroed at random.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune, at least 2-D.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            `default_mask` itself if nothing is pruned, else a new mask of the dtype of
            `t` (as in PyTorch).

        Raises
        ------
        ValueError
            If `t` has fewer than two dimensions, or an integer amount exceeds the
            number of channels.
        IndexError
            If ``dim`` is out of range.
        """
        return _structured_mask(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        dim: int = -1,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining channels of ``module.<name>`` at random.

        Arguments as in :func:`random_structured`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, dim=dim, seed=seed, generator=generator)


class LnStructured(BasePruningMethod, _tprune.LnStructured):
    """Prune whole (currently unpruned) channels of smallest L\\ ``n`` norm.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int, default -1
        Dimension along which channels are defined.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.

    Notes
    -----
    Among channels of equal norm, the lowest index is pruned first.
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: int | float, n: Any, dim: int = -1):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def _core_method(self) -> Any:
        return _core.LnStructured(self.amount, self.n, self.dim)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the ``amount`` channels of smallest norm zeroed.

        Parameters
        ----------
        t : torch.Tensor
            Importance scores, at least 2-D.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            `default_mask` itself if nothing is pruned, else a new mask of the dtype of
            `t` (as in PyTorch).

        Raises
        ------
        ValueError
            If `t` has fewer than two dimensions, `n` is not a valid order, or an integer
            amount exceeds the number of channels.
        IndexError
            If ``dim`` is out of range.
        """
        return _structured_mask(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        n: Any,
        dim: int,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining channels of ``module.<name>`` of smallest norm.

        Arguments as in :func:`ln_structured`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod, _tprune.CustomFromMask):
    """Prune with a precomputed mask, multiplied into the default mask.

    Parameters
    ----------
    mask : torch.Tensor or array_like
        The mask; non-zero entries are kept. It is stored detached from autograd.
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: Any):
        mask = torch.as_tensor(mask)
        self.mask = mask.detach() if mask.requires_grad else mask

    def _core_method(self) -> Any:
        return _core.CustomFromMask(self.mask)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return ``default_mask * mask``, in the dtype of `default_mask`.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune (unused).
        default_mask : torch.Tensor
            Mask of earlier pruning; not modified.

        Returns
        -------
        torch.Tensor
            The new mask.

        Raises
        ------
        ValueError
            If the stored mask has another shape than `default_mask` (the error is an
            :class:`AssertionError` too).
        """
        _check_shape(default_mask, self.mask, "mask")
        custom = self.mask.to(device=default_mask.device)
        return _run_core(_core.CustomFromMask(custom), t, default_mask)

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, mask: Any):  # type: ignore[override]
        """Prune ``module.<name>`` with the precomputed `mask`.

        Arguments as in :func:`custom_from_mask`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, mask=mask)


class NMStructured(BasePruningMethod):
    """Prune `n` of every `m` consecutive entries along `dim` (2:4 by default).

    Not in :mod:`torch.nn.utils.prune`. Entries already pruned count first, so every group
    ends with at most ``m - n`` non-zeros; see :class:`arrayprune.NMStructured`.

    Parameters
    ----------
    n, m : int
        The pattern: `n` zeros in every group of `m`.
    dim : int, default -1
        Axis along which groups run (-1: the input features of a Linear weight).
    """

    PRUNING_TYPE = "global"

    def __init__(self, n: int = 2, m: int = 4, dim: int = -1):
        core = _core_patterns.NMStructured(n, m, dim)  # validates the pattern
        self.n, self.m, self.dim = core.n, core.m, dim

    def _core_method(self) -> Any:
        return _core_patterns.NMStructured(self.n, self.m, self.dim)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the pattern imposed (dtype of `default_mask`)."""
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        n: int = 2,
        m: int = 4,
        dim: int = -1,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Impose `n`:`m` sparsity on ``module.<name>``.

        Arguments as in :func:`nm_structured`; returns the forward pre-hook installed.
        """
        return super().apply(module, name, n=n, m=m, dim=dim, importance_scores=importance_scores)


class BlockUnstructured(BasePruningMethod):
    """Prune whole blocks of `block_shape`, those of smallest power-mean magnitude first.

    Not in :mod:`torch.nn.utils.prune`. Blocks align to the trailing dimensions; blocks
    already entirely pruned are not counted; see :class:`arrayprune.BlockUnstructured`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean scoring a block.
    """

    PRUNING_TYPE = "global"

    def __init__(self, amount: int | float, block_shape: tuple[int, ...], n: float = 1):
        core = _core_patterns.BlockUnstructured(amount, block_shape, n)
        self.amount, self.block_shape, self.n = amount, core.block_shape, n

    def _core_method(self) -> Any:
        return _core_patterns.BlockUnstructured(self.amount, self.block_shape, self.n)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of the remaining blocks zeroed."""
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        block_shape: tuple[int, ...],
        n: float = 1,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the blocks of ``module.<name>``.

        Arguments as in :func:`block_unstructured`; returns the forward pre-hook installed.
        """
        return super().apply(
            module, name, amount=amount, block_shape=block_shape, n=n, importance_scores=importance_scores
        )


_register_core_backed(
    Identity,
    RandomUnstructured,
    L1Unstructured,
    RandomStructured,
    LnStructured,
    CustomFromMask,
    NMStructured,
    BlockUnstructured,
)
