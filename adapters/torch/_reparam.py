"""The reparametrization: base class, container, and installing a method on a module.

Pruning ``module.<name>`` moves the parameter to ``<name>_orig``, registers the mask as
the buffer ``<name>_mask`` and installs the method as a forward pre-hook; a second method
on the same tensor joins the first in a :class:`PruningContainer`. A built-in, unpatched
method pruning a parameter of a plain module for the first time takes a fast path
(`_apply_fresh`); everything else runs inside a `_Transaction` that rolls the module back
if anything fails. :meth:`BasePruningMethod.remove` makes the pruning permanent.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.methods as _core

from ._rollback import _Transaction
from ._tensors import _detached, _free_name, _Parameter, _plain_module, _run_core, _scores_for, _to_dtype


class BasePruningMethod(_tprune.BasePruningMethod):
    """Abstract base of pruning methods acting on tensors of PyTorch modules.

    A subclass of :class:`torch.nn.utils.prune.BasePruningMethod`. Subclasses set
    ``PRUNING_TYPE`` (``'unstructured'``, ``'structured'`` with a ``dim`` attribute, or
    ``'global'``) and implement :meth:`compute_mask`. An instance installed on a module
    is its forward pre-hook: calling it with ``(module, inputs)`` recomputes
    ``module.<name>`` from ``<name>_orig`` and ``<name>_mask``.

    Methods
    -------
    compute_mask(t, default_mask)
        The mask for importance scores `t` on top of `default_mask` (abstract).
    apply(module, name, *args, importance_scores=None, **kwargs)
        Prune ``module.<name>`` with a new instance (class method).
    apply_mask(module)
        The pruned tensor ``<name>_mask * <name>_orig``.
    prune(t, default_mask=None, importance_scores=None)
        `t` multiplied by its mask.
    remove(module)
        Make the pruning of ``module.<name>`` permanent.
    """

    _tensor_name: str | None = None

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        """Recompute ``module.<name>`` as ``<name>_mask * <name>_orig`` (the pre-hook).

        Parameters
        ----------
        module : torch.nn.Module
            The module the method is installed on.
        inputs : tuple
            The positional inputs of the forward call (unused).
        """
        self._remember(module)
        setattr(module, self._tensor_name, self.apply_mask(module))

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        *args: Any,
        importance_scores: torch.Tensor | None = None,
        **kwargs: Any,
    ):
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)``, adding the reparametrization.

        On first pruning, the parameter moves to ``<name>_orig``, the mask becomes the
        buffer ``<name>_mask`` and the method is installed as a forward pre-hook. If the
        tensor is already pruned, the method joins the existing one(s) in a
        :class:`PruningContainer` and acts only on what is still unpruned. If anything
        fails, the module is left exactly as it was.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor to prune.
        name : str
            Name of the parameter within `module`.
        *args, **kwargs
            Arguments of the pruning method's constructor.
        importance_scores : torch.Tensor, optional
            Scores of the shape of the parameter ranking its entries; the parameter
            itself (its current, pruned value) if omitted.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook now installed: the new method, or the container holding
            it.

        Raises
        ------
        AssertionError
            If the tensor has more than one pruning hook.
        ValueError
            If `importance_scores` has another shape than the parameter (the error is an
            :class:`AssertionError` too), or the amount is invalid.
        TypeError
            If ``module.<name>`` is not a parameter.
        """
        return _apply(module, name, cls(*args, **kwargs), importance_scores)

    # -- bookkeeping ------------------------------------------------------------------

    def remove(self, module: torch.nn.Module) -> None:
        """Fold the mask into the original parameter and drop the reparametrization.

        ``<name>_orig`` (the same Parameter object) becomes ``module.<name>`` again, holding
        ``mask * orig``; ``<name>_orig`` and ``<name>_mask`` are removed. Pruning is not
        undone.

        Parameters
        ----------
        module : torch.nn.Module
            The module this method is installed on.
        """
        name = self._tensor_name
        params, buffers = module._parameters, module._buffers
        if name is None or name + "_orig" not in params or name + "_mask" not in buffers:
            super().remove(module)  # PyTorch's own checks and messages
            return
        orig = params[name + "_orig"]
        mask = buffers[name + "_mask"].detach()
        if mask.dtype != orig.dtype:
            mask = mask.to(dtype=orig.dtype)
        weight = mask * orig.detach()  # outside autograd
        module.__dict__.pop(name, None)
        orig.data = weight
        del params[name + "_orig"]
        del buffers[name + "_mask"]
        if _plain_module(module) and _free_name(module, name):
            params[name] = orig  # what Module.__setattr__ does, after its checks
        else:
            setattr(module, name, orig)  # e.g. RNNs, which refresh their flat weights

    def _remember(self, module: torch.nn.Module) -> None:
        """Keep a weak reference to the module this hook is installed on (for deepcopy)."""
        ref = self.__dict__.get("_module_ref")
        if ref is None or ref() is not module:
            self._module_ref = weakref.ref(module)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_module_ref", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict[int, Any]) -> BasePruningMethod:
        """Copy the method; when copied with its module, copy the pruned tensor too.

        ``module.<name>`` is ``<name>_mask * <name>_orig``, a tensor inside the autograd
        graph, which :func:`copy.deepcopy` refuses to copy. The hook is copied before
        that attribute (a module's hooks come first in its ``__dict__``), so it registers
        the copy in `memo`: the product of the copied mask and the copied parameter.
        """
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        ref = self.__dict__.get("_module_ref")
        module = ref() if ref is not None else None
        new_module = memo.get(id(module)) if module is not None else None
        if new_module is not None:
            _memoize_pruned_tensor(module, self._tensor_name, memo)
        new.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        if new_module is not None:
            new._module_ref = weakref.ref(new_module)
        return new

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={_short(v)}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}>"
    return repr(value)


