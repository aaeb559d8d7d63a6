"""The method classes and their verbs: one of each per entry of :data:`arrayprune.METHODS`.

Each class derives from :class:`~arrayprune.adapters.torch._base.CoreMethod` (its masks
come from the core class ``_CORE``) and from PyTorch's class of the same name where
there is one, keeping PyTorch's signatures (extended with the core's keyword-only
parameters, such as ``seed``). The code below the marker is written by
``tools/write_verbs.py``; a test keeps it in step with the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

import arrayprune as ap

from ._base import CoreMethod, apply_method, core_parameter, make_core
from ._streams import PyTorchStreamRandomStructured, PyTorchStreamRandomUnstructured

Array = Any

# <verbs>
# Written by tools/write_verbs.py from arrayprune.METHODS: edit the table or the class, then rerun it.

class Identity(CoreMethod, _tprune.Identity):
    """A method that prunes nothing: its mask is the default mask.

    A subclass of :class:`torch.nn.utils.prune.Identity`; masks computed by
    :class:`arrayprune.Identity`.
    """

    PRUNING_TYPE = "unstructured"
    _CORE = ap.Identity
    _PARAMS = ()

    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        self._core = make_core(type(self), args, kwargs)

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str) -> Any:  # type: ignore[override]
        """Prune ``module.<name>`` as :func:`identity`; return the hook installed."""
        return apply_method(module, name, cls(), None)


class RandomUnstructured(CoreMethod, _tprune.RandomUnstructured):
    """Prune (currently unpruned) entries chosen uniformly at random.

    A subclass of :class:`torch.nn.utils.prune.RandomUnstructured`; masks computed by
    :class:`arrayprune.RandomUnstructured`. Without `seed` or `generator`, draws from PyTorch's
    global generator exactly as PyTorch does.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    """

    PRUNING_TYPE = "unstructured"
    _CORE = ap.RandomUnstructured
    _STREAM = PyTorchStreamRandomUnstructured
    _PARAMS = ("amount", "seed", "generator")
    amount = core_parameter("amount")
    seed = core_parameter("seed")
    generator = core_parameter("generator")

    def __init__(self, amount: int | float, *, seed: int | None = None, generator: Any = None) -> None:
        self._core = make_core(type(self), (), {"amount": amount, "seed": seed, "generator": generator})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        *,
        seed: int | None = None,
        generator: Any = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`random_unstructured`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount, seed=seed, generator=generator), None)


class L1Unstructured(CoreMethod, _tprune.L1Unstructured):
    """Prune the (currently unpruned) entries of smallest absolute value.

    A subclass of :class:`torch.nn.utils.prune.L1Unstructured`; masks computed by
    :class:`arrayprune.L1Unstructured`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    """

    PRUNING_TYPE = "unstructured"
    _CORE = ap.L1Unstructured
    _PARAMS = ("amount",)
    amount = core_parameter("amount")

    def __init__(self, amount: int | float) -> None:
        self._core = make_core(type(self), (), {"amount": amount})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        importance_scores: Any = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`l1_unstructured`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount), importance_scores)


class RandomStructured(CoreMethod, _tprune.RandomStructured):
    """Prune whole (currently unpruned) channels chosen uniformly at random.

    A subclass of :class:`torch.nn.utils.prune.RandomStructured`; masks computed by
    :class:`arrayprune.RandomStructured`. Without `seed` or `generator`, draws from PyTorch's
    global generator exactly as PyTorch does.

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

    PRUNING_TYPE = "structured"
    _CORE = ap.RandomStructured
    _STREAM = PyTorchStreamRandomStructured
    _PARAMS = ("amount", "dim", "seed", "generator")
    amount = core_parameter("amount")
    dim = core_parameter("dim")
    seed = core_parameter("seed")
    generator = core_parameter("generator")

    def __init__(self, amount: int | float, dim: int = -1, *, seed: int | None = None, generator: Any = None) -> None:
        self._core = make_core(type(self), (), {"amount": amount, "dim": dim, "seed": seed, "generator": generator})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        dim: int = -1,
        *,
        seed: int | None = None,
        generator: Any = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`random_structured`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount, dim=dim, seed=seed, generator=generator), None)


