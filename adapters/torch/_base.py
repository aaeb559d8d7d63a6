"""The base classes (methods as forward pre-hooks, core-backed methods, the container) and
installing a method on ``module.<name>``: one path, restoring the module on any failure
(:func:`transaction`), and one fast path (the mask first, then direct writes)."""

from __future__ import annotations

import copy
import operator
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.methods as _core
from arrayprune.methods import combine_masks

from ._tensors import check_shape, detached, free_name, masked, plain_module, scores_for, to_dtype


class BasePruningMethod(_tprune.BasePruningMethod):
    """Abstract base of pruning methods, a :class:`torch.nn.utils.prune.BasePruningMethod`: set
    ``PRUNING_TYPE``, implement ``compute_mask(t, default_mask)``. An instance is its hook."""

    _tensor_name: str = None  # type: ignore[assignment]  # PyTorch's declaration; None until applied

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        self._remember(module)
        setattr(module, self._tensor_name, self.apply_mask(module))

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, *args: Any, importance_scores: Any = None, **kwargs: Any):
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)``; return the hook installed."""
        return apply_method(module, name, cls(*args, **kwargs), importance_scores)

    def remove(self, module: torch.nn.Module) -> None:
        """Write ``mask * orig`` into ``<name>_orig``, which becomes ``module.<name>`` again."""
        name = self._tensor_name
        params, buffers = module._parameters, module._buffers
        orig = None if name is None else params.get(name + "_orig")
        stored = None if name is None else buffers.get(name + "_mask")
        if name is None or orig is None or stored is None:
            return super().remove(module)  # PyTorch's own checks and messages
        mask = stored.detach()
        weight = masked(mask if mask.dtype == orig.dtype else mask.to(dtype=orig.dtype), orig.detach())
        module.__dict__.pop(name, None)
        orig.data = weight
        del params[name + "_orig"], buffers[name + "_mask"]
        if plain_module(module) and free_name(module, name):
            params[name] = orig  # what Module.__setattr__ does, after its checks
        else:
            setattr(module, name, orig)  # e.g. RNNs, which refresh their flat weights

    def _remember(self, module: torch.nn.Module) -> None:
        self.__dict__["_module_ref"] = weakref.ref(module)  # the module this hook is on, for deepcopy

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_module_ref"}

    def __deepcopy__(self, memo: dict[int, Any]) -> BasePruningMethod:
        # ``module.<name>`` is no leaf of the autograd graph, which deepcopy refuses. The hook
        # comes first in the module's __dict__: copied with it, it puts that tensor's copy in memo.
        new = memo[id(self)] = type(self).__new__(type(self))
        ref = self.__dict__.get("_module_ref")
        module = ref() if ref is not None else None
        if module is not None and id(module) in memo:
            _memoize_pruned_tensor(module, self._tensor_name, memo)
            new.__dict__["_module_ref"] = weakref.ref(memo[id(module)])
        new.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        return new

    def __repr__(self) -> str:
        names = getattr(self, "_PARAMS", None) or [k for k in vars(self) if not k.startswith("_")]
        values = [getattr(self, k, None) for k in names]
        shown = [f"<tensor {tuple(v.shape)} {v.dtype}>" if isinstance(v, torch.Tensor) else repr(v) for v in values]
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in zip(names, shown, strict=True))})"


def _memoize_pruned_tensor(module: torch.nn.Module, name: str | None, memo: dict[int, Any]) -> None:
    current = module.__dict__.get(name) if name is not None else None
    if name is None or not isinstance(current, torch.Tensor) or current.is_leaf or id(current) in memo:
        return
    orig, mask = module._parameters.get(name + "_orig"), module._buffers.get(name + "_mask")
    if orig is None or mask is None:
        return
    new_orig, new_mask = copy.deepcopy(orig, memo), copy.deepcopy(mask, memo)
    with torch.set_grad_enabled(current.requires_grad):
        memo[id(current)] = new_mask.to(dtype=new_orig.dtype) * new_orig
    memo.setdefault(id(memo), []).append(current)  # keep the id taken while memo lives


class CoreMethod(BasePruningMethod):
    """A method whose masks its core method ``_core`` computes, built once from the
    constructor's arguments (``_STREAM``, the PyTorch-stream variant, if unseeded). The
    constructor's parameters are properties reading it; assigning one rebuilds it."""

    _CORE: ClassVar[type]
    _STREAM: ClassVar[type | None] = None
    _PARAMS: ClassVar[tuple[str, ...]] = ()
    _SHAPED: ClassVar[tuple[str, ...]] = ()  # parameters that are tensors shaped like the pruned one

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """`default_mask` with this method's pruning of scores `t`, as PyTorch's."""
        return core_mask(self, t, default_mask)