def _memoize_pruned_tensor(module: torch.nn.Module, name: str | None, memo: dict[int, Any]) -> None:
    if name is None:
        return
    current = module.__dict__.get(name)
    if not isinstance(current, torch.Tensor) or current.is_leaf or id(current) in memo:
        return
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if orig is None or mask is None:
        return
    new_orig = copy.deepcopy(orig, memo)
    new_mask = copy.deepcopy(mask, memo)
    with torch.set_grad_enabled(current.requires_grad):
        memo[id(current)] = new_mask.to(dtype=new_orig.dtype) * new_orig
    memo.setdefault(id(memo), []).append(current)  # keep the id taken while memo lives


class PruningContainer(BasePruningMethod, _tprune.PruningContainer):
    """Sequence of pruning methods applied one after the other to the same tensor.

    A subclass of :class:`torch.nn.utils.prune.PruningContainer`. It may hold any
    pruning method, including PyTorch's and user-written ones.

    Parameters
    ----------
    *args : BasePruningMethod
        Methods already applied, oldest first, or a single iterable of them. The
        container acts on the tensor of the first one (``_tensor_name``).

    Notes
    -----
    :meth:`compute_mask` applies only the newest method, on what the ``default_mask``
    (the mask of the earlier methods) leaves: its remaining entries for an
    ``'unstructured'`` method, its remaining channels for a ``'structured'`` one, all
    of it for a ``'global'`` one. Built-in methods do this with the core's fast paths;
    other methods get the remaining part gathered, as in PyTorch.
    """

    def __init__(self, *args: Any):
        self._pruning_methods: tuple[Any, ...] = ()
        if len(args) == 1 and not isinstance(args[0], _tprune.BasePruningMethod) and isinstance(args[0], Iterable):
            args = tuple(args[0])
        if args and isinstance(args[0], _tprune.BasePruningMethod):
            self._tensor_name = getattr(args[0], "_tensor_name", None)
        for method in args:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: Any) -> None:
        """Append `method` to the container.

        Parameters
        ----------
        method : torch.nn.utils.prune.BasePruningMethod
            The method; ``None`` is ignored.

        Raises
        ------
        TypeError
            If `method` is not a pruning method.
        ValueError
            If `method` acts on another tensor than the container.
        """
        if method is None:
            return
        if not isinstance(method, _tprune.BasePruningMethod):
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if self._tensor_name != getattr(method, "_tensor_name", None):
            raise ValueError(
                f"Can only add pruning methods acting on the parameter named '{self._tensor_name}' "
                f"to PruningContainer {self}. Found '{getattr(method, '_tensor_name', None)}'"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx: Any) -> Any:
        return self._pruning_methods[idx]

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Apply the newest method to what `default_mask` leaves unpruned.

        Parameters
        ----------
        t : torch.Tensor
            Importance scores.
        default_mask : torch.Tensor
            Mask of the earlier methods, same shape; not modified.

        Returns
        -------
        torch.Tensor
            The combined mask, of the dtype of `t` (as in PyTorch).

        Raises
        ------
        IndexError
            If the container is empty, or a structured method's ``dim`` is out of range.
        ValueError
            If the method's ``PRUNING_TYPE`` is unknown.
        AttributeError
            If a structured method has no ``dim``.
        """
        if not self._pruning_methods:
            raise IndexError("PruningContainer holds no pruning method")
        method = self._pruning_methods[-1]
        with torch.no_grad():
            mask = _detached(default_mask).to(dtype=t.dtype)
            scores = _detached(t)
            core_method = _native_core_method(method)
            if isinstance(core_method, _core.Identity):
                return mask
            if isinstance(core_method, _core.CustomFromMask):
                return method.compute_mask(scores, mask)  # 'global': sees everything
            return _core.combine_masks(method if core_method is None else core_method, scores, mask)

    def __repr__(self) -> str:
        return f"PruningContainer{self._pruning_methods!r}"


# --------------------------------------------------------------------------------------
# Built-in methods: the ones whose masks the core computes
# --------------------------------------------------------------------------------------
#
# The classes are defined in ``_methods`` (they derive from BasePruningMethod) and
# registered here when that module is imported, before any of them can be used.

_CORE_BACKED: tuple[type, ...] = ()
_CORE_BACKED_SET: frozenset[type] = frozenset()
_NATIVE_COMPUTE_MASKS: frozenset[Any] = frozenset()


def _register_core_backed(*classes: type) -> None:
    """Declare `classes` built-in: methods whose own ``compute_mask`` the core stands for."""
    global _CORE_BACKED, _CORE_BACKED_SET, _NATIVE_COMPUTE_MASKS
    _CORE_BACKED = _CORE_BACKED + classes
    _CORE_BACKED_SET = frozenset(_CORE_BACKED)
    _NATIVE_COMPUTE_MASKS = frozenset(cls.__dict__["compute_mask"] for cls in _CORE_BACKED)


def _native_core_method(method: Any) -> Any:
    """The core method equivalent to `method`, or None if `method` is not a built-in.

    A built-in method whose ``compute_mask`` was replaced (overridden in a subclass,
    patched on the class or set on the instance) is treated as foreign, so that the
    replacement is what gets called.
    """
    cls = type(method)
    if cls not in _CORE_BACKED_SET and not isinstance(method, _CORE_BACKED):
        return None  # (the set spares the abstract-base-class check in the common case)
    if "compute_mask" in vars(method) or getattr(cls, "compute_mask", None) not in _NATIVE_COMPUTE_MASKS:
        return None
    return method._core_method()


# --------------------------------------------------------------------------------------
# Applying a method to a module
# --------------------------------------------------------------------------------------


def _pruning_hooks(module: torch.nn.Module, name: str) -> list[tuple[Any, Any]]:
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, _tprune.BasePruningMethod) and getattr(hook, "_tensor_name", None) == name
    ]


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _apply(
    module: torch.nn.Module,
    name: str,
    method: Any,
    importance_scores: torch.Tensor | None,
    precomputed: torch.Tensor | None = None,
) -> Any:
    """Install `method` on ``module.<name>``, all or nothing (see BasePruningMethod.apply).

    `precomputed` is the mask the hook would compute, already known (global pruning
    computes every mask at once, existing masks included): it becomes the buffer as it
    is, sparing the ones mask and the multiplication.
    """
    method._tensor_name = name
    if precomputed is None:
        hook = _apply_fresh(module, name, method, importance_scores)
        if hook is not None:
            return hook
    with _Transaction([module]):
        found = _pruning_hooks(module, name)
        if len(found) > 1:
            raise AssertionError(
                f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
                "Use a PruningContainer."
            )
        for key, _ in found:
            del module._forward_pre_hooks[key]
        old = found[0][1] if found else None

        if old is None:
            hook = method
        elif isinstance(old, PruningContainer):
            old.add_pruning_method(method)
            hook = old
        elif isinstance(old, _tprune.PruningContainer):
            # PyTorch's container: carry its methods over into one of ours.
            hook = PruningContainer(*old._pruning_methods, method)
            hook._tensor_name = name
        else:
            hook = PruningContainer(old)
            hook.add_pruning_method(method)

        orig = getattr(module, name)
        core = None
        importance_scores = _scores_for(orig, importance_scores, name)

        if old is None:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            fresh = precomputed is None and isinstance(orig, torch.Tensor)
            core = _native_core_method(hook) if fresh else None
            if isinstance(core, (_core.UnstructuredPruningMethod, _core.StructuredPruningMethod)):
                # A built-in, unpatched method on a fresh tensor: the core's boolean mask
                # is the whole answer, in the parameter's dtype as PyTorch has it.
                precomputed = _to_dtype(_run_core(core, importance_scores, None), orig.dtype)
            default_mask = torch.ones_like(orig) if precomputed is None else None
        elif precomputed is not None:
            old_mask = default_mask = None
        else:
            old_mask = getattr(module, name + "_mask").detach()
            if _native_core_method(hook[-1]) is None:
                # Foreign code may write into its default mask: give it a copy.
                default_mask = old_mask.clone(memory_format=torch.contiguous_format)
            else:
                default_mask = old_mask  # the core never writes into a default mask

        if precomputed is not None:
            mask = precomputed
        else:
            with torch.no_grad():
                mask = hook.compute_mask(_detached(importance_scores), default_mask=default_mask)
        if isinstance(mask, torch.Tensor) and precomputed is None:
            if mask.requires_grad:
                mask = mask.detach()
            if old is not None and _shares_memory(mask, old_mask):
                mask = mask.clone(memory_format=torch.contiguous_format)
        module.register_buffer(name + "_mask", mask)
        if core is not None and type(hook).apply_mask is _tprune.BasePruningMethod.apply_mask:
            pruned = mask * orig  # what apply_mask computes, without looking both up again
        else:
            pruned = hook.apply_mask(module)
        setattr(module, name, pruned)
        module.register_forward_pre_hook(hook)
    if isinstance(hook, BasePruningMethod):
        hook._remember(module)
    return hook


def _apply_fresh(module: torch.nn.Module, name: str, method: Any, importance_scores: torch.Tensor | None) -> Any:
    """`_apply` for the common case, or None where it does not apply.

    The common case: a built-in, unpatched method pruning a parameter for the first
    time, on a plain module (see `_plain_module`) where ``<name>_orig`` and
    ``<name>_mask`` are free. Everything that can fail (the checks, the mask) happens
    before the module is touched, so no rollback is needed; the writes that follow are
    those of ``register_parameter``, ``register_buffer`` and ``setattr`` after their
    checks, in the same order, so the state dict is ordered as PyTorch orders it.
    """
    d = module.__dict__
    params = d.get("_parameters")
    orig = params.get(name) if isinstance(params, dict) else None
    if type(orig) is not _Parameter or not _plain_module(module):
        return None
    core = _native_core_method(method)
    if not isinstance(core, (_core.UnstructuredPruningMethod, _core.StructuredPruningMethod)):
        return None
    orig_name, mask_name = name + "_orig", name + "_mask"
    if name in d or not (_free_name(module, orig_name) and _free_name(module, mask_name)):
        return None
    if _pruning_hooks(module, name):
        return None
    mask = _to_dtype(_run_core(core, _scores_for(orig, importance_scores, name), None), orig.dtype)

    params[orig_name] = orig
    del params[name]
    d["_buffers"][mask_name] = mask
    d["_non_persistent_buffers_set"].discard(mask_name)
    d[name] = mask * orig
    module.register_forward_pre_hook(method)
    method._remember(module)
    return method