class LnStructured(CoreMethod, _tprune.LnStructured):
    """Prune whole (currently unpruned) channels of smallest L``n`` norm.

    A subclass of :class:`torch.nn.utils.prune.LnStructured`; masks computed by
    :class:`arrayprune.LnStructured`.

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

    PRUNING_TYPE = "structured"
    _CORE = ap.LnStructured
    _PARAMS = ("amount", "n", "dim")
    amount = core_parameter("amount")
    n = core_parameter("n")
    dim = core_parameter("dim")

    def __init__(self, amount: int | float, n: Any, dim: int = -1) -> None:
        self._core = make_core(type(self), (), {"amount": amount, "n": n, "dim": dim})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        n: Any,
        dim: int,
        importance_scores: Any = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`ln_structured`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount, n=n, dim=dim), importance_scores)


class CustomFromMask(CoreMethod, _tprune.CustomFromMask):
    """Prune with a precomputed mask (multiplied into the default mask).

    A subclass of :class:`torch.nn.utils.prune.CustomFromMask`; masks computed by
    :class:`arrayprune.CustomFromMask`.

    Parameters
    ----------
    mask : array
        The mask; non-zero entries are kept.
    """

    PRUNING_TYPE = "global"
    _CORE = ap.CustomFromMask
    _PARAMS = ("mask",)
    _SHAPED = ("mask",)
    mask = core_parameter("mask")

    def __init__(self, mask: Array) -> None:
        self._core = make_core(type(self), (), {"mask": mask})

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, mask: Array) -> Any:  # type: ignore[override]
        """Prune ``module.<name>`` as :func:`custom_from_mask`; return the hook installed."""
        return apply_method(module, name, cls(mask=mask), None)


class NMStructured(CoreMethod):
    """Prune `n` of every `m` consecutive entries along `dim` (2:4 by default).

    Not in :mod:`torch.nn.utils.prune`; masks computed by :class:`arrayprune.NMStructured`.

    Parameters
    ----------
    n : int, default 2
        Entries pruned per group.
    m : int, default 4
        Group length.
    dim : int, default -1
        Axis along which groups run (the input dimension of a linear weight is -1).
    """

    PRUNING_TYPE = "global"
    _CORE = ap.NMStructured
    _PARAMS = ("n", "m", "dim")
    n = core_parameter("n")
    m = core_parameter("m")
    dim = core_parameter("dim")

    def __init__(self, n: int = 2, m: int = 4, dim: int = -1) -> None:
        self._core = make_core(type(self), (), {"n": n, "m": m, "dim": dim})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        n: int = 2,
        m: int = 4,
        dim: int = -1,
        importance_scores: Array | None = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`nm_structured`; return the hook installed."""
        return apply_method(module, name, cls(n=n, m=m, dim=dim), importance_scores)


class BlockUnstructured(CoreMethod):
    """Prune whole blocks of a given shape, those of smallest norm first.

    Not in :mod:`torch.nn.utils.prune`; masks computed by :class:`arrayprune.BlockUnstructured`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean (positive, or ``inf``).
    """

    PRUNING_TYPE = "global"
    _CORE = ap.BlockUnstructured
    _PARAMS = ("amount", "block_shape", "n")
    amount = core_parameter("amount")
    block_shape = core_parameter("block_shape")
    n = core_parameter("n")

    def __init__(self, amount: int | float, block_shape: tuple[int, ...], n: float = 1) -> None:
        self._core = make_core(type(self), (), {"amount": amount, "block_shape": block_shape, "n": n})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        block_shape: tuple[int, ...],
        n: float = 1,
        importance_scores: Array | None = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`block_unstructured`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount, block_shape=block_shape, n=n), importance_scores)