def make_core(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if cls._STREAM is None and not cls._SHAPED:
        return cls._CORE(*args, **kwargs)
    stream = cls._STREAM is not None and kwargs.get("seed") is None and kwargs.get("generator") is None
    core = (cls._STREAM if stream else cls._CORE)(*args, **kwargs)
    for key in cls._SHAPED:
        value = getattr(core, key)  # a tensor keeps its device (not torch's default one)
        value = torch.as_tensor(value, device=value.device if isinstance(value, torch.Tensor) else None)
        setattr(core, key, value.detach() if value.requires_grad else value)
    return core


def core_parameter(key: str) -> property:
    def set_(self: Any, value: Any) -> None:  # a new core method, with the new value
        params = {k: getattr(self._core, k) for k in self._PARAMS if hasattr(self._core, k)}
        self._core = make_core(type(self), (), {**params, key: value})

    return property(operator.attrgetter("_core." + key), set_)


def core_of(method: Any) -> Any:
    """`method`'s core method if the core computes its masks, else None (foreign or patched)."""
    native = type(method).compute_mask is CoreMethod.compute_mask and "compute_mask" not in method.__dict__
    return method._core if native else None


def core_mask(method: Any, t: torch.Tensor, default_mask: Any, combine: bool = False) -> Any:
    """The mask of CoreMethod `method` on scores `t` as PyTorch's (`combine`: as a container's;
    no `default_mask`: the core's boolean keep mask; meta tensors: a meta mask)."""
    for key in method._SHAPED:
        check_shape(t, getattr(method, key), key)
    if t.is_meta or (default_mask is not None and default_mask.is_meta):
        return torch.empty(t.shape, dtype=torch.bool if default_mask is None else default_mask.dtype, device="meta")
    if default_mask is None:
        return method._core.compute_mask(t.detach(), None)
    given = detached(default_mask)
    if combine:
        return combine_masks(method._core, detached(t), given)
    mask = method._core.compute_mask(detached(t), given)
    if mask is given:
        return default_mask
    if method.PRUNING_TYPE == "structured" and mask.dtype != t.dtype:
        return mask.to(dtype=t.dtype)
    return mask


class PruningContainer(BasePruningMethod, _tprune.PruningContainer, _core.PruningContainer):
    """Methods applied in turn to a tensor, the newest to what the others left: a
    :class:`torch.nn.utils.prune.PruningContainer` and a :class:`arrayprune.PruningContainer`
    (whose construction and checks it has), combining by :func:`arrayprune.combine_masks`.

    Parameters
    ----------
    *args : BasePruningMethod
        Methods applied, oldest first, or one iterable of them (``None`` is ignored).
    """

    def __init__(self, *args: Any):
        _core.PruningContainer.__init__(self, *args)

    @classmethod
    def _accepts(cls, method: Any) -> bool:
        return isinstance(method, _tprune.BasePruningMethod)

    def add_pruning_method(self, method: Any) -> None:
        """Append `method`: TypeError if not a method, ValueError if of another tensor."""
        _core.PruningContainer.add_pruning_method(self, method)

    def compute_mask(self, t: torch.Tensor, default_mask: Any) -> torch.Tensor:
        """The newest method on what `default_mask` leaves, in the dtype of `t` (IndexError if empty)."""
        if not self._pruning_methods:
            raise IndexError("PruningContainer holds no pruning method")
        method = self._pruning_methods[-1]
        with torch.no_grad():
            mask = detached(default_mask).to(dtype=t.dtype)
            if core_of(method) is not None:
                return core_mask(method, t, mask, combine=True)
            return combine_masks(method, detached(t), mask)

    def __repr__(self) -> str:
        return f"PruningContainer{self._pruning_methods!r}"


# --------------------------------------------------------------------------------------
# Installing a method on a module
# --------------------------------------------------------------------------------------

_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _record(module: torch.nn.Module) -> list[tuple[Any, Any]]:
    """(object, contents) to put back in place: attributes, parameters, buffers, hooks (their
    handles stay valid), an RNN's ``_flat_weights``, the methods of pruning containers."""
    d = module.__dict__
    saved: list[tuple[Any, Any]] = [(d, dict(d)), *((d[k], dict(d[k])) for k in _DICTS if isinstance(d.get(k), dict))]
    for key, kind in (("_non_persistent_buffers_set", set), ("_flat_weights", list)):
        if isinstance(d.get(key), kind):
            saved.append((d[key], kind(d[key])))
    hooks = d.get("_forward_pre_hooks", {}).values()
    return saved + [(h, h.__dict__.get("_pruning_methods")) for h in hooks if isinstance(h, _tprune.PruningContainer)]


@contextmanager
def transaction(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Restore the given modules if the block raises."""
    saved = [_record(m) for m in {id(m): m for m in modules}.values()]
    try:
        yield
    except BaseException:
        for obj, contents in (pair for record in reversed(saved) for pair in record):
            if isinstance(obj, _tprune.PruningContainer):
                obj.__dict__.pop("_pruning_methods", None)
                if contents is not None:
                    obj._pruning_methods = contents
            elif isinstance(obj, list):
                obj[:] = contents
            else:  # a dict or a set, in place
                obj.clear()
                obj.update(contents)
        raise


def pruning_hooks(module: torch.nn.Module, name: str) -> list[tuple[Any, Any]]:
    hooks = module._forward_pre_hooks.items()
    return [(k, h) for k, h in hooks if isinstance(h, _tprune.BasePruningMethod) and h._tensor_name == name]


def fast_path(module: torch.nn.Module, name: str, method: Any) -> bool:
    """Whether an unpatched CoreMethod given no tensor (multiplied in as it is) prunes a
    parameter of a plain module for the first time, ``<name>_orig``/``_mask`` being free."""
    d = module.__dict__
    return (
        type(d.get("_parameters", {}).get(name)) is torch.nn.Parameter
        and core_of(method) is not None
        and not method._SHAPED
        and plain_module(module)
        and name not in d
        and free_name(module, name + "_orig", name + "_mask")
        and not pruning_hooks(module, name)
    )


def apply_method(module: torch.nn.Module, name: str, method: Any, scores: Any, precomputed: Any = None) -> Any:
    """Install `method` on ``module.<name>``; return the hook. `precomputed`: its known mask."""
    method._tensor_name = name
    if precomputed is None and fast_path(module, name, method):
        d = module.__dict__
        params = d["_parameters"]
        orig = params[name]
        mask = to_dtype(core_mask(method, scores_for(orig, scores, name), None), orig.dtype)
        params[name + "_orig"] = params.pop(name)
        d["_buffers"][name + "_mask"] = mask
        d["_non_persistent_buffers_set"].discard(name + "_mask")
        d[name] = mask * orig
        module.register_forward_pre_hook(method)
        method._remember(module)
        return method

    with transaction([module]):
        found = pruning_hooks(module, name)
        if len(found) > 1:
            msg = f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}."
            raise AssertionError(msg + " Use a PruningContainer.")
        for key, _ in found:
            del module._forward_pre_hooks[key]
        old = found[0][1] if found else None
        hook: Any = old
        if old is None:
            hook = method
        elif isinstance(old, PruningContainer):
            old.add_pruning_method(method)
        else:  # a lone method, or PyTorch's container: its methods move into one of ours
            hook = PruningContainer(*(old if isinstance(old, _tprune.PruningContainer) else [old]), method)
        orig = getattr(module, name)
        scores = scores_for(orig, scores, name)
        if old is None:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
        mask = precomputed
        if mask is None:
            old_mask = None if old is None else getattr(module, name + "_mask").detach()
            default_mask = torch.ones_like(orig) if old_mask is None else old_mask
            if old_mask is not None and core_of(hook[-1]) is None:  # foreign code may write into it
                default_mask = old_mask.clone(memory_format=torch.contiguous_format)
            with torch.no_grad():
                mask = hook.compute_mask(detached(scores), default_mask=default_mask)
            if isinstance(mask, torch.Tensor):
                mask = mask.detach() if mask.requires_grad else mask
                if old_mask is not None and _shares_memory(mask, old_mask):
                    mask = mask.clone(memory_format=torch.contiguous_format)
        module.register_buffer(name + "_mask", mask)
        setattr(module, name, hook.apply_mask(module))
        module.register_forward_pre_hook(hook)
    if isinstance(hook, BasePruningMethod):
        hook._remember(module)
    return hook


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