class Wanda(CoreMethod):
    """Prune ``amount`` of the entries of every output unit: those of smallest score.

    Not in :mod:`torch.nn.utils.prune`; masks computed by :class:`arrayprune.Wanda`.

    Parameters
    ----------
    amount : int or float
        Per output unit, the fraction in ``[0, 1]`` of its entries to prune, or their
        number. Inside a container (iterative pruning), of its entries still unpruned.
    dim : int, default 0
        The output axis of the weight.
    """

    PRUNING_TYPE = "global"
    _CORE = ap.Wanda
    _PARAMS = ("amount", "dim")
    amount = core_parameter("amount")
    dim = core_parameter("dim")

    def __init__(self, amount: int | float, dim: int = 0) -> None:
        self._core = make_core(type(self), (), {"amount": amount, "dim": dim})

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        dim: int = 0,
        importance_scores: Array | None = None,
    ) -> Any:
        """Prune ``module.<name>`` as :func:`wanda`; return the hook installed."""
        return apply_method(module, name, cls(amount=amount, dim=dim), importance_scores)


def identity(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`Identity` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    """
    apply_method(module, name, Identity(), None)
    return module


def random_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`RandomUnstructured` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    """
    apply_method(module, name, RandomUnstructured(amount, seed=seed, generator=generator), None)
    return module


def l1_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    importance_scores: Any = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`L1Unstructured` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.
    """
    apply_method(module, name, L1Unstructured(amount), importance_scores)
    return module


def random_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    dim: int,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`RandomStructured` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Axis along which channels are defined.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    """
    apply_method(module, name, RandomStructured(amount, dim, seed=seed, generator=generator), None)
    return module


def ln_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    n: Any,
    dim: int,
    importance_scores: Any = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`LnStructured` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm` (see
        :func:`arrayprune.norms.channel_norms`).
    dim : int, default -1
        Axis along which channels are defined.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.
    """
    apply_method(module, name, LnStructured(amount, n, dim), importance_scores)
    return module


def custom_from_mask(module: torch.nn.Module, name: str, mask: Array) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`CustomFromMask` (what remains of it); return `module`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    mask : array
        The mask; non-zero entries are kept.
    """
    apply_method(module, name, CustomFromMask(mask), None)
    return module


def nm_structured(
    module: torch.nn.Module,
    name: str,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    importance_scores: Array | None = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`NMStructured` (what remains of it); return `module`.

    Not in :mod:`torch.nn.utils.prune`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    n : int, default 2
        Entries pruned per group.
    m : int, default 4
        Group length.
    dim : int, default -1
        Axis along which groups run (the input dimension of a linear weight is -1).
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.
    """
    apply_method(module, name, NMStructured(n, m, dim), importance_scores)
    return module


def block_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    importance_scores: Array | None = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`BlockUnstructured` (what remains of it); return `module`.

    Not in :mod:`torch.nn.utils.prune`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean (positive, or ``inf``).
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.
    """
    apply_method(module, name, BlockUnstructured(amount, block_shape, n), importance_scores)
    return module


def wanda(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    dim: int = 0,
    importance_scores: Array | None = None,
) -> torch.nn.Module:
    """Prune ``module.<name>`` with :class:`Wanda` (what remains of it); return `module`.

    Not in :mod:`torch.nn.utils.prune`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Per output unit, the fraction in ``[0, 1]`` of its entries to prune, or their
        number. Inside a container (iterative pruning), of its entries still unpruned.
    dim : int, default 0
        The output axis of the weight.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.
    """
    apply_method(module, name, Wanda(amount, dim), importance_scores)
    return module


CLASSES: dict[str, type[CoreMethod]] = {
    "identity": Identity,
    "random_unstructured": RandomUnstructured,
    "l1_unstructured": L1Unstructured,
    "random_structured": RandomStructured,
    "ln_structured": LnStructured,
    "custom_from_mask": CustomFromMask,
    "nm_structured": NMStructured,
    "block_unstructured": BlockUnstructured,
    "wanda": Wanda,
}
VERBS: dict[str, Callable[..., torch.nn.Module]] = {
    "identity": identity,
    "random_unstructured": random_unstructured,
    "l1_unstructured": l1_unstructured,
    "random_structured": random_structured,
    "ln_structured": ln_structured,
    "custom_from_mask": custom_from_mask,
    "nm_structured": nm_structured,
    "block_unstructured": block_unstructured,
    "wanda": wanda,
}
__all__ = [
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "NMStructured",
    "BlockUnstructured",
    "Wanda",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "wanda",
]
# </verbs>
